"""``race mlflow-init``: create the MLflow DB, the experiment and the study's parent run once,
before parallel jobs touch it (a fresh sqlite DB created by several processes at once fails in
its schema migration)."""

from __future__ import annotations

import json
from pathlib import Path

HELP = "create the MLflow DB, experiment and study run"


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, help="study config (file or the workflow's JSON)")
    p.add_argument("--out", required=True, help="marker file to write (JSON with the ids)")


def run(args) -> int:
    from race.study.config import load_config
    from race.study.specs import mlflow_spec
    from race.tracking.mlflow_runs import ensure_study_run

    config = load_config(args.config)
    experiment_id, run_id = ensure_study_run(mlflow_spec(config), config["study"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"experiment_id": experiment_id,
                                          "study_run_id": run_id}) + "\n")
    return 0
