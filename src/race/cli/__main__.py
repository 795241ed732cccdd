"""``python -m race.cli``: the ``race`` command through this interpreter (what the rules call)."""

import sys

from race.cli import main

sys.exit(main())
