"""Hub references: the revision a Hugging Face hub id is loaded at, and the commit that was.

A model, PRM or dataset named by hub id (``org/name`` that is no local folder,
:func:`is_hub_reference`) is loaded at the revision the config's ``revisions:`` pins (hub id ->
branch, tag or commit sha); an id it does not list loads the hub's default branch. The jobs
that load hub ids carry the pins of the ids they load (``TrainJob.revisions``,
``EvalJob.revisions``), and every loader asks for that revision: by its ``revision=`` argument
(:func:`race.policy.ladder.load_policy`, :func:`race.data.tokenizer.load_tokenizer`,
:func:`race.data.task.load_hf_split`, :func:`race.feedback.loading.resolve_model_dir`), which
falls back to the pins of the process (:func:`pinned`, :func:`revision_of`) where the load is
several calls away from the job (a reward's feedback model, an evaluation's PRM).

The commit a revision resolved to is read from the local hub cache (:func:`resolve_commit`):
what the branch or tag pointed at when the repository was last fetched. A training run's
fingerprint covers, for each hub-id input, the revision asked for and that commit
(:func:`race.grpo.resume.job_fingerprint`), and its ``train.json`` records them under
``references`` (:func:`hub_references`): a new commit on the hub starts a new run rather than
resuming or reusing one of the old commit. A local folder is covered by its files' stamps.
"""

from __future__ import annotations

import contextlib
import errno
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from race.core.cells import is_hub_id

#: A commit sha as the hub writes it (a revision of this shape names the commit itself).
COMMIT = re.compile(r"^[0-9a-f]{40}$")

_PINS: dict[str, str] = {}


def is_hub_reference(spec) -> bool:
    """A hub id that names no local folder (a folder shaped ``dir/name`` is a path, as
    ``from_pretrained`` reads it)."""
    return spec is not None and is_hub_id(str(spec)) and not Path(str(spec)).is_dir()


def require_folder_or_hub_id(spec, what: str) -> None:
    """Refuse a ``spec`` that is neither a hub id nor an existing folder (a local folder not
    written yet): a FileNotFoundError naming it and what it should hold, where
    ``from_pretrained`` would report a malformed repo id."""
    if not is_hub_id(str(spec)) and not Path(str(spec)).is_dir():
        raise FileNotFoundError(errno.ENOENT, f"no such folder ({what})", str(spec))


@contextlib.contextmanager
def pinned(revisions: Mapping[str, str] | None) -> Iterator[None]:
    """Within the block, the process's pins are ``revisions`` (hub id -> revision): what every
    loader asks for when its caller passes no revision."""
    saved = dict(_PINS)
    _PINS.clear()
    _PINS.update(revisions or {})
    try:
        yield
    finally:
        _PINS.clear()
        _PINS.update(saved)


def revision_of(spec, revision: str | None = None) -> str | None:
    """``revision`` when given, else the process's pin of ``spec`` (:func:`pinned`); None --
    the hub's default branch, or a local path -- otherwise."""
    return revision if revision is not None else _PINS.get(str(spec))


def resolve_commit(repo_id: str, revision: str | None = None,
                   repo_type: str = "model") -> str | None:
    """The commit ``revision`` (None: the default branch) of hub repository ``repo_id``
    resolves to in the local hub cache (``huggingface_hub.constants.HF_HUB_CACHE``, read at
    call time), or None when the cache does not hold that revision's snapshot.

    The cache layout is huggingface_hub's: ``<repo_type>s--org--name/refs/<revision>`` holds
    the commit a branch or tag pointed at when last fetched, ``snapshots/<commit>/`` its
    files; a 40-hex revision is the commit itself. (``try_to_load_from_cache`` resolves a
    ref the same way but answers with a file's path, not the commit; ``scan_cache_dir`` walks
    the whole cache.)"""
    snapshot = local_snapshot(repo_id, revision, repo_type)
    return None if snapshot is None else snapshot.name


def local_snapshot(repo_id: str, revision: str | None = None,
                   repo_type: str = "model") -> Path | None:
    """The folder of the cached snapshot :func:`resolve_commit` finds (``snapshots/<commit>``),
    or None; nothing is downloaded."""
    from huggingface_hub import constants
    from huggingface_hub.file_download import repo_folder_name

    revision = revision or constants.DEFAULT_REVISION
    repo = Path(constants.HF_HUB_CACHE) / repo_folder_name(repo_id=repo_id, repo_type=repo_type)
    ref = repo / "refs" / revision
    commit = ref.read_text().strip() if ref.is_file() else revision
    snapshot = repo / "snapshots" / commit
    return snapshot if COMMIT.match(commit) and snapshot.is_dir() else None


def hub_references(specs: Iterable, revisions: Mapping[str, str] | None,
                   repo_type: str = "model") -> dict[str, dict]:
    """``{hub id: {"revision": the pin (None: the default branch), "commit": what it
    resolves to in the cache (None: not there)}}`` for the hub ids among ``specs``, sorted;
    local paths and None are left out."""
    revisions = revisions or {}
    ids = sorted({str(s) for s in specs if is_hub_reference(s)})
    return {i: {"revision": revisions.get(i),
                "commit": resolve_commit(i, revisions.get(i), repo_type)} for i in ids}
