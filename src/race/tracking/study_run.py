"""The study's own MLflow run: the parent that every cell's run nests under
(``mlflow.parentRunId``, created by :func:`race.tracking.mlflow_runs.ensure_study_run`).

Once the study is mirrored, :func:`finish_study_run` gives it what a reader needs to trust and
rerun the study: the resolved config (artifact ``config.json``), the git commit of the code and
the versions of the stack and the CPU kernel settings (:mod:`race.core.cpu_kernels`; tags: unlike
params they may change between reruns), summary metrics (``study/...``, at step 0) and the
reports (``report.md``, the tables and the figures) as artifacts; then it is marked FINISHED.
"""

from __future__ import annotations

import csv
import json
import subprocess
import tempfile
import time
from importlib import metadata
from pathlib import Path

from race.core.cpu_kernels import kernel_settings
from race.core.outputs import read_output
from race.core.study import Study
from race.tracking.mlflow_runs import locked

#: the distributions whose versions decide the numbers (and the workflow that ran them)
VERSIONED = ("race", "torch", "transformers", "trl", "peft", "accelerate", "mlflow",
             "snakemake")


def versions() -> dict[str, str]:
    out = {}
    for dist in VERSIONED:
        try:
            out[f"version.{dist}"] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[f"version.{dist}"] = "not installed"
    return out


def git_commit(cwd: str | Path = ".") -> str:
    """The commit the code was run from, ``+dirty`` when tracked files differ from it;
    ``unknown`` outside a git checkout."""
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=cwd, capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return commit + ("+dirty" if dirty.strip() else "")


def summary_metrics(study: Study, run_dirs: list[Path], reports: Path | None) -> dict:
    """``study/cells`` (runs mirrored), ``study/model_flops`` (training model FLOPs spent by
    all of them, the top rung of each), and from ``reports/regime.csv``, when the reports are
    there, ``study/regime_cells`` and ``study/decided_cells`` (winner at z >= 2)."""
    out = {"study/cells": len(run_dirs),
           "study/model_flops": sum(read_output(d / "train.json")["model_flops"]
                                    for d in run_dirs)}
    regime = reports / "regime.csv" if reports is not None else None
    if regime is not None and regime.exists():
        with regime.open() as f:
            rows = list(csv.DictReader(f))
        out["study/regime_cells"] = len(rows)
        out["study/decided_cells"] = sum(r.get("decided") == "True" for r in rows)
    return out


def _changed_summary(client, run_id: str, metrics: dict) -> list:
    """The summary points to log: a metric whose latest value differs (or that has none) is
    logged at the next step, so a rerun that changes nothing logs nothing and every
    (key, step) holds one value."""
    from mlflow.entities import Metric

    now = int(time.time() * 1000)
    out = []
    for key, value in sorted(metrics.items()):
        history = sorted(client.get_metric_history(run_id, key), key=lambda m: m.step)
        if history and history[-1].value == float(value):
            continue
        out.append(Metric(key, float(value), now, history[-1].step + 1 if history else 0))
    return out


def finish_study_run(client, run_id: str, study: Study, run_dirs: list[Path],
                     reports: str | Path | None = None) -> dict:
    """Tag, attach and finish the study run; returns the summary metrics."""
    from mlflow.entities import RunTag

    reports = Path(reports) if reports is not None else None
    tags = {"git_commit": git_commit(), "results_dir": str(study.results), **versions(),
            **kernel_settings()}
    metrics = summary_metrics(study, run_dirs, reports)
    with locked(study.results / "mlflow"):  # two mirrors at once: one logs the change
        client.log_batch(run_id, metrics=_changed_summary(client, run_id, metrics),
                         tags=[RunTag(k, v) for k, v in tags.items()])
    with tempfile.TemporaryDirectory() as tmp:
        resolved = Path(tmp) / "config.json"
        resolved.write_text(json.dumps(dict(study.config), indent=1, sort_keys=True) + "\n")
        client.log_artifact(run_id, str(resolved))
    if reports is not None and reports.is_dir():
        for path in sorted(reports.glob("*.md")) + sorted(reports.glob("*.csv")):
            client.log_artifact(run_id, str(path), artifact_path="reports")
        if (reports / "figures").is_dir():
            client.log_artifacts(run_id, str(reports / "figures"),
                                 artifact_path="reports/figures")
    client.set_terminated(run_id, status="FINISHED")
    return metrics
