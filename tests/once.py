"""Work the tests share, done once per test run across pytest-xdist's workers."""

import json
from collections.abc import Callable
from pathlib import Path

from filelock import FileLock


def once_per_run(shared: Path, name: str, build: Callable[[], dict]) -> dict:
    """The JSON record ``build()`` returns, built by the first caller in any worker of this
    test run and kept as ``<name>.json`` in ``shared`` (the folder the run's workers share);
    a later caller waits on ``<name>.lock`` and reads the record. A build that fails leaves
    no record, so the next caller builds again."""
    record = shared / f"{name}.json"
    with FileLock(shared / f"{name}.lock"):
        if not record.exists():
            record.write_text(json.dumps(build()))
    return json.loads(record.read_text())
