"""How far an undecided comparison is from an answer: evaluation prompts and seeds needed.

The question: two configs A and B scored on the same ``n`` evaluation prompts differ by an
observed gap ``d = acc_A - acc_B`` (fractions). How many prompts, and how many training seeds,
would put that gap at ``z >= DECIDED_Z`` (the report's "decided" line), if it held?

**Prompts (the evaluation's noise).** A paired comparison: per prompt i, ``D_i = X_A,i - X_B,i``,
where ``X`` is the prompt's score (greedy pass@1: 0 or 1; sampled pass@1: the mean of its k
verdicts). The gap's standard error over n prompts is ``sigma_d / sqrt(n)`` with

    sigma_d^2 = sigma_A^2 + sigma_B^2 - 2 * rho * sigma_A * sigma_B,

``sigma_X^2`` the variance of one prompt's score and ``rho`` the correlation of the two configs'
per-prompt scores. Deciding at z with power ``1 - beta`` needs

    n = ((z + z_beta) * sigma_d / d)^2,        z_beta = Phi^-1(power)

(the normal-approximation sample size of a paired difference of two proportions / means).
The default ``power = 0.5`` (``z_beta = 0``) is the n at which the *expected* z of the observed
gap is exactly z: even odds that a rerun on n prompts decides it. 80% power multiplies n by
``((z + 0.84) / z)^2``, about 2 at z = 2.

- ``sigma_X^2`` of a row comes from its own 95% interval, ``n * se^2`` with
  ``se = (hi - lo) / (2 * 1.96)``: a Wilson interval gives about ``p(1 - p)`` (greedy pass@1),
  the prompt-clustered bootstrap of sampled pass@1 gives the variance of the k-sample mean
  itself. Without an interval: ``p(1 - p)``, which is exact for one sample per prompt and an upper
  bound for mean@k with any k (law of total variance: ``p(1 - p) = Var_i(p_i) + E[p_i(1 - p_i)]``,
  and averaging k samples shrinks only the second term).
- ``rho`` is not in the runs table (it needs the per-prompt verdicts of ``eval.json``), so the
  report sets it to 0. Two configs scored on the same prompts share their difficulty, so rho is
  positive in practice and the n given is an upper bound: the prompts a paired test needs at
  most, at the observed accuracies.

**Seeds (the training noise).** The same z for a gap whose noise is the training seed's: each
config's mean over k seeds has variance ``s^2 / k``, s^2 the variance of one config's accuracy
across seeds (pooled over every config x rung run on two or more seeds, :func:`seed_variance`:
one config's own two seeds are one degree of freedom), so

    k = (z + z_beta)^2 * (s_A^2 + s_B^2) / d^2      (the seeds per config).

**Against every candidate.** A winner is decided only when it leads every other candidate
(:func:`race.analysis.frontier.rank_candidates`), so the prompts a comparison needs are the most
that any candidate needs against the leader (``binding``: usually the runner-up, but a farther
candidate with a noisier evaluation can need more); with one pooled seed variance the smallest
gap, the runner-up's, needs the most seeds.

**Both at once.** The two variances add: with ``2 n`` prompts and ``2 k`` seeds each noise takes
half of the allowed variance ``d^2 / (z + z_beta)^2``, so the gap reaches z. The report gives n and
k, each the minimum with the other noise gone, and says so.

Counts are rounded up (a tolerance of 1e-9 keeps an exact product from rounding up by float
error); a gap of 0 (a tie) or a missing input gives NaN: no number of prompts decides a tie.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from scipy.stats import norm

from race.analysis.frontier import DECIDED_Z, binomial_se, pooled

#: Power of the sample sizes: 0.5 = the expected z of the observed gap reaches DECIDED_Z.
POWER = 0.5


def z_beta(power: float = POWER) -> float:
    """The normal quantile that the power adds to the decision line (0 at power 0.5)."""
    if not 0 < power < 1:
        raise ValueError(f"power must be in (0, 1), got {power}")
    return float(norm.ppf(power))


def _count(x: float) -> float:
    """Round a required count up; NaN and infinity stay NaN (no count decides)."""
    if x is None or not math.isfinite(x):
        return math.nan
    return float(max(1, math.ceil(x - 1e-9)))


def binomial_variance(p: float) -> float:
    """``p(1 - p)``: one prompt's score variance, exact for one sample per prompt and an upper
    bound for the mean of k samples (module docstring)."""
    p = min(max(float(p), 0.0), 1.0)
    return p * (1 - p)


def paired_sd(var_a: float, var_b: float, rho: float = 0.0) -> float:
    """``sigma_d``: the standard deviation of one prompt's paired difference of scores."""
    if not -1 <= rho <= 1:
        raise ValueError(f"correlation must be in [-1, 1], got {rho}")
    var = var_a + var_b - 2 * rho * math.sqrt(var_a * var_b)
    return math.sqrt(max(var, 0.0))


