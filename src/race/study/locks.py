"""Snakemake's lock on a working folder, explained where a user meets it.

Snakemake (its default file backend) locks the folder it runs in: it writes
``.snakemake/locks/<n>.input.lock`` and ``<n>.output.lock`` (the files the run reads and
writes) before the first job and deletes them when it ends. A scheduler killed outright
(SIGKILL, a closed session, a lost node) cannot, and every later run that touches those files
stops with Snakemake's ``LockException`` until ``snakemake --unlock``. A lock names no process,
so a live run cannot be told from a dead one: :func:`lock_note` says both, and the fix, when
the workflow starts and finds locks (Snakemake checks them only after the Snakefile is read,
and offers no hook on that error).
"""

from __future__ import annotations

import os
from pathlib import Path

#: Where Snakemake's file backend keeps its locks, relative to the working folder.
LOCKS = Path(".snakemake") / "locks"


def lock_note(roots, workdir: str | Path = ".", configfiles=()) -> str | None:
    """A line for the user when ``workdir`` holds a Snakemake lock on a file under one of
    ``roots`` (the study's results and reports folders; another study's lock is not this
    one's business), else None: what it means and the command that removes it, with the
    run's ``--configfile`` s."""
    held = [path for path in _locked(workdir) if _under(path, roots)]
    if not held:
        return None
    given = "".join(f" --configfile {_shown(path, workdir)}" for path in configfiles)
    return (f"RACE: {LOCKS} holds a lock on this study's files ({held[0]}, ...). If another "
            "snakemake runs here, let it finish. If none does, a killed one left the lock and "
            f"Snakemake stops with LockException: `snakemake --unlock{given}` removes it; the "
            "next run then redoes only the unfinished jobs (a training job resumes from its "
            "last checkpoint).")


def _locked(workdir: str | Path) -> list[str]:
    """The files Snakemake's locks in ``workdir`` name, as it wrote them."""
    paths = []
    for lock in sorted(Path(workdir, LOCKS).glob("*.lock")):
        try:
            paths += [line.strip() for line in lock.read_text().splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError):
            continue  # removed meanwhile by the run that held it, or not Snakemake's
    return paths


def _under(path: str, roots) -> bool:
    parts = Path(os.path.normpath(path)).parts
    heads = [Path(os.path.normpath(root)).parts for root in roots]
    return any(parts[:len(head)] == head for head in heads)


def _shown(path: str | Path, workdir: str | Path) -> str:
    relative = os.path.relpath(Path(path).resolve(), Path(workdir).resolve())
    return str(path) if relative.startswith("..") else relative
