"""The six report figures, each written as PNG and SVG.

Conventions: FLOP axes are model FLOPs on a log scale; accuracy is a fraction in [0, 1]; one
colour per allocation in every figure (:func:`alloc_palette`, fixed by the sorted allocation
names of the whole table) and one marker per policy size. Each figure's title states the
question it answers; panels are titled by what they hold.

Each figure has a ``plot_<name>(data) -> Figure`` that only draws (tests inspect its axes) and a
``<name>(data, out_dir) -> list[Path]`` that draws and writes ``<name>.png`` and ``<name>.svg``.
A figure whose input was not run (no validation rows for ``race_agreement``, no rows at all)
is still written, as a single panel that says "not run" and why: the workflow declares every
figure as an output, so a missing file would fail the rule, and a blank would hide the reason.

Figures are built on ``matplotlib.figure.Figure`` directly (no pyplot, no global state, no
interactive backend) and saved without dates, with a fixed SVG id salt: reruns are byte-stable.
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
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from race.analysis.columns import TARGET_LABELS
from race.analysis.fit import sigmoid
from race.analysis.frontier import pooled, size_order
from race.analysis.protocol import Agreement
from race.analysis.regime_cells import cell_colours, hatch_patch_kw, legend_handles, regime_cell
from race.flops.ledger import BUDGET_PHASES

FIGURE_NAMES = ["frontier", "compute_breakdown", "same_flop", "regime_map", "race_agreement",
                "fits"]

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
    ``frontier`` / ``regime``: the frontier tables; ``points`` / ``fits``: :mod:`race.analysis.fit`
    rung points and fit table; ``agreement``: None when the validation grid was not run.
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

    def __post_init__(self) -> None:
        self.runs = pooled(self.runs) if len(self.runs) else self.runs
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
def _style() -> Iterator[None]:
    """Theme for drawing and saving (rcParams are read at save time too)."""
    rc = {"svg.hashsalt": "race", "svg.fonttype": "path", "figure.dpi": 100,
          "axes.titlesize": 9, "axes.labelsize": 8, "xtick.labelsize": 7, "ytick.labelsize": 7,
          "legend.fontsize": 7, "figure.titlesize": 11}
    with sns.axes_style("whitegrid"), mpl.rc_context(rc):
        yield


def _panel_title(reward: str, target: str) -> str:
    return f"{reward} reward · {TARGET_LABELS.get(target, target)}"


def _grid(n_rows: int, n_cols: int, title: str, **kw: object) -> tuple[Figure, np.ndarray]:
    fig = Figure(figsize=(PANEL_W * n_cols + 1.6, PANEL_H * n_rows + 1.0), layout="constrained")
    axes = np.atleast_2d(fig.subplots(n_rows, n_cols, squeeze=False, **kw))
    fig.suptitle(title)
    return fig, axes


def _not_run(title: str, reason: str) -> Figure:
    fig = Figure(figsize=(6.5, 2.6), layout="constrained")
    ax = fig.subplots()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, f"not run: {reason}", ha="center", va="center", fontsize=11,
            transform=ax.transAxes)
    return fig


def _legend(fig: Figure, data: FigureData, extra: list[object] | None = None,
            sizes: bool = True) -> None:
    handles = [Patch(color=data.palette[a], label=a) for a in data.allocs]
    if sizes:
        handles += [Line2D([], [], color="0.3", marker=data.marker(s), linestyle=data.linestyle(s),
                           label=s) for s in data.sizes]
    handles += list(extra or [])
    fig.legend(handles=handles, loc="outside right center",
               title="alloc / size" if sizes else "allocation", frameon=False)


def _fmt_flops(x: float) -> str:
    return f"{x:.1e}".replace("e+", "e")


def save(fig: Figure, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``name.png`` and ``name.svg`` (no date metadata); return both paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.png", out / f"{name}.svg"]
    with _style():
        fig.savefig(paths[0], dpi=110, metadata={"Software": None})
        # The PNG's draw placed every axes (constrained layout): keep that layout for the SVG
        # instead of solving it again (about a third of the report job's time).
        fig.set_layout_engine("none")
        fig.savefig(paths[1], metadata={"Date": None, "Creator": None})
    return paths


# ----------------------------------------------------------------------------------------------
# 1. frontier


FRONTIER_TITLE = "Which size × allocation gives the best accuracy at each training budget?"


def plot_frontier(data: FigureData) -> Figure:
    """Accuracy vs model FLOPs used per (size, alloc), rows = reward, cols = target.

    Error bars are the seed-combined 95% intervals; the black line joins each budget's winner;
    grey horizontal lines are the base policies' accuracies (budget 0, one per size).
    """
    with _style():
        if data.summary.empty:
            return _not_run(FRONTIER_TITLE, "no runs")
        fig, axes = _grid(len(data.rewards), len(data.targets), FRONTIER_TITLE,
                          sharex=True, sharey=True)
        for i, reward in enumerate(data.rewards):
            for j, target in enumerate(data.targets):
                ax = axes[i, j]
                sub = data.summary[(data.summary["reward"] == reward)
                                   & (data.summary["target"] == target)
                                   & data.summary["acc"].notna()]
                # Base policies (budget 0) cannot sit on a log axis: a grey line per size
                # marks where training started, so a gain or a loss reads at a glance.
                for size, g in sub[sub["budget"] == 0].groupby("size", sort=True):
                    ax.axhline(g["acc"].iloc[0], color="grey", linewidth=0.9, alpha=0.8,
                               linestyle=data.linestyle(size), zorder=0)
                sub = sub[sub["budget"] > 0]
                for (size, alloc), g in sub.groupby(["size", "alloc"], sort=True):
                    g = g.sort_values("budget")
                    yerr = np.vstack([g["acc"] - g["acc_lo"], g["acc_hi"] - g["acc"]])
                    ax.errorbar(g["flops"], g["acc"], yerr=np.nan_to_num(yerr.clip(0)),
                                color=data.palette[alloc], marker=data.marker(size),
                                linestyle=data.linestyle(size), linewidth=0.8, markersize=4,
                                capsize=2, alpha=0.85)
                best = data.frontier[(data.frontier["reward"] == reward)
                                     & (data.frontier["target"] == target)
                                     & (data.frontier["budget"] > 0)
                                     & data.frontier["acc"].notna()].sort_values("budget")
                ax.plot(best["best_flops"], best["acc"], color="black", linewidth=2.2,
                        alpha=0.35, zorder=0, solid_capstyle="round")
                ax.set_xscale("log")
                ax.set_title(_panel_title(reward, target))
                ax.set_xlabel("training compute (model FLOPs)")
                ax.set_ylabel("accuracy (fraction)")
        frontier_handle = Line2D([], [], color="black", alpha=0.35, linewidth=2.2,
                                 label="best per budget")
        base_handle = Line2D([], [], color="grey", linewidth=0.9,
                             label="base policy (no RL), line style = size")
        _legend(fig, data, [frontier_handle, base_handle])
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


def plot_compute_breakdown(data: FigureData) -> Figure:
    """Stacked rollout / learning / reward shares; rows = size, cols = reward, bars = alloc."""
    with _style():
        if data.runs.empty:
            return _not_run(BREAKDOWN_TITLE, "no runs")
        table = breakdown_table(data.runs)
        fig, axes = _grid(len(data.sizes), len(data.rewards), BREAKDOWN_TITLE, sharey=True)
        for i, size in enumerate(data.sizes):
            for j, reward in enumerate(data.rewards):
                ax = axes[i, j]
                sub = table[(table["size"] == size) & (table["reward"] == reward)]
                sub = sub.set_index("alloc").reindex(data.allocs).dropna(how="all")
                x = np.arange(len(sub))
                bottom = np.zeros(len(sub))
                for p in BUDGET_PHASES:
                    vals = sub[f"share_{p}"].fillna(0).to_numpy()
                    ax.bar(x, vals, bottom=bottom, color=PHASE_COLOURS[p], edgecolor="white",
                           width=0.7, label=p)
                    bottom += vals
                ax.set_xticks(x, list(sub.index))
                for tick, alloc in zip(ax.get_xticklabels(), sub.index, strict=True):
                    tick.set_color(data.palette[alloc])  # the allocation colour, as elsewhere
                    tick.set_fontweight("bold")
                ax.set_ylim(0, 1)
                ax.set_title(f"{size} · {reward} reward")
                ax.set_xlabel("allocation")
                ax.set_ylabel("share of model FLOPs")
        handles = [Patch(color=PHASE_COLOURS[p], label=p) for p in BUDGET_PHASES]
        fig.legend(handles=handles, loc="outside right center", title="phase", frameon=False)
        return fig


# ----------------------------------------------------------------------------------------------
# 3. same FLOPs


def equal_budget(runs: pd.DataFrame) -> float:
    """The budget rung reached by the most configs (largest on a tie): the fairest common rung."""
    counts = runs.groupby("budget")[["size", "reward", "alloc"]].apply(
        lambda g: len(g.drop_duplicates()))
    top = counts.max()
    return float(max(b for b, c in counts.items() if c == top))


def plot_same_flop(data: FigureData) -> Figure:
    """Updates and rollouts bought at one equal budget; rows = reward, cols = (updates, rollouts),
    x = size, bars = alloc (mean over seeds), log count axis."""
    title = "What does the same budget buy? Updates and rollouts per size and allocation"
    with _style():
        if data.runs.empty:
            return _not_run(title, "no runs")
        budget = equal_budget(data.runs)
        rows = data.runs[data.runs["budget"] == budget]
        fig, axes = _grid(len(data.rewards), 2, f"{title} (budget {_fmt_flops(budget)} model "
                          "FLOPs)")
        metrics = [("updates", "optimizer updates bought (count)"),
                   ("rollouts", "rollouts bought (completions)")]
        for i, reward in enumerate(data.rewards):
            sub = rows[rows["reward"] == reward]
            for j, (col, label) in enumerate(metrics):
                ax = axes[i, j]
                if sub.empty:
                    ax.text(0.5, 0.5, "not run at this budget", ha="center",
                            transform=ax.transAxes)
                else:
                    sns.barplot(data=sub, x="size", y=col, hue="alloc", order=data.sizes,
                                hue_order=data.allocs, palette=data.palette, errorbar=None,
                                ax=ax, legend=False)
                    ax.set_yscale("log")
                ax.set_title(f"{col} · {reward} reward")
                ax.set_xlabel("policy size")
                ax.set_ylabel(label)
        _legend(fig, data, sizes=False)
        return fig


# ----------------------------------------------------------------------------------------------
# 4. regime map


REGIME_TITLE = "Which allocation wins at each budget and policy size?"


def plot_regime_map(data: FigureData) -> Figure:
    """Heatmap budget x size -> winning allocation; rows = reward, cols = target.

    Only a decided winner (``decided``: gap_z >= DECIDED_Z over the runner-up) gets its
    allocation's colour; grey = tie; hatched light grey = undecided, labelled with the leader,
    "?" and its z (:mod:`race.analysis.regime_cells`); "n/a" = no value at that rung; blank =
    never run."""
    with _style():
        if data.regime.empty:
            return _not_run(REGIME_TITLE, "no runs")
        allocs = data.allocs
        cmap = ListedColormap(cell_colours(data.palette, allocs))
        fig, axes = _grid(len(data.rewards), len(data.targets), REGIME_TITLE)
        budgets = sorted(data.regime["budget"].unique())
        for i, reward in enumerate(data.rewards):
            for j, target in enumerate(data.targets):
                ax = axes[i, j]
                sub = data.regime[(data.regime["reward"] == reward)
                                  & (data.regime["target"] == target)]
                codes = np.full((len(data.sizes), len(budgets)), np.nan)
                text = np.full(codes.shape, "", dtype=object)
                undecided = []
                for r in sub.itertuples(index=False):
                    y, x = data.sizes.index(r.size), budgets.index(r.budget)
                    cell = regime_cell(r, allocs)
                    codes[y, x], text[y, x] = cell.code, cell.text
                    if cell.kind == "undecided":
                        undecided.append((x, y))
                sns.heatmap(codes, ax=ax, cmap=cmap, vmin=-0.5, vmax=len(allocs) + 1.5,
                            cbar=False, annot=text, fmt="", annot_kws={"fontsize": 6},
                            linewidths=1, linecolor="white", mask=np.isnan(codes))
                for x, y in undecided:
                    ax.add_patch(Rectangle((x, y), 1, 1, **hatch_patch_kw()))
                ax.set_xticks(np.arange(len(budgets)) + 0.5,
                              [_fmt_flops(b) for b in budgets], rotation=45)
                ax.set_yticks(np.arange(len(data.sizes)) + 0.5, data.sizes, rotation=0)
                ax.grid(False)
                # seaborn does not annotate masked cells: say "n/a" (no value) ourselves.
                for y, x in zip(*np.nonzero(text == "n/a"), strict=True):
                    ax.text(x + 0.5, y + 0.5, "n/a", ha="center", va="center", fontsize=6,
                            color="0.4")
                ax.set_title(_panel_title(reward, target))
                ax.set_xlabel("budget rung (model FLOPs, log-spaced)")
                ax.set_ylabel("policy size")
        _legend(fig, data, legend_handles(), sizes=False)
        return fig


# ----------------------------------------------------------------------------------------------
# 5. RACE agreement


AGREEMENT_TITLE = "Does the cheap pilot rank configs the way the validation budget does?"


def plot_race_agreement(data: FigureData) -> Figure:
    """Pilot rank vs validation rank per config; rows = reward, cols = target; rho, regret
    (accuracy points) and top-1 agreement annotated in each panel."""
    with _style():
        ag = data.agreement
        if ag is None or ag.ranks.empty:
            return _not_run(AGREEMENT_TITLE, "no validation rows (RACE validation grid)")
        fig, axes = _grid(len(data.rewards), len(data.targets), AGREEMENT_TITLE)
        for i, reward in enumerate(data.rewards):
            for j, target in enumerate(data.targets):
                ax = axes[i, j]
                sub = ag.ranks[(ag.ranks["reward"] == reward) & (ag.ranks["target"] == target)]
                n = max(int(sub["pilot_rank"].max()) if len(sub) else 1, 2)
                ax.plot([1, n], [1, n], color="0.6", linewidth=0.8, linestyle="--", zorder=0)
                for r in sub.itertuples(index=False):
                    ax.scatter(r.pilot_rank, r.validation_rank, color=data.palette[r.alloc],
                               marker=data.marker(r.size), s=36, edgecolor="black",
                               linewidth=0.4)
                row = ag.table[(ag.table["reward"] == reward) & (ag.table["target"] == target)]
                if len(row) and row["n_common"].iloc[0] > 0:
                    r0 = row.iloc[0]
                    rho = "n/a" if pd.isna(r0["spearman_rho"]) else f"{r0['spearman_rho']:.2f}"
                    note = (f"ρ = {rho}\nregret = {r0['regret_points']:.1f} pts\n"
                            f"top-1: {'yes' if r0['top1_agree'] else 'no'}")
                else:
                    note = "no common configs"
                ax.text(0.97, 0.03, note, transform=ax.transAxes, ha="right", va="bottom",
                        fontsize=7, bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0})
                ax.set_xlim(0.5, n + 0.5)
                ax.set_ylim(0.5, n + 0.5)
                ax.set_xticks(range(1, n + 1))
                ax.set_yticks(range(1, n + 1))
                ax.set_title(_panel_title(reward, target))
                ax.set_xlabel("pilot rank (1 = best)")
                ax.set_ylabel("validation rank (1 = best)")
        _legend(fig, data)
        return fig


# ----------------------------------------------------------------------------------------------
# 6. fits


FITS_TITLE = "How does accuracy grow with training compute? Sigmoid fits per config"


def plot_fits(data: FigureData) -> Figure:
    """Observed mean accuracy per rung and the fitted R(C) per config (curve only where the fit
    succeeded); rows = reward, cols = target; median |held-out error| in each panel."""
    with _style():
        if data.points.empty:
            return _not_run(FITS_TITLE, "no runs")
        fig, axes = _grid(len(data.rewards), len(data.targets), FITS_TITLE, sharex=True,
                          sharey=True)
        fits = data.fits.set_index(["size", "reward", "alloc", "target"])
        for i, reward in enumerate(data.rewards):
            for j, target in enumerate(data.targets):
                ax = axes[i, j]
                sub = data.points[(data.points["reward"] == reward)
                                  & (data.points["target"] == target) & data.points["acc"].notna()]
                for (size, alloc), g in sub.groupby(["size", "alloc"], sort=True):
                    colour = data.palette[alloc]
                    ax.scatter(g["flops"], g["acc"], color=colour, marker=data.marker(size),
                               s=16, zorder=3)
                    key = (size, reward, alloc, target)
                    if key in fits.index and fits.loc[key, "status"] == "ok":
                        f = fits.loc[key]
                        c = np.geomspace(g["flops"].min() / 1.5, g["flops"].max() * 1.5, 120)
                        ax.plot(c, sigmoid(c, f["A"], f["B"], f["C_mid"], f["R0"]),
                                color=colour, linestyle=data.linestyle(size), linewidth=1.0)
                err = data.fits[(data.fits["reward"] == reward) & (data.fits["target"] == target)
                                & (data.fits["holdout_status"] == "ok")]["holdout_error_points"]
                n_ok = int(((data.fits["reward"] == reward) & (data.fits["target"] == target)
                            & (data.fits["status"] == "ok")).sum())
                note = (f"fits: {n_ok}\nmedian |held-out error| = {err.abs().median():.1f} pts"
                        if len(err) else f"fits: {n_ok}\nheld-out: insufficient rungs")
                ax.text(0.03, 0.97, note, transform=ax.transAxes, ha="left", va="top",
                        fontsize=7, bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0})
                ax.set_xscale("log")
                ax.set_title(_panel_title(reward, target))
                ax.set_xlabel("training compute (model FLOPs)")
                ax.set_ylabel("accuracy (fraction)")
        _legend(fig, data)
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


def write_all(data: FigureData, out_dir: str | Path) -> dict[str, list[Path]]:
    """Every figure, in :data:`FIGURE_NAMES` order: name -> [png, svg]."""
    return {name: write(name, data, out_dir) for name in FIGURE_NAMES}


def not_run_figures(data: FigureData) -> list[str]:
    """Names of the figures that will say "not run" (listed in the report)."""
    out = []
    if data.agreement is None or data.agreement.ranks.empty:
        out.append("race_agreement")
    if data.runs.empty:
        out += [n for n in FIGURE_NAMES if n != "race_agreement"]
    return out

