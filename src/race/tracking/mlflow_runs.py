"""MLflow as the window onto a run folder (the files under results/ are the source of truth).

One MLflow run per training cell, named by the cell's run key and tagged ``run_key`` and
``study``. Its id is stored in the run folder (``mlflow_run_id``) so a rerun or a resumed run
continues the same MLflow run; when the file is lost the run is found again by its ``run_key``
tag, never duplicated. A metric step already logged is never logged twice (a resumed run
replays the steps after its last checkpoint with identical values: those are skipped).

A run is logged either live, by its training job, or after the fact by ``race mlflow-log``
(:mod:`race.tracking.mirror`), which mirrors the run folder; both go through :class:`RunLogger`,
so mixing them (a live run mirrored later) logs nothing twice.

Metrics go through ``log_batch`` (~10x faster than one call per point, docs/design.md), queued and
sent once per checkpoint, so logging stays off the training step's critical path.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from race.study.specs import MlflowSpec

RUN_ID_FILE = "mlflow_run_id"


def ensure_experiment(spec: MlflowSpec) -> str:
    """Create (once) the tracking DB and the experiment; returns the experiment id."""
    from mlflow.tracking import MlflowClient

    if spec.tracking_uri.startswith("sqlite:///"):
        Path(spec.tracking_uri.removeprefix("sqlite:///")).parent.mkdir(parents=True,
                                                                         exist_ok=True)
    client = MlflowClient(tracking_uri=spec.tracking_uri)
    exp = client.get_experiment_by_name(spec.experiment)
    if exp is not None:
        return exp.experiment_id
    artifact = spec.artifact_root
    if "://" not in artifact:
        artifact = Path(artifact).resolve().as_uri()
    return client.create_experiment(spec.experiment, artifact_location=artifact)


def ensure_study_run(spec: MlflowSpec, study: str) -> tuple[str, str]:
    """The experiment and the study's parent run (tagged ``race_role=study``), created once;
    returns ``(experiment_id, run_id)``."""
    from mlflow.tracking import MlflowClient

    experiment_id = ensure_experiment(spec)
    client = MlflowClient(tracking_uri=spec.tracking_uri)
    found = client.search_runs([experiment_id], f"tags.race_role = 'study' and "
                               f"tags.study = '{study}'", max_results=1)
    if found:
        return experiment_id, found[0].info.run_id
    run = client.create_run(experiment_id, run_name=f"study:{study}",
                            tags={"race_role": "study", "study": study})
    return experiment_id, run.info.run_id


def init_store(spec: MlflowSpec, study: str, out: str | Path) -> dict:
    """``race mlflow-init``: the DB, the experiment and the study run, once, and a marker file
    ``out`` with their ids (what live training jobs wait for)."""
    experiment_id, run_id = ensure_study_run(spec, study)
    ids = {"experiment_id": experiment_id, "study_run_id": run_id}
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    Path(out).write_text(json.dumps(ids) + "\n")
    return ids


class RunLogger:
    """Logs one cell's params and per-step metrics; idempotent across reruns and resumes."""

    def __init__(self, spec: MlflowSpec, run_dir: str | Path, run_key: str, study: str,
                 params: dict, tags: dict | None = None):
        from mlflow.entities import Param, RunTag
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=spec.tracking_uri)
        experiment_id = ensure_experiment(spec)
        id_file = Path(run_dir) / RUN_ID_FILE
        run_id = id_file.read_text().strip() if id_file.exists() else self._find(
            experiment_id, run_key)
        if run_id is None:
            all_tags = {"run_key": run_key, "study": study, **(tags or {})}
            run = self.client.create_run(experiment_id, run_name=run_key, tags=all_tags)
            run_id = run.info.run_id
            self.client.log_batch(run_id, params=[Param(k, str(v)[:6000])
                                                  for k, v in sorted(params.items())])
        else:
            self.client.set_terminated(run_id, status="RUNNING")
            if tags:
                self.client.log_batch(run_id, tags=[RunTag(k, str(v)) for k, v in tags.items()])
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        if not id_file.exists() or id_file.read_text().strip() != run_id:
            # Atomic: parallel evaluate jobs of the same cell read this file.
            from race.atomic import write_text_atomic

            write_text_atomic(id_file, run_id + "\n")
        self.run_id = run_id
        self.logged_steps = self._logged_steps()
        self._pending = []
        self._held: dict[str, set[tuple[int, float]]] = {}  # see log_new_values

    def _find(self, experiment_id: str, run_key: str) -> str | None:
        runs = self.client.search_runs([experiment_id], f"tags.run_key = '{run_key}'",
                                       max_results=2)
        return runs[0].info.run_id if runs else None

    def _logged_steps(self) -> set[int]:
        # "flops_total" is logged at every step, so its history lists every step already logged.
        return {m.step for m in self.client.get_metric_history(self.run_id, "flops_total")}

    def log_step(self, step: int, metrics: dict[str, float]) -> bool:
        """Queue ``metrics`` at ``step`` unless that step was already logged. Returns whether
        it queued.

        Nothing is sent until :meth:`flush` (training flushes at every checkpoint and at the
        end): one ``log_batch`` per flush instead of one per step keeps the tracking store
        off the training loop. Steps queued after the last checkpoint of a killed run are
        lost with it and logged again when the resumed run replays them.
        """
        from mlflow.entities import Metric

        if step in self.logged_steps:
            return False
        now = int(time.time() * 1000)
        self._pending += [Metric(k, float(v), now, step) for k, v in sorted(metrics.items())
                          if v is not None]
        self.logged_steps.add(step)
        return True

    def log_new_values(self, step: int, metrics: dict[str, float]) -> int:
        """Queue each metric at ``step`` unless MLflow already holds that value there; returns
        how many were queued. For metrics logged once per rung from files (evaluations):
        mirroring the same eval.json again logs nothing, a re-evaluated rung whose numbers
        changed logs the new value at the same step (MLflow shows the latest)."""
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        queued = 0
        for key, value in sorted(metrics.items()):
            if value is None:
                continue
            if key not in self._held:  # one history query per key and run
                self._held[key] = {(m.step, m.value) for m in
                                   self.client.get_metric_history(self.run_id, key)}
            point = (int(step), float(value))
            if point in self._held[key]:
                continue
            self._pending.append(Metric(key, point[1], now, point[0]))
            self._held[key].add(point)
            queued += 1
        return queued

    def flush(self) -> None:
        """Send the queued metrics (``log_batch`` takes at most 1000 per call)."""
        for i in range(0, len(self._pending), 1000):
            self.client.log_batch(self.run_id, metrics=self._pending[i:i + 1000])
        self._pending = []

    def finish(self, status: str = "FINISHED") -> None:
        self.flush()
        self.client.set_terminated(self.run_id, status=status)
