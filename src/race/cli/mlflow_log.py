"""``race mlflow-log``: mirror every run folder of the study (params, per-step metrics,
evaluations) into MLflow, logging nothing twice (see race.tracking.mirror)."""

from __future__ import annotations

import sys

HELP = "mirror every run folder of the study into MLflow"


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, help="study config (file or the workflow's JSON)")
    p.add_argument("--selected", help="RACE selection (selected.json): its validation runs too")
    p.add_argument("--reports", help="reports folder to attach to the study run")
    p.add_argument("--out", required=True, help="JSON summary to write (run ids, what was "
                                                 "logged)")


def run(args) -> int:
    from race.study.config import load_study
    from race.tracking.mirror import write_mirror

    try:
        summary = write_mirror(load_study(args.config), args.selected, args.out,
                               args.reports)
    except ValueError as exc:
        raise SystemExit(f"race mlflow-log: {exc}") from None
    new = sum(r["steps_logged"] for r in summary["runs"].values())
    values = sum(r["eval_values_logged"] for r in summary["runs"].values())
    print(f"race mlflow-log: {len(summary['runs'])} runs, {new} new steps, {values} new eval "
          f"values -> {summary['tracking_uri']}", file=sys.stderr)
    return 0
