"""``race aggregate``: collect the run folders into the runs tables (``--pilot``: the pilot
alone, what ``race select`` ranks)."""

from __future__ import annotations

HELP = "collect run folders into the runs tables"


def add_arguments(p) -> None:
    p.add_argument("--config", required=True, help="study config (file or the workflow's JSON)")
    p.add_argument("--selected", help="RACE selection (selected.json) to add validation runs")
    p.add_argument("--pilot", action="store_true",
                   help="write only the pilot table (what race select ranks)")
    p.add_argument("--out", required=True, help="output CSV (e.g. results/runs.csv)")


def run(args) -> int:
    from race.analysis.aggregate import write_pilot_table, write_tables
    from race.study.config import load_study

    study = load_study(args.config)
    if args.pilot:
        if args.selected:
            raise SystemExit("race aggregate: --pilot and --selected do not combine (the pilot "
                             "comes before the selection)")
        print(write_pilot_table(study, args.out))
    else:
        print(write_tables(study, args.out, args.selected))
    return 0
