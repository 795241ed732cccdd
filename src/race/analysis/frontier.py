"""Frontier tables: which (size, allocation) wins at each budget, and which allocation per size.

Conventions (shared by every report module):

- Accuracy is a fraction in [0, 1], read from ``acc_<target>``; its 95% interval from
  ``acc_<target>_lo`` / ``acc_<target>_hi``. FLOPs are model FLOPs (``flops_total``, the budget's
  own currency); budgets are matched by the ``budget`` column (the rung), never by FLOPs used.
- A *config* is (size, alloc) within one reward system; a *cell* is a config and a seed.
- Stages: rows carry ``stage`` = pilot / validation / full. A table without the column is one
  grid and is labelled "full". The frontier pools every stage (a rung is a rung whichever grid
  reached it); a (size, reward, alloc, seed, budget) row present in several stages is kept once,
  preferring full > validation > pilot (:func:`pooled`).
- Seeds: the accuracy of a config at a rung is the mean over its seeds that have a value. Its
  interval (:func:`seed_summary`): one seed -> the row's own binomial interval, unchanged; k >= 2
  seeds -> mean +/- 1.96 * se with ``se^2 = max(s^2 / k, mean(se_i^2))``, clipped to [0, 1],
  where s is the standard deviation across seeds and se_i = (hi_i - lo_i) / (2 * 1.96) is the
  binomial standard error of seed i. The seed spread already contains the evaluation noise, so
  the two are not added (that would count it twice); the binomial term is a floor, because a
  few seeds that happen to agree must not make the interval narrower than the evaluation alone
  allows. The floor is one evaluation's variance, not it over k: every seed is scored on the
  same evaluation prompts, so the noise of which prompts were drawn is shared by the seeds and
  does not average out (for greedy pass@1 it is all of the evaluation noise). This is a normal
  approximation: with 2-3 seeds it is optimistic, and the report says so.
- Ties: candidates whose mean accuracies differ by at most ``TIE_ATOL`` share first place. They
  are listed together, name-sorted and joined by "|" (``best`` = "a|b", ``tie`` = True), their
  interval is the envelope of theirs, ``n_seeds`` the smallest of theirs. Nothing is resolved
  silently.
- Gaps: ``gap`` = winner's mean - runner-up's mean (fraction), ``gap_se`` = sqrt(se_w^2 + se_r^2),
  ``gap_z`` = gap / gap_se, ``overlap`` = the two 95% intervals overlap. The two se are added
  as if the evaluations were independent. They are not: every config is scored on the same
  prompts, whose difficulty they share, so the evaluation noise of a gap is smaller (a paired
  comparison on the per-prompt outcomes, ``bench/study/study_gates.py``, finds it several times
  smaller). But a one-seed se holds no training-seed noise, which a paired z would ignore and
  which the validation seeds measure (:func:`race.analysis.report_markdown.seed_spread`). The
  unpaired se stands in for both: more than the evaluation noise alone, and an estimate of the
  training noise only as far as the seed spread bears it out (docs/design.md compares them).
- Decided: ``decided`` = True only when one winner leads *every* other candidate by a z of at
  least :data:`DECIDED_Z` (``gap_z``, against the runner-up, is the one shown; a candidate with
  a lower mean but a wide interval can be closer to the winner than the runner-up is). A tie,
  a NaN z (no standard error), a smaller z, and a lone candidate (no runner-up to be compared
  against) are all ``decided`` = False, never NA: the column is a plain boolean, and the
  report counts every such cell as undecided.
- Missing cells (:func:`missing_cells`): within a stage, every config seen there is expected at
  every seed and every budget seen there; an absent row or a NaN accuracy is listed, never dropped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from race.analysis.columns import TARGETS
from race.evaluation.metrics import Z95  # two-sided 95% normal quantile

#: Mean accuracies closer than this are a tie (accuracies are fractions: 1e-9 is far below one
#: evaluation sample, so only genuinely equal scores tie).
TIE_ATOL = 1e-9

#: A winner is *decided* when ``gap_z >= DECIDED_Z``. The gap's z is a normal test of "winner
#: better than runner-up"; 2 is the two-sided 95% quantile (1.96) rounded up, the same
#: confidence as every interval in the report. Below it, a rerun could plausibly swap the two,
#: so the cell is reported (and drawn) as undecided rather than as a winner.
DECIDED_Z = 2.0

#: The target scored by each cell's own reward: a base policy has it under one reward only.
NATIVE_TARGET = "native_reward"

#: Which stage's copy of a duplicated row the pooled table keeps (lower wins).
STAGE_PRIORITY = {"full": 0, "validation": 1, "pilot": 2}


CONFIG_KEYS = ["size", "reward", "alloc"]
CELL_KEYS = CONFIG_KEYS + ["seed"]
ROW_KEYS = CELL_KEYS + ["budget"]


# ----------------------------------------------------------------------------------------------
# Reading the runs table


def load_runs(path: str | Path) -> pd.DataFrame:
    """Read a runs table; add ``stage`` = "full" when absent (one table, one grid)."""
    df = pd.read_csv(path)
    return normalise_runs(df)


def normalise_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Identity columns as strings (sizes and allocs are names), seed as int, budget as float."""
    df = df.copy()
    if "stage" not in df.columns:
        df["stage"] = "full"
    for col in ["study", "stage", "cell", "size", "reward", "alloc"]:
        if col in df.columns:
            df[col] = df[col].astype(str)
    if "seed" in df.columns:
        df["seed"] = df["seed"].astype(int)
    if "budget" in df.columns:
        df["budget"] = df["budget"].astype(float)
    return df


