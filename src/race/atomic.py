"""One way to write a file so that a reader, or a crash, never sees half of it."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write_text_atomic(path: str | Path, text: str, durable: bool = True) -> Path:
    """Write ``text`` to a temporary file in the same folder, fsync it, then ``os.replace``.

    A reader never sees a half-written file either way; ``durable=False`` skips the fsync
    (the file may revert to its previous version after a power loss) for files rewritten
    at every training step whose durable copy lives elsewhere.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
