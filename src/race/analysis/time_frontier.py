"""Seconds beside FLOPs: the frontier at equal measured seconds (an iso-time frontier).

The FLOP frontier (:func:`race.analysis.frontier.frontier_table`) compares configs at the same
budget of model FLOPs. The same question in seconds: which config is best when each may train
for the same wall time on the device that ran it? Conventions:

- A config's seconds at a rung: the sum of its budget phases' measured seconds up to that rung
  (``seconds_<phase>`` of runs.csv: rollout, learning, reward; the run's own ledger, evaluation
  excluded), the mean over its seeds. The base policy (budget 0) takes 0 seconds.
- Time budgets: one per trained FLOP rung and reward system, ``T_b`` = the median over that
  reward's configs of their seconds at rung b, so each time budget sits beside the FLOP rung it
  is matched with.
- Within ``T``, a config delivers the snapshot of its largest rung reached in at most ``T``
  seconds that has a value for the target (it is evaluated only at rungs, so a run that would
  pass a rung just after ``T`` delivers the rung before). The winner, runner-up, gap, z and
  "decided" are then ranked exactly as the FLOP frontier's (:func:`rank_candidates`), with each
  config's accuracy and standard error at the rung it delivers.
- ``differs``: the time winner is not the FLOP winner at the matched rung (ties compared as
  sets). Seconds are the device's (``device`` names it, from the runs' ``perf.json``): a CPU
  run's seconds are one process's at its thread count, and timings from several devices are not
  comparable (``device`` then lists them all and the report says so).
"""

from __future__ import annotations

import math

import pandas as pd

from race.analysis.frontier import pooled, rank_candidates
from race.flops.ledger import BUDGET_PHASES

TIME_COLUMNS = [
    "reward", "target", "budget", "seconds", "time_best", "time_best_acc", "time_best_budget",
    "time_runner_up", "gap", "gap_z", "decided", "flop_best", "flop_decided", "differs",
    "n_candidates", "device",
]


def devices(runs: pd.DataFrame) -> list[str]:
    """The devices that timed the trained rows (``device`` of runs.csv), sorted."""
    if "device" not in runs.columns:
        return []
    trained = runs[runs["budget"] > 0]
    return sorted(str(d) for d in trained["device"].dropna().unique())


def config_seconds(runs: pd.DataFrame) -> pd.DataFrame:
    """Seconds per (reward, size, alloc, budget): the budget phases' seconds summed, mean over
    seeds; NaN where a trained row has no timing."""
    cols = [f"seconds_{p}" for p in BUDGET_PHASES]
    pool = pooled(runs)
    if not set(cols) <= set(pool.columns):
        return pd.DataFrame(columns=["reward", "size", "alloc", "budget", "seconds"])
    secs = pool[cols].astype(float).sum(axis=1, min_count=len(cols))
    secs = secs.where(pool["budget"] > 0, 0.0)  # a base policy trains for no time
    return (pool[["reward", "size", "alloc", "budget"]].assign(seconds=secs.to_numpy())
            .groupby(["reward", "size", "alloc", "budget"], sort=True)["seconds"]
            .mean().reset_index())


def time_frontier(runs: pd.DataFrame, summary: pd.DataFrame, frontier: pd.DataFrame,
                  targets: list[str]) -> pd.DataFrame:
    """The iso-time frontier beside the FLOP one (module docstring; columns
    :data:`TIME_COLUMNS`): per reward x target x trained rung, at that rung's time budget."""
    secs = config_seconds(runs)
    if secs.empty or secs["seconds"].isna().all():
        return pd.DataFrame(columns=TIME_COLUMNS)
    device = ", ".join(devices(runs))
    s = summary.merge(secs, on=["reward", "size", "alloc", "budget"], how="left")
    s = s[s["acc"].notna() & s["seconds"].notna()]
    rows = []
    for (reward, target), g in s.groupby(["reward", "target"], sort=True):
        if target not in targets:
            continue
        rungs = secs[(secs["reward"] == reward) & (secs["budget"] > 0)]
        for budget, at in rungs.groupby("budget", sort=True):
            limit = float(at["seconds"].median())
            if math.isnan(limit):
                continue  # no run timed this rung
            within = g[g["seconds"] <= limit].sort_values("budget", kind="mergesort")
            best = within.groupby(["size", "alloc"]).tail(1)  # each config's last rung in time
            r = rank_candidates(best)
            won = best[best["label"].isin(str(r["best"]).split("|"))]
            f = frontier[(frontier["reward"] == reward) & (frontier["target"] == target)
                         & (frontier["budget"] == budget) & (frontier["n_candidates"] > 0)]
            if f.empty:
                continue  # the target does not run at this rung: nothing to compare in time
            flop_best = str(f["best"].iloc[0])
            rows.append({
                "reward": reward, "target": target, "budget": budget, "seconds": limit,
                "time_best": r["best"], "time_best_acc": r["acc"],
                "time_best_budget": float(won["budget"].max()) if len(won) else float("nan"),
                "time_runner_up": r["runner_up"], "gap": r["gap"], "gap_z": r["gap_z"],
                "decided": bool(r["decided"]), "flop_best": flop_best,
                "flop_decided": bool(f["decided"].iloc[0]),
                "differs": bool(r["best"]) and (
                    set(str(r["best"]).split("|")) != set(flop_best.split("|"))),
                "n_candidates": r["n_candidates"], "device": device,
            })
    out = pd.DataFrame(rows, columns=TIME_COLUMNS)
    order = {t: i for i, t in enumerate(targets)}
    return (out.assign(_t=out["target"].map(order))
            .sort_values(["reward", "_t", "budget"], kind="mergesort")
            .drop(columns="_t").reset_index(drop=True))
