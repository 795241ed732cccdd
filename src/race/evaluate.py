"""Evaluation of one policy snapshot: every target with its own ``eval`` FLOP ledger.

A snapshot is a base policy, or a base policy plus the LoRA adapter of a budget rung
(``results/runs/<cell>/budget~<B>/``). Targets (accuracies are fractions in [0, 1]; each comes
with a 95% interval and its ``n`` = the number of prompts the interval is computed over):

``in_pass1``       greedy pass@1 on the first ``n_in`` eval-in prompts (Wilson interval).
``ood_pass1``      greedy pass@1 on the first ``n_ood`` eval-OOD prompts -- longer chains than
                   training, hence the larger ``max_new_tokens_ood`` (Wilson).
``maj_k``          ``k`` completions sampled at ``temperature`` for each of the first
                   ``sample_prompts`` eval-in prompts; the majority final answer is scored.
                   Unparseable answers never vote; ties go to the earliest-sampled answer among
                   the tied (:func:`race.metrics.majority_index`) (Wilson).
``prm_bon``        ``bon_n`` completions per prompt (the same prompts) reranked by a PRM: the
                   highest aggregated step score is scored, ties to the earliest sample
                   (:func:`race.metrics.best_index`) (Wilson). Without a PRM the target is
                   skipped and the reason recorded -- never a made-up number.
``native_reward``  the cell's training reward (a ``rewards:`` entry through
                   :func:`race.rewards.build_reward`) on the first ``native_prompts`` eval-in
                   prompts, ``native_samples`` completions each at the training temperature:
                   the mean reward, with a cluster-bootstrap interval over prompts.

FLOPs. Every number is charged to the ``eval`` phase and kept apart from the training budget.
Per target: ``model`` (real tokens, causal attention: the budget convention of race.flops),
``executed`` (what the kernels ran: left-padded prompts, full attention blocks, every row of a
batch decoding until its longest row stops) and ``tokens`` (completion tokens generated plus
tokens a scorer read). Generation is charged from the shapes race.generation returns; PRM and
reward-model scoring from the scorer's ``consume()``; the rule verifier costs 0.

* A merged adapter (``merge_adapter: true``, the default: what a deployment does) costs
  nothing extra, so no LoRA FLOPs are charged; unmerged, every forward is charged the adapter's
  ``2·r·(d_in + d_out)`` per token per adapted module.
* Each target's ledger is the compute that target needs by itself. With ``share_samples``
  (default) maj@k and best-of-n draw ONE pool of ``max(k, bon_n)`` samples per prompt and use
  its first ``k`` / ``bon_n``; a target that uses only a prefix is charged the generation of
  its own samples batched on their own (model FLOPs exact per row; executed FLOPs of batches of
  ``batch_size`` of those rows, each at its longest prompt and completion). What the job
  really ran -- the pool once -- is reported once in ``executed_total``; ``charged_total`` is
  the sum of the per-target ledgers.

Determinism: generation is reseeded per batch from ``seed`` and a fixed per-target salt (so a
target's samples do not depend on which other targets run) and the bootstrap is seeded; with
one torch thread the same inputs give an identical ``eval.json`` except its ``wall_s`` fields.

``eval.json`` (format ``race-eval/1``, written atomically; FLOPs are JSON integers)::

    format, phase ("eval"), policy, adapter, adapter_merged, lora_flops_charged,
    rung {step, budget, train_model_flops}      (a base policy: step 0)
    settings {every EvalSpec field, prm, reward, sample_sharing}
    targets {<target>: {acc, lo, hi, n, samples, interval, correct,
                        flops {model, executed, tokens},
                        flops_parts {generation {...}, scoring {...}},
                        wall_s, skipped, details}}
    charged_total {model, executed, tokens}     (sum of the per-target ledgers)
    executed_total {model, executed, tokens}    (what the job ran: a shared pool once)
    wall_s

A skipped target has ``acc = lo = hi = None``, ``n = 0``, zero FLOPs and ``skipped`` = why.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from race import flops
from race.meter import PhaseFlops
from race.metrics import best_index, bootstrap_interval, majority_index, mean, wilson
from race.task import MARKER, Record, extract_answer, load_jsonl, verify, verify_math

TARGETS: tuple[str, ...] = ("in_pass1", "ood_pass1", "maj_k", "prm_bon", "native_reward")
EVAL_FORMAT = "race-eval/1"
PRM_AGGREGATES = ("min", "last", "product")

#: Seed salts: each sampled draw has its own random stream (see the module docstring).
_SALT = {"pool": 3, "prm_bon": 4, "native_reward": 5}

ZERO = PhaseFlops(0, 0, 0)


# --------------------------------------------------------------------------- settings


@dataclass(frozen=True)
class EvalSpec:
    """The config keys under ``eval:``. Defaults fit the 2-core default study (one evaluate
    job of a ladder policy takes seconds: see the report of issue #6)."""

    targets: tuple[str, ...] = TARGETS  # which targets run (empty / null: all)
    n_in: int = 200  # eval-in prompts for in_pass1 (capped by the split size)
    n_ood: int = 200  # eval-OOD prompts for ood_pass1
    max_new_tokens: int = 48  # completion cap on eval-in (3 steps ~ 35 tokens + EOS)
    max_new_tokens_ood: int = 64  # on eval-OOD (5 steps ~ 53 tokens + EOS)
    sample_prompts: int = 64  # eval-in prompts for maj_k and prm_bon
    k: int = 8  # maj@k samples per prompt
    bon_n: int = 8  # best-of-n samples per prompt
    share_samples: bool = True  # one pool of max(k, bon_n) samples for maj_k and prm_bon
    temperature: float = 1.0  # sampling temperature of maj_k and prm_bon
    native_prompts: int = 64  # eval-in prompts for native_reward
    native_samples: int = 4  # completions per prompt for native_reward
    native_temperature: float = 1.0  # the training temperature (race evaluate
    # --train-temperature overrides it with the cell's)
    prm: str | None = None  # PRM of prm_bon: a PRM ladder name, a path or a hub id
    prm_aggregate: str = "min"  # step scores -> one score: min | last | product
    verifier: str = "task"  # task (the arithmetic verifier) | math (numeric final answer)
    batch_size: int = 256  # rows per generate call (tiny models: fewer, larger calls are faster)
    seed: int = 0
    merge_adapter: bool = True  # merge LoRA before evaluating (then no LoRA FLOPs are charged)
    attn_implementation: str = "sdpa"  # sdpa | eager
    bootstrap_reps: int = 2000  # bootstrap replicates of native_reward's interval

    def __post_init__(self) -> None:
        targets = TARGETS if not self.targets else tuple(self.targets)
        unknown = [t for t in targets if t not in TARGETS]
        if unknown:
            raise ValueError(f"eval.targets: unknown target(s) {unknown} (known: "
                             f"{', '.join(TARGETS)})")
        if len(set(targets)) != len(targets):
            raise ValueError(f"eval.targets: duplicate target in {list(targets)}")
        object.__setattr__(self, "targets", targets)
        for name in ("n_in", "n_ood", "max_new_tokens", "max_new_tokens_ood", "sample_prompts",
                     "k", "bon_n", "native_prompts", "native_samples", "batch_size",
                     "bootstrap_reps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"eval.{name}: must be an integer >= 1, got {value!r}")
        for name in ("temperature", "native_temperature"):
            if not float(getattr(self, name)) > 0:
                raise ValueError(f"eval.{name}: must be > 0, got {getattr(self, name)!r}")
        choices = {"prm_aggregate": PRM_AGGREGATES, "verifier": ("task", "math"),
                   "attn_implementation": ("sdpa", "eager")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"eval.{name}: must be one of {allowed}, got "
                                 f"{getattr(self, name)!r}")

    @classmethod
    def from_config(cls, section: dict | None) -> EvalSpec:
        """From the ``eval:`` mapping; an unknown key is an error naming it (a typo must not
        silently fall back to a default)."""
        section = dict(section or {})
        known = [f.name for f in fields(cls)]
        for key in section:
            if key not in known:
                raise ValueError(f"eval.{key}: unknown key (known: {', '.join(known)})")
        if section.get("targets") is not None:
            section["targets"] = tuple(section["targets"])
        else:
            section.pop("targets", None)
        return cls(**section)


# --------------------------------------------------------------------------- results


def _add(*parts: PhaseFlops) -> PhaseFlops:
    return PhaseFlops(sum(p.model for p in parts), sum(p.executed for p in parts),
                      sum(p.tokens for p in parts))


def _flops_json(p: PhaseFlops) -> dict[str, int]:
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
        return _add(self.generation, self.scoring)

    @classmethod
    def skip(cls, reason: str) -> TargetResult:
        return cls(None, None, None, 0, skipped=reason)

    def to_json(self) -> dict:
        return {
            "acc": self.acc, "lo": self.lo, "hi": self.hi, "n": self.n,
            "samples": self.samples, "interval": self.interval, "correct": self.correct,
            "flops": _flops_json(self.flops),
            "flops_parts": {"generation": _flops_json(self.generation),
                            "scoring": _flops_json(self.scoring)},
            "wall_s": round(self.wall_s, 4), "skipped": self.skipped, "details": self.details,
        }


def _binary_result(correct: list[bool], **kw) -> TargetResult:
    n, c = len(correct), int(sum(correct))
    lo, hi = wilson(c, n)
    return TargetResult(c / n, lo, hi, n, interval="wilson", correct=c, **kw)


# --------------------------------------------------------------------------- the snapshot


@dataclass
class Snapshot:
    """A loaded policy and what its FLOPs depend on."""

    model: Any
    tokenizer: Any
    arch: flops.Arch
    lora: flops.LoraSpec | None  # adapters charged on every forward (None: none or merged)
    policy: str
    adapter: str | None
    merged: bool


def lora_spec_of(adapter_dir: str | Path) -> flops.LoraSpec:
    """The rank and target modules of a saved PEFT LoRA adapter (``adapter_config.json``)."""
    cfg = json.loads((Path(adapter_dir) / "adapter_config.json").read_text())
    targets = cfg.get("target_modules") or ()
    targets = (targets,) if isinstance(targets, str) else tuple(sorted(targets))
    return flops.LoraSpec(int(cfg["r"]), targets)


def load_snapshot(policy: str | Path, adapter: str | Path | None = None, *, merge: bool = True,
                  attn_implementation: str = "sdpa") -> Snapshot:
    """Base policy (float32, no remote code) + optionally the LoRA adapter in ``adapter``.

    ``merge``: fold the adapter into the base weights (``merge_and_unload``); otherwise keep it
    as a separate PEFT module and charge its FLOPs. The tokenizer is the base policy's.
    """
    import torch

    from race.char_tokenizer import load_tokenizer
    from race.ladder import load_policy

    model = load_policy(str(policy), attn_implementation=attn_implementation,
                        dtype=torch.float32)
    arch = flops.Arch.from_config(model.config)
    lora = None
    if adapter is not None:
        from peft import PeftModel

        if not (Path(adapter) / "adapter_config.json").exists():
            raise FileNotFoundError(f"no LoRA adapter (adapter_config.json) in {adapter}")
        model = PeftModel.from_pretrained(model, str(adapter), is_trainable=False)
        if merge:
            model = model.merge_and_unload()
        else:
            lora = lora_spec_of(adapter)
    model.eval()
    return Snapshot(model, load_tokenizer(policy), arch, lora, str(policy),
                    None if adapter is None else str(adapter), adapter is not None and merge)


# --------------------------------------------------------------------------- FLOPs


def batch_flops(arch: flops.Arch, batches, lora: flops.LoraSpec | None = None) -> PhaseFlops:
    """Generation FLOPs of ``race.generation`` batches, from the shapes they really ran."""
    model = executed = tokens = 0
    for b in batches:
        model += flops.batch_generate_flops(arch, b.prompt_lens, b.completion_lens, lora=lora)
        executed += flops.batch_generate_flops(
            arch, b.prompt_lens, b.completion_lens, executed=True, lora=lora,
            padded_prompt_len=b.padded_prompt_len, generated_width=b.new_tokens_run)
        tokens += sum(b.completion_lens)
    return PhaseFlops(model, executed, tokens)


def rebatched_flops(arch: flops.Arch, rows: Sequence[tuple[int, int]], batch_size: int,
                    lora: flops.LoraSpec | None = None) -> PhaseFlops:
    """Generation FLOPs of ``rows`` = (prompt_len, completion_len) generated on their own.

    Rows are batched in order, ``batch_size`` at a time, each batch left-padded to its longest
    prompt and decoding until its longest completion (what ``generate`` would run for these
    lengths). Model FLOPs do not depend on the batching.
    """
    batches = []
    for start in range(0, len(rows), batch_size):
        chunk = rows[start:start + batch_size]
        prompts, completions = [p for p, _ in chunk], [g for _, g in chunk]
        batches.append(_Shapes(prompts, completions, max(prompts), max(completions)))
    return batch_flops(arch, batches, lora)


@dataclass
class _Shapes:
    """The fields of race.generation.GenerationBatch that FLOPs need."""

    prompt_lens: list[int]
    completion_lens: list[int]
    padded_prompt_len: int
    new_tokens_run: int


# --------------------------------------------------------------------------- answers


def _math_answer(completion: str) -> float | None:
    """The final number as :func:`race.task.verify_math` reads it (after the last marker, else
    the last number in the text)."""
    text = completion.rsplit(MARKER, 1)[1] if MARKER in completion else completion
    numbers = re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)
    if not numbers:
        return None
    try:
        value = float(numbers[0 if MARKER in completion else -1].replace(",", ""))
    except ValueError:
        return None
    return round(value, 6)  # verify_math compares to 1e-6: equal keys vote together


def verifier(name: str) -> tuple[Callable[[str, str], bool], Callable[[str], Any]]:
    """(is the completion correct, its final-answer key for majority voting) for a verifier."""
    if name == "math":
        return verify_math, _math_answer
    return verify, extract_answer


# --------------------------------------------------------------------------- sampling


@dataclass
class SamplePool:
    """``per_prompt`` sampled completions for each record, in sampling order."""

    records: list[Record]
    per_prompt: int
    texts: list[list[str]]  # [prompt][sample]
    rows: list[list[tuple[int, int]]]  # [prompt][sample] -> (prompt_len, completion_len)
    batches: list  # race.generation.GenerationBatch
    wall_s: float

    def prefix_rows(self, m: int) -> list[tuple[int, int]]:
        return [r for group in self.rows for r in group[:m]]


class Evaluator:
    """Runs the targets of one snapshot. ``prm``: an object with ``score(prompts, completions,
    aggregate)`` and ``consume()`` (or None); ``reward``: a TRL-style reward function with
    ``consume()`` (or None): a missing one skips its target, with the reason recorded."""

    def __init__(self, snapshot: Snapshot, eval_in: list[Record], eval_ood: list[Record],
                 spec: EvalSpec, *, prm=None, reward=None):
        self.snap, self.spec = snapshot, spec
        self.eval_in, self.eval_ood = eval_in, eval_ood
        self.prm, self.reward = prm, reward
        self.is_correct, self.answer_key = verifier(spec.verifier)
        self.executed_total = ZERO  # what really ran (a shared pool counted once)

    # ------------------------------------------------------------------ plumbing
    def _generate(self, prompts: list[str], *, max_new_tokens: int, samples: int = 1,
                  temperature: float | None = None, salt: int = 0):
        from race.generation import generate

        return generate(self.snap.model, self.snap.tokenizer, prompts,
                        max_new_tokens=max_new_tokens, batch_size=self.spec.batch_size,
                        do_sample=temperature is not None,
                        temperature=1.0 if temperature is None else float(temperature),
                        seed=self.spec.seed * 1009 + salt, num_return_sequences=samples)

    def _charge(self, part: PhaseFlops) -> PhaseFlops:
        self.executed_total = _add(self.executed_total, part)
        return part

    def sample_pool(self, records: list[Record], per_prompt: int, *, max_new_tokens: int,
                    temperature: float, salt: int) -> SamplePool:
        t0 = time.perf_counter()
        gens = self._generate([r.prompt for r in records], max_new_tokens=max_new_tokens,
                              samples=per_prompt, temperature=temperature, salt=salt)
        flat = [(p, g) for b in gens.batches
                for p, g in zip(b.prompt_lens, b.completion_lens, strict=True)]
        m = per_prompt
        pool = SamplePool(records, m, [gens.texts[i * m:(i + 1) * m] for i in range(len(records))],
                          [flat[i * m:(i + 1) * m] for i in range(len(records))], gens.batches,
                          time.perf_counter() - t0)
        self._charge(batch_flops(self.snap.arch, gens.batches, self.snap.lora))
        return pool

    def pool_flops(self, pool: SamplePool, m: int) -> PhaseFlops:
        """The generation a target using the first ``m`` samples per prompt needs alone."""
        if m == pool.per_prompt:
            return batch_flops(self.snap.arch, pool.batches, self.snap.lora)
        return rebatched_flops(self.snap.arch, pool.prefix_rows(m), self.spec.batch_size,
                               self.snap.lora)

    # ------------------------------------------------------------------ targets
    def pass1(self, records: list[Record], max_new_tokens: int) -> TargetResult:
        """Greedy pass@1 on ``records``."""
        t0 = time.perf_counter()
        gens = self._generate([r.prompt for r in records], max_new_tokens=max_new_tokens)
        correct = [self.is_correct(t, r.answer) for t, r in zip(gens.texts, records, strict=True)]
        gen = self._charge(batch_flops(self.snap.arch, gens.batches, self.snap.lora))
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

    def native_reward(self) -> TargetResult:
        s = self.spec
        records = self.eval_in[:s.native_prompts]
        m = s.native_samples
        pool = self.sample_pool(records, m, max_new_tokens=s.max_new_tokens,
                                temperature=s.native_temperature, salt=_SALT["native_reward"])
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
            generation=batch_flops(self.snap.arch, pool.batches, self.snap.lora),
            scoring=scoring, wall_s=pool.wall_s + time.perf_counter() - t0,
            details={"samples_per_prompt": m, "temperature": s.native_temperature,
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
        if self.eval_in:
            results.update(self._sampled_targets())
        if "prm_bon" in s.targets and "prm_bon" not in results:  # no PRM
            results["prm_bon"] = TargetResult.skip(
                "no PRM given (race evaluate --prm, or eval.prm)")
        if "native_reward" in s.targets and "native_reward" not in results:
            results["native_reward"] = self.native_reward() if self.reward is not None else (
                TargetResult.skip("no training reward given (race evaluate --reward-json)"))
        return {t: results[t] for t in s.targets}


def _consume(scorer) -> PhaseFlops:
    """A scorer's FLOPs since its last ``consume()`` (0 for a scorer without a ledger)."""
    consume = getattr(scorer, "consume", None)
    return consume() if consume is not None else ZERO


# --------------------------------------------------------------------------- one job


def rung_info(adapter: str | Path | None) -> dict:
    """``{step, budget, train_model_flops}`` of a rung folder (from its ledger.json); a base
    policy is step 0 with no budget. A folder without a ledger gives ``step: None``."""
    if adapter is None:
        return {"step": 0, "budget": None, "train_model_flops": 0}
    path = Path(adapter) / "ledger.json"
    if not path.exists():
        return {"step": None, "budget": None, "train_model_flops": None}
    ledger = json.loads(path.read_text())
    return {"step": int(ledger["step"]), "budget": ledger.get("budget"),
            "train_model_flops": ledger.get("model_flops")}


def _load_split(data_dir: str | Path, name: str) -> list[Record]:
    return load_jsonl(Path(data_dir) / f"{name}.jsonl")


def _resolve_prm(prm, spec: EvalSpec, results_dir: str | Path):
    """(scorer or None, description). A string is loaded with race.prm.load_prm (imported
    here: race.prm is only needed when a PRM is used)."""
    prm = spec.prm if prm is None else prm
    if prm is None or "prm_bon" not in spec.targets:
        return None, None
    if isinstance(prm, str | Path):
        from race.prm import load_prm

        return load_prm(str(prm), results_dir=str(results_dir)), str(prm)
    return prm, getattr(prm, "name", type(prm).__name__)


def _resolve_reward(reward, spec: EvalSpec, tokenizer, results_dir: str | Path):
    if reward is None or "native_reward" not in spec.targets:
        return None, None
    if isinstance(reward, dict):
        from race.rewards import build_reward

        return build_reward(reward, tokenizer=tokenizer, results_dir=str(results_dir)), reward
    return reward, getattr(reward, "__name__", type(reward).__name__)


def evaluate(policy: str | Path, data_dir: str | Path, out: str | Path | None = None,
             spec: EvalSpec | None = None, *, adapter: str | Path | None = None,
             reward: dict | Callable | None = None, prm: str | Path | Any | None = None,
             results_dir: str | Path = "results") -> dict:
    """Evaluate one snapshot on every target of ``spec``; returns (and writes to ``out``) the
    ``eval.json`` payload.

    ``reward``: a ``rewards:`` entry (dict, built with race.rewards.build_reward) or a reward
    object; ``prm``: a PRM ladder name (``results_dir/prm/size~NAME``), a path or hub id (loaded
    with race.prm.load_prm), or a scorer object; ``None`` falls back to ``spec.prm``.
    """
    t0 = time.perf_counter()
    spec = spec or EvalSpec()
    # Read only the splits the targets use (an in-distribution-only data folder is enough).
    eval_in = _load_split(data_dir, "eval_in") if set(spec.targets) - {"ood_pass1"} else []
    eval_ood = _load_split(data_dir, "eval_ood") if "ood_pass1" in spec.targets else []
    snap = load_snapshot(policy, adapter, merge=spec.merge_adapter,
                         attn_implementation=spec.attn_implementation)
    scorer, prm_name = _resolve_prm(prm, spec, results_dir)
    reward_fn, reward_desc = _resolve_reward(reward, spec, snap.tokenizer, results_dir)
    evaluator = Evaluator(snap, eval_in, eval_ood, spec, prm=scorer, reward=reward_fn)
    results = evaluator.run()
    payload = {
        "format": EVAL_FORMAT,
        "phase": "eval",  # kept apart from the training budget (race.ledger.BUDGET_PHASES)
        "policy": snap.policy,
        "adapter": snap.adapter,
        "adapter_merged": snap.merged,
        "lora_flops_charged": snap.lora is not None,
        "rung": rung_info(adapter),
        "settings": {**asdict(spec), "targets": list(spec.targets), "prm": prm_name,
                     "reward": reward_desc, "sample_sharing": _sharing_note(spec)},
        "targets": {t: r.to_json() for t, r in results.items()},
        "charged_total": _flops_json(_add(*(r.flops for r in results.values()))),
        "executed_total": _flops_json(evaluator.executed_total),
        "wall_s": 0.0,
    }
    payload["wall_s"] = round(time.perf_counter() - t0, 4)
    if out is not None:
        write_json_atomic(out, payload)
    return payload


def _sharing_note(spec: EvalSpec) -> str:
    if not spec.share_samples:
        return "maj_k and prm_bon draw their own samples; each ledger is what it ran"
    return ("maj_k and prm_bon share one pool of max(k, bon_n) samples per prompt; each target "
            "is charged the generation of its own first k / bon_n samples as if run alone "
            "(plus PRM scoring for prm_bon); executed_total counts the pool once")


def write_json_atomic(path: str | Path, payload: dict) -> Path:
    """Write JSON atomically (a reader, or a crash, never sees half a file). FLOPs stay
    JSON integers (exact at any size)."""
    from race.atomic import write_text_atomic

    return write_text_atomic(path, json.dumps(payload, indent=1, sort_keys=True) + "\n")


# --------------------------------------------------------------------------- MLflow


def eval_metrics(payload: dict) -> dict[str, float]:
    """``eval/<target>``, ``eval/<target>_lo`` and ``eval/<target>_hi`` of the targets that
    ran (a skipped target logs nothing)."""
    out: dict[str, float] = {}
    for target, r in payload["targets"].items():
        if r["acc"] is None:
            continue
        out[f"eval/{target}"] = float(r["acc"])
        out[f"eval/{target}_lo"] = float(r["lo"])
        out[f"eval/{target}_hi"] = float(r["hi"])
    return out


def _run_key(run_dir: Path) -> str:
    """The cell's run key: the part of the path after ``runs/`` (else the path itself)."""
    parts = run_dir.resolve().parts
    if "runs" in parts:
        return "/".join(parts[len(parts) - parts[::-1].index("runs"):])
    return str(run_dir)


def log_to_mlflow(payload: dict, run_dir: str | Path, mlflow_spec, study: str = "race") -> bool:
    """Log :func:`eval_metrics` to the cell's MLflow run at step = the rung's training step.

    The run is the one whose id the run folder holds (``mlflow_run_id``, written by training);
    without that file nothing is logged and False is returned (a run is never created here).
    """
    from race.tracking import RUN_ID_FILE, RunLogger

    run_dir = Path(run_dir)
    if not (run_dir / RUN_ID_FILE).exists():
        return False
    _eval_step(payload)  # a payload without a step fails before the run is touched
    logger = RunLogger(mlflow_spec, run_dir, _run_key(run_dir), study, params={})
    try:
        log_eval(logger, payload)
    finally:
        logger.finish()
    return True


def log_eval(logger, payload: dict) -> int:
    """Queue :func:`eval_metrics` of ``payload`` on ``logger`` (a race.tracking.RunLogger) at
    the rung's training step, skipping values MLflow already holds; returns how many."""
    return logger.log_new_values(_eval_step(payload), eval_metrics(payload))


def _eval_step(payload: dict) -> int:
    """The training step of the evaluated rung (where its metrics go in MLflow)."""
    step = payload["rung"]["step"]
    if step is None:
        raise ValueError(f"{payload['adapter']}: no ledger.json, so no training step to log "
                         "the evaluation at")
    return int(step)


def mlflow_spec_from_config(config: dict):
    """A race.tracking.MlflowSpec from the config's ``mlflow:`` section (experiment defaults to
    the study name, as in race.study)."""
    from race.tracking import MlflowSpec

    section = dict(config.get("mlflow") or {})
    known = {f.name for f in fields(MlflowSpec)}
    values = {k: v for k, v in section.items() if k in known and v is not None}
    values.setdefault("experiment", config.get("study") or MlflowSpec.experiment)
    return MlflowSpec(**values)


def with_overrides(spec: EvalSpec, **overrides) -> EvalSpec:
    """``spec`` with the non-None overrides applied (validated again)."""
    return replace(spec, **{k: v for k, v in overrides.items() if v is not None})
