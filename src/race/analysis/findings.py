"""The study's answer in sentences: what ``summary.md`` and the top of ``report.md`` say.

Each builder takes the report's tables (small DataFrames, no I/O) and returns one sentence with
its numbers, its interval or z, and "decided" or "undecided" in plain words; nothing is typed by
hand. Conventions:

- Accuracies are fractions printed to 3 decimals; gaps and gains are accuracy points (100 x a
  fraction) to 1 decimal; FLOPs are model FLOPs; shares are percentages of model FLOPs.
- The *headline target* is the first of the study's RACE targets (``race.targets``) that the
  report has, else its first target: the accuracy the study was designed to decide. Sentences
  about one target use it; counts run over every target.
- "Decided" is the report's rule everywhere: ``z >= DECIDED_Z``. A gain or difference whose
  z is below it (in absolute value) is "undecided", and so is a tie or a lone candidate.
- A gain over the base policy: the config's accuracy at the largest rung minus its size's base
  policy's, ``se = sqrt(se_top^2 + se_base^2)`` (the frontier's unpaired convention). The best
  config's gain is picked after the fact from every (reward, allocation), so it is optimistic;
  the sentence gives the range over every config beside it.
- What a reward system bought: the mean over the (size, allocation) configs both ran of its
  accuracy minus the cheapest reward system's (lowest reward share), at the largest rung, with
  ``se = sqrt(sum(se_R^2 + se_cheap^2)) / m`` over the m configs (independent runs).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from race.analysis.frontier import DECIDED_Z, Z95, is_decided
from race.analysis.markdown import acc, decided_counts, flops, interval, num, pct, pts, target
from race.analysis.power import needed_range
from race.analysis.protocol import PilotCost


def headline_target(targets: list[str], race_targets: list[str] | None = None) -> str:
    """The target the sentences speak of (module docstring)."""
    chosen = [t for t in (race_targets or []) if t in targets]
    return (chosen or targets)[0]


def verdict(decided: bool) -> str:
    return "decided" if decided else "undecided"


def signed(points: float) -> str:
    """Accuracy points with their sign (``+2.3``, ``-0.4``)."""
    return "–" if points is None or not math.isfinite(points) else f"{points:+.1f}"


def count(x: float) -> str:
    """A required count, with thousands separators ("–" when none decides)."""
    return "–" if x is None or not math.isfinite(x) else f"{x:,.0f}"


def top_rung(table: pd.DataFrame) -> float:
    """The largest trained rung of a table with a ``budget`` column (NaN when none)."""
    b = table.loc[table["budget"] > 0, "budget"]
    return float(b.max()) if len(b) else math.nan


def _z(x: object) -> str:
    return num(x, ".2f")


# ----------------------------------------------------------------------------------------------
# 1. Frontier winners


def winner_clause(r: object) -> str:
    """One frontier row: ``reward → size/alloc at acc [lo, hi], gap over the runner-up (z,
    verdict)``."""
    if not r.best:
        return f"{r.reward}: no value"
    if r.tie:
        return (f"{r.reward} → {' and '.join(str(r.best).split('|'))} tie at {acc(r.acc)} "
                "(undecided)")
    head = f"{r.reward} → {r.best} at {acc(r.acc)} {interval(r.acc_lo, r.acc_hi)}"
    if not r.runner_up:
        return f"{head}, alone (undecided)"
    return (f"{head}, {pts(100 * r.gap)} points over {r.runner_up} (z = {_z(r.gap_z)}, "
            f"{verdict(bool(r.decided))})")


def frontier_sentence(frontier: pd.DataFrame, target_key: str) -> str:
    """Who the largest rung's budget buys per reward system, on one target."""
    b = top_rung(frontier)
    rows = frontier[(frontier["target"] == target_key) & (frontier["budget"] == b)]
    if rows.empty:
        return f"No trained rung has a value for {target(target_key)}."
    clauses = [winner_clause(r) for r in rows.itertuples(index=False)]
    single = rows[(rows["best"] != "") & ~rows["tie"].astype(bool)]
    sizes = single["best_size"].value_counts()
    leads = ", ".join(f"{s} for {n}" for s, n in sorted(sizes.items(), key=lambda x: (-x[1],
                                                                                     x[0])))
    lead = (f" Leading size: {leads} of {len(rows)} reward systems "
            f"({int(rows['decided'].astype(bool).sum())} decided).") if leads else ""
    return (f"At the largest rung ({flops(b)} model FLOPs), on {target(target_key)}, the "
            f"budget buys: {'; '.join(clauses)}.{lead}")


# ----------------------------------------------------------------------------------------------
# 2. What RL bought