def sort_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Rows in a fixed order (stage, size, reward, alloc, seed, budget), columns as given."""
    keys = [c for c in ["study", "stage", "size", "reward", "alloc", "seed", "budget"]
            if c in df.columns]
    return df.sort_values(keys, kind="mergesort").reset_index(drop=True)


def targets_in(df: pd.DataFrame, targets: Iterable[str] | None = None) -> list[str]:
    """Evaluation targets to report: those asked for, else every ``acc_<t>`` column with a value.

    Known targets come in report order (:data:`race.analysis.columns.TARGETS`), others after them,
    sorted. A target whose column is entirely empty was not evaluated and is left out.
    """
    if targets is not None:
        wanted = list(targets)
        absent = [t for t in wanted if f"acc_{t}" not in df.columns]
        if absent:
            raise ValueError(f"targets not in the runs table: {absent}")
        return wanted
    found = []
    for col in df.columns:
        if not col.startswith("acc_") or col.endswith(("_lo", "_hi")):
            continue
        if df[col].notna().any():
            found.append(col[len("acc_"):])
    known = [t for t in TARGETS if t in found]
    return known + sorted(t for t in found if t not in TARGETS)


def size_order(df: pd.DataFrame) -> list[str]:
    """Sizes from small to large: by median ``params`` when the column is there, then by name."""
    sizes = sorted(df["size"].unique())
    if "params" not in df.columns:
        return sizes
    params = df.groupby("size")["params"].median()

    def key(s: str) -> tuple[float, str]:
        p = params.get(s, math.nan)
        return (math.inf if pd.isna(p) else float(p), s)  # NaN (hub sizes) would unsort

    return sorted(sizes, key=key)


def config_label(size: str, alloc: str) -> str:
    """One config's name in tables and figures: ``size/alloc``."""
    return f"{size}/{alloc}"


