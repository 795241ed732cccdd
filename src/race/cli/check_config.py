"""``race check-config``: validate a study config (schema, cross-field checks, and the task files
and local model folders it names: race.study.inputs), nothing written."""

from __future__ import annotations

import sys

HELP = "validate a study config (schema, cross-field, input files and model folders)"


def add_arguments(p) -> None:
    p.add_argument("config", help="path to a study config YAML")


def run(args) -> int:
    from race.flops.plan import study_plan
    from race.study.cells import grid_cells
    from race.study.config import ConfigError, load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"{args.config}: {exc}", file=sys.stderr)
        return 2
    print(f"{args.config}: valid ({len(grid_cells(config))} grid cells, "
          f"{len(config['budgets'])} budget rungs)")
    planned = study_plan(config)
    print(f"planned training model FLOPs (each run charged its budget): pilot "
          f"{planned['pilot']:.3g} (part of the grid), full grid {planned['full_grid']:.3g}, "
          f"validation at most {planned['validation_at_most']:.3g}, total at most "
          f"{planned['total_at_most']:.3g}; nested rungs save {planned['nested_rungs_save']:.3g}"
          f" against one run per rung ({planned['one_run_per_rung']:.3g})")
    return 0
