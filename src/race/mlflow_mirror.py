"""``race mlflow-log``: mirror every run folder of a study into MLflow, in one process.

The run folders are the source of truth; MLflow is a window onto them. This job logs, per
cell (grid and validation runs), the run's params and tags, every per-step metric of
``metrics.jsonl`` and the evaluation metrics of each evaluated rung (``eval/<target>``, at the
rung's training step), then marks the run FINISHED. It also creates the study's parent run.

Idempotent through :class:`race.tracking.RunLogger`: a run is found again by its id file or its
``run_key`` tag (never duplicated), a training step already in MLflow is skipped, an evaluation
value already there is skipped. So it serves both modes of ``mlflow.live``:

* ``live: true`` -- training jobs logged their steps as they ran; this job adds the
  evaluations (and any step a job could not log).
* ``live: false`` -- nothing touched MLflow before; this job logs everything. Training and
  evaluation jobs then never import MLflow (~4 s of start-up each on 2 cores).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from race import study as S


def expected_evals(config: dict, cell: S.Cell, validation: bool) -> list[Path]:
    """The eval.json files of a cell (:func:`race.study.evaluated_rungs`)."""
    run = S.run_dir(config, cell)
    return [run / f"budget~{S.format_budget(b)}" / "eval.json"
            for b in S.evaluated_rungs(config, cell, validation)]


def _metrics_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"missing run output: {path}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mirror_run(config: dict, cell: S.Cell, spec, validation: bool = False) -> dict:
    """Mirror one cell's run folder; returns what was logged now (0s when already mirrored)."""
    from race.evaluate import log_eval
    from race.tracking import RunLogger
    from race.train import DONE

    job = S.train_job(config, cell)
    run_dir = Path(job.run_dir)
    if not (run_dir / DONE).exists():
        raise FileNotFoundError(f"{run_dir}: the run has not finished ({DONE} is missing)")
    evals = [json.loads(p.read_text()) if p.exists() else p
             for p in expected_evals(config, cell, validation)]
    missing = [str(p) for p in evals if isinstance(p, Path)]
    if missing:
        raise FileNotFoundError(f"missing evaluation(s): {', '.join(missing)}")
    logger = RunLogger(spec, run_dir, cell.key, config["study"], job.params(), tags=job.tags)
    status = "FAILED"
    try:
        steps = sum(logger.log_step(row["step"], {k: v for k, v in row.items() if k != "step"})
                    for row in _metrics_rows(run_dir))
        values = sum(log_eval(logger, payload) for payload in evals)
        status = "FINISHED"
    finally:
        logger.finish(status)
    return {"run_id": logger.run_id, "steps_logged": int(steps), "eval_values_logged": values}


def mirror_study(config: dict, selected: list[dict]) -> dict:
    """Mirror every grid cell and every validation run of ``selected`` (RACE's selection)."""
    from race.tracking import ensure_study_run

    spec = S.mlflow_spec(config)
    experiment_id, study_run = ensure_study_run(spec, config["study"])
    runs = {c.key: mirror_run(config, c, spec) for c in S.grid_cells(config)}
    runs.update({c.key: mirror_run(config, c, spec, validation=True)
                 for c in S.validation_cells(config, selected)})
    return {"experiment_id": experiment_id, "study_run_id": study_run,
            "tracking_uri": spec.tracking_uri, "live": S.mlflow_live(config), "runs": runs}


def register(sub) -> None:
    p = sub.add_parser("mlflow-log", help="mirror every run folder of the study into MLflow")
    p.add_argument("--config", required=True, help="study config (file or the workflow's JSON)")
    p.add_argument("--selected", help="RACE selection (selected.json): its validation runs too")
    p.add_argument("--out", required=True, help="JSON summary to write (run ids, what was "
                                                 "logged)")
    p.set_defaults(func=_main)


def _main(args) -> int:
    from race.atomic import write_text_atomic

    config = S.load_config(args.config)
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
