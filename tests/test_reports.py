"""Reports layer: frontier and regime tables, RACE protocol, sigmoid fits, figures, CLI.

Every table is synthetic with a known answer (tests/synthetic_runs.py, fixed seeds). Figures are
checked on the matplotlib Figure (panel count and titles) before anything is saved, and the
written files once, through ``race report``.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402
from scipy.stats import spearmanr  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))

from synthetic_runs import make_runs, make_study, wilson  # noqa: E402

from race.analysis import figures, paper_figures  # noqa: E402
from race.analysis.columns import TARGET_LABELS  # noqa: E402
from race.analysis.fit import (  # noqa: E402
    INSUFFICIENT,
    fit_sigmoid,
    fit_table,
    sigmoid,
    sigmoid_band,
)
from race.analysis.frontier import (  # noqa: E402
    DECIDED_Z,
    Z95,
    frontier_table,
    is_decided,
    missing_cells,
    normalise_runs,
    rank_candidates,
    regime_table,
    seed_summary,
    size_order,
)
from race.analysis.protocol import agreement, rank_pilot, select  # noqa: E402
from race.analysis.regime_cells import UNDECIDED_LABEL, regime_cell  # noqa: E402
from race.analysis.report import analyse  # noqa: E402
from race.analysis.report_data import nested_savings  # noqa: E402
from race.analysis.report_markdown import FIGURE_CAPTIONS, render  # noqa: E402

T = "in_pass1"


def table(values: dict[tuple[str, str, float], float], *, stage: str = "full",
          seeds: tuple[int, ...] = (0,), reward: str = "rule",
          targets: tuple[str, ...] = (T,)) -> pd.DataFrame:
    """Rows whose accuracy is looked up in ``values[(size, alloc, budget)]`` (or with the seed
    as a fourth key element when present)."""
    sizes = sorted({k[0] for k in values}, key=["nano", "micro", "mini"].index)
    allocs = sorted({k[1] for k in values})
    budgets = sorted({k[2] for k in values})
    configs = sorted({(k[0], reward, k[1]) for k in values})

    def acc(size, _reward, alloc, seed, budget, _target):
        return values.get((size, alloc, budget, seed), values.get((size, alloc, budget)))

    df = make_runs(sizes=sizes, rewards=(reward,), allocs=allocs, targets=targets, stage=stage,
                   budgets=budgets, seeds=seeds, configs=configs, acc=acc)
    return normalise_runs(df)


# ----------------------------------------------------------------------------------------------
# Frontier and regime


KNOWN = {
    ("nano", "base", 1e11): 0.30, ("nano", "base", 4e11): 0.40,
    ("nano", "search", 1e11): 0.35, ("nano", "search", 4e11): 0.45,
    ("micro", "base", 1e11): 0.20, ("micro", "base", 4e11): 0.60,
    ("micro", "search", 1e11): 0.25, ("micro", "search", 4e11): 0.50,
}


def test_frontier_known_winner():
    f = frontier_table(table(KNOWN)).set_index("budget")
    assert f.loc[1e11, "best"] == "nano/search"
    assert f.loc[1e11, "runner_up"] == "nano/base"
    assert f.loc[1e11, "gap"] == pytest.approx(0.05)
    assert f.loc[4e11, "best"] == "micro/base"
    assert (f.loc[4e11, "best_size"], f.loc[4e11, "best_alloc"]) == ("micro", "base")
    assert f.loc[4e11, "gap"] == pytest.approx(0.10)
    assert not f["tie"].any()
    assert (f["n_candidates"] == 4).all() and (f["n_seeds"] == 1).all()
    # One seed: the row's own interval, and the gap's z uses both standard errors.
    lo, hi = wilson(0.60 * 400, 400)
    assert (f.loc[4e11, "acc_lo"], f.loc[4e11, "acc_hi"]) == pytest.approx((lo, hi))
    assert f.loc[4e11, "gap_z"] > 2 and not f.loc[4e11, "overlap"]
    # 0.35 vs 0.30 on 400 samples each is z ~ 1.5: a leader, not a decided winner.
    assert f["decided"].tolist() == [False, True]
    assert f.loc[1e11, "gap_z"] == pytest.approx(0.05 / math.hypot(_se(0.35), _se(0.30)))


def test_regime_known_winner():
    r = regime_table(table(KNOWN)).set_index(["budget", "size"])["best_alloc"]
    assert r.to_dict() == {(1e11, "nano"): "search", (1e11, "micro"): "search",
                           (4e11, "nano"): "search", (4e11, "micro"): "base"}


def test_seed_interval_combines_spread_and_binomial():
    vals = {("nano", "base", 1e11, s): a for s, a in enumerate([0.40, 0.45, 0.50])}
    vals[("nano", "base", 1e11)] = 0.0
    s = seed_summary(table(vals, seeds=(0, 1, 2)), T, ["size", "alloc", "budget"]).iloc[0]
    se_b = [(wilson(a * 400, 400)[1] - wilson(a * 400, 400)[0]) / (2 * Z95)
            for a in (0.40, 0.45, 0.50)]
    # The binomial floor is one evaluation's variance (the mean), not over k: the seeds share
    # the evaluation prompts.
    se = math.sqrt(max(np.var([0.40, 0.45, 0.50], ddof=1) / 3, sum(x * x for x in se_b) / 3))
    assert s["n_seeds"] == 3 and s["acc"] == pytest.approx(0.45)
    assert s["se"] == pytest.approx(se)
    assert (s["acc_lo"], s["acc_hi"]) == pytest.approx((0.45 - Z95 * se, 0.45 + Z95 * se))
    # Seeds that happen to agree: the interval is one evaluation's, not narrower.
    close = {("nano", "base", 1e11, s): a for s, a in enumerate([0.4475, 0.45, 0.4525])}
    close[("nano", "base", 1e11)] = 0.0
    s = seed_summary(table(close, seeds=(0, 1, 2)), T, ["size", "alloc", "budget"]).iloc[0]
    one = (wilson(0.45 * 400, 400)[1] - wilson(0.45 * 400, 400)[0]) / (2 * Z95)
    assert s["se"] == pytest.approx(one, rel=0.01)


def test_ties_are_reported_not_broken():
    vals = dict(KNOWN)
    vals[("nano", "base", 1e11)] = 0.35  # equal to nano/search
    df = table(vals)
    f = frontier_table(df).set_index("budget")
    assert f.loc[1e11, "best"] == "nano/base|nano/search"
    assert f.loc[1e11, "tie"] and f.loc[1e11, "n_tied"] == 2
    assert f.loc[1e11, "runner_up"] == "micro/search"
    r = regime_table(df).set_index(["budget", "size"])
    assert r.loc[(1e11, "nano"), "best_alloc"] == "base|search"
    assert r.loc[(1e11, "nano"), "tie"] and not r.loc[(1e11, "micro"), "tie"]
    # A tie is never decided, however far the tied pair is ahead of the next candidate.
    assert f.loc[1e11, "gap_z"] > DECIDED_Z and not f.loc[1e11, "decided"]
    assert not r.loc[(1e11, "nano"), "decided"]


def _se(a: float, n: int = 400) -> float:
    """Binomial standard error implied by the synthetic rows' Wilson interval."""
    lo, hi = wilson(a * n, n)
    return (hi - lo) / (2 * Z95)


