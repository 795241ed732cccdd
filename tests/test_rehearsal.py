"""The rehearsal of the Qwen2.5 study (``make rehearsal``): configs/rehearsal.yaml stands for
configs/qwen2.5.yaml key for key, and runs end to end on the stand-ins `race stand-ins` writes
(race.study.stand_ins)."""

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_workflow import snakemake, workdir

ROOT = Path(__file__).resolve().parents[1]
REHEARSAL = "results-rehearsal"

#: Keys (dotted; a prefix covers what is under it) in which the rehearsal may differ from the
#: config it stands for, and why. Every other key must be equal, or the rehearsal no longer
#: runs the real study's code path.
MAY_DIFFER = {
    "study": "a name", "results_dir": "where it writes", "reports_dir": "where it writes",
    "device": "where it runs", "resources": "where it runs", "slurm": "where it runs",
    "mlflow.tracking_uri": "where it writes", "mlflow.artifact_root": "where it writes",
    "task": "data source (GSM8K from the hub vs the same format from local files)",
    "sizes": "models", "rewards.math-prm.prm": "models", "rewards.rule+prm.prm": "models",
    "eval.prm": "models", "revisions": "models (hub pins)",
    "budgets": "budgets", "race.pilot_rungs": "budgets", "race.validation_budget": "budgets",
    "race.validation_seeds": "sample counts (seeds)",
    "eval.n_in": "sample counts", "eval.sample_prompts": "sample counts",
    "eval.sampled_prompts": "sample counts",
    "eval.native_prompts": "sample counts", "eval.native_samples": "sample counts",
    "eval.max_new_tokens": "lengths", "training.max_completion_length": "lengths",
    "training.save_every": "checkpoint cadence (a run option: a checkpoint every 2 steps, "
                           "so that the rehearsal writes and resumes from one)",
    "training.micro_batch_rows": "memory: rows per micro-batch (set in both)",
    **{f"allocations.{a}.prompts_per_step": "rows per step: a quarter of the real ones (a CPU "
       "samples from the real 151,936 logits in milliseconds a row and token)"
       for a in ("base", "search", "updates")},
}


def flatten(config: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in config.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, dotted + "."))
        else:
            out[dotted] = value
    return out


def exempt(key: str) -> bool:
    return any(key == k or key.startswith(k + ".") for k in MAY_DIFFER)


def load(name: str) -> dict:
    return yaml.safe_load((ROOT / "configs" / name).read_text())


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory, install_stand_ins) -> Path:
    """``make rehearsal`` in a scratch copy of the workflow: the stand-ins, then the study."""
    wd = workdir(tmp_path_factory.mktemp("rehearsal"))
    install_stand_ins(wd / REHEARSAL / "hub")
    snakemake(wd, "--cores", "2", "--configfile", "configs/rehearsal.yaml")
    return wd


