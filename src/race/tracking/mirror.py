"""The mirror behind ``race mlflow-log``: every run folder of a study into MLflow, in one process.

The run folders are the source of truth; MLflow is a window onto them. This job logs, per
cell (grid and validation runs), the run's params and tags, every per-step metric of
``metrics.jsonl`` and the evaluation metrics of each evaluated rung (``eval/<target>``, at the
rung's training step), then marks the run FINISHED. It also creates the study's parent run.

Idempotent through :class:`race.tracking.mlflow_runs.RunLogger`: a run is found again by its id
file or its ``run_key`` tag (never duplicated), a training step already in MLflow is skipped,
an evaluation value already there is skipped. So it serves both modes of ``mlflow.live``:

* ``live: true`` -- training jobs logged their steps as they ran; this job adds the
  evaluations (and any step a job could not log).
* ``live: false`` -- nothing touched MLflow before; this job logs everything. Training and
  evaluation jobs then never import MLflow (~4 s of start-up each on 2 cores).
"""

from __future__ import annotations

import json
from pathlib import Path

from race.atomic import write_text_atomic
from race.study import cells as C
from race.study import jobs, specs
from race.tracking.eval_metrics import log_eval
from race.tracking.mlflow_runs import RunLogger, ensure_study_run


def expected_evals(config: dict, cell: C.Cell) -> list[Path]:
    """The eval.json files of a cell: those its evaluation job writes."""
    return [Path(s.out) for s in jobs.eval_job(config, cell).snapshots]


def _metrics_rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise FileNotFoundError(f"missing run output: {path}")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mirror_run(config: dict, cell: C.Cell, spec) -> dict:
    """Mirror one cell's run folder; returns what was logged now (0s when already mirrored)."""

    job = jobs.train_job(config, cell)
    run_dir = Path(job.run_dir)
    if not (run_dir / C.DONE).exists():
        raise FileNotFoundError(f"{run_dir}: the run has not finished ({C.DONE} is missing)")
    evals = [json.loads(p.read_text()) if p.exists() else p
             for p in expected_evals(config, cell)]
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


def write_mirror(config: dict, selected_path: str | Path | None, out: str | Path) -> dict:
    """``race mlflow-log``: mirror the study (the grid, and the validation runs of the RACE
    selection in ``selected_path``) and write the summary to ``out``; returns it."""
    if not config["mlflow"]["enabled"]:
        raise ValueError("mlflow.enabled is false in the config")
    selected = json.loads(Path(selected_path).read_text())["selected"] if selected_path else []
    summary = mirror_study(config, selected)
    write_text_atomic(out, json.dumps(summary, indent=1, sort_keys=True) + "\n")
    return summary


def mirror_study(config: dict, selected: list[dict]) -> dict:
    """Mirror every grid cell and every validation run of ``selected`` (RACE's selection)."""
    spec = specs.mlflow_spec(config)
    experiment_id, study_run = ensure_study_run(spec, config["study"])
    runs = {c.key: mirror_run(config, c, spec) for c in C.grid_cells(config)}
    runs.update({c.key: mirror_run(config, c, spec)
                 for c in C.validation_cells(config, selected)})
    return {"experiment_id": experiment_id, "study_run_id": study_run,
            "tracking_uri": spec.tracking_uri, "live": specs.mlflow_live(config), "runs": runs}
