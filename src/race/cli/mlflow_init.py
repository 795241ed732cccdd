"""``race mlflow-init``: create the MLflow DB, the experiment and the study's parent run once,
before parallel jobs touch it (a fresh sqlite DB created by several processes at once fails in
its schema migration)."""

from __future__ import annotations

HELP = "create the MLflow DB, experiment and study run"


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, help="study config (file or the workflow's JSON)")
    p.add_argument("--out", required=True, help="marker file to write (JSON with the ids)")


def run(args) -> int:
    from race.study.config import load_study
    from race.tracking.mlflow_runs import init_store

    study = load_study(args.config)
    init_store(study.mlflow, study.name, args.out)
    return 0