@pytest.mark.slow
def test_the_rehearsal_runs_the_real_path(rehearsal):
    wd = rehearsal
    config = load("rehearsal.yaml")
    results = wd / REHEARSAL
    runs = pd.read_csv(results / "runs.csv")
    trained = runs[runs["stage"] != "base"]
    cells = len(config["sizes"]) * len(config["rewards"]) * len(config["allocations"])
    assert len(trained) == cells * len(config["budgets"])
    # The base policies, hub-style folders, are evaluated too (budget 0 of every curve).
    assert (runs["stage"] == "base").sum() == cells and runs["params"].notna().all()
    # The feedback model reads every completion of the PRM rewards: reward FLOPs are spent.
    prm = trained[trained["reward"] != "rule"]
    assert (prm["flops_reward"] > 0).all() and (trained[trained["reward"] == "rule"][
        "flops_reward"] == 0).all()
    # The data came through datasets' json builder from the GSM8K-format files.
    stand_in_test = (results / "hub" / "gsm8k" / "test.jsonl").read_text().splitlines()
    eval_in = (results / "data" / "eval_in.jsonl").read_text().splitlines()
    assert len(eval_in) == len(stand_in_test)
    # The planning bound on prompts holds for the data.
    from race.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(wd / config["sizes"][0])
    train = [json.loads(line)["prompt"] for line in
             (results / "data" / "train.jsonl").read_text().splitlines()]
    assert max(len(tokenizer(p, add_special_tokens=False)["input_ids"]) for p in train) <= \
        config["task"]["max_prompt_tokens"]
    assert json.loads(eval_in[0])["solution"].rstrip().split("\n")[-1].startswith("####")
    # Every policy and PRM tokenizer is Qwen2.5's real vocabulary (race.study.qwen_vocab), on
    # models of Qwen2.5's config vocabularies; the PRM's step separator sits at its real id.
    from race.study.qwen_vocab import vocabulary_files

    real = json.loads((vocabulary_files() / "vocab.json").read_text(encoding="utf-8"))
    prm = wd / config["rewards"]["math-prm"]["prm"]
    for folder, rows in [*((wd / s, 151936) for s in config["sizes"]), (prm, 152064)]:
        tok = load_tokenizer(folder)
        assert len(tok) == 151665 and all(tok.convert_tokens_to_ids(t) == i
                                          for t, i in list(real.items())[::997])
        assert json.loads((folder / "config.json").read_text())["vocab_size"] == rows
    assert load_tokenizer(prm).convert_tokens_to_ids("<extra_0>") == 151651
    # The briefly fine-tuned policy earns the rule reward at times (not always zero).
    rule_metrics = sorted(results.glob("runs/*/reward~rule/*/seed~0/metrics.jsonl"))
    rewards = [json.loads(line).get("reward_mean") for f in rule_metrics
               for line in f.read_text().splitlines()]
    assert max(r for r in rewards if r is not None) > 0
    # Every target ran, the PRM's best-of-n with its scoring charged.
    for target in config["eval"]["targets"]:
        assert trained[f"acc_{target}"].notna().all(), target
    assert (trained["eval_flops_prm_bon"] > trained["eval_flops_maj_k"]).all()
    # Every run computed in bfloat16, and the longer ones left a resumable checkpoint.
    run_dirs = [p.parent for p in results.glob("runs/*/*/*/seed~0/train.json")]
    assert len(run_dirs) == cells
    assert {json.loads((d / "perf.json").read_text())["dtype"] for d in run_dirs} == {
        "bfloat16"}
    assert any((d / "checkpoints").glob("checkpoint-*/race_state.json") for d in run_dirs)
    assert (results / "reports" / "report.md").exists()


# After the study: xdist hands a worker its next file once at most two of its tests are
# left (tests/conftest.py), so these quick ones come last, or that file would wait here.
def test_the_rehearsal_stands_for_the_qwen_config():
    """configs/rehearsal.yaml and configs/qwen2.5.yaml differ only in the keys MAY_DIFFER
    names; those that differ in value are set in both where the real config sets them."""
    real, rehearsal = flatten(load("qwen2.5.yaml")), flatten(load("rehearsal.yaml"))
    drift = {k: (real.get(k, "<unset>"), rehearsal.get(k, "<unset>"))
             for k in sorted(set(real) | set(rehearsal))
             if not exempt(k) and real.get(k, "<unset>") != rehearsal.get(k, "<unset>")}
    assert not drift, f"configs/rehearsal.yaml drifted from configs/qwen2.5.yaml: {drift}"
    # The named keys are real keys of one config or the other (a renamed key fails here).
    keys = set(real) | set(rehearsal)
    assert all(any(k == n or k.startswith(n + ".") for k in keys) for n in MAY_DIFFER)
    # The real path's settings themselves, as the issue lists them.
    assert rehearsal["training.dtype"] == "bfloat16"
    assert rehearsal["training.gradient_checkpointing"] is True
    assert rehearsal["training.attn_implementation"] == "sdpa"
    assert rehearsal["task.kind"] == "hf"


def test_the_config_diff_catches_drift():
    real = flatten(load("qwen2.5.yaml"))
    changed = dict(real, **{"allocations.search.num_generations": 16})
    assert [k for k in changed if not exempt(k) and changed[k] != real[k]] == [
        "allocations.search.num_generations"]
