"""Single-column versions of the report figures, for a paper: one legible figure per reward (or
per reward and target), beside the overview grids of :mod:`race.analysis.figures`.

Files, relative to the figures folder (``reports/figures/``), each as PNG and SVG:

- ``frontier/<reward>/<target>``, ``regime_map/<reward>/<target>``,
  ``race_agreement/<reward>/<target>``, ``fits/<reward>/<target>``: one panel each;
- ``compute_breakdown/<reward>``: one panel per policy size, stacked;
- ``same_flop/<reward>``: updates above rollouts.

``<reward>`` is the reward system's name and ``<target>`` the evaluation target's key (e.g.
``in_pass1``), as in the runs table (a "/" in a name would become "--").

Conventions: :data:`COLUMN_W` = 3.4 inches wide (one column of a two-column paper), the height
following the content; no text smaller than :data:`MIN_PT` = 7 points (panel titles and axis
labels 8, ticks, legends and annotations 7); PNG at :data:`PANEL_DPI` = 200 (680 pixels wide).
No figure title: a paper's caption states the question; each panel's title names its reward and
target. The legend sits under the panels. Colours, markers and what each panel draws are the
overview's (the ``draw_<name>`` functions of :mod:`race.analysis.figures`).

A figure that is not run (no runs; ``race_agreement`` without validation rows) has no panel
files: its folder is left empty and the overview figure says why. Each write first removes the
PNG and SVG files under every figure's folder, so a folder holds exactly this report's panels.
"""

from __future__ import annotations

import math
import textwrap
from functools import partial
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from race.analysis import figures
from race.analysis.figure_base import FigureData, legend_items, panel_title, save, style
from race.analysis.parallel import pmap
from race.analysis.regime_cells import legend_handles

COLUMN_W = 3.4
PANEL_DPI = 200
MIN_PT = 7
#: Height of one panel (axes, its title, labels and ticks), in inches.
PANEL_H = 2.7
#: Height of one stacked panel in the per-reward figures (compute_breakdown, same_flop).
STACKED_H = 2.1
#: The single-column theme: every text at least MIN_PT points.
RC = {"axes.titlesize": 8, "axes.labelsize": 8, "xtick.labelsize": MIN_PT,
      "ytick.labelsize": MIN_PT, "legend.fontsize": MIN_PT, "legend.title_fontsize": MIN_PT,
      "font.size": MIN_PT}

#: Figures with one file per (reward, target); the others have one file per reward.
PER_TARGET = ("frontier", "regime_map", "race_agreement", "fits")


def pattern(name: str) -> str:
    """The files of figure ``name`` relative to the figures folder, without the suffix."""
    return f"{name}/<reward>/<target>" if name in PER_TARGET else f"{name}/<reward>"


def _part(name: str) -> str:
    return str(name).replace("/", "--")


def panel_keys(data: FigureData, name: str,
               targets: list[str] | None = None) -> list[tuple[str, ...]]:
    """(reward, target) or (reward,) per file of figure ``name``; none when it is not run.
    ``targets``: the targets that get single-column files (default: all the data has)."""
    if name in figures.not_run_figures(data):
        return []
    if name in PER_TARGET:
        chosen = [t for t in (targets or data.targets) if t in data.targets] or data.targets
        return [(r, t) for r in data.rewards for t in chosen]
    return [(r,) for r in data.rewards]


def stem(name: str, key: tuple[str, ...]) -> str:
    """``name/<reward>[/<target>]``: the file's path under the figures folder, no suffix."""
    return "/".join([name] + [_part(k) for k in key])


def _title(text: str) -> str:
    return textwrap.fill(text, 46)


