"""The RACE protocol: rank configs on the cheap pilot grid, select, and score the pilot's ranking.

A diagnostic, not a guarantee (docs/design.md, "RACE pilot protocol"). Conventions:

- A config is (size, alloc) within one reward system; configs are ranked per (reward, target).
- Pilot ranking (:func:`rank_pilot`): by accuracy at the highest pilot rung (the largest
  ``budget`` among the pilot rows); ties broken by the mean accuracy over all pilot rungs, then
  by name (size, then alloc). The pilot has one seed; if a pilot config has several, their mean
  is used. A config without a value at the highest rung is listed after every config with one,
  without a rank (``rank`` is NA), and is never selected.
- Selection (:func:`select`): for every reward, the union over targets of the top-k configs plus
  the baseline allocation at every size.
- Agreement (:func:`agreement`), per (reward, target), over the configs present in both the pilot
  and the validation grid: Spearman rho between pilot rank and validation rank (validation
  accuracy = mean over seeds at the validation budget, the largest validation ``budget``); top-1
  agreement (the pilot's best among the validated configs is the validation's best; a tie for
  the validation best counts as agreement if the pilot's pick is among the tied);
  regret in accuracy points = 100 x (validation best accuracy - validation accuracy of the
  pilot's pick). A config without a pilot value is not scored (a search target evaluated only
  at the top rung has none at the pilot rungs: its row has n_common = 0). Configs the pilot
  cannot tell apart (equal at its top rung and in its mean over rungs) share their pilot rank;
  the pick is then all of them (agreement if any is a validation best; its accuracy their
  mean). With full-grid rows: ``regret_full_points`` = 100 x (full grid's best - full
  grid's accuracy of RACE's final choice, the validation best), and ``regret_full_pilot_points``
  the same for the pilot's pick, both at the validation budget.
- Cost (:func:`pilot_cost`), model FLOPs: pilot = sum over pilot cells of ``flops_total`` at the
  cell's largest rung (nested rungs: one run per cell); RACE = the same over the pilot and
  validation cells together, so a validated config's run at a pilot seed, which is the pilot's
  run carried on to the validation budget, counts once (``validation_flops`` = RACE - pilot:
  what validating added). The full grid it is compared with is every config at the validation
  budget and the validation's seed count (like for like: the question answered for every
  config at the validation's strength): n_validation_seeds x the sum over configs of their mean
  ``flops_total`` over the full grid's seeds when the full grid was run (a grid with other
  seeds is rescaled to the validation's count), else the estimate n_configs x
  n_validation_seeds x validation budget (``full_grid_estimated`` = True).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import rankdata, spearmanr

from race.analysis.frontier import (
    CELL_KEYS,
    CONFIG_KEYS,
    TIE_ATOL,
    normalise_runs,
    seed_summary,
    targets_in,
)
from race.core.atomic import write_json_atomic
from race.core.schema import check

RANKING_COLUMNS = ["reward", "target", "rank", "size", "alloc", "acc_top", "acc_mean",
                   "top_budget"]


def rank_pilot(pilot_df: pd.DataFrame, targets: list[str] | None = None) -> pd.DataFrame:
    """Pilot rank of every config per (reward, target); rank 1 is best (module docstring).

    Columns: :data:`RANKING_COLUMNS`; ``acc_top`` is the accuracy at the highest pilot rung
    ``top_budget``, ``acc_mean`` the mean over pilot rungs (fractions).
    """
    targets = targets_in(pilot_df, targets)
    top_budget = float(pilot_df["budget"].max())
    parts = []
    for t in targets:
        by_rung = seed_summary(pilot_df, t, ["reward", "size", "alloc", "budget"])
        top = by_rung[by_rung["budget"] == top_budget][["reward", "size", "alloc", "acc"]]
        mean = by_rung.groupby(["reward", "size", "alloc"])["acc"].mean().rename("acc_mean")
        configs = by_rung[["reward", "size", "alloc"]].drop_duplicates()
        r = (configs.merge(top.rename(columns={"acc": "acc_top"}), how="left")
             .merge(mean.reset_index(), how="left"))
        # Sort keys: value at the top rung (missing last), then the mean, then the name.
        # Rounded so that float noise in a mean over seeds cannot break a genuine tie.
        r["_missing"] = r["acc_top"].isna()
        r["_top"], r["_mean"] = r["acc_top"].round(12), r["acc_mean"].round(12)
        r = r.sort_values(["reward", "_missing", "_top", "_mean", "size", "alloc"],
                          ascending=[True, True, False, False, True, True],
                          na_position="last", kind="mergesort")
        # A config without a value at the top rung (a search target run only at the
        # validation budget) is not ranked: a rank by name would read as a pilot result.
        r["rank"] = (r.groupby("reward").cumcount() + 1).astype("Int64").mask(r["_missing"])
        r["target"] = t
        r["top_budget"] = top_budget
        parts.append(r.drop(columns=["_missing", "_top", "_mean"]))
    out = pd.concat(parts, ignore_index=True)[RANKING_COLUMNS]
    order = {t: i for i, t in enumerate(targets)}
    return (out.assign(_t=out["target"].map(order))
            .sort_values(["reward", "_t", "rank"], kind="mergesort")
            .drop(columns="_t").reset_index(drop=True))


def select(pilot_df: pd.DataFrame, top_k: int, baseline_alloc: str,
           targets: list[str] | None = None) -> list[dict[str, str]]:
    """Configs to run at the validation budget: per reward, top-k over each target + baseline.

    Returns [{"size", "reward", "alloc"}, ...] sorted by (reward, size, alloc), each once.
    Raises ValueError when ``top_k`` < 1 or the baseline allocation is not in the pilot.
    """
    check("race", "top_k", top_k)
    if baseline_alloc not in set(pilot_df["alloc"]):
        raise ValueError(f"baseline allocation {baseline_alloc!r} is not in the pilot grid "
                         f"(allocations: {sorted(set(pilot_df['alloc']))})")
    ranks = rank_pilot(pilot_df, targets)
    chosen = set(ranks[ranks["rank"] <= top_k][["size", "reward", "alloc"]]
                 .itertuples(index=False, name=None))
    for reward, g in pilot_df.groupby("reward"):
        for size in g["size"].unique():
            chosen.add((size, reward, baseline_alloc))
    return [{"size": s, "reward": r, "alloc": a}
            for s, r, a in sorted(chosen, key=lambda x: (x[1], x[0], x[2]))]


def _json_float(x: object) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


def rankings_json(ranks: pd.DataFrame) -> dict[str, dict[str, list[dict[str, object]]]]:
    """{reward: {target: [{"rank", "size", "alloc", "acc_top", "acc_mean"}, ...]}} (rank order)."""
    out: dict[str, dict[str, list[dict[str, object]]]] = {}
    for row in ranks.itertuples(index=False):
        out.setdefault(row.reward, {}).setdefault(row.target, []).append({
            "rank": None if pd.isna(row.rank) else int(row.rank), "size": row.size,
            "alloc": row.alloc,
            "acc_top": _json_float(row.acc_top), "acc_mean": _json_float(row.acc_mean),
        })
    return out


def read_pilot(path: str | Path) -> pd.DataFrame:
    """The pilot rows (``stage == "pilot"``) of a runs table; a table without a ``stage``
    column is taken as all pilot."""
    df = pd.read_csv(path)
    if "stage" not in df.columns:
        return normalise_runs(df.assign(stage="pilot"))
    df = normalise_runs(df)
    pilot = df[df["stage"] == "pilot"].reset_index(drop=True)
    if pilot.empty:
        raise ValueError(f"{path} has no rows with stage == 'pilot' (stages: "
                         f"{sorted(df['stage'].unique())})")
    return pilot


def write_selection(pilot_df: pd.DataFrame, top_k: int, baseline_alloc: str, out: str | Path,
                    targets: list[str] | None = None) -> dict[str, object]:
    """Write ``{"selected": [...], "rankings": {...}, ...}`` to ``out`` (sorted keys, no time)."""
    selected = select(pilot_df, top_k, baseline_alloc, targets)
    ranks = rank_pilot(pilot_df, targets)
    doc = {
        "selected": selected,
        "rankings": rankings_json(ranks),
        "top_k": int(top_k),
        "baseline": baseline_alloc,
        "targets": targets_in(pilot_df, targets),
        "pilot_top_budget": float(pilot_df["budget"].max()),
    }
    write_json_atomic(out, doc, indent=2)
    return doc


# ----------------------------------------------------------------------------------------------
# Agreement


AGREEMENT_COLUMNS = [
    "reward", "target", "n_common", "spearman_rho", "top1_agree", "pilot_pick",
    "validation_best", "validation_best_acc", "pilot_pick_validation_acc", "regret_points",
    "full_best", "full_best_acc", "regret_full_points", "regret_full_pilot_points",
    "validation_budget",
]

RANK_COLUMNS = ["reward", "target", "size", "alloc", "pilot_rank", "validation_rank",
                "pilot_acc_top", "validation_acc", "validation_n_seeds"]


@dataclass(frozen=True)
class PilotCost:
    """Model FLOPs of the pilot, validation and full grid (see module docstring)."""

    pilot_flops: float
    validation_flops: float  # what validation added to the pilot's runs
    full_grid_flops: float
    full_grid_estimated: bool
    pilot_share: float  # pilot / full grid
    race_share: float  # (pilot + validation) / full grid
    n_configs: int
    n_validation_seeds: int
    validation_budget: float


@dataclass(frozen=True)
class Agreement:
    """``table``: one row per (reward, target) (:data:`AGREEMENT_COLUMNS`); ``ranks``: per config
    (:data:`RANK_COLUMNS`); ``cost``: :class:`PilotCost`."""

    table: pd.DataFrame
    ranks: pd.DataFrame
    cost: PilotCost


def _run_flops(df: pd.DataFrame) -> float:
    """Sum over cells of ``flops_total`` at the cell's largest rung (one run serves all rungs)."""
    if df.empty:
        return 0.0
    last = df.sort_values("budget", kind="mergesort").groupby(CELL_KEYS).tail(1)
    return float(last["flops_total"].sum())


