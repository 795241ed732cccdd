"""``race check-config``: validate a study config (schema, cross-field checks, and the task files
and local model folders it names: race.study.inputs), nothing written; then print the study's
planned training model FLOPs by stage (pilot, full grid, validation, and what the nested rungs
save: race.study.plan.study_plan, each run charged its budget)."""

from __future__ import annotations

import sys
from pathlib import Path

HELP = "validate a study config (schema, cross-field, input files and model folders)"


def add_arguments(p) -> None:
    p.add_argument("config", help="path to a study config YAML")
    p.add_argument("--flops-per-second", type=float,
                   help="sustained model FLOP/s for the study's hours (default: the rate of the "
                        "finished runs in the study's results_dir on its device, if any)")


def run(args) -> int:
    from race.study.config import ConfigError, load_study
    from race.study.memory import format_study_memory
    from race.study.plan import format_study_hours, format_study_plan, study_plan, study_rate

    try:
        study = load_study(args.config)
    except ConfigError as exc:
        message = str(exc)  # errors reading the file already start with its path
        read_error = message.startswith(f"{Path(args.config)}: ")
        prefix = "" if read_error else f"{args.config}: "
        print(prefix + message, file=sys.stderr)
        return 2
    print(f"{args.config}: valid ({len(study.grid_cells())} grid cells, "
          f"{len(study.budgets)} budget rungs)")
    plan = study_plan(study)
    print(format_study_plan(plan))
    print(format_study_hours(plan, *study_rate(study, args.flops_per_second)))
    print(format_study_memory(study))
    return 0
