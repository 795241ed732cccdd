"""Reward systems with TRL's ``reward_funcs`` signature, each keeping its own FLOP ledger.

A reward function is called as ``f(prompts=..., completions=..., completion_ids=..., **columns)``
and returns one float per completion. Every reward object here also exposes

* ``consume() -> PhaseFlops``: model / executed FLOPs and tokens spent since the last call
  (the trainer's meter charges them to the ``reward`` phase of the step);
* ``bound(rows, max_prompt_len, max_completion_len) -> int``: the most model FLOPs one call on
  ``rows`` completions can cost (the budget stop needs it before the step runs).

``rule`` is the task verifier: 1.0 for a verified final answer, else 0.0; it costs 0 FLOPs (its
wall time is still recorded by the meter). The learned feedback models (``prm``, ``rule+prm``,
``orm``) live in :mod:`race.prm` and follow the same interface.
"""

from __future__ import annotations

from race.meter import PhaseFlops
from race.task import verify, verify_math


class RuleReward:
    """The verifier as a reward: exact final answer after the ``####`` marker."""

    def __init__(self, math_verifier: bool = False):
        self.__name__ = "rule"
        self._verify = verify_math if math_verifier else verify

    def __call__(self, prompts, completions, answer, **_) -> list[float]:
        return [1.0 if self._verify(c, a) else 0.0 for c, a in zip(completions, answer,
                                                                   strict=True)]

    def consume(self) -> PhaseFlops:
        return PhaseFlops(0, 0, 0)

    def bound(self, rows: int, max_prompt_len: int, max_completion_len: int) -> int:
        return 0


def build_reward(spec: dict, tokenizer=None, results_dir=None):
    """The reward object for a ``rewards:`` config entry (``type`` rule, prm, rule+prm, orm)."""
    kind = spec.get("type", "rule")
    if kind == "rule":
        return RuleReward(math_verifier=spec.get("verifier", "task") == "math")
    if kind in ("prm", "rule+prm", "orm"):
        from race.prm import build_model_reward

        return build_model_reward(spec, tokenizer=tokenizer, results_dir=results_dir)
    raise ValueError(f"rewards: unknown type {kind!r} (known: rule, prm, rule+prm, orm)")
