"""Where each allocation and reward system puts the budget: phase shares and steps per rung.

Conventions (model FLOPs, :mod:`race.analysis.columns`):

- A phase's share of a run is ``flops_<phase> / flops_total`` (rollout, learning, reward: the
  budget phases). An allocation's split (:func:`allocation_split`) is the mean share over its
  cells (sizes x rewards x seeds, stages pooled) at the largest trained rung of the table.
- A reward system's compute share (:func:`reward_shares`) is its reward FLOPs over its total
  FLOPs, summed over its runs, each run counted once at its largest rung (nested rungs: one
  run serves every rung), so a share is "of everything that reward's cells spent".
- Steps per rung (:func:`steps_table`): the optimizer steps a cell took to reach the rung (the
  ledger's ``steps``), the median over reward systems and seeds per (allocation, size, rung):
  a reward model's FLOPs come out of the same budget, so its cells take fewer steps.
- The knobs shown are those of :data:`race.analysis.columns.KNOB_COLUMNS` that differ between
  the allocations (the others are the study's shared training settings).
"""

from __future__ import annotations

import pandas as pd

from race.analysis.columns import KNOB_COLUMNS
from race.analysis.frontier import CELL_KEYS, pooled
from race.flops.ledger import BUDGET_PHASES

#: The knob names as the split table heads them.
KNOB_LABELS = {"num_generations": "completions/prompt", "prompts_per_step": "prompts/step",
               "num_iterations": "updates/batch", "max_completion_length": "completion cap",
               "lora_rank": "LoRA rank", "learning_rate": "learning rate", "beta": "beta"}


def trained(runs: pd.DataFrame) -> pd.DataFrame:
    """The pooled trained rows (budget > 0) with a positive ``flops_total``."""
    pool = pooled(runs)
    return pool[(pool["budget"] > 0) & (pool["flops_total"] > 0)]


def varying_knobs(runs: pd.DataFrame) -> list[str]:
    """The knob columns whose value differs between allocations."""
    present = [k for k in KNOB_COLUMNS if k in runs.columns]
    per = runs.groupby("alloc")[present].first()
    return [k for k in present if per[k].nunique(dropna=False) > 1]


def allocation_split(runs: pd.DataFrame) -> pd.DataFrame:
    """Per allocation at the largest trained rung: its varying knobs, ``share_<phase>`` (mean
    fraction of ``flops_total``), ``budget`` (the rung) and ``n_cells`` averaged."""
    rows = trained(runs)
    if rows.empty:
        return pd.DataFrame(columns=["alloc", "budget", "n_cells"]
                            + [f"share_{p}" for p in BUDGET_PHASES])
    top = float(rows["budget"].max())
    at = rows[rows["budget"] == top]
    shares = at[["alloc"]].assign(**{f"share_{p}": at[f"flops_{p}"] / at["flops_total"]
                                     for p in BUDGET_PHASES})
    out = shares.groupby("alloc", sort=True).mean().reset_index()
    out.insert(1, "budget", top)
    out.insert(2, "n_cells", at.groupby("alloc", sort=True).size().to_numpy())
    knobs = varying_knobs(runs)
    if knobs:
        out = out.merge(runs.groupby("alloc")[knobs].first().reset_index(), on="alloc")
    return out


def steps_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Median steps per (alloc, size, budget) over reward systems and seeds (trained rungs)."""
    rows = trained(runs)
    return (rows.groupby(["alloc", "size", "budget"], sort=True)["steps"].median()
            .reset_index())


def reward_shares(runs: pd.DataFrame) -> pd.DataFrame:
    """Per reward system: ``reward_flops``, ``total_flops`` (each run at its largest rung) and
    ``share`` = reward / total, sorted by share then name."""
    rows = trained(runs)
    if rows.empty:
        return pd.DataFrame(columns=["reward", "reward_flops", "total_flops", "share"])
    last = rows.sort_values("budget", kind="mergesort").groupby(CELL_KEYS).tail(1)
    g = last.groupby("reward", sort=True)
    out = pd.DataFrame({"reward_flops": g["flops_reward"].sum().astype(float),
                        "total_flops": g["flops_total"].sum().astype(float)}).reset_index()
    out["share"] = out["reward_flops"] / out["total_flops"]
    return out.sort_values(["share", "reward"], kind="mergesort").reset_index(drop=True)
