"""The smoke study (tests/smoke.py: run once per test run, through SLURM where
tools/slurm-cluster.sh can bring a cluster up, else locally): its outputs end to end and its
SLURM jobs; then the faults a finished study survives, on copies of it (a training job killed
past a checkpoint, the tracking DB deleted, a ledger and an evaluation cut short, a config
whose jobs would fail at their start): each rerun leaves the study as if uninterrupted. One
file, so that the fault tests run on the study's worker as soon as it is done."""

import json
import posixpath
import re
import shutil
import sqlite3
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
from dry_run import job_counts
from faults import checkpoint, kill_switch, steps_done
from smoke import KILLED, ON_SLURM, ledgers, mlflow_points, runs_table
from test_workflow import MODEL_RULES, SMOKE_RESULTS, snakemake, workdir

from race.analysis.report_markdown import FIGURE_CAPTIONS
from race.core.cells import format_budget
from race.core.outputs import DRY_RUN_NOTE


def test_a_gpu_job_on_a_partition_without_gpus_is_refused_before_submission(
        tmp_path, slurm_cluster):
    """The cluster's partition cpu has no GPU: RACE says so, with the fix, before any job
    (local or submitted) runs, instead of the plugin's "Invalid generic resource"."""
    if slurm_cluster is not None:
        pytest.skip(f"no SLURM cluster: {slurm_cluster}")
    wd = workdir(tmp_path)
    (wd / "study.yaml").write_text((wd / "configs" / "smoke.yaml").read_text()
                                   + ON_SLURM.replace("partition: gpu", "partition: cpu"))
    proc = snakemake(wd, "--workflow-profile", "profiles/slurm", "--configfile", "study.yaml",
                     check=False, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert ("resources.train.gpu: 1 asks for a GPU, but SLURM partition 'cpu' (slurm.partition)"
            " has no GPU on any node" in out), out[-2000:]
    assert "submitted with SLURM" not in out and not (wd / SMOKE_RESULTS / "data").exists()


@pytest.mark.slow
def test_the_smoke_study_runs_through_slurm(smoke_study):
    """Every model job went through sbatch, each COMPLETED (squeue remembers finished jobs
    for MinJobAge), training with a GPU request; the workflow checked the cluster first."""
    if not smoke_study["slurm"]:
        pytest.skip(f"no SLURM cluster: {smoke_study['not_on_slurm']}")
    log = smoke_study["log"]
    ids = re.findall(r"has been submitted with SLURM jobid (\d+)", log)
    rules = re.findall(r"^rule (\w+):", log, flags=re.M)  # a localrule's job says localrule
    assert set(rules) == set(MODEL_RULES) and len(ids) == len(rules), (rules, ids)
    states = dict(line.split("|") for line in subprocess.run(
        ["squeue", "--states=all", "--noheader", "--format=%i|%T", "--jobs", ",".join(ids)],
        capture_output=True, text=True, check=True).stdout.split())
    assert set(states) == set(ids) and set(states.values()) == {"COMPLETED"}, states
    assert "RACE: SLURM job states from squeue" in log
    assert "RACE: model jobs' GPUs from partition 'gpu'" in log
    gpu_jobs = [i for i in ids if "TresPerJob=gres:gpu:1" in subprocess.run(
        ["scontrol", "show", "job", i], capture_output=True, text=True).stdout]
    assert len(gpu_jobs) == rules.count("train") + rules.count("train_validation") > 0
    print(f"{len(ids)} sbatch jobs, all COMPLETED; {len(gpu_jobs)} with a GPU")


@pytest.mark.slow
def test_smoke_study_end_to_end(smoke_study):
    wd = smoke_study["wd"]
    config = yaml.safe_load((wd / "configs" / "smoke.yaml").read_text())
    runs = pd.read_csv(wd / SMOKE_RESULTS / "runs.csv")
    trained = runs[runs["stage"] != "base"]
    n_grid = len(config["sizes"]) * len(config["rewards"]) * len(config["allocations"])
    assert (trained["stage"] == "full").sum() == n_grid * len(config["budgets"])
    assert not trained.duplicated(["cell", "budget"]).any()  # one row per cell x rung
    assert (trained["flops_total"] <= trained["budget"]).all()
    assert (trained[trained["reward"] == "rule+prm"]["flops_reward"] > 0).all()
    assert (trained[trained["reward"] == "rule"]["flops_reward"] == 0).all()
    cells = set(trained["cell"])
    db = sqlite3.connect(wd / SMOKE_RESULTS / "mlflow" / "mlflow.db")
    keys = [r[0] for r in db.execute(
        "select value from tags where key = 'run_key'")]
    assert sorted(keys) == sorted(cells)  # exactly one MLflow run per cell
    per_run = db.execute("select run_uuid, count(*), count(distinct step) from metrics "
                         "where key = 'flops/total' group by run_uuid").fetchall()
    assert len(per_run) == len(cells)  # every cell logged its FLOP curve
    assert all(n == distinct and n > 0 for _, n, distinct in per_run)  # no step twice
    evals = mlflow_eval_points(db)
    assert len(evals) == len(cells)  # every cell has its evaluations
    assert all(n == distinct for n, distinct in evals.values())  # no (key, step) twice
    for name in ("report.md", "frontier.csv", "regime.csv"):
        assert (wd / SMOKE_RESULTS / "reports" / name).exists()
    # The report reads the trained PRM's record: one row, the rewards and evaluation using it.
    feedback = pd.read_csv(wd / SMOKE_RESULTS / "reports" / "feedback.csv")
    assert feedback[["prm", "used_by"]].values.tolist() == [["nano", "rule+prm, eval"]]
    assert "## Feedback models" in (wd / SMOKE_RESULTS / "reports" / "report.md").read_text()
    # The noisy teacher wrote the base policies' solutions; sampled pass@1 ran everywhere.
    pre = json.loads((wd / SMOKE_RESULTS / "base" / "size~nano" / "pre.json").read_text())
    written = pre["teacher"]["written"]
    assert written["truncated"] > 0.5 * written["eligible_for_truncation"]
    assert runs["acc_sampled_pass1"].notna().all() and (runs["n_sampled_pass1"] == 8).all()
    # The smoke task is small enough for its tiny policies to score: values, not a column of 0.
    assert runs["acc_in_pass1"].mean() > 0, runs["acc_in_pass1"].tolist()
    figures = sorted(p.name for p in (wd / SMOKE_RESULTS / "reports" / "figures").glob("*.png"))
    assert len(figures) == 6
    # Progress inside the jobs: a line per training step, and pretraining's progress.
    train_log = (wd / "logs" / "runs" / f"{KILLED}.log").read_text()
    # The job's JSON opens its log, and the console shows no shell command (profiles/default).
    assert train_log.startswith("race train: job {")
    assert "race train --job" not in smoke_study["log"]
    assert re.search(r"race train: step 1 \| [0-9.e+]+ / [0-9.e+]+ model FLOPs", train_log)
    assert "race pretrain: " in (wd / "logs" / "base" / "size~nano.log").read_text()

    # Delete one rung's evaluation: only that cell's evaluation job (all of its rungs) and what
    # depends on it rebuild -- the pilot table and the selection too, since the job rewrites
    # the cell's pilot rungs as well.
    top = trained[(trained["stage"] == "full") & (trained["budget"] == max(config["budgets"]))]
    cell = top.iloc[0]
    budget = format_budget(cell["budget"])
    target = wd / SMOKE_RESULTS / "runs" / cell["cell"] / f"budget~{budget}" / "eval.json"
    assert target.exists(), target
    target.unlink()
    plan = job_counts(snakemake(wd, "-n", "--cores", "2", "--configfile",
                                "configs/smoke.yaml").stdout)
    assert plan == {"evaluate": 1, "aggregate_pilot": 1, "select": 1, "aggregate": 1,
                    "mlflow_log": 1, "report": 1, "all": 1}, plan
    snakemake(wd, "--cores", "2", "--configfile", "configs/smoke.yaml")
    assert target.exists()
    assert mlflow_eval_points(db) == evals  # the re-evaluation logged nothing twice
    # A second run has nothing to do.
    again = snakemake(wd, "-n", "--cores", "2", "--configfile", "configs/smoke.yaml").stdout
    assert "Nothing to be done" in again
    # How jobs run is not what they compute: checkpointing more often, another step limit,
    # or calling the CLI through another path to the interpreter reruns nothing
    # (race.core.study.RUN_OPTION_KEYS, left out of every rule's config slice; the
    # interpreter is reached through the shell prefix, not a param).
    edited = yaml.safe_load((wd / "configs" / "smoke.yaml").read_text())
    edited["training"]["save_every"] += 1
    edited["max_steps_per_run"] = 10**6
    (wd / "configs" / "edited.yaml").write_text(yaml.safe_dump(edited))
    assert "Nothing to be done" in snakemake(wd, "-n", "--cores", "2", "--configfile",
                                             "configs/edited.yaml").stdout
    moved = subprocess.run(
        [sys.executable, "-c", "import sys, snakemake.cli; sys.executable = '/moved/bin/python'; "
         "sys.argv[1:] = ['-n', '--cores', '2', '--configfile', 'configs/smoke.yaml']; "
         "snakemake.cli.main()"], cwd=wd, capture_output=True, text=True)
    assert "Nothing to be done" in moved.stdout, moved.stdout[-2000:] + moved.stderr[-2000:]

    # Snakemake's report: each figure with its own caption, the report text, the tables.
    snakemake(wd, "--report", "report.zip", "--configfile", "configs/smoke.yaml")
    with zipfile.ZipFile(wd / "report.zip") as z:
        names = z.namelist()
        pages = {n: z.read(n).decode() for n in names if n.endswith(".html")}
        text = "".join(z.read(n).decode(errors="ignore") for n in names
                       if n.endswith((".html", ".js")))
    for name in ("report.html", "index.html", "frontier.csv", "regime.csv", *figures):
        assert any(n.endswith(f"/{name}") for n in names), name
    for caption in FIGURE_CAPTIONS.values():  # each figure's own (capitalised) caption
        assert caption[1:25] in text, caption
    # Every file the report's pages show or link is in the archive, where the link leads: the
    # report page's figures and their SVG and single-column files, and each entry of
    # Snakemake's own page (its results' data/raw/... paths).
    shown = zip_links(names, pages)
    for name in figures:
        assert any(n.endswith(f"/index.html -> figures/{name}") for n in shown), name


def zip_links(names: list[str], pages: dict[str, str]) -> list[str]:
    """Every local link of the archive's HTML ``pages`` (member -> text), as ``page -> link``,
    after checking that each resolves to a member of the archive (``names``). Snakemake's own
    page names its results in a JSON table (``"data_uri": "data/raw/<id>/<file>"``)."""
    from race.analysis.report_pages import local_links

    members, shown = set(names), []
    for page, html in pages.items():
        folder = posixpath.dirname(page)
        links = local_links(html) + re.findall(r'"data_uri": "(data/raw/[^"]+)"', html)
        for link in links:
            target = posixpath.normpath(posixpath.join(folder, link))
            assert target in members, f"{page} links {link}: not in the archive"
            shown.append(f"{page} -> {link}")
    assert shown
    return shown


def mlflow_eval_points(db) -> dict[str, tuple[int, int]]:
    """Per MLflow run: (eval/* points, distinct (key, step) pairs)."""
    rows = db.execute("select run_uuid, count(*), count(distinct key || ':' || step) "
                      "from metrics where key like 'eval/%' group by run_uuid").fetchall()
    return {run: (n, distinct) for run, n, distinct in rows}


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