#: One clear and one noisy cell per budget, and a size with a single allocation (lone candidate).
NOISY = {
    ("nano", "base", 1e11): 0.30, ("nano", "search", 1e11): 0.60,  # clear: z ~ 9
    ("micro", "base", 1e11): 0.40, ("micro", "search", 1e11): 0.42,  # noisy: z ~ 0.6
    ("mini", "base", 1e11): 0.40,  # alone
    ("nano", "base", 4e11): 0.55, ("nano", "search", 4e11): 0.56,  # noisy: z ~ 0.3
    ("micro", "base", 4e11): 0.54, ("micro", "search", 4e11): 0.30,  # clear: z ~ 7
    ("mini", "base", 4e11): 0.20,  # alone
}
NOISY_DECIDED = {(1e11, "nano"): True, (1e11, "micro"): False, (1e11, "mini"): False,
                 (4e11, "nano"): False, (4e11, "micro"): True, (4e11, "mini"): False}


def test_decided_rule():
    assert DECIDED_Z == 2.0
    assert is_decided(2.0) and is_decided(7.1)
    assert not is_decided(1.99) and not is_decided(math.nan) and not is_decided(pd.NA)
    assert not is_decided(None) and not is_decided(9.0, tie=True)


def test_regime_and_frontier_decided_clear_vs_noisy():
    df = table(NOISY)
    r = regime_table(df).set_index(["budget", "size"])
    assert r["decided"].dtype == bool
    assert r["decided"].to_dict() == NOISY_DECIDED
    assert r.loc[(1e11, "micro"), "gap_z"] == pytest.approx(
        0.02 / math.hypot(_se(0.42), _se(0.40)))
    assert r.loc[(1e11, "micro"), "gap_z"] < 1 and r.loc[(1e11, "micro"), "overlap"]
    assert r.loc[(4e11, "micro"), "gap_z"] == pytest.approx(
        0.24 / math.hypot(_se(0.54), _se(0.30)))
    # A lone candidate has nothing to be compared against: no z, not decided.
    lone = r.loc[(4e11, "mini")]
    assert lone["n_candidates"] == 1 and lone["runner_up"] == "" and math.isnan(lone["gap_z"])
    f = frontier_table(df).set_index("budget")
    assert f["decided"].dtype == bool
    assert (f.loc[1e11, "best"], f.loc[1e11, "runner_up"]) == ("nano/search", "micro/search")
    assert f.loc[1e11, "gap_z"] == pytest.approx(0.18 / math.hypot(_se(0.60), _se(0.42)))
    assert f.loc[1e11, "decided"]
    assert (f.loc[4e11, "best"], f.loc[4e11, "runner_up"]) == ("nano/search", "nano/base")
    assert f.loc[4e11, "gap_z"] < 1 and not f.loc[4e11, "decided"]


def test_missing_cells_are_reported():
    df = table(KNOWN)
    absent = (df["size"] == "micro") & (df["alloc"] == "base") & (df["budget"] == 4e11)
    df = df[~absent].copy()
    df.loc[(df["size"] == "nano") & (df["alloc"] == "search") & (df["budget"] == 1e11),
           f"acc_{T}"] = np.nan
    m = missing_cells(df)
    assert m[["size", "alloc", "budget", "target", "reason"]].values.tolist() == [
        ["micro", "base", 4e11, "all", "no row"],
        ["nano", "search", 1e11, T, f"NaN acc_{T}"],
    ]
    # The rest still ranks: without micro/base at 4e11 the winner is micro/search.
    f = frontier_table(df).set_index("budget")
    assert f.loc[4e11, "best"] == "micro/search" and f.loc[4e11, "n_candidates"] == 3
    assert f.loc[1e11, "best"] == "nano/base" and f.loc[1e11, "n_candidates"] == 3


def test_search_targets_below_the_top_rung_are_not_run_by_design():
    """eval.search_at: base_and_top: maj_k's NaNs between the base and a cell's top rung are
    not missing; at the top rung they are."""
    df = table(KNOWN)
    df["acc_maj_k"] = 0.5
    top = df.groupby(["size", "reward", "alloc", "seed"])["budget"].transform("max")
    df.loc[(df["budget"] > 0) & (df["budget"] < top), "acc_maj_k"] = np.nan
    df.loc[(df["size"] == "nano") & (df["alloc"] == "base") & (df["budget"] == top),
           "acc_maj_k"] = np.nan  # a real gap at the top rung
    by_design = missing_cells(df, [T, "maj_k"], search_only_at_top=True)
    assert by_design[["size", "alloc", "target"]].values.tolist() == [["nano", "base", "maj_k"]]
    every_rung = missing_cells(df, [T, "maj_k"])
    assert len(every_rung) == int(df["acc_maj_k"].isna().sum()) > 1
    # The same in a stage that does not sort first (each stage's rows are renumbered).
    shuffled = df.assign(stage="pilot").sample(frac=1.0, random_state=0)
    two = normalise_runs(pd.concat([df, shuffled], ignore_index=True))
    by_design = missing_cells(two, [T, "maj_k"], search_only_at_top=True)
    assert by_design[["stage", "size", "alloc", "target"]].values.tolist() == [
        ["full", "nano", "base", "maj_k"], ["pilot", "nano", "base", "maj_k"]]


# ----------------------------------------------------------------------------------------------
# RACE protocol


PILOT = {("nano", "a", 1e11): 0.30, ("nano", "a", 2e11): 0.50,
         ("nano", "b", 1e11): 0.30, ("nano", "b", 2e11): 0.40,
         ("nano", "c", 1e11): 0.20, ("nano", "c", 2e11): 0.30}
VALIDATION = {("nano", "a", 1e12): 0.55, ("nano", "b", 1e12): 0.60, ("nano", "c", 1e12): 0.35}
FULL = {**VALIDATION, ("nano", "d", 1e12): 0.70}


def test_rank_pilot_and_tie_break():
    r = rank_pilot(table(PILOT, stage="pilot"))
    assert r["alloc"].tolist() == ["a", "b", "c"] and r["rank"].tolist() == [1, 2, 3]
    assert r["acc_top"].tolist() == [0.5, 0.4, 0.3] and (r["top_budget"] == 2e11).all()
    vals = dict(PILOT)
    vals[("nano", "c", 2e11)] = 0.40  # ties b at the top rung ...
    vals[("nano", "c", 1e11)] = 0.35  # ... and has the higher mean over rungs
    r = rank_pilot(table(vals, stage="pilot"))
    assert r["alloc"].tolist() == ["a", "c", "b"]
    vals[("nano", "c", 1e11)] = 0.30  # tied on both: by name
    r = rank_pilot(table(vals, stage="pilot"))
    assert r["alloc"].tolist() == ["a", "b", "c"]


