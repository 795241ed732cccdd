"""``race report``: everything under reports/ -- runs, frontier, regime, missing, RACE agreement
and fit tables, the prompts and seeds each undecided comparison needs (power.csv), the
frontier in measured seconds (time_frontier.csv), six overview figures and their single-column
versions (PNG and SVG; the per-target ones for the study's RACE targets), report.md (the
findings first), summary.md (the findings alone: the study's answer in sentences, each with
its numbers and whether it is decided), and the pages Snakemake's HTML report shows
(report.html, one caption per figure: race.analysis.report_pages).

    race report RUNS_CSV --out reports/ [--config config.yaml] [--threads N]
                [--pilot-csv P] [--validation-csv V] [--full-csv F] [--prm PRM_JSON ...]

The grids are separated by the ``stage`` column of RUNS_CSV; a per-stage CSV replaces that
stage's rows (see race.analysis.report).
"""

from __future__ import annotations

import sys
from pathlib import Path

HELP = "write the findings (summary.md), frontier tables, figures and report.md"


def add_arguments(p) -> None:
    p.add_argument("runs_csv", metavar="RUNS_CSV",
                   help="runs table; grids separated by its stage column")
    p.add_argument("--out", required=True, help="output directory (e.g. reports/)")
    p.add_argument("--config", default=None,
                   help="study config: a YAML file or the workflow's JSON slice (reads study, "
                        "eval.targets, race.targets: the findings' headline target, rewards)")
    p.add_argument("--pilot-csv", default=None, help="pilot rows (replace stage == 'pilot')")
    p.add_argument("--validation-csv", default=None,
                   help="validation rows (replace stage == 'validation')")
    p.add_argument("--full-csv", default=None, help="full-grid rows (replace stage == 'full')")
    p.add_argument("--prm", nargs="*", default=[], metavar="PRM_JSON",
                   help="prm.json of each PRM the study trained (the feedback-model table)")
    p.add_argument("--threads", type=int, default=1,
                   help="processes for the fits, bands and figures (same files for any number)")


def run(args) -> int:
    from race.analysis.report import write_reports
    from race.analysis.report_pages import write_pages

    try:
        paths = write_reports(args.runs_csv, args.out, args.config, pilot_csv=args.pilot_csv,
                              validation_csv=args.validation_csv, full_csv=args.full_csv,
                              workers=args.threads, prm_records=args.prm)
        paths += write_pages(args.out)
    except ValueError as exc:  # a table or target problem: say it, no traceback
        raise SystemExit(f"race report: {exc}") from exc
    print(f"race report: {len(paths)} files -> {args.out} (the findings: "
          f"{Path(args.out) / 'summary.md'})", file=sys.stderr)
    return 0
