"""What each rollout engine of :mod:`race.core.engines` does with a model: the training
generation's weights (:func:`generation_weights`), the decoder an entry names
(:func:`decoder_class`) and one decode of a left-padded batch (:func:`decode`, what evaluation,
base-policy evaluation and PRM sampling run through :func:`race.policy.generation.generate`).

- ``peft``: ``generate`` through the unmerged LoRA layers, each adapted projection computing
  ``W·x + s·B·(A·x)``: three matmuls and an add per module and token.
- ``merged``: before each training generation (once per optimizer step: a step generates at
  most once), every adapted module's weight is replaced by a new tensor ``W + s·B·A`` and the
  adapters are disabled; afterwards the original weight tensors are put back
  (:func:`merged_weights`). The frozen weights are never written to, so they stay equal to the
  loaded ones bit for bit (an in-place merge-then-unmerge, ``W + s·B·A - s·B·A``, is not exact
  in floating point), and the learning phase runs through the unmerged adapters as under
  ``peft``. The merge costs ``B·A`` per module (:func:`race.flops.analytic.lora_merge_flops`)
  and, while generating, a second copy of the adapted weights.
- ``static``: ``merged`` plus a static KV cache sized once per job (the longest prompt plus
  the completion cap: :func:`race.core.engines.static_cache_len`), so that every decode runs
  the same shapes; on CUDA the decode forward is compiled (TRL builds its generation config
  with ``disable_compile=True``; the trainer sets it back). A static cache's attention reads
  every cached position, filled or not.
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

Evaluation merges a rung's adapter into the policy on the job's device (``eval.merge_adapter``)
before it decodes, and a base policy or PRM sampling has no adapter: there, ``peft`` and
``merged`` both mean ``generate``, ``static`` ``generate`` with a static cache (compiled on
CUDA), and ``fused`` the decoder -- or ``generate`` where the decoder cannot read the model (a
PEFT-wrapped policy under ``merge_adapter: false``, another architecture) or the model's
generation config adds logits processors (:func:`race.policy.decoder.plain_sampling`).
"""

from __future__ import annotations

import contextlib
import importlib

from race.core.engines import Engine, engine


def _entry(spec: Engine | str) -> Engine:
    return engine(spec) if isinstance(spec, str) else spec


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


def generation_weights(peft_model, spec: Engine | str):
    """The weights a training generation under ``spec`` runs with, as a context: the LoRA
    layers as they are (an engine that does not merge), or :func:`merged_weights` -- its
    adapters left on for a decoder, which reads the base layers alone."""
    spec = _entry(spec)
    if not spec.merges:
        return contextlib.nullcontext()
    return merged_weights(peft_model, adapters_off=spec.decoder is None)


def decoder_class(spec: Engine | str):
    """The decoder class ``spec`` names (``module:Class``), None for ``generate``."""
    spec = _entry(spec)
    if spec.decoder is None:
        return None
    module, name = spec.decoder.split(":")
    return getattr(importlib.import_module(module), name)


def generate_kwargs(spec: Engine | str, device: str, max_cache_len: int | None = None) -> dict:
    """What ``generate`` is given under ``spec`` on ``device`` beyond the sampling settings:
    a static cache of ``max_cache_len`` positions (at least; None: the call's own length),
    compiled where the entry says (transformers compiles a static-cache decode on CUDA unless
    told not to)."""
    spec = _entry(spec)
    if not spec.static_cache:
        return {}
    out = {"cache_implementation": "static", "disable_compile": device not in spec.compile_on}
    if max_cache_len is not None:
        out["max_cache_len"] = max_cache_len
    return out


def cache_len_of(model, spec: Engine | str) -> int | None:
    """Positions of the static cache ``model``'s last ``generate`` ran with (transformers
    keeps the largest it has built on the model), None under a dynamic cache."""
    if not _entry(spec).static_cache:
        return None
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return getattr(base, "_previous_max_cache_length", None)


def usable_decoder(model, spec: Engine | str):
    """The decoder that decodes ``model`` under ``spec``, built; None where the engine has
    none, where the decoder cannot read the model (a PEFT wrapper, another architecture) or
    where its generation config asks ``generate`` for more than temperature sampling."""
    cls = decoder_class(spec)
    if cls is None or not cls.supports(model) or not cls.plain_sampling(
            model.generation_config):
        return None
    return cls(model)


def decode(model, spec: Engine | str, input_ids, attention_mask, *, max_new_tokens: int,
           do_sample: bool, temperature: float, eos_token_id: int | None,
           pad_token_id: int | None, decoder=None, max_cache_len: int | None = None):
    """New tokens of one left-padded batch under ``spec`` (module docstring): ``decoder``
    (:func:`usable_decoder`'s, built once per call of many batches) where there is one, else
    ``generate`` (sampling at ``top_k=0, top_p=1``: what the decoder implements) with the
    entry's :func:`generate_kwargs`."""
    import torch

    spec = _entry(spec)
    spec.check_device(model.device.type)
    if decoder is not None:
        return decoder.generate(input_ids, attention_mask, max_new_tokens=max_new_tokens,
                                do_sample=do_sample, temperature=temperature,
                                eos_token_ids=[eos_token_id], pad_token_id=pad_token_id)
    with torch.no_grad():
        out = model.generate(
            input_ids=input_ids, attention_mask=attention_mask,
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            temperature=temperature if do_sample else None,
            top_k=0 if do_sample else None,
            top_p=1.0 if do_sample else None,
            pad_token_id=pad_token_id,
            eos_token_id=eos_token_id,
            **generate_kwargs(spec, model.device.type, max_cache_len),
        )
    return out[:, input_ids.shape[1]:]
