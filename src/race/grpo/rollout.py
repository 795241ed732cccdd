"""Rollout engines: how the policy generates a step's completions (``training.rollout_engine``).

- ``peft`` (unset): ``generate`` through the unmerged LoRA layers, each adapted projection
  computing ``W·x + s·B·(A·x)``: three matmuls and an add per module and token.
- ``merged``: before each generation (once per optimizer step: a step generates at most once),
  every adapted module's weight is replaced by a new tensor ``W + s·B·A`` and the adapters are
  disabled; afterwards the original weight tensors are put back. The frozen weights are never
  written to, so they stay equal to the loaded ones bit for bit (an in-place merge-then-unmerge,
  ``W + s·B·A - s·B·A``, is not exact in floating point), and the learning phase runs through the
  unmerged adapters as under ``peft``. The merge costs ``B·A`` per module
  (:func:`race.flops.analytic.lora_merge_flops`) and, while generating, a second copy of the
  adapted weights.
- ``static``: ``merged`` plus a static KV cache sized once per job (the longest prompt plus the
  completion cap), so that every decode runs the same shapes; on CUDA the decode forward is
  compiled (TRL builds its generation config with ``disable_compile=True``; the trainer sets it
  back). A static cache's attention reads every cached position, filled or not.
- ``fused``: ``merged``, with the decode loop of race.policy.decoder in place of ``generate``:
  query/key/value and gate/up projections as one matmul each, a cache written in place, none
  of ``generate``'s per-token machinery. The same matmuls and attention widths as ``merged``
  with a dynamic cache, so the same executed FLOPs; on the CPU's small policies, where a
  decode step is bound by calls rather than arithmetic, the fastest
  (``bench/performance/rollout_engines.py``).

The engine changes how rollouts are computed, never what a budget is charged: model FLOPs price
generation through the adapted policy (its LoRA terms included) under every engine, so the
same shapes give the same ledger model FLOPs and the study's answer does not depend on the
engine. Executed FLOPs follow the engine (race.flops.meter). Like the device, the engine is not
part of a run's fingerprint: merged weights round differently from the unmerged sum, so samples
differ by rounding, not in distribution.
"""

from __future__ import annotations

import contextlib


def _lora_layers(model):
    from peft.tuners.lora import LoraLayer

    return [m for m in model.modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def merged_weights(peft_model, *, adapters_off: bool = True):
    """Generate from merged weights inside this block (module docstring): each adapted
    module's base weight swapped for ``W + Σ s·B·A`` over its active adapters, the adapters
    disabled; on exit the original weight Parameters, untouched, are put back.
    ``adapters_off=False`` leaves the adapters on, for a reader of the base layers' weights
    alone (race.policy.decoder): PEFT's switch walks every module twice, a few milliseconds a
    step on the small policies."""
    import torch

    swapped = []
    layers = _lora_layers(peft_model)
    for layer in layers:
        active = [n for n in layer.active_adapters if n in layer.lora_A]
        if layer.merged or any(n in layer.lora_variant or layer.lora_bias.get(n) for n in active) \
                or any(getattr(layer.lora_dropout[n], "p", 0.0) for n in active):
            raise ValueError("a merging rollout engine takes plain LoRA on nn.Linear (no "
                             "DoRA or other variant, no lora_bias or lora_dropout, not "
                             "merged already): peft applies those where a merge would not")
    try:
        with torch.no_grad():
            for layer in layers:
                base = layer.get_base_layer()
                original = base.weight
                merged = original.detach().clone()
                for name in layer.active_adapters:
                    if name in layer.lora_A:
                        merged += layer.get_delta_weight(name).to(merged.dtype)
                base._parameters["weight"] = torch.nn.Parameter(merged, requires_grad=False)
                swapped.append((base, original))
        with peft_model.disable_adapter() if adapters_off else contextlib.nullcontext():
            yield
    finally:
        for base, original in swapped:
            base._parameters["weight"] = original


def static_cache_len(max_prompt_len: int, max_completion_length: int) -> int:
    """Positions of the static KV cache a job sizes once: transformers' ``generate`` caches
    ``max_length - 1 = prompt + max_new_tokens - 1`` positions, at most this for any batch of
    the job's prompts (a larger cache would only be read, at a cost, never written)."""
    return max_prompt_len + max_completion_length - 1