def rl_gains(summary: pd.DataFrame, target_key: str, sizes: list[str]) -> pd.DataFrame:
    """Per size: the base policy's accuracy, the best config at the largest rung (reward/alloc),
    its gain (fraction) with se, 95% interval, z and verdict, and the range of every config's
    gain. Sizes without a base value or a top-rung value are left out."""
    s = summary[(summary["target"] == target_key) & summary["acc"].notna()]
    b = top_rung(s)
    rows = []
    for size in sizes:
        base = s[(s["size"] == size) & (s["budget"] == 0)]
        top = s[(s["size"] == size) & (s["budget"] == b)].sort_values(
            ["acc", "reward", "alloc"], ascending=[False, True, True], kind="mergesort")
        if base.empty or top.empty:
            continue
        b_acc, b_se = float(base["acc"].iloc[0]), float(base["se"].iloc[0])
        best = top.iloc[0]
        gain = float(best["acc"]) - b_acc
        se = math.hypot(float(best["se"]), b_se)
        z = gain / se if se > 0 else math.nan
        rows.append({"size": size, "base_acc": b_acc, "best": f"{best['reward']}/{best['alloc']}",
                     "best_acc": float(best["acc"]), "gain": gain, "se": se,
                     "lo": gain - Z95 * se, "hi": gain + Z95 * se, "z": z,
                     "decided": is_decided(abs(z)) if math.isfinite(z) else False,
                     "n_configs": int(len(top)), "min_gain": float(top["acc"].min()) - b_acc,
                     "max_gain": float(top["acc"].max()) - b_acc, "budget": b})
    return pd.DataFrame(rows)


def rl_sentence(summary: pd.DataFrame, target_key: str, sizes: list[str]) -> str:
    """What RL to the largest rung bought over each size's base policy, on one target."""
    g = rl_gains(summary, target_key, sizes)
    if g.empty:
        return (f"No base policy has a value for {target(target_key)}: what RL bought over it is "
                "not measured.")
    clauses = [
        f"{r.size} {acc(r.base_acc)} → {acc(r.best_acc)} ({r.best}, {signed(100 * r.gain)} "
        f"points, 95% interval [{signed(100 * r.lo)}, {signed(100 * r.hi)}], z = {_z(r.z)}, "
        f"{verdict(r.decided)}; its {r.n_configs} configs {signed(100 * r.min_gain)} to "
        f"{signed(100 * r.max_gain)})" for r in g.itertuples(index=False)]
    return (f"RL to the largest rung bought, on {target(target_key)}, over each base policy: "
            f"{'; '.join(clauses)} (the best config is picked after the fact: its gain is "
            "optimistic).")


# ----------------------------------------------------------------------------------------------
# 3. Reward systems


def reward_effects(summary: pd.DataFrame, shares: pd.DataFrame, target_key: str) -> pd.DataFrame:
    """Per reward system but the cheapest: its mean accuracy difference to the cheapest (lowest
    share) over the (size, alloc) configs both ran at the largest rung, with se, z, verdict."""
    if len(shares) < 2:
        return pd.DataFrame()
    s = summary[(summary["target"] == target_key) & summary["acc"].notna()]
    s = s[s["budget"] == top_rung(s)]
    cheap = str(shares["reward"].iloc[0])
    ref = s[s["reward"] == cheap][["size", "alloc", "acc", "se"]]
    rows = []
    for r in shares.iloc[1:].itertuples(index=False):
        both = s[s["reward"] == r.reward][["size", "alloc", "acc", "se"]].merge(
            ref, on=["size", "alloc"], suffixes=("", "_ref"))
        m = len(both)
        if not m:
            continue
        diff = float((both["acc"] - both["acc_ref"]).mean())
        se = float(np.sqrt((both["se"] ** 2 + both["se_ref"] ** 2).sum())) / m
        z = diff / se if se > 0 else math.nan
        rows.append({"reward": r.reward, "share": r.share, "reference": cheap, "diff": diff,
                     "se": se, "z": z, "n_configs": m,
                     "decided": is_decided(abs(z)) if math.isfinite(z) else False})
    return pd.DataFrame(rows)


