"""The smoke study the tests share: run once per test run, uninterrupted, and read by every
test that needs a finished study (tests/test_smoke_study.py, its fault tests included). Under
pytest-xdist the first worker to ask runs it, under a lock in the folder the run's workers
share; the others wait for it and read what it left."""

import json
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path

import pandas as pd
from once import once_per_run

from race.analysis.columns import TIMING_COLUMNS

#: The smoke study's results_dir (its reports_dir is the reports folder inside it): its own, so
#: that running it beside the default study leaves results/ and the committed reports/ alone.
SMOKE_RESULTS = "results-smoke"

#: The smoke study on the cluster: the model jobs on partition gpu, training asking for a GPU
#: (the cluster's are stand-ins: the jobs compute on the CPU, as locally).
ON_SLURM = "slurm: {partition: gpu}\nresources: {train: {gpu: 1}}\n"

#: The cell with the most steps: the fault test kills its training job; the end-to-end test
#: reads its log.
KILLED = "size~nano/reward~rule/alloc~base/seed~0"


def finished_study(shared: Path, slurm_cluster: Callable[[], str | None]) -> dict:
    """The smoke study run once in ``shared`` (the first caller runs it; a later one, in any
    worker, waits for the lock and reads the record): ``wd`` (the tests may edit it),
    ``finished`` (a copy as it finished, never edited), the run's console ``log``, and
    whether it ran on SLURM. ``slurm_cluster()`` brings the cluster up, or says why not; it is
    called only by the caller that runs the study. Where a cluster comes up, the study runs
    through profiles/slurm, so that the fault test also finds the cluster's study equal to a
    local one; a hang is a failure (timeout)."""
    from test_workflow import snakemake, workdir

    def run() -> dict:
        not_on_slurm = slurm_cluster()
        wd = shared / "smoke"
        wd.mkdir()
        workdir(wd)
        if not_on_slurm is None:
            (wd / "study.yaml").write_text((wd / "configs" / "smoke.yaml").read_text() + ON_SLURM)
            proc = snakemake(wd, "--workflow-profile", "profiles/slurm", "--configfile",
                             "study.yaml", "--slurm-init-seconds-before-status-checks", "2",
                             "--seconds-between-status-checks", "2", timeout=1200)
        else:
            proc = snakemake(wd, "--cores", "2", "--configfile", "configs/smoke.yaml")
        finished = shared / "smoke-finished"
        shutil.copytree(wd, finished, symlinks=True)
        return {"wd": str(wd), "finished": str(finished), "log": proc.stdout + proc.stderr,
                "slurm": not_on_slurm is None, "not_on_slurm": not_on_slurm}

    study = once_per_run(shared, "smoke-study", run)
    return {**study, "wd": Path(study["wd"]), "finished": Path(study["finished"])}


def runs_table(wd: Path) -> pd.DataFrame:
    runs = pd.read_csv(wd / SMOKE_RESULTS / "runs.csv").drop(columns=TIMING_COLUMNS)
    return runs.sort_values(["stage", "cell", "budget"]).reset_index(drop=True)


def without_wall_time(obj):
    if isinstance(obj, dict):
        return {k: without_wall_time(v) for k, v in obj.items() if k != "wall_s"}
    if isinstance(obj, list):
        return [without_wall_time(v) for v in obj]
    return obj


def ledgers(wd: Path) -> dict[str, dict]:
    """Every ledger of the study (each rung's and each run's), wall seconds aside."""
    root = wd / SMOKE_RESULTS / "runs"
    return {str(p.relative_to(root)): without_wall_time(json.loads(p.read_text()))
            for p in sorted(root.rglob("ledger.json")) if "checkpoints" not in p.parts}


def mlflow_points(wd: Path) -> list[tuple]:
    """(run_key, key, step, value) of every metric point of the active runs, with repeats;
    wall seconds (perf/...) without their value, which differs between any two runs."""
    db = sqlite3.connect(wd / SMOKE_RESULTS / "mlflow" / "mlflow.db")
    rows = db.execute("select t.value, m.key, m.step, m.value from metrics m join runs r on "
                      "r.run_uuid = m.run_uuid join tags t on t.run_uuid = m.run_uuid and "
                      "t.key = 'run_key' where r.lifecycle_stage = 'active'").fetchall()
    db.close()
    return sorted((run, key, step, None if key.startswith("perf/") else value)
                  for run, key, step, value in rows)


