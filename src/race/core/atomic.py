"""One way to write a file so that a reader, or a crash, never sees half of it.

Permissions follow the user's umask, as a plain ``open()`` would: ``tempfile`` creates its files
0600 and folders 0700 whatever the umask, which would leave a study on a shared (group-readable)
filesystem readable by its owner only.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def current_umask() -> int:
    """The process umask (reading it means setting it; set it straight back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | Path, text: str, durable: bool = True) -> Path:
    """Write ``text`` to a temporary file in the same folder, fsync it, then ``os.replace``.

    A reader never sees a half-written file either way; ``durable=False`` skips the fsync
    (the file may revert to its previous version after a power loss) for files rewritten
    at every training step whose durable copy lives elsewhere. The file gets mode
    ``0666 & ~umask``.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~current_umask())
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


def write_json_atomic(path: str | Path, payload, indent: int | None = 1) -> Path:
    """:func:`write_text_atomic` of ``payload`` as sorted-key JSON with a final newline."""
    return write_text_atomic(path, json.dumps(payload, indent=indent, sort_keys=True) + "\n")


def make_temp_dir(parent: str | Path, prefix: str) -> Path:
    """A fresh folder in ``parent`` (to fill, then ``os.replace`` into place), with mode
    ``0777 & ~umask`` like a folder made by ``mkdir``."""
    folder = Path(tempfile.mkdtemp(dir=parent, prefix=prefix))
    folder.chmod(0o777 & ~current_umask())
    return folder
