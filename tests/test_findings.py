"""The findings' sentence builders, the power formula, the seed check and the frontier in
seconds, each on a small table with a hand-checked answer (tests/synthetic_runs.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from synthetic_runs import make_runs, wilson  # noqa: E402

from race.analysis.findings import (  # noqa: E402
    allocation_sentence,
    frontier_sentence,
    headline_target,
    race_sentence,
    reward_sentence,
    rl_sentence,
    seeds_sentence,
    time_sentence,
    undecided_sentence,
)
from race.analysis.findings_tables import power_md, split_md, winners_md  # noqa: E402
from race.analysis.frontier import (  # noqa: E402
    Z95,
    config_summary,
    frontier_table,
    missing_cells,
    normalise_runs,
    regime_table,
)
from race.analysis.power import (  # noqa: E402
    power_table,
    prompt_variance,
    prompts_for_gap,
    prompts_needed,
    seed_variance,
    seeds_needed,
)
from race.analysis.protocol import AGREEMENT_COLUMNS, PilotCost  # noqa: E402
from race.analysis.report_markdown import asked  # noqa: E402
from race.analysis.seeds import every_seed  # noqa: E402
from race.analysis.splits import (  # noqa: E402
    allocation_split,
    reward_shares,
    steps_table,
)
from race.analysis.time_frontier import time_frontier  # noqa: E402

T = "in_pass1"


def runs(values: dict[tuple, float], *, rewards=("rule",), seeds=(0,),
         targets=(T,)) -> pd.DataFrame:
    """Rows whose accuracy is ``values[(size, alloc, budget[, seed])]`` (tests/test_reports)."""
    sizes = sorted({k[0] for k in values}, key=["nano", "micro", "mini"].index)
    allocs = sorted({k[1] for k in values})
    budgets = sorted({k[2] for k in values})

    def acc(size, _reward, alloc, seed, budget, _target):
        return values.get((size, alloc, budget, seed), values.get((size, alloc, budget)))

    configs = sorted({(k[0], r, k[1]) for k in values for r in rewards})
    return normalise_runs(make_runs(sizes=sizes, rewards=rewards, allocs=allocs,
                                    targets=targets, budgets=budgets, seeds=seeds,
                                    configs=configs, acc=acc))


# ----------------------------------------------------------------------------------------------
# The power formula


def test_paired_prompts_and_seeds_by_hand():
    # 0.425 vs 0.375, each prompt's variance p(1 - p): 4 * 0.47875 / 0.05^2 = 766.
    assert prompts_needed(0.05, 0.425 * 0.575, 0.375 * 0.625) == 766
    assert prompts_for_gap(0.05, 0.4) == 766
    assert prompts_needed(-0.05, 0.425 * 0.575, 0.375 * 0.625) == 766  # the gap's sign
    # Equal variances, correlation 0.5: sigma_d^2 = 2v - v = v, half as many.
    assert prompts_needed(0.1, 0.25, 0.25, rho=0.5) == 100
    # Seeds: 4 * (4e-4 + 4e-4) / 0.02^2 = 8 per config.
    assert seeds_needed(0.02, 4e-4, 4e-4) == 8
    # A tie or an unmeasured variance: no count decides.
    assert math.isnan(prompts_needed(0.0, 0.2, 0.2))
    assert math.isnan(seeds_needed(0.02, math.nan, math.nan))
    with pytest.raises(ValueError, match="power"):
        prompts_needed(0.05, 0.2, 0.2, power=1.0)


def test_prompt_variance_from_the_interval_and_pooled_seed_variance():
    two = runs({("nano", "base", 1e11, 0): 0.50, ("nano", "base", 1e11, 1): 0.52,
                ("nano", "search", 1e11, 0): 0.60, ("nano", "search", 1e11, 1): 0.65},
               seeds=(0, 1))
    # One degree of freedom per config: (0.0002 + 0.00125) / 2.
    assert seed_variance(two, T) == (pytest.approx(0.000725), 2)
    # A Wilson interval's n * se^2 is p(1 - p) to within its continuity terms.
    var = prompt_variance(two, T, ["reward", "budget", "size", "alloc"])
    lo, hi = wilson(200, 400)
    assert var["prompt_var"].iloc[0] == pytest.approx(
        (400 * ((hi - lo) / (2 * Z95)) ** 2 + 400 * ((lambda b: (b[1] - b[0]) / (2 * Z95))(
            wilson(208, 400))) ** 2) / 2)
    assert var["prompt_var"].iloc[0] == pytest.approx(0.25, rel=0.02)
    assert var["n_prompts"].tolist() == [400, 400]
    assert seed_variance(runs({("nano", "base", 1e11): 0.5}), T) == (pytest.approx(math.nan,
                                                                                 nan_ok=True), 0)


def test_power_table_lists_undecided_rows_with_their_counts():
    df = runs({("nano", "base", 4e11): 0.40, ("nano", "search", 4e11): 0.45})
    summary = config_summary(df, [T])
    f, g = frontier_table(df, [T], summary), regime_table(df, [T], summary)
    assert not f["decided"].iloc[0]
    p = power_table(df, summary, f, g, [T])
    assert p["table"].tolist() == ["frontier", "regime"]
    var = {a: 400 * ((hi - lo) / (2 * Z95)) ** 2
           for a, (lo, hi) in (("base", wilson(160, 400)), ("search", wilson(180, 400)))}
    n = math.ceil(4 * (var["base"] + var["search"]) / 0.05 ** 2)
    assert p["prompts_needed"].tolist() == [n, n] and p["n_prompts"].tolist() == [400, 400]
    assert p["binding"].tolist() == ["nano/base", "base"]
    assert p["seeds_needed"].isna().all()  # one seed: the training noise is not measured
    md = power_md(p)
    assert "| rule | eval-in greedy pass@1 | nano/search | nano/base | 5.0 | " in md
    assert f"| 400 | {n:,} | 1 | – | – |" in md


# ----------------------------------------------------------------------------------------------
# Seeds and seconds


def test_a_finding_holds_on_every_seed_only_if_it_leads_on_each():
    holds = {("nano", "base", 1e11, 0): 0.40, ("nano", "base", 1e11, 1): 0.42,
             ("nano", "search", 1e11, 0): 0.50, ("nano", "search", 1e11, 1): 0.48}
    fails = {**holds, ("nano", "search", 1e11, 1): 0.41, ("nano", "base", 1e11, 1): 0.44,
             ("nano", "search", 1e11, 0): 0.56}
    for values, expected in ((holds, True), (fails, False)):
        df = runs(values, seeds=(0, 1))
        s = config_summary(df, [T])
        checks = every_seed(df, frontier_table(df, [T], s), regime_table(df, [T], s), [T])
        assert checks[["table", "leader", "seeds"]].values.tolist() == [
            ["frontier", "nano/search", "0,1"], ["regime", "search", "0,1"]]
        assert checks["holds_every_seed"].tolist() == [expected, expected]
    text = seeds_sentence(checks, T)
    assert text.startswith("Where the leader ran on several seeds, 0 of 1 frontier winners and "
                           "0 of 1 regime cells lead on every seed")
    assert "on 2 seeds a coin passes one time in 4" in text
    assert "rule nano/search at 1.00e11 (fails)" in text
    assert "not measured" in seeds_sentence(checks.iloc[0:0], T)


def test_the_time_winner_can_differ_from_the_flop_winner():
    """nano takes 1 s per 1e11 FLOPs, micro 4 s. The time budgets are the rungs' median seconds
    (2.5 s and 10 s): within 2.5 s only nano reached a rung; within 10 s nano is at 4e11
    (0.40) and micro at 1e11 (0.35), while at equal FLOPs micro wins both rungs."""
    df = runs({("nano", "base", 1e11): 0.30, ("nano", "base", 4e11): 0.40,
               ("micro", "base", 1e11): 0.35, ("micro", "base", 4e11): 0.60})
    per = {"nano": 1.0, "micro": 4.0}
    df["seconds_rollout"] = [per[s] * b / 1e11 for s, b in zip(df["size"], df["budget"],
                                                                 strict=True)]
    df["seconds_learning"], df["seconds_reward"], df["device"] = 0.0, 0.0, "cpu"
    summary = config_summary(df, [T])
    f = frontier_table(df, [T], summary)
    t = time_frontier(df, summary, f, [T])
    assert t["seconds"].tolist() == [2.5, 10.0]
    assert t["flop_best"].tolist() == ["micro/base", "micro/base"]
    assert t["time_best"].tolist() == ["nano/base", "nano/base"]
    assert t["time_best_budget"].tolist() == [1e11, 4e11]
    assert t["time_runner_up"].tolist() == ["", "micro/base"]
    assert t["differs"].all() and not t["decided"].any()
    text = time_sentence(t, T)
    assert text.startswith("On measured seconds (cpu), the winner at equal time differs from "
                           "the winner at equal FLOPs in 2 of 2 (reward, target, rung) "
                           "comparisons (0 of them decided in time)")
    z = float(t["gap_z"].iloc[1])
    assert (f"rule micro/base (FLOPs) vs nano/base (seconds, 0.400, z = {z:.2f}, undecided)"
            in text)
    empty = time_frontier(df.drop(columns=["seconds_rollout"]), summary, f, [T])
    assert empty.empty and "not drawn" in time_sentence(empty, T)


# ----------------------------------------------------------------------------------------------
# Sentences


KNOWN = {("nano", "base", 1e11): 0.30, ("nano", "base", 4e11): 0.40,
         ("nano", "search", 1e11): 0.35, ("nano", "search", 4e11): 0.45,
         ("micro", "base", 1e11): 0.20, ("micro", "base", 4e11): 0.60,
         ("micro", "search", 1e11): 0.25, ("micro", "search", 4e11): 0.50}


def test_frontier_sentence_names_the_winner_gap_z_and_verdict():
    df = runs(KNOWN)
    f = frontier_table(df, [T])
    r = f[f["budget"] == 4e11].iloc[0]
    lo, hi = wilson(240, 400)
    text = frontier_sentence(f, T)
    assert text == (
        "At the largest rung (4.00e11 model FLOPs), on eval-in greedy pass@1, the budget buys: "
        f"rule → micro/base at 0.600 [{lo:.3f}, {hi:.3f}], 10.0 points over micro/search "
        f"(z = {r['gap_z']:.2f}, decided). Leading size: micro for 1 of 1 reward systems "
        "(1 decided).")
    table = winners_md(f, T)
    assert f"| rule | nano/search? (z={f['gap_z'].iloc[0]:.1f}) | **micro/base** " in table
    tie = runs({("nano", "base", 4e11): 0.40, ("nano", "search", 4e11): 0.40})
    assert "rule → nano/base and nano/search tie at 0.400 (undecided)" in frontier_sentence(
        frontier_table(tie, [T]), T)


def test_rl_sentence_gain_over_the_base_policy():
    summary = pd.DataFrame({
        "target": T, "budget": [0.0, 0.0, 4e11, 4e11], "size": "nano", "reward": "rule",
        "alloc": ["base", "search", "base", "search"], "acc": [0.2, 0.2, 0.5, 0.3],
        "se": [0.02, 0.02, 0.03, 0.03]})
    # gain 0.3, se = hypot(0.03, 0.02) = 0.03606, z = 8.32, 0.3 +/- 1.96 se = [0.229, 0.371]
    assert rl_sentence(summary, T, ["nano"]) == (
        "RL to the largest rung bought, on eval-in greedy pass@1, over each base policy: nano "
        "0.200 → 0.500 (rule/base, +30.0 points, 95% interval [+22.9, +37.1], z = 8.32, "
        "decided; its 2 configs +10.0 to +30.0) (the best config is picked after the fact: its "
        "gain is optimistic).")
    assert "not measured" in rl_sentence(summary[summary["budget"] > 0], T, ["nano"])


def test_reward_sentence_shares_and_what_they_bought():
    summary = pd.DataFrame({
        "target": T, "budget": 4e11, "size": ["nano", "micro"] * 2, "alloc": "base",
        "reward": ["rule", "rule", "prm", "prm"], "acc": [0.55, 0.47, 0.50, 0.40],
        "se": 0.02})
    shares = pd.DataFrame({"reward": ["rule", "prm"], "share": [0.0, 0.3]})
    # mean of -0.05 and -0.07 = -0.06; se = sqrt(4 * 0.02^2) / 2 = 0.02; z = -3
    assert reward_sentence(summary, shares, T) == (
        "Reward FLOPs / total: rule 0.0%, prm 30.0% (summed over each reward system's runs to "
        "their largest rung); against rule, the cheapest, they moved eval-in greedy pass@1 at "
        "the largest rung by: prm -6.0 points (95% interval [-9.9, -2.1], z = -3.00, decided) "
        "(mean over the up to 2 size × allocation configs both ran).")
    one = reward_sentence(summary, shares.iloc[:1], T)
    assert one.endswith("no second reward system to compare with.")


def test_splits_shares_and_steps_from_the_ledgers():
    df = normalise_runs(make_runs(sizes=("nano",), rewards=("rule", "prm"),
                                  budgets=(1e11, 4e11)))
    shares = reward_shares(df)
    assert shares["reward"].tolist() == ["rule", "prm"]
    assert shares["share"].tolist() == pytest.approx([0.0, 0.05])
    prm = df[df["reward"] == "prm"]
    split = allocation_split(prm)
    assert split["alloc"].tolist() == ["base", "search", "updates"]
    assert split[["share_rollout", "share_learning", "share_reward"]].values.ravel().tolist() \
        == pytest.approx([0.55, 0.40, 0.05, 0.75, 0.20, 0.05, 0.35, 0.60, 0.05])
    steps = steps_table(prm)
    # One step costs 1e9 FLOPs x sqrt(updates per batch): 400 steps of base, 200 of updates.
    assert steps[steps["budget"] == 4e11]["steps"].tolist() == [400, 400, 200]
    md = split_md(split, steps, ["nano"])
    assert ("| allocation | completions/prompt | prompts/step | updates/batch | rollout | "
            "learning | reward | steps to 1.00e11 (nano) | steps to 4.00e11 (nano) |") in md
    assert "| updates | 8 | 4 | 4 | 35.0% | 60.0% | 5.0% | 50 | 200 |" in md
    assert allocation_sentence(split, steps) == (
        "At the largest rung (4.00e11 FLOPs) the allocations split the budget rollout 35.0% "
        "(updates) to 75.0% (search), learning 20.0% (search) to 60.0% (updates), reward 5.0% "
        "in every allocation (mean over sizes and reward systems), and reach it in 200 "
        "(updates, nano) to 400 (base, nano) optimizer steps (table below).")


def test_race_sentence_pick_regret_and_cost():
    rows = [{"reward": "rule", "target": T, "n_common": 3, "top1_agree": True,
             "regret_points": 0.0, "full_best": "nano/base", "regret_full_points": 0.0},
            {"reward": "prm", "target": T, "n_common": 3, "top1_agree": False,
             "regret_points": 4.5, "full_best": "micro/base", "regret_full_points": 2.0},
            {"reward": "prm", "target": "maj_k", "n_common": 0, "top1_agree": None,
             "regret_points": math.nan, "full_best": None, "regret_full_points": math.nan}]
    table = pd.DataFrame(rows).reindex(columns=AGREEMENT_COLUMNS)
    cost = PilotCost(pilot_flops=1e12, validation_flops=3e12, full_grid_flops=2e13,
                     full_grid_estimated=False, pilot_share=0.05, race_share=0.2, n_configs=6,
                     n_validation_seeds=2, validation_budget=4e11)
    assert race_sentence(table, cost, T) == (
        "The RACE pilot picked the validated best on eval-in greedy pass@1 for 1 of 2 reward "
        "systems (regret up to 4.5 points, prm; over every target it ranks 1 of 2); RACE's "
        "final choice was the full grid's best for 1 of 2 (regret vs the full grid up to 2.0 "
        "points, prm), at 5.0% (pilot) and 20.0% (pilot + validation) of the full grid's model "
        "FLOPs.")
    assert race_sentence(None, None, T).startswith("RACE was not validated")


def test_undecided_sentence_counts_and_needs():
    df = runs({("nano", "base", 4e11): 0.40, ("nano", "search", 4e11): 0.45,
               ("micro", "base", 4e11): 0.20, ("micro", "search", 4e11): 0.60})
    s = config_summary(df, [T])
    f, g = frontier_table(df, [T], s), regime_table(df, [T], s)
    p = power_table(df, s, f, g, [T])
    text = undecided_sentence(f, g, p, T)
    # micro/search leads the frontier by 15 points (decided), nano's regime cell is not.
    assert text == ("Undecided (z < 2): 0 of 1 comparable frontier winners (0 of 1 at the "
                    "largest rung) and 1 of 2 comparable regime cells.")
    close = runs({("nano", "base", 4e11): 0.40, ("nano", "search", 4e11): 0.45})
    s = config_summary(close, [T])
    f, g = frontier_table(close, [T], s), regime_table(close, [T], s)
    p = power_table(close, s, f, g, [T])
    n = int(p["prompts_needed"].iloc[0])
    assert undecided_sentence(f, g, p, T) == (
        "Undecided (z < 2): 1 of 1 comparable frontier winners (1 of 1 at the largest rung) "
        "and 1 of 1 comparable regime cells; at the largest rung on eval-in greedy pass@1, "
        f"putting the observed gaps at z = 2 takes {n:,} to {n:,} paired evaluation prompts "
        f"per config (median {n:,}; the evaluation used 400), the seeds unmeasured (no config "
        "ran on two), each with the other noise gone (\"How far from an answer\").")


def test_headline_target_is_the_first_race_target_reported():
    assert headline_target(["in_pass1", "sampled_pass1"], ["sampled_pass1"]) == "sampled_pass1"
    assert headline_target(["in_pass1", "ood_pass1"], ["sampled_pass1"]) == "in_pass1"
    assert headline_target(["ood_pass1"], None) == "ood_pass1"


# ----------------------------------------------------------------------------------------------
# No "no value" rows for what does not run by design; missing lists what should exist


def test_native_reward_at_the_base_rung_is_missing_only_if_no_reward_has_it():
    df = runs({("nano", "base", 0.0): 0.1, ("nano", "base", 1e11): 0.3},
              rewards=("rule", "prm"), targets=(T, "native_reward"))
    base_prm = (df["budget"] == 0) & (df["reward"] == "prm")
    one = df.assign(acc_native_reward=df["acc_native_reward"].mask(base_prm))
    assert missing_cells(one).empty  # blank by design: the base evaluation measured rule's
    none = df.assign(acc_native_reward=df["acc_native_reward"].mask(df["budget"] == 0))
    assert missing_cells(none)[["reward", "budget", "target"]].values.tolist() == [
        ["prm", 0.0, "native_reward"], ["rule", 0.0, "native_reward"]]


def test_asked_drops_rows_that_do_not_run_by_design():
    frontier = pd.DataFrame({"reward": "rule", "target": ["maj_k"] * 3 + [T],
                             "budget": [0.0, 1e11, 4e11, 1e11], "n_candidates": [2, 0, 2, 0]})
    missing = pd.DataFrame({"stage": "full", "size": "nano", "reward": "rule", "alloc": "base",
                            "seed": 0, "budget": [1e11], "target": [T], "reason": "NaN acc"})
    kept = asked(frontier, missing)
    assert kept[["target", "budget"]].values.tolist() == [
        ["maj_k", 0.0], ["maj_k", 4e11], [T, 1e11]]
    # A whole missing row ("all" targets) at 1e11 is a question for every target there.
    regime = frontier.assign(size="nano")
    assert len(asked(regime, missing.assign(target="all"))) == 4
    assert len(asked(regime, missing.assign(target="all", size="micro"))) == 2
