"""What every report figure shares: colours, markers, the data they draw from, the theme,
panel titles, the "not run" figure and the byte-stable writer (:mod:`race.analysis.figures`,
:mod:`race.analysis.paper_figures`).

Conventions: one colour per allocation in every figure (:func:`alloc_palette`, fixed by the
sorted allocation names of the whole table), one marker and line style per policy size, phases
in greys (so that colour always means allocation).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from race.analysis.columns import TARGET_LABELS
from race.analysis.fit import BAND_COLUMNS, band_table
from race.analysis.frontier import pooled, size_order
from race.analysis.protocol import Agreement

MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p"]
LINESTYLES = ["-", "--", ":", "-.", (0, (5, 1)), (0, (1, 3))]
#: Phases are not allocations: greys, so that colour always means allocation.
PHASE_COLOURS = {"rollout": "#404040", "learning": "#8c8c8c", "reward": "#d0d0d0"}
PANEL_W, PANEL_H = 3.6, 2.9


def alloc_palette(allocs: list[str]) -> dict[str, tuple[float, float, float]]:
    """Allocation -> colour, from the sorted names (the same in every figure of a report)."""
    names = sorted(set(allocs))
    base = "colorblind" if len(names) <= 10 else "husl"
    return dict(zip(names, sns.color_palette(base, len(names)), strict=True))


@dataclass
class FigureData:
    """Everything the figures draw from, computed once by the report.

    ``runs``: pooled runs table; ``summary``: :func:`race.analysis.frontier.config_summary`;
    ``frontier`` / ``regime``: the frontier tables; ``points`` / ``fits`` / ``bands``:
    :mod:`race.analysis.fit` rung points, fit table and the fits' curves with their 95% bands
    (:func:`race.analysis.fit.band_table`; computed here when not given); ``agreement``: None
    when the validation grid was not run.
    """

    runs: pd.DataFrame
    summary: pd.DataFrame
    frontier: pd.DataFrame
    regime: pd.DataFrame
    points: pd.DataFrame
    fits: pd.DataFrame
    targets: list[str]
    agreement: Agreement | None = None
    sizes: list[str] = field(default_factory=list)
    rewards: list[str] = field(default_factory=list)
    palette: dict[str, tuple[float, float, float]] = field(default_factory=dict)
    bands: pd.DataFrame | None = None

    def __post_init__(self) -> None:
        self.runs = pooled(self.runs) if len(self.runs) else self.runs
        if self.bands is None:
            self.bands = (band_table(self.points, self.fits) if len(self.fits)
                          else pd.DataFrame(columns=BAND_COLUMNS))
        if not self.sizes and len(self.runs):
            self.sizes = size_order(self.runs)
        if not self.rewards and len(self.runs):
            self.rewards = sorted(self.runs["reward"].unique())
        if not self.palette and len(self.runs):
            self.palette = alloc_palette(list(self.runs["alloc"].unique()))

    @property
    def allocs(self) -> list[str]:
        return list(self.palette)

    def marker(self, size: str) -> str:
        return MARKERS[self.sizes.index(size) % len(MARKERS)]

    def linestyle(self, size: str) -> object:
        return LINESTYLES[self.sizes.index(size) % len(LINESTYLES)]


# ----------------------------------------------------------------------------------------------
# Shared pieces


@contextlib.contextmanager
def style(rc: dict[str, object] | None = None) -> Iterator[None]:
    """Theme for drawing and saving (rcParams are read at save time too); ``rc``: rcParams
    that replace the theme's (the single-column figures' larger text)."""
    theme = {"svg.hashsalt": "race", "svg.fonttype": "path", "figure.dpi": 100,
             "axes.titlesize": 9, "axes.labelsize": 8, "xtick.labelsize": 7,
             "ytick.labelsize": 7, "legend.fontsize": 7, "figure.titlesize": 11}
    with sns.axes_style("whitegrid"), mpl.rc_context({**theme, **(rc or {})}):
        yield


def panel_title(reward: str, target: str) -> str:
    return f"{reward} reward · {TARGET_LABELS.get(target, target)}"


def grid(n_rows: int, n_cols: int, title: str, **kw: object) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(PANEL_W * n_cols + 1.6, PANEL_H * n_rows + 1.0), layout="constrained")
    axes = np.atleast_2d(fig.subplots(n_rows, n_cols, squeeze=False, **kw))
    fig.suptitle(title)
    return fig, axes


def not_run(title: str, reason: str) -> Figure:
    fig = Figure(figsize=(6.5, 2.6), layout="constrained")
    ax = fig.subplots()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, f"not run: {reason}", ha="center", va="center", fontsize=11,
            transform=ax.transAxes)
    return fig


def legend_items(data: FigureData, extra: list[object] | None = None,
                 sizes: bool = True) -> list[object]:
    """Handles: one colour patch per allocation, one marker/line per size, then ``extra``."""
    handles = [Patch(color=data.palette[a], label=a) for a in data.allocs]
    if sizes:
        handles += [Line2D([], [], color="0.3", marker=data.marker(s), linestyle=data.linestyle(s),
                           label=s) for s in data.sizes]
    return handles + list(extra or [])


def legend(fig: Figure, data: FigureData, extra: list[object] | None = None,
           sizes: bool = True) -> None:
    """The overview's legend, right of the panels."""
    fig.legend(handles=legend_items(data, extra, sizes), loc="outside right center",
               title="alloc / size" if sizes else "allocation", frameon=False)


def fmt_flops(x: float) -> str:
    return f"{x:.1e}".replace("e+", "e")


def save(fig: Figure, out_dir: str | Path, name: str, dpi: float = 110,
         rc: dict[str, object] | None = None) -> list[Path]:
    """Write ``name.png`` (``dpi`` pixels per inch) and ``name.svg`` (no date metadata) in the
    theme (:func:`style`, with ``rc``); return both paths. ``name`` may hold "/" (a
    subfolder)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    with style(rc):
        fig.savefig(paths[0], dpi=dpi, metadata={"Software": None})
        # The PNG's draw placed every axes (constrained layout): keep that layout for the SVG
        # instead of solving it again (about a third of the report job's time).
        fig.set_layout_engine("none")
        fig.savefig(paths[1], metadata={"Date": None, "Creator": None})
    return paths
