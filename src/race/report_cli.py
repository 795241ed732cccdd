"""``race select`` (the RACE checkpoint) and ``race report`` (everything under reports/).

    race select PILOT_CSV --top-k K --baseline ALLOC [--targets T ...] --out selected.json
    race report RUNS_CSV --out reports/ [--config config.yaml]
                [--pilot-csv P] [--validation-csv V] [--full-csv F]

``select`` reads the pilot rows of PILOT_CSV (``stage`` == "pilot"; a table without a ``stage``
column is taken as all pilot) and writes the selected (size, reward, alloc) set with the pilot
rankings. ``report`` separates the grids by the ``stage`` column of RUNS_CSV; a per-stage CSV
replaces that stage's rows (see :mod:`race.report`).
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd


def _pilot_rows(path: str) -> pd.DataFrame:
    from race.frontier import normalise_runs

    df = pd.read_csv(path)
    if "stage" not in df.columns:
        return normalise_runs(df.assign(stage="pilot"))
    df = normalise_runs(df)
    pilot = df[df["stage"] == "pilot"].reset_index(drop=True)
    if pilot.empty:
        raise SystemExit(f"race select: {path} has no rows with stage == 'pilot' "
                         f"(stages: {sorted(df['stage'].unique())})")
    return pilot


def run_select(args: argparse.Namespace) -> int:
    from race.race_protocol import write_selection

    pilot = _pilot_rows(args.pilot_csv)
    try:
        doc = write_selection(pilot, args.top_k, args.baseline, args.out, args.targets)
    except ValueError as exc:
        raise SystemExit(f"race select: {exc}") from exc
    print(f"race select: {len(doc['selected'])} configs -> {args.out}", file=sys.stderr)
    return 0


def run_report(args: argparse.Namespace) -> int:
    from race.report import write_reports

    try:
        paths = write_reports(args.runs_csv, args.out, args.config, pilot_csv=args.pilot_csv,
                              validation_csv=args.validation_csv, full_csv=args.full_csv)
    except ValueError as exc:  # a table or target problem: say it, no traceback
        raise SystemExit(f"race report: {exc}") from exc
    print(f"race report: {len(paths)} files -> {args.out}", file=sys.stderr)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``select`` and ``report`` to the ``race`` command line."""
    sel = subparsers.add_parser(
        "select", help="RACE checkpoint: pick the configs to validate from the pilot grid",
        description="Rank configs on the pilot grid per (reward, target) and select, per "
                    "reward, the union over targets of the top-k plus the baseline allocation "
                    "at every size.")
    sel.add_argument("pilot_csv", metavar="PILOT_CSV",
                     help="runs table; its stage == 'pilot' rows are used")
    sel.add_argument("--top-k", type=int, required=True, help="configs kept per (reward, target)")
    sel.add_argument("--baseline", required=True, help="allocation always kept at every size")
    sel.add_argument("--targets", nargs="+", default=None,
                     help="evaluation targets to rank on (default: every target with a value)")
    sel.add_argument("--out", required=True, help="selected.json to write")
    sel.set_defaults(func=run_select)

    rep = subparsers.add_parser(
        "report", help="write frontier tables, figures and report.md",
        description="Write reports/: runs, frontier, regime, missing, RACE agreement and fit "
                    "tables, six figures (PNG and SVG) and report.md.")
    rep.add_argument("runs_csv", metavar="RUNS_CSV",
                     help="runs table; grids separated by its stage column")
    rep.add_argument("--out", required=True, help="output directory (e.g. reports/)")
    rep.add_argument("--config", default=None,
                     help="study config YAML (reads study and eval.targets)")
    rep.add_argument("--pilot-csv", default=None, help="pilot rows (replace stage == 'pilot')")
    rep.add_argument("--validation-csv", default=None,
                     help="validation rows (replace stage == 'validation')")
    rep.add_argument("--full-csv", default=None, help="full-grid rows (replace stage == 'full')")
    rep.set_defaults(func=run_report)