def pilot_cost(pilot_df: pd.DataFrame, validation_df: pd.DataFrame | None,
               full_df: pd.DataFrame | None = None) -> PilotCost:
    """What the pilot (and the whole RACE protocol) cost as a share of the full grid."""
    configs = pilot_df[CONFIG_KEYS].drop_duplicates()
    if full_df is not None and not full_df.empty:
        configs = pd.concat([configs, full_df[CONFIG_KEYS]]).drop_duplicates()
    p_flops = _run_flops(pilot_df)
    if validation_df is not None and not validation_df.empty:
        v_budget = float(validation_df["budget"].max())
        n_seeds = int(validation_df["seed"].nunique())
        v_flops = _run_flops(pd.concat([pilot_df, validation_df])) - p_flops
    elif full_df is not None and not full_df.empty:
        v_budget = float(full_df["budget"].max())
        n_seeds = int(full_df["seed"].nunique())
        v_flops = 0.0
    else:
        v_budget, n_seeds, v_flops = math.nan, 0, 0.0
    full_at = (full_df[full_df["budget"] == v_budget] if full_df is not None else None)
    if full_at is not None and not full_at.empty:
        per_config = full_at.groupby(CONFIG_KEYS)["flops_total"].mean()
        full_flops, estimated = n_seeds * float(per_config.sum()), False
    else:
        full_flops, estimated = len(configs) * n_seeds * v_budget, True

    def share(x: float) -> float:
        return x / full_flops if full_flops and not math.isnan(full_flops) else math.nan

    return PilotCost(pilot_flops=p_flops, validation_flops=v_flops, full_grid_flops=full_flops,
                     full_grid_estimated=estimated, pilot_share=share(p_flops),
                     race_share=share(p_flops + v_flops), n_configs=int(len(configs)),
                     n_validation_seeds=n_seeds, validation_budget=v_budget)


