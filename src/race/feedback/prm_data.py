"""PRM data: the scoring text format, step-labelled examples, corruptions, balance and AUC.

**Text format** (shared by training and scoring, :func:`prm_text`): the prompt as it is, then
every non-empty line of the completion (stripped, as :func:`race.data.task.split_steps` reads it)
followed by the step separator. A last line without a separator gets one appended; blank lines
are dropped. The label / score of step i sits on the separator token that closes line i -- the
answer line ``#### n`` is a step like the others. The prompt itself may contain separators
(``"17+8=?\\n"``): the step positions are the *last* n separator tokens of the text.

**Labels** come from the task's step checker (:func:`race.data.task.step_labels`), never from a
model: 1 = the step is correct, 0 = it is not. Each wrong line also carries its error family
(:func:`race.data.task.line_errors`), so the held-out AUC can be split by family
(:func:`error_metrics`).

**Examples** have a ``source``: ``sample`` (a completion sampled from a base policy: realistic
mistakes), ``reference`` (the task's solution: every step correct) or ``corrupt`` (the reference
with one synthetic mistake, :func:`corrupt`). Synthetic examples are only added to bring the
step positive rate of the samples into a band (:func:`balance`).

Nothing here imports torch: the functions work on strings, token-id lists and floats.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from race.core.engines import DECODE_DEFAULT
from race.data.task import (
    LINE_ERRORS,
    MARKER,
    STEP_SEPARATOR,
    Problem,
    line_errors,
    split_steps,
    step_labels,
)
from race.policy.optim import IGNORE_INDEX  # no loss, no metric: every non-separator position

#: Default probe for a PRM's vocabulary: every character the arithmetic task's text uses.
PROBE_TEXT = "0123456789+-=?#\n 12+3=15\n15-4=11\n#### 11\n"

SOURCES = ("sample", "reference", "corrupt")


def prm_text(prompt: str, completion: str, separator: str = STEP_SEPARATOR) -> tuple[str, int]:
    """(text a PRM scores, number of steps n): see the module docstring. ``n == 0`` for a
    completion without a non-blank line (the text is then the prompt alone)."""
    lines = split_steps(completion)
    return prompt + "".join(line + separator for line in lines), len(lines)


def step_positions(ids: Sequence[int], separator_id: int, n_steps: int) -> list[int]:
    """Token positions of the ``n_steps`` step separators: the last ``n_steps`` occurrences of
    ``separator_id`` in ``ids``. Raises ``ValueError`` when there are fewer (a tokenizer that
    merges the separator into a neighbouring token cannot mark steps)."""
    if n_steps == 0:
        return []
    found = [i for i, t in enumerate(ids) if t == separator_id]
    if len(found) < n_steps:
        raise ValueError(f"the text has {n_steps} steps but only {len(found)} separator tokens "
                         f"(id {separator_id}): the tokenizer merges the step separator with "
                         "neighbouring characters")
    return found[-n_steps:]


# --------------------------------------------------------------------------- examples


@dataclass(frozen=True)
class Example:
    """One labelled completion: ``labels[i]`` is the checker's verdict on line i, ``errors[i]``
    the error family of a wrong line i (None where the line is correct; ``()`` when unknown)."""

    prompt: str
    completion: str
    labels: tuple[bool, ...]
    source: str = "sample"
    errors: tuple[str | None, ...] = ()


def labelled(problem: Problem, prompt: str, completion: str, source: str) -> Example | None:
    """The example for one completion, or None when it has no line (nothing to label)."""
    labels = step_labels(problem, completion)
    if not labels:
        return None
    return Example(prompt, completion, tuple(labels), source,
                   tuple(line_errors(problem, completion)))


def positive_rate(examples: Sequence[Example]) -> float:
    """Fraction of correct steps over all steps of ``examples`` (nan without steps)."""
    steps = sum(len(e.labels) for e in examples)
    return sum(sum(e.labels) for e in examples) / steps if steps else float("nan")


def dedupe(examples: Sequence[Example]) -> list[Example]:
    """Drop repeats of the same (prompt, PRM text): a sampled solution repeated k times would
    weigh k times in the loss and in the metrics. First occurrence kept, order preserved."""
    seen: set[tuple[str, str]] = set()
    out = []
    for e in examples:
        key = (e.prompt, prm_text(e.prompt, e.completion)[0])
        if key not in seen:
            seen.add(key)
            out.append(e)
    return out


def encode(tokenizer, example: Example, separator: str = STEP_SEPARATOR
           ) -> tuple[list[int], list[int]]:
    """(input ids, per-position labels) of one example: the step label (0/1) at each step's
    separator token, :data:`IGNORE_INDEX` everywhere else. No special tokens are added."""
    text, n = prm_text(example.prompt, example.completion, separator)
    if n != len(example.labels):
        raise ValueError(f"{n} lines but {len(example.labels)} labels for {example.completion!r}")
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    sep_id = tokenizer.convert_tokens_to_ids(separator)
    targets = [IGNORE_INDEX] * len(ids)
    for pos, ok in zip(step_positions(ids, sep_id, n), example.labels, strict=True):
        targets[pos] = int(ok)
    return ids, targets


# --------------------------------------------------------------------------- synthetic data


def _format(lines: list[tuple[int, str, int, int]], answer: int) -> str:
    body = [f"{a}{op}{b}={c}" for a, op, b, c in lines]
    return STEP_SEPARATOR.join(body + [f"{MARKER} {answer}"])


def _nudge(value: int, rng: random.Random) -> int:
    """A different non-negative integer near ``value`` (a plausible slip: off by 1-10)."""
    delta = rng.choice([d for d in range(-10, 11) if d and value + d >= 0])
    return value + delta


def corrupt(problem: Problem, rng: random.Random) -> str:
    """The reference solution with one synthetic mistake, of a kind drawn uniformly from:

    ``result``  a step's stated result is off (an arithmetic slip; the next step, which starts
                from the true value, is then inconsistent too);
    ``operand`` a step uses a wrong second operand, with correct arithmetic on it;
    ``answer``  the final answer differs from the last step's result;
    ``skip``    one step is left out (only for chains of two or more steps).

    Which lines are wrong is decided by :func:`race.data.task.step_labels`, not here.
    """
    value, lines = problem.start, []
    for (op, b), c in zip(problem.ops, problem.results(), strict=True):
        lines.append((value, op, b, c))
        value = c
    kinds = ["result", "operand", "answer"] + (["skip"] if len(lines) > 1 else [])
    kind = rng.choice(kinds)
    answer = problem.answer
    i = rng.randrange(len(lines))
    a, op, b, c = lines[i]
    if kind == "result":
        lines[i] = (a, op, b, _nudge(c, rng))
    elif kind == "operand":
        b2 = _nudge(b, rng)
        c2 = a + b2 if op == "+" else a - b2
        lines[i] = (a, op, b2, c2) if c2 >= 0 else (a, op, b, _nudge(c, rng))
    elif kind == "answer":
        answer = _nudge(answer, rng)
    else:
        del lines[i]
    return _format(lines, answer)


def balance(samples: Sequence[Example], pool: Sequence[tuple[Problem, str, str]],
            rng: random.Random, target: float, tolerance: float) -> list[Example]:
    """Synthetic examples that bring the step positive rate of ``samples`` to ``target``.

    Rule: when the samples' positive rate is within ``target ± tolerance`` nothing is added.
    Above the band (sampled mistakes too rare), corrupted references (:func:`corrupt`) are
    added; below it (mistakes too common), reference solutions are added -- one per prompt of
    ``pool`` (``(problem, prompt, reference)`` triples) in a seeded order, stopping as soon as
    the rate of samples + additions crosses ``target`` or every prompt got one.
    """
    rate = positive_rate(samples)
    if not samples or abs(rate - target) <= tolerance:
        return []
    too_positive = rate > target
    pos = sum(sum(e.labels) for e in samples)
    steps = sum(len(e.labels) for e in samples)
    order = list(range(len(pool)))
    rng.shuffle(order)
    added: list[Example] = []
    for i in order:
        problem, prompt, reference = pool[i]
        if too_positive:
            example = labelled(problem, prompt, corrupt(problem, rng), "corrupt")
        else:
            example = labelled(problem, prompt, reference, "reference")
        if example is None:
            continue
        added.append(example)
        pos += sum(example.labels)
        steps += len(example.labels)
        if (pos / steps <= target) if too_positive else (pos / steps >= target):
            break
    return added


def split_prompts(prompts: Sequence[str], heldout_frac: float, seed: int) -> set[str]:
    """The held-out prompts: a seeded ``heldout_frac`` share of the distinct prompts (at least
    one when there are two or more, so both sides are non-empty)."""
    distinct = sorted(set(prompts))
    random.Random(seed).shuffle(distinct)
    n = int(round(len(distinct) * heldout_frac))
    if heldout_frac > 0 and len(distinct) > 1:
        n = min(max(n, 1), len(distinct) - 1)
    return set(distinct[:n])


# --------------------------------------------------------------------------- metrics


def roc_auc(scores: Sequence[float], labels: Sequence[int]) -> float:
    """Area under the ROC curve = P(score of a random positive > score of a random negative),
    ties counting one half (the Mann-Whitney statistic with average ranks). ``nan`` when either
    class is absent."""
    if len(scores) != len(labels):
        raise ValueError(f"{len(scores)} scores but {len(labels)} labels")
    n_pos = sum(1 for y in labels if y)
    n_neg = len(labels) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):  # average rank over each run of tied scores (ranks are 1-based)
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    rank_sum = sum(r for r, y in zip(ranks, labels, strict=True) if y)
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def step_metrics(scores: Sequence[float], labels: Sequence[int], threshold: float = 0.5) -> dict:
    """Step-level AUC, accuracy of ``score > threshold`` (predicted correct), number of steps
    and positive rate of a set of scored steps."""
    n = len(labels)
    correct = sum((s > threshold) == bool(y) for s, y in zip(scores, labels, strict=True))
    return {
        "auc": roc_auc(scores, labels),
        "accuracy": correct / n if n else float("nan"),
        "steps": n,
        "positive_rate": sum(1 for y in labels if y) / n if n else float("nan"),
    }


def error_metrics(scores: Sequence[float], labels: Sequence[int],
                  errors: Sequence[str | None]) -> dict[str, dict]:
    """Per error family F of :data:`race.data.task.LINE_ERRORS`: ``auc``, the AUC
    (:func:`roc_auc`) of ``scores`` separating the correct steps from the wrong steps of family
    F only (nan when there is no step of F or no correct step), and ``steps``, the number of
    wrong steps of family F. ``errors[i]`` is step i's family (None for a correct step)."""
    if not len(scores) == len(labels) == len(errors):
        raise ValueError(f"{len(scores)} scores, {len(labels)} labels, {len(errors)} errors")
    correct = [s for s, y in zip(scores, labels, strict=True) if y]
    out = {}
    for family in LINE_ERRORS:
        wrong = [s for s, y, e in zip(scores, labels, errors, strict=True)
                 if not y and e == family]
        out[family] = {"auc": roc_auc(correct + wrong, [1] * len(correct) + [0] * len(wrong)),
                       "steps": len(wrong)}
    return out