def test_a_config_without_a_top_rung_value_is_not_ranked_or_selected():
    pilot = table(PILOT, stage="pilot")
    # the pilot's best, but no value at its top rung
    pilot.loc[(pilot["alloc"] == "a") & (pilot["budget"] == 2e11), f"acc_{T}"] = math.nan
    r = rank_pilot(pilot)
    assert r["alloc"].tolist() == ["b", "c", "a"] and r["rank"].tolist()[:2] == [1, 2]
    assert pd.isna(r["rank"].iloc[2])
    assert [c["alloc"] for c in select(pilot, 1, "c")] == ["b", "c"]


def test_size_order_puts_sizes_without_params_last_in_name_order():
    df = table({(s, "a", 1e11): 0.5 for s in ("nano", "micro", "mini")})
    df["size"] = df["size"].map({"nano": "org--B-14B", "micro": "nano", "mini": "org--B-3B"})
    df.loc[df["size"].str.startswith("org"), "params"] = math.nan  # hub sizes: not counted
    assert size_order(df) == ["nano", "org--B-14B", "org--B-3B"]


def test_select_union_plus_baseline():
    pilot = table({("nano", "a", 1e11): 0.5, ("nano", "b", 1e11): 0.2,
                   ("micro", "a", 1e11): 0.3, ("micro", "b", 1e11): 0.4}, stage="pilot",
                  targets=(T, "ood_pass1"))
    pilot.loc[(pilot["size"] == "micro") & (pilot["alloc"] == "b"), "acc_ood_pass1"] = 0.9
    # Top-1 is nano/a on in_pass1 and micro/b on ood_pass1; the baseline "a" at both sizes.
    sel = select(pilot, top_k=1, baseline_alloc="a", targets=[T, "ood_pass1"])
    assert sel == [{"size": "micro", "reward": "rule", "alloc": "a"},
                   {"size": "micro", "reward": "rule", "alloc": "b"},
                   {"size": "nano", "reward": "rule", "alloc": "a"}]
    assert select(pilot, 1, "a", [T]) == [{"size": "micro", "reward": "rule", "alloc": "a"},
                                           {"size": "nano", "reward": "rule", "alloc": "a"}]
    assert len(select(pilot, 4, "a", [T])) == 4
    with pytest.raises(ValueError, match="baseline"):
        select(pilot, 1, "nope")


def test_agreement_hand_made():
    pilot = table(PILOT, stage="pilot")
    val = table(VALIDATION, stage="validation", seeds=(0, 1))
    full = table(FULL, stage="full", seeds=(0, 1))
    ag = agreement(pilot, val, full)
    row = ag.table.iloc[0]
    # pilot a > b > c, validation b > a > c: d^2 = 1 + 1 + 0 -> rho = 1 - 6*2/(3*8) = 0.5
    assert row["n_common"] == 3 and row["spearman_rho"] == pytest.approx(0.5)
    assert row["pilot_pick"] == "nano/a" and row["validation_best"] == "nano/b"
    assert not row["top1_agree"]
    assert row["regret_points"] == pytest.approx(5.0)
    assert row["full_best"] == "nano/d"
    assert row["regret_full_points"] == pytest.approx(10.0)  # RACE's choice b vs d
    assert row["regret_full_pilot_points"] == pytest.approx(15.0)  # the pilot's pick a vs d
    ranks = ag.ranks.set_index("alloc")
    assert ranks["validation_rank"].to_dict() == {"a": 2.0, "b": 1.0, "c": 3.0}
    # Cost: 3 pilot cells x 2e11 vs 4 configs x 2 seeds x 1e12 (measured full grid).
    assert ag.cost.pilot_flops == pytest.approx(6e11)
    assert ag.cost.full_grid_flops == pytest.approx(8e12) and not ag.cost.full_grid_estimated
    assert ag.cost.pilot_share == pytest.approx(0.075)
    # The validation's seed-0 runs carry the pilot's runs on to 1e12: RACE is 3 configs x 2
    # seeds x 1e12, each run counted once (not the pilot's 6e11 again on top).
    assert ag.cost.validation_flops == pytest.approx(6e12 - 6e11)
    assert ag.cost.race_share == pytest.approx(0.75)
    # A one-seed full grid is compared at the validation's two seeds (like for like).
    one_seed = agreement(pilot, val, table(FULL, stage="full")).cost
    assert not one_seed.full_grid_estimated
    assert one_seed.full_grid_flops == pytest.approx(8e12)
    assert one_seed.race_share == pytest.approx(0.75)
    # Without the full grid: estimated as 3 configs x 2 seeds x 1e12.
    est = agreement(pilot, val).cost
    assert est.full_grid_estimated and est.full_grid_flops == pytest.approx(6e12)
    assert math.isnan(agreement(pilot, val).table["regret_full_points"].iloc[0])


def test_agreement_scores_only_what_the_pilot_measured():
    """A target without pilot values (a search target run only at the top rung) is not
    scored, and configs the pilot cannot tell apart share its rank and its pick."""
    pilot = table(PILOT, stage="pilot", targets=(T, "maj_k"))
    pilot.loc[pilot["budget"] == 2e11, "acc_maj_k"] = np.nan  # none at the top pilot rung
    val = table(VALIDATION, stage="validation", seeds=(0, 1), targets=(T, "maj_k"))
    rows = agreement(pilot, val).table.set_index("target")
    assert rows.loc["maj_k", "n_common"] == 0 and math.isnan(rows.loc["maj_k", "spearman_rho"])
    assert rows.loc["maj_k", "pilot_pick"] != rows.loc["maj_k", "pilot_pick"]  # NaN: none
    assert rows.loc[T, "n_common"] == 3
    tied = dict(PILOT)
    tied[("nano", "b", 2e11)] = 0.50  # b equals a at the top rung ...
    tied[("nano", "b", 1e11)] = 0.30  # ... and in the mean: the pilot cannot tell them apart
    ag = agreement(table(tied, stage="pilot"), val)
    row = ag.table.iloc[0]
    assert row["pilot_pick"] == "nano/a|nano/b" and row["top1_agree"]  # b is the best
    assert row["pilot_pick_validation_acc"] == pytest.approx((0.55 + 0.60) / 2)
    assert row["regret_points"] == pytest.approx(2.5)
    assert ag.ranks.set_index("alloc")["pilot_rank"].to_dict() == {"a": 1.5, "b": 1.5, "c": 3}
    # pilot (1.5, 1.5, 3) vs validation (2, 1, 3): Spearman of the average ranks
    assert row["spearman_rho"] == pytest.approx(spearmanr([1.5, 1.5, 3], [2, 1, 3]).statistic)


def test_agreement_perfect_pilot():
    pilot = table(PILOT, stage="pilot")
    val = table({("nano", "a", 1e12): 0.7, ("nano", "b", 1e12): 0.6}, stage="validation",
                seeds=(0, 1, 2))
    row = agreement(pilot, val).table.iloc[0]
    assert row["spearman_rho"] == pytest.approx(1.0) and row["top1_agree"]
    assert row["regret_points"] == pytest.approx(0.0) and row["n_common"] == 2


# ----------------------------------------------------------------------------------------------
# Fits


