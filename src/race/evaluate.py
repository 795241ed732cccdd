"""Evaluation targets of a policy snapshot, each with its own ``eval`` FLOP ledger.

Targets (fractions in [0, 1], each with a 95% interval and its n):

in_pass1       greedy pass@1 on eval-in (Wilson interval)
ood_pass1      greedy pass@1 on eval-OOD, longer chains than training (Wilson)
maj_k          k sampled completions per prompt, majority final answer (ties: the answer
               sampled first among the tied; unparseable answers never win) (Wilson)
prm_bon        n sampled completions reranked by a PRM, accuracy of the top-scored one (ties:
               the earliest sample) (Wilson); skipped, with the reason recorded, without a PRM
native_reward  the cell's training reward on held-out eval-in prompts: mean over sampled
               completions at the sampling temperature (bootstrap interval)

FLOPs. A snapshot's LoRA adapter is merged into the base weights before evaluation, so no
adapter FLOPs are charged (merging is what a deployment would do). Each target's ledger is the
compute that target needs by itself: generation (model FLOPs: real tokens, causal; executed:
the padded batch, decoding until its longest row stops) plus PRM / reward-model scoring. Samples
are drawn once per target. None of this is charged to the training budget.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from race import flops
from race.task import extract_answer, load_jsonl, verify


# --------------------------------------------------------------------------- metric logic

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (well behaved at 0/n and n/n)."""
    import math

    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def bootstrap_mean(values: list[float], seed: int = 0, reps: int = 2000) -> tuple[float, float]:
    """Percentile bootstrap interval of a mean (for rewards that are not 0/1)."""
    import random

    if not values:
        return (0.0, 0.0)
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choice(values) for _ in range(n)) / n for _ in range(reps))
    return (means[int(0.025 * reps)], means[min(reps - 1, int(0.975 * reps))])


def majority(answers: list[int | None]) -> int | None:
    """Most frequent final answer; unparseable answers (None) never win; ties go to the
    answer sampled first among the tied."""
    from collections import Counter

    counts = Counter(a for a in answers if a is not None)
    if not counts:
        return None
    top = max(counts.values())
    return next(a for a in answers if a is not None and counts[a] == top)


def best_of_n(scores: list[float]) -> int:
    """Index of the highest score; ties go to the earliest sample."""
    if not scores:
        raise ValueError("best_of_n needs at least one score")
    return scores.index(max(scores))


@dataclass(frozen=True)
class EvalSpec:
    """Config keys under ``eval:`` (defaults sized for the 2-core default study)."""

    targets: tuple[str, ...] = ("in_pass1", "ood_pass1", "maj_k", "prm_bon", "native_reward")
    n_in: int = 100
    n_ood: int = 100
    k: int = 4  # maj@k samples per prompt
    n_bon: int = 4  # best-of-n samples per prompt
    n_sample_prompts: int = 32  # prompts for maj@k and best-of-n
    native_prompts: int = 32
    native_samples: int = 2
    temperature: float = 1.0
    max_new_tokens: int = 40
    max_new_tokens_ood: int = 64
    batch_size: int = 64
    seed: int = 0
    prm: str | None = None  # PRM used by prm_bon (a ladder name, a path or a hub id)
    aggregate: str = "min"  # how the PRM's step scores rank a sample

    @classmethod
    def from_config(cls, section: dict) -> EvalSpec:
        known = {f for f in cls.__dataclass_fields__}
        values = {k: v for k, v in section.items() if k in known}
        if "targets" in values:
            values["targets"] = tuple(values["targets"])
        return cls(**values)


@dataclass
class TargetResult:
    acc: float | None
    lo: float | None
    hi: float | None
    n: int
    flops: dict = field(default_factory=lambda: {"model": 0, "executed": 0, "tokens": 0})
    wall_s: float = 0.0
    skipped: str | None = None


def _generation_flops(arch, gens) -> dict:
    model = executed = tokens = 0
    for b in gens.batches:
        model += flops.batch_generate_flops(arch, b.prompt_lens, b.completion_lens)
        executed += flops.batch_generate_flops(
            arch, b.prompt_lens, b.completion_lens, executed=True,
            padded_prompt_len=b.padded_prompt_len, generated_width=b.new_tokens_run)
        tokens += sum(b.completion_lens)
    return {"model": model, "executed": executed, "tokens": tokens}


def _add(ledger: dict, phase) -> dict:
    return {"model": ledger["model"] + phase.model, "executed": ledger["executed"] +
            phase.executed, "tokens": ledger["tokens"] + phase.tokens}


