"""Calibrate the analytic FLOP model against torch's FlopCounterMode.

    python bench/calibration/flops_calibration.py

For each tiny Qwen2 config and attention implementation (eager, CPU SDPA with the registered
formulas) it measures one batch per phase and prints measured / analytic-executed (1.000000 =
exact), plus model / executed (how much the causal triangle and padding-free counting save) and
the wall time of the measured runs. Nothing is asserted: tests/test_flops.py holds the bar.
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: bench.common

import torch

from bench.common import BATCH, NEW, PROMPT, RANK, SEQ, flop_configs, phases

warnings.filterwarnings("ignore")


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the "use_cache is incompatible with checkpointing" note
    torch.set_num_threads(1)
    print(f"batch {BATCH}, seq {SEQ}, generate {PROMPT}+{NEW}, LoRA r={RANK}\n")
    header = (f"{'config':<15} {'attn':<6} {'phase':<20} {'measured':>12} {'executed':>12} "
              f"{'meas/exec':>10} {'model/exec':>10} {'wall_s':>7}")
    print(header)
    print("-" * len(header))
    worst = 0.0
    for cname, values in flop_configs().items():
        for impl in ("eager", "sdpa"):
            for phase, measure, executed, model in phases(values, impl):
                torch.manual_seed(0)
                start = time.perf_counter()
                measured = measure()
                wall = time.perf_counter() - start
                ratio = measured / executed
                worst = max(worst, abs(ratio - 1))
                print(f"{cname:<15} {impl:<6} {phase:<20} {measured:>12} {executed:>12} "
                      f"{ratio:>10.6f} {model / executed:>10.4f} {wall:>7.3f}")
    print(f"\nlargest |measured/executed - 1| = {worst:.2e}")


if __name__ == "__main__":
    main()
