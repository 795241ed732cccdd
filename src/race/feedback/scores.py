"""Step scores to one score, and completions to text: shared by the feedback models, the rewards
built on them and best-of-n reranking."""

from __future__ import annotations

import math
from collections.abc import Sequence

#: How a completion's step scores become one score (``rewards.<name>.aggregate``).
AGGREGATES = ("min", "last", "product")


def aggregate(step_scores: Sequence[float], how: str = "min") -> float:
    """One score from a completion's step scores: ``min``, ``last`` or ``product``.
    No steps -> 0.0 (nothing to credit)."""
    if how not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {AGGREGATES}, got {how!r}")
    if not step_scores:
        return 0.0
    if how == "min":
        return float(min(step_scores))
    if how == "last":
        return float(step_scores[-1])
    return float(math.prod(step_scores))




def as_text(completion) -> str:
    """A completion as text: TRL passes strings, or message lists for conversational data
    (then the contents of the messages are joined)."""
    if isinstance(completion, str):
        return completion
    return "".join(m.get("content", "") for m in completion)
