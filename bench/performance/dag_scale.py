"""Dry-run wall time of a 10,000-cell grid beside three peers (target: RACE / peer <= 1.2).

    python bench/performance/dag_scale.py [SEEDS]  # SEEDS=1,2,4: 1,000/2,000/4,000-cell scaling
    python bench/performance/dag_scale.py 3 --ablations  # where RACE's extra time per job goes

Grid: 10 sizes x 10 rewards x 10 allocations x SEEDS seeds (default 10: 10,000 cells) over 3
rungs, built from the default config in a temporary copy of the workflow (sizes are hub-style
ids, so no pretraining jobs). Three peers, the first two bare rules (no params, resources,
logs or benchmarks):

- the *bare peer*, the least any Snakefile with these per-cell jobs costs: a train job and an
  evaluation job per cell, each writing one file per rung, and a target rule over them --
  Snakemake's own per-job floor;
- the *same-DAG peer* (:data:`SAME_DAG_SNAKEFILE`): RACE's jobs and file edges as well (the
  pilot table over the first rung's evaluations, the selection checkpoint, the runs table over
  every evaluation, the report, the MLflow mirror, every ledger named as a target). RACE over
  it is the cost of RACE's own per-job features; over the bare peer, that plus the study's
  aggregation edges;
- the *feature-matched peer* (:data:`FEATURED_SNAKEFILE`): the same-DAG peer whose per-cell
  rules declare what RACE's declare for every job (named files, a job JSON param, log and
  benchmark files, threads, resources, a conda env). RACE over it is what RACE's own code adds
  per job; the same-DAG peer against it, what Snakemake charges for those declarations.

Each is timed as ``snakemake -n`` (every job listed) and ``snakemake -n --quiet rules`` (the
job-count table only, what one reads on a grid this size), in one run. Prints, never asserts:
these machines are shared and noisy.

``--ablations`` times ``-n --quiet rules`` of variants of the RACE workflow, each without one
feature the peers lack (log and benchmark files of the per-cell rules, their resources, the job
JSON in their params, the three at once, the RACE pilot and checkpoint, the MLflow jobs), best
of two, beside the peers: what each feature costs per job, and how close RACE's own DAG comes
to the same-DAG peer without its per-job features.
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common

import yaml

from bench.common import ROOT

RUNGS = [1e12, 2e12, 4e12]
#: The peer: Snakemake's floor for this DAG shape (one train job and one evaluation job per
#: cell, each writing a file per rung, and one target rule).
PEER_SNAKEFILE = """
CELLS = [f"c{i}" for i in range(int(config["cells"]))]
RUNGS = ["1", "2", "4"]

rule all:
    input: expand("runs/{cell}/budget~{rung}/eval.json", cell=CELLS, rung=RUNGS)

rule train:
    output: expand("runs/{{cell}}/budget~{rung}/ledger.json", rung=RUNGS)
    shell: "touch {output}"

rule evaluate:
    input: expand("runs/{{cell}}/budget~{rung}/ledger.json", rung=RUNGS)
    output: expand("runs/{{cell}}/budget~{rung}/eval.json", rung=RUNGS)
    shell: "touch {output}"
"""
#: The same-DAG peer: RACE's jobs and file edges with nothing else -- the tokenizer/data jobs,
#: train (rung ledgers + DONE) and evaluate per cell, the pilot table over the first rung's
#: evaluations, the selection checkpoint whose output decides the validation targets, the runs
#: table over every evaluation, the report and the MLflow mirror, and a target rule that names
#: every ledger and evaluation as RACE's does -- as bare rules (no params, logs, benchmarks,
#: resources, input functions per job). RACE / this peer is what RACE's own per-job features
#: cost; RACE / the bare peer adds the cost of the study's DAG shape (its aggregation edges).
_SAME_DAG_HEAD = """
CELLS = [f"c{i}" for i in range(int(config["cells"]))]
RUNGS = ["1", "2", "4"]
EVALS = expand("runs/{cell}/budget~{rung}/eval.json", cell=CELLS, rung=RUNGS)
LEDGERS = expand("runs/{cell}/budget~{rung}/ledger.json", cell=CELLS, rung=RUNGS)


def validation(wildcards):
    checkpoints.select.get()
    return [f"runs/{cell}/budget~4/eval.json" for cell in CELLS[:10]]


rule all:
    input: "reports/report.md", "runs.csv", "mlflow/logged.json", LEDGERS, EVALS, validation

rule tokenizer:
    output: "tokenizer/tokenizer.json"
    shell: "touch {output}"

rule data:
    input: "tokenizer/tokenizer.json"
    output: "data/train.jsonl", "data/eval_in.jsonl"
    shell: "touch {output}"

"""
_SAME_DAG_CELL_RULES = """
rule train:
    input: "data/train.jsonl"
    output: expand("runs/{{cell}}/budget~{rung}/ledger.json", rung=RUNGS), "runs/{cell}/DONE"
    shell: "touch {output}"

