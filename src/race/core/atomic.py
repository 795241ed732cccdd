"""One way to write a file so that a reader, or a crash, never sees half of it.

Permissions follow the user's umask, as a plain ``open()`` would: ``tempfile`` creates its files
0600 and folders 0700 whatever the umask, and so does safetensors its weight files, which would
leave a study on a shared (group-readable) filesystem readable by its owner only. Model weights
are saved through :func:`saving_weights`, which also turns a full disk into an error that says so.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import tempfile
from pathlib import Path

#: Free bytes below which a failed save is taken to have run out of space: torch's zip writer
#: reports a short write as "unexpected pos A vs B", without the errno, and leaves the partial
#: file filling the disk.
LOW_SPACE_BYTES = 1 << 20


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


class NoSpaceError(OSError):
    """A save of model weights failed because its filesystem is full."""


def out_of_space(exc: BaseException, folder: str | Path) -> bool:
    """Whether ``exc``, raised by a save into ``folder``, comes from a full disk: an ENOSPC
    (or EDQUOT) anywhere in its chain, safetensors' "os error 28", or any error while the
    folder's filesystem has under :data:`LOW_SPACE_BYTES` left (checked before the partial
    files are deleted)."""
    seen = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(seen) or "os error 28" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    where = Path(folder)
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        fs = os.statvfs(where)
    except OSError:
        return False
    return fs.f_bavail * fs.f_frsize < LOW_SPACE_BYTES


def weights_follow_umask(folder: str | Path) -> None:
    """Give every ``*.safetensors`` file of ``folder`` the mode ``0666 & ~umask`` of any other
    output (safetensors writes them 0600)."""
    mode = 0o666 & ~current_umask()
    for path in Path(folder).glob("*.safetensors"):
        path.chmod(mode)


@contextlib.contextmanager
def saving_weights(folder: str | Path, what: str, discard_partial: bool = False):
    """Around a save of model weights into ``folder`` (a model, adapter or checkpoint folder):
    afterwards the weights follow the umask (:func:`weights_follow_umask`); a save that fails
    for lack of space (:func:`out_of_space`) raises :class:`NoSpaceError` saying so and naming
    ``what`` (e.g. ``"checkpoint <folder>"``), after deleting ``folder`` when
    ``discard_partial`` (a folder that holds nothing but this save)."""
    try:
        yield Path(folder)
    except Exception as exc:  # safetensors' SafetensorError is neither OSError nor RuntimeError
        if not out_of_space(exc, folder):
            raise
        if discard_partial:
            shutil.rmtree(folder, ignore_errors=True)
        removed = "; its partial folder was removed" if discard_partial else ""
        raise NoSpaceError(f"no space left on device while saving {what}{removed} "
                           f"({type(exc).__name__}: {exc})") from exc
    weights_follow_umask(folder)
