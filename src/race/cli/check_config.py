"""``race check-config``: validate a study config (schema, cross-field checks, and the task files
and local model folders it names: race.study.inputs), nothing written; then print the study's
planned training model FLOPs by stage (pilot, full grid, validation, and what the nested rungs
save: race.study.plan.study_plan, each run charged its budget), the evaluation jobs' model FLOPs,
and the device-hours per phase and stage, each phase at its own rate (race.study.hours: a
phase's flag, else --flops-per-second, else --rates FILE, else the study's finished work)."""

from __future__ import annotations

import sys
from pathlib import Path

HELP = "validate a study config (schema, cross-field, input files and model folders)"


def add_arguments(p) -> None:
    p.add_argument("config", help="path to a study config YAML")
    p.add_argument("--flops-per-second", type=float,
                   help="one sustained model FLOP/s for every phase without its own flag "
                        "(before --rates and the study's finished work)")
    for phase, what in (("rollout", "rollout under the config's rollout_engine"),
                        ("learning", "learning"), ("reward", "the reward model"),
                        ("eval", "evaluation jobs")):
        p.add_argument(f"--{phase}-flops-per-second", type=float, metavar="R",
                       help=f"sustained model FLOP/s of {what}")
    p.add_argument("--rates", metavar="FILE",
                   help="a rates file (race.study.hours.write_rates: per phase model FLOP/s, "
                        "rollout per engine), e.g. from bench/performance/gpu_check.py --rates")


def run(args) -> int:
    from race.study.config import ConfigError, load_study
    from race.study.hours import (
        PHASES,
        eval_flops,
        format_eval_flops,
        format_rates,
        format_study_hours,
        phase_rates,
        study_hours,
        train_phase_flops,
    )
    from race.study.memory import format_study_memory
    from race.study.plan import format_reward_reads, format_study_plan, study_plan

    try:
        study = load_study(args.config)
    except ConfigError as exc:
        message = str(exc)  # errors reading the file already start with its path
        read_error = message.startswith(f"{Path(args.config)}: ")
        prefix = "" if read_error else f"{args.config}: "
        print(prefix + message, file=sys.stderr)
        return 2
    try:
        rates = phase_rates(study, {p: getattr(args, f"{p}_flops_per_second") for p in PHASES},
                            args.flops_per_second, args.rates)
    except ValueError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(f"{args.config}: valid ({len(study.grid_cells())} grid cells, "
          f"{len(study.budgets)} budget rungs)")
    plan = study_plan(study)
    print(format_study_plan(plan))
    reads = format_reward_reads(study)
    if reads:
        print(reads)
    evaluation = eval_flops(study)
    print(format_eval_flops(evaluation))
    print(format_rates(rates, study.training.rollout_engine))
    print(format_study_hours(study_hours(train_phase_flops(study), evaluation, rates), rates))
    print(format_study_memory(study))
    return 0
