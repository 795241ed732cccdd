"""The small Markdown tables beside the findings: winners per reward and rung, the allocations'
splits, how far each undecided comparison is from an answer, and the frontier in seconds.

Number formats are :mod:`race.analysis.markdown`'s (accuracies 3 decimals, points 1 decimal,
FLOPs ``1.20e11``); a leader is printed bare only when decided, else with a "?" and its z.
"""

from __future__ import annotations

import pandas as pd

from race.analysis.findings import count, top_rung
from race.analysis.markdown import acc, flops, md_table, num, pct, pts, target, yes
from race.analysis.splits import KNOB_LABELS


def leader_cell(best: str, tie: bool, decided: bool, runner_up: str, gap_z: object) -> str:
    """One comparison in a small table: the leader when decided, else "leader? z=…"."""
    if not best:
        return "–"
    if tie:
        return f"{best} (tie)"
    z = f"z={num(gap_z, '.1f')}"
    if decided:
        return f"**{best}** ({z})"
    return f"{best}? ({z if runner_up else 'alone'})"


def mark(best: str, tie: bool, decided: bool) -> str:
    """A leader without its z: bold when decided, "(tie)", or a "?" when undecided."""
    if not best:
        return "–"
    return f"{best} (tie)" if tie else f"**{best}**" if decided else f"{best}?"


def winners_md(frontier: pd.DataFrame, target_key: str) -> str:
    """Reward systems x trained rungs: the frontier winner on one target (bold: decided)."""
    f = frontier[(frontier["target"] == target_key) & (frontier["budget"] > 0)]
    if f.empty:
        return ""
    budgets = sorted(f["budget"].unique())
    rows = []
    for reward, g in f.groupby("reward", sort=True):
        cells = {r.budget: leader_cell(r.best, bool(r.tie), bool(r.decided), r.runner_up,
                                       r.gap_z) for r in g.itertuples(index=False)}
        rows.append([reward] + [cells.get(b, "–") for b in budgets])
    return md_table(rows, ["reward \\ rung (FLOPs)"] + [flops(b) for b in budgets])


def split_md(split: pd.DataFrame, steps: pd.DataFrame, sizes: list[str]) -> str:
    """Allocations: the knobs that differ, the phase shares at the largest rung, and the
    median steps per rung for each size (small to large)."""
    if split.empty:
        return ""
    knobs = [k for k in KNOB_LABELS if k in split.columns]
    phases = [c.removeprefix("share_") for c in split.columns if c.startswith("share_")]
    budgets = sorted(steps["budget"].unique())
    order = [s for s in sizes if s in set(steps["size"])]
    header = (["allocation"] + [KNOB_LABELS[k] for k in knobs] + phases
              + [f"steps to {flops(b)} ({' · '.join(order)})" for b in budgets])
    rows = []
    for r in split.itertuples(index=False):
        mine = steps[steps["alloc"] == r.alloc]
        per = {(x.size, x.budget): x.steps for x in mine.itertuples(index=False)}
        rows.append([r.alloc] + [num(getattr(r, k), "g") for k in knobs]
                    + [pct(getattr(r, f"share_{p}")) for p in phases]
                    + [" · ".join(num(per.get((s, b)), ".0f") for s in order) for b in budgets])
    return md_table(rows, header)


def power_md(power: pd.DataFrame, budget: float | None = None) -> str:
    """The undecided frontier winners (at ``budget``, default the largest rung) with the
    prompts and seeds that would decide them."""
    f = power[power["table"] == "frontier"]
    b = top_rung(f) if budget is None else budget
    f = f[f["budget"] == b]
    if f.empty:
        return "Every comparable frontier winner at the largest rung is decided."
    header = ["reward", "target", "leader", "runner-up", "gap (pts)", "z", "prompts used",
              "prompts needed", "seeds", "seeds needed", "holds on every seed"]
    rows = [[r.reward, target(r.target), r.leader, r.runner_up or "–", pts(100 * r.gap),
             num(r.gap_z, ".2f"), count(r.n_prompts),
             (count(r.prompts_needed) + (f" (vs {r.binding})" if r.binding
                                          and r.binding != r.runner_up else "")
              if r.gap else "never (tie)"), str(r.n_seeds),
             count(r.seeds_needed) if r.gap else "never (tie)",
             yes(r.holds_every_seed) if r.holds_every_seed is not pd.NA else "–"]
            for r in f.itertuples(index=False)]
    return md_table(rows, header)


def power_counts_md(power: pd.DataFrame, targets: list[str]) -> str:
    """Per table and target: how many undecided rows, and the median prompts and seeds."""
    lines = []
    for name in ("frontier", "regime"):
        for t in targets:
            g = power[(power["table"] == name) & (power["target"] == t)]
            if g.empty:
                continue
            n = pd.to_numeric(g["prompts_needed"], errors="coerce")
            k = pd.to_numeric(g["seeds_needed"], errors="coerce")
            lines.append(f"- {name} · {target(t)}: {len(g)} undecided; median "
                         f"{count(float(n.median()))} prompts (now "
                         f"{count(float(g['n_prompts'].median()))}), median "
                         f"{count(float(k.median()))} seeds.")
    return "\n".join(lines)


def time_md(time_frontier: pd.DataFrame, target_key: str) -> str:
    """The iso-time frontier on one target beside the FLOP winners (all rewards, rungs): bold
    when decided, a "?" when not."""
    t = time_frontier[time_frontier["target"] == target_key]
    if t.empty:
        return ""
    header = ["reward", "rung (FLOPs)", "time budget (s)", "FLOP winner", "time winner",
              "its accuracy", "reached rung", "z", "differs"]
    rows = [[r.reward, flops(r.budget), num(r.seconds, ".1f"),
             mark(r.flop_best, "|" in r.flop_best, bool(r.flop_decided)),
             leader_cell(r.time_best, "|" in str(r.time_best), bool(r.decided),
                         r.time_runner_up, r.gap_z),
             acc(r.time_best_acc), flops(r.time_best_budget), num(r.gap_z, ".2f"),
             yes(r.differs)] for r in t.itertuples(index=False)]
    return md_table(rows, header)