def _best(acc: pd.Series, labels: pd.Series) -> tuple[str, float]:
    """Best label (ties joined by "|", name-sorted) and its accuracy."""
    if acc.notna().sum() == 0:
        return "", math.nan
    top = float(acc.max())
    return "|".join(sorted(labels[acc >= top - TIE_ATOL])), top


def _pilot_ranks(common: pd.DataFrame) -> np.ndarray:
    """Pilot ranks of ``common`` (in pilot rank order) with the pilot's ties averaged: configs
    equal at the top pilot rung and in the mean over pilot rungs (:func:`rank_pilot`'s keys
    before the name) share one rank, as the validation side's ties do."""
    keys = pd.DataFrame({"top": common["acc_top"].round(12), "mean": common["acc_mean"].round(12)})
    position = pd.Series(np.arange(1, len(common) + 1, dtype=float))
    return position.groupby([keys["top"], keys["mean"]], dropna=False).transform("mean").to_numpy()


def _at_budget(df: pd.DataFrame, target: str, budget: float) -> pd.DataFrame:
    rows = df[df["budget"] == budget]
    return seed_summary(rows, target, ["reward", "size", "alloc"]) if len(rows) else \
        pd.DataFrame(columns=["reward", "size", "alloc", "acc", "n_seeds"])


