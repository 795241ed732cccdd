"""How one regime-map cell is drawn (:func:`race.analysis.figures.plot_regime_map`).

Only a *decided* winner (``decided`` in the regime table: a single winner with
``gap_z >= DECIDED_Z``) is drawn in its allocation's colour. A tie is solid grey, an undecided
cell (z below the threshold, NaN z, or a lone candidate) is hatched light grey with the leader's
name, a "?" and its z; neither grey is an allocation colour, so colour always means "won".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd
from matplotlib.patches import Patch

from race.analysis.frontier import DECIDED_Z

TIE_COLOUR = "#bdbdbd"
UNDECIDED_COLOUR = "#f2f2f2"
UNDECIDED_EDGE = "#969696"
UNDECIDED_HATCH = "////"
UNDECIDED_LABEL = f"undecided (z < {DECIDED_Z:g})"


@dataclass(frozen=True)
class RegimeCell:
    """``kind``: "winner", "tie", "undecided" or "no value"; ``code``: the colormap index
    (allocations in order, then tie, then undecided; NaN = nothing drawn); ``text``: the label."""

    kind: str
    code: float
    text: str


def _z_text(gap_z: object, n_candidates: object) -> str:
    if not pd.isna(gap_z):
        return f"z={float(gap_z):.1f}"
    return "alone" if n_candidates == 1 else "z=n/a"


def regime_cell(row: object, allocs: list[str]) -> RegimeCell:
    """The drawing of one regime-table row (a namedtuple or Series with best_alloc, tie,
    decided, gap_z and n_candidates) on a map whose allocations are ``allocs``."""
    best = str(row.best_alloc or "")
    if not best:
        return RegimeCell("no value", math.nan, "n/a")
    if bool(row.tie):
        return RegimeCell("tie", float(len(allocs)), best.replace("|", "|\n"))
    if not bool(row.decided):
        return RegimeCell("undecided", float(len(allocs) + 1),
                          f"{best}?\n{_z_text(row.gap_z, row.n_candidates)}")
    return RegimeCell("winner", float(allocs.index(best)), best)


def cell_colours(palette: dict[str, object], allocs: list[str]) -> list[object]:
    """Colormap entries in :attr:`RegimeCell.code` order."""
    return [palette[a] for a in allocs] + [TIE_COLOUR, UNDECIDED_COLOUR]


def hatch_patch_kw() -> dict[str, object]:
    """Keyword arguments of the hatching drawn over an undecided cell."""
    return {"fill": False, "hatch": UNDECIDED_HATCH, "edgecolor": UNDECIDED_EDGE,
            "linewidth": 0, "zorder": 1.5}  # over the cell colour, under its label


def legend_handles() -> list[Patch]:
    """Tie and undecided entries of the regime map's legend."""
    return [Patch(color=TIE_COLOUR, label="tie"),
            Patch(facecolor=UNDECIDED_COLOUR, edgecolor=UNDECIDED_EDGE, hatch=UNDECIDED_HATCH,
                  label=UNDECIDED_LABEL)]