def prompts_needed(gap: float, var_a: float, var_b: float, *, z: float = DECIDED_Z,
                   power: float = POWER, rho: float = 0.0) -> float:
    """Evaluation prompts (per config, the same prompts for both) that put a paired gap
    ``gap`` (fraction) at ``z`` with ``power``: ``n = ((z + z_beta) * sigma_d / gap)^2``.
    ``var_a``, ``var_b``: one prompt's score variance per config. NaN for a zero gap."""
    if any(pd.isna(v) for v in (gap, var_a, var_b)) or gap == 0:
        return math.nan
    return _count(((z + z_beta(power)) * paired_sd(var_a, var_b, rho) / abs(gap)) ** 2)


def prompts_for_gap(gap: float, accuracy: float, *, z: float = DECIDED_Z, power: float = POWER,
                    rho: float = 0.0) -> float:
    """Prompts that resolve a gap of ``gap`` at accuracy ``accuracy`` (fractions): the two
    configs at ``accuracy +/- gap / 2``, each prompt's variance ``p(1 - p)`` (greedy pass@1;
    an upper bound for sampled pass@1). ``race plan --gap --accuracy``."""
    if not 0 < gap < 1:
        raise ValueError(f"gap must be a fraction in (0, 1), got {gap}")
    hi, lo = accuracy + gap / 2, accuracy - gap / 2
    if lo < 0 or hi > 1:
        raise ValueError(f"accuracy {accuracy} +/- gap/2 must stay in [0, 1]")
    return prompts_needed(gap, binomial_variance(hi), binomial_variance(lo), z=z, power=power,
                          rho=rho)


def seeds_needed(gap: float, seed_var_a: float, seed_var_b: float, *, z: float = DECIDED_Z,
                 power: float = POWER) -> float:
    """Seeds per config that put ``gap`` at ``z`` against the training noise alone:
    ``k = (z + z_beta)^2 * (s_A^2 + s_B^2) / gap^2``. NaN for a zero gap or an unmeasured s."""
    if any(pd.isna(v) for v in (gap, seed_var_a, seed_var_b)) or gap == 0:
        return math.nan
    return _count((z + z_beta(power)) ** 2 * (seed_var_a + seed_var_b) / gap ** 2)


def seed_variance(runs: pd.DataFrame, target: str) -> tuple[float, int]:
    """(pooled variance of one config's accuracy across seeds, groups it pools): over every
    (size, reward, alloc, budget) of the pooled table with two or more seeds holding a value,
    ``sum((k_g - 1) * s_g^2) / sum(k_g - 1)``. (NaN, 0) when no config ran on two seeds."""
    col = f"acc_{target}"
    if col not in runs.columns:
        return math.nan, 0
    pool = pooled(runs).dropna(subset=[col])
    g = pool.groupby(["size", "reward", "alloc", "budget"])[col]
    k, var = g.count(), g.var(ddof=1)
    keep = k >= 2
    df = float((k[keep] - 1).sum())
    if not df:
        return math.nan, 0
    return float(((k[keep] - 1) * var[keep]).sum() / df), int(keep.sum())


def prompt_variance(runs: pd.DataFrame, target: str, by: list[str]) -> pd.DataFrame:
    """One prompt's score variance per group of ``by`` (mean over its seeds of ``n * se^2``,
    se from the row's 95% interval, :func:`race.analysis.frontier.binomial_se`), and the
    prompts its evaluation used (``n_prompts``, the smallest over its seeds)."""
    col, n_col = f"acc_{target}", f"n_{target}"
    pool = pooled(runs)
    pool = pool[pool[col].notna()] if col in pool.columns else pool.iloc[0:0]
    if pool.empty or n_col not in pool.columns:
        return pd.DataFrame(columns=by + ["prompt_var", "n_prompts"])
    n = pool[n_col].astype(float)
    se = binomial_se(pool, target)
    p = pool[col].astype(float).clip(0, 1)
    var = (n * se ** 2).where(se.notna() & (n > 0), p * (1 - p))
    work = pool[by].assign(prompt_var=var.to_numpy(), n_prompts=n.to_numpy())
    return work.groupby(by, sort=True).agg(prompt_var=("prompt_var", "mean"),
                                           n_prompts=("n_prompts", "min")).reset_index()


POWER_COLUMNS = [
    "table", "reward", "target", "budget", "size", "leader", "runner_up", "acc",
    "runner_up_acc", "gap", "gap_z", "n_prompts", "prompts_needed", "binding", "n_seeds",
    "seed_sd", "seeds_needed", "holds_every_seed",
]


