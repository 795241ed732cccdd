"""PRM training (``race prm``): step labels over base-policy samples, a token classifier fine-tuned
on them, held-out step AUC and accuracy (see :func:`train_prm`)."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path

import torch

from race.core.atomic import saving_weights, write_json_atomic
from race.core.specs import PRMSpec
from race.feedback.models import quiet_transformers
from race.feedback.prm_data import (
    IGNORE_INDEX,
    Example,
    answer_line_flags,
    build_examples,
    encode,
    error_metrics,
    positive_rate,
    sample_completions,
    shared_tokenizer,
    split_prompts,
    step_errors,
    step_metrics,
)
from race.feedback.prm_sampling import draw_samples, read_samples
from race.flops import analytic as flops
from race.flops.meter import PhaseFlops
from race.policy.optim import LENGTH_GROUPS, collate, length_groups, optimizer_step


def prm_train_flops(arch: flops.Arch, n_tokens: int, attention: str = "causal") -> int:
    """Forward + backward of full fine-tuning of a 2-label token classifier over one row: the
    backbone (``flops.train_flops`` without LM head) plus 3x the head at every position
    (forward, input gradient, weight gradient)."""
    backbone = flops.train_flops(arch, n_tokens, logits=0, attention=attention)
    return backbone + 3 * flops.reward_head_flops(arch, n_tokens, head="token", num_labels=2)


def _lr(step: int, spec: PRMSpec) -> float:
    """Linear warmup over ``warmup_frac`` of the steps, then cosine decay to 10% of the peak."""
    warm = max(1, int(spec.warmup_frac * spec.steps))
    if step < warm:
        return spec.learning_rate * (step + 1) / warm
    progress = (step - warm) / max(1, spec.steps - warm)
    return spec.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def fit(model, train: list[tuple[list[int], list[int]]], spec: PRMSpec, pad_id: int,
        length_groups_per_batch: int = LENGTH_GROUPS) -> dict:
    """Full fine-tuning: ``spec.steps`` AdamW steps on seeded epochs of ``train`` (encoded
    examples), cross-entropy at the step-separator positions only (every other target is
    :data:`IGNORE_INDEX`). Returns the loss and the pre FLOPs (model: real tokens, causal;
    executed: the padded micro-batches, the attention kernel's block) and tokens. Each batch
    runs as ``length_groups_per_batch`` micro-batches (:mod:`race.policy.optim`; 1 = whole)."""
    arch = flops.Arch.from_config(model.config)
    attention = "full" if spec.attn_implementation == "eager" else "sdpa"
    gen = torch.Generator().manual_seed(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate,
                            weight_decay=spec.weight_decay)
    order: list[int] = []
    model_flops = executed = tokens = 0
    losses: list[float] = []
    model.train()
    for step in range(spec.steps):
        if len(order) < spec.batch_size:  # a new seeded epoch (the tail of the last one kept)
            order += torch.randperm(len(train), generator=gen).tolist()
        batch = [train[i] for i in order[:spec.batch_size]]
        order = order[spec.batch_size:]
        batches = length_groups(batch, pad_id, length_groups_per_batch)
        losses.append(optimizer_step(model, opt, _lr(step, spec), batches))
        lengths = [len(x) for x, _ in batch]
        model_flops += sum(prm_train_flops(arch, n) for n in lengths)
        executed += sum(b.rows * prm_train_flops(arch, b.width, attention) for b in batches)
        tokens += sum(lengths)
        if (step + 1) % max(1, spec.steps // 20) == 0 or step + 1 == spec.steps:
            print(f"race prm: step {step + 1} / {spec.steps} | loss {losses[-1]:.4f}",
                  file=sys.stderr, flush=True)
    model.eval()
    tail = losses[-max(1, len(losses) // 10):]
    return {"final_loss": sum(tail) / len(tail), "training": PhaseFlops(model_flops, executed,
                                                                        tokens)}


def predict(model, encoded: list[tuple[list[int], list[int]]], pad_id: int,
            batch_size: int = 64) -> tuple[list[float], list[int]]:
    """(positive probabilities, labels) at every labelled position of ``encoded``."""
    scores: list[float] = []
    labels: list[int] = []
    with torch.no_grad():
        for start in range(0, len(encoded), batch_size):
            b = collate(encoded[start:start + batch_size], pad_id).to(model.device)
            probs = model(input_ids=b.input_ids,
                          attention_mask=b.attention_mask).logits.softmax(-1)[..., 1]
            keep = b.labels != IGNORE_INDEX
            scores += probs[keep].tolist()
            labels += b.labels[keep].tolist()
    return scores, labels


def init_classifier(size: str, tokenizer, policies: Sequence[str], spec: PRMSpec):
    """(2-label token classifier of ladder size ``size``, where its weights came from).

    ``spec.init``: ``random`` -- a fresh ``ladder_config(size, vocab)`` model; ``base`` -- the
    backbone of the base policy in ``policies`` with that very architecture (its LM head is
    dropped, the score head is new), as real PRMs start from a policy checkpoint; ``auto`` --
    ``base`` when such a policy is given, else ``random``. Seeded by ``spec.seed``.
    """
    from transformers import Qwen2ForTokenClassification

    from race.policy.ladder import ladder_config

    config = ladder_config(size, vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                           bos_token_id=tokenizer.bos_token_id,
                           eos_token_id=tokenizer.eos_token_id)
    config.num_labels = 2
    want = flops.Arch.from_config(config)
    same = [p for p in policies
            if flops.Arch.from_config(json.loads((Path(p) / "config.json").read_text())) == want]
    if spec.init == "base" and not same:
        raise ValueError(f"prm.init is 'base' but no base policy of size {size!r} is among "
                         f"{list(policies)}")
    torch.manual_seed(spec.seed)
    if spec.init != "random" and same:
        with quiet_transformers():  # its load report lists the new score head as missing
            model = Qwen2ForTokenClassification.from_pretrained(
                same[0], num_labels=2, use_safetensors=True,
                attn_implementation=spec.attn_implementation, dtype=torch.float32)
        return model, same[0]
    config._attn_implementation = spec.attn_implementation
    return Qwen2ForTokenClassification(config), "random"


def heldout_metrics(model, tokenizer, examples: list[Example]) -> dict:
    """Step metrics (:func:`race.feedback.prm_data.step_metrics`) of held-out examples: ``sampled``
    (the policies' completions: what the PRM scores in RL), ``sampled_no_answer`` (their
    step lines only: the answer line is correct whenever it repeats the last stated result,
    an easy positive) and ``all`` (synthetic examples included); and, per error family of
    :data:`race.data.task.LINE_ERRORS`, the AUC of correct vs that family's wrong steps and
    their number (``sampled_by_error``, ``all_by_error``:
    :func:`race.feedback.prm_data.error_metrics`)."""
    sampled = [e for e in examples if e.source == "sample"]
    out = {}
    for key, subset in (("sampled", sampled), ("all", examples)):
        scores, labels = predict(model, [encode(tokenizer, e) for e in subset],
                                 tokenizer.pad_token_id) if subset else ([], [])
        out[key] = step_metrics(scores, labels)
        out[f"{key}_by_error"] = error_metrics(scores, labels, step_errors(subset))
        if key == "sampled":
            keep = [not a for a in answer_line_flags(subset)]
            out["sampled_no_answer"] = step_metrics(
                [s for s, k in zip(scores, keep, strict=True) if k],
                [y for y, k in zip(labels, keep, strict=True) if k])
    return out


def headline_metrics(metrics: dict) -> dict:
    """The ``prm.json`` headline fields from :func:`heldout_metrics`: AUC, accuracy, step count
    and positive rate on the policies' samples, AUC and step count per error family, and the
    full ``heldout`` metrics."""
    sampled, by_error = metrics["sampled"], metrics["sampled_by_error"]
    return {"auc": sampled["auc"], "accuracy": sampled["accuracy"], "steps": sampled["steps"],
            "positive_rate": sampled["positive_rate"],
            "auc_by_error": {f: m["auc"] for f, m in by_error.items()},
            "steps_by_error": {f: m["steps"] for f, m in by_error.items()},
            "heldout": metrics}


def read_examples(samples_jsonl: str | Path, split: str = "heldout") -> list[Example]:
    """The examples of one split (``train`` or ``heldout``) that :func:`train_prm` wrote to
    its ``samples.jsonl``."""
    rows = [json.loads(line) for line in Path(samples_jsonl).read_text().splitlines() if line]
    return [Example(r["prompt"], r["completion"], tuple(bool(x) for x in r["labels"]),
                    r["source"], tuple(r["errors"])) for r in rows if r["split"] == split]


def _phase(p: PhaseFlops) -> dict:
    return {"model_flops": p.model, "executed_flops": p.executed, "tokens": p.tokens}


def train_prm(size: str, policies: Sequence[str | Path], data_dir: str | Path,
              out_dir: str | Path, spec: PRMSpec | None = None,
              length_groups_per_batch: int = LENGTH_GROUPS, device: str = "cpu",
              backbone: str | Path | None = None, samples: str | Path | None = None) -> dict:
    """Train PRM ladder size ``size`` on step labels; returns the ``prm.json`` record
    (metrics that are undefined -- one class only among the held-out steps -- are None).

    1. the first ``n_prompts`` train-split prompts; each base policy in ``policies`` samples
       ``samples_per_prompt`` completions per prompt (``temperature``), so the PRM sees the
       policies' real mistakes -- or, given ``samples`` (a ``race prm-samples`` folder drawn
       with the same policies and settings), those completions, whose FLOPs that folder's
       ``samples.json`` counts (:mod:`race.feedback.prm_sampling`);
    2. the step checker labels every line; repeats are dropped; synthetic reference
       solutions or corruptions are added only to bring the step positive rate near
       ``target_positive_rate`` (:func:`build_examples`);
    3. the prompts are split (seeded, ``heldout_frac`` held out), so no held-out prompt is
       trained on;
    4. a ``Qwen2ForTokenClassification`` of ``ladder_config(size, vocab)`` with 2 labels --
       random init, or the same-size base policy's backbone (``init``,
       :func:`init_classifier`; ``backbone``: another checkpoint of that architecture in
       place of the sampling policies, e.g. ``bench/calibration/prm_draws.py --backbone``) -- is
       fully
       fine-tuned for ``steps`` AdamW steps, loss = cross-entropy at the step separators only;
    5. held-out step AUC and accuracy at 0.5, on the policies' samples (``auc``,
       ``accuracy``: what the PRM scores in RL) and on every held-out example (``all``);
       per error family of the wrong steps (:func:`race.data.task.line_errors`), the AUC of
       correct vs that family's steps of the samples (``auc_by_error``, None for a family
       without steps) and their number (``steps_by_error``).

    Output: ``model.safetensors`` + ``config.json`` + tokenizer (``save_pretrained``),
    ``prm.json`` (metrics, the ``pre`` FLOPs of training and, when it sampled itself, of
    sampling, model and executed, tokens, wall seconds, the spec) and ``samples.jsonl``
    (every example with its labels, error families, source and split). Deterministic for a
    seed (and thread count) on one device; sampling and training run on ``device`` (``cpu``
    or ``cuda``).
    """
    from race.data.task import load_jsonl, write_jsonl
    from race.policy.ladder import count_parameters

    t0 = time.perf_counter()
    spec = spec or PRMSpec()
    policies = [str(p) for p in policies]
    if not policies:
        raise ValueError("race prm: needs at least one base policy directory")
    tokenizer = shared_tokenizer(policies)
    records = load_jsonl(Path(data_dir) / "train.jsonl")[: spec.n_prompts]
    prompts = [r.prompt for r in records]
    if samples:
        completions, sampling = read_samples(samples, policies, spec, prompts), None
    else:
        completions, sampling = sample_completions(
            policies, prompts, per_prompt=spec.samples_per_prompt,
            max_new_tokens=spec.max_new_tokens, temperature=spec.temperature, seed=spec.seed,
            batch_size=spec.sample_batch_size, device=device)
    examples = build_examples(records, completions, target=spec.target_positive_rate,
                              tolerance=spec.balance_tolerance, seed=spec.seed)
    held = split_prompts(prompts, spec.heldout_frac, spec.seed)
    train_ex = [e for e in examples if e.prompt not in held]
    test_ex = [e for e in examples if e.prompt in held]
    if not train_ex:
        raise ValueError("race prm: no training example (raise prm.n_prompts)")

    candidates = policies
    if backbone:  # init "base": a backbone of another architecture is an error, not random
        spec, candidates = replace(spec, init="base"), [str(backbone)]
    model, init = init_classifier(size, tokenizer, candidates, spec)
    model.to(device)  # initialised on the CPU: a seed gives the same model on either device
    pad = tokenizer.pad_token_id
    fitted = fit(model, [encode(tokenizer, e) for e in train_ex], spec, pad,
                 length_groups_per_batch)

    metrics = heldout_metrics(model, tokenizer, test_ex)

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with saving_weights(out, f"PRM {out}"):
        model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    write_jsonl(out / "samples.jsonl", (
        {"prompt": e.prompt, "completion": e.completion, "labels": [int(x) for x in e.labels],
         "errors": list(e.errors), "source": e.source,
         "split": "heldout" if e.prompt in held else "train"}
        for e in examples))
    training = fitted["training"]
    phases = {"training": training} | ({"sampling": sampling} if sampling else {})
    params, non_embedding = count_parameters(model)
    record = {
        "phase": "pre",
        "size": size,
        "policies": policies,
        "init": init,
        "params": params,
        "non_embedding_params": non_embedding,
        **headline_metrics(metrics),
        "examples": {"train": len(train_ex), "heldout": len(test_ex),
                     **{s: sum(e.source == s for e in examples) for s in
                        ("sample", "reference", "corrupt")}},
        "sample_positive_rate": positive_rate([e for e in examples if e.source == "sample"]),
        "train_positive_rate": positive_rate(train_ex),
        "final_loss": fitted["final_loss"],
        "samples": str(samples) if samples else None,
        "model_flops": sum(p.model for p in phases.values()),
        "executed_flops": sum(p.executed for p in phases.values()),
        "tokens": sum(p.tokens for p in phases.values()),
        "flops": {name: _phase(p) for name, p in phases.items()},
        "wall_s": round(time.perf_counter() - t0, 3),
        "spec": asdict(spec),
    }
    record = _finite(record)  # a metric without both classes is nan: null in JSON
    write_json_atomic(out / "prm.json", record, indent=2)
    return record


def _finite(value):
    """JSON-safe copy: nan (a metric without both classes) becomes null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def run_prm(job) -> dict:
    """``race prm``: a :class:`race.core.jobs.PrmJob`."""
    from race.core.ladder import LADDER_DIALS

    if job.size not in LADDER_DIALS:
        raise ValueError(f"race prm: size must be a ladder size ({', '.join(LADDER_DIALS)}), "
                         f"got {job.size!r}")
    from race.policy.device import prepare_device

    return train_prm(job.size, job.policies, job.data_dir, job.out_dir, job.spec,
                     device=prepare_device(job.device), samples=job.samples or None)


def run_prm_samples(job) -> dict:
    """``race prm-samples``: a :class:`race.core.jobs.PrmSamplesJob`."""
    from race.policy.device import prepare_device

    return draw_samples(job.policies, job.data_dir, job.out_dir, job,
                        device=prepare_device(job.device), engine=job.engine)
