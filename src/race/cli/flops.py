"""``race flops``: what a forward, a generation or a training step costs, before spending it.

    race flops CONFIG --phase forward  --batch B --seq T [--logits N]
    race flops CONFIG --phase generate --batch B --prompt P --new G
    race flops CONFIG --phase train    --batch B --seq T [--logits N] [--grad-ckpt]
      common: [--lora-rank R] [--lora-targets q_proj,k_proj,...] [--executed] [--json]
              [--vocab V] [--attn eager|sdpa]
    race flops --table [--ref-len T]

CONFIG is a config.json, a model directory, a ladder size or a Qwen2.5 name. Sequences have
uniform lengths (no padding). Model FLOPs by default (causal attention); ``--executed`` gives
what the kernels compute (full attention block; ``--attn sdpa`` for the fused kernel's
backward). Errors exit with status 2.
"""

from __future__ import annotations

import json
import sys

from race.core.specs import ATTN_IMPLEMENTATIONS
from race.flops import analytic as F
from race.flops.estimates import (
    ESTIMATES,
    LADDER_REF_LEN,
    QWEN_REF_LEN,
    EstimateError,
    estimate,
    format_estimate,
    table,
)

HELP = "FLOPs of a forward, generation or training step"


def add_arguments(p) -> None:
    p.add_argument("config", nargs="?", help="config.json, model dir, ladder size or Qwen2.5 name")
    p.add_argument("--phase", choices=ESTIMATES, default="forward")
    p.add_argument("--batch", type=int, default=1, help="sequences (default 1)")
    p.add_argument("--seq", type=int, help="tokens per sequence (forward, train)")
    p.add_argument("--logits", type=int,
                   help="LM-head positions: the last N of each sequence (default all)")
    p.add_argument("--prompt", type=int, help="prompt tokens (generate)")
    p.add_argument("--new", type=int, help="generated tokens per sequence (generate)")
    p.add_argument("--grad-ckpt", action="store_true", help="gradient checkpointing (train)")
    p.add_argument("--lora-rank", type=int, help="LoRA rank (train: LoRA instead of full FT)")
    p.add_argument("--lora-targets", default=",".join(F.ALL_PROJECTIONS),
                   help="comma-separated adapted projections (default all seven)")
    p.add_argument("--executed", action="store_true",
                   help="executed FLOPs (full attention block) instead of model FLOPs")
    p.add_argument("--attn", choices=ATTN_IMPLEMENTATIONS, default="eager",
                   help="kernel for --executed (only the training backward differs)")
    p.add_argument("--vocab", type=int, help="vocabulary size (ladder default "
                                             f"{F.LADDER_REFERENCE_VOCAB})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--table", action="store_true",
                   help="markdown table for every ladder and Qwen2.5 size")
    p.add_argument("--ref-len", type=int, help=f"context of --table (default {QWEN_REF_LEN} "
                                                f"for Qwen2.5, {LADDER_REF_LEN} for the ladder)")


def run(args) -> int:
    try:
        if args.table:
            print(table(args.ref_len, vocab=args.vocab))
            return 0
        result = estimate(args)
    except EstimateError as exc:
        print(f"race flops: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result) if args.json else format_estimate(result))
    return 0
