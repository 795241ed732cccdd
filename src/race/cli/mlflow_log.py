"""``race mlflow-log``: mirror every run folder of the study (params, per-step metrics,
evaluations) into MLflow, logging nothing twice."""

from __future__ import annotations

import json
import sys
from pathlib import Path

HELP = "mirror every run folder of the study into MLflow"


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, help="study config (file or the workflow's JSON)")
    p.add_argument("--selected", help="RACE selection (selected.json): its validation runs too")
    p.add_argument("--out", required=True, help="JSON summary to write (run ids, what was "
                                                 "logged)")


def run(args) -> int:
    from race.atomic import write_text_atomic
    from race.study.config import load_config
    from race.tracking.mirror import mirror_study

    config = load_config(args.config)
    if not config["mlflow"]["enabled"]:
        raise SystemExit("race mlflow-log: mlflow.enabled is false in the config")
    selected = json.loads(Path(args.selected).read_text())["selected"] if args.selected else []
    summary = mirror_study(config, selected)
    write_text_atomic(args.out, json.dumps(summary, indent=1, sort_keys=True) + "\n")
    new = sum(r["steps_logged"] for r in summary["runs"].values())
    values = sum(r["eval_values_logged"] for r in summary["runs"].values())
    print(f"race mlflow-log: {len(summary['runs'])} runs, {new} new steps, {values} new eval "
          f"values -> {summary['tracking_uri']}", file=sys.stderr)
    return 0
