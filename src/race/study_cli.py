"""``race check-config`` (validate a study config) and ``race mlflow-init`` (create the DB,
the experiment and the study's parent run once, before parallel jobs touch it)."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("check-config", help="validate a study config (schema + cross-field)")
    p.add_argument("config", help="path to a study config YAML")
    p.set_defaults(func=_check)

    m = sub.add_parser("mlflow-init", help="create the MLflow DB, experiment and study run")
    m.add_argument("--spec", required=True, help="MLflow settings as JSON (MlflowSpec fields)")
    m.add_argument("--study", required=True, help="study name (the parent run's name)")
    m.add_argument("--out", required=True, help="marker file to write (JSON with the ids)")
    m.set_defaults(func=_mlflow_init)


def _check(args) -> int:
    from race.study import ConfigError, grid_cells, load_config

    try:
        config = load_config(args.config)
    except ConfigError as exc:
        print(f"{args.config}: {exc}", file=sys.stderr)
        return 2
    print(f"{args.config}: valid ({len(grid_cells(config))} grid cells, "
          f"{len(config['budgets'])} budget rungs)")
    return 0


def _mlflow_init(args) -> int:
    from race.tracking import MlflowSpec, ensure_study_run

    experiment_id, run_id = ensure_study_run(MlflowSpec(**json.loads(args.spec)), args.study)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"experiment_id": experiment_id,
                                          "study_run_id": run_id}) + "\n")
    return 0
