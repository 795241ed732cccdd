"""Length-grouped micro-batches vs the batch padded whole, for base-policy pretraining.

    python bench/performance/length_groups.py [--sizes nano mini] [--tokens 200000]
        [--rounds 3]

Pretrains each size for ``--tokens`` real tokens (the default study's spec otherwise; a short
budget, so the wall time is the SFT loop's, not the final evaluation's) with
``length_groups_per_batch`` = 1 (one padded batch) and :data:`race.policy.optim.LENGTH_GROUPS`,
alternating for ``--rounds`` rounds on one thread, and prints each round's wall seconds, the
median ratio grouped / whole, the final losses (the same gradient: equal up to float rounding)
and executed / model FLOPs (padding run). PRM training batches through the same helper. Needs
the default study's data and tokenizer (``make run``) or ``--results`` of another study.
Prints, never asserts.
"""

import argparse
import statistics
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from race.core.specs import PretrainSpec
from race.policy.optim import LENGTH_GROUPS
from race.policy.pretrain import pretrain


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default="results", type=Path)
    parser.add_argument("--sizes", nargs="+", default=["nano", "mini"])
    parser.add_argument("--tokens", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = replace(PretrainSpec(), token_budget=args.tokens, eval_examples=20)
    for size in args.sizes:
        walls: dict[int, list[float]] = {1: [], LENGTH_GROUPS: []}
        records: dict[int, dict] = {}
        for r in range(args.rounds):
            for groups in walls:
                with tempfile.TemporaryDirectory() as out:
                    t0 = time.perf_counter()
                    records[groups] = pretrain(size, args.results / "data",
                                               args.results / "tokenizer", out, spec,
                                               length_groups_per_batch=groups)
                    walls[groups].append(time.perf_counter() - t0)
            print(f"{size} round {r}: whole {walls[1][-1]:.1f} s, {LENGTH_GROUPS} groups "
                  f"{walls[LENGTH_GROUPS][-1]:.1f} s", flush=True)
        pairs = zip(walls[LENGTH_GROUPS], walls[1], strict=True)
        ratio = statistics.median(g / w for g, w in pairs)
        print(f"{size}: median wall ratio {LENGTH_GROUPS} groups / whole = {ratio:.2f}")
        for groups, rec in records.items():
            print(f"  groups {groups}: final loss {rec['final_loss']:.5f}, executed / model "
                  f"FLOPs {rec['executed_flops'] / rec['model_flops']:.3f}")


if __name__ == "__main__":
    main()