class Evaluator:
    """Evaluates one loaded policy on the task splits."""

    def __init__(self, model, tokenizer, data_dir: str | Path, spec: EvalSpec):
        self.model, self.tok, self.spec = model, tokenizer, spec
        self.arch = flops.Arch.from_config(model.config)
        self.eval_in = load_jsonl(Path(data_dir) / "eval_in.jsonl")
        self.eval_ood = load_jsonl(Path(data_dir) / "eval_ood.jsonl")

    def _generate(self, prompts, *, sample: bool, n: int, max_new: int, salt: int):
        from race.generation import generate

        return generate(self.model, self.tok, prompts, max_new_tokens=max_new,
                        batch_size=self.spec.batch_size, do_sample=sample,
                        temperature=self.spec.temperature, seed=self.spec.seed * 101 + salt,
                        num_return_sequences=n)

    def greedy(self, records, max_new: int, salt: int) -> TargetResult:
        t0 = time.perf_counter()
        gens = self._generate([r.prompt for r in records], sample=False, n=1, max_new=max_new,
                              salt=salt)
        correct = sum(verify(t, r.answer) for t, r in zip(gens.texts, records, strict=True))
        lo, hi = wilson(correct, len(records))
        return TargetResult(correct / len(records), lo, hi, len(records),
                            _generation_flops(self.arch, gens), time.perf_counter() - t0)

    def _samples(self, n: int, salt: int):
        records = self.eval_in[: self.spec.n_sample_prompts]
        gens = self._generate([r.prompt for r in records], sample=True, n=n,
                              max_new=self.spec.max_new_tokens, salt=salt)
        groups = [gens.texts[i * n:(i + 1) * n] for i in range(len(records))]
        return records, groups, gens

    def maj_k(self) -> TargetResult:
        t0 = time.perf_counter()
        records, groups, gens = self._samples(self.spec.k, salt=3)
        correct = sum(str(majority([extract_answer(t) for t in g])) == r.answer
                      for g, r in zip(groups, records, strict=True))
        lo, hi = wilson(correct, len(records))
        return TargetResult(correct / len(records), lo, hi, len(records),
                            _generation_flops(self.arch, gens), time.perf_counter() - t0)

    def prm_bon(self, prm) -> TargetResult:
        if prm is None:
            return TargetResult(None, None, None, 0, skipped="no PRM configured (eval.prm)")
        t0 = time.perf_counter()
        records, groups, gens = self._samples(self.spec.n_bon, salt=4)
        prm.consume()
        correct = 0
        for g, r in zip(groups, records, strict=True):
            scores = prm.score([r.prompt] * len(g), g, aggregate=self.spec.aggregate)
            correct += verify(g[best_of_n(scores)], r.answer)
        ledger = _add(_generation_flops(self.arch, gens), prm.consume())
        lo, hi = wilson(correct, len(records))
        return TargetResult(correct / len(records), lo, hi, len(records), ledger,
                            time.perf_counter() - t0)

    def native_reward(self, reward) -> TargetResult:
        if reward is None:
            return TargetResult(None, None, None, 0, skipped="no training reward given")
        t0 = time.perf_counter()
        records = self.eval_in[: self.spec.native_prompts]
        n = self.spec.native_samples
        gens = self._generate([r.prompt for r in records], sample=True, n=n,
                              max_new=self.spec.max_new_tokens, salt=5)
        reward.consume()
        prompts = [r.prompt for r in records for _ in range(n)]
        answers = [r.answer for r in records for _ in range(n)]
        values = [float(v) for v in reward(prompts=prompts, completions=gens.texts,
                                           answer=answers)]
        ledger = _add(_generation_flops(self.arch, gens), reward.consume())
        lo, hi = bootstrap_mean(values, seed=self.spec.seed)
        return TargetResult(sum(values) / len(values), lo, hi, len(values), ledger,
                            time.perf_counter() - t0)

    def run(self, prm=None, reward=None) -> dict[str, TargetResult]:
        s = self.spec
        jobs = {
            "in_pass1": lambda: self.greedy(self.eval_in[: s.n_in], s.max_new_tokens, 1),
            "ood_pass1": lambda: self.greedy(self.eval_ood[: s.n_ood], s.max_new_tokens_ood, 2),
            "maj_k": self.maj_k,
            "prm_bon": lambda: self.prm_bon(prm),
            "native_reward": lambda: self.native_reward(reward),
        }
        unknown = [t for t in s.targets if t not in jobs]
        if unknown:
            raise ValueError(f"eval.targets: unknown target(s) {unknown}")
        return {t: jobs[t]() for t in s.targets}


def load_snapshot(policy: str, adapter: str | None, attn_implementation: str = "sdpa"):
    """Base policy (+ a LoRA adapter merged into it) and its tokenizer."""
    import torch

    from race.char_tokenizer import load_tokenizer
    from race.ladder import load_policy

    model = load_policy(policy, attn_implementation=attn_implementation, dtype=torch.float32)
    if adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
    model.eval()
    return model, load_tokenizer(policy)


def write_json_atomic(path: str | Path, payload: dict) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(payload, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def evaluate_snapshot(policy: str, adapter: str | None, data_dir: str, out: str,
                      spec: EvalSpec, prm=None, reward=None) -> dict:
    t0 = time.perf_counter()
    model, tok = load_snapshot(policy, adapter)
    results = Evaluator(model, tok, data_dir, spec).run(prm=prm, reward=reward)
    payload = {
        "policy": policy,
        "adapter": adapter,
        "adapter_merged": adapter is not None,
        "spec": asdict(spec),
        "targets": {t: asdict(r) for t, r in results.items()},
        "eval_flops_total": {k: sum(r.flops[k] for r in results.values())
                             for k in ("model", "executed", "tokens")},
        "wall_s": time.perf_counter() - t0,
    }
    write_json_atomic(out, payload)
    return payload
