"""The numbers a report is made from: :class:`Report` (every table, figure input and finding
of one study, built by :func:`race.analysis.report.analyse`) and the nested-rung savings
(:func:`nested_savings`). No I/O and no Markdown."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pandas as pd

from race.analysis import figures
from race.analysis.frontier import CELL_KEYS
from race.analysis.power import POWER_COLUMNS
from race.analysis.prm_quality import FEEDBACK_COLUMNS
from race.analysis.protocol import Agreement, PilotCost
from race.analysis.seeds import SEED_COLUMNS
from race.analysis.time_frontier import TIME_COLUMNS

#: The figures' folder, relative to the report's directory.
FIGURE_DIR = "figures"


@dataclass(frozen=True)
class NestedSavings:
    """Model FLOPs with nested rungs (one run per cell) vs one run per (cell, rung)."""

    n_cells: int
    n_rungs: int  # (cell, rung) rows
    separate_flops: float  # sum over cells of the FLOPs used at every rung
    nested_flops: float  # sum over cells of the FLOPs used at the largest rung
    saved_flops: float

    @property
    def saved_share(self) -> float:
        return self.saved_flops / self.separate_flops if self.separate_flops else math.nan


def nested_savings(runs: pd.DataFrame) -> NestedSavings:
    """Saved = sum over runs of (sum over its rungs of FLOPs used - the largest rung's).

    A run is a cell (size, reward, alloc, seed), whichever grids name it: the pilot is the
    first seed's grid cells at the cheap rungs, and a validated config at a seed the grid runs
    is that same run carried on to the validation budget. So each (cell, rung) counts once,
    not once per grid that lists it; the base rows (budget 0: no RL step) are no rung.
    """
    rungs = runs[runs["budget"] > 0].drop_duplicates(CELL_KEYS + ["budget"])
    g = rungs.groupby(CELL_KEYS)["flops_total"]
    separate, nested = float(g.sum().sum()), float(g.max().sum())
    return NestedSavings(int(g.ngroups), int(len(rungs)), separate, nested, separate - nested)


@dataclass
class Report:
    """Everything the tables, figures and report.md are made from
    (:func:`race.analysis.report.analyse`)."""

    study: str
    runs: pd.DataFrame  # all stages, sorted
    targets: list[str]
    summary: pd.DataFrame  # seed summary per reward, target, budget, size, alloc
    frontier: pd.DataFrame
    regime: pd.DataFrame
    missing: pd.DataFrame
    points: pd.DataFrame  # fit inputs: mean FLOPs and accuracy per config, target and rung
    fits: pd.DataFrame
    bands: pd.DataFrame  # the fits' drawn curves and 95% bands (race.analysis.fit.band_table)
    rankings: pd.DataFrame  # pilot ranking (empty without pilot rows)
    agreement: Agreement | None  # None without pilot or validation rows
    cost: PilotCost | None  # None without pilot rows
    savings: NestedSavings
    #: name -> [png, svg] relative to the report's directory (filled when written)
    figures: dict[str, list[str]] = field(default_factory=dict)
    #: name -> its single-column PNGs relative to the report's directory (filled when written)
    panels: dict[str, list[str]] = field(default_factory=dict)
    #: configured targets with no value in the table
    targets_not_evaluated: list[str] = field(default_factory=list)
    #: the trained PRMs' held-out quality (race.analysis.prm_quality), empty without one
    feedback: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=FEEDBACK_COLUMNS))
    #: the target the findings speak of (race.analysis.findings.headline_target)
    headline: str = ""
    #: undecided comparisons with the prompts and seeds that would decide them (power.csv)
    power: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=POWER_COLUMNS))
    #: comparisons whose leader ran on several seeds: does it lead on each? (seed_checks.csv)
    seed_checks: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=SEED_COLUMNS))
    #: the frontier at equal measured seconds beside the FLOP one (time_frontier.csv)
    time: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=TIME_COLUMNS))
    #: each allocation's phase shares at the largest rung (allocation_split.csv), its median
    #: steps per size and rung, and each reward system's reward share of its FLOPs
    split: pd.DataFrame = field(default_factory=pd.DataFrame)
    steps: pd.DataFrame = field(default_factory=pd.DataFrame)
    shares: pd.DataFrame = field(default_factory=pd.DataFrame)

    def figure_data(self) -> figures.FigureData:
        return figures.FigureData(runs=self.runs, summary=self.summary, frontier=self.frontier,
                                  regime=self.regime, points=self.points, fits=self.fits,
                                  bands=self.bands, targets=self.targets,
                                  agreement=self.agreement)

    @property
    def not_run(self) -> list[str]:
        """Figures that say "not run" (their input grid is absent)."""
        return figures.not_run_figures(self.figure_data())