def test_sigmoid_fit_recovers_known_parameters():
    rng = np.random.default_rng(0)
    c = np.geomspace(1e10, 1e14, 10)
    y = sigmoid(c, 0.8, 1.5, 1e12, 0.1) + rng.normal(0, 0.01, c.size)
    for r0 in (0.1, None):
        f = fit_sigmoid(c, y, r0)
        assert f.status == "ok" and f.r0_fixed == (r0 is not None)
        assert f.A == pytest.approx(0.8, abs=0.03)
        assert f.B == pytest.approx(1.5, rel=0.25)
        assert math.log10(f.C_mid) == pytest.approx(12.0, abs=0.15)
        assert f.R0 == pytest.approx(0.1, abs=0.03)
        assert f.rmse < 0.02


def test_fit_table_base_rows_holdout_and_insufficient_rungs():
    budgets = [1e11, 2e11, 4e11, 8e11, 1.6e12, 3.2e12]
    vals = {("nano", "base", b): round(float(sigmoid(b, 0.7, 1.2, 5e11, 0.1)) * 400) / 400
            for b in budgets}
    df = table(vals)
    base = df[df["budget"] == 1e11].assign(budget=0.0, flops_total=0.0, **{f"acc_{T}": 0.1})
    fits = fit_table(pd.concat([df, base])).iloc[0]
    assert fits["status"] == "ok" and fits["r0_fixed"] and fits["R0"] == 0.1
    assert fits["A"] == pytest.approx(0.7, abs=0.03) and fits["n_rungs"] == 6
    assert fits["holdout_status"] == "ok" and abs(fits["holdout_error_points"]) < 3
    assert fits["holdout_budget"] == 3.2e12
    # Three rungs, R0 free: four parameters -> no fit at all.
    few = fit_table(df[df["budget"] <= 4e11]).iloc[0]
    assert few["status"] == INSUFFICIENT and math.isnan(few["A"])
    assert few["holdout_status"] == INSUFFICIENT and math.isnan(few["holdout_pred"])
    # Three rungs with R0 fixed: a fit, but no rung left to hold out.
    few = fit_table(pd.concat([df[df["budget"] <= 4e11], base])).iloc[0]
    assert few["status"] == "ok" and few["holdout_status"] == INSUFFICIENT


def test_a_reward_without_a_base_value_fits_r0_freely():
    """The base policy's native reward is measured under one reward only; another reward's
    fit must not borrow it as R0."""
    budgets = [1e11, 2e11, 4e11, 8e11, 1.6e12, 3.2e12]
    vals = {("nano", "base", b): round(float(sigmoid(b, 0.7, 1.2, 5e11, 0.1)) * 400) / 400
            for b in budgets}
    parts = [table(vals, reward=reward) for reward in ("rule", "prm")]
    base = [p[p["budget"] == 1e11].assign(budget=0.0, flops_total=0.0) for p in parts]
    base[0][f"acc_{T}"] = 0.1
    base[1][f"acc_{T}"] = np.nan  # measured under the rule reward only
    fits = fit_table(pd.concat(parts + base)).set_index("reward")
    assert fits.loc["rule", "r0_fixed"] and fits.loc["rule", "R0"] == 0.1
    assert not fits.loc["prm", "r0_fixed"]


def test_a_winner_is_decided_only_against_every_other_candidate():
    """A third candidate with a lower mean but a wide interval can be closer to the winner
    than the runner-up is: the winner is then undecided."""
    cands = pd.DataFrame({"label": ["a", "b", "c"], "acc": [0.80, 0.70, 0.69],
                          "se": [0.01, 0.01, 0.20], "acc_lo": [0.78, 0.68, 0.30],
                          "acc_hi": [0.82, 0.72, 1.0], "n_seeds": [2, 2, 2]})
    r = rank_candidates(cands)
    assert r["runner_up"] == "b" and r["gap_z"] == pytest.approx(0.1 / math.hypot(0.01, 0.01))
    assert not r["decided"]
    assert rank_candidates(cands.assign(se=0.01))["decided"]
    assert not rank_candidates(cands.assign(se=[0.01, 0.01, np.nan]))["decided"]


def test_the_same_flop_figure_uses_a_trained_rung():
    """The base rung has a row for every config but buys nothing: a partial grid's most
    common rung must not be it."""
    df = table(KNOWN)
    base = df[df["budget"] == 1e11].assign(budget=0.0, flops_total=0.0)
    partial = df[~((df["budget"] == 4e11) & (df["alloc"] == "base"))
                 & ~((df["budget"] == 1e11) & (df["size"] == "nano") & (df["alloc"] == "search"))]
    assert figures.equal_budget(pd.concat([partial, base])) == 1e11  # 3 configs; base: 4
    assert math.isnan(figures.equal_budget(base))  # nothing trained yet


def test_sigmoid_band_parametric_bootstrap():
    c = np.geomspace(1e10, 1e14, 8)
    truth = sigmoid(c, 0.8, 1.5, 1e12, 0.1)
    se = np.full(c.size, 0.02)
    fit = fit_sigmoid(c, truth, 0.1)
    grid = np.geomspace(c.min(), c.max(), 50)
    lo, hi = sigmoid_band(c, truth, se, fit, grid)
    # Deterministic (seeded), ordered, around the fit, and about as wide as the points' noise.
    again = sigmoid_band(c, truth, se, fit, grid)
    assert np.array_equal(lo, again[0]) and np.array_equal(hi, again[1])
    curve = fit.predict(grid)
    assert np.all(lo <= curve + 1e-9) and np.all(curve <= hi + 1e-9)
    assert 0.005 < float(np.median(hi - lo)) < 0.08
    # Ten times less noise, a band about ten times narrower; none, the fit itself.
    lo10, hi10 = sigmoid_band(c, truth, se / 10, fit, grid)
    assert float(np.median(hi10 - lo10)) == pytest.approx(float(np.median(hi - lo)) / 10,
                                                         rel=0.3)
    lo0, hi0 = sigmoid_band(c, truth, se * 0, fit, grid)
    assert lo0 == pytest.approx(curve, abs=1e-6) and hi0 == pytest.approx(curve, abs=1e-6)
    # No band without a fit or without every point's standard error.
    assert sigmoid_band(c, truth, np.append(se[:-1], np.nan), fit, grid) is None
    assert sigmoid_band(c[:2], truth[:2], se[:2], fit_sigmoid(c[:2], truth[:2]), grid) is None


# ----------------------------------------------------------------------------------------------
# Figures, report, CLI


@pytest.fixture(scope="module")
def study() -> pd.DataFrame:
    return normalise_runs(make_study())


@pytest.fixture(scope="module")
def gappy(study) -> pd.DataFrame:
    """The study with one full-grid row removed (a known missing cell)."""
    gone = ((study["stage"] == "full") & (study["size"] == "micro") & (study["reward"] == "rule")
            & (study["alloc"] == "search") & (study["seed"] == 2) & (study["budget"] == 8e11))
    return study[~gone].reset_index(drop=True)


@pytest.fixture(scope="module")
def report(gappy):
    return analyse(gappy, study="synthetic")


def _titled(fig) -> list[str]:
    return [ax.get_title() for ax in fig.axes if ax.get_title()]


