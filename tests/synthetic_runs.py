"""Synthetic runs tables with known answers, built in code (fixed seed) for the report tests.

Every column of :func:`race.analysis.columns.all_columns` is filled. Accuracy is an exact fraction
k / n_eval with a Wilson 95% interval, like a real evaluation; by default it follows a known
sigmoid in the budget whose asymptote grows with size and allocation index, so the winner at the
top rung is the largest size with the last allocation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import numpy as np
import pandas as pd

from race.analysis.columns import all_columns

SIZES = ("nano", "micro")
REWARDS = ("rule", "prm")
ALLOCS = ("base", "search", "updates")
TARGETS = ("in_pass1", "ood_pass1")
PARAMS = {"nano": 1.0e5, "micro": 1.0e6, "mini": 4.0e6}

#: rollout / learning / reward shares of a step per allocation (reward share 0 under "rule").
SHARES = {"base": (0.55, 0.40, 0.05), "search": (0.75, 0.20, 0.05),
          "updates": (0.35, 0.60, 0.05)}
KNOBS = {"base": (8, 4, 1), "search": (32, 2, 1), "updates": (8, 4, 4)}  # gens, prompts, iters

AccFn = Callable[[str, str, str, int, float, str], float]


def wilson(k: float, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval of k successes out of n."""
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def default_acc(sizes: Iterable[str], allocs: Iterable[str], noise: float = 0.01,
                seed: int = 0) -> AccFn:
    """Known sigmoid: A grows with size and alloc index; seed noise is fixed per (cell, target)."""
    sizes, allocs = list(sizes), list(allocs)
    rng = np.random.default_rng(seed)
    cache: dict[tuple, float] = {}

    def acc(size: str, reward: str, alloc: str, run_seed: int, budget: float,
            target: str) -> float:
        si, ai = sizes.index(size), allocs.index(alloc)
        a = 0.35 + 0.15 * si + 0.08 * ai - (0.1 if target.startswith("ood") else 0.0)
        c_mid = 2e11 * (1 + si)
        base = 0.1 + a / (1 + (c_mid / budget) ** 1.2)
        key = (size, reward, alloc, run_seed, target)
        if key not in cache:
            cache[key] = float(rng.normal(0, noise))
        return float(np.clip(base + cache[key], 0, 1))

    return acc


def make_runs(*, sizes: Iterable[str] = SIZES, rewards: Iterable[str] = REWARDS,
              allocs: Iterable[str] = ALLOCS, targets: Iterable[str] = TARGETS,
              stage: str = "full", budgets: Iterable[float] = (1e11, 2e11, 4e11),
              seeds: Iterable[int] = (0,), configs: Iterable[tuple[str, str, str]] | None = None,
              acc: AccFn | None = None, n_eval: int = 400, seed: int = 0,
              study: str = "synthetic") -> pd.DataFrame:
    """One stage's rows: every (size, reward, alloc) (or ``configs``) x seed x budget.

    ``acc(size, reward, alloc, seed, budget, target)`` gives the true accuracy; it is rounded to
    k / n_eval. FLOPs used are just under the budget (a run stops before exceeding it).
    """
    sizes, allocs, targets = list(sizes), list(allocs), list(targets)
    acc = acc or default_acc(sizes, allocs, seed=seed)
    if configs is None:
        configs = [(s, r, a) for s in sizes for r in rewards for a in allocs]
    rng = np.random.default_rng(seed + 1)
    rows = []
    for size, reward, alloc in configs:
        gens, prompts, iters = KNOBS.get(alloc, (8, 4, 1))
        shares = np.array(SHARES.get(alloc, (0.5, 0.45, 0.05)))
        if reward == "rule":
            shares = shares * np.array([1, 1, 0])
        shares = shares / shares.sum()
        params = PARAMS.get(size, 1e6)
        step_flops = 1e9 * params / 1e5 * iters ** 0.5
        for run_seed in seeds:
            for budget in sorted(budgets):
                steps = max(1, int(budget // step_flops))
                used = steps * step_flops
                row = {
                    "study": study, "stage": stage,
                    "cell": f"size~{size}/reward~{reward}/alloc~{alloc}/seed~{run_seed}",
                    "size": size, "reward": reward, "alloc": alloc, "seed": run_seed,
                    "budget": float(budget),
                    "num_generations": gens, "prompts_per_step": prompts,
                    "num_iterations": iters, "max_completion_length": 64, "lora_rank": 8,
                    "learning_rate": 1e-4, "beta": 0.0,
                    "steps": steps, "updates": steps * iters, "rollouts": steps * prompts * gens,
                    "prompts_seen": steps * prompts, "flops_total": used,
                    "p_learning": shares[1], "max_step_flops": step_flops,
                    "wall_s": steps * 0.25, "params": params, "non_embedding_params": params * 0.8,
                    "exec_flops_total": used * 1.3,
                }
                for phase, share in zip(["rollout", "learning", "reward"], shares, strict=True):
                    row[f"flops_{phase}"] = used * share
                    row[f"exec_flops_{phase}"] = used * share * 1.3
                    row[f"tokens_{phase}"] = steps * prompts * gens * 80 if share else 0
                for t in targets:
                    k = round(acc(size, reward, alloc, run_seed, float(budget), t) * n_eval)
                    lo, hi = wilson(k, n_eval)
                    row.update({f"acc_{t}": k / n_eval, f"acc_{t}_lo": lo, f"acc_{t}_hi": hi,
                                f"n_{t}": n_eval,
                                f"eval_flops_{t}": float(rng.uniform(1e9, 2e9))})
                rows.append(row)
    return pd.DataFrame(rows, columns=all_columns(targets))


def make_study(*, top: Iterable[tuple[str, str, str]] | None = None, full: bool = True,
               seed: int = 0) -> pd.DataFrame:
    """Pilot (1 seed, three rungs), validation (selected configs, 3 seeds, two larger rungs)
    and optionally the full grid at the validation rungs, in one table."""
    pilot = make_runs(stage="pilot", budgets=(1e11, 2e11, 4e11), seeds=(0,), seed=seed)
    configs = list(top) if top is not None else [
        (s, r, a) for s in SIZES for r in REWARDS for a in ("base", "updates")]
    val = make_runs(stage="validation", budgets=(8e11, 1.6e12), seeds=(0, 1, 2),
                    configs=configs, seed=seed)
    parts = [pilot, val]
    if full:
        parts.append(make_runs(stage="full", budgets=(8e11, 1.6e12), seeds=(0, 1, 2),
                               seed=seed))
    return pd.concat(parts, ignore_index=True)
