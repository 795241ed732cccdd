"""Architectures of the Qwen2.5 base models, so that ``race flops`` works without a hub.

The numbers are those of the published ``config.json`` files (docs/design.md, "Reference
architectures"): SwiGLU MLP, RMSNorm (eps 1e-6), rotary (theta 1e6), biases on q/k/v only;
0.5B/1.5B/3B tie the LM head to the embedding, 7B/14B do not. Only architecture keys are kept
(no token ids, no dtype): enough to count FLOPs and parameters and to instantiate the model on
the meta device. Names work with or without the ``Qwen/`` organisation prefix.
"""

from __future__ import annotations

from typing import Any

_ARCH_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "vocab_size", "tie_word_embeddings",
              "max_position_embeddings")


def _qwen25(*values: Any) -> dict[str, Any]:
    return dict(zip(_ARCH_KEYS, values, strict=True))


#: name -> config.json-style dict (architecture keys only).
QWEN25: dict[str, dict[str, Any]] = {
    "Qwen2.5-0.5B": _qwen25(896, 4864, 24, 14, 2, 151936, True, 32768),
    "Qwen2.5-1.5B": _qwen25(1536, 8960, 28, 12, 2, 151936, True, 32768),
    "Qwen2.5-3B": _qwen25(2048, 11008, 36, 16, 2, 151936, True, 32768),
    "Qwen2.5-7B": _qwen25(3584, 18944, 28, 28, 4, 152064, False, 131072),
    "Qwen2.5-14B": _qwen25(5120, 13824, 48, 40, 8, 152064, False, 131072),
    # The Math PRM is the 7B backbone with a score head instead of an LM head: counted as tied
    # (the embedding once, no head matrix); its head, Linear(h, h) -> Linear(h, 2), is left
    # out of the parameters (0.2%) and priced by race.flops.analytic.reward_model_flops.
    "Qwen2.5-Math-PRM-7B": _qwen25(3584, 18944, 28, 28, 4, 152064, True, 4096),
}

#: Published parameter totals as the model cards print them (billions, 2-3 significant
#: digits), for a sanity check of the parameter count.
PUBLISHED_PARAMS: dict[str, str] = {
    "Qwen2.5-0.5B": "0.49",
    "Qwen2.5-1.5B": "1.54",
    "Qwen2.5-3B": "3.09",
    "Qwen2.5-7B": "7.61",
    "Qwen2.5-14B": "14.7",
    "Qwen2.5-Math-PRM-7B": "7.07",
}

_COMMON: dict[str, Any] = {
    "model_type": "qwen2",
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1e6,
    "use_sliding_window": False,
}

_ORG = "Qwen/"


#: Known architectures that are feedback models, not policies (no LM head to generate with).
FEEDBACK = ("Qwen2.5-Math-PRM-7B",)


def names() -> list[str]:
    """The known names, without the organisation prefix."""
    return list(QWEN25)


def policy_names() -> list[str]:
    """The known policies (every name but the feedback models)."""
    return [n for n in QWEN25 if n not in FEEDBACK]


def canonical_name(name: str) -> str:
    """``"Qwen/Qwen2.5-7B"`` -> ``"Qwen2.5-7B"``; raises KeyError for an unknown name."""
    short = name[len(_ORG):] if name.startswith(_ORG) else name
    if short not in QWEN25:
        raise KeyError(f"unknown Qwen2.5 config {name!r}; known: {', '.join(QWEN25)}")
    return short


def is_known(name: str) -> bool:
    try:
        canonical_name(name)
    except KeyError:
        return False
    return True


def config_dict(name: str) -> dict[str, Any]:
    """A fresh config.json-style dict of the named model."""
    return {**_COMMON, **QWEN25[canonical_name(name)]}


def qwen2_config(name: str, **overrides: Any):
    """The named architecture as a transformers ``Qwen2Config`` (``overrides`` win)."""
    from transformers import Qwen2Config

    values = config_dict(name)
    values.pop("model_type")
    theta = values.pop("rope_theta")
    values.update(overrides)
    values.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": theta})
    return Qwen2Config(**values)