def agreement(pilot_df: pd.DataFrame, validation_df: pd.DataFrame,
              full_df: pd.DataFrame | None = None,
              targets: list[str] | None = None) -> Agreement:
    """Score the pilot ranking against the validation grid (and the full grid when given).

    Regrets are in accuracy points (100 x fraction); rho is NaN with fewer than two common
    configs or when either ranking is constant.
    """
    targets = targets_in(pilot_df, targets)
    v_budget = float(validation_df["budget"].max())
    ranks = rank_pilot(pilot_df, targets)
    rows, rank_rows = [], []
    for t in targets:
        val = _at_budget(validation_df, t, v_budget)
        full = _at_budget(full_df, t, v_budget) if full_df is not None else None
        for reward in sorted(set(ranks["reward"])):
            p = ranks[(ranks["reward"] == reward) & (ranks["target"] == t)]
            # A config the pilot has no value for was not ranked by the pilot (a search
            # target run only at the top rung has none at the pilot rungs): not scored.
            p = p[p["acc_top"].notna()]
            v = val[(val["reward"] == reward) & val["acc"].notna()]
            common = p.merge(v[["size", "alloc", "acc", "n_seeds"]], on=["size", "alloc"])
            common = common.sort_values("rank", kind="mergesort").reset_index(drop=True)
            label = common["size"] + "/" + common["alloc"]
            row: dict[str, object] = {"reward": reward, "target": t,
                                      "n_common": int(len(common)),
                                      "validation_budget": v_budget}
            if len(common):
                # Ranks among the validated configs only: both rankings over the same set.
                p_rank = _pilot_ranks(common)
                v_rank = rankdata(-common["acc"].to_numpy(), method="average")
                rho = math.nan
                if len(common) >= 2 and np.ptp(v_rank) > 0 and np.ptp(p_rank) > 0:
                    rho = float(spearmanr(p_rank, v_rank).statistic)
                # The pilot's pick: every config tied at its first place (a tie the pilot
                # cannot break is not broken by name here); its accuracy is their mean, the
                # expected outcome of picking one of them at random.
                picked = p_rank == p_rank.min()
                pick = "|".join(label[picked])
                v_best, v_best_acc = _best(common["acc"], label)
                pick_acc = float(common["acc"][picked].mean())
                row.update({
                    "spearman_rho": rho,
                    "top1_agree": bool(set(label[picked]) & set(v_best.split("|"))),
                    "pilot_pick": pick,
                    "validation_best": v_best,
                    "validation_best_acc": v_best_acc,
                    "pilot_pick_validation_acc": pick_acc,
                    "regret_points": 100.0 * (v_best_acc - pick_acc),
                })
                if full is not None and len(full):
                    f = full[(full["reward"] == reward) & full["acc"].notna()]
                    f_label = f["size"] + "/" + f["alloc"]
                    f_best, f_best_acc = _best(f["acc"], f_label)
                    f_acc = dict(zip(f_label, f["acc"], strict=True))
                    final = v_best.split("|")[0]
                    pick_full = np.mean([f_acc.get(x, math.nan) for x in label[picked]])
                    row.update({
                        "full_best": f_best, "full_best_acc": f_best_acc,
                        "regret_full_points": 100.0 * (f_best_acc - f_acc.get(final, math.nan)),
                        "regret_full_pilot_points": 100.0 * (f_best_acc - pick_full),
                    })
                for i, c in common.iterrows():
                    rank_rows.append({
                        "reward": reward, "target": t, "size": c["size"], "alloc": c["alloc"],
                        "pilot_rank": float(p_rank[i]), "validation_rank": float(v_rank[i]),
                        "pilot_acc_top": c["acc_top"], "validation_acc": c["acc"],
                        "validation_n_seeds": int(c["n_seeds"]),
                    })
            rows.append(row)
    table = pd.DataFrame(rows, columns=AGREEMENT_COLUMNS)
    order = {t: i for i, t in enumerate(targets)}
    table = (table.assign(_t=table["target"].map(order))
             .sort_values(["reward", "_t"], kind="mergesort").drop(columns="_t")
             .reset_index(drop=True))
    rank_table = pd.DataFrame(rank_rows, columns=RANK_COLUMNS)
    return Agreement(table=table, ranks=rank_table,
                     cost=pilot_cost(pilot_df, validation_df, full_df))


def cost_dict(cost: PilotCost) -> dict[str, object]:
    """The cost as a plain dict (for JSON and the report)."""
    return asdict(cost)
