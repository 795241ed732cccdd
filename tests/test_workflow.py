"""The Snakemake study, driven from pytest in a temporary copy of the workflow."""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from smoke import SMOKE_RESULTS

from race.cli import invocation

ROOT = Path(__file__).resolve().parents[1]


def workdir(tmp_path: Path) -> Path:
    for name in ("Snakefile", "config.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    for name in ("workflow", "configs", "profiles", "envs"):
        shutil.copytree(ROOT / name, tmp_path / name)
    return tmp_path


#: The rules whose jobs SLURM runs (the others are the Snakefile's localrules).
MODEL_RULES = ("base", "prm_samples", "prm", "train", "train_validation", "evaluate",
               "evaluate_validation", "evaluate_base")


def snakemake(cwd: Path, *args: str, check: bool = True,
              timeout: float | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(proc.stdout[-3000:] + proc.stderr[-3000:])
    return proc


@pytest.mark.parametrize("configfile", ["config.yaml", "configs/smoke.yaml",
                                        "configs/qwen2.5.yaml"])
def test_dry_runs(tmp_path, configfile):
    wd = workdir(tmp_path)
    out = snakemake(wd, "-n", "--cores", "2", "--configfile", configfile).stdout
    assert "train" in out and "evaluate" in out and "report" in out
    assert not (wd / "results").exists() and not (wd / SMOKE_RESULTS).exists()


def test_a_results_dir_holding_another_study_is_refused(tmp_path):
    wd = workdir(tmp_path)
    (wd / SMOKE_RESULTS).mkdir()
    (wd / SMOKE_RESULTS / "STUDY").write_text("race-default\n")
    proc = snakemake(wd, "-n", "--cores", "1", "--configfile", "configs/smoke.yaml", check=False)
    assert proc.returncode != 0
    assert "holds the study 'race-default'" in proc.stdout + proc.stderr


@pytest.mark.parametrize("sizes, rewards", [
    (["nano", "org/model"], ["rule", "rule+prm"]),  # mixed: per-cell input functions
    (["nano", "micro"], ["rule"]),  # every size a ladder size, no PRM: plain inputs
    (["org/model"], ["rule"]),  # no ladder size (then a ladder PRM has no policy to sample)
])
def test_training_and_evaluation_wait_for_their_cells_inputs(tmp_path, sizes, rewards):
    """Each train / evaluate job waits for its own cell's base policy (ladder sizes only) and
    for the PRM its reward needs, whether the rule passes them as a plain value or a function."""
    wd = workdir(tmp_path)
    config = yaml.safe_load((wd / "configs" / "smoke.yaml").read_text())
    config["sizes"] = sizes
    config["rewards"] = {name: config["rewards"][name] for name in rewards}
    if not any(size in ("nano", "micro", "mini") for size in sizes):
        config["prm"]["sizes"], config["eval"]["prm"] = [], None
    (wd / "study.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(wd, "-n", "--cores", "1", "--configfile", "study.yaml").stdout
    blocks = re.findall(r"^rule (train|evaluate):\n    input: ([^\n]*)\n.*?wildcards: ([^\n]*)",
                        out, flags=re.M | re.S)
    assert {rule for rule, _, _ in blocks} == {"train", "evaluate"}
    for rule, inputs, wildcards in blocks:
        w = dict(part.split("=") for part in wildcards.split(", "))
        base = f"{SMOKE_RESULTS}/base/size~nano/pre.json"
        assert (base in inputs) == (w["size"] == "nano"), inputs
        # Evaluation reranks best-of-n with eval.prm (nano, when there is one) whatever the
        # cell's reward.
        needs_prm = w["reward"] == "rule+prm" if rule == "train" else bool(
            config["prm"]["sizes"])
        assert (f"{SMOKE_RESULTS}/prm/size~nano/prm.json" in inputs) == needs_prm, inputs


def test_slurm_profile_parses(tmp_path):
    """The Qwen2.5 study under the SLURM profile: model jobs request their GPU under the
    resource name the executor plugin reads (gpu), with the config's memory and runtime; the
    light jobs run where Snakemake runs, not on the (GPU) partition."""
    wd = workdir(tmp_path)
    study = yaml.safe_load((wd / "configs" / "qwen2.5.yaml").read_text())
    study["slurm"]["account"] = "proj-42"
    (wd / "study.yaml").write_text(yaml.safe_dump(study))
    out = snakemake(wd, "--executor", "slurm", "--workflow-profile", "profiles/slurm", "-n",
                    "--jobs", "10", "--configfile", "study.yaml").stdout
    jobs = out.split("\nrule ")[1:]
    for rule, mem, runtime in (("train", 64000, 720), ("evaluate", 32000, 120)):
        resources = [j.split("resources: ")[1].splitlines()[0] for j in jobs
                     if j.startswith(f"{rule}:")]
        # The config's slurm: section reaches the plugin as its resource names.
        assert resources and all(f"mem_mb={mem}," in r and f"runtime={runtime}" in r
                                 and "gpu=1, slurm_partition=gpu, slurm_account=proj-42" in r
                                 for r in resources), resources[:1]
    assert "gpus=" not in out
    # Every rule but the model jobs' is a localrule (a dry run prints them all as "rule").
    rules = set(snakemake(wd, "--list-rules").stdout.split())
    text = (wd / "Snakefile").read_text()
    local = set(re.search(r"\nlocalrules:\n((?:    \w+,\n)+)", text).group(1).replace(
        ",", " ").split())
    assert local == rules - set(MODEL_RULES), (local, rules)


def test_jobs_call_the_cli_through_the_deployment_python(tmp_path):
    """Plain: this interpreter by path. Under --sdm conda: the env's own python, importing the
    package from the checkout's src/ (envs/race.yaml holds the stack, not the package)."""
    assert invocation(False, "/repo") == f"{sys.executable} -m race.cli"
    assert invocation(True, "/a b/repo") == "PYTHONPATH='/a b/repo/src' python -m race.cli"
    # The conda form is a working shell command when the env's python is first on PATH (here
    # a wrapper around this interpreter stands in for it).
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "python").write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    (bindir / "python").chmod(0o755)
    proc = subprocess.run(["bash", "-c", f"{invocation(True, str(ROOT))} check-config --help"],
                          env={**os.environ, "PATH": f"{bindir}:{os.environ['PATH']}"},
                          capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0 and "check-config" in proc.stdout, proc.stderr


BAD = [
    ({"sizes": ["nano", "giant"]}, "sizes[1]: unknown size 'giant'"),
    ({"allocations": {"base": {"num_generations": 1}}}, "allocations.base.num_generations"),
    ({"rewards": {"prm": {"type": "prm"}}}, "rewards.prm.prm"),
    ({"budgets": [8.0e9, 4.0e9]}, "budgets[1]: rungs must be strictly increasing"),
    ({"budgets": [1.0e6, 4.0e9, 8.0e9]}, "budgets[0]: 1e+06 FLOPs is below one step"),
    ({"race": {"baseline": "nope"}}, "race.baseline"),
    ({"allocations": {"base": {"num_generation": 4}}}, "num_generation"),
    ({"sizes": ["nano", "/etc"]}, "sizes[1]: /etc is not a model folder (no config.json)"),
    ({"seeds": [-1]}, "-1 is less than the minimum of 0"),
    ({"eval": {"targets": ["in_pass1", "ood_pass1"]}}, "race.targets[0]: 'sampled_pass1' is "
                                                       "not evaluated"),
    ({"eval": {"prm": "micro"}}, "eval.prm: 'micro' is not one of prm.sizes"),
    ({"rewards": {"rule": {"type": "rule"}, "p": {"type": "prm", "prm": "nano", "weight": 0.2}}},
     "rewards.p.weight: type prm reads no weight key"),
]


@pytest.mark.parametrize("override, message", BAD)
def test_bad_configs_are_rejected_before_anything_is_written(tmp_path, override, message):
    wd = workdir(tmp_path)
    config = yaml.safe_load((wd / "configs" / "smoke.yaml").read_text())
    for key, value in override.items():
        if isinstance(value, dict) and key in ("race", "eval"):
            config[key].update(value)
        else:
            config[key] = value
    (wd / "bad.yaml").write_text(yaml.safe_dump(config))
    proc = snakemake(wd, "-n", "--cores", "1", "--configfile", "bad.yaml", check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert not (wd / SMOKE_RESULTS).exists()


def test_flop_counts_in_scientific_notation_through_snakemake(tmp_path):
    """Snakemake reads --configfile with YAML 1.1, where 4e9 is a string."""
    wd = workdir(tmp_path)
    text = (wd / "configs" / "smoke.yaml").read_text()
    text = re.sub(r"(?m)^budgets: .*$", "budgets: [4e9, 8e9, 1.6e10]", text)
    text = re.sub(r"(?m)^  validation_budget: .*$", "  validation_budget: 8e9", text)
    (wd / "sci.yaml").write_text(text)
    plan = snakemake(wd, "-n", "--cores", "1", "--configfile", "sci.yaml").stdout
    assert "budget~1.6e10/ledger.json" in plan


def test_duplicate_names_are_rejected(tmp_path):
    from race.study.config import ConfigError, read_yaml

    path = tmp_path / "dup.yaml"
    path.write_text("allocations:\n  base: {}\n  base: {}\n")
    with pytest.raises(ConfigError, match="duplicate key 'base'"):
        read_yaml(path)
    # The workflow refuses them too (Snakemake's own reader keeps the last one).
    (tmp_path / "wd").mkdir()
    wd = workdir(tmp_path / "wd")
    study = wd / "study.yaml"
    study.write_text((wd / "configs" / "smoke.yaml").read_text() + "seeds: [0, 1]\n")
    proc = snakemake(wd, "-n", "--cores", "1", "--configfile", "study.yaml", check=False)
    assert proc.returncode != 0 and "duplicate key 'seeds'" in proc.stdout + proc.stderr
    assert not (wd / SMOKE_RESULTS).exists()


def test_a_lock_note_names_the_command_that_removes_a_stale_lock(tmp_path):
    """Snakemake's locks (its file backend: the files a run reads and writes, one per line)
    on this study's files get a note; another study's, or none, get none."""
    from race.study.locks import lock_note

    locks = tmp_path / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    assert lock_note(["results"], tmp_path) is None
    (locks / "0.output.lock").write_text("results-smoke/data/train.jsonl\n")
    assert lock_note(["results", "reports"], tmp_path) is None
    (locks / "1.output.lock").write_text("results/runs/x/DONE\nresults/data/train.jsonl\n")
    note = lock_note(["results", "reports"], tmp_path, [tmp_path / "configs" / "smoke.yaml"])
    assert note.startswith("RACE: .snakemake/locks holds a lock on this study's files "
                           "(results/runs/x/DONE, ...)")
    assert "`snakemake --unlock --configfile configs/smoke.yaml` removes it" in note


def test_a_stale_lock_and_a_pickle_rung_are_named_as_the_workflow_starts(tmp_path):
    """After a kill: the lock it left gets RACE's note before Snakemake's LockException (which
    no hook can add to), and a finished rung holding a pickle adapter stops the workflow while
    it parses, naming the folder, before a job is scheduled (Snakemake deletes a scheduled
    job's outputs: the cell's other eval.json files)."""
    wd = workdir(tmp_path)
    locks = wd / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    (locks / "0.output.lock").write_text(f"{SMOKE_RESULTS}/data/train.jsonl\n")
    run = wd / SMOKE_RESULTS / "runs" / "size~nano" / "reward~rule" / "alloc~base" / "seed~0"
    for budget, weights in (("4e9", "adapter_model.safetensors"), ("8e9", "adapter_model.bin")):
        rung = run / f"budget~{budget}"
        rung.mkdir(parents=True)
        for name, text in (("adapter_config.json", '{"r": 4}'), (weights, ""), ("DONE", ""),
                           ("eval.json", "{}")):
            (rung / name).write_text(text)
    proc = snakemake(wd, "-n", "--cores", "1", "--configfile", "configs/smoke.yaml",
                     check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "`snakemake --unlock --configfile configs/smoke.yaml` removes it" in out
    assert (f"rung snapshot: {SMOKE_RESULTS}/runs/size~nano/reward~rule/alloc~base/seed~0/"
            "budget~8e9 holds pickle weights (adapter_model.bin)") in out
    assert all((run / f"budget~{b}" / "eval.json").read_text() == "{}" for b in ("4e9", "8e9"))


@pytest.mark.parametrize("damaged, message", [
    (f"{SMOKE_RESULTS}/base/size~nano/model.safetensors",
     f"{SMOKE_RESULTS}/base/size~nano/model.safetensors is damaged (Error while deserializing "
     f"header: incomplete metadata, file not fully covered): delete "
     f"{SMOKE_RESULTS}/base/size~nano and rerun to have the base job write it again"),
    (f"{SMOKE_RESULTS}/mlflow/mlflow.db",
     f"mlflow.tracking_uri: {SMOKE_RESULTS}/mlflow/mlflow.db is damaged (file is not a "
     "database): delete it, and the workflow rebuilds it from the run folders"),
])
def test_damaged_weights_or_tracking_db_are_named_as_the_workflow_starts(tmp_path, damaged,
                                                                         message):
    """A truncated base policy (a copy cut short) or a tracking DB that is not one stops the
    workflow while it parses, naming the file and its repair, before any job (the base
    policy was met by a train job's SafetensorError traceback; the DB by the mirror's)."""
    import torch
    from safetensors.torch import save_file

    wd = workdir(tmp_path)
    path = wd / damaged
    path.parent.mkdir(parents=True)
    if path.suffix == ".safetensors":
        save_file({"w": torch.zeros(64)}, path)
        path.write_bytes(path.read_bytes()[:-100])
    else:
        path.write_text("not a database " * 100)
    proc = snakemake(wd, "-n", "--cores", "1", "--configfile", "configs/smoke.yaml",
                     check=False)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]
    assert path.exists()  # nothing deleted


def test_every_path_in_every_command_is_quoted(tmp_path):
    """A results folder with a space in its name: each job's shell command, split as the shell
    splits it, keeps every path whole (the data, tokenizer, MLflow and mirror rules once
    passed `results smoke/data` as two arguments)."""
    import shlex

    wd = workdir(tmp_path)
    text = (wd / "configs" / "smoke.yaml").read_text().replace(SMOKE_RESULTS, "results smoke")
    (wd / "spaced.yaml").write_text(text)
    out = snakemake(wd, "-n", "-p", "--cores", "1", "--configfile", "spaced.yaml").stdout
    commands = re.findall(r"^Shell command: (.+)$", out, flags=re.M)
    assert len(commands) >= 10, out[-2000:]
    for command in commands:
        words = shlex.split(command)
        assert "results" not in words and not any(w.startswith("smoke/") for w in words), command
    assert any("'results smoke/data'" in c for c in commands)
