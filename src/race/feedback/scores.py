"""Step scores to one score, and completions to text: shared by the feedback models, the rewards
built on them and best-of-n reranking.

Aggregates (:data:`AGGREGATES`, :func:`aggregate`) of a completion's step scores:

``min``      the weakest step: one bad step sinks the completion;
``last``     the last line's score (the answer line of a well-formed completion);
``product``  the product: the probability that every step is right, if the steps were
             independent; long completions pay for every step;
``mean``     the mean: partial credit, a completion with one bad step out of many still
             scores high (for ``rule+prm`` rewards, where the rule term rewards the answer and
             the PRM term credits the share of good steps).

No steps -> 0.0 for every aggregate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from race.core.specs import PRM_AGGREGATES

#: How a completion's step scores become one score (``rewards.<name>.aggregate``).
AGGREGATES = PRM_AGGREGATES  # the schema's enum (race.core.specs)


def aggregate(step_scores: Sequence[float], how: str = "min") -> float:
    """One score from a completion's step scores: ``min``, ``last``, ``product`` or ``mean``
    (module docstring). No steps -> 0.0 (nothing to credit)."""
    if how not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {AGGREGATES}, got {how!r}")
    if not step_scores:
        return 0.0
    if how == "min":
        return float(min(step_scores))
    if how == "last":
        return float(step_scores[-1])
    if how == "mean":
        return float(math.fsum(step_scores) / len(step_scores))
    return float(math.prod(step_scores))




def as_text(completion) -> str:
    """A completion as text: TRL passes strings, or message lists for conversational data
    (then the contents of the messages are joined)."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion)
