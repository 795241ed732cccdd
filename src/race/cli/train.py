"""``race train``: one metered GRPO run of a study cell to its FLOP budget (see race.grpo.run).

    race train --job JSON [--run-options JSON]
    race train --config config.yaml --cell size~nano/reward~rule/alloc~g8/seed~0
"""

from __future__ import annotations

import sys

from race.cli.jobs import add_job_arguments, load_job, print_record

HELP = "train one cell with GRPO + LoRA to its FLOP budget"


def add_arguments(p) -> None:
    add_job_arguments(p, "run key size~S/reward~R/alloc~A/seed~N (with --config)",
                      run_options=True)


def run(args) -> int:
    from race.grpo.run import BudgetError, RunLockedError, run_training

    job = load_job("train", args)
    try:
        summary = run_training(job)
    except (BudgetError, RunLockedError) as exc:
        print(f"race train: {exc}", file=sys.stderr)
        return 2
    return print_record(summary, ("budget", "steps", "model_flops", "p_learning", "updates",
                                  "rollouts"))
