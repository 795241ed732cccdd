"""Gate A (before RL): do the base policies leave headroom that RL can reach?

    python bench/base_headroom.py [--config config.yaml] [--sizes nano micro mini]
                                  [--prompts 200] [--k 16] [--set teacher.truncate=0.7 ...]

Builds the study's task data and tokenizer in a temporary directory, pretrains each ladder size
exactly as ``race pretrain`` does (the config's ``pretrain:`` and ``teacher:`` sections,
``--set`` overriding any key, e.g. ``--set task.seed=1`` or ``--set teacher.noisy=false``),
then samples ``k`` completions per eval-in prompt at the training temperature and decodes one
greedily. Prints per size: greedy pass@1, sampled pass@1 (mean@k), pass@k (unbiased), maj@k,
format-valid share of the samples, and the share of samples per failure kind
(race.data.task.FAILURES: truncated is the teacher's systematic failure).

The gate (issue 21): for every size, pass@k at least 30 points above sampled pass@1, sampled
pass@1 below 50%, format-valid at least 98%. The last line says whether each size passes.
Pretraining takes about 1-3 minutes per size on one core at the default token budget.
"""

import argparse
import copy
import tempfile
import time
from pathlib import Path

import torch
import yaml

from race.data.sources import write_task_data
from race.data.task import load_jsonl
from race.data.teacher import TeacherSpec
from race.data.tokenizer import save_tokenizer
from race.evaluation.evaluator import Evaluator
from race.evaluation.snapshot import load_snapshot
from race.policy.pretrain import pretrain
from race.study.config import load_config
from race.study.specs import EvalSpec, PretrainSpec


def apply_overrides(config: dict, overrides: list[str]) -> dict:
    """``section.key=value`` pairs (value parsed as YAML) over a copy of ``config``."""
    config = copy.deepcopy(config)
    for item in overrides:
        dotted, _, raw = item.partition("=")
        section, _, key = dotted.partition(".")
        if not key:
            raise SystemExit(f"--set {item!r}: expected section.key=value")
        config.setdefault(section, {})[key] = yaml.safe_load(raw)
    return config


def headroom(policy: str, records, k: int, temperature: float, eval_section: dict) -> dict:
    """Greedy and sampled metrics of one policy on ``records``, through the study's evaluator
    (module docstring): sampled_pass1 with k samples per prompt carries pass@k, the format-valid
    share and the failure shares; maj_k draws its own k samples."""
    n = len(records)
    spec = EvalSpec.from_config(eval_section).with_overrides(
        targets=("in_pass1", "sampled_pass1", "maj_k"), n_in=n, sampled_prompts=n,
        sample_prompts=n, sampled_k=k, k=k, temperature=temperature,
        train_temperature=temperature)
    found = Evaluator(load_snapshot(policy), records, [], spec).run()
    sampled = found["sampled_pass1"]
    return {
        "greedy": found["in_pass1"].acc, "pass1": sampled.acc,
        f"pass@{k}": sampled.details[f"pass@{k}"], f"maj@{k}": found["maj_k"].acc,
        "valid": sampled.details["format_valid"],
        **{f"share_{f}": v for f, v in sampled.details["failures"].items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--sizes", nargs="+", default=None)
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--k", type=int, default=16)
    parser.add_argument("--set", dest="overrides", nargs="*", default=[])
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = apply_overrides(load_config(args.config), args.overrides)
    sizes = args.sizes or [s for s in config["sizes"]]
    teacher = TeacherSpec.from_config(config.get("teacher"))
    spec = PretrainSpec.from_config(config["pretrain"])
    temperature = config["training"]["temperature"]
    print(f"task {config['task']}\nteacher {teacher}\npretrain tokens {spec.token_budget}")
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        write_task_data(config["task"], tmp / "data")
        save_tokenizer(tmp / "tokenizer")
        records = load_jsonl(tmp / "data" / "eval_in.jsonl")[: args.prompts]
        for size in sizes:
            t0 = time.perf_counter()
            pre = pretrain(size, tmp / "data", tmp / "tokenizer", tmp / size, spec,
                           teacher=teacher, max_value=config["task"]["max_value"])
            rows[size] = headroom(str(tmp / size), records, args.k, temperature, config["eval"])
            r = rows[size]
            print(f"{size:6} params {pre['params']:>9,}  " + "  ".join(
                f"{key} {value:.3f}" for key, value in r.items())
                + f"  ({time.perf_counter() - t0:.0f} s)", flush=True)
    k = args.k
    for size, r in rows.items():
        gates = {f"pass@{k} - pass1 >= 0.30": r[f"pass@{k}"] - r["pass1"] >= 0.30,
                 "pass1 < 0.50": r["pass1"] < 0.50, "valid >= 0.98": r["valid"] >= 0.98}
        print(f"gate A {size}: " + ", ".join(f"{g} {'yes' if ok else 'NO'}"
                                             for g, ok in gates.items()))


if __name__ == "__main__":
    main()
