"""``race data`` (task splits as JSONL) and ``race tokenizer`` (the character tokenizer)."""

from __future__ import annotations

import json


def register(sub) -> None:
    p = sub.add_parser("data", help="write the task splits (train / eval_in / eval_ood) as JSONL")
    p.add_argument("--out", required=True, help="output directory, e.g. results/data")
    p.add_argument("--config", help="study config; its task: section sets the task spec")
    p.set_defaults(func=_data)

    t = sub.add_parser("tokenizer", help="build and save the character-level tokenizer")
    t.add_argument("--out", required=True, help="output directory, e.g. results/tokenizer")
    t.set_defaults(func=_tokenizer)


def write_task_data(task: dict, out: str) -> dict:
    """Write train / eval_in / eval_ood JSONL for the config's ``task:`` section.

    arithmetic: the synthetic task (deterministic from its seed); jsonl: the user's files,
    validated and copied; hf: a ``datasets`` id (needs a reachable hub), GSM8K-style mapping.
    """
    from dataclasses import fields
    from pathlib import Path

    from race.task import TaskSpec, load_hf_split, load_jsonl, write_jsonl, write_splits

    kind = task.get("kind", "arithmetic")
    if kind == "arithmetic":
        names = {f.name for f in fields(TaskSpec)}
        return write_splits(TaskSpec(**{k: v for k, v in task.items() if k in names}), out)
    paths = {}
    for split in ("train", "eval_in", "eval_ood"):
        if kind == "jsonl":
            key = f"{split}_jsonl"
            if not task.get(key):
                raise ValueError(f"task.{key}: required when task.kind is jsonl")
            records = load_jsonl(task[key])
        else:
            dataset = task["hf_ood_id"] if split == "eval_ood" and task.get("hf_ood_id") else (
                task["hf_id"])
            records = load_hf_split(dataset, "train" if split == "train" else "test",
                                    task.get("hf_config"))
        paths[split] = Path(out) / f"{split}.jsonl"
        write_jsonl(paths[split], ({"prompt": r.prompt, "answer": r.answer,
                                    "solution": r.solution, **r.meta} for r in records))
    return paths


def _data(args) -> int:
    task = {}
    if args.config:
        from race.study import load_config

        task = load_config(args.config).get("task", {})
    paths = write_task_data(task, args.out)
    print(json.dumps({k: str(v) for k, v in paths.items()}))
    return 0


def _tokenizer(args) -> int:
    from race.char_tokenizer import load_tokenizer, save_tokenizer

    out = save_tokenizer(args.out)
    print(f"saved a {len(load_tokenizer(out))}-token character tokenizer to {out}")
    return 0
