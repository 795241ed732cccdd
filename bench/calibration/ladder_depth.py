"""Why the ladder has a depth floor: pretrain one ladder width at several depths with the same
token budget and print greedy eval-in accuracy per depth.

    python bench/calibration/ladder_depth.py [--size nano] [--depths 2 3 4] [--config config.yaml]
        [--data results/data] [--tokenizer results/tokenizer]

Uses the study's data and tokenizer (``snakemake results/data/train.jsonl
results/tokenizer/tokenizer.json`` builds them) and its ``pretrain:`` settings. Each depth is one
``race pretrain`` run (about 1-2 minutes on one core at the default token budget); the models go
to a temporary directory and are discarded.
"""

import argparse
import tempfile

import torch

from race.core.specs import PretrainSpec
from race.policy.pretrain import pretrain
from race.study.config import load_config


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="nano")
    parser.add_argument("--depths", type=int, nargs="+", default=[2, 3, 4])
    parser.add_argument("--config", default="config.yaml")
    parser.add_argument("--data", default="results/data")
    parser.add_argument("--tokenizer", default="results/tokenizer")
    args = parser.parse_args()
    torch.set_num_threads(1)
    spec = PretrainSpec(**load_config(args.config)["pretrain"])
    print(f"{'size':6} {'layers':>6} {'params':>9} {'eval-in acc':>11} {'n':>4} {'wall s':>7}")
    for depth in args.depths:
        with tempfile.TemporaryDirectory() as out:
            rec = pretrain(args.size, args.data, args.tokenizer, out, spec, layers=depth)
        print(f"{args.size:6} {rec['layers']:>6} {rec['params']:>9,} "
              f"{rec['eval_in_accuracy']:>11.3f} {rec['eval_in_n']:>4} {rec['wall_s']:>7.1f}",
              flush=True)


if __name__ == "__main__":
    main()
