"""Length-sorted batching vs the caller's order for sampled evaluation, side by side.

    python bench/performance/generation_order.py [--policy results/base/size~mini]
        [--adapter DIR] [--engine fused]

Generates sampled_pass1's workload (the first ``--prompts`` eval-in prompts x ``--samples`` at
temperature 1, batches of ``--batch-size``, one thread, decoded by ``--engine``: the default
study's) with ``generate(length_sorted=True)``
and ``length_sorted=False``, alternating for ``--rounds`` rounds, and prints each round's wall
seconds, the median ratio sorted / caller order, and the decode steps each batching ran
(model FLOPs are the same; executed FLOPs follow the decode steps). Needs the default study's
base policies (``make run``) or any local policy folder. Prints, never asserts.
"""

import argparse
import statistics
import time

import torch

from race.core.engines import ROLLOUT_ENGINES
from race.data.task import load_jsonl
from race.evaluation.snapshot import load_snapshot
from race.policy.generation import generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="results/base/size~mini")
    parser.add_argument("--adapter", default=None, help="a rung's adapter folder (merged)")
    parser.add_argument("--data", default="results/data/eval_in.jsonl")
    parser.add_argument("--engine", default="fused", choices=ROLLOUT_ENGINES)
    parser.add_argument("--prompts", type=int, default=400)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    snap = load_snapshot(args.policy, args.adapter)
    prompts = [r.prompt for r in load_jsonl(args.data)[:args.prompts]]
    walls: dict[bool, list[float]] = {True: [], False: []}
    steps: dict[bool, list[int]] = {}
    for r in range(args.rounds):
        for sort in (False, True) if r % 2 == 0 else (True, False):
            t0 = time.perf_counter()
            gens = generate(snap.model, snap.tokenizer, prompts, engine=args.engine,
                            max_new_tokens=args.max_new_tokens,
                            batch_size=args.batch_size, do_sample=True, seed=r,
                            num_return_sequences=args.samples, length_sorted=sort)
            walls[sort].append(time.perf_counter() - t0)
            steps[sort] = [b.new_tokens_run for b in gens.batches]
        print(f"round {r}: caller order {walls[False][-1]:.2f} s, length-sorted "
              f"{walls[True][-1]:.2f} s")
    ratio = statistics.median(s / c for s, c in zip(walls[True], walls[False], strict=True))
    print(f"{len(prompts)} prompts x {args.samples} samples, batches of {args.batch_size}: "
          f"length-sorted / caller order wall = {ratio:.2f} (median of {args.rounds} rounds)")
    for sort, label in ((False, "caller order"), (True, "length-sorted")):
        print(f"  decode steps per batch, {label}: {steps[sort]} (sum {sum(steps[sort])})")


if __name__ == "__main__":
    main()
