"""Reward systems with TRL's ``reward_funcs`` signature, each keeping its own FLOP ledger.

A reward function is called as ``f(prompts=..., completions=..., completion_ids=..., **columns)``
and returns one float per completion. Every reward object here also exposes

* ``consume() -> PhaseFlops``: model / executed FLOPs and tokens spent since the last call
  (the trainer's meter charges them to the ``reward`` phase of the step);
* ``bound(rows, max_prompt_len, max_completion_len) -> int``: the most model FLOPs one call on
  ``rows`` completions can cost (the budget stop needs it before the step runs).

``rule`` is the task verifier: 1.0 for a verified final answer, else 0.0; it costs 0 FLOPs (its
wall time is still recorded by the meter). The learned feedback models (``prm``, ``rule+prm``,
``orm``) are :class:`FeedbackReward` over a model of :mod:`race.feedback.models`, with the same
interface.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from race.core.schema import check
from race.data.task import VERIFIERS, answer_reader
from race.feedback.scores import as_text
from race.flops.meter import PhaseFlops, RewardReads


class RuleReward:
    """The verifier as a reward: exact final answer after the ``####`` marker."""

    def __init__(self, verifier: str = "task"):
        self.__name__ = "rule"
        self._verify = VERIFIERS[verifier][0]

    def __call__(self, prompts, completions, answer, **_) -> list[float]:
        return [1.0 if self._verify(c, a) else 0.0 for c, a in zip(completions, answer,
                                                                   strict=True)]

    def consume(self) -> PhaseFlops:
        return PhaseFlops(0, 0, 0)

    #: A rule reads no model: nothing to reserve for it.
    reads = None


def build_reward(spec: dict, tokenizer=None, results_dir=None, *, load=None):
    """The reward object for a ``rewards:`` config entry (``type`` rule, prm, rule+prm, orm);
    ``load``: how a feedback model is loaded (:func:`build_model_reward`)."""
    kind = spec.get("type", "rule")
    if kind == "rule":
        return RuleReward(spec.get("verifier", "task"))
    if kind in ("prm", "rule+prm", "orm"):
        return build_model_reward(spec, tokenizer=tokenizer, results_dir=results_dir, load=load)
    raise ValueError(f"rewards: unknown type {kind!r} (known: rule, prm, rule+prm, orm)")


# --------------------------------------------------------------------------- rewards


class FeedbackReward:
    """A TRL reward function backed by a feedback model (``prm``, ``rule+prm``, ``orm``).

    ``prm``: reward = aggregate(step scores). ``orm``: reward = the ORM's score.
    ``rule+prm``: reward = (1 - w) * rule + w * aggregate(step scores), rule = 1.0 for a
    verified final answer else 0.0, ``w`` = ``weight`` in [0, 1] -- so the reward stays in
    [0, 1]. With ``w = 0`` the PRM is not run (and nothing is charged). Every reward is a
    probability-like value in [0, 1]; a completion without steps scores 0.0 from the model.

    A PRM's step scores count only for a completion that states a final answer (as the
    verifier reads one, :func:`race.data.task.answer_reader`); one that states none scores 0.0
    from the PRM. Unlike the textbook aggregate of step scores, this gate is needed because a
    PRM scores the lines a completion has and its training labels (race.data.task.step_labels)
    never mark a line that is missing: without it, stopping after a first correct step scored
    higher than a full solution under the default study's strong PRM (0.83 against 0.70, min
    aggregate), a hack any PRM-rewarded policy could find. The ORM reads the whole completion
    and is not gated.
    """

    def __init__(self, model, kind: str, *, aggregate: str = "min",
                 weight: float = 1.0, verifier: str = "task"):
        check("rewards", "aggregate", aggregate)  # the config's rules, from the schema
        check("rewards", "weight", weight)
        self.model, self.kind, self.aggregate, self.weight = model, kind, aggregate, weight
        self.__name__ = kind
        self.rule = None
        if kind == "rule+prm":
            self.rule = RuleReward(verifier)
        self._answer = answer_reader(verifier) if kind != "orm" else None

    def _model_scores(self, prompts: list, completions: list[str]) -> list[float]:
        """The feedback model's aggregate per completion; 0.0 for a completion that states no
        final answer where the model is a PRM (class docstring)."""
        scores = self.model.score(prompts, completions, aggregate=self.aggregate)
        if self._answer is None:
            return scores
        return [s if self._answer(c) is not None else 0.0
                for s, c in zip(scores, completions, strict=True)]

    def __call__(self, prompts, completions, answer=None, **kwargs) -> list[float]:
        prompts, completions = list(prompts), [as_text(c) for c in completions]
        if self.rule is None:
            return self._model_scores(prompts, completions)
        if answer is None:
            raise ValueError("rule+prm reward: needs the dataset's answer column")
        rule = self.rule(prompts, completions, answer)
        if self.weight == 0.0:
            return rule
        return combine(rule, self._model_scores(prompts, completions), self.weight)

    def consume(self) -> PhaseFlops:
        return self.model.consume()

    @property
    def reads(self) -> RewardReads | None:
        """What the reward model reads of a completion (None: at weight 0 it is not run)."""
        if self.rule is not None and self.weight == 0.0:
            return None
        return self.model.reads


def combine(rule: Sequence[float], model: Sequence[float], weight: float) -> list[float]:
    """``rule+prm``: (1 - weight) * rule + weight * model, elementwise."""
    return [(1.0 - weight) * r + weight * m for r, m in zip(rule, model, strict=True)]


def build_model_reward(spec: dict, tokenizer=None, results_dir: str | Path | None = "results",
                       *, load=None):
    """The reward object for a ``rewards:`` entry of type ``prm``, ``rule+prm`` or ``orm``.

    Keys: ``prm`` / ``orm`` (ladder name, directory or hub id), ``aggregate`` (min),
    ``weight`` (rule+prm, 0.5), ``verifier`` (task | math: the rule+prm verifier, and how a
    PRM reward reads whether a completion states a final answer), and the model options
    :data:`race.core.specs.MODEL_OPTIONS`. ``tokenizer`` is the policy's (vocabulary probe
    and ``bound``). ``load``: called as ``load(reference, results_dir, policy_tokenizer=,
    **options)``; None is :func:`race.feedback.loading.load_feedback_model` (a fresh model), an
    evaluation job passes its cache (one model shared by the rewards and scorers that name it).
    """
    kind = spec.get("type")
    if kind not in ("prm", "rule+prm", "orm"):
        raise ValueError(f"rewards: {kind!r} is not a feedback-model reward (prm, rule+prm, orm)")
    key = "orm" if kind == "orm" else "prm"
    if not spec.get(key):
        raise ValueError(f"rewards: a {kind} reward needs the {key!r} key")
    # Imported here: a rule reward must not pay for torch and transformers.
    from race.core.specs import MODEL_OPTIONS
    from race.feedback.loading import load_feedback_model

    load = load or load_feedback_model
    model = load(spec[key], results_dir or "results", policy_tokenizer=tokenizer,
                 **{k: spec[k] for k in MODEL_OPTIONS if k in spec})
    if (model.kind == "orm") != (kind == "orm"):
        raise ValueError(f"rewards: {spec[key]!r} is a{'n ORM' if model.kind == 'orm' else ' PRM'}"
                         f", not usable as a {kind} reward")
    return FeedbackReward(model, kind, aggregate=spec.get("aggregate", "min"),
                          weight=1.0 if kind != "rule+prm" else float(spec.get("weight", 0.5)),
                          verifier=spec.get("verifier", "task"))