@pytest.mark.parametrize("name,shape", [
    ("frontier", ("rewards", "targets")),
    ("compute_breakdown", ("sizes", "rewards")),
    ("same_flop", ("rewards", 2)),
    ("regime_map", ("rewards", "targets")),
    ("race_agreement", ("rewards", "targets")),
    ("fits", ("rewards", "targets")),
])
def test_figure_panels(report, name, shape):
    data = report.figure_data()
    counts = {"rewards": len(data.rewards), "targets": len(data.targets),
              "sizes": len(data.sizes)}
    rows, cols = (counts[s] if isinstance(s, str) else s for s in shape)
    fig = figures.PLOTTERS[name](data)
    titles = _titled(fig)
    assert len(titles) == rows * cols, titles
    assert "?" in fig.get_suptitle()  # the title states the question
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel()
    if name in ("frontier", "fits"):
        assert all(ax.get_xscale() == "log" for ax in fig.axes)
        assert f"prm reward · {TARGET_LABELS['in_pass1']}" in titles
    if name == "same_flop":  # counts of tens to thousands: linear axes from 0
        assert all(ax.get_yscale() == "linear" and ax.get_ylim()[0] == 0 for ax in fig.axes)


def _drawn_texts(fig) -> list:
    """Every visible, non-empty text of a drawn figure (tick labels, titles, notes, legend)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    FigureCanvasAgg(fig).draw()
    return [t for t in fig.findobj(Text) if t.get_visible() and t.get_text().strip()]


@pytest.mark.parametrize("name", figures.FIGURE_NAMES)
def test_single_column_figures_are_legible(report, name):
    """Each per-reward (or per reward and target) figure: one column wide, no text under 7 pt,
    and no title, axis label, note or legend entry cut off at the figure's edge."""
    data = report.figure_data()
    keys = paper_figures.panel_keys(data, name)
    per_target = name in ("frontier", "regime_map", "race_agreement", "fits")
    assert keys == ([(r, t) for r in data.rewards for t in data.targets] if per_target
                    else [(r,) for r in data.rewards])
    for key in keys:
        fig = paper_figures.plot_panel(name, data, *key)
        w, h = fig.get_size_inches()
        assert 3.3 <= w <= 3.5 and h <= 9.0, (key, w, h)
        texts = _drawn_texts(fig)
        small = [(t.get_text(), t.get_fontsize()) for t in texts if t.get_fontsize() < 7]
        assert not small, (key, small)
        box = fig.bbox
        renderer = fig.canvas.get_renderer()
        framed = [t for ax in fig.axes for t in (ax.title, ax.xaxis.label, ax.yaxis.label,
                                                 *ax.texts)]
        framed += [t for lg in fig.legends for t in lg.get_texts()]
        for t in framed:
            if not t.get_text().strip():
                continue
            e = t.get_window_extent(renderer)
            assert (e.x0 >= box.x0 - 1 and e.x1 <= box.x1 + 1 and e.y0 >= box.y0 - 1
                    and e.y1 <= box.y1 + 1), (key, t.get_text())
        assert any(f"{key[0]} reward" in t.get_text() for t in texts)  # titled by reward


def test_single_column_fits_stay_within_the_data_with_a_band(report):
    data = report.figure_data()
    pts = data.points[data.points["acc"].notna()]
    ok = data.fits[data.fits["status"] == "ok"]
    assert len(ok) > 0
    for reward in data.rewards:
        for target in data.targets:
            fig = paper_figures.plot_panel("fits", data, reward, target)
            (ax,) = [a for a in fig.axes if a.get_title()]
            assert ax.get_xscale() == "log"
            lines = {ln.get_gid(): ln for ln in ax.get_lines() if str(ln.get_gid()).startswith(
                "fit:")}
            bands = {c.get_gid(): c for c in ax.collections if str(c.get_gid()).startswith(
                "band:")}
            want = ok[(ok["reward"] == reward) & (ok["target"] == target)]
            assert sorted(lines) == sorted(f"fit:{r.size}/{r.alloc}" for r in want.itertuples())
            for gid, line in lines.items():
                size, alloc = gid.removeprefix("fit:").split("/")
                g = pts[(pts["size"] == size) & (pts["alloc"] == alloc)
                        & (pts["reward"] == reward) & (pts["target"] == target)]
                x = np.asarray(line.get_xdata(), dtype=float)
                # Smooth: many points, from the smallest to the largest FLOPs with data.
                assert len(x) >= 50 and np.all(np.diff(np.log(x)) > 0)
                assert x.min() == pytest.approx(g["flops"].min(), rel=1e-12)
                assert x.max() == pytest.approx(g["flops"].max(), rel=1e-12)
                band = bands[f"band:{size}/{alloc}"]  # every drawn fit has its band
                verts = np.concatenate([p.vertices for p in band.get_paths()])
                assert verts[:, 0].min() >= x.min() * (1 - 1e-12)
                assert verts[:, 0].max() <= x.max() * (1 + 1e-12)
    b = data.bands
    assert (b["lo"] <= b["hi"]).all() and b["lo"].notna().all()
    assert ((b["fit"] >= b["lo"] - 1e-9) & (b["fit"] <= b["hi"] + 1e-9)).mean() > 0.9


def test_single_column_same_flop_counts_are_linear(report):
    data = report.figure_data()
    fig = paper_figures.plot_panel("same_flop", data, data.rewards[0])
    axes = [a for a in fig.axes if a.get_title()]
    assert len(axes) == 2
    assert all(a.get_yscale() == "linear" and a.get_ylim()[0] == 0 for a in axes)
    assert [a.get_title().split(" ")[0] for a in axes] == ["updates", "rollouts"]


def _noisy_report():
    rep = analyse(table(NOISY), study="noisy")
    rep.figures = {n: [f"figures/{n}.png", f"figures/{n}.svg"] for n in figures.FIGURE_NAMES}
    return rep


def test_regime_map_draws_undecided_cells_grey():
    rep = _noisy_report()
    data = rep.figure_data()
    allocs = data.allocs
    assert allocs == ["base", "search"]
    cells = {(r.budget, r.size): regime_cell(r, allocs) for r in rep.regime.itertuples()}
    assert {k: c.kind for k, c in cells.items()} == {
        (1e11, "nano"): "winner", (1e11, "micro"): "undecided", (1e11, "mini"): "undecided",
        (4e11, "nano"): "undecided", (4e11, "micro"): "winner", (4e11, "mini"): "undecided"}
    # Winners take their allocation's colour index; an undecided cell takes none of them.
    assert cells[(1e11, "nano")].code == allocs.index("search")
    assert cells[(4e11, "micro")].code == allocs.index("base")
    assert all(c.code == len(allocs) + 1 for c in cells.values() if c.kind == "undecided")
    z = 0.02 / math.hypot(_se(0.42), _se(0.40))
    assert cells[(1e11, "micro")].text == f"search?\nz={z:.1f}" == "search?\nz=0.6"
    assert cells[(4e11, "mini")].text == "base?\nalone"

    fig = figures.plot_regime_map(data)
    (ax,) = [a for a in fig.axes if a.get_title()]
    mesh = ax.collections[0].get_array()
    # Rows are sizes (nano, micro, mini), columns budgets (1e11, 4e11).
    assert np.ma.filled(mesh, -1).reshape(3, 2).tolist() == [[1, 3], [3, 0], [3, 3]]
    hatched = [p for p in ax.patches if p.get_hatch()]
    assert sorted((p.get_x(), p.get_y()) for p in hatched) == [(0, 1), (0, 2), (1, 0), (1, 2)]
    texts = {t.get_text() for t in ax.texts}
    assert {"search", "base", "search?\nz=0.6", "base?\nalone"} <= texts
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["base", "search", "tie", UNDECIDED_LABEL] == [
        "base", "search", "tie", "undecided (z < 2)"]


