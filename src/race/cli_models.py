"""``race models``: the policy ladder as a table (name, shape, parameter counts)."""

from __future__ import annotations

from race.char_tokenizer import ALPHABET, SPECIAL_TOKENS
from race.ladder import LADDER_DIALS, ladder_shape

#: Vocabulary of the default character tokenizer (special tokens + alphabet).
DEFAULT_VOCAB = len(SPECIAL_TOKENS) + len(dict.fromkeys(ALPHABET))


def ladder_rows(vocab: int = DEFAULT_VOCAB) -> list[dict]:
    """One row per ladder size, parameters counted on an instantiated (meta-device) model."""
    import torch
    from transformers import Qwen2ForCausalLM

    from race.ladder import count_parameters, ladder_config

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


def register(sub) -> None:
    p = sub.add_parser("models", help="print the policy ladder (shapes and parameter counts)")
    p.add_argument("--vocab", type=int, default=DEFAULT_VOCAB,
                   help=f"vocabulary size (default: the character tokenizer's, {DEFAULT_VOCAB})")
    p.set_defaults(func=lambda args: print(format_table(ladder_rows(args.vocab))) or 0)
