"""Base policies: a short supervised "pretraining" of every ladder size on train-split solutions.

Every size sees the same data in the same order for the same token budget (a model family
trained on the same data), so base accuracy grows with size. On the arithmetic task the
solutions fed are the teacher's (:mod:`race.data.teacher`): drawn afresh for every sequence from
one seeded stream, noisy by default (slips and a systematic truncation), the references with
``teacher.noisy: false``. Tokens counted against the budget
are the real (unpadded) prompt + solution + EOS tokens fed to the model; the loss is on solution
and EOS tokens only. Deterministic for a fixed seed and thread count.

Output directory: ``model.safetensors`` + ``config.json`` (``save_pretrained``), the tokenizer,
and ``pre.json`` -- the ``pre`` ledger record (tokens, model and executed FLOPs of full
fine-tuning, wall seconds) and the base greedy accuracy on eval-in. ``pre`` FLOPs are reported,
never charged to a training cell's budget.
"""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict
from pathlib import Path

from race.core.atomic import saving_weights, write_json_atomic
from race.core.specs import PretrainSpec, TaskSpec, TeacherSpec
from race.data.task import is_arithmetic, load_jsonl, problem_of, verify
from race.data.teacher import SLIPS
from race.data.teacher import solution as teacher_solution
from race.data.tokenizer import load_tokenizer
from race.policy.optim import IGNORE_INDEX, LENGTH_GROUPS, length_groups, optimizer_step


def lr_at(step_tokens: int, spec: PretrainSpec) -> float:
    """Linear warmup then cosine decay to ``min_lr_frac`` of the peak, in tokens seen."""
    frac = min(step_tokens / spec.token_budget, 1.0)
    if frac < spec.warmup_frac:
        return spec.learning_rate * max(frac / spec.warmup_frac, 1e-3)
    progress = (frac - spec.warmup_frac) / max(1e-9, 1 - spec.warmup_frac)
    cosine = 0.5 * (1 + math.cos(math.pi * progress))
    return spec.learning_rate * (spec.min_lr_frac + (1 - spec.min_lr_frac) * cosine)


def greedy_accuracy(model, tokenizer, records, max_new_tokens: int) -> tuple[float, int]:
    """Fraction of ``records`` whose greedy completion the verifier accepts, and n (decoded
    as an evaluation job that names no engine decodes: race.core.engines.DECODE_DEFAULT)."""
    from race.core.engines import DECODE_DEFAULT
    from race.policy.generation import generate

    gens = generate(model, tokenizer, [r.prompt for r in records], engine=DECODE_DEFAULT,
                    max_new_tokens=max_new_tokens)
    correct = sum(verify(t, r.answer) for t, r in zip(gens.texts, records, strict=True))
    return correct / max(1, len(records)), len(records)


class Teacher:
    """The solutions pretraining feeds: the teacher's draw for arithmetic records (one seeded
    stream, so the same seed feeds the same corruptions to every size), else the record's own
    ``solution``. Counts what it wrote, for ``pre.json``."""

    def __init__(self, records, spec: TeacherSpec, max_value: int, seed: int):
        import random

        self.records, self.spec, self.max_value = records, spec, max_value
        self.problems = [problem_of(r) if is_arithmetic(r) else None for r in records]
        if spec.noisy and any(p is None for p in self.problems):
            raise ValueError("teacher.noisy: the training records carry no arithmetic chain "
                             "(start/ops); set teacher.noisy: false")
        self.rng = random.Random(f"teacher-{seed}")
        self.counts = {"solutions": 0, "steps": 0, "truncated": 0, "eligible_for_truncation": 0,
                       **{f"{k}_slips": 0 for k in SLIPS}}

    def solution(self, i: int) -> str:
        problem = self.problems[i]
        if problem is None or not self.spec.noisy:
            return self.records[i].solution
        drawn = teacher_solution(problem, self.spec, self.rng, self.max_value)
        c = self.counts
        c["solutions"] += 1
        c["steps"] += len(drawn.steps)
        c["truncated"] += drawn.truncated
        c["eligible_for_truncation"] += len(problem.ops) >= self.spec.truncate_min_steps
        for step in drawn.steps:
            if step.slip:
                c[f"{step.slip}_slips"] += 1
        return drawn.text