def split_stages(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Rows of each stage present, keyed by stage name."""
    return {s: g.reset_index(drop=True) for s, g in df.groupby("stage", sort=True)}


def pooled(df: pd.DataFrame) -> pd.DataFrame:
    """All stages as one table, each (size, reward, alloc, seed, budget) once.

    A validation run and a full-grid run of the same cell are the same content-derived run, so
    a duplicate is a copy, not an extra seed; the copy from the most complete grid is kept.
    """
    rank = df["stage"].map(STAGE_PRIORITY).fillna(len(STAGE_PRIORITY))
    out = df.assign(_rank=rank).sort_values(ROW_KEYS + ["_rank"], kind="mergesort")
    out = out.drop_duplicates(ROW_KEYS, keep="first").drop(columns="_rank")
    return out.reset_index(drop=True)


# ----------------------------------------------------------------------------------------------
# Seeds -> one accuracy with an interval


def binomial_se(df: pd.DataFrame, target: str) -> pd.Series:
    """Per-row standard error of ``acc_<target>``: from its 95% interval, else from ``n_<target>``.

    The interval is a binomial one (Wilson or similar), so half its width over 1.96 is the
    standard error it implies; without an interval, sqrt(p(1 - p) / n).
    """
    acc = df[f"acc_{target}"].astype(float)
    se = pd.Series(np.nan, index=df.index)
    lo_col, hi_col, n_col = f"acc_{target}_lo", f"acc_{target}_hi", f"n_{target}"
    if lo_col in df.columns and hi_col in df.columns:
        se = (df[hi_col].astype(float) - df[lo_col].astype(float)) / (2 * Z95)
    if n_col in df.columns:
        n = df[n_col].astype(float)
        from_n = np.sqrt(acc.clip(0, 1) * (1 - acc.clip(0, 1)) / n.where(n > 0))
        se = se.fillna(from_n)
    return se


def seed_summary(df: pd.DataFrame, target: str, by: list[str]) -> pd.DataFrame:
    """Mean accuracy over seeds per group of ``by``, with its 95% interval (module docstring).

    Columns: ``by`` + acc, se, acc_lo, acc_hi, n_seeds, flops (mean ``flops_total``, model
    FLOPs), seeds ("0,1,2"). Rows whose accuracy is NaN do not count as seeds; a group with no
    value keeps acc = NaN and n_seeds = 0 (it is reported as missing, not dropped here).
    """
    acc_col = f"acc_{target}"
    work = df[by + ["seed", "flops_total"]].copy()
    work["acc"] = df[acc_col].astype(float)
    work["se_b"] = binomial_se(df, target)
    work["var_b"] = work["se_b"] ** 2
    lo_col, hi_col = f"acc_{target}_lo", f"acc_{target}_hi"
    work["lo1"] = df[lo_col].astype(float) if lo_col in df.columns else np.nan
    work["hi1"] = df[hi_col].astype(float) if hi_col in df.columns else np.nan
    valid = work["acc"].notna()
    work.loc[~valid, ["se_b", "var_b", "lo1", "hi1"]] = np.nan
    work["seed_str"] = work["seed"].astype(str).where(valid)

    g = work.groupby(by, sort=True, dropna=False)
    out = g.agg(
        acc=("acc", "mean"),
        var_s=("acc", lambda x: x.var(ddof=1)),
        n_seeds=("acc", "count"),
        var_b_sum=("var_b", "sum"),
        n_var_b=("var_b", "count"),
        lo1=("lo1", "first"),
        hi1=("hi1", "first"),
        flops=("flops_total", "mean"),
        seeds=("seed_str", lambda x: ",".join(sorted(x.dropna(), key=int))),
    ).reset_index()

    k = out["n_seeds"].astype(float)
    seed_term = out["var_s"] / k
    binom_term = (out["var_b_sum"] / out["n_var_b"]).where(out["n_var_b"] > 0)
    var = np.fmax(seed_term, binom_term)  # fmax ignores a NaN side
    one = out["n_seeds"] == 1
    var = var.where(~one, out["var_b_sum"].where(out["n_var_b"] > 0))
    out["se"] = np.sqrt(var)
    lo = (out["acc"] - Z95 * out["se"]).clip(lower=0.0)
    hi = (out["acc"] + Z95 * out["se"]).clip(upper=1.0)
    # One seed: the row's own interval as evaluated (Wilson intervals are not symmetric).
    out["acc_lo"] = lo.where(~one | out["lo1"].isna(), out["lo1"])
    out["acc_hi"] = hi.where(~one | out["hi1"].isna(), out["hi1"])
    out.loc[out["n_seeds"] == 0, ["acc", "se", "acc_lo", "acc_hi"]] = np.nan
    return out[by + ["acc", "se", "acc_lo", "acc_hi", "n_seeds", "flops", "seeds"]]


# ----------------------------------------------------------------------------------------------
# Ranking candidates within a group


def _join(values: Iterable[object]) -> str:
    return "|".join(str(v) for v in values)


def rank_candidates(cands: pd.DataFrame) -> dict[str, object]:
    """Winner, ties and runner-up among candidates.

    ``cands`` has columns label, acc, se, acc_lo, acc_hi, n_seeds. Candidates without an
    accuracy are not ranked. Returns a flat dict of the winner's and the runner-up's fields
    (labels joined by "|" when tied), the gap between them, and ``decided`` (a bool):
    True only for a single winner that leads every other candidate by a z of at least
    ``DECIDED_Z`` (``gap_z`` is the runner-up's). A tie, a NaN z, and a
    lone candidate (nothing to be compared against, so nothing shows it is better than the
    alternatives) are False, as is a group with no accuracy at all.
    """
    valid = cands[cands["acc"].notna()].sort_values(
        ["acc", "label"], ascending=[False, True], kind="mergesort")
    row: dict[str, object] = {"n_candidates": int(len(valid))}
    empty = {"best": "", "acc": np.nan, "acc_lo": np.nan, "acc_hi": np.nan, "n_seeds": 0,
             "tie": False, "n_tied": 0, "runner_up": "", "runner_up_acc": np.nan,
             "runner_up_lo": np.nan, "runner_up_hi": np.nan, "gap": np.nan, "gap_se": np.nan,
             "gap_z": np.nan, "overlap": pd.NA, "decided": False}
    if valid.empty:
        return {**row, **empty}
    top = valid["acc"].iloc[0]
    first = valid[valid["acc"] >= top - TIE_ATOL].sort_values("label", kind="mergesort")
    rest = valid[valid["acc"] < top - TIE_ATOL]
    row.update({
        "best": _join(first["label"]),
        "acc": float(first["acc"].mean()),
        "acc_lo": float(first["acc_lo"].min()),
        "acc_hi": float(first["acc_hi"].max()),
        "n_seeds": int(first["n_seeds"].min()),
        "tie": len(first) > 1,
        "n_tied": int(len(first)),
    })
    if rest.empty:
        return {**empty, **row, "tie": len(first) > 1, "n_tied": int(len(first))}
    second_acc = rest["acc"].iloc[0]
    second = rest[rest["acc"] >= second_acc - TIE_ATOL].sort_values("label", kind="mergesort")
    # The largest standard error on either side: with ties, the gap is only as sure as the
    # least certain of the tied candidates.
    gap = float(row["acc"]) - float(second["acc"].mean())
    gap_se = math.hypot(float(first["se"].max()), float(second["se"].max()))
    lo_w, hi_w = float(row["acc_lo"]), float(row["acc_hi"])
    lo_r, hi_r = float(second["acc_lo"].min()), float(second["acc_hi"].max())
    overlap = (pd.NA if any(math.isnan(v) for v in (lo_w, hi_w, lo_r, hi_r))
               else bool(max(lo_w, lo_r) <= min(hi_w, hi_r)))
    row.update({
        "runner_up": _join(second["label"]),
        "runner_up_acc": float(second["acc"].mean()),
        "runner_up_lo": lo_r,
        "runner_up_hi": hi_r,
        "gap": gap,
        "gap_se": gap_se,
        "gap_z": gap / gap_se if gap_se > 0 else np.nan,
        "overlap": overlap,
    })
    # Against every other candidate, not only the runner-up (module docstring).
    gaps = float(row["acc"]) - rest["acc"].to_numpy(dtype=float)
    ses = np.hypot(float(first["se"].max()), rest["se"].to_numpy(dtype=float))
    with np.errstate(divide="ignore", invalid="ignore"):
        zs = np.where(ses > 0, gaps / ses, np.nan)
    weakest_z = float(np.min(zs))  # NaN when a candidate has no standard error: undecided
    row["decided"] = (is_decided(row["gap_z"], bool(row["tie"]))
                      and is_decided(weakest_z, bool(row["tie"])))
    return row


def is_decided(gap_z: object, tie: bool = False) -> bool:
    """True when a single winner leads its runner-up by at least :data:`DECIDED_Z` standard
    errors; False for a tie and for a missing or NaN z (no runner-up, no standard error)."""
    if tie or gap_z is None or gap_z is pd.NA:
        return False
    z = float(gap_z)
    return not math.isnan(z) and z >= DECIDED_Z


def config_summary(df: pd.DataFrame, targets: list[str]) -> pd.DataFrame:
    """Seed summary per (reward, target, budget, size, alloc) over the pooled table, long format."""
    pool = pooled(df)
    parts = []
    for t in targets:
        s = seed_summary(pool, t, ["reward", "budget", "size", "alloc"])
        stages = (pool.groupby(["reward", "budget", "size", "alloc"])["stage"]
                  .agg(lambda x: ",".join(sorted(set(x)))).rename("stages").reset_index())
        s = s.merge(stages, on=["reward", "budget", "size", "alloc"], how="left")
        s.insert(1, "target", t)
        parts.append(s)
    out = pd.concat(parts, ignore_index=True)
    out["label"] = [config_label(s, a) for s, a in zip(out["size"], out["alloc"], strict=True)]
    return out.sort_values(["reward", "target", "budget", "size", "alloc"],
                           kind="mergesort").reset_index(drop=True)


def _order_targets(df: pd.DataFrame, targets: list[str]) -> pd.DataFrame:
    order = {t: i for i, t in enumerate(targets)}
    return df.assign(_t=df["target"].map(order)).sort_values(
        ["reward", "_t", "budget"] + [c for c in ["size_rank"] if c in df.columns],
        kind="mergesort").drop(columns="_t").reset_index(drop=True)


FRONTIER_COLUMNS = [
    "reward", "target", "budget", "best", "best_size", "best_alloc", "acc", "acc_lo", "acc_hi",
    "n_seeds", "best_flops", "tie", "n_tied", "runner_up", "runner_up_acc", "runner_up_lo",
    "runner_up_hi", "gap", "gap_se", "gap_z", "overlap", "decided", "n_candidates", "stages",
]


def frontier_table(df: pd.DataFrame, targets: list[str] | None = None,
                   summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """Best (size, alloc) per reward x target x budget, by mean accuracy over seeds.

    Columns: :data:`FRONTIER_COLUMNS`. ``best`` is "size/alloc" ("a|b" for a tie; ``best_size``
    and ``best_alloc`` list the tied entries in the same order); ``best_flops`` is the winner's
    mean model FLOPs used at the rung; ``stages`` the grids that contributed rows at that rung.
    """
    targets = targets_in(df, targets)
    summary = config_summary(df, targets) if summary is None else summary
    rows = []
    for (reward, target, budget), g in summary.groupby(["reward", "target", "budget"], sort=True):
        r = rank_candidates(g)
        winners = g[g["label"].isin(str(r["best"]).split("|"))].sort_values("label")
        r.update({
            "reward": reward, "target": target, "budget": budget,
            "best_size": _join(winners["size"]), "best_alloc": _join(winners["alloc"]),
            "best_flops": float(winners["flops"].mean()) if len(winners) else np.nan,
            "stages": ",".join(sorted(set(",".join(g["stages"].dropna()).split(",")) - {""})),
        })
        rows.append(r)
    out = pd.DataFrame(rows, columns=FRONTIER_COLUMNS)
    return _order_targets(out, targets)


REGIME_COLUMNS = [
    "reward", "target", "budget", "size", "best_alloc", "acc", "acc_lo", "acc_hi", "n_seeds",
    "tie", "n_tied", "runner_up", "runner_up_acc", "gap", "gap_se", "gap_z", "overlap",
    "decided", "n_candidates",
]


def regime_table(df: pd.DataFrame, targets: list[str] | None = None,
                 summary: pd.DataFrame | None = None) -> pd.DataFrame:
    """Winning allocation per reward x target x budget x size (the regime map's cells).

    Columns: :data:`REGIME_COLUMNS`; ``best_alloc`` is "a|b" for a tie, ``runner_up`` the next
    allocation; sizes in :func:`size_order`.
    """
    targets = targets_in(df, targets)
    summary = config_summary(df, targets) if summary is None else summary
    sizes = {s: i for i, s in enumerate(size_order(df))}
    rows = []
    for (reward, target, budget, size), g in summary.groupby(
            ["reward", "target", "budget", "size"], sort=True):
        r = rank_candidates(g.assign(label=g["alloc"]))
        r.update({"reward": reward, "target": target, "budget": budget, "size": size,
                  "best_alloc": r.pop("best")})
        rows.append(r)
    out = pd.DataFrame(rows, columns=REGIME_COLUMNS)
    out["size_rank"] = out["size"].map(sizes)
    return _order_targets(out, targets).drop(columns="size_rank")


MISSING_COLUMNS = ["stage", "size", "reward", "alloc", "seed", "budget", "target", "reason"]


def missing_cells(df: pd.DataFrame, targets: list[str] | None = None,
                  search_only_at_top: bool = False) -> pd.DataFrame:
    """Rows a stage's grid implies but the table lacks, and accuracies that are NaN.

    Within each stage, every (size, reward, alloc) seen there is expected at every seed and every
    budget seen in that stage. ``reason`` is "no row" (``target`` = "all") or "NaN acc_<t>".
    The base policy (budget 0) is evaluated once per size, its native reward under one reward
    system (race.analysis.aggregate): the other systems' empty ``acc_native_reward`` there is
    by design, not missing, as long as one system of that size has the value.
    (A validation grid holds only the selected configs: an unselected config is absent at every
    budget and is not "missing".) With ``search_only_at_top`` (``eval.search_at:
    base_and_top``) the search targets (race.core.specs.SEARCH_TARGETS) are not run between
    the base policy and a cell's top rung (its largest budget in the whole table), so their
    NaNs there are by design, not missing.
    """
    from race.core.specs import SEARCH_TARGETS

    targets = targets_in(df, targets)
    top = df.groupby(CELL_KEYS)["budget"].transform("max")
    # A column, not a mask aligned by index: split_stages renumbers each stage's rows.
    df = df.assign(_not_run=(df["budget"] > 0) & (df["budget"] < top))
    out = []
    for stage, g in split_stages(df).items():
        configs = g[CONFIG_KEYS].drop_duplicates().itertuples(index=False, name=None)
        seeds = sorted(g["seed"].unique())
        budgets = sorted(g["budget"].unique())
        present = set(g[ROW_KEYS].itertuples(index=False, name=None))
        for size, reward, alloc in sorted(configs):
            for seed in seeds:
                for budget in budgets:
                    if (size, reward, alloc, seed, budget) not in present:
                        out.append((stage, size, reward, alloc, seed, budget, "all", "no row"))
        for t in targets:
            nan = g[g[f"acc_{t}"].isna()]
            if search_only_at_top and t in SEARCH_TARGETS:
                nan = nan[~nan["_not_run"]]
            if t == NATIVE_TARGET:
                # One base evaluation per size, its native reward under one reward system:
                # the others' base rows are blank by design wherever that one has a value.
                base = g[(g["budget"] == 0) & g[f"acc_{t}"].notna()]
                nan = nan[~((nan["budget"] == 0) & nan["size"].isin(set(base["size"])))]
            for size, reward, alloc, seed, budget in nan[ROW_KEYS].itertuples(index=False,
                                                                                name=None):
                out.append((stage, size, reward, alloc, seed, budget, t, f"NaN acc_{t}"))
    res = pd.DataFrame(out, columns=MISSING_COLUMNS)
    return res.sort_values(MISSING_COLUMNS, kind="mergesort").reset_index(drop=True)
