"""Seconds beside FLOPs in a finished study: per size and phase, wall seconds, achieved FLOP/s
and utilisation (MFU) of the training runs at their top rung.

    python bench/performance/utilisation.py [reports/runs.csv]

Reads the runs table's perf columns (:data:`race.analysis.columns.PERF_COLUMNS`) for the full
grid at its largest budget and prints, per size and budget phase, the median over its cells of
the phase's seconds, its share of the run's seconds and of its model FLOPs, the achieved
executed FLOP/s and the MFU against the run's ``peak_flops`` (on a CPU a matmul rate measured
at the job's start: race.flops.peak). Where the share of seconds and the share of FLOPs part,
an iso-FLOP comparison of allocations is not an iso-time one. Prints, never asserts.
"""

import argparse

import pandas as pd

from race.flops.ledger import BUDGET_PHASES


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="?", default="reports/runs.csv")
    args = parser.parse_args()
    runs = pd.read_csv(args.runs)
    top = runs[(runs.stage == "full") & (runs.budget == runs.budget.max())]
    if "peak_flops" not in top or top.peak_flops.isna().all():
        raise SystemExit(f"{args.runs}: no perf columns (a study trained before perf.json)")
    print(f"{len(top)} cells at budget {runs.budget.max():.2g}; device "
          f"{', '.join(sorted(top.device.dropna().unique()))}, median peak "
          f"{top.peak_flops.median():.3g} FLOP/s")
    seconds = top[[f"seconds_{p}" for p in BUDGET_PHASES]].sum(axis=1)
    for size, g in top.groupby("size", sort=False):
        for p in BUDGET_PHASES:
            share_s = (g[f"seconds_{p}"] / seconds[g.index]).median()
            share_f = (g[f"flops_{p}"] / g.flops_total).median()
            print(f"  {size:<6} {p:<9} {g[f'seconds_{p}'].median():7.1f} s  "
                  f"{100 * share_s:5.1f}% of seconds  {100 * share_f:5.1f}% of FLOPs  "
                  f"{g[f'exec_flops_per_s_{p}'].median():9.3g} FLOP/s  "
                  f"MFU {100 * g[f'mfu_{p}'].median():5.1f}%")


if __name__ == "__main__":
    main()
