"""The noisy teacher: seeded, controlled corruptions of the reference solutions the base
policies are fine-tuned on.

Why: RL post-training sharpens what a policy already samples (pass@k -> pass@1) and removes
execution slips; it rarely teaches a capability the base lacks. A base policy fine-tuned on
clean solutions errs by *capability* (wrong digits it would write at any temperature), which
leaves GRPO little correct behaviour to reinforce. Fine-tuned on this teacher, a policy imitates
a distribution that is right often enough to sample correct solutions, but wrong in ways
decoding exposes:

* **slips**, per step and independent (at most one per step): an *operand* slip copies the
  step's operand off by one (``17+8`` written ``17+9``), a *sign* slip applies the other
  operation (``17-8``), an *arithmetic* slip states a result off by one or two. The chain goes
  on from the stated result, and the answer line repeats the last stated result, so a slipped
  solution is consistent but wrong. A slip is only made where every number written from then
  on stays in ``[0, task.max_value]`` (the teacher never writes a number the task could not,
  so no negative one): the
  realised rate of a family is its configured rate times the share of steps where it fits
  (:func:`slip_options`; sign slips fit least often, since the task already flips operations
  at the range's edges). ``pre.json`` records what was written.
* **truncation**, the systematic failure: a chain of at least ``truncate_min_steps`` steps
  loses its last step with probability ``truncate`` (the answer line then states the
  second-to-last result). Above one half, the mode of the teacher's distribution is wrong on
  those chains: greedy decoding is wrong where sampling is sometimes right, which is exactly
  what an RL reward can fix.

A *clean* teacher (``teacher.noisy: false``) writes the reference solutions: the ablation
without any of this. Every draw comes from the caller's ``random.Random``, so a fixed seed
gives the same corruptions. The config keys live under ``teacher:`` (schema and config.yaml
say what each does); :func:`solution` is called by :mod:`race.policy.pretrain` once per
sequence fed, so each epoch sees fresh corruptions of the same prompts.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from race.core.specs import TeacherSpec
from race.data.task import MARKER, STEP_SEPARATOR, Problem

#: Slip families in the order one uniform draw picks them (one slip at most per step).
SLIPS: tuple[str, ...] = ("operand", "sign", "arithmetic")

#: Result offsets an arithmetic slip draws from.
ARITHMETIC_OFFSETS: tuple[int, ...] = (-2, -1, 1, 2)


@dataclass(frozen=True)
class Step:
    """One written step ``a<op>b=c`` and the slip it carries (None: as the problem says)."""

    a: int
    op: str
    b: int
    c: int
    slip: str | None = None

    @property
    def text(self) -> str:
        return f"{self.a}{self.op}{self.b}={self.c}"


@dataclass(frozen=True)
class TeacherSolution:
    """A written solution and what was done to it (for tests and the corruption report)."""

    steps: tuple[Step, ...]
    truncated: bool

    @property
    def text(self) -> str:
        answer = self.steps[-1].c
        return STEP_SEPARATOR.join([s.text for s in self.steps] + [f"{MARKER} {answer}"])


def _apply(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


def _stays_in_range(value: int, rest: tuple[tuple[str, int], ...], max_value: int) -> bool:
    """Whether ``value`` and every result of applying ``rest`` to it lie in [0, max_value]."""
    for op, b in ((None, 0), *rest):
        value = value if op is None else _apply(value, op, b)
        if not 0 <= value <= max_value:
            return False
    return True


def slip_options(a: int, op: str, b: int, max_value: int,
                 rest: tuple[tuple[str, int], ...] = ()) -> dict[str, list[Step]]:
    """Every slipped version of step ``a op b`` by family, keeping only those after which the
    stated result and the results of the remaining steps ``rest`` (written as the problem
    says, from the slipped value) stay in ``[0, max_value]``; an empty list: that family
    cannot slip here."""
    c = _apply(a, op, b)
    flipped = "-" if op == "+" else "+"
    candidates = {
        "operand": [Step(a, op, b2, _apply(a, op, b2), "operand") for b2 in (b - 1, b + 1)
                    if b2 >= 1],
        "sign": [Step(a, flipped, b, _apply(a, flipped, b), "sign")],
        "arithmetic": [Step(a, op, b, c + d, "arithmetic") for d in ARITHMETIC_OFFSETS],
    }
    return {family: [s for s in steps if _stays_in_range(s.c, rest, max_value)]
            for family, steps in candidates.items()}


def solution(problem: Problem, spec: TeacherSpec, rng: random.Random,
             max_value: int) -> TeacherSolution:
    """One teacher solution of ``problem`` drawn with ``rng`` (see the module docstring).

    The draws per step are fixed in number (one uniform for the family, one for the variant),
    so a change of one rate does not reshuffle the random stream of every later sequence.
    """
    ops = problem.ops
    truncated = False
    if spec.noisy and len(ops) >= spec.truncate_min_steps:
        truncated = rng.random() < spec.truncate
        if truncated:
            ops = ops[:-1]
    steps, value = [], problem.start
    for i, (op, b) in enumerate(ops):
        step = Step(value, op, b, _apply(value, op, b))
        if spec.noisy:
            family_draw, variant_draw = rng.random(), rng.random()
            edge = 0.0
            for family in SLIPS:
                edge += spec.rate(family)
                if family_draw < edge:
                    options = slip_options(value, op, b, max_value, ops[i + 1:])[family]
                    if options:
                        step = options[int(variant_draw * len(options))]
                    break
        steps.append(step)
        value = step.c
    return TeacherSolution(tuple(steps), truncated)
