"""What a planned forward, generation or training step costs (``race flops``), and the per-token
table of every ladder and Qwen2.5 size (``race flops --table``).

A request is any object with the attributes ``config, phase, batch, seq, logits, prompt, new,
grad_ckpt, lora_rank, lora_targets, executed, attn, vocab`` (the ``race flops`` arguments);
a bad value raises :class:`EstimateError` naming the flag. Sequences have uniform lengths (no
padding). Model FLOPs by default (causal attention); executed FLOPs are what the kernels
compute (full attention block; ``attn="sdpa"`` for the fused kernel's backward).
"""

from __future__ import annotations

from race.flops import analytic as F

#: The kinds of step ``race flops --phase`` can estimate (not FLOP phases: see the ledger).
ESTIMATES = ("forward", "generate", "train")

#: Reference contexts of ``--table`` when ``--ref-len`` is not given: 512 tokens for Qwen2.5
#: (a typical GRPO prompt + completion), 128 for the ladder (half its 256-token context).
QWEN_REF_LEN = 512
LADDER_REF_LEN = 128
TABLE_LORA_RANK = 8


class EstimateError(ValueError):
    """A bad request; the message names the flag."""


# --------------------------------------------------------------------------- one estimate


def _positive(args, name: str, low: int = 1) -> int:
    value = getattr(args, name)
    flag = "--" + name.replace("_", "-")
    if value is None:
        raise EstimateError(f"--phase {args.phase} needs {flag}")
    if value < low:
        raise EstimateError(f"{flag} must be >= {low}, got {value}")
    return value


def _lora(args) -> F.LoraSpec | None:
    if args.lora_rank is None:
        return None
    targets = tuple(t.strip() for t in args.lora_targets.split(",") if t.strip())
    try:
        return F.LoraSpec(args.lora_rank, targets)
    except ValueError as exc:
        raise EstimateError(f"--lora-targets / --lora-rank: {exc}") from exc


def _arch(args) -> F.Arch:
    if not args.config:
        raise EstimateError("CONFIG is required (or use --table)")
    if args.vocab is not None and args.vocab < 1:
        raise EstimateError(f"--vocab must be >= 1, got {args.vocab}")
    try:
        return F.resolve_arch(args.config, vocab=args.vocab)
    except ValueError as exc:
        raise EstimateError(f"CONFIG {args.config!r}: {exc}") from exc


def _phase_flops(args, arch: F.Arch, lora: F.LoraSpec | None, executed: bool) -> int:
    """FLOPs of the whole batch for the requested phase."""
    attention = ("full" if args.attn == "eager" else "sdpa") if executed else "causal"
    if args.phase == "generate":
        one = F.generate_flops(arch, args.prompt, args.new, lora=lora, executed=executed,
                               attention="full" if executed else "causal")
    elif args.phase == "forward":
        one = F.forward_flops(arch, args.seq, logits=args.logits, lora=lora, attention=attention)
    else:
        one = F.train_flops(arch, args.seq, logits=args.logits, lora=lora,
                            grad_ckpt=args.grad_ckpt, attention=attention)
    return args.batch * one