def step_errors(examples: Sequence[Example]) -> list[str | None]:
    """Per labelled step of ``examples`` (in order), its error family (None: correct)."""
    out: list[str | None] = []
    for e in examples:
        if len(e.errors) != len(e.labels):
            raise ValueError(f"{len(e.labels)} labels but {len(e.errors)} error families for "
                             f"{e.completion!r} (build examples with labelled())")
        out += e.errors
    return out


# --------------------------------------------------------------------------- building the set


def shared_tokenizer(policies: Sequence[str]):
    """The base policies' common tokenizer: a PRM reads text the way the policies write it,
    so they must share one vocabulary (``ValueError`` otherwise)."""
    from race.data.tokenizer import load_tokenizer

    tokenizers = [load_tokenizer(p) for p in policies]
    for p, tok in zip(policies[1:], tokenizers[1:], strict=True):
        if tok.get_vocab() != tokenizers[0].get_vocab():
            raise ValueError(f"base policies {policies[0]} and {p} use different tokenizers: "
                             "a PRM is trained on one vocabulary")
    return tokenizers[0]


def sample_completions(policies: Sequence[str], prompts: list[str], *, per_prompt: int,
                       max_new_tokens: int, temperature: float, seed: int, batch_size: int,
                       device: str = "cpu", engine: str = DECODE_DEFAULT):
    """``per_prompt`` sampled completions per prompt from every base policy (grouped by
    prompt, policies in order) and the generation FLOPs of sampling as a ``PhaseFlops``:
    KV-cached ``generate`` (:func:`race.flops.analytic.batch_generate_flops`), model = real
    prompt and completion tokens, executed = the left-padded batches as they ran; tokens =
    completion tokens generated. The policies sample on ``device`` (``cpu`` or ``cuda``),
    decoded by the rollout engine ``engine`` (race.core.engines)."""
    import torch

    from race.data.tokenizer import load_tokenizer
    from race.flops import analytic as flops
    from race.flops.meter import PhaseFlops, static_prefill_keys
    from race.policy.generation import generate
    from race.policy.ladder import load_policy

    grouped: list[list[str]] = [[] for _ in prompts]
    model = executed = tokens = 0
    for policy_dir in policies:
        policy = load_policy(policy_dir, dtype=torch.float32).to(device)
        gens = generate(policy, load_tokenizer(policy_dir), prompts, engine=engine, do_sample=True,
                        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed,
                        num_return_sequences=per_prompt, batch_size=batch_size)
        arch = flops.Arch.from_config(policy.config)
        eager = getattr(policy.config, "_attn_implementation", None) == "eager"
        attention = "full" if eager else "sdpa"
        for b in gens.batches:
            model += flops.batch_generate_flops(arch, b.prompt_lens, b.completion_lens)
            executed += flops.batch_generate_flops(
                arch, b.prompt_lens, b.completion_lens, executed=True,
                padded_prompt_len=b.padded_prompt_len, generated_width=b.new_tokens_run,
                cache_len=b.cache_len, prefill_keys=static_prefill_keys(
                    b.prompt_lens, b.padded_prompt_len, b.cache_len, attention))
            tokens += sum(b.completion_lens)
        for i in range(len(prompts)):
            grouped[i] += gens.texts[i * per_prompt:(i + 1) * per_prompt]
    return grouped, PhaseFlops(model, executed, tokens)


def build_examples(records, samples: Sequence[Sequence[str]], *, target: float,
                   tolerance: float, seed: int) -> list[Example]:
    """Label the samples of each record (step checker), drop repeats, and add synthetic
    references or corruptions only when the samples' step positive rate is outside
    ``target ± tolerance`` (:func:`balance`). ``records``: task records with start/ops."""
    from race.data.task import problem_of

    problems = [problem_of(r) for r in records]
    drawn = [labelled(p, r.prompt, c, "sample")
             for p, r, texts in zip(problems, records, samples, strict=True) for c in texts]
    sampled = dedupe([e for e in drawn if e is not None])
    pool = [(p, r.prompt, r.solution or p.solution)
            for p, r in zip(problems, records, strict=True)]
    extra = balance(sampled, pool, random.Random(seed + 1), target, tolerance)
    return dedupe(sampled + extra)


def answer_line_flags(examples: Sequence[Example]) -> list[bool]:
    """Per labelled step of ``examples`` (in order), whether it is an answer line ``####``."""
    return [line.startswith(MARKER) for e in examples for line in split_steps(e.completion)]
