"""Do two runs tables of one study agree apart from their wall-clock columns?

    python bench/study/same_runs.py results/runs.csv OTHER/results/runs.csv
    git show HEAD:reports/runs.csv > old.csv
    python bench/study/same_runs.py old.csv reports/runs.csv
    python bench/study/same_runs.py A/runs.csv B/runs.csv --reward rule --stage full

Rows are matched by (stage, cell, budget). The columns left out are
:data:`race.analysis.columns.TIMING_COLUMNS` (wall seconds, per-phase seconds, FLOP/s, MFU and
the measured peak): every other column -- accuracies and their intervals, FLOPs per phase,
steps, updates, tokens -- is a function of the config, the seeds, the code and the kernels it
computed with. Prints the rows of each, whether they are identical, and for each differing
column how many rows differ and by at most how much. ``--reward`` / ``--stage`` compare only
those rows: after a change that only some cells see (a retrained PRM leaves the rule-reward
cells' training alone; the pilot may then validate other configs), whether the rest stayed put.
Prints, never asserts.
"""

import argparse

import pandas as pd

from race.analysis.columns import TIMING_COLUMNS

KEYS = ["stage", "cell", "budget"]


def select(runs: pd.DataFrame, args: argparse.Namespace) -> pd.DataFrame:
    """The rows of ``runs`` that ``--reward`` and ``--stage`` keep."""
    for column in ("reward", "stage"):
        if getattr(args, column):
            runs = runs[runs[column] == getattr(args, column)]
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--reward", help="only this reward system's rows")
    parser.add_argument("--stage", help="only this stage's rows (pilot, validation, full)")
    args = parser.parse_args()
    a, b = (select(pd.read_csv(path), args).drop(columns=TIMING_COLUMNS, errors="ignore")
            .sort_values(KEYS).reset_index(drop=True) for path in (args.first, args.second))
    print(f"{args.first}: {a.shape[0]} rows; {args.second}: {b.shape[0]} rows; "
          f"{len(a.columns)} columns compared ({len(TIMING_COLUMNS)} timing columns left out)")
    if list(a.columns) != list(b.columns) or not a[KEYS].equals(b[KEYS]):
        print("different columns or rows: not the same study grid")
        return
    if a.equals(b):
        print("identical apart from the timing columns")
        return
    for column in a.columns:
        if a[column].equals(b[column]):
            continue
        differs = ~((a[column] == b[column]) | (a[column].isna() & b[column].isna()))
        # a boolean column is numeric to pandas, but its rows cannot be subtracted
        numeric = (pd.api.types.is_numeric_dtype(a[column])
                   and not pd.api.types.is_bool_dtype(a[column]))
        gap = (f", at most {(a[column] - b[column]).abs().max():.3g}" if numeric else "")
        print(f"  {column}: {int(differs.sum())} rows differ{gap}")


if __name__ == "__main__":
    main()