rule evaluate:
    input: expand("runs/{{cell}}/budget~{rung}/ledger.json", rung=RUNGS), "data/eval_in.jsonl"
    output: expand("runs/{{cell}}/budget~{rung}/eval.json", rung=RUNGS)
    shell: "touch {output}"
"""
_SAME_DAG_TAIL = """
rule aggregate_pilot:
    input: expand("runs/{cell}/budget~1/eval.json", cell=CELLS)
    output: "race/pilot.csv"
    shell: "touch {output}"

checkpoint select:
    input: "race/pilot.csv"
    output: "race/selected.json"
    shell: "touch {output}"

rule aggregate:
    input: EVALS, "race/selected.json", validation
    output: "runs.csv", "stages.csv"
    shell: "touch {output}"

rule report:
    input: "stages.csv"
    output: "reports/report.md"
    shell: "touch {output}"

rule mlflow_log:
    input: "runs.csv", "reports/report.md"
    output: "mlflow/logged.json"
    shell: "touch {output}"
"""
SAME_DAG_SNAKEFILE = _SAME_DAG_HEAD + _SAME_DAG_CELL_RULES + _SAME_DAG_TAIL
#: The per-cell rules of the feature-matched peer: the same-DAG peer's, declaring what RACE's
#: declare for every job -- named input and output files, a job JSON param (a function, as
#: RACE's is, of the length of RACE's train and eval jobs), log and benchmark files, threads,
#: the resources mem_mb / runtime / gpu and a conda env file -- and formatting the JSON into
#: the shell command as RACE's do.
_FEATURED_RULE = """
rule {name}:
    conda: "env.yaml"
    input: {inputs}
    output: {outputs}
    params: job=lambda w: "x" * {job_chars}
    log: "logs/{{cell}}.{name}.log"
    benchmark: "benchmarks/{{cell}}.{name}.tsv"
    threads: 1
    resources: mem_mb=2000, runtime=30, gpu=0
    shell: ": {{params.job:q}}; touch {{output}} > {{log}} 2>&1"
