"""The offline ladder's dimensions as plain numbers (no torch, no transformers).

A size dial ``k`` gives a tiny Qwen2 decoder (race.policy.ladder builds it; the formulas and
why the depth has a floor are in its docstring):

    hidden = 32 * (k + 2), intermediate = 4 * hidden, layers = max(4, k + 2),
    heads = k + 2 (head dim 32), kv heads = heads // 2 if heads is even else 1.

:func:`config_dict` is the ``Qwen2Config`` of a rung as a plain mapping: the policy loader
builds its model from it and the FLOP model reads its architecture from it, so both see the
same numbers and the FLOP model imports no model code.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

LADDER_DIALS: dict[str, int] = {"nano": 0, "micro": 1, "mini": 2}

#: Depth floor of the ladder (see the module docstring: shallower models cannot learn the chains).
MIN_LADDER_LAYERS = 4

#: Context length of the ladder models: the longest OOD prompt plus solution fits well inside.
LADDER_MAX_POSITIONS = 256


@dataclass(frozen=True)
class LadderShape:
    """Architecture numbers of one ladder rung (no vocabulary: that comes from the tokenizer)."""

    name: str
    dial: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int


def ladder_shape(dial: int, name: str | None = None) -> LadderShape:
    """The architecture for size dial ``dial`` (see the module docstring for the formulas)."""
    if dial < 0:
        raise ValueError(f"size dial must be >= 0, got {dial}")
    hidden = 32 * (dial + 2)
    heads = dial + 2
    return LadderShape(
        name=name or f"dial{dial}",
        dial=dial,
        hidden=hidden,
        intermediate=4 * hidden,
        layers=max(MIN_LADDER_LAYERS, dial + 2),
        heads=heads,
        kv_heads=heads // 2 if heads % 2 == 0 else 1,
    )


def is_ladder_name(spec: str) -> bool:
    return spec in LADDER_DIALS


def config_dict(name: str, vocab_size: int, layers: int | None = None) -> dict:
    """The architecture keys of ladder rung ``name``'s ``Qwen2Config`` (``layers`` overrides
    the rung's depth: the depth ablation of ``bench/calibration/ladder_depth.py``)."""
    if name not in LADDER_DIALS:
        raise KeyError(f"unknown ladder size {name!r}; known: {sorted(LADDER_DIALS)}")
    shape = ladder_shape(LADDER_DIALS[name], name)
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers must be >= 1, got {layers}")
        shape = replace(shape, layers=layers)
    return {"model_type": "qwen2", "vocab_size": vocab_size, "hidden_size": shape.hidden,
            "intermediate_size": shape.intermediate, "num_hidden_layers": shape.layers,
            "num_attention_heads": shape.heads, "num_key_value_heads": shape.kv_heads,
            "max_position_embeddings": LADDER_MAX_POSITIONS, "rope_theta": 1e6,
            "tie_word_embeddings": True}