def reward_sentence(summary: pd.DataFrame, shares: pd.DataFrame, target_key: str) -> str:
    """The reward systems' compute shares and what each bought over the cheapest."""
    if shares.empty:
        return "No trained run: the reward systems' compute shares are not measured."
    spent = ", ".join(f"{r.reward} {pct(r.share)}" for r in shares.itertuples(index=False))
    head = (f"Reward FLOPs / total: {spent} (summed over each reward system's runs to their "
            "largest rung)")
    e = reward_effects(summary, shares, target_key)
    if e.empty:
        return f"{head}; no second reward system to compare with."
    cheap, n = e["reference"].iloc[0], int(e["n_configs"].max())
    bought = "; ".join(
        f"{r.reward} {signed(100 * r.diff)} points (95% interval "
        f"[{signed(100 * (r.diff - Z95 * r.se))}, {signed(100 * (r.diff + Z95 * r.se))}], "
        f"z = {_z(r.z)}, {verdict(r.decided)})" for r in e.itertuples(index=False))
    return (f"{head}; against {cheap}, the cheapest, they moved {target(target_key)} at the "
            f"largest rung by: {bought} (mean over the up to {n} size × allocation configs both "
            "ran).")


# ----------------------------------------------------------------------------------------------
# 4. Allocations


def _extreme(split: pd.DataFrame, col: str, largest: bool) -> str:
    """``x% (a, b)``: the extreme share and every allocation at it (to the printed digit)."""
    shown = split[col].map(pct)
    value = split[col].max() if largest else split[col].min()
    names = split.loc[shown == pct(value), "alloc"]
    return f"{pct(value)} ({', '.join(names)})"


def allocation_sentence(split: pd.DataFrame, steps: pd.DataFrame) -> str:
    """Each allocation's rollout / learning / reward split and the steps it takes (the table
    under the sentences has every number)."""
    if split.empty:
        return "No trained run: the allocations' splits are not measured."
    b = float(split["budget"].iloc[0])
    phases = [c.removeprefix("share_") for c in split.columns if c.startswith("share_")]
    parts = []
    for p in phases:
        col = f"share_{p}"
        same = pct(split[col].min()) == pct(split[col].max())
        parts.append(f"{p} {pct(split[col].min())} in every allocation" if same else
                     f"{p} {_extreme(split, col, False)} to {_extreme(split, col, True)}")
    at = steps[steps["budget"] == b]
    lo, hi = at.loc[at["steps"].idxmin()], at.loc[at["steps"].idxmax()]
    return (f"At the largest rung ({flops(b)} FLOPs) the allocations split the budget "
            f"{', '.join(parts)} (mean over sizes and reward systems), and reach it in "
            f"{num(lo['steps'], '.0f')} ({lo['alloc']}, {lo['size']}) to "
            f"{num(hi['steps'], '.0f')} ({hi['alloc']}, {hi['size']}) optimizer steps "
            "(table below).")


# ----------------------------------------------------------------------------------------------
# 5. The RACE pilot


def race_sentence(agreement: pd.DataFrame | None, cost: PilotCost | None,
                  target_key: str) -> str:
    """Whether the pilot picked the validated best, RACE's choice against the full grid, and
    the cost as shares of the full grid's FLOPs."""
    price = ""
    if cost is not None and math.isfinite(cost.pilot_share):
        price = (f", at {pct(cost.pilot_share)} (pilot) and {pct(cost.race_share)} (pilot + "
                 "validation) of the full grid's model FLOPs"
                 + (" (estimated: the full grid was not run)" if cost.full_grid_estimated
                    else ""))
    if agreement is None or agreement.empty:
        return ("RACE was not validated (no pilot or validation rows): whether the pilot picks "
                f"the best config is not measured{price}.")
    scored = agreement[agreement["n_common"] > 0]
    mine = scored[scored["target"] == target_key]
    agree = int(mine["top1_agree"].astype(bool).sum())
    worst = mine.loc[mine["regret_points"].idxmax()] if len(mine) else None
    regret = (f"regret up to {pts(worst['regret_points'])} points, {worst['reward']}"
              if worst is not None else "no regret scored")
    full = mine[mine["full_best"].notna()]
    final = ""
    if len(full):
        hit = int((full["regret_full_points"].abs() < 1e-9).sum())
        top = full.loc[full["regret_full_points"].idxmax()]
        final = (f"; RACE's final choice was the full grid's best for {hit} of {len(full)} "
                 f"(regret vs the full grid up to {pts(top['regret_full_points'])} points, "
                 f"{top['reward']})")
    return (f"The RACE pilot picked the validated best on {target(target_key)} for {agree} of "
            f"{len(mine)} reward systems ({regret}; over every target it ranks "
            f"{int(scored['top1_agree'].astype(bool).sum())} of {len(scored)}){final}{price}.")


# ----------------------------------------------------------------------------------------------
# 6. Seeds


