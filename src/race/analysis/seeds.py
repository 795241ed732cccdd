"""Which findings hold on every seed: a leader that wins on each training seed it ran.

A frontier winner or regime cell is one comparison at one (reward, target, rung): the leader
(highest mean over seeds) against the other candidates. Where the leader ran on two or more
seeds (the RACE validation seeds), the finding *holds on every seed* when, on each of those
seeds, the leader's accuracy is strictly higher than that of every other candidate that ran on
the same seed. A candidate without that seed is not compared on it (the validation reruns only
the selected configs), and a tie for the lead is no finding to check. This is a sign test on k
seeds, not a significance test: with 2 seeds, a coin would pass it one time in four.
"""

from __future__ import annotations

import pandas as pd

from race.analysis.frontier import config_label, pooled

SEED_COLUMNS = ["table", "reward", "target", "budget", "size", "leader", "seeds",
                "holds_every_seed"]


def _holds(rows: pd.DataFrame, col: str, label: pd.Series, leader: str) -> tuple[str, bool]:
    """(the leader's seeds, whether it leads every rival on each of them)."""
    mine = rows[label == leader]
    seeds = sorted(int(s) for s in mine["seed"])
    for seed in seeds:
        on = rows[rows["seed"] == seed]
        ours = float(on.loc[label[on.index] == leader, col].iloc[0])
        rivals = on.loc[label[on.index] != leader, col]
        if len(rivals) and not (ours > rivals).all():
            return ",".join(map(str, seeds)), False
    return ",".join(map(str, seeds)), True


def every_seed(runs: pd.DataFrame, frontier: pd.DataFrame, regime: pd.DataFrame,
               targets: list[str]) -> pd.DataFrame:
    """Per comparable row (trained rung, two or more candidates, a single leader) whose leader
    ran on two or more seeds: ``seeds`` (theirs, "0,1") and ``holds_every_seed`` (columns
    :data:`SEED_COLUMNS`; ``size`` empty for the frontier)."""
    pool = pooled(runs)
    out = []
    for t in targets:
        col = f"acc_{t}"
        have = pool[pool[col].notna()] if col in pool.columns else pool.iloc[0:0]
        for name, table in (("frontier", frontier), ("regime", regime)):
            sub = table[(table["target"] == t) & (table["budget"] > 0)
                        & (table["n_candidates"] >= 2) & ~table["tie"].astype(bool)]
            for r in sub.itertuples(index=False):
                rows = have[(have["reward"] == r.reward) & (have["budget"] == r.budget)]
                if name == "regime":
                    rows = rows[rows["size"] == r.size]
                    label, leader = rows["alloc"], r.best_alloc
                else:
                    label = pd.Series([config_label(s, a) for s, a in
                                       zip(rows["size"], rows["alloc"], strict=True)],
                                      index=rows.index, dtype=object)
                    leader = r.best
                if int((label == leader).sum()) < 2:
                    continue
                seeds, holds = _holds(rows, col, label, leader)
                out.append({"table": name, "reward": r.reward, "target": t,
                            "budget": r.budget, "size": r.size if name == "regime" else "",
                            "leader": leader, "seeds": seeds, "holds_every_seed": holds})
    return pd.DataFrame(out, columns=SEED_COLUMNS)
