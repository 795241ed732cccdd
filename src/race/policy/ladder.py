"""The offline policy ladder and the one loader every policy goes through.

The ladder is a family of tiny ``Qwen2ForCausalLM`` configs driven by a single size dial ``k``:

    hidden        = 32 * (k + 2)
    intermediate  = 4 * hidden            (SwiGLU: gate, up, down)
    layers        = max(4, k + 2)
    heads         = k + 2                  (head dim 32)
    kv heads      = heads // 2 if heads is even else 1   (GQA; KV heads must divide heads)

Named rungs: ``nano`` (k=0, ~0.25M parameters), ``micro`` (k=1, ~0.55M), ``mini`` (k=2, ~1M):
about 2x parameters per rung, width growing at a fixed depth of 4. Depth has a floor because
a chain of steps needs it: at hidden 64 and the default 1M pretraining tokens, 2 layers reach
2% greedy eval-in accuracy, 3 layers 11.5% and 4 layers 19.5% (``python
bench/calibration/ladder_depth.py`` on the default task). Accuracy rises steeply with width, so the
rungs are
close enough that every size lands between trivial and saturated after the same short
pretraining, and pretraining the whole ladder fits in minutes on two CPU cores.
The vocabulary is the character-level task tokenizer's; the LM head is tied to the input
embedding, as in the small Qwen2.5 models.

A size entry that is not a ladder name is a hub id or a local path: it loads through
``AutoModelForCausalLM.from_pretrained`` with ``trust_remote_code=False`` and safetensors only.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from race.core.ladder import LADDER_DIALS, config_dict, is_ladder_name, ladder_shape


def ladder_config(name: str, vocab_size: int, pad_token_id: int | None = None,
                  bos_token_id: int | None = None, eos_token_id: int | None = None,
                  layers: int | None = None):
    """A ``Qwen2Config`` for ladder rung ``name`` with the given vocabulary
    (:func:`race.core.ladder.config_dict`; ``layers`` overrides the rung's depth)."""
    from transformers import Qwen2Config

    keys = {k: v for k, v in config_dict(name, vocab_size, layers).items() if k != "model_type"}
    return Qwen2Config(**keys, pad_token_id=pad_token_id,
                       bos_token_id=bos_token_id, eos_token_id=eos_token_id, use_cache=True)


def build_ladder_model(name: str, tokenizer, seed: int = 0, attn_implementation: str = "sdpa",
                       layers: int | None = None):
    """Randomly initialised ladder policy (deterministic for a given seed); ``layers``
    overrides the rung's depth (see ``ladder_config``)."""
    import torch
    from transformers import Qwen2ForCausalLM

    config = ladder_config(
        name,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        layers=layers,
    )
    config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config)


#: What a policy folder that is missing should hold, for the error naming it.
POLICY_FOLDER = ("a policy: a ladder size's base policy is written by its base job, "
                 "`snakemake` or `race pretrain`")


def load_policy(spec: str | Path, attn_implementation: str = "sdpa", dtype=None,
                revision: str | None = None):
    """Load a causal LM from a hub id or a local directory: no remote code, safetensors only.
    A hub id loads at ``revision``, else at its pin (:func:`race.core.references.revision_of`),
    else at the hub's default branch.

    Ladder names are not accepted here: a ladder policy is first pretrained (``race pretrain``)
    and then loaded from its directory like any other checkpoint.
    """
    from transformers import AutoModelForCausalLM

    from race.core.references import require_folder_or_hub_id, revision_of

    spec = str(spec)
    if is_ladder_name(spec):
        raise ValueError(
            f"{spec!r} is a ladder name: load its pretrained directory (results/base/size~{spec})"
        )
    require_folder_or_hub_id(spec, POLICY_FOLDER)
    return AutoModelForCausalLM.from_pretrained(
        spec,
        trust_remote_code=False,
        use_safetensors=True,
        attn_implementation=attn_implementation,
        dtype=dtype,
        revision=revision_of(spec, revision) or "main",
    )


def quiet_checkpointing_renames() -> None:
    """Silence, for this process, the FutureWarnings transformers 5.24 raises for its renamed
    gradient-checkpointing API (``is_gradient_checkpointing``, ``gradient_checkpointing_enable``
    / ``_disable`` -> ``*activation_checkpointing*``), and only those.

    RACE itself uses the new names (GRPOConfig's ``activation_checkpointing``); the old ones
    are read by PEFT 0.21 (``PeftModel.__init__`` reads ``is_gradient_checkpointing``, so
    every adapter wrapped or loaded) and TRL 1.16 (its generation and reference-forward
    context managers toggle checkpointing by the old names). Nothing a job can act on, yet
    each process printed them (~100 lines over the smoke study's logs). Called where RACE
    hands a model to those libraries (race.grpo.trainer, race.evaluation.snapshot); a
    transformers warning with any other message, or any other library's, still shows.
    """
    warnings.filterwarnings(
        "ignore",
        message=r"`(is_gradient_checkpointing|gradient_checkpointing_enable|"
                r"gradient_checkpointing_disable)` is deprecated and will be removed in v6",
        category=FutureWarning,
        module=r"transformers\.modeling_utils$",
    )


def count_parameters(model) -> tuple[int, int]:
    """(all parameters, non-embedding parameters), each shared tensor counted once.

    Non-embedding excludes the input embedding and an untied LM head (the convention of the
    scaling-law literature); a tied head is the embedding and is excluded once.
    """
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    emb = model.get_input_embeddings().weight
    embedding = emb.numel()
    head = model.get_output_embeddings()
    if head is not None and head.weight is not emb:
        embedding += head.weight.numel()
    return total, total - embedding


def ladder_rows(vocab: int) -> list[dict]:
    """One row per ladder size, parameters counted on an instantiated (meta-device) model."""
    import torch
    from transformers import Qwen2ForCausalLM

    rows = []
    for name in LADDER_DIALS:
        shape = ladder_shape(LADDER_DIALS[name], name)
        with torch.device("meta"):
            model = Qwen2ForCausalLM(ladder_config(name, vocab_size=vocab))
        params, non_embedding = count_parameters(model)
        rows.append({"name": name, "dial": shape.dial, "layers": shape.layers,
                     "hidden": shape.hidden, "intermediate": shape.intermediate,
                     "heads": f"{shape.heads}/{shape.kv_heads}", "params": params,
                     "non_embedding_params": non_embedding})
    return rows


def format_table(rows: list[dict]) -> str:
    cols = ["name", "dial", "layers", "hidden", "intermediate", "heads", "params",
            "non_embedding_params"]
    head = ["name", "dial", "layers", "hidden", "d_ff", "heads/kv", "params", "non-emb params"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        lines.append("| " + " | ".join(f"{r[c]:,}" if isinstance(r[c], int) and c.endswith(
            "params") else str(r[c]) for c in cols) + " |")
    return "\n".join(lines)