def test_frontier_figure_shows_intervals():
    rep = _noisy_report()
    fig = figures.plot_frontier(rep.figure_data())
    (ax,) = [a for a in fig.axes if a.get_title()]
    assert len(ax.containers) == 5  # one errorbar series per (size, alloc)
    # Each vertical bar runs from acc_lo to acc_hi of its (size, alloc, budget).
    got = sorted((float(seg[0][1]), float(seg[1][1])) for c in ax.containers
                 for seg in c.lines[2][0].get_segments())
    s = rep.summary[rep.summary["budget"] > 0]
    want = sorted(zip(s["acc_lo"], s["acc_hi"], strict=True))
    assert len(got) == 10
    assert got == pytest.approx(want)
    lo, hi = wilson(0.60 * 400, 400)
    assert (lo, hi) in [pytest.approx(b) for b in got]


def test_report_counts_decided_winners():
    md = render(_noisy_report())
    assert "## Decided winners" in md
    # The two mini cells have one allocation each (nothing to decide): not comparable.
    assert (f"- rule reward · {TARGET_LABELS[T]}: 1 of 2 comparable frontier winners and 2 of "
            "4 comparable regime cells decided (z ≥ 2).") in md
    assert ("Decided (z ≥ 2): 1 of 2 comparable frontier winners, 2 of 4 comparable regime "
            "cells.") in md
    z = 0.02 / math.hypot(_se(0.42), _se(0.40))
    assert f"undecided (search vs base, z={z:.1f})" == "undecided (search vs base, z=0.6)"
    assert "| micro | undecided (search vs base, z=0.6) | base |" in md
    assert "| mini | undecided (base alone) | undecided (base alone) |" in md
    assert "| nano | search | undecided (search vs base, z=0.3) |" in md


