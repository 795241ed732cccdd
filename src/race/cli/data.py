"""``race data``: the task splits (train / eval_in / eval_ood) as JSONL."""

from __future__ import annotations

import json

HELP = "write the task splits (train / eval_in / eval_ood) as JSONL"


def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="output directory, e.g. results/data")
    p.add_argument("--config", help="study config; its task: section sets the task")


def run(args) -> int:
    from race.data.sources import write_task_data

    task, revisions = {}, {}
    if args.config:
        from race.study.config import load_study

        study = load_study(args.config)
        task = dict(study.config.get("task", {}))
        revisions = study.revisions_of(study.source.hf_id, study.source.hf_ood_id)
    paths = write_task_data(task, args.out, revisions)
    print(json.dumps({k: str(v) for k, v in paths.items()}))
    return 0
