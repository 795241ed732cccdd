"""Pure metric logic of the evaluation targets: no models, no I/O.

Conventions: accuracies and rewards are fractions in [0, 1]; every interval is a two-sided 95%
interval ``(lo, hi)``; sample order is the order in which completions were drawn (index 0 first).

* :func:`wilson` -- Wilson score interval of a binomial proportion (binary accuracies; scipy).
  Unlike the normal ("Wald") interval it stays inside [0, 1] and is not degenerate at 0/n or n/n.
* :func:`bootstrap_interval` -- percentile bootstrap of a mean over *groups* (one group per
  prompt): prompts are resampled with replacement, not single completions, because completions
  of the same prompt are correlated (a cluster bootstrap).
* :func:`pass_at_k` -- the unbiased pass@k estimator of Chen et al. (2021) from n samples of
  which c are correct: ``1 - C(n-c, k) / C(n, k)``, the chance that k of the n drawn without
  replacement contain a correct one (the plain "any of the first k" is the same in expectation
  but noisier). With k = 1 it is c / n, so mean@n pass@1 is ``pass_at_k(n, c, 1)``.
* :func:`majority_index` -- the majority-vote pick of maj@k.
* :func:`best_index` -- the pick of PRM best-of-n.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Hashable, Sequence

import numpy as np
from scipy import stats

#: The standard-normal quantile of a two-sided 95% interval (Phi^-1(0.975) = 1.95996...).
Z95 = float(stats.norm.ppf(0.975))


def wilson(successes: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval of ``successes`` out of ``n`` trials (scipy's
    ``binomtest(...).proportion_ci(method="wilson")``, no continuity correction).
    Known values (95%): 0/10 -> (0, 0.2775), 5/10 -> (0.2366, 0.7634), 10/10 -> (0.7225, 1).
    """
    if n <= 0:
        raise ValueError(f"wilson: need n >= 1 trials, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"wilson: successes must be in [0, {n}], got {successes}")
    ci = stats.binomtest(successes, n).proportion_ci(confidence_level=confidence,
                                                     method="wilson")
    # At 0/n and n/n one bound is exactly 0 or 1; computed, it is off by float round-off.
    lo = 0.0 if successes == 0 else max(0.0, float(ci.low))
    hi = 1.0 if successes == n else min(1.0, float(ci.high))
    return lo, hi


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("mean of no values")
    return math.fsum(values) / len(values)


def bootstrap_interval(groups: Sequence[Sequence[float]], reps: int = 2000,
                       seed: int = 0) -> tuple[float, float]:
    """95% percentile-bootstrap interval of the mean of all values, resampling groups
    (``scipy.stats.bootstrap``, seeded: deterministic).

    Each replicate draws ``len(groups)`` groups with replacement and takes the mean of every
    value in them, i.e. the ratio of the drawn groups' sums to their sizes (scipy resamples
    the (sum, size) pairs together, ``paired=True``). With equal group sizes this is the mean
    of the group means. When every group has the same mean, or there is one group, every
    replicate is that mean and so is the interval (scipy would warn about a degenerate
    distribution).
    """
    if not groups or any(len(g) == 0 for g in groups):
        raise ValueError("bootstrap_interval: need at least one group, none of them empty")
    if reps < 1:
        raise ValueError(f"bootstrap_interval: reps must be >= 1, got {reps}")
    sums = np.array([math.fsum(g) for g in groups])
    sizes = np.array([len(g) for g in groups], dtype=float)
    group_means = sums / sizes
    if np.all(group_means == group_means[0]):
        m = float(sums.sum() / sizes.sum())
        return m, m
    result = stats.bootstrap((sums, sizes), lambda s, n, axis: s.sum(axis) / n.sum(axis),
                             paired=True, vectorized=True, n_resamples=reps,
                             confidence_level=0.95, method="percentile",
                             random_state=np.random.default_rng(seed))
    ci = result.confidence_interval
    return float(ci.low), float(ci.high)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct (module docstring); needs k <= n.

    Known values: (n=16, c=0, k=16) -> 0; (16, 1, 16) -> 1; (16, 4, 1) -> 0.25;
    (4, 1, 2) -> 0.5.
    """
    if not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 1 <= k <= n, got k={k}, n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"pass_at_k: c must be in [0, {n}], got {c}")
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def majority_index(answers: Sequence[Hashable | None]) -> int | None:
    """Index of the sample that represents the majority final answer, or None.

    ``answers[i]`` is the final answer parsed from sample i (None: no parseable answer).
    Rules: unparseable answers never win (they are not a vote for anything); the answer with
    the most votes wins; a tie is broken by the earliest-sampled answer among the tied (the
    tied answer whose first occurrence has the smallest index). The returned index is that
    first occurrence. All answers None (or no samples) -> None, which scores as wrong.
    """
    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(i for i, a in enumerate(answers) if a is not None and counts[a] == top)


def best_index(scores: Sequence[float]) -> int:
    """Index of the highest score; ties go to the earliest sample.

    A NaN score ranks below every number (a broken score must not be picked over a real one);
    if every score is NaN the first sample is picked.
    """
    if not scores:
        raise ValueError("best_index: need at least one score")
    best, best_i = -math.inf, 0
    for i, s in enumerate(scores):
        s = float(s)
        if not math.isnan(s) and s > best:  # strict ">": the earliest of equal scores stays
            best, best_i = s, i
    return best_i