def test_figure_not_run_without_validation(study, tmp_path):
    rep = analyse(study[study["stage"] == "pilot"], study="pilot only")
    assert rep.agreement is None and rep.not_run == ["race_agreement"]
    fig = figures.plot_race_agreement(rep.figure_data())
    assert len(fig.axes) == 1
    assert any("not run" in t.get_text() for t in fig.axes[0].texts)
    paths = figures.write("race_agreement", rep.figure_data(), tmp_path)
    assert [p.name for p in paths] == ["race_agreement.png", "race_agreement.svg"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_nested_savings(report):
    sv = nested_savings(report.runs)
    # Every synthetic run uses exactly its budget. A run is a cell, whichever grids list it:
    # the 12 configs x 3 seeds of the full grid. Seed 0's pass the pilot's 1e11, 2e11, 4e11 and
    # then 8e11, 1.6e12 (sum 3.1e12, largest 1.6e12); seeds 1 and 2 pass 8e11, 1.6e12 (sum
    # 2.4e12), but one of them (not a validated config) lacks its 8e11 rung.
    assert sv.n_cells == 36 and sv.n_rungs == 12 * 5 + 24 * 2 - 1
    assert sv.separate_flops == pytest.approx(12 * 3.1e12 + 24 * 2.4e12 - 8e11, rel=1e-9)
    assert sv.saved_flops == pytest.approx(12 * 1.5e12 + 24 * 8e11 - 8e11, rel=1e-9)
    assert sv.nested_flops == pytest.approx(36 * 1.6e12, rel=1e-9)


@pytest.fixture(scope="module")
def cli_report(gappy, tmp_path_factory):
    from race.cli import main

    tmp = tmp_path_factory.mktemp("cli")
    gappy.to_csv(tmp / "runs.csv", index=False)
    # The slice of the config the workflow's report rule passes (study, eval and rewards),
    # and the prm.json records of the two PRMs it trained.
    for size, auc in (("mini", 0.96), ("nano", 0.84)):
        (tmp / f"prm_{size}.json").write_text(json.dumps(prm_record(size, auc)))
    assert main(["report", str(tmp / "runs.csv"), "--out", str(tmp / "reports"),
                 *cli_report_args(tmp)]) == 0
    return tmp


CLI_CONFIG = {"study": "cli-study",
              "eval": {"targets": ["in_pass1", "ood_pass1", "maj_k"], "prm": "mini"},
              "rewards": {"rule": {"type": "rule"}, "prm": {"type": "prm", "prm": "mini"}}}


def cli_report_args(folder: Path) -> list[str]:
    """The config slice and PRM records ``cli_report`` passes (its prm_*.json in ``folder``)."""
    records = [str(folder / f"prm_{size}.json") for size in ("mini", "nano")]
    return ["--config", json.dumps(CLI_CONFIG), "--prm", *records]


def prm_record(size: str, auc: float) -> dict:
    """The fields of a prm.json (race.feedback.prm_training.train_prm) the report reads."""
    return {"size": size, "init": f"/abs/results/base/size~{size}", "params": 1000,
            "spec": {"steps": 1500}, "steps": 3000, "auc": auc, "accuracy": auc - 0.1,
            "heldout": {"sampled_no_answer": {"auc": auc - 0.2}},
            "auc_by_error": {"arithmetic": auc, "truncated": 1.0, "answer": None},
            "steps_by_error": {"arithmetic": 400, "truncated": 500, "answer": 0}}


def test_feedback_table_reads_each_prm_and_who_uses_it():
    from race.analysis.prm_quality import feedback_md, feedback_table

    config = {"rewards": {"prm": {"type": "prm", "prm": "mini"},
                          "rule+prm": {"type": "rule+prm", "prm": "mini"},
                          "prm_weak": {"type": "prm", "prm": "nano"}, "rule": {"type": "rule"}},
              "eval": {"prm": "mini"}}
    table = feedback_table([prm_record("nano", 0.84), prm_record("mini", 0.96)], config)
    assert table["prm"].tolist() == ["mini", "nano"]
    assert table["used_by"].tolist() == ["prm, rule+prm, eval", "prm_weak"]
    mini = table.iloc[0]
    assert mini["init"] == "base/size~mini" and mini["train_steps"] == 1500
    assert (mini["auc"], mini["auc_step_lines"], mini["auc_arithmetic"]) == pytest.approx(
        (0.96, 0.76, 0.96))
    assert math.isnan(mini["auc_answer"]) and mini["n_answer"] == 0 and mini["n_sign"] == 0
    md = feedback_md(table)
    # Only the families some PRM saw get a column; a row per PRM, no absolute path.
    assert "| arithmetic | truncated |" in md and "answer (" not in md and "/abs/" not in md
    assert ("| mini | prm, rule+prm, eval | base/size~mini | 3000 | 0.960 | 0.760 | 0.860 "
            "| 0.96 (400)") in md
    assert "No record of a trained PRM" in feedback_md(feedback_table([], config))


def test_bad_prm_records_name_the_file(tmp_path):
    from race.analysis.prm_quality import read_records
    from race.cli import main

    (tmp_path / "runs.csv").write_text("size\n")
    (tmp_path / "other.json").write_text('{"auc": 0.9}')
    for name, message in (("absent.json", "cannot be read"), ("other.json", "no 'size' key")):
        with pytest.raises(ValueError, match=f"{name}: .*{message}"):
            read_records([tmp_path / name])
    with pytest.raises(SystemExit, match="race report: PRM record .*absent.json"):
        main(["report", str(tmp_path / "runs.csv"), "--out", str(tmp_path / "out"),
              "--prm", str(tmp_path / "absent.json")])


def test_cli_report_writes_everything(cli_report):
    out = cli_report / "reports"
    for name in ["runs", "frontier", "regime", "missing", "fits", "pilot_rankings",
                 "agreement", "agreement_ranks", "race_cost"]:
        assert (out / f"{name}.csv").is_file(), name
    for name in figures.FIGURE_NAMES:
        png = out / "figures" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000
        assert (out / "figures" / f"{name}.svg").stat().st_size > 0
    md = (out / "report.md").read_text()
    assert md.startswith("# RACE report: cli-study")
    # The single-column figures: per reward (and target), listed in report.md and captioned.
    for name in figures.FIGURE_NAMES:
        pngs = sorted((out / "figures" / name).rglob("*.png"))
        n_keys = 2 * 2 if name in paper_figures.PER_TARGET else 2  # rewards (x targets)
        assert len(pngs) == n_keys, (name, pngs)
        assert paper_figures.pattern(name) in FIGURE_CAPTIONS[name]
        for png in pngs:
            assert png.with_suffix(".svg").stat().st_size > 0
            rel = png.relative_to(out).as_posix()
            assert f"]({rel})" in md, rel
    assert {p.relative_to(out / "figures").as_posix() for p in (out / "figures").rglob("*.png")
            if p.parent.name != "figures"} >= {"frontier/rule/in_pass1.png",
                                               "fits/prm/ood_pass1.png", "same_flop/rule.png",
                                               "compute_breakdown/prm.png"}
    feedback = pd.read_csv(out / "feedback.csv", keep_default_na=False)
    assert feedback[["prm", "used_by", "auc"]].values.tolist() == [["mini", "prm, eval", 0.96],
                                                                     ["nano", "", 0.84]]
    assert "| nano | – | base/size~nano |" in md
    for section in ["## FLOP conventions", "## Feedback models", "## Frontier", "## Regime",
                    "## RACE",
                    "## Compute–performance fits", "## Nested budget rungs", "## Missing cells",
                    "## Caveats", "](figures/frontier.png)", "Median width",
                    "holds the evaluation's noise only"]:
        assert section in md, section
    assert str(cli_report) not in md  # relative links only
    missing = pd.read_csv(out / "missing.csv")
    assert missing[["stage", "size", "alloc", "seed", "reason"]].values.tolist() == [
        ["full", "micro", "search", 2, "no row"]]
    assert "1 missing" in md
    assert "not evaluated (no values in the table): maj@k" in md
    runs = pd.read_csv(out / "runs.csv")
    assert len(runs) == len(pd.read_csv(cli_report / "runs.csv"))


def test_findings_come_first_and_alone_in_summary_md(cli_report):
    """summary.md holds the findings (one numbered sentence per question, each with numbers),
    and report.md's first 40 lines hold the same ones, before any figure or table."""
    out = cli_report / "reports"
    summary = (out / "summary.md").read_text().splitlines()
    assert summary[0] == "# RACE findings: cli-study"
    sentences = [line for line in summary if line[:1].isdigit() and ". " in line[:4]]
    assert [s.split(".")[0] for s in sentences] == [str(i) for i in range(1, 9)]
    assert all(any(c.isdigit() for c in s.split(". ", 1)[1]) for s in sentences[:7])
    lines = (out / "report.md").read_text().splitlines()
    top = lines[:40]
    assert top[2] == "## Findings"
    for s in sentences:
        assert s in top and top.index(s) < lines.index("## Figures"), s
    text = "\n".join(sentences)
    # The config has no race.targets: the headline is its first target.
    assert f"on {TARGET_LABELS[T]}, the budget buys: " in text
    for word in ("decided", "undecided", "points", "95% interval", "z = "):
        assert word in text, word
    assert "| reward \\ rung (FLOPs) |" in "\n".join(top)  # the winners' small table
    power = pd.read_csv(out / "power.csv")
    assert set(power["table"]) <= {"frontier", "regime"} and len(power)


def test_report_page_fits_the_page_and_holds_every_file_it_links(cli_report, tmp_path):
    """report/index.html, the page the Snakemake report shows: figures scale down to the page
    and a wide table scrolls in its own box (the CSS), and every file it shows or links lies
    in its folder at that relative path (the same bytes as under reports/), so that the folder,
    packed whole by `snakemake --report report.zip`, keeps every link. In a real browser where
    one is installed (headless Chromium): every figure loads and the page never scrolls
    sideways."""
    from race.analysis.report_pages import PAGE_DIR, PAGE_INDEX, local_links

    out = cli_report / "reports"
    folder = out / PAGE_DIR
    page = (folder / PAGE_INDEX).read_text()
    assert "img{max-width:100%;height:auto}" in page
    assert "table{border-collapse:collapse;display:block;max-width:100%;overflow-x:auto}" in page
    images = re.findall(r'<img src="([^"]+)"', page)
    links = local_links(page)
    assert images and set(images) <= set(links)
    for name in figures.FIGURE_NAMES:  # each figure's PNG and SVG, shown or linked
        assert {f"figures/{name}.png", f"figures/{name}.svg"} <= set(links), name
    for link in links:
        assert (folder / link).read_bytes() == (out / link).read_bytes(), link
    assert {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()} == {
        PAGE_INDEX, *links}
    seen = browser_layout(folder, tmp_path)
    if seen is None:
        pytest.skip("no headless Chromium to render the page")
    assert seen["images"] == len(images) and seen["broken"] == [], seen
    assert seen["page_width"] <= seen["window_width"], seen  # no sideways scroll
    assert seen["overflowing"] == [], seen  # no image or table past the window's edge
    assert seen["tables_scrolling"] >= 1, seen  # the wide ones scroll in their own box


#: Rendered by browser_layout: what the page looks like once loaded, as JSON on <body>.
LAYOUT_PROBE = """<script>addEventListener("load", () => {
  const root = document.documentElement, width = root.clientWidth;
  const boxes = [...document.querySelectorAll("img, table")];
  document.body.dataset.layout = JSON.stringify({
    window_width: width, page_width: root.scrollWidth, images: document.images.length,
    broken: [...document.images].filter(i => !i.naturalWidth).map(i => i.getAttribute("src")),
    overflowing: boxes.filter(b => b.getBoundingClientRect().right > width + 0.5)
      .map(b => b.tagName + " " + (b.getAttribute("src") || "")),
    tables_scrolling: [...document.querySelectorAll("table")]
      .filter(t => t.scrollWidth > t.clientWidth).length});
});</script>"""


def browser_layout(folder: Path, tmp_path: Path, width: int = 1000) -> dict | None:
    """The page ``folder/index.html`` as headless Chromium lays it out in a ``width``-pixel
    window (LAYOUT_PROBE, run on a copy beside the page's files); None without Chromium."""
    import html
    import shutil
    import subprocess

    browser = next(filter(None, map(shutil.which, ("chromium", "chromium-browser",
                                                   "google-chrome", "google-chrome-stable"))),
                   None)
    if browser is None:
        return None
    copy = shutil.copytree(folder, tmp_path / "page")
    probe = copy / "probe.html"
    probe.write_text((copy / "index.html").read_text().replace("</body>",
                                                               LAYOUT_PROBE + "</body>"))
    proc = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                           f"--user-data-dir={tmp_path / 'profile'}",
                           f"--window-size={width},800", "--virtual-time-budget=10000",
                           "--dump-dom", probe.as_uri()],
                          capture_output=True, text=True, timeout=120)
    found = re.search(r'data-layout="([^"]*)"', proc.stdout)
    assert found, proc.stderr[-2000:]
    return json.loads(html.unescape(found.group(1)))


