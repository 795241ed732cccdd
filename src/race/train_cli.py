"""``race train``: one metered GRPO run of a study cell (see race.train)."""

from __future__ import annotations

import json
import sys


def register(sub) -> None:
    p = sub.add_parser("train", help="train one cell with GRPO + LoRA to its FLOP budget")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--job", help="the job as JSON (what the workflow passes)")
    src.add_argument("--config", help="study config file (use with --cell)")
    p.add_argument("--cell", help="run key size~S/reward~R/alloc~A/seed~N (with --config)")
    p.set_defaults(func=_main)


def _main(args) -> int:
    from race.train import BudgetError, job_from_json, run_training

    if args.job:
        job = job_from_json(args.job)
    else:
        from race.study import load_config, parse_cell, train_job

        if not args.cell:
            print("race train: --cell is required with --config", file=sys.stderr)
            return 2
        config = load_config(args.config)
        job = train_job(config, parse_cell(args.cell, config))
    try:
        summary = run_training(job)
    except BudgetError as exc:
        print(f"race train: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({k: summary[k] for k in ("budget", "steps", "model_flops", "p_learning",
                                              "updates", "rollouts")}))
    return 0