def pretrain(size: str, data_dir: str | Path, tokenizer_dir: str | Path, out_dir: str | Path,
             spec: PretrainSpec | None = None, layers: int | None = None,
             teacher: TeacherSpec | None = None, max_value: int | None = None,
             length_groups_per_batch: int = LENGTH_GROUPS, device: str = "cpu") -> dict:
    """SFT ladder size ``size`` from random init; returns the ``pre`` record (also saved).

    ``teacher`` (default: the schema's) writes the solutions (module docstring); its slips
    stay in ``[0, max_value]`` (default: the task's). ``layers`` overrides the rung's depth
    (ablations only; the study uses the ladder as is). ``length_groups_per_batch``: the
    micro-batches each batch runs as (:mod:`race.policy.optim`; 1 = the batch padded whole).
    ``device``: ``cpu`` or ``cuda`` (the weights are initialised on the CPU, so a seed gives the
    same initial model on either).
    """
    import torch

    from race.flops import analytic as flops
    from race.policy.ladder import build_ladder_model, count_parameters

    spec = spec or PretrainSpec()
    data_dir, out_dir = Path(data_dir), Path(out_dir)
    tokenizer = load_tokenizer(tokenizer_dir)
    train = load_jsonl(data_dir / "train.jsonl")
    eval_in = load_jsonl(data_dir / "eval_in.jsonl")[: spec.eval_examples]
    model = build_ladder_model(size, tokenizer, seed=spec.seed, layers=layers).to(device)
    arch = flops.Arch.from_config(model.config)
    params, non_embedding = count_parameters(model)

    teacher = teacher or TeacherSpec()
    writer = Teacher(train, teacher, TaskSpec().max_value if max_value is None else max_value,
                     spec.seed)
    eos = tokenizer.eos_token
    prompt_ids = [tokenizer(r.prompt, add_special_tokens=False)["input_ids"] for r in train]
    gen = torch.Generator().manual_seed(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate,
                            weight_decay=spec.weight_decay, betas=(0.9, 0.95))
    model.train()
    tokens = model_flops = exec_flops = steps = 0
    t0 = time.perf_counter()
    order = torch.randperm(len(train), generator=gen).tolist()
    cursor = 0
    next_report = spec.token_budget / 20
    while tokens < spec.token_budget:
        if cursor + spec.batch_size > len(order):
            order, cursor = torch.randperm(len(train), generator=gen).tolist(), 0
        idx = order[cursor:cursor + spec.batch_size]
        cursor += spec.batch_size
        targets = [writer.solution(i) + eos for i in idx]
        target_ids = tokenizer(targets, add_special_tokens=False)["input_ids"]
        seqs = [prompt_ids[i] + t for i, t in zip(idx, target_ids, strict=True)]
        rows = [(s, [IGNORE_INDEX] * len(prompt_ids[i]) + s[len(prompt_ids[i]):])
                for i, s in zip(idx, seqs, strict=True)]
        batches = length_groups(rows, tokenizer.pad_token_id, length_groups_per_batch)
        loss = optimizer_step(model, opt, lr_at(tokens, spec), batches)
        steps += 1
        real = [len(s) for s in seqs]
        tokens += sum(real)
        # Full fine-tuning, logits at every position (the eager HF forward computes them all).
        model_flops += sum(flops.train_flops(arch, n) for n in real)
        exec_flops += sum(b.rows * flops.train_flops(arch, b.width, attention="full")
                          for b in batches)
        if tokens >= next_report or tokens >= spec.token_budget:  # ~20 lines per run
            next_report += spec.token_budget / 20
            print(f"race pretrain: {tokens:,} / {spec.token_budget:,} tokens "
                  f"({100 * min(1.0, tokens / spec.token_budget):.0f}%) | step {steps} | loss "
                  f"{loss:.4f} | {time.perf_counter() - t0:.0f} s",
                  file=sys.stderr, flush=True)
    wall = time.perf_counter() - t0

    accuracy, n_eval = greedy_accuracy(model, tokenizer, eval_in, spec.eval_max_new_tokens)
    out_dir.mkdir(parents=True, exist_ok=True)
    with saving_weights(out_dir, f"base policy {out_dir}"):
        model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    record = {
        "phase": "pre",
        "size": size,
        "layers": model.config.num_hidden_layers,
        "params": params,
        "non_embedding_params": non_embedding,
        "steps": steps,
        "tokens": tokens,
        "model_flops": model_flops,
        "executed_flops": exec_flops,
        "wall_s": round(wall, 3),
        "eval_in_accuracy": accuracy,
        "eval_in_n": n_eval,
        "final_loss": loss,
        "spec": asdict(spec),
        "teacher": {**asdict(teacher), "written": writer.counts},
    }
    write_json_atomic(out_dir / "pre.json", record, indent=2)
    return record


def run_pretrain(job) -> dict:
    """``race pretrain``: a :class:`race.core.jobs.PretrainJob`."""
    from race.policy.device import prepare_device

    return pretrain(job.size, job.data_dir, job.tokenizer_dir, job.out_dir, job.spec,
                    teacher=job.teacher, max_value=job.max_value,
                    device=prepare_device(job.device))
