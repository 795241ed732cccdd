"""Gate A (before RL): do the base policies leave headroom that RL can reach?

    python bench/calibration/base_headroom.py [--config config.yaml] [--sizes nano micro mini]
        [--prompts 200] [--k 16] [--set teacher.truncate=0.7 ...]

Builds the study's task data and tokenizer in a temporary directory, pretrains each ladder size
exactly as ``race pretrain`` does (the config's ``pretrain:`` and ``teacher:`` sections,
``--set`` overriding any key, e.g. ``--set task.seed=1`` or ``--set teacher.noisy=false``),
then samples ``k`` completions per eval-in prompt at the training temperature and decodes one
greedily. Prints per size: greedy pass@1, sampled pass@1 (mean@k), pass@k (unbiased), maj@k,
format-valid share of the samples, and the share of samples per failure kind
(race.data.task.FAILURES: truncated is the teacher's systematic failure).

With ``--from-results`` it measures the study's own base policies instead (``results_dir`` of
the config, after ``snakemake`` built them), adds best-of-k reranked by the strong PRM
(``eval.prm``) and prints every PRM's held-out step AUC, overall and per error family
(``prm.json``).

The gate (issue 21): for every size, pass@k at least 30 points above sampled pass@1, sampled
pass@1 below 50%, format-valid at least 98%, and (with the PRM) best-of-k above maj@k; the
strong PRM's AUC at least 0.90 overall and on truncated lines, the weak one's lower. The last
lines say whether each size passes. Pretraining takes about 2-8 minutes per size on one core
at the default token budget.
"""

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common

import torch

from bench.common import add_set_option, results_folder, study_config
from race.core.specs import EvalSpec, PretrainSpec, TeacherSpec
from race.data.sources import write_task_data
from race.data.task import load_jsonl
from race.data.tokenizer import save_tokenizer
from race.evaluation.snapshot import load_snapshot
from race.evaluation.targets import Evaluator
from race.feedback.loading import load_prm
from race.policy.pretrain import pretrain


def headroom(policy: str, records, k: int, temperature: float, eval_section: dict,
             prm=None) -> dict:
    """Greedy and sampled metrics of one policy on ``records``, through the study's evaluator
    (module docstring): sampled_pass1 with k samples per prompt carries pass@k, the format-valid
    share and the failure shares; maj_k (and prm_bon with ``prm``) share one pool of k."""
    n = len(records)
    targets = ("in_pass1", "sampled_pass1", "maj_k") + (("prm_bon",) if prm else ())
    spec = EvalSpec.from_config(eval_section).with_overrides(
        targets=targets, n_in=n, sampled_prompts=n, sample_prompts=n, sampled_k=k, k=k,
        bon_n=k, temperature=temperature, train_temperature=temperature)
    found = Evaluator(load_snapshot(policy), records, [], spec, prm=prm).run()
    sampled = found["sampled_pass1"]
    return {
        "greedy": found["in_pass1"].acc, "pass1": sampled.acc,
        f"pass@{k}": sampled.details[f"pass@{k}"], f"maj@{k}": found["maj_k"].acc,
        **({f"bon@{k}": found["prm_bon"].acc} if prm else {}),
        "valid": sampled.details["format_valid"],
        **{f"share_{f}": v for f, v in sampled.details["failures"].items()},
    }


def print_row(size: str, params: int, row: dict, seconds: float) -> None:
    print(f"{size:6} params {params:>9,}  " + "  ".join(
        f"{key} {value:.3f}" for key, value in row.items()) + f"  ({seconds:.0f} s)", flush=True)


def prm_lines(results: Path, prm_sizes: list[str]) -> None:
    """Each trained PRM's held-out step AUC, overall and on the truncated answer lines."""
    for size in prm_sizes:
        rec = json.loads((results / "prm" / f"size~{size}" / "prm.json").read_text())
        by_error = rec.get("auc_by_error", {})
        families = "  ".join(f"{f} {v:.3f}" for f, v in by_error.items() if v is not None)
        print(f"PRM {size}: step AUC {rec['auc']:.3f}  by error family: {families}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--sizes", nargs="+", default=None)
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--k", type=int, default=16)
    add_set_option(parser)
    parser.add_argument("--from-results", action="store_true",
                        help="measure the study's own base policies and PRMs (results_dir of "
                             "the config) instead of pretraining in a temporary directory; "
                             "adds the PRMs' AUCs and the strong PRM's best-of-k")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = study_config(args.config, args.overrides)
    sizes = args.sizes or [s for s in config["sizes"]]
    teacher = TeacherSpec.from_config(config.get("teacher"))
    spec = PretrainSpec.from_config(config["pretrain"])
    temperature = config["training"]["temperature"]
    print(f"task {config['task']}\nteacher {teacher}\npretrain tokens {spec.token_budget}")
    rows = {}
    if args.from_results:
        res = results_folder(config)
        prm_sizes = config["prm"]["sizes"]
        prm_lines(res, prm_sizes)
        strong = config["eval"].get("prm") or (prm_sizes[-1] if prm_sizes else None)
        scorer = load_prm(strong, results_dir=str(res)) if strong else None
        records = load_jsonl(res / "data" / "eval_in.jsonl")[: args.prompts]
        for size in sizes:
            t0 = time.perf_counter()
            base = res / "base" / f"size~{size}"
            rows[size] = headroom(str(base), records, args.k, temperature, config["eval"],
                                  prm=scorer)
            params = json.loads((base / "pre.json").read_text())["params"]
            print_row(size, params, rows[size], time.perf_counter() - t0)
    else:
        with tempfile.TemporaryDirectory() as tmp:
            tmp = Path(tmp)
            write_task_data(config["task"], tmp / "data")
            save_tokenizer(tmp / "tokenizer")
            records = load_jsonl(tmp / "data" / "eval_in.jsonl")[: args.prompts]
            for size in sizes:
                t0 = time.perf_counter()
                pre = pretrain(size, tmp / "data", tmp / "tokenizer", tmp / size, spec,
                               teacher=teacher, max_value=config["task"]["max_value"])
                rows[size] = headroom(str(tmp / size), records, args.k, temperature,
                                      config["eval"])
                print_row(size, pre["params"], rows[size], time.perf_counter() - t0)
    k = args.k
    for size, r in rows.items():
        gates = {f"pass@{k} - pass1 >= 0.30": r[f"pass@{k}"] - r["pass1"] >= 0.30,
                 "pass1 < 0.50": r["pass1"] < 0.50, "valid >= 0.98": r["valid"] >= 0.98}
        if f"bon@{k}" in r:
            gates[f"bon@{k} > maj@{k}"] = r[f"bon@{k}"] > r[f"maj@{k}"]
        print(f"gate A {size}: " + ", ".join(f"{g} {'yes' if ok else 'NO'}"
                                             for g, ok in gates.items()))


if __name__ == "__main__":
    main()
