"""The targets: every target of one loaded snapshot, each with its own ``eval`` FLOP ledger
(the targets, their intervals and what each is charged are described in
:mod:`race.evaluation.eval_job`)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from race.core.engines import DECODE_DEFAULT
from race.core.specs import EvalSpec
from race.data.task import (
    FAILURES,
    VERIFIERS,
    Record,
    failure_kind,
    is_arithmetic,
    math_answer,
    problem_of,
)
from race.evaluation.metrics import (
    best_index,
    bootstrap_interval,
    majority_index,
    mean,
    pass_at_k,
    wilson,
)
from race.evaluation.snapshot import Snapshot
from race.flops import analytic as flops
from race.flops.meter import PhaseFlops, static_prefill_keys
from race.policy.generation import length_order

#: Seed salts: each sampled draw has its own random stream (see race.evaluation.eval_job).
_SALT = {"pool": 3, "prm_bon": 4, "native_reward": 5, "sampled_pass1": 6}

ZERO = PhaseFlops(0, 0, 0)


# --------------------------------------------------------------------------- results


def add_flops(*parts: PhaseFlops) -> PhaseFlops:
    return PhaseFlops(sum(p.model for p in parts), sum(p.executed for p in parts),
                      sum(p.tokens for p in parts))


def flops_json(p: PhaseFlops) -> dict[str, int]:
    return {"model": int(p.model), "executed": int(p.executed), "tokens": int(p.tokens)}


@dataclass
class TargetResult:
    """One target: value, 95% interval, its n, and its eval ledger (generation + scoring)."""

    acc: float | None  # accuracy (or mean reward for native_reward); None when skipped
    lo: float | None
    hi: float | None
    n: int  # prompts the value and interval are computed over
    samples: int = 0  # completions generated for it
    interval: str | None = None  # "wilson" | "bootstrap"
    correct: int | None = None  # binary targets: prompts scored correct
    generation: PhaseFlops = ZERO
    scoring: PhaseFlops = ZERO
    wall_s: float = 0.0
    skipped: str | None = None  # why the target did not run
    details: dict = field(default_factory=dict)  # the target's own settings

    @property
    def flops(self) -> PhaseFlops:
        return add_flops(self.generation, self.scoring)

    @classmethod
    def skip(cls, reason: str) -> TargetResult:
        return cls(None, None, None, 0, skipped=reason)

    def to_json(self) -> dict:
        return {
            "acc": self.acc, "lo": self.lo, "hi": self.hi, "n": self.n,
            "samples": self.samples, "interval": self.interval, "correct": self.correct,
            "flops": flops_json(self.flops),
            "flops_parts": {"generation": flops_json(self.generation),
                            "scoring": flops_json(self.scoring)},
            "wall_s": round(self.wall_s, 4), "skipped": self.skipped, "details": self.details,
        }


def _binary_result(correct: list[bool], details: dict, **kw) -> TargetResult:
    """One 0/1 outcome per prompt: the rate, its Wilson interval, and the outcomes themselves
    in prompt order (``details["correct_per_prompt"]``: two policies scored on the same
    prompts are compared pairwise on them, race.analysis.frontier)."""
    n, c = len(correct), int(sum(correct))
    lo, hi = wilson(c, n)
    details = {**details, "correct_per_prompt": [int(v) for v in correct]}
    return TargetResult(c / n, lo, hi, n, interval="wilson", correct=c, details=details, **kw)


# --------------------------------------------------------------------------- FLOPs


def batch_flops(arch: flops.Arch, batches, lora: flops.LoraSpec | None = None,
                attn_implementation: str = "sdpa") -> PhaseFlops:
    """Generation FLOPs of ``race.policy.generation`` batches, from the shapes they really ran
    (a static cache's length included: every decode attends to all of it, the prefill too but
    for SDPA on an unpadded batch, race.flops.meter.static_prefill_keys)."""
    attention = "full" if attn_implementation == "eager" else "sdpa"
    model = executed = tokens = 0
    for b in batches:
        model += flops.batch_generate_flops(arch, b.prompt_lens, b.completion_lens, lora=lora)
        executed += flops.batch_generate_flops(
            arch, b.prompt_lens, b.completion_lens, executed=True, lora=lora,
            padded_prompt_len=b.padded_prompt_len, generated_width=b.new_tokens_run,
            cache_len=b.cache_len, prefill_keys=static_prefill_keys(
                b.prompt_lens, b.padded_prompt_len, b.cache_len, attention))
        tokens += sum(b.completion_lens)
    return PhaseFlops(model, executed, tokens)


def rebatched_flops(arch: flops.Arch, rows: Sequence[tuple[int, int]], batch_size: int,
                    lora: flops.LoraSpec | None = None, *, cache_len: int | None = None,
                    attn_implementation: str = "sdpa") -> PhaseFlops:
    """Generation FLOPs of ``rows`` = (prompt_len, completion_len) generated on their own.

    Rows are batched as ``generate`` batches them (sorted by prompt length, ties in row order,
    ``batch_size`` at a time), each batch left-padded to its longest prompt and decoding until
    its longest completion (what ``generate`` would run for these lengths), with a static cache
    of ``cache_len`` positions where the pool they come from had one. Model FLOPs do not
    depend on the batching.
    """
    ordered = [rows[i] for i in length_order([p for p, _ in rows])]
    batches = []
    for start in range(0, len(ordered), batch_size):
        chunk = ordered[start:start + batch_size]
        prompts, completions = [p for p, _ in chunk], [g for _, g in chunk]
        batches.append(_Shapes(prompts, completions, max(prompts), max(completions), cache_len))
    return batch_flops(arch, batches, lora, attn_implementation)


@dataclass
class _Shapes:
    """The fields of race.policy.generation.GenerationBatch that FLOPs need."""

    prompt_lens: list[int]
    completion_lens: list[int]
    padded_prompt_len: int
    new_tokens_run: int
    cache_len: int | None = None


# --------------------------------------------------------------------------- answers


def _math_key(completion: str) -> float | None:
    """The final number :func:`race.data.task.math_answer` reads, rounded to the 1e-6 that
    :func:`race.data.task.verify_math` compares to, so that equal answers vote together."""
    value = math_answer(completion)
    return None if value is None else round(value, 6)


def verifier(name: str) -> tuple[Callable[[str, str], bool], Callable[[str], Any]]:
    """(is the completion correct, its final-answer key for majority voting) for a verifier
    (race.data.task.VERIFIERS; a math answer rounded, :func:`_math_key`)."""
    is_correct, answer = VERIFIERS[name]
    return is_correct, _math_key if name == "math" else answer


# --------------------------------------------------------------------------- sampling


@dataclass
class SamplePool:
    """``per_prompt`` sampled completions for each record, in sampling order."""

    records: list[Record]
    per_prompt: int
    texts: list[list[str]]  # [prompt][sample]
    rows: list[list[tuple[int, int]]]  # [prompt][sample] -> (prompt_len, completion_len)
    batches: list  # race.policy.generation.GenerationBatch
    wall_s: float

    def prefix_rows(self, m: int, n_prompts: int | None = None) -> list[tuple[int, int]]:
        return [r for group in self.rows[:n_prompts] for r in group[:m]]

    def head(self, n_prompts: int, m: int) -> SamplePool:
        """The first ``m`` samples of the first ``n_prompts`` prompts (``batches`` stay the
        whole pool's: they are what ran)."""
        return SamplePool(self.records[:n_prompts], m, [t[:m] for t in self.texts[:n_prompts]],
                          [r[:m] for r in self.rows[:n_prompts]], self.batches, self.wall_s)


class Evaluator:
    """Runs the targets of one snapshot. ``prm``: an object with ``score(prompts, completions,
    aggregate)`` and ``consume()`` (or None); ``reward``: a TRL-style reward function with
    ``consume()`` (or None): a missing one skips its target, with the reason recorded.
    ``engine``: the rollout engine that decodes (race.core.engines; an EvalJob's engine)."""

    def __init__(self, snapshot: Snapshot, eval_in: list[Record], eval_ood: list[Record],
                 spec: EvalSpec, *, prm=None, reward=None, engine: str = DECODE_DEFAULT):
        self.snap, self.spec, self.engine = snapshot, spec, engine
        self.eval_in, self.eval_ood = eval_in, eval_ood
        self.prm, self.reward = prm, reward
        self.is_correct, self.answer_key = verifier(spec.verifier)
        self.executed_total = ZERO  # what really ran (a shared pool counted once)
        self._sampled_pool: SamplePool | None = None  # sampled_pass1's, shared by native_reward

    # ------------------------------------------------------------------ plumbing
    def _generate(self, prompts: list[str], *, max_new_tokens: int, samples: int = 1,
                  temperature: float | None = None, salt: int = 0):
        from race.policy.generation import generate

        return generate(self.snap.model, self.snap.tokenizer, prompts, engine=self.engine,
                        max_new_tokens=max_new_tokens, batch_size=self.spec.batch_size,
                        do_sample=temperature is not None,
                        temperature=1.0 if temperature is None else float(temperature),
                        seed=self.spec.seed * 1009 + salt, num_return_sequences=samples)

    def _flops(self, batches) -> PhaseFlops:
        """:func:`batch_flops` of batches this snapshot generated."""
        return batch_flops(self.snap.arch, batches, self.snap.lora,
                           self.spec.attn_implementation)

    def _charge(self, part: PhaseFlops) -> PhaseFlops:
        self.executed_total = add_flops(self.executed_total, part)
        return part

    def sample_pool(self, records: list[Record], per_prompt: int, *, max_new_tokens: int,
                    temperature: float, salt: int) -> SamplePool:
        t0 = time.perf_counter()
        gens = self._generate([r.prompt for r in records], max_new_tokens=max_new_tokens,
                              samples=per_prompt, temperature=temperature, salt=salt)
        m = per_prompt
        pool = SamplePool(records, m, [gens.texts[i * m:(i + 1) * m] for i in range(len(records))],
                          [gens.rows[i * m:(i + 1) * m] for i in range(len(records))],
                          gens.batches, time.perf_counter() - t0)
        self._charge(self._flops(gens.batches))
        return pool

    def pool_flops(self, pool: SamplePool, m: int, n_prompts: int | None = None) -> PhaseFlops:
        """The generation a target using the first ``m`` samples of the first ``n_prompts``
        prompts (None: all) needs alone."""
        if m == pool.per_prompt and n_prompts in (None, len(pool.records)):
            return self._flops(pool.batches)
        return rebatched_flops(self.snap.arch, pool.prefix_rows(m, n_prompts),
                               self.spec.batch_size, self.snap.lora,
                               cache_len=max((b.cache_len or 0 for b in pool.batches),
                                             default=0) or None,
                               attn_implementation=self.spec.attn_implementation)

    # ------------------------------------------------------------------ targets
    def pass1(self, records: list[Record], max_new_tokens: int) -> TargetResult:
        """Greedy pass@1 on ``records``."""
        t0 = time.perf_counter()
        gens = self._generate([r.prompt for r in records], max_new_tokens=max_new_tokens)
        correct = [self.is_correct(t, r.answer) for t, r in zip(gens.texts, records, strict=True)]
        gen = self._charge(self._flops(gens.batches))
        return _binary_result(correct, samples=len(records), generation=gen,
                              wall_s=time.perf_counter() - t0,
                              details={"max_new_tokens": max_new_tokens, "decoding": "greedy"})

    def maj_k(self, pool: SamplePool) -> TargetResult:
        t0 = time.perf_counter()
        k = self.spec.k
        correct = []
        for record, texts in zip(pool.records, pool.texts, strict=True):
            pick = majority_index([self.answer_key(t) for t in texts[:k]])
            correct.append(pick is not None and self.is_correct(texts[pick], record.answer))
        return _binary_result(correct, samples=k * len(pool.records),
                              generation=self.pool_flops(pool, k),
                              wall_s=pool.wall_s + time.perf_counter() - t0,
                              details=self._sampling_details(k, pool))

    def prm_bon(self, pool: SamplePool) -> TargetResult:
        t0 = time.perf_counter()
        n = self.spec.bon_n
        prompts = [r.prompt for r in pool.records for _ in range(n)]
        completions = [t for texts in pool.texts for t in texts[:n]]
        _consume(self.prm)  # start the scorer's ledger at zero
        scores = [float(s) for s in self.prm.score(prompts, completions,
                                                   aggregate=self.spec.prm_aggregate)]
        if len(scores) != len(completions):
            raise ValueError(f"PRM returned {len(scores)} scores for {len(completions)} "
                             "completions")
        scoring = self._charge(_consume(self.prm))
        correct = []
        for i, record in enumerate(pool.records):
            group = completions[i * n:(i + 1) * n]
            pick = best_index(scores[i * n:(i + 1) * n])
            correct.append(self.is_correct(group[pick], record.answer))
        details = self._sampling_details(n, pool)
        details.update(prm=getattr(self.prm, "name", None), aggregate=self.spec.prm_aggregate)
        return _binary_result(correct, samples=n * len(pool.records),
                              generation=self.pool_flops(pool, n), scoring=scoring,
                              wall_s=pool.wall_s + time.perf_counter() - t0, details=details)

    def _training_pool(self, n_prompts: int, per_prompt: int,
                       target: str) -> tuple[list[Record], SamplePool]:
        """``per_prompt`` samples of the first ``n_prompts`` eval-in prompts at the training
        temperature, on ``target``'s own random stream."""
        records = self.eval_in[:n_prompts]
        return records, self.sample_pool(records, per_prompt,
                                         max_new_tokens=self.spec.max_new_tokens,
                                         temperature=self.spec.train_temperature,
                                         salt=_SALT[target])

    def sampled_pass1(self) -> TargetResult:
        """Sampled pass@1 at the training temperature, as mean@k over ``sampled_prompts``
        prompts: the accuracy the policy's own samples reach (what GRPO optimises), resolved
        to a few points by k samples per prompt. Its interval is the cluster bootstrap over
        prompts. Details: pass@k (unbiased) from the same samples, the share of samples with a
        well-formed answer line, the correct samples per prompt, and (arithmetic task) the share
        per failure kind."""
        s = self.spec
        k = s.sampled_k
        records, pool = self._training_pool(s.sampled_prompts, k, "sampled_pass1")
        self._sampled_pool = pool
        t0 = time.perf_counter()
        groups = [[float(self.is_correct(t, r.answer)) for t in texts]
                  for r, texts in zip(records, pool.texts, strict=True)]
        lo, hi = bootstrap_interval(groups, reps=s.bootstrap_reps, seed=s.seed)
        texts = [t for group in pool.texts for t in group]
        details = {
            "samples_per_prompt": k, "temperature": s.train_temperature,
            "max_new_tokens": s.max_new_tokens,
            f"pass@{k}": mean([pass_at_k(k, int(sum(g)), k) for g in groups]),
            "format_valid": mean([self.answer_key(t) is not None for t in texts]),
            # Correct samples per prompt, in eval-in order: what a paired comparison of two
            # policies on the same prompts needs (race.analysis.frontier).
            "correct_per_prompt": [int(sum(g)) for g in groups],
        }
        if all(is_arithmetic(r) for r in records):
            kinds = [failure_kind(problem_of(r), t)
                     for r, group in zip(records, pool.texts, strict=True) for t in group]
            details["failures"] = {f: kinds.count(f) / len(kinds) for f in FAILURES}
        return TargetResult(
            mean([v for g in groups for v in g]), lo, hi, len(records), samples=len(texts),
            interval="bootstrap", correct=int(sum(map(sum, groups))),
            generation=self._flops(pool.batches),
            wall_s=pool.wall_s + time.perf_counter() - t0, details=details)

    def _native_pool(self) -> tuple[SamplePool, PhaseFlops]:
        """native_reward's samples and the generation it is charged. With ``share_samples``,
        and when sampled_pass1 drew at least as many prompts and samples at the same
        temperature, its pool's head (charged as if generated alone, like maj_k's prefix);
        otherwise a pool of its own."""
        s = self.spec
        n, m = min(s.native_prompts, len(self.eval_in)), s.native_samples
        shared = self._sampled_pool
        if (s.share_samples and shared is not None and len(shared.records) >= n
                and shared.per_prompt >= m):
            return shared.head(n, m), self.pool_flops(shared, m, n)
        _, pool = self._training_pool(n, m, "native_reward")
        return pool, self._flops(pool.batches)

    def native_reward(self) -> TargetResult:
        """The mean training reward of the policy's own samples at the training temperature
        (for a PRM reward: what the policy may have learnt to please), over ``native_prompts``
        prompts x ``native_samples``. Its interval is the cluster bootstrap over prompts."""
        s = self.spec
        m = s.native_samples
        pool, generation = self._native_pool()
        records = pool.records
        t0 = time.perf_counter()
        _consume(self.reward)
        completions = [t for texts in pool.texts for t in texts]
        values = [float(v) for v in self.reward(
            prompts=[r.prompt for r in records for _ in range(m)], completions=completions,
            answer=[r.answer for r in records for _ in range(m)])]
        if len(values) != len(completions) or not all(math.isfinite(v) for v in values):
            raise ValueError("the training reward must return one finite float per completion")
        scoring = self._charge(_consume(self.reward))
        groups = [values[i * m:(i + 1) * m] for i in range(len(records))]
        lo, hi = bootstrap_interval(groups, reps=s.bootstrap_reps, seed=s.seed)
        return TargetResult(
            mean(values), lo, hi, len(records), samples=len(values), interval="bootstrap",
            generation=generation, scoring=scoring, wall_s=pool.wall_s + time.perf_counter() - t0,
            details={"samples_per_prompt": m, "temperature": s.train_temperature,
                     "max_new_tokens": s.max_new_tokens,
                     "reward": getattr(self.reward, "__name__", type(self.reward).__name__)})

    def _sampling_details(self, m: int, pool: SamplePool) -> dict:
        """``pool_samples_per_prompt`` > ``samples_per_prompt``: the target used a prefix of a
        shared pool (and is charged its own samples only)."""
        return {"samples_per_prompt": m, "pool_samples_per_prompt": pool.per_prompt,
                "temperature": self.spec.temperature, "max_new_tokens": self.spec.max_new_tokens}

    # ------------------------------------------------------------------ orchestration
    def _bon_runs(self) -> bool:
        return "prm_bon" in self.spec.targets and self.prm is not None

    def _sampled_targets(self) -> dict[str, TargetResult]:
        """maj_k and prm_bon, from one shared pool or from one pool each."""
        s = self.spec
        records = self.eval_in[:s.sample_prompts]
        want = {}
        if "maj_k" in s.targets:
            want["maj_k"] = s.k
        if self._bon_runs():
            want["prm_bon"] = s.bon_n
        run = {"maj_k": self.maj_k, "prm_bon": self.prm_bon}
        out: dict[str, TargetResult] = {}
        if s.share_samples and want:
            pool = self.sample_pool(records, max(want.values()), max_new_tokens=s.max_new_tokens,
                                    temperature=s.temperature, salt=_SALT["pool"])
            return {t: run[t](pool) for t in want}
        for t, m in want.items():
            pool = self.sample_pool(records, m, max_new_tokens=s.max_new_tokens,
                                    temperature=s.temperature,
                                    salt=_SALT["pool" if t == "maj_k" else "prm_bon"])
            out[t] = run[t](pool)
        return out

    def run(self) -> dict[str, TargetResult]:
        """Every target of ``spec.targets``, in that order."""
        s = self.spec
        results: dict[str, TargetResult] = {}
        if not self.eval_in:  # nothing to evaluate on: say so rather than divide by zero
            results.update({t: TargetResult.skip("eval_in has no records") for t in s.targets
                            if t != "ood_pass1"})
        if "ood_pass1" in s.targets and not self.eval_ood:
            results["ood_pass1"] = TargetResult.skip("eval_ood has no records")
        if "in_pass1" in s.targets and "in_pass1" not in results:
            results["in_pass1"] = self.pass1(self.eval_in[:s.n_in], s.max_new_tokens)
        if "ood_pass1" in s.targets and "ood_pass1" not in results:
            results["ood_pass1"] = self.pass1(self.eval_ood[:s.n_ood], s.max_new_tokens_ood)
        if "sampled_pass1" in s.targets and "sampled_pass1" not in results:
            results["sampled_pass1"] = self.sampled_pass1()
        if self.eval_in:
            results.update(self._sampled_targets())
        if "prm_bon" in s.targets and "prm_bon" not in results:  # no PRM
            results["prm_bon"] = TargetResult.skip(
                "no PRM given (EvalJob.prm, or eval.prm)")
        if "native_reward" in s.targets and "native_reward" not in results:
            results["native_reward"] = self.native_reward() if self.reward is not None else (
                TargetResult.skip("no training reward given (EvalJob.reward)"))
        return {t: results[t] for t in s.targets}


def _consume(scorer) -> PhaseFlops:
    """A scorer's FLOPs since its last ``consume()`` (0 for a scorer without a ledger)."""
    consume = getattr(scorer, "consume", None)
    return consume() if consume is not None else ZERO