def seeds_sentence(seed_checks: pd.DataFrame, target_key: str) -> str:
    """Which findings hold on every seed where the leader ran on several."""
    if seed_checks.empty:
        return ("No leader ran on two or more seeds: which findings hold on every seed is not "
                "measured.")
    k = min(len(s.split(",")) for s in seed_checks["seeds"])
    parts = []
    for name, label in (("frontier", "frontier winners"), ("regime", "regime cells")):
        t = seed_checks[seed_checks["table"] == name]
        parts.append(f"{int(t['holds_every_seed'].sum())} of {len(t)} {label}")
    mine = seed_checks[(seed_checks["table"] == "frontier")
                       & (seed_checks["target"] == target_key)]
    listed = "; ".join(f"{r.reward} {r.leader} at {flops(r.budget)} "
                       f"({'holds' if r.holds_every_seed else 'fails'})"
                       for r in mine.itertuples(index=False))
    on = f"; on {target(target_key)}: {listed}" if listed else ""
    return (f"Where the leader ran on several seeds, {' and '.join(parts)} lead on every seed "
            f"(a sign test, not significance: on {k} seeds a coin passes one time in "
            f"{2 ** k}){on}.")


# ----------------------------------------------------------------------------------------------
# 7. What stayed undecided, and how far from an answer


def undecided_sentence(frontier: pd.DataFrame, regime: pd.DataFrame, power: pd.DataFrame,
                       target_key: str) -> str:
    """How much is undecided, and the prompts and seeds the largest rung's gaps need."""
    f_dec, f_all = decided_counts(frontier)
    r_dec, r_all = decided_counts(regime)
    b = top_rung(frontier)
    at_top = frontier[frontier["budget"] == b]
    t_dec, t_all = decided_counts(at_top)
    head = (f"Undecided (z < {DECIDED_Z:g}): {f_all - f_dec} of {f_all} comparable frontier "
            f"winners ({t_all - t_dec} of {t_all} at the largest rung) and {r_all - r_dec} of "
            f"{r_all} comparable regime cells")
    rows = power[(power["table"] == "frontier") & (power["target"] == target_key)
                 & (power["budget"] == b)]
    if rows.empty:
        return head + "."
    n_lo, n_med, n_hi = needed_range(rows["prompts_needed"])
    k_lo, k_med, k_hi = needed_range(rows["seeds_needed"])
    now = count(float(rows["n_prompts"].median()))
    ties = int(rows["prompts_needed"].isna().sum())
    tie_note = f", {ties} tie(s) that no count decides" if ties else ""
    seeds = (f", or {count(k_lo)} to {count(k_hi)} seeds per config (median {count(k_med)}; "
             f"seed sd {pts(100 * float(rows['seed_sd'].iloc[0]))} points)"
             if math.isfinite(k_med) else ", the seeds unmeasured (no config ran on two)")
    return (f"{head}; at the largest rung on {target(target_key)}, putting the observed gaps "
            f"at z = {DECIDED_Z:g} takes {count(n_lo)} to {count(n_hi)} paired evaluation "
            f"prompts per config (median {count(n_med)}; the evaluation used {now}){seeds}, "
            f"each with the other noise gone{tie_note} (\"How far from an answer\").")


# ----------------------------------------------------------------------------------------------
# 8. Seconds beside FLOPs


def time_sentence(time_frontier: pd.DataFrame, target_key: str) -> str:
    """Where the iso-time winner and the FLOP winner differ."""
    if time_frontier.empty:
        return "No run recorded its seconds: the frontier on measured time is not drawn."
    device = time_frontier["device"].iloc[0] or "device not recorded"
    mixed = (" (timed on several devices: their seconds are not comparable)"
             if "," in device else "")
    d = time_frontier[time_frontier["differs"].astype(bool)]
    b = top_rung(time_frontier)
    mine = d[(d["target"] == target_key) & (d["budget"] == b)]
    listed = "; ".join(f"{r.reward} {r.flop_best} (FLOPs) vs {r.time_best} (seconds, "
                       f"{acc(r.time_best_acc)}, z = {_z(r.gap_z)}, {verdict(bool(r.decided))})"
                       for r in mine.itertuples(index=False))
    secs = time_frontier[(time_frontier["target"] == target_key)
                         & (time_frontier["budget"] == b)]["seconds"]
    where = (f"; on {target(target_key)} at the largest rung's time "
             f"({num(float(secs.min()), '.0f')} to {num(float(secs.max()), '.0f')} s by reward "
             f"system): {listed or 'the same winners'}") if len(secs) else ""
    return (f"On measured seconds ({device}{mixed}), the winner at equal time differs from the "
            f"winner at equal FLOPs in {len(d)} of {len(time_frontier)} (reward, target, rung) "
            f"comparisons ({int(d['decided'].astype(bool).sum())} of them decided in time)"
            f"{where}.")
