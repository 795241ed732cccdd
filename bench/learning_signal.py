"""Learning signal and learning-rate sweep: does a rule-reward GRPO run raise greedy eval-in
accuracy above its base policy's, and at which constant learning rate?

    python bench/learning_signal.py [--sizes nano micro mini] [--lrs 1e-4 2e-4 2e-3]
                                    [--alloc base] [--budget 2e11] [--config config.yaml]

Needs the study's data and base policies (``snakemake results/base/size~mini/pre.json`` and
the other sizes). Each (size, lr) is one ``race train`` run with the rule reward and the named
allocation of the config, snapshotted at budget/4, budget/2 and budget; every snapshot and the
base policy are scored greedily on all of eval-in with the same code as ``race evaluate``'s
in_pass1. Runs go to a temporary directory. Prints one line per run: accuracy at each rung
with its training step, and the mean training reward over each quarter of the run.
"""

import argparse
import json
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from race.data.task import load_jsonl
from race.evaluation.snapshot import load_snapshot
from race.grpo.run import run_training
from race.policy.pretrain import greedy_accuracy
from race.study.cells import results, rung_dir
from race.study.config import load_config
from race.study.jobs import TrainJob
from race.study.specs import EvalSpec, allocation


def accuracy(policy: str, adapter: Path | None, records) -> float:
    snap = load_snapshot(policy, adapter)
    return greedy_accuracy(snap.model, snap.tokenizer, records, EvalSpec().max_new_tokens)[0]


def quarters(values: list[float]) -> list[float]:
    q = max(1, len(values) // 4)
    return [round(sum(values[i:i + q]) / len(values[i:i + q]), 3)
            for i in range(0, len(values), q)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=["nano", "micro", "mini"])
    parser.add_argument("--lrs", nargs="+", type=float, default=[1e-4, 2e-4, 2e-3])
    parser.add_argument("--alloc", default="base")
    parser.add_argument("--budget", type=float, default=2e11)
    parser.add_argument("--config", default="config.yaml")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = load_config(args.config)
    res = results(config)
    records = load_jsonl(res / "data" / "eval_in.jsonl")
    rungs = [args.budget / 4, args.budget / 2, args.budget]
    print(f"rule reward, alloc {args.alloc}, greedy eval-in accuracy (n={len(records)})")
    for size in args.sizes:
        base = str(res / "base" / f"size~{size}")
        print(f"{size}: base {accuracy(base, None, records):.3f}", flush=True)
        for lr in args.lrs:
            alloc = replace(allocation(config, args.alloc), learning_rate=lr)
            with tempfile.TemporaryDirectory() as tmp:
                job = TrainJob(base=base, train_data=str(res / "data" / "train.jsonl"),
                               run_dir=tmp, rungs=rungs, alloc=alloc, save_every=10**6)
                run_training(job)
                cells = []
                for b in rungs:
                    ledger = json.loads((rung_dir(tmp, b) / "ledger.json").read_text())
                    cells.append(f"{b:.2g}: {accuracy(base, rung_dir(tmp, b), records):.3f} "
                                 f"(step {ledger['steps']})")
                rewards = [json.loads(line)["reward_mean"]
                           for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
            print(f"  lr {lr:g}: " + ", ".join(cells) + f"; reward by quarter {quarters(rewards)}",
                  flush=True)


if __name__ == "__main__":
    main()