def estimate(args) -> dict:
    """The JSON object of one ``race flops`` call (raises EstimateError on a bad argument)."""
    arch = _arch(args)
    lora = _lora(args)
    _positive(args, "batch")
    if args.phase == "generate":
        _positive(args, "prompt")
        _positive(args, "new")
        tokens = args.batch * (args.prompt + args.new)
    else:
        _positive(args, "seq")
        if args.logits is not None and not 1 <= args.logits <= args.seq:
            raise EstimateError(f"--logits must be in [1, --seq={args.seq}], got {args.logits}")
        tokens = args.batch * args.seq
    model = _phase_flops(args, arch, lora, executed=False)
    executed = _phase_flops(args, arch, lora, executed=True)
    # Without LoRA every weight is trainable (full fine-tuning); with it only the adapters.
    trainable = arch.params() if lora is None else F.lora_params(arch, lora)
    return {
        "config": args.config,
        "phase": args.phase,
        "flops": executed if args.executed else model,
        "kind": "executed" if args.executed else "model",
        "model_flops": model,
        "executed_flops": executed,
        "tokens": tokens,
        "batch": args.batch,
        "seq": args.seq,
        "logits": args.logits,
        "prompt": args.prompt,
        "new": args.new,
        "grad_ckpt": bool(args.grad_ckpt),
        "lora_rank": lora.rank if lora else None,
        "lora_targets": list(lora.targets) if lora else None,
        "attn": args.attn,
        "vocab": arch.vocab,
        "params": arch.params(),
        "non_embedding_params": arch.non_embedding_params(),
        "trainable_params": trainable,
    }


def format_estimate(r: dict) -> str:
    """One human-readable line of an :func:`estimate` result."""
    lora = f", LoRA r={r['lora_rank']} on {','.join(r['lora_targets'])}" if r["lora_rank"] else ""
    if r["phase"] == "generate":
        shape = f"batch {r['batch']} x (prompt {r['prompt']} + new {r['new']})"
    else:
        shape = f"batch {r['batch']} x seq {r['seq']}"
        if r["logits"] is not None:
            shape += f", logits at last {r['logits']}"
    ckpt = ", grad-ckpt" if r["grad_ckpt"] else ""
    return (f"{r['config']} {r['phase']} ({shape}{lora}{ckpt}): {r['flops']:.4e} "
            f"{r['kind']} FLOPs = {r['flops']} ({r['params']:,} params)")


# --------------------------------------------------------------------------- table


def _table_row(name: str, arch: F.Arch, ref_len: int) -> str:
    lora = F.LoraSpec(TABLE_LORA_RANK)
    gen = F.decode_token_flops(arch, ref_len, lora=lora)
    train_lora = F.train_flops(arch, ref_len, lora=lora) / ref_len
    train_full = F.train_flops(arch, ref_len) / ref_len
    return (f"| {name} | {arch.params() / 1e6:,.1f}M | {arch.non_embedding_params() / 1e6:,.1f}M "
            f"| {ref_len} | {gen:.3e} | {train_lora:.3e} | {train_full:.3e} |")


def table(ref_len: int | None = None, vocab: int | None = None) -> str:
    """Markdown table: model FLOPs per generated token (one decode step at context ``ref_len``,
    LoRA r=8 on all projections) and per trained token (forward + backward of a ``ref_len``
    sequence, logits everywhere, no checkpointing; LoRA r=8 and full fine-tuning)."""
    from race.core.ladder import LADDER_DIALS
    from race.flops import known_configs

    if ref_len is not None and ref_len < 1:
        raise EstimateError(f"--ref-len must be >= 1, got {ref_len}")
    lines = [
        f"| model | params | non-emb params | context | FLOPs / generated token "
        f"(LoRA r={TABLE_LORA_RANK}) | FLOPs / trained token (LoRA r={TABLE_LORA_RANK}) "
        f"| FLOPs / trained token (full FT) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in LADDER_DIALS:
        arch = F.resolve_arch(name, vocab=vocab)
        lines.append(_table_row(f"{name} (V={arch.vocab})", arch, ref_len or LADDER_REF_LEN))
    for name in known_configs.policy_names():
        lines.append(_table_row(name, F.resolve_arch(name), ref_len or QWEN_REF_LEN))
    lines.append("")
    lines.append(f"Model FLOPs (causal attention, no padding). Generated token: one KV-cached "
                 f"decode step attending to `context` keys. Trained token: forward + backward "
                 f"over a `context`-token sequence / `context`. Ladder vocabulary: "
                 f"{vocab or F.LADDER_REFERENCE_VOCAB} (`race flops --table --vocab V`).")
    return "\n".join(lines)
