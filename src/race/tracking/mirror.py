"""The mirror behind ``race mlflow-log``: every run folder of a study into MLflow, in one process.

The run folders are the source of truth; MLflow is a window onto them. This job logs, per
cell (grid and validation runs), the run's params and tags, every per-step metric of
``metrics.jsonl`` and the evaluation metrics of each evaluated rung (``eval/<target>``, at the
rung's training step; their intervals as the table artifact ``eval_intervals.json``), then marks
the run FINISHED. It also creates the study's parent run.

Idempotent through :class:`race.tracking.mlflow_runs.RunLogger`: a run is found again by its id
file or its ``run_key`` tag (never duplicated), and a (key, step) point already in MLflow is not
sent again; a point held with another value re-creates the run from the files (see
:func:`mirror_run`). So it serves both modes of ``mlflow.live``:

* ``live: true`` -- training jobs logged their steps as they ran; this job adds the
  evaluations (and any step a job could not log).
* ``live: false`` -- nothing touched MLflow before; this job logs everything. Training and
  evaluation jobs then never import MLflow (~4 s of start-up each on 2 cores).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from race.core import cells as C
from race.core.atomic import write_json_atomic
from race.core.outputs import (
    CORRUPT_SUFFIX,
    DRY_RUN_NOTE,
    METRICS,
    CorruptOutputError,
    metrics_problem,
    read_output,
)
from race.core.study import Study
from race.study import builders
from race.tracking.eval_metrics import log_eval, log_intervals
from race.tracking.mlflow_runs import RunLogger, ensure_study_run
from race.tracking.study_run import finish_study_run

SYNC_FILE = "mlflow_synced.json"
#: What a mirrored run holds, by version; part of each run's digest, so a new version mirrors
#: every run once more instead of skipping it as unchanged (2: evaluation intervals as a table
#: artifact, not ``eval/<target>_lo`` / ``_hi`` metrics; short run names)
MIRROR_FORMAT = "race-mlflow/2"


def expected_evals(study: Study, cell: C.Cell) -> list[Path]:
    """The eval.json files of a cell: those its evaluation job writes."""
    return [Path(s.out) for s in builders.eval_job(study, cell).snapshots]


def _metrics_rows(run_dir: Path) -> list[dict]:
    """The rows of a finished run's ``metrics.jsonl``, one per step its ``train.json`` counts;
    a cut or damaged file is an error naming it (mirrored as it is, MLflow would silently
    lack the missing steps)."""
    path = run_dir / METRICS
    if not path.exists():
        raise FileNotFoundError(f"missing run output: {path}")
    steps = read_output(run_dir / "train.json").get("steps")
    if not isinstance(steps, int):
        raise CorruptOutputError(f"{run_dir / 'train.json'} holds no step count; it is written "
                                 "by the train (race train) job")
    problem = metrics_problem(path, list(range(1, steps + 1)))
    if problem is not None:
        raise CorruptOutputError(
            f"{path}: {problem}; it is written by the train (race train) job: rerun the "
            f"workflow (it sets the file aside as {METRICS}{CORRUPT_SUFFIX} and the train job "
            "rebuilds it from its checkpoint)")
    return [json.loads(line) for line in path.read_text().splitlines()]


def _digest(paths: list[Path]) -> str:
    """The files' names and contents, under :data:`MIRROR_FORMAT`."""
    h = hashlib.sha256(MIRROR_FORMAT.encode() + b"\0")
    for path in paths:
        h.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def mirror_run(study: Study, cell: C.Cell, spec) -> dict:
    """Make one cell's MLflow run hold exactly its run folder's points; returns what was
    logged now (0s when already mirrored).

    The run folder's ``mlflow_synced.json`` (the run id and a digest of the files mirrored)
    lets an unchanged, already mirrored run be skipped without asking the store per key. A
    point that the store holds with another value (the cell was retrained or re-evaluated
    after a config change) makes the mirror re-create the run from the files: the old run
    goes to MLflow's trash, so every (key, step) keeps one value, the files' latest. So does a
    run holding a metric the files no longer produce (:meth:`RunLogger.stale_keys`).
    """
    job = builders.train_job(study, cell)
    run_dir = Path(job.run_dir)
    if not (run_dir / C.DONE).exists():
        raise FileNotFoundError(f"{run_dir}: the run has not finished ({C.DONE} is missing)")
    eval_paths = expected_evals(study, cell)
    missing = [str(p) for p in eval_paths if not p.exists()]
    if missing:
        raise FileNotFoundError(f"missing evaluation(s): {', '.join(missing)}")
    digest = _digest([run_dir / "metrics.jsonl", *eval_paths])
    rows = _metrics_rows(run_dir)
    times = [int(r["time"] * 1000) for r in rows if r.get("time") is not None]
    logger = RunLogger(spec, run_dir, cell.key, study.name, run_params(study, cell, job),
                       tags=job.tags, start_time=min(times, default=None))
    end = max(times, default=None)
    if logger.params_changed:  # MLflow never changes a logged param: a new run holds them
        logger.replace_run()
    sync_file = run_dir / SYNC_FILE
    if sync_file.exists() and read_output(sync_file) == {"run_id": logger.run_id,
                                                         "digest": digest}:
        logger.finish(end_time=end)
        return {"run_id": logger.run_id, "steps_logged": 0, "eval_values_logged": 0}
    evals = [read_output(p) for p in eval_paths]
    status = "FAILED"
    try:
        for _ in range(2):
            for row in rows:
                logger.log_row(row)
            for payload in evals:
                log_eval(logger, payload)
            if logger.stale_keys():  # e.g. an older version's eval/<target>_lo
                logger.replace_run()
            result = logger.flush()
            if not result["changed"]:
                break
            logger.replace_run()  # the files changed since they were mirrored
        logger.log_artifacts({p.parent.name: [p.parent / "ledger.json", p] for p in eval_paths})
        log_intervals(logger, evals)
        status = "FINISHED"
    finally:
        logger.finish(status, end_time=end)
    write_json_atomic(sync_file, {"run_id": logger.run_id, "digest": digest})
    sent = result["steps"]
    return {"run_id": logger.run_id,
            "steps_logged": len({s for k, steps in sent.items() if not k.startswith("eval/")
                                 for s in steps}),
            "eval_values_logged": sum(len(v) for k, v in sent.items() if k.startswith("eval/"))}


