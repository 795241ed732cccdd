"""Evaluation results in MLflow: ``eval/<target>`` at the training step of the evaluated rung,
on the cell's run, never logged twice. A live evaluation job logs a value only where the run
holds none; a re-evaluation that changed it reaches MLflow through the mirror
(race.tracking.mirror), which re-creates the run from the files.

The 95% intervals are not metrics: as ``eval/<target>_lo`` / ``_hi`` they made three charts of
every target. They are one table artifact per run, :data:`INTERVALS` (a row per evaluated rung
and target: :data:`INTERVAL_COLUMNS`), rewritten whole from the run folder's eval.json files
each time evaluations are logged.
"""

from __future__ import annotations

from pathlib import Path

from race.core.outputs import read_output
from race.tracking.mlflow_runs import RUN_ID_FILE, RunLogger

#: the run's table artifact of evaluation intervals (MLflow's table format: mlflow.load_table)
INTERVALS = "eval_intervals.json"
#: its columns: the rung (budget and training model FLOPs from its ledger, training step), the
#: target, the value logged as ``eval/<target>``, its 95% interval, the prompts it is over and
#: the interval's method (wilson | bootstrap)
INTERVAL_COLUMNS = ["budget", "train_model_flops", "step", "target", "value", "lo", "hi", "n",
                    "interval"]


def eval_metrics(payload: dict) -> dict[str, float]:
    """``eval/<target>`` of the targets that ran (a skipped target logs nothing)."""
    return {f"eval/{target}": float(r["acc"]) for target, r in payload["targets"].items()
            if r["acc"] is not None}


def interval_rows(payloads: list[dict]) -> list[list]:
    """The :data:`INTERVAL_COLUMNS` rows of ``payloads`` (eval.json contents), by rung step then
    target; a skipped target has no row, as it has no metric."""
    rows = []
    for payload in sorted(payloads, key=_eval_step):
        rung = payload["rung"]
        for target, r in sorted(payload["targets"].items()):
            if r["acc"] is not None:
                rows.append([rung.get("budget"), rung.get("train_model_flops"), _eval_step(payload),
                             target, r["acc"], r["lo"], r["hi"], r.get("n"), r.get("interval")])
    return rows


def log_intervals(logger, payloads: list[dict]) -> None:
    """Replace the run's :data:`INTERVALS` table with the rows of ``payloads`` (every evaluated
    rung of the run: the table is written whole, never appended to)."""
    logger.log_table(INTERVALS, INTERVAL_COLUMNS, interval_rows(payloads))


def _rung_payloads(run_dir: Path, payload: dict) -> list[dict]:
    """``payload`` and the other evaluated rungs of the run folder (``budget~*/eval.json``). A
    live evaluation job logs one rung; the table holds them all. A damaged file is left out
    rather than failing the job that did not write it: the mirror writes the table again from
    exactly the files it expects."""
    out, own = [payload], Path(payload["adapter"]).resolve()
    for path in sorted(run_dir.glob("budget~*/eval.json")):
        if path.parent.resolve() == own:
            continue
        try:
            out.append(read_output(path))
        except ValueError:  # CorruptOutputError: cut by a kill, being rewritten
            continue
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
        log_intervals(logger, _rung_payloads(run_dir, payload))
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
