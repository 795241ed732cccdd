"""Evaluation results in MLflow: ``eval/<target>`` (and its interval) at the training step of
the evaluated rung, on the cell's run, never logged twice. A live evaluation job logs a value
only where the run holds none; a re-evaluation that changed it reaches MLflow through the
mirror (race.tracking.mirror), which re-creates the run from the files."""

from __future__ import annotations

from pathlib import Path

from race.tracking.mlflow_runs import RUN_ID_FILE, RunLogger


def eval_metrics(payload: dict) -> dict[str, float]:
    """``eval/<target>``, ``eval/<target>_lo`` and ``eval/<target>_hi`` of the targets that
    ran (a skipped target logs nothing)."""
    out: dict[str, float] = {}
    for target, r in payload["targets"].items():
        if r["acc"] is None:
            continue
        out[f"eval/{target}"] = float(r["acc"])
        out[f"eval/{target}_lo"] = float(r["lo"])
        out[f"eval/{target}_hi"] = float(r["hi"])
    return out


def _run_key(run_dir: Path) -> str:
    """The cell's run key: the part of the path after ``runs/`` (else the path itself)."""
    parts = run_dir.resolve().parts
    if "runs" in parts:
        return "/".join(parts[len(parts) - parts[::-1].index("runs"):])
    return str(run_dir)


def log_to_mlflow(payload: dict, run_dir: str | Path, mlflow_spec, study: str = "race") -> bool:
    """Log :func:`eval_metrics` to the cell's MLflow run at step = the rung's training step.

    The run is the one whose id the run folder holds (``mlflow_run_id``, written by training);
    without that file nothing is logged and False is returned. (A stale id, its DB lost, is
    resolved as by training: the run found by its ``run_key`` tag, else a new one without params.)
    """
    run_dir = Path(run_dir)
    if not (run_dir / RUN_ID_FILE).exists():
        return False
    _eval_step(payload)  # a payload without a step fails before the run is touched
    logger = RunLogger(mlflow_spec, run_dir, _run_key(run_dir), study, params={})
    try:
        log_eval(logger, payload)
    finally:
        logger.finish()
    return True


def log_eval(logger, payload: dict) -> int:
    """Queue :func:`eval_metrics` of ``payload`` on ``logger`` (a
    race.tracking.mlflow_runs.RunLogger) at the rung's training step; returns how many. Its
    flush sends only the points MLflow does not hold yet."""
    metrics = eval_metrics(payload)
    logger.log_step(_eval_step(payload), metrics)
    return len(metrics)


def _eval_step(payload: dict) -> int:
    """The training step of the evaluated rung (where its metrics go in MLflow)."""
    step = payload["rung"]["step"]
    if step is None:
        raise ValueError(f"{payload['adapter']}: no ledger.json, so no training step to log "
                         "the evaluation at")
    return int(step)