"""
_RUNG_FILES = 'expand("runs/{{cell}}/budget~{rung}/%s.json", rung=RUNGS)'
FEATURED_RULES = _FEATURED_RULE.format(
    name="train", job_chars=1000, inputs='data="data/train.jsonl"',
    outputs=f'rungs={_RUNG_FILES % "ledger"}, done="runs/{{cell}}/DONE"',
) + _FEATURED_RULE.format(
    name="evaluate", job_chars=1800,
    inputs=f'ledgers={_RUNG_FILES % "ledger"}, data="data/eval_in.jsonl"',
    outputs=f'evals={_RUNG_FILES % "eval"}',
)
#: The feature-matched peer: RACE / it is what RACE's own code adds per job (its job builders,
#: input functions and wildcard constraints); the same-DAG peer / it, what Snakemake charges
#: for the declarations themselves.
FEATURED_SNAKEFILE = _SAME_DAG_HEAD + FEATURED_RULES + _SAME_DAG_TAIL
MODES = {"snakemake -n": ["-n"], "snakemake -n --quiet rules": ["-n", "--quiet", "rules"]}


def race_workdir(wd: Path, seeds: int) -> None:
    shutil.copy(ROOT / "Snakefile", wd / "Snakefile")
    shutil.copytree(ROOT / "workflow", wd / "workflow")
    shutil.copytree(ROOT / "envs", wd / "envs")
    config = yaml.safe_load((ROOT / "config.yaml").read_text())
    config["sizes"] = [f"org/model-{i}" for i in range(10)]
    config["rewards"] = {f"r{i}": {"type": "rule"} for i in range(10)}
    config["allocations"] = {f"a{i}": {"num_generations": 2 + i} for i in range(10)}
    config["seeds"] = list(range(seeds))
    config["budgets"] = RUNGS
    config["race"].update(pilot_rungs=RUNGS[:1], validation_budget=RUNGS[-1],
                          validation_seeds=[0], baseline="a0")
    config["prm"]["sizes"] = []
    config["eval"]["prm"] = None
    (wd / "config.yaml").write_text(yaml.safe_dump(config))


def _without(*edits: tuple[str, str]):
    """A text edit of the per-cell rules (train.smk, evaluate.smk): each pattern replaced."""
    def edit(text: str) -> str:
        for pattern, instead in edits:
            text = re.sub(pattern, instead, text)
        return text

    return edit


_NO_LOGS = ((r"\n    (log|benchmark):\n        \"[^\n]*\",?", ""), (r" > \{log\} 2>&1", ""))
_NO_RESOURCES = ((r"\n    threads: [^\n]*", ""), (r"\n    resources:\n(?:        [^\n]*\n)+", "\n"))
_NO_JOB_JSON = ((r"job=lambda[^\n]*", 'job="{}",'),)
#: Variants of the workflow for --ablations: (edit of the per-cell rules, config changes).
ABLATIONS = {
    "as is": (None, {}),
    "no log/benchmark files": (_without(*_NO_LOGS), {}),
    "no resources/threads": (_without(*_NO_RESOURCES), {}),
    "no job JSON in params": (_without(*_NO_JOB_JSON), {}),
    "none of these three": (_without(*_NO_LOGS, *_NO_RESOURCES, *_NO_JOB_JSON), {}),
    "no RACE pilot/checkpoint": (None, {"race": {"enabled": False}}),
    "no MLflow jobs": (None, {"mlflow": {"enabled": False}}),
}


def ablations(seeds: int, peers: dict[str, Path]) -> None:
    args = ["-n", "--quiet", "rules"]
    walls = {name: min(dry_run(folder, [*args, "--config", f"cells={1000 * seeds}"])[0]
                       for _ in range(2)) for name, folder in peers.items()}
    print("  " + ", ".join(f"{name} {wall:.1f} s" for name, wall in walls.items()))
    for name, (edit, changes) in ABLATIONS.items():
        with tempfile.TemporaryDirectory() as tmp:
            wd = Path(tmp)
            race_workdir(wd, seeds)
            for rule in ("train.smk", "evaluate.smk"):
                path = wd / "workflow" / "rules" / rule
                path.write_text(edit(path.read_text()) if edit else path.read_text())
            config = yaml.safe_load((wd / "config.yaml").read_text())
            for section, values in changes.items():
                config[section].update(values)
            (wd / "config.yaml").write_text(yaml.safe_dump(config))
            runs = [dry_run(wd, args) for _ in range(2)]
            wall = min(r[0] for r in runs)
            ratios = ", ".join(f"RACE / {peer} {wall / peer_wall:.2f}"
                               for peer, peer_wall in walls.items())
            print(f"  {name:26s} {wall:6.1f} s ({runs[0][1]} jobs) [{runs[0][2]}]  {ratios}")


def dry_run(wd: Path, args: list[str]) -> tuple[float, int, str]:
    """(wall s, planned jobs, status) of one ``snakemake`` dry run in ``wd``."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", *args], cwd=wd,
                          capture_output=True, text=True)
    wall = time.perf_counter() - t0
    status = "ok" if proc.returncode == 0 else f"failed: {(proc.stdout + proc.stderr)[-800:]}"
    return wall, planned_jobs(proc.stdout), status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("seeds", nargs="?", type=int, default=10,
                        help="seeds per grid point; cells = 1000 x seeds (default 10)")
    parser.add_argument("--ablations", action="store_true",
                        help="time variants without one feature each (see the docstring)")
    options = parser.parse_args()
    seeds = options.seeds
    if seeds < 1:
        parser.error(f"seeds must be >= 1, got {seeds}")
    cells = 1000 * seeds
    with (tempfile.TemporaryDirectory() as race_dir, tempfile.TemporaryDirectory() as peer_dir,
          tempfile.TemporaryDirectory() as same_dir,
          tempfile.TemporaryDirectory() as featured_dir):
        race_workdir(Path(race_dir), seeds)
        (Path(peer_dir) / "Snakefile").write_text(PEER_SNAKEFILE)
        (Path(same_dir) / "Snakefile").write_text(SAME_DAG_SNAKEFILE)
        (Path(featured_dir) / "Snakefile").write_text(FEATURED_SNAKEFILE)
        (Path(featured_dir) / "env.yaml").write_text("dependencies: []\n")
        peers = {"bare peer": Path(peer_dir), "same-DAG peer": Path(same_dir),
                 "feature-matched peer": Path(featured_dir)}
        if options.ablations:
            print(f"dag_scale --ablations: {cells} cells x {len(RUNGS)} rungs")
            ablations(seeds, peers)
            return
        print(f"dag_scale: {cells} cells x {len(RUNGS)} rungs (target: RACE / peer <= 1.2)")
        for mode, args in MODES.items():
            wall, jobs, status = dry_run(Path(race_dir), args)
            print(f"  {mode}: RACE {wall:6.1f} s ({jobs} jobs, "
                  f"{1e3 * wall / max(jobs, 1):.2f} ms/job) [{status}]")
            for name, folder in peers.items():
                p_wall, p_jobs, p_status = dry_run(folder, [*args, "--config", f"cells={cells}"])
                print(f"    {name:14s} {p_wall:6.1f} s ({p_jobs} jobs, "
                      f"{1e3 * p_wall / max(p_jobs, 1):.2f} ms/job) [{p_status}]  |  "
                      f"RACE / {name} {wall / p_wall:.2f}")


def planned_jobs(dry_run_stdout: str) -> int:
    """The 'total' row of a dry run's job stats (0 if absent)."""
    for line in dry_run_stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "total" and parts[1].isdigit():
            return int(parts[1])
    return 0


if __name__ == "__main__":
    main()
