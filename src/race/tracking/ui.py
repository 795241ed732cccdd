"""What ``make ui`` (``race mlflow-ui``) opens: the MLflow UI over a study's tracking store,
landing on the experiment's runs table.

MLflow 3's UI opens an experiment on its GenAI overview (traces), which a RACE study has none
of: it reads the experiment's ``mlflow.experimentKind`` tag only while its global GenAI /
model-training toggle is off. The URL's ``workflowType=machine_learning`` picks the
model-training view whatever the toggle says, and ``/runs`` its runs table, so
:func:`runs_table_url` is the page to open; the experiment id in it is looked up in the store,
never typed by hand. The table is sorted by run name: in its default order (created) the UI
folds every cell's run under the study's parent run, one row until expanded; in any other it
lists them flat, and the names (race.tracking.mlflow_runs.run_name) sort by size, reward,
allocation, seed.

:func:`ui_command` is the local server: loopback only, one worker (a researcher's browser needs
no more, and MLflow's default workers take several times its memory:
``bench/performance/ui_memory.py``), its job runner off
(``MLFLOW_SERVER_ENABLE_JOB_EXECUTION``: it would start jobs from the UI).
"""

from __future__ import annotations

import os
import sys

from race.core.specs import MlflowSpec

HOST = "127.0.0.1"  # loopback only: the UI has no authentication
PORT = 5000  # MLflow's own default
WORKERS = 1
#: the runs table's URL query: MLflow UI's model-training view ("genai" is the traces view),
#: sorted by run name (the UI's sort key for it is the ``mlflow.runName`` tag; %60 is a backtick)
RUNS_TABLE_QUERY = ("workflowType=machine_learning&orderByKey=tags.%60mlflow.runName%60"
                    "&orderByAsc=true")


def is_server(spec: MlflowSpec) -> bool:
    """The store is a tracking server (http/https), which serves its own UI."""
    return spec.tracking_uri.startswith(("http://", "https://"))


def experiment_id(spec: MlflowSpec) -> str | None:
    """The id of the study's experiment in its tracking store; None while the store or the
    experiment does not exist yet (or the experiment is in MLflow's trash). A sqlite DB that
    does not exist is not created: MLflow's client would create it, outside the lock
    race.tracking.mlflow_runs.ensure_experiment creates it under."""
    if spec.sqlite_db is not None and not spec.sqlite_db.is_file():
        return None
    from mlflow.tracking import MlflowClient

    exp = MlflowClient(tracking_uri=spec.tracking_uri).get_experiment_by_name(spec.experiment)
    if exp is None or exp.lifecycle_stage != "active":
        return None
    return exp.experiment_id


def ui_base(spec: MlflowSpec, port: int = PORT) -> str:
    """The UI's address: the tracking server's own, else the local server's."""
    return spec.tracking_uri.rstrip("/") if is_server(spec) else f"http://{HOST}:{port}"


def runs_table_url(base: str, experiment: str | None) -> str:
    """The UI page of ``experiment``'s runs table (MLflow's hash routes); without an experiment
    yet, the experiments list."""
    if experiment is None:
        return f"{base}/#/experiments"
    return f"{base}/#/experiments/{experiment}/runs?{RUNS_TABLE_QUERY}"


def ui_command(spec: MlflowSpec, port: int = PORT) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of ``mlflow ui`` over ``spec``'s local store (this interpreter's
    MLflow, the pinned one)."""
    argv = [sys.executable, "-m", "mlflow", "ui", "--host", HOST, "--port", str(port),
            "--workers", str(WORKERS), "--backend-store-uri", spec.tracking_uri,
            # only for an experiment created in the UI: RACE's carry their artifact location
            "--default-artifact-root", spec.artifact_root]
    return argv, {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
