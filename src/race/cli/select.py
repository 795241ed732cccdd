"""``race select``: the RACE checkpoint. Ranks configs on the pilot rows of PILOT_CSV per
(reward, target) and writes, per reward, the union over targets of the top-k plus the baseline
allocation at every size, with the pilot rankings.

    race select PILOT_CSV --top-k K --baseline ALLOC [--targets T ...] --out selected.json
"""

from __future__ import annotations

import sys

HELP = "RACE checkpoint: pick the configs to validate from the pilot grid"


def add_arguments(p) -> None:
    p.add_argument("pilot_csv", metavar="PILOT_CSV",
                   help="runs table; its stage == 'pilot' rows are used (all rows without a "
                        "stage column)")
    p.add_argument("--top-k", type=int, required=True, help="configs kept per (reward, target)")
    p.add_argument("--baseline", required=True, help="allocation always kept at every size")
    p.add_argument("--targets", nargs="+", default=None,
                   help="evaluation targets to rank on (default: every target with a value)")
    p.add_argument("--out", required=True, help="selected.json to write")


def run(args) -> int:
    from race.analysis.protocol import read_pilot, write_selection

    try:
        doc = write_selection(read_pilot(args.pilot_csv), args.top_k, args.baseline, args.out,
                              args.targets)
    except ValueError as exc:
        raise SystemExit(f"race select: {exc}") from exc
    print(f"race select: {len(doc['selected'])} configs -> {args.out}", file=sys.stderr)
    return 0
