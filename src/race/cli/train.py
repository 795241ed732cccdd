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


def check_run_length(job) -> None:
    """Refuse, before any model loads, a job whose budget takes more steps than its
    ``max_steps_per_run`` (race.study.plan.first_overlong). Every prompt is counted at the
    longest one's UTF-8 bytes + 1 tokens, no fewer than the tokenizers RACE loads make of it
    (at most a token per byte, plus the word-start token some add), so the steps counted are
    at most the run's. Skipped while the data or the base policy is missing: the run itself
    reports that."""
    from race.core.errors import ConfigError
    from race.data.task import load_jsonl
    from race.study.plan import first_overlong, job_step_cost

    try:
        prompt_len = 1 + max(len(r.prompt.encode()) for r in load_jsonl(job.train_data))
    except (OSError, ValueError):
        return
    cost = job_step_cost(job, prompt_len)
    if cost is None:
        return
    over = first_overlong({job.run_key or job.run_dir: cost}, job.rungs, job.max_steps_per_run)
    if over is not None:
        raise ConfigError(over.message("rungs", "the config (or the job's --run-options)"))


def run(args) -> int:
    from race.core.atomic import NoSpaceError
    from race.grpo.run import BudgetError, RunLockedError, run_training

    job = load_job("train", args)
    check_run_length(job)
    try:
        summary = run_training(job)
    except (BudgetError, RunLockedError, NoSpaceError) as exc:
        print(f"race train: {exc}", file=sys.stderr)
        return 2
    return print_record(summary, ("budget", "steps", "model_flops", "p_learning", "updates",
                                  "rollouts"))
