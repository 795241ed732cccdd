"""Faults a finished study survives: on a copy of the smoke study (tests/smoke.py), a
training job killed past a checkpoint, the tracking DB deleted, a ledger and an evaluation
cut short; each rerun leaves the study as if uninterrupted."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from faults import checkpoint, kill_switch, steps_done
from smoke import KILLED, SMOKE_RESULTS, ledgers, mlflow_points, runs_table
from test_workflow import snakemake

from race.core.outputs import DRY_RUN_NOTE

CUT_LEDGER = "size~micro/reward~rule/alloc~updates/seed~0/budget~8e9/ledger.json"
CUT_EVAL = "size~nano/reward~rule+prm/alloc~base/seed~0/budget~4e9/eval.json"


def cut_short(path: Path) -> None:
    text = path.read_text()
    path.write_text(text[: len(text) // 2])


@pytest.mark.slow
def test_faults_leave_the_study_as_if_uninterrupted(smoke_study, tmp_path):
    """On a copy of the finished smoke study: undo one cell, kill its training job after its
    second rung, rerun; then delete the MLflow DB, cut a ledger and an evaluation short,
    rerun: the study is the uninterrupted one."""
    wd = tmp_path / "wd"
    shutil.copytree(smoke_study["finished"], wd, symlinks=True)
    # The copy is the finished study where it now lies: nothing to redo.
    assert "Nothing to be done" in snakemake(wd, "-n", "--cores", "2", "--configfile",
                                             "configs/smoke.yaml").stdout
    run = wd / SMOKE_RESULTS / "runs" / KILLED
    shutil.rmtree(run)  # only this cell (and what reads it) runs again
    # The training job of KILLED kills itself two steps past its second rung's checkpoint.
    study = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "2",
                              "--configfile", "configs/smoke.yaml"], cwd=wd,
                             env=kill_switch(tmp_path / "kill", run, rungs=2, steps=2),
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert study.wait(timeout=900) != 0  # the workflow reports the killed job
    killed_at = steps_done(run)
    step, rungs = checkpoint(run)
    assert rungs == 2 and killed_at > step and not (run / "DONE").exists()

    snakemake(wd, "--cores", "2", "--configfile", "configs/smoke.yaml")
    log = (wd / "logs" / "runs" / f"{KILLED}.log").read_text()
    resumed = re.search(r"resuming from checkpoint-(\d+) \((\d+) steps kept; rung summaries "
                        r"rebuilt: \['4e9', '8e9'\]\)", log)
    assert resumed, log[-2000:]
    kept = int(resumed.group(2))
    print(f"killed after {killed_at} steps; resumed from step {kept}: "
          f"{killed_at - kept} steps redone")
    assert killed_at == kept + 1  # killed at the end of step kept + 2, before it was logged

    (wd / SMOKE_RESULTS / "mlflow" / "mlflow.db").unlink()
    cut_short(wd / SMOKE_RESULTS / "runs" / CUT_LEDGER)
    cut_short(wd / SMOKE_RESULTS / "runs" / CUT_EVAL)
    # A dry run says what it would set aside, and that its plan leaves those reruns out
    # (Snakemake plans from the files as they are); it changes nothing.
    dry = snakemake(wd, "-n", "--cores", "2", "--configfile", "configs/smoke.yaml")
    assert (dry.stdout + dry.stderr).count(f"({DRY_RUN_NOTE})") == 3
    assert (wd / SMOKE_RESULTS / "runs" / CUT_LEDGER).exists()
    assert (wd / SMOKE_RESULTS / "runs" / CUT_EVAL).exists()
    assert (wd / SMOKE_RESULTS / "mlflow" / "logged.json").exists()
    rerun = snakemake(wd, "--cores", "2", "--configfile", "configs/smoke.yaml")
    notes = rerun.stdout + rerun.stderr
    assert "set aside as ledger.json.corrupt, the train (race train) job reruns" in notes
    assert "set aside as eval.json.corrupt, the evaluate (race evaluate) job reruns" in notes
    assert "the tracking DB" in notes and "rebuilds it" in notes

    finished = smoke_study["finished"]
    pd.testing.assert_frame_equal(runs_table(wd), runs_table(finished))
    assert ledgers(wd) == ledgers(finished)
    points = mlflow_points(wd)
    assert len({p[:3] for p in points}) == len(points)  # no (run, key, step) twice
    assert points == mlflow_points(finished)  # the same runs and points as before


def tree_digest(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (relative path -> bytes)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.slow
def test_a_config_whose_jobs_would_fail_at_start_touches_no_finished_cell(smoke_study, tmp_path):
    """device: cuda on a machine without a GPU changes every model job's params, so Snakemake
    would rerun them all, deleting their outputs first, and each would fail at its start: the
    workflow refuses it when it starts, and every file of the finished study is unchanged."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch sees a GPU here: device: cuda is a good config")
    wd = tmp_path / "wd"
    shutil.copytree(smoke_study["finished"], wd, symlinks=True)
    config = yaml.safe_load((wd / "configs" / "smoke.yaml").read_text())
    (wd / "cuda.yaml").write_text(yaml.safe_dump({**config, "device": "cuda"}))
    before = tree_digest(wd / SMOKE_RESULTS)
    dry = snakemake(wd, "-n", "--cores", "2", "--configfile", "cuda.yaml")
    assert "a real run here stops at the start: device: cuda, but torch sees no CUDA device" \
        in dry.stderr, dry.stderr[-2000:]
    proc = snakemake(wd, "--cores", "2", "--configfile", "cuda.yaml", check=False)
    assert proc.returncode != 0
    assert "device: cuda, but torch sees no CUDA device" in proc.stdout + proc.stderr
    assert tree_digest(wd / SMOKE_RESULTS) == before