def run_params(study: Study, cell: C.Cell, job) -> dict:
    """The params a researcher filters a cell's runs on: the training job's (allocation with
    its effective LoRA alpha, reward, seed, budget), the cell's names, the policy's parameter
    counts (all, and non-embedding as in the scaling-law literature), and the study's task,
    pretraining and evaluation settings (``task.*``, ``pretrain.*``, ``eval.*``)."""
    from race.flops.analytic import resolve_arch

    out = dict(job.params(), size=cell.size, reward=cell.reward, alloc=cell.alloc)
    try:
        arch = resolve_arch(job.base)
        out.update(policy_params=arch.params(), policy_non_embedding_params=(
            arch.non_embedding_params()))
    except (OSError, ValueError):  # a hub id the machine cannot resolve: counts unknown
        pass
    for section in ("task", "pretrain", "eval"):
        out.update({f"{section}.{k}": v for k, v in (study.config.get(section) or {}).items()})
    return out


def forget_lost_store(study: Study, dry_run: bool = False) -> list[str]:
    """When the study's sqlite tracking DB is gone, delete the mirror's summary
    (``mlflow/logged.json``) so that the workflow's mlflow_log job runs again and rebuilds the
    store from the run folders; returns a log line per file deleted (``dry_run``: per file a
    real run would delete; nothing is). (A tracking server's store cannot be checked without
    reaching it: run ``snakemake --forcerun mlflow_log``.)"""
    db = study.mlflow.sqlite_db
    logged = study.results / "mlflow" / "logged.json"
    if not (study.mlflow.enabled and db is not None and logged.exists()):
        return []
    if db.exists():
        return []
    line = f"race: {logged}: the tracking DB {db} is gone; the mlflow_log job rebuilds it from "
    if dry_run:
        return [line + f"the run folders ({DRY_RUN_NOTE})"]
    logged.unlink()
    return [line + "the run folders"]


def write_mirror(study: Study, selected_path: str | Path | None, out: str | Path,
                 reports: str | Path | None = None) -> dict:
    """``race mlflow-log``: mirror the study (the grid, and the validation runs of the RACE
    selection in ``selected_path``), attach ``reports`` to the study run, and write the
    summary to ``out``; returns it."""
    if not study.mlflow.enabled:
        raise ValueError("mlflow.enabled is false in the config")
    selected = read_output(selected_path)["selected"] if selected_path else []
    summary = mirror_study(study, selected, reports)
    write_json_atomic(out, summary)
    return summary


def mirror_study(study: Study, selected: list[dict], reports: str | Path | None = None) -> dict:
    """Mirror every grid cell and every validation run of ``selected`` (RACE's selection),
    each nested under the study run, then finish the study run
    (:func:`race.tracking.study_run.finish_study_run`)."""
    from mlflow.tracking import MlflowClient

    spec = study.mlflow
    experiment_id, study_run = ensure_study_run(spec, study.name,
                                                study.results / "mlflow")
    cells = study.grid_cells() + study.validation_cells(selected)
    runs = {c.key: mirror_run(study, c, spec) for c in cells}
    summary = finish_study_run(MlflowClient(tracking_uri=spec.tracking_uri), study_run, study,
                               [study.run_dir(c) for c in cells], reports)
    return {"experiment_id": experiment_id, "study_run_id": study_run,
            "tracking_uri": spec.tracking_uri,
            "study": summary, "runs": runs}
