"""The RL recipe sweep (gate B's dials): does rule-reward GRPO raise sampled pass@1 above the
base policy's, by how much per budget rung, and at which learning rate?

    python bench/calibration/learning_signal.py [--sizes nano micro mini]
        [--lrs 3e-4 1e-3 2e-3] [--alloc base] [--config config.yaml]
        [--set training.warmup_steps=5 training.scale_rewards=batch]

Needs the study's data and base policies (``snakemake results/base/size~mini/pre.json`` and
the other sizes). Each (size, lr) is one ``race train`` run with the rule reward and the named
allocation through the config's budget rungs (``--set`` overrides any ``training:`` key);
the base policy and every rung are scored with the evaluator's ``sampled_pass1`` (mean@k at the
training temperature over the config's ``eval.sampled_prompts`` x ``eval.sampled_k``, cluster
bootstrap interval) and greedy ``in_pass1``. Runs go to a temporary directory. Prints one line
per run: sampled pass@1 [95% interval] and greedy pass@1 at each rung with its step, the share
of truncated samples at the top rung, and the mean training reward per quarter of the run.
A (size, lr) passes gate B's gain line when the top rung's interval is above the base's and
the gain is at least 15 points.
"""

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common

import torch

from bench.common import add_set_option, results_folder, study_config
from race.core.cells import rung_dir
from race.core.jobs import TrainJob
from race.core.specs import EvalSpec
from race.data.task import load_jsonl
from race.evaluation.snapshot import load_snapshot
from race.evaluation.targets import Evaluator
from race.grpo.run import run_training
from race.study.config import typed_study


def scores(policy: str, adapter: Path | None, records, spec: EvalSpec) -> dict:
    """sampled_pass1 and in_pass1 of one snapshot (the study's evaluator, same settings)."""
    found = Evaluator(load_snapshot(policy, adapter), records, [], spec).run()
    return {t: found[t] for t in spec.targets}


def line(result: dict) -> str:
    s, g = result["sampled_pass1"], result["in_pass1"]
    return f"{s.acc:.3f} [{s.lo:.3f}, {s.hi:.3f}] greedy {g.acc:.3f}"


def quarters(values: list[float]) -> list[float]:
    q = max(1, len(values) // 4)
    return [round(sum(values[i:i + q]) / len(values[i:i + q]), 3)
            for i in range(0, len(values), q)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=None)
    parser.add_argument("--lrs", nargs="+", type=float, default=[3e-4, 1e-3, 2e-3])
    parser.add_argument("--alloc", default=None, help="default: race.baseline, else the first")
    parser.add_argument("--config", default="config.yaml")
    add_set_option(parser, help="training.KEY=VALUE overrides, e.g. training.warmup_steps=5")
    args = parser.parse_args()
    torch.set_num_threads(1)
    config = study_config(args.config, args.overrides)
    study = typed_study(config)
    res = results_folder(config)
    alloc_name = args.alloc or study.baseline_alloc()
    records = load_jsonl(res / "data" / "eval_in.jsonl")
    temperature = study.allocations[alloc_name].temperature
    spec = study.eval.with_overrides(targets=("sampled_pass1", "in_pass1"),
                                     train_temperature=temperature)
    rungs = list(study.budgets)
    print(f"rule reward, alloc {alloc_name}, training {config['training']}")
    print(f"sampled pass@1: {spec.sampled_prompts} prompts x {spec.sampled_k} at T={temperature}")
    for size in args.sizes or study.sizes:
        base = str(res / "base" / f"size~{size}")
        before = scores(base, None, records, spec)
        print(f"{size}: base {line(before)}", flush=True)
        for lr in args.lrs:
            alloc = replace(study.allocations[alloc_name], learning_rate=lr)
            with tempfile.TemporaryDirectory() as tmp:
                job = TrainJob(base=base, train_data=str(res / "data" / "train.jsonl"),
                               run_dir=tmp, rungs=rungs, alloc=alloc, save_every=10**6)
                run_training(job)
                cells, top = [], None
                for b in rungs:
                    steps = json.loads((rung_dir(tmp, b) / "ledger.json").read_text())["steps"]
                    top = scores(base, rung_dir(tmp, b), records, spec)
                    cells.append(f"{b:.2g} (step {steps}): {line(top)}")
                rewards = [json.loads(row)["reward_mean"]
                           for row in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
            s0, s1 = before["sampled_pass1"], top["sampled_pass1"]
            gain = s1.acc - s0.acc
            passed = gain >= 0.15 and s1.lo > s0.hi
            truncated = s1.details.get("failures", {}).get("truncated", float("nan"))
            print(f"  lr {lr:g}: " + "; ".join(cells)
                  + f"; top-rung truncated share {truncated:.3f}; reward by quarter "
                  f"{quarters(rewards)}; gain {gain:+.3f} {'PASS' if passed else 'fail'}",
                  flush=True)


if __name__ == "__main__":
    main()
