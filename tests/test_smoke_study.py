"""The smoke study (tests/smoke.py: run once per test run, through SLURM where
tools/slurm-cluster.sh can bring a cluster up, else locally): its outputs end to end and its
SLURM jobs."""

import json
import posixpath
import re
import sqlite3
import subprocess
import sys
import zipfile

import pandas as pd
import pytest
import yaml
from dry_run import job_counts
from smoke import KILLED, ON_SLURM
from test_workflow import MODEL_RULES, SMOKE_RESULTS, snakemake, workdir

from race.analysis.report_markdown import FIGURE_CAPTIONS
from race.core.cells import format_budget


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