def _column(n_panels: int, panel_h: float, handles: list[object]) -> tuple[Figure, list]:
    """A COLUMN_W-wide figure of ``n_panels`` stacked axes with the legend under them, its
    columns as many as the longest label lets fit in the width."""
    longest = max((len(h.get_label()) for h in handles), default=1)
    # A legend entry at 7 pt: ~0.55 em per character, plus the handle and the gaps (~0.45 in).
    entry_w = longest * 0.55 * MIN_PT / 72 + 0.45
    ncols = max(1, min(len(handles), int((COLUMN_W - 0.1) // entry_w)))
    rows = math.ceil(len(handles) / ncols) if handles else 0
    height = n_panels * panel_h + 0.05 + (0.14 * rows + 0.08 if rows else 0)
    fig = Figure(figsize=(COLUMN_W, round(height, 2)), layout="constrained")
    axes = list(fig.subplots(n_panels, 1, squeeze=False)[:, 0])
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=ncols, frameon=False,
                   columnspacing=0.8, handlelength=1.6, handletextpad=0.4)
    return fig, axes


def _frontier(data: FigureData, reward: str, target: str) -> Figure:
    extra = [Line2D([], [], color="black", alpha=0.35, linewidth=2.2, label="best per budget"),
             Line2D([], [], color="grey", linewidth=0.9, label="base policy (no RL)")]
    fig, (ax,) = _column(1, PANEL_H, legend_items(data, extra))
    figures.draw_frontier(ax, data, reward, target)
    ax.set_title(_title(panel_title(reward, target)))
    return fig


def _regime_map(data: FigureData, reward: str, target: str) -> Figure:
    fig, (ax,) = _column(1, PANEL_H, legend_items(data, legend_handles(), sizes=False))
    figures.draw_regime_map(ax, data, reward, target, fontsize=MIN_PT)
    ax.set_title(_title(panel_title(reward, target)))
    return fig


def _race_agreement(data: FigureData, reward: str, target: str) -> Figure:
    fig, (ax,) = _column(1, PANEL_H, legend_items(data))
    figures.draw_race_agreement(ax, data, reward, target)
    ax.set_title(_title(panel_title(reward, target)))
    return fig


def _fits(data: FigureData, reward: str, target: str) -> Figure:
    fig, (ax,) = _column(1, PANEL_H, legend_items(data, [figures.band_handle()]))
    figures.draw_fits(ax, data, reward, target)
    ax.set_title(_title(panel_title(reward, target)))
    return fig


def _compute_breakdown(data: FigureData, reward: str) -> Figure:
    table = figures.breakdown_table(data.runs)
    fig, axes = _column(len(data.sizes), STACKED_H, figures.phase_handles())
    for ax, size in zip(axes, data.sizes, strict=True):
        figures.draw_compute_breakdown(ax, data, table, size, reward)
        ax.set_title(f"{size} · {reward} reward")
    return fig


def _same_flop(data: FigureData, reward: str) -> Figure:
    budget = figures.fmt_flops(figures.equal_budget(data.runs))
    fig, axes = _column(len(figures.SAME_FLOP_METRICS), STACKED_H,
                        legend_items(data, sizes=False))
    for ax, (col, _, label) in zip(axes, figures.SAME_FLOP_METRICS, strict=True):
        figures.draw_same_flop(ax, data, reward, col, label)
        ax.set_title(_title(f"{col} at {budget} model FLOPs · {reward} reward"))
    return fig


PANEL_PLOTTERS = {
    "frontier": _frontier,
    "compute_breakdown": _compute_breakdown,
    "same_flop": _same_flop,
    "regime_map": _regime_map,
    "race_agreement": _race_agreement,
    "fits": _fits,
}


def plot_panel(name: str, data: FigureData, *key: str) -> Figure:
    """The single-column figure of ``name`` for ``key`` = (reward, target) or (reward,)."""
    with style(RC):
        return PANEL_PLOTTERS[name](data, *key)


def clear(out_dir: str | Path) -> None:
    """Remove the PNG and SVG files (then empty folders) under each figure's panel folder."""
    for name in figures.FIGURE_NAMES:
        folder = Path(out_dir) / name
        if not folder.is_dir():
            continue
        for path in sorted(folder.rglob("*")):
            if path.is_file() and path.suffix in (".png", ".svg"):
                path.unlink()
        for path in sorted(folder.rglob("*"), reverse=True):
            if path.is_dir() and not any(path.iterdir()):
                path.rmdir()


def write_panels(data: FigureData, out_dir: str | Path, targets: list[str] | None = None,
                 workers: int = 1) -> dict[str, list[Path]]:
    """Every single-column figure under ``out_dir`` (the figures folder), in
    :data:`race.analysis.figures.FIGURE_NAMES` order: name -> [png, svg, png, svg, ...]. Each
    figure's folder exists afterwards, empty when the figure is not run. ``targets``: the
    targets with per-target files (the report passes the study's RACE targets: a paper shows
    the question's target; the overview grids keep every target). ``workers``: processes
    (:func:`race.analysis.parallel.pmap`)."""
    clear(out_dir)
    files = []
    for name in figures.FIGURE_NAMES:
        (Path(out_dir) / name).mkdir(parents=True, exist_ok=True)
        files += [(name, key) for key in panel_keys(data, name, targets)]
    out: dict[str, list[Path]] = {name: [] for name in figures.FIGURE_NAMES}
    for (name, _), paths in zip(files, pmap(partial(_write_panel, data, out_dir), files,
                                             workers), strict=True):
        out[name] += paths
    return out


def _write_panel(data: FigureData, out_dir: str | Path,
                 file: tuple[str, tuple[str, ...]]) -> list[Path]:
    name, key = file
    return save(plot_panel(name, data, *key), out_dir, stem(name, key), dpi=PANEL_DPI, rc=RC)
