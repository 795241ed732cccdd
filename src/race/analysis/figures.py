"""The six report figures, each written as PNG and SVG.

Conventions: FLOP axes are model FLOPs on a log scale, count axes linear from 0; accuracy is
a fraction in [0, 1]; one colour per allocation in every figure and one marker per policy size
(:mod:`race.analysis.figure_base`). Each figure's title states the question it answers; panels
are titled by what they hold.

Each figure has a ``plot_<name>(data) -> Figure`` that only draws the overview grid of every
panel (tests inspect its axes), and :func:`write` draws and writes ``<name>.png`` and
``<name>.svg``. Each panel is drawn by a ``draw_<name>(ax, data, ...)`` that the overview and
the single-column paper versions (:mod:`race.analysis.paper_figures`) share. A figure whose
input was not run (no validation rows for ``race_agreement``, no rows at all) is still written,
as a single panel that says "not run" and why: the workflow declares every figure as an
output, so a missing file would fail the rule, and a blank would hide the reason.

Figures are built on ``matplotlib.figure.Figure`` directly (no pyplot, no global state, no
interactive backend) and saved without dates, with a fixed SVG id salt: reruns are byte-stable.
"""

from __future__ import annotations

import math
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from race.analysis.figure_base import (
    PHASE_COLOURS,
    FigureData,
    fmt_flops,
    grid,
    legend,
    not_run,
    panel_title,
    save,
    style,
)
from race.analysis.parallel import pmap
from race.analysis.regime_cells import cell_colours, hatch_patch_kw, legend_handles, regime_cell
from race.flops.ledger import BUDGET_PHASES

FIGURE_NAMES = ["frontier", "compute_breakdown", "same_flop", "regime_map", "race_agreement",
                "fits"]

# ----------------------------------------------------------------------------------------------
# 1. frontier


FRONTIER_TITLE = "Which size × allocation gives the best accuracy at each training budget?"


def draw_frontier(ax: object, data: FigureData, reward: str, target: str) -> None:
    """One frontier panel: accuracy vs model FLOPs used per (size, alloc) with 95% error bars,
    the line through each budget's winner, and a grey line per size at the base accuracy."""
    sub = data.summary[(data.summary["reward"] == reward) & (data.summary["target"] == target)
                       & data.summary["acc"].notna()]
    # Base policies (budget 0) cannot sit on a log axis: a grey line per size marks where
    # training started, so a gain or a loss reads at a glance.
    for size, g in sub[sub["budget"] == 0].groupby("size", sort=True):
        ax.axhline(g["acc"].iloc[0], color="grey", linewidth=0.9, alpha=0.8,
                   linestyle=data.linestyle(size), zorder=0)
    sub = sub[sub["budget"] > 0]
    for (size, alloc), g in sub.groupby(["size", "alloc"], sort=True):
        g = g.sort_values("budget")
        yerr = np.vstack([g["acc"] - g["acc_lo"], g["acc_hi"] - g["acc"]])
        ax.errorbar(g["flops"], g["acc"], yerr=np.nan_to_num(yerr.clip(0)),
                    color=data.palette[alloc], marker=data.marker(size),
                    linestyle=data.linestyle(size), linewidth=0.8, markersize=4, capsize=2,
                    alpha=0.85)
    best = data.frontier[(data.frontier["reward"] == reward)
                         & (data.frontier["target"] == target) & (data.frontier["budget"] > 0)
                         & data.frontier["acc"].notna()].sort_values("budget")
    ax.plot(best["best_flops"], best["acc"], color="black", linewidth=2.2, alpha=0.35, zorder=0,
            solid_capstyle="round")
    ax.set_xscale("log")
    ax.set_xlabel("training compute (model FLOPs)")
    ax.set_ylabel("accuracy (fraction)")


def frontier_handles() -> list[Line2D]:
    return [Line2D([], [], color="black", alpha=0.35, linewidth=2.2, label="best per budget"),
            Line2D([], [], color="grey", linewidth=0.9,
                   label="base policy (no RL), line style = size")]


