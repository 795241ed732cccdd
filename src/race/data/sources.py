"""Where the task splits come from: the synthetic arithmetic task, the user's JSONL files, or a
``datasets`` id (GSM8K-style; needs a reachable hub)."""

from __future__ import annotations

from pathlib import Path


def write_task_data(task: dict, out: str, revisions: dict | None = None) -> dict:
    """Write train / eval_in / eval_ood JSONL for the config's ``task:`` section.

    arithmetic: the synthetic task (deterministic from its seed); jsonl: the user's files,
    validated and copied; hf: a ``datasets`` id (needs a reachable hub), GSM8K-style mapping,
    loaded at its pin in ``revisions`` (hub id -> revision; else the default branch), the
    revision and the commit it resolved to recorded in ``references.json``
    (:func:`race.core.references.hub_references`).
    """

    from race.core.specs import TaskSpec
    from race.data.task import load_hf_split, load_jsonl, write_jsonl, write_splits

    kind = task.get("kind", "arithmetic")
    if kind == "arithmetic":
        return write_splits(TaskSpec.from_config(task), out)
    paths = {}
    for split in ("train", "eval_in", "eval_ood"):
        if kind == "jsonl":
            path = task.get(f"{split}_jsonl")
            if not path:
                raise ValueError(f"task.{split}_jsonl: required when task.kind is jsonl")
            records = load_jsonl(path)
        else:
            # The OOD target may be another dataset, with its own config name (or none).
            other = split == "eval_ood" and task.get("hf_ood_id")
            dataset, name = ((task["hf_ood_id"], task.get("hf_ood_config")) if other
                             else (task["hf_id"], task.get("hf_config")))
            files = None if other else task.get("hf_data_files")
            records = load_hf_split(dataset, "train" if split == "train" else "test", name,
                                    revision=(revisions or {}).get(dataset),
                                    **({"data_files": files} if files else {}))
        paths[split] = Path(out) / f"{split}.jsonl"
        write_jsonl(paths[split], ({"prompt": r.prompt, "answer": r.answer,
                                    "solution": r.solution, **r.meta} for r in records))
    if kind == "hf":
        _record_references([task["hf_id"], task.get("hf_ood_id")], revisions, out)
    return paths


def _record_references(ids: list, revisions: dict | None, out: str) -> None:
    """``references.json`` beside the splits: each hub dataset's revision and commit."""
    from race.core.atomic import write_json_atomic
    from race.core.references import hub_references

    references = hub_references(ids, revisions, repo_type="dataset")
    if references:
        write_json_atomic(Path(out) / "references.json", references, indent=1)