def test_single_column_files_have_their_size_on_disk(cli_report, report):
    """A PNG is the figure's size at PANEL_DPI: 3.4 in -> 680 pixels wide at 200 dpi."""
    from PIL import Image

    data = report.figure_data()
    for name, key in [("fits", ("rule", "in_pass1")), ("same_flop", ("prm",)),
                      ("regime_map", ("prm", "ood_pass1"))]:
        w_in, h_in = paper_figures.plot_panel(name, data, *key).get_size_inches()
        path = cli_report / "reports" / "figures" / (paper_figures.stem(name, key) + ".png")
        with Image.open(path) as img:
            (w_px, h_px), dpi = img.size, img.info["dpi"]
        assert dpi[0] == pytest.approx(paper_figures.PANEL_DPI, abs=0.01)
        assert w_px == round(w_in * paper_figures.PANEL_DPI) == 680
        assert abs(h_px - h_in * paper_figures.PANEL_DPI) <= 1
        assert 3.3 <= w_px / dpi[0] <= 3.5


def test_single_column_folders_are_rewritten(study, tmp_path):
    """A rewrite leaves no stale panel, and a figure that is not run has an empty folder."""
    rep = analyse(study[study["stage"] == "pilot"], study="pilot only")
    stale = tmp_path / "race_agreement" / "gone" / "in_pass1.png"
    stale.parent.mkdir(parents=True)
    stale.write_bytes(b"old")
    keep = tmp_path / "notes.txt"
    keep.write_text("mine")
    written = paper_figures.write_panels(rep.figure_data(), tmp_path)
    assert written["race_agreement"] == [] and not stale.exists()
    assert (tmp_path / "race_agreement").is_dir()
    assert not any((tmp_path / "race_agreement").iterdir())
    assert keep.read_text() == "mine"
    assert {p.name for p in written["same_flop"]} == {"rule.png", "rule.svg", "prm.png",
                                                      "prm.svg"}


def test_write_reports_is_deterministic(cli_report, report, tmp_path):
    """The same table, analysed in memory, writes byte-identical files (no time, fixed order)."""
    from dataclasses import replace

    from race.analysis.prm_quality import feedback_table, read_records
    from race.analysis.report import write_tables

    out = cli_report / "reports"
    records = read_records(sorted(cli_report.glob("prm_*.json")))
    rep = replace(report, feedback=feedback_table(records, CLI_CONFIG))
    for path in write_tables(rep, tmp_path):
        assert path.read_bytes() == (out / path.name).read_bytes(), path.name
    again = figures.save(figures.plot_regime_map(rep.figure_data()), tmp_path, "regime_map")
    assert again[1].read_bytes() == (out / "figures" / "regime_map.svg").read_bytes()


def test_report_on_two_processes_writes_the_same_files(gappy, cli_report, tmp_path):
    """``race report --threads 2`` (fits, bands and figures on two processes) writes every
    file byte for byte as the one-process report does."""
    from race.analysis.parallel import pmap
    from race.cli import main

    assert pmap(abs, [-3, 2, -1], workers=2) == [3, 2, 1]  # input order
    gappy.to_csv(tmp_path / "runs.csv", index=False)
    assert main(["report", str(tmp_path / "runs.csv"), "--out", str(tmp_path / "reports"),
                 *cli_report_args(cli_report), "--threads", "2"]) == 0
    one, two = cli_report / "reports", tmp_path / "reports"
    files = sorted(p.relative_to(one) for p in one.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(two) for p in two.rglob("*") if p.is_file())
    for rel in files:
        assert (one / rel).read_bytes() == (two / rel).read_bytes(), rel


def test_cli_select(study, tmp_path):
    from race.cli import main

    study.to_csv(tmp_path / "runs.csv", index=False)
    out = tmp_path / "selected.json"
    assert main(["select", str(tmp_path / "runs.csv"), "--top-k", "1", "--baseline", "base",
                 "--targets", T, "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    pilot = study[study["stage"] == "pilot"]
    assert doc["selected"] == select(pilot, 1, "base", [T])
    assert {"size": "nano", "reward": "rule", "alloc": "base"} in doc["selected"]
    ranks = doc["rankings"]["rule"][T]
    assert [r["rank"] for r in ranks] == list(range(1, 7))
    assert {"size": ranks[0]["size"], "reward": "rule", "alloc": ranks[0]["alloc"]} \
        in doc["selected"]
    with pytest.raises(SystemExit):
        main(["select", str(tmp_path / "runs.csv"), "--top-k", "1", "--baseline", "nope",
              "--out", str(out)])


def test_seed_spread_caveat_measures_training_noise():
    """Configs run on two seeds give the spread a one-seed gap must beat; none: not measured."""
    from race.analysis.report_markdown import seed_spread, seed_spread_text

    def acc(size, reward, alloc, seed, budget, target):
        return 0.5 + (0.02 if alloc == "base" else 0.05) * seed  # 2 and 5 points apart

    two = make_runs(sizes=("nano",), rewards=("rule",), allocs=("base", "search"),
                    targets=(T,), budgets=(1e11,), seeds=(0, 1), acc=acc)
    assert seed_spread(two, T) == pytest.approx((5.0, 3.5, 2))
    text = seed_spread_text(two, [T])
    assert "up to 5.0 points (median 3.5, 2 configs × rungs)" in text
    one = make_runs(sizes=("nano",), rewards=("rule",), allocs=("base",), targets=(T,),
                    budgets=(1e11,), acc=acc)
    assert seed_spread(one, T)[2] == 0
    assert "not measured" in seed_spread_text(one, [T])