def plot_frontier(data: FigureData) -> Figure:
    """Accuracy vs model FLOPs used per (size, alloc), rows = reward, cols = target
    (:func:`draw_frontier`).

    Error bars are the seed-combined 95% intervals; the black line joins each budget's winner;
    grey horizontal lines are the base policies' accuracies (budget 0, one per size).
    """
    with style():
        if data.summary.empty:
            return not_run(FRONTIER_TITLE, "no runs")
        fig, axes = grid(len(data.rewards), len(data.targets), FRONTIER_TITLE,
                          sharex=True, sharey=True)
        for i, reward in enumerate(data.rewards):
            for j, target in enumerate(data.targets):
                draw_frontier(axes[i, j], data, reward, target)
                axes[i, j].set_title(panel_title(reward, target))
        legend(fig, data, frontier_handles())
        return fig


# ----------------------------------------------------------------------------------------------
# 2. compute breakdown


BREAKDOWN_TITLE = ("Where does the training compute go? "
                   "Share of model FLOPs per phase at each config's largest rung")


def breakdown_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Phase shares ``share_<phase>`` (fractions of ``flops_total``) per (size, reward, alloc)
    at its largest rung, mean over seeds."""
    last = runs[runs["budget"] == runs.groupby(["size", "reward", "alloc"])["budget"]
                .transform("max")]
    shares = last[["size", "reward", "alloc"]].copy()
    total = last["flops_total"].where(last["flops_total"] > 0)
    cols = [f"share_{p}" for p in BUDGET_PHASES]  # "reward" is both a phase and a column name
    for p, c in zip(BUDGET_PHASES, cols, strict=True):
        shares[c] = last[f"flops_{p}"] / total
    return shares.groupby(["size", "reward", "alloc"], sort=True)[cols].mean().reset_index()


def draw_compute_breakdown(ax: object, data: FigureData, table: pd.DataFrame, size: str,
                           reward: str) -> None:
    """One breakdown panel: stacked phase shares per allocation of ``size`` under ``reward``
    (``table``: :func:`breakdown_table`); tick labels in the allocation colours."""
    sub = table[(table["size"] == size) & (table["reward"] == reward)]
    sub = sub.set_index("alloc").reindex(data.allocs).dropna(how="all")
    x = np.arange(len(sub))
    bottom = np.zeros(len(sub))
    for p in BUDGET_PHASES:
        vals = sub[f"share_{p}"].fillna(0).to_numpy()
        ax.bar(x, vals, bottom=bottom, color=PHASE_COLOURS[p], edgecolor="white", width=0.7,
               label=p)
        bottom += vals
    ax.set_xticks(x, list(sub.index))
    for tick, alloc in zip(ax.get_xticklabels(), sub.index, strict=True):
        tick.set_color(data.palette[alloc])  # the allocation colour, as elsewhere
        tick.set_fontweight("bold")
    ax.set_ylim(0, 1)
    ax.set_xlabel("allocation")
    ax.set_ylabel("share of model FLOPs")


def phase_handles() -> list[Patch]:
    return [Patch(color=PHASE_COLOURS[p], label=p) for p in BUDGET_PHASES]


def plot_compute_breakdown(data: FigureData) -> Figure:
    """Stacked rollout / learning / reward shares; rows = size, cols = reward, bars = alloc."""
    with style():
        if data.runs.empty:
            return not_run(BREAKDOWN_TITLE, "no runs")
        table = breakdown_table(data.runs)
        fig, axes = grid(len(data.sizes), len(data.rewards), BREAKDOWN_TITLE, sharey=True)
        for i, size in enumerate(data.sizes):
            for j, reward in enumerate(data.rewards):
                draw_compute_breakdown(axes[i, j], data, table, size, reward)
                axes[i, j].set_title(f"{size} · {reward} reward")
        fig.legend(handles=phase_handles(), loc="outside right center", title="phase",
                   frameon=False)
        return fig


# ----------------------------------------------------------------------------------------------
# 3. same FLOPs


SAME_FLOP_TITLE = "What does the same budget buy? Updates and rollouts per size and allocation"
#: (column, axis label, short axis label) of the two same-FLOP panels per reward.
SAME_FLOP_METRICS = [("updates", "optimizer updates bought (count)", "updates (count)"),
                     ("rollouts", "rollouts bought (completions)", "rollouts (completions)")]


def equal_budget(runs: pd.DataFrame) -> float:
    """The trained rung (budget > 0) reached by the most configs (largest on a tie): the
    fairest common rung. The base rung has a row for every config and buys nothing."""
    trained = runs[runs["budget"] > 0]
    if trained.empty:
        return math.nan  # nothing trained: the panels say "not run at this budget"
    counts = trained.groupby("budget")[["size", "reward", "alloc"]].apply(
        lambda g: len(g.drop_duplicates()))
    top = counts.max()
    return float(max(b for b, c in counts.items() if c == top))


def draw_same_flop(ax: object, data: FigureData, reward: str, col: str, label: str) -> None:
    """One same-FLOP panel: ``col`` (updates or rollouts) bought at :func:`equal_budget` under
    ``reward``; x = size, bars = alloc (mean over seeds), on a linear count axis from 0."""
    rows = data.runs[data.runs["budget"] == equal_budget(data.runs)]
    sub = rows[rows["reward"] == reward]
    if sub.empty:
        ax.text(0.5, 0.5, "not run at this budget", ha="center", transform=ax.transAxes)
    else:
        sns.barplot(data=sub, x="size", y=col, hue="alloc", order=data.sizes,
                    hue_order=data.allocs, palette=data.palette, errorbar=None, ax=ax,
                    legend=False, saturation=1)  # the legend's colours exactly
    # Counts of tens to thousands: a linear axis from 0 keeps bar lengths proportional.
    ax.set_yscale("linear")
    ax.set_ylim(bottom=0)
    ax.set_xlabel("policy size")
    ax.set_ylabel(label)


def plot_same_flop(data: FigureData) -> Figure:
    """Updates and rollouts bought at one equal budget; rows = reward, cols = (updates, rollouts),
    x = size, bars = alloc (mean over seeds), linear count axes."""
    with style():
        if data.runs.empty:
            return not_run(SAME_FLOP_TITLE, "no runs")
        budget = equal_budget(data.runs)
        fig, axes = grid(len(data.rewards), 2, f"{SAME_FLOP_TITLE} (budget "
                          f"{fmt_flops(budget)} model FLOPs)")
        for i, reward in enumerate(data.rewards):
            for j, (col, label, _) in enumerate(SAME_FLOP_METRICS):
                draw_same_flop(axes[i, j], data, reward, col, label)
                axes[i, j].set_title(f"{col} · {reward} reward")
        legend(fig, data, sizes=False)
        return fig


# ----------------------------------------------------------------------------------------------
# 4. regime map


REGIME_TITLE = "Which allocation wins at each budget and policy size?"


def draw_regime_map(ax: object, data: FigureData, reward: str, target: str,
                    fontsize: float = 6) -> None:
    """One regime-map panel: budget x size -> winning allocation (:func:`plot_regime_map`);
    cell labels at ``fontsize`` points."""
    allocs = data.allocs
    cmap = ListedColormap(cell_colours(data.palette, allocs))
    budgets = sorted(data.regime["budget"].unique())
    sub = data.regime[(data.regime["reward"] == reward) & (data.regime["target"] == target)]
    codes = np.full((len(data.sizes), len(budgets)), np.nan)
    text = np.full(codes.shape, "", dtype=object)
    undecided = []
    for r in sub.itertuples(index=False):
        y, x = data.sizes.index(r.size), budgets.index(r.budget)
        cell = regime_cell(r, allocs)
        codes[y, x], text[y, x] = cell.code, cell.text
        if cell.kind == "undecided":
            undecided.append((x, y))
    sns.heatmap(codes, ax=ax, cmap=cmap, vmin=-0.5, vmax=len(allocs) + 1.5, cbar=False,
                annot=text, fmt="", annot_kws={"fontsize": fontsize}, linewidths=1,
                linecolor="white", mask=np.isnan(codes))
    for x, y in undecided:
        ax.add_patch(Rectangle((x, y), 1, 1, **hatch_patch_kw()))
    ax.set_xticks(np.arange(len(budgets)) + 0.5, [fmt_flops(b) for b in budgets], rotation=45)
    ax.set_yticks(np.arange(len(data.sizes)) + 0.5, data.sizes, rotation=0)
    ax.grid(False)
    # seaborn does not annotate masked cells: say "n/a" (no value) ourselves.
    for y, x in zip(*np.nonzero(text == "n/a"), strict=True):
        ax.text(x + 0.5, y + 0.5, "n/a", ha="center", va="center", fontsize=fontsize,
                color="0.4")
    ax.set_xlabel("budget rung (model FLOPs, log-spaced)")
    ax.set_ylabel("policy size")


def plot_regime_map(data: FigureData) -> Figure:
    """Heatmap budget x size -> winning allocation; rows = reward, cols = target.

    Only a decided winner (``decided``: gap_z >= DECIDED_Z over the runner-up) gets its
    allocation's colour; grey = tie; hatched light grey = undecided, labelled with the leader,
    "?" and its z (:mod:`race.analysis.regime_cells`); "n/a" = no value at that rung; blank =
    never run."""
    with style():
        if data.regime.empty:
            return not_run(REGIME_TITLE, "no runs")
        fig, axes = grid(len(data.rewards), len(data.targets), REGIME_TITLE)
        for i, reward in enumerate(data.rewards):
            for j, target in enumerate(data.targets):
                draw_regime_map(axes[i, j], data, reward, target)
                axes[i, j].set_title(panel_title(reward, target))
        legend(fig, data, legend_handles(), sizes=False)
        return fig


# ----------------------------------------------------------------------------------------------
# 5. RACE agreement


AGREEMENT_TITLE = "Does the cheap pilot rank configs the way the validation budget does?"


def draw_race_agreement(ax: object, data: FigureData, reward: str, target: str) -> None:
    """One agreement panel: pilot rank vs validation rank per config, with rho, regret
    (accuracy points) and top-1 agreement in a 7-point note."""
    ag = data.agreement
    sub = ag.ranks[(ag.ranks["reward"] == reward) & (ag.ranks["target"] == target)]
    # Both ranks lie in 1..len(sub) (ties averaged: 3.5 is possible); an axis cut at the
    # largest pilot rank would hide points whose validation rank is larger.
    n = max(len(sub), 2)
    ax.plot([1, n], [1, n], color="0.6", linewidth=0.8, linestyle="--", zorder=0)
    for r in sub.itertuples(index=False):
        ax.scatter(r.pilot_rank, r.validation_rank, color=data.palette[r.alloc],
                   marker=data.marker(r.size), s=36, edgecolor="black", linewidth=0.4)
    row = ag.table[(ag.table["reward"] == reward) & (ag.table["target"] == target)]
    if len(row) and row["n_common"].iloc[0] > 0:
        r0 = row.iloc[0]
        rho = "n/a" if pd.isna(r0["spearman_rho"]) else f"{r0['spearman_rho']:.2f}"
        note = (f"ρ = {rho}\nregret = {r0['regret_points']:.1f} pts\n"
                f"top-1: {'yes' if r0['top1_agree'] else 'no'}")
    else:
        note = "no common configs"
    ax.text(0.97, 0.03, note, transform=ax.transAxes, ha="right", va="bottom", fontsize=7,
            bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0})
    ax.set_xlim(0.5, n + 0.5)
    ax.set_ylim(0.5, n + 0.5)
    ax.set_xticks(range(1, n + 1))
    ax.set_yticks(range(1, n + 1))
    ax.set_xlabel("pilot rank (1 = best)")
    ax.set_ylabel("validation rank (1 = best)")


def plot_race_agreement(data: FigureData) -> Figure:
    """Pilot rank vs validation rank per config; rows = reward, cols = target; rho, regret
    (accuracy points) and top-1 agreement annotated in each panel."""
    with style():
        ag = data.agreement
        if ag is None or ag.ranks.empty:
            return not_run(AGREEMENT_TITLE, "no validation rows (RACE validation grid)")
        fig, axes = grid(len(data.rewards), len(data.targets), AGREEMENT_TITLE)
        for i, reward in enumerate(data.rewards):
            for j, target in enumerate(data.targets):
                draw_race_agreement(axes[i, j], data, reward, target)
                axes[i, j].set_title(panel_title(reward, target))
        legend(fig, data)
        return fig


# ----------------------------------------------------------------------------------------------
# 6. fits


FITS_TITLE = "How does accuracy grow with training compute? Sigmoid fits per config"
#: Opacity of a fit's 95% band (one band per config, several per panel).
BAND_ALPHA = 0.15


def draw_fits(ax: object, data: FigureData, reward: str, target: str) -> None:
    """One fits panel: mean accuracy per rung, and per config with an "ok" fit the fitted R(C)
    as a smooth curve over the FLOPs that config has data for (never beyond: no extrapolation)
    with its pointwise 95% band (:func:`race.analysis.fit.band_table`: parametric bootstrap over
    the rungs' evaluation intervals). Artists carry ``gid`` "fit:<size>/<alloc>" and
    "band:<size>/<alloc>". A note gives the number of fits and the median |held-out error|."""
    sub = data.points[(data.points["reward"] == reward) & (data.points["target"] == target)
                      & data.points["acc"].notna()]
    bands = data.bands[(data.bands["reward"] == reward) & (data.bands["target"] == target)]
    curves = dict(iter(bands.groupby(["size", "alloc"], sort=False)))
    for (size, alloc), g in sub.groupby(["size", "alloc"], sort=True):
        colour = data.palette[alloc]
        ax.scatter(g["flops"], g["acc"], color=colour, marker=data.marker(size), s=16, zorder=3)
        b = curves.get((size, alloc))
        if b is None:
            continue
        if b["lo"].notna().all():
            ax.fill_between(b["flops"], b["lo"], b["hi"], color=colour, alpha=BAND_ALPHA,
                            linewidth=0, gid=f"band:{size}/{alloc}")
        ax.plot(b["flops"], b["fit"], color=colour, linestyle=data.linestyle(size),
                linewidth=1.0, gid=f"fit:{size}/{alloc}")
    fits = data.fits[(data.fits["reward"] == reward) & (data.fits["target"] == target)]
    err = fits[fits["holdout_status"] == "ok"]["holdout_error_points"]
    n_ok = int((fits["status"] == "ok").sum())
    note = (f"fits: {n_ok}\nmedian |held-out error| = {err.abs().median():.1f} pts"
            if len(err) else f"fits: {n_ok}\nheld-out: insufficient rungs")
    ax.text(0.03, 0.97, note, transform=ax.transAxes, ha="left", va="top", fontsize=7,
            bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0})
    ax.set_xscale("log")
    ax.set_xlabel("training compute (model FLOPs)")
    ax.set_ylabel("accuracy (fraction)")


def band_handle() -> Patch:
    return Patch(color="0.5", alpha=BAND_ALPHA * 2, label="fit's 95% band")


def plot_fits(data: FigureData) -> Figure:
    """Observed mean accuracy per rung and the fitted R(C) per config with its 95% band, over
    the observed FLOPs only (:func:`draw_fits`); rows = reward, cols = target."""
    with style():
        if data.points.empty:
            return not_run(FITS_TITLE, "no runs")
        fig, axes = grid(len(data.rewards), len(data.targets), FITS_TITLE, sharex=True,
                          sharey=True)
        for i, reward in enumerate(data.rewards):
            for j, target in enumerate(data.targets):
                draw_fits(axes[i, j], data, reward, target)
                axes[i, j].set_title(panel_title(reward, target))
        legend(fig, data, [band_handle()])
        return fig


# ----------------------------------------------------------------------------------------------
# Writers: one per figure, and all of them


PLOTTERS = {
    "frontier": plot_frontier,
    "compute_breakdown": plot_compute_breakdown,
    "same_flop": plot_same_flop,
    "regime_map": plot_regime_map,
    "race_agreement": plot_race_agreement,
    "fits": plot_fits,
}


def write(name: str, data: FigureData, out_dir: str | Path) -> list[Path]:
    """Write figure ``name`` (one of :data:`FIGURE_NAMES`) as PNG and SVG; return the paths."""
    return save(PLOTTERS[name](data), out_dir, name)


def write_all(data: FigureData, out_dir: str | Path, workers: int = 1) -> dict[str, list[Path]]:
    """Every figure, in :data:`FIGURE_NAMES` order: name -> [png, svg]; ``workers`` processes
    (:func:`race.analysis.parallel.pmap`)."""
    paths = pmap(partial(write, data=data, out_dir=out_dir), FIGURE_NAMES, workers)
    return dict(zip(FIGURE_NAMES, paths, strict=True))


def not_run_figures(data: FigureData) -> list[str]:
    """Names of the figures that will say "not run" (listed in the report)."""
    out = []
    if data.agreement is None or data.agreement.ranks.empty:
        out.append("race_agreement")
    if data.runs.empty:
        out += [n for n in FIGURE_NAMES if n != "race_agreement"]
    return out