def _needs(lead: pd.Series, rest: pd.DataFrame, label: str, s2: float,
           power: float) -> tuple[float, str, float]:
    """(prompts, the candidate that needs the most of them, seeds) for ``lead`` to lead every
    row of ``rest`` at the decision line: "decided" is against every candidate, and a farther
    candidate with a noisier evaluation can need more prompts than the runner-up. With one
    pooled seed variance the smallest gap (the runner-up's) needs the most seeds."""
    ns = [prompts_needed(float(lead["acc"]) - float(c["acc"]), float(lead["prompt_var"]),
                         float(c["prompt_var"]), power=power) for _, c in rest.iterrows()]
    known = [(n, str(c[label])) for n, (_, c) in zip(ns, rest.iterrows(), strict=True)
             if math.isfinite(n)]
    n, binding = max(known) if known else (math.nan, "")
    k = seeds_needed(float(lead["acc"]) - float(rest["acc"].max()), s2, s2, power=power)
    return n, binding, k


def power_table(runs: pd.DataFrame, summary: pd.DataFrame, frontier: pd.DataFrame,
                regime: pd.DataFrame, targets: list[str], seeds: pd.DataFrame | None = None,
                power: float = POWER) -> pd.DataFrame:
    """Every undecided comparable frontier winner and regime cell (a trained rung with two or
    more candidates holding a value) with the prompts and seeds that would decide it against
    every other candidate (columns :data:`POWER_COLUMNS`; ``table`` "frontier" or "regime",
    ``size`` empty for the frontier). ``summary``: the seed summary of
    :func:`race.analysis.frontier.config_summary`; ``n_prompts``: the fewest prompts an
    evaluation of the comparison used; ``binding``: the candidate that needs the most prompts
    (usually the runner-up); ``seed_sd``: the pooled seed standard deviation of the target;
    ``holds_every_seed`` from ``seeds`` (:func:`race.analysis.seeds.every_seed`), NA where
    the leader ran on one seed only. A tie needs NaN prompts and seeds: no count decides it."""
    keys = ["reward", "budget", "size", "alloc"]
    rows = []
    for t in targets:
        s2, _ = seed_variance(runs, t)
        cand = summary[(summary["target"] == t) & summary["acc"].notna()].merge(
            prompt_variance(runs, t, keys), on=keys, how="left")
        for name, table, label in (("frontier", frontier, "label"), ("regime", regime, "alloc")):
            sub = table[(table["target"] == t) & (table["budget"] > 0)
                        & (table["n_candidates"] >= 2) & ~table["decided"].astype(bool)]
            for r in sub.itertuples(index=False):
                leader = r.best if name == "frontier" else r.best_alloc
                g = cand[(cand["reward"] == r.reward) & (cand["budget"] == r.budget)]
                if name == "regime":
                    g = g[g["size"] == r.size]
                first = g[label].isin(str(leader).split("|"))
                n, binding, k = ((math.nan, "", math.nan) if r.tie else
                                 _needs(g[first].iloc[0], g[~first], label, s2, power))
                rows.append({
                    "table": name, "reward": r.reward, "target": t, "budget": r.budget,
                    "size": r.size if name == "regime" else "", "leader": leader,
                    "runner_up": r.runner_up, "acc": r.acc, "runner_up_acc": r.runner_up_acc,
                    "gap": 0.0 if r.tie else float(r.gap),
                    "gap_z": 0.0 if r.tie else r.gap_z,
                    "n_prompts": float(g["n_prompts"].min()), "prompts_needed": n,
                    "binding": binding, "n_seeds": r.n_seeds,
                    "seed_sd": math.sqrt(s2) if math.isfinite(s2) else math.nan,
                    "seeds_needed": k, "holds_every_seed": pd.NA,
                })
    out = pd.DataFrame(rows, columns=POWER_COLUMNS)
    if seeds is not None and len(out) and len(seeds):
        keyed = {(r.table, r.reward, r.target, r.budget, r.size): r.holds_every_seed
                 for r in seeds.itertuples(index=False)}
        out["holds_every_seed"] = [keyed.get((r.table, r.reward, r.target, r.budget, r.size),
                                             pd.NA) for r in out.itertuples(index=False)]
    order = {t: i for i, t in enumerate(targets)}
    return (out.assign(_t=out["target"].map(order), _k=out["table"].map(
        {"frontier": 0, "regime": 1}))
        .sort_values(["_k", "reward", "_t", "budget", "size"], kind="mergesort")
        .drop(columns=["_t", "_k"]).reset_index(drop=True))


def needed_range(values: pd.Series) -> tuple[float, float, float]:
    """(smallest, median, largest) of a needed-count column, NaNs (ties) left out."""
    v = pd.to_numeric(values, errors="coerce").dropna()
    if v.empty:
        return math.nan, math.nan, math.nan
    return float(v.min()), float(np.median(v)), float(v.max())
