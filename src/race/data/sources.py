"""Where the task splits come from: the synthetic arithmetic task, the user's JSONL files, or a
``datasets`` id (GSM8K-style; needs a reachable hub)."""

from __future__ import annotations

from pathlib import Path


def write_task_data(task: dict, out: str) -> dict:
    """Write train / eval_in / eval_ood JSONL for the config's ``task:`` section.

    arithmetic: the synthetic task (deterministic from its seed); jsonl: the user's files,
    validated and copied; hf: a ``datasets`` id (needs a reachable hub), GSM8K-style mapping.
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
            records = load_hf_split(dataset, "train" if split == "train" else "test", name)
        paths[split] = Path(out) / f"{split}.jsonl"
        write_jsonl(paths[split], ({"prompt": r.prompt, "answer": r.answer,
                                    "solution": r.solution, **r.meta} for r in records))
    return paths
