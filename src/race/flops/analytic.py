"""The analytic FLOP model of RACE (docs/design.md, "FLOP conventions").

Every function returns an exact Python ``int`` number of FLOPs for **one sequence** unless it
says otherwise (the ``batch_*`` helpers sum over rows). Conventions:

- **What is counted: matmuls**, 2 FLOPs per multiply-add. Per decoder layer the projections q,
  k, v, o, gate, up, down; the attention matmuls ``Q·Kᵀ`` and ``P·V``
  (``4·H·d_h`` FLOPs per query per attended key); the LM head ``2·d·V`` per position where
  logits are computed, tied or not; LoRA's ``A`` and ``B`` (``2·r·(d_in + d_out)`` per token
  per adapted module, as the adapters stay unmerged).
- **What is not counted**: biases, RMSNorm, rotary, softmax, activations, residual adds,
  dropout, the loss, the embedding lookup (a gather, zero FLOPs) and its backward (a
  scatter-add), and the optimizer. None is a matmul; together they are well under 1% of the
  total at the sizes RACE runs, and torch's ``FlopCounterMode`` -- the reference this model is
  validated against -- does not count them either.
- **Model FLOPs** (``attention="causal"``, what a budget is charged): real tokens only, a token
  at position t attends to t keys, logits only where they are used (an update's completion
  positions; generation's new tokens), whatever the implementation computes.
- **Executed FLOPs** (what the kernels did): padded positions included and the attention block
  as the kernel computes it. ``attention="full"`` is the eager implementation (and the masked
  SDPA forward): every new position attends to all keys of its block. ``attention="sdpa"`` is
  torch's fused SDPA kernel as torch's FLOP formulas count it: full block forward, and a
  backward of five block matmuls (recomputed scores, dP, dV, dQ, dK) whenever any of Q, K, V
  needs a gradient. Recomputation (gradient checkpointing) is included. Executed >= model, but
  for a rollout from merged weights (race.policy.engines), which skips the adapter matmuls that
  model FLOPs charge and pays :func:`lora_merge_flops` instead.

Backward follows autograd: a gradient is computed only for a tensor that depends on a
trainable weight, so with LoRA nothing below the lowest adapter is differentiated.

Ladder names (``nano``/``micro``/``mini``) need a vocabulary; without a tokenizer
:data:`LADDER_REFERENCE_VOCAB` stands in for the character tokenizer's size.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from race.core import ladder
from race.core.ladder import LADDER_DIALS

# LoRA placement is part of the FLOP model's vocabulary: its callers name it as F.LoraSpec.
from race.core.specs import ALL_PROJECTIONS as ALL_PROJECTIONS
from race.core.specs import ATTN_IMPLEMENTATIONS
from race.core.specs import LoraSpec as LoraSpec
from race.data.tokenizer import VOCAB_SIZE

ATTENTION_PROJECTIONS: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_PROJECTIONS: tuple[str, ...] = ("gate_proj", "up_proj", "down_proj")

#: Vocabulary of a ladder model when no tokenizer is given: the character tokenizer's size,
#: the one vocabulary default of every command (``race models``, ``race flops``, ``race plan``,
#: the config's step-size check), so they print the same parameter counts for a ladder size.
LADDER_REFERENCE_VOCAB = VOCAB_SIZE

#: Attention modes: "causal" = model FLOPs; "full" = eager kernel; "sdpa" = fused SDPA kernel.
ATTENTION_MODES: tuple[str, ...] = ("causal", "full", "sdpa")

#: Classification heads of :func:`reward_model_flops`.
REWARD_HEADS: tuple[str, ...] = ("token", "sequence", "prm_mlp")


# --------------------------------------------------------------------------- architecture


def _get(cfg: Any, key: str, default: Any = None) -> Any:
    if isinstance(cfg, Mapping):
        return cfg.get(key, default)
    return getattr(cfg, key, default)


@dataclass(frozen=True)
class Arch:
    """The numbers of a Qwen2-style decoder that FLOPs and parameter counts depend on."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool
    q_bias: bool = True
    k_bias: bool = True
    v_bias: bool = True

    def __post_init__(self) -> None:
        for name in ("hidden", "intermediate", "layers", "heads", "kv_heads", "head_dim", "vocab"):
            if getattr(self, name) < 1:
                raise ValueError(f"Arch.{name} must be >= 1, got {getattr(self, name)}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads "
                             f"({self.kv_heads})")

    @classmethod
    def from_config(cls, cfg: Any) -> Arch:
        """From a transformers ``Qwen2Config`` (or any object / config.json dict with its keys).

        ``head_dim`` is ``cfg.head_dim`` when set, else ``hidden_size // num_attention_heads``
        (what ``Qwen2Attention`` does). Missing optional keys take ``Qwen2Config``'s defaults:
        ``num_key_value_heads = num_attention_heads``, ``tie_word_embeddings = False``. Qwen2
        always has biases on q, k, v (``Qwen2Attention`` hard-codes them).
        """
        model_type = _get(cfg, "model_type")
        if model_type not in (None, "qwen2"):
            raise ValueError(f"model_type {model_type!r} is not a Qwen2 decoder (need 'qwen2')")
        if _get(cfg, "use_sliding_window", False):
            raise ValueError("sliding-window attention is not modelled (use_sliding_window=True)")
        missing = [k for k in ("hidden_size", "intermediate_size", "num_hidden_layers",
                               "num_attention_heads", "vocab_size") if _get(cfg, k) is None]
        if missing:
            raise ValueError(f"config lacks {', '.join(missing)}")
        hidden = int(_get(cfg, "hidden_size"))
        heads = int(_get(cfg, "num_attention_heads"))
        kv_heads = _get(cfg, "num_key_value_heads") or heads
        head_dim = _get(cfg, "head_dim") or hidden // heads
        return cls(
            hidden=hidden,
            intermediate=int(_get(cfg, "intermediate_size")),
            layers=int(_get(cfg, "num_hidden_layers")),
            heads=heads,
            kv_heads=int(kv_heads),
            head_dim=int(head_dim),
            vocab=int(_get(cfg, "vocab_size")),
            tied=bool(_get(cfg, "tie_word_embeddings", False)),
        )

    def with_vocab(self, vocab: int) -> Arch:
        return replace(self, vocab=int(vocab))

    @property
    def q_width(self) -> int:
        """Width of the query projection output (and o_proj input): H·d_h."""
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        """Width of the key and value projection outputs: H_kv·d_h."""
        return self.kv_heads * self.head_dim

    def projections(self) -> dict[str, tuple[int, int]]:
        """``{name: (d_in, d_out)}`` of the seven projections of one decoder layer."""
        d, ff = self.hidden, self.intermediate
        return {
            "q_proj": (d, self.q_width),
            "k_proj": (d, self.kv_width),
            "v_proj": (d, self.kv_width),
            "o_proj": (self.q_width, d),
            "gate_proj": (d, ff),
            "up_proj": (d, ff),
            "down_proj": (ff, d),
        }

    def layer_matmul_params(self) -> int:
        """Weights of one decoder layer's projections (no biases, no norms)."""
        return sum(i * o for i, o in self.projections().values())

    def block_matmul_params(self) -> int:
        """N_block of docs/design.md: the projection weights of all layers."""
        return self.layers * self.layer_matmul_params()

    def embedding_params(self) -> int:
        """The input embedding plus an untied LM head (a tied head is the embedding)."""
        return self.vocab * self.hidden * (1 if self.tied else 2)

    def non_embedding_params(self) -> int:
        """Every parameter but the input embedding and an untied head: projections, the q/k/v
        biases, the two RMSNorms per layer and the final RMSNorm."""
        bias = (self.q_width * self.q_bias + self.kv_width * self.k_bias
                + self.kv_width * self.v_bias)
        norms = 2 * self.hidden
        return self.layers * (self.layer_matmul_params() + bias + norms) + self.hidden

    def params(self) -> int:
        """All parameters of ``Qwen2ForCausalLM`` (a tied head counted once)."""
        return self.non_embedding_params() + self.embedding_params()


# --------------------------------------------------------------------------- LoRA


def lora_params(arch: Arch, lora: LoraSpec) -> int:
    """Trainable adapter parameters: ``r·(d_in + d_out)`` per adapted module per layer."""
    proj = arch.projections()
    return arch.layers * sum(lora.rank * sum(proj[t]) for t in lora.targets)


def _lora_forward_per_token(arch: Arch, lora: LoraSpec | None, name: str) -> int:
    if lora is None or not lora.adapts(name):
        return 0
    d_in, d_out = arch.projections()[name]
    return 2 * lora.rank * (d_in + d_out)


# --------------------------------------------------------------------------- building blocks


def _check_attention(attention: str) -> None:
    if attention not in ATTENTION_MODES:
        raise ValueError(f"attention must be one of {ATTENTION_MODES}, got {attention!r}")


def _check_count(name: str, value: int, low: int = 0) -> int:
    if int(value) != value or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
    return int(value)


def attended_keys(n_tokens: int, past: int = 0, attention: str = "causal") -> int:
    """Sum over the ``n_tokens`` new positions of the keys each one attends to.

    causal: position i (1-based) of the block attends to ``past + i`` keys;
    full / sdpa: every position attends to all ``past + n_tokens`` keys of the block.
    """
    _check_attention(attention)
    if attention == "causal":
        return n_tokens * past + n_tokens * (n_tokens + 1) // 2
    return n_tokens * (past + n_tokens)


def _attention_matmul(arch: Arch, keys: int) -> int:
    """FLOPs of ONE attention matmul (Q·Kᵀ, P·V, or one of their gradients) in ONE layer,
    summed over the queries whose attended keys total ``keys``: 2·H·d_h per query-key pair."""
    return 2 * arch.heads * arch.head_dim * keys


# Cached: the online meter asks for the same per-layer coefficients for every row of every step;
# both functions are pure in their (frozen, hashable) arguments.
@functools.lru_cache(maxsize=256)
def _layer_forward_per_token(arch: Arch, lora: LoraSpec | None) -> int:
    """Projection FLOPs (adapters included) of one decoder layer for one token."""
    return sum(2 * i * o + _lora_forward_per_token(arch, lora, name)
               for name, (i, o) in arch.projections().items())


def _head(arch: Arch) -> int:
    """LM head FLOPs per logit position: 2·d·V, tied or not."""
    return 2 * arch.hidden * arch.vocab


def _logits(n_tokens: int, logits: int | None) -> int:
    if logits is None:
        return n_tokens
    logits = _check_count("logits", logits)
    if logits > n_tokens:
        raise ValueError(f"logits ({logits}) cannot exceed the number of positions ({n_tokens})")
    return logits


# --------------------------------------------------------------------------- forward


def forward_flops(arch: Arch, n_tokens: int, *, past: int = 0, logits: int | None = None,
                  lora: LoraSpec | None = None, attention: str = "causal") -> int:
    """One forward over ``n_tokens`` new positions of one sequence, after ``past`` cached keys.

    ``2·N_block·n + 4·L·H·d_h·keys + 2·d·V·logits`` (+ LoRA), where ``keys`` is
    :func:`attended_keys`; ``logits`` is the number of positions that go through the LM head
    (default all ``n_tokens``; 0 for a backbone-only forward). ``attention`` "causal" gives
    model FLOPs, "full"/"sdpa" the executed full block.
    """
    n_tokens = _check_count("n_tokens", n_tokens)
    past = _check_count("past", past)
    keys = attended_keys(n_tokens, past, attention)
    layers = arch.layers * (_layer_forward_per_token(arch, lora) * n_tokens
                            + 2 * _attention_matmul(arch, keys))
    return layers + _head(arch) * _logits(n_tokens, logits)


# --------------------------------------------------------------------------- backward


@dataclass(frozen=True)
class _Grad:
    """Per-layer backward FLOPs, split by how they scale."""

    per_token: int  # projection and adapter gradients, FLOPs per token
    attention_matmuls: int  # number of attention-sized matmuls (each _attention_matmul)


def _linear_backward(arch: Arch, lora: LoraSpec | None, name: str,
                     input_requires_grad: bool) -> tuple[int, bool]:
    """(backward FLOPs per token, output requires grad) of one projection (+ its adapter).

    Full fine-tuning (``lora is None``): the weight gradient always, the input gradient where
    the input requires grad. LoRA: the frozen base weight costs only its input gradient, and
    only where the input requires grad; the adapter adds dA (2·r·d_in), dB (2·r·d_out), the
    gradient of A's output (2·r·d_out: it requires grad because A is trainable) and the
    gradient of the input through A (2·r·d_in) where the input requires grad.
    """
    d_in, d_out = arch.projections()[name]
    full = lora is None
    flops = 2 * d_in * d_out * (int(full) + int(input_requires_grad))
    adapted = lora is not None and lora.adapts(name)
    if adapted:
        r = lora.rank
        flops += 2 * r * d_in + 2 * r * d_out + 2 * r * d_out
        flops += 2 * r * d_in if input_requires_grad else 0
    return flops, full or adapted or input_requires_grad


def _attention_backward_matmuls(q: bool, k: bool, v: bool, attention: str) -> int:
    """How many attention-sized matmuls the attention backward runs.

    Autograd on the eager matmuls computes dV = Pᵀ·dO only if V requires grad, dP = dO·Vᵀ if Q
    or K does (the scores need a gradient), dQ = dS·K and dK = dSᵀ·Q as needed. The fused SDPA
    backward computes all of dQ, dK, dV and recomputes the scores: 5 whenever any is needed.
    """
    if attention == "sdpa":
        return 5 if (q or k or v) else 0
    return int(v) + int(q or k) + int(q) + int(k)


@functools.lru_cache(maxsize=1024)
def _layer_backward(arch: Arch, lora: LoraSpec | None, attention: str,
                    x_requires_grad: bool) -> tuple[_Grad, bool]:
    """Backward of one decoder layer whose input (residual stream) requires grad or not.

    Returns the FLOPs and whether the layer's output requires grad. Norms, rotary, softmax and
    the SwiGLU product pass "requires grad" through unchanged and cost no matmul FLOPs.
    """
    per_token = 0

    def linear(name: str, in_rg: bool) -> bool:
        nonlocal per_token
        flops, out_rg = _linear_backward(arch, lora, name, in_rg)
        per_token += flops
        return out_rg

    q = linear("q_proj", x_requires_grad)
    k = linear("k_proj", x_requires_grad)
    v = linear("v_proj", x_requires_grad)
    matmuls = _attention_backward_matmuls(q, k, v, attention)
    o = linear("o_proj", q or k or v)
    mid = x_requires_grad or o  # residual stream after attention
    gate = linear("gate_proj", mid)
    up = linear("up_proj", mid)
    down = linear("down_proj", gate or up)
    return _Grad(per_token, matmuls), mid or down


def backward_flops(arch: Arch, n_tokens: int, *, logits: int | None = None,
                   lora: LoraSpec | None = None, attention: str = "causal",
                   inputs_require_grad: bool = False) -> int:
    """Backward of a loss over the ``logits`` positions of one sequence of ``n_tokens``.

    Full fine-tuning (``lora is None``): every weight is trainable, the embedding output
    requires grad, so each matmul costs its input gradient plus its weight gradient and the
    backward is exactly 2x :func:`forward_flops` (``attention="sdpa"``: the fused kernel's 5
    block matmuls instead of 4). LoRA: see :func:`_linear_backward` and
    :func:`_attention_backward_matmuls`; ``inputs_require_grad=True`` models an embedding
    output that requires grad (``enable_input_require_grads``, which transformers 5.24 turns on
    with gradient checkpointing): then every layer is differentiated from the bottom.
    The LM head costs its input gradient (2·d·V per logit) whenever its input requires grad,
    plus its weight gradient under full fine-tuning (a tied head is the trainable embedding).
    """
    n_tokens = _check_count("n_tokens", n_tokens)
    _check_attention(attention)
    n_logits = _logits(n_tokens, logits)
    keys = attended_keys(n_tokens, 0, attention)
    requires_grad = lora is None or inputs_require_grad
    total = 0
    for _ in range(arch.layers):
        grad, requires_grad = _layer_backward(arch, lora, attention, requires_grad)
        total += grad.per_token * n_tokens + grad.attention_matmuls * _attention_matmul(arch, keys)
    head_passes = int(requires_grad) + int(lora is None)
    return total + head_passes * _head(arch) * n_logits


def checkpoint_recompute_flops(arch: Arch, n_tokens: int, *, lora: LoraSpec | None = None,
                               attention: str = "causal") -> int:
    """What gradient checkpointing re-runs in the backward: each decoder layer's forward
    except its last matmul (the head is not checkpointed).

    transformers 5.24 checkpoints each decoder layer with torch's non-reentrant checkpoint,
    whose early stop (``torch.utils.checkpoint.set_checkpoint_early_stop``, on by default) ends
    the recomputation as soon as every tensor saved for backward is regenerated. A matmul saves
    its inputs before it runs and nothing after the layer's last matmul saves anything (only the
    residual add follows), so that last matmul -- ``down_proj``, or ``down_proj``'s lora_B when
    it is adapted -- is not recomputed (measured with FlopCounterMode).
    """
    n_tokens = _check_count("n_tokens", n_tokens)
    keys = attended_keys(n_tokens, 0, attention)
    d_ff = arch.intermediate
    if lora is not None and lora.adapts("down_proj"):
        last = 2 * lora.rank * arch.hidden  # lora_B of down_proj: r -> d
    else:
        last = 2 * d_ff * arch.hidden
    per_token = _layer_forward_per_token(arch, lora) - last
    return arch.layers * (per_token * n_tokens + 2 * _attention_matmul(arch, keys))


def train_flops(arch: Arch, n_tokens: int, *, logits: int | None = None,
                lora: LoraSpec | None = None, grad_ckpt: bool = False,
                attention: str = "causal", inputs_require_grad: bool | None = None,
                head_recompute: bool = False) -> int:
    """Forward + backward of one training sequence (+ the checkpoint recompute).

    With ``grad_ckpt`` the backward also re-runs the layers (:func:`checkpoint_recompute_flops`)
    and, as transformers 5.24's ``gradient_checkpointing_enable`` calls
    ``enable_input_require_grads`` on every causal LM (and TRL does too for PEFT models), the
    embedding output requires grad, so under LoRA the layers below the lowest adapter are
    differentiated as well. ``inputs_require_grad`` overrides that (default: ``grad_ckpt``).
    Note: checkpointing is not free in FLOPs -- it is charged, as docs/design.md requires.
    ``head_recompute``: the backward recomputes the ``logits`` positions' logits before their
    input gradient, one more head pass (TRL's chunked log-prob head, which keeps no logits
    between its forward and backward): executed FLOPs, not a model FLOP of the algorithm.
    """
    if inputs_require_grad is None:
        inputs_require_grad = grad_ckpt
    fwd = forward_flops(arch, n_tokens, logits=logits, lora=lora, attention=attention)
    bwd = backward_flops(arch, n_tokens, logits=logits, lora=lora, attention=attention,
                         inputs_require_grad=inputs_require_grad)
    recompute = (checkpoint_recompute_flops(arch, n_tokens, lora=lora, attention=attention)
                 if grad_ckpt else 0)
    if head_recompute:
        recompute += _head(arch) * _logits(n_tokens, logits)
    return fwd + bwd + recompute


# --------------------------------------------------------------------------- generation


def generate_flops(arch: Arch, prompt_len: int, new_tokens: int, *, lora: LoraSpec | None = None,
                   executed: bool = False, padded_prompt_len: int | None = None,
                   decode_steps: int | None = None, attention: str = "full",
                   cache_len: int | None = None, prefill_keys: int | None = None) -> int:
    """KV-cached ``model.generate`` of ``new_tokens`` tokens after a prompt, one sequence.

    As transformers 5.24 does it (measured): one prefill forward over the prompt whose LM head
    runs at the last position only (``generate`` passes ``logits_to_keep=1``), then one cached
    decode forward per further token, each with one logit; the decode producing token j+1 has
    ``prompt + j`` keys. G new tokens = 1 prefill + G-1 decodes (no forward after the last).

    Model FLOPs (``executed=False``): the real ``prompt_len``, causal prefill, ``new_tokens - 1``
    decodes. Executed: the prefill over ``padded_prompt_len`` (the batch's left-padded width)
    with the full block (``attention`` "full" or "sdpa": equal for a forward), and
    ``decode_steps`` decode forwards (default ``new_tokens - 1``): a batch keeps computing every
    row, finished or not, until its longest completion stops, so pass the batch's number of
    decode forwards (generated width - 1). Decodes attend to the padded context. ``cache_len``
    (executed only): a static KV cache of that many positions, which every decode's attention
    reads whole, written or not (the mask hides the rest); the prefill's queries attend to
    ``prefill_keys`` keys (default ``cache_len``; transformers' SDPA path cuts them to the prompt
    when no row of the batch is padded).
    """
    prompt_len = _check_count("prompt_len", prompt_len)
    new_tokens = _check_count("new_tokens", new_tokens)
    if new_tokens == 0:
        return 0
    if executed:
        prompt = prompt_len if padded_prompt_len is None else _check_count(
            "padded_prompt_len", padded_prompt_len)
        if prompt < prompt_len:
            raise ValueError(f"padded_prompt_len ({prompt}) < prompt_len ({prompt_len})")
        steps = new_tokens - 1 if decode_steps is None else _check_count(
            "decode_steps", decode_steps)
        mode = attention
    else:
        prompt, steps, mode = prompt_len, new_tokens - 1, "causal"
    if prompt < 1:
        raise ValueError("generation needs a prompt of at least one token")
    if executed and cache_len is not None:
        if cache_len < prompt + steps:
            raise ValueError(f"cache_len ({cache_len}) < the positions generated "
                             f"({prompt + steps})")
        keys = cache_len if prefill_keys is None else prefill_keys
        prefill = forward_flops(arch, prompt, past=keys - prompt, logits=1, lora=lora,
                                attention="full")
        return prefill + steps * forward_flops(arch, 1, past=cache_len - 1, logits=1, lora=lora)
    prefill = forward_flops(arch, prompt, logits=1, lora=lora, attention=mode)
    return prefill + _decodes_flops(arch, prompt, steps, lora)


def _decodes_flops(arch: Arch, prompt: int, steps: int, lora: LoraSpec | None) -> int:
    """``steps`` cached decode forwards after ``prompt`` keys, in closed form.

    Decode j (1-based) is ``forward_flops(arch, 1, past=prompt + j - 1, logits=1)``: a fixed
    part plus attention over ``prompt + j`` keys (a single query attends to every cached key
    and itself, causal or full alike). Summing the arithmetic series once instead of calling
    :func:`forward_flops` per token keeps the online meter O(rows) per step, not O(tokens).
    """
    if steps == 0:
        return 0
    fixed = forward_flops(arch, 1, past=0, logits=1, lora=lora)  # attends to 1 key
    keys = steps * prompt + steps * (steps + 1) // 2
    return steps * fixed + arch.layers * 2 * _attention_matmul(arch, keys - steps)


def decode_token_flops(arch: Arch, context: int, *, lora: LoraSpec | None = None) -> int:
    """One cached decode forward for a token that attends to ``context`` keys (itself
    included), logits at that one position: the cost of one generated token."""
    context = _check_count("context", context, low=1)
    return forward_flops(arch, 1, past=context - 1, logits=1, lora=lora)


# --------------------------------------------------------------------------- reward models


def reward_head_flops(arch: Arch, positions: int, *, head: str = "token",
                      num_labels: int = 2) -> int:
    """The classification head of a reward model over ``positions`` positions.

    token / sequence: ``Linear(d, num_labels)`` (2·d·num_labels per position; transformers'
    ``Qwen2ForSequenceClassification`` scores every position and only then pools the last
    non-pad one). prm_mlp: Qwen2.5-Math-PRM's ``Linear(d, d) -> ReLU -> Linear(d, 2)``.
    """
    if head not in REWARD_HEADS:
        raise ValueError(f"head must be one of {REWARD_HEADS}, got {head!r}")
    d = arch.hidden
    per_position = 2 * d * d + 2 * d * 2 if head == "prm_mlp" else 2 * d * num_labels
    return per_position * positions


def reward_model_flops(arch: Arch, n_tokens: int, *, head: str = "token", num_labels: int = 2,
                       score_positions: int | None = None, lora: LoraSpec | None = None,
                       attention: str = "causal") -> int:
    """Forward of a reward / feedback model: the backbone (no LM head) plus its score head.

    ``score_positions`` = positions the head runs at (default all ``n_tokens``: what all three
    heads execute in transformers; pass fewer only for an implementation that slices first).
    """
    n_tokens = _check_count("n_tokens", n_tokens)
    positions = _logits(n_tokens, score_positions)
    backbone = forward_flops(arch, n_tokens, logits=0, lora=lora, attention=attention)
    return backbone + reward_head_flops(arch, positions, head=head, num_labels=num_labels)


# --------------------------------------------------------------------------- batches
#
# The meter knows, per batch, each row's real length and the padded width the model ran on.
# Each helper takes both and returns the model number (executed=False: every row at its own
# length, causal) or the executed one (executed=True: every row at the padded width, the
# kernel's full attention block). Call it twice for the pair.


def _executed_attention(attn_implementation: str) -> str:
    if attn_implementation not in ATTN_IMPLEMENTATIONS:
        raise ValueError(f"attn_implementation must be one of {ATTN_IMPLEMENTATIONS}, "
                         f"got {attn_implementation!r}")
    return "full" if attn_implementation == "eager" else "sdpa"


def _rows(lengths: Sequence[int], per_row: int | Sequence[int] | None,
          name: str) -> list[int | None]:
    if per_row is None or isinstance(per_row, int):
        return [per_row] * len(lengths)
    if len(per_row) != len(lengths):
        raise ValueError(f"{name} has {len(per_row)} entries for {len(lengths)} rows")
    return list(per_row)


def _padded(lengths: Sequence[int], padded_len: int | None) -> int:
    width = max(lengths) if padded_len is None else int(padded_len)
    if lengths and width < max(lengths):
        raise ValueError(f"padded_len ({width}) < longest row ({max(lengths)})")
    return width


def _executed_logits(logits: list[int | None], padded_logits: int | None, width: int) -> int:
    if padded_logits is not None:
        return int(padded_logits)
    known = [n for n in logits if n is not None]
    # logits_to_keep slices the same number of last positions from every row: the widest.
    return max(known) if len(known) == len(logits) and known else width


def batch_forward_flops(arch: Arch, lengths: Sequence[int],
                        logits_per_seq: int | Sequence[int] | None = None, *,
                        executed: bool = False, padded_len: int | None = None,
                        padded_logits: int | None = None, lora: LoraSpec | None = None,
                        attn_implementation: str = "eager") -> int:
    """Forward over a padded batch.

    ``lengths``: real tokens per row; ``logits_per_seq``: LM-head positions per row (int for
    all rows, a list, or None = every real token). Model: sum over rows of their own length and
    logits. Executed: ``len(lengths)`` rows of ``padded_len`` (default the longest row) with the
    full block, ``padded_logits`` positions each (default the widest ``logits_per_seq``, as
    ``logits_to_keep`` slices the same count from every row, or ``padded_len``).
    """
    logits = _rows(lengths, logits_per_seq, "logits_per_seq")
    if not executed:
        return sum(forward_flops(arch, n, logits=g, lora=lora)
                   for n, g in zip(lengths, logits, strict=True))
    width = _padded(lengths, padded_len)
    return len(lengths) * forward_flops(
        arch, width, logits=_executed_logits(logits, padded_logits, width), lora=lora,
        attention=_executed_attention(attn_implementation))


def batch_train_flops(arch: Arch, lengths: Sequence[int],
                      logits_per_seq: int | Sequence[int] | None = None, *,
                      executed: bool = False, padded_len: int | None = None,
                      padded_logits: int | None = None, lora: LoraSpec | None = None,
                      grad_ckpt: bool = False, attn_implementation: str = "eager") -> int:
    """Forward + backward over a padded batch (see :func:`batch_forward_flops` for the rows).

    Model FLOPs include the checkpoint recompute only if ``grad_ckpt`` -- it is compute the run
    chose to spend, so it is charged (docs/design.md).
    """
    logits = _rows(lengths, logits_per_seq, "logits_per_seq")
    if not executed:
        return sum(train_flops(arch, n, logits=g, lora=lora, grad_ckpt=grad_ckpt)
                   for n, g in zip(lengths, logits, strict=True))
    width = _padded(lengths, padded_len)
    return len(lengths) * train_flops(
        arch, width, logits=_executed_logits(logits, padded_logits, width), lora=lora,
        grad_ckpt=grad_ckpt, attention=_executed_attention(attn_implementation))


def batch_generate_flops(arch: Arch, prompt_lens: Sequence[int], new_tokens: Sequence[int], *,
                         executed: bool = False, padded_prompt_len: int | None = None,
                         generated_width: int | None = None,
                         lora: LoraSpec | None = None, cache_len: int | None = None,
                         prefill_keys: int | None = None) -> int:
    """``model.generate`` over a left-padded batch of prompts.

    ``new_tokens``: real completion length per row (EOS included). Model: each row's own prompt
    and completion. Executed: every row runs the prefill over ``padded_prompt_len`` (default the
    longest prompt) and ``generated_width - 1`` decodes, where ``generated_width`` (default the
    longest completion) is the batch's number of generated columns; with a static KV cache of
    ``cache_len`` positions every decode attends to all of them, the prefill to
    ``prefill_keys`` (:func:`generate_flops`).
    """
    if len(prompt_lens) != len(new_tokens):
        raise ValueError(f"{len(prompt_lens)} prompts but {len(new_tokens)} completion lengths")
    if not executed:
        return sum(generate_flops(arch, p, g, lora=lora)
                   for p, g in zip(prompt_lens, new_tokens, strict=True))
    if not prompt_lens:
        return 0
    width = _padded(prompt_lens, padded_prompt_len)
    gen = max(new_tokens) if generated_width is None else int(generated_width)
    if gen == 0:
        return 0
    return len(prompt_lens) * generate_flops(
        arch, width, gen, lora=lora, executed=True, padded_prompt_len=width,
        decode_steps=gen - 1, cache_len=cache_len, prefill_keys=prefill_keys)


def projection_weights(arch: Arch, names) -> int:
    """Weights of the named projections (:meth:`Arch.projections`) over every layer."""
    proj = arch.projections()
    return arch.layers * sum(proj[t][0] * proj[t][1] for t in names)


def adapted_weights(arch: Arch, lora: LoraSpec) -> int:
    """Frozen weights the adapters adapt: ``d_in·d_out`` per adapted module per layer."""
    return projection_weights(arch, lora.targets)


def lora_merge_flops(arch: Arch, lora: LoraSpec) -> int:
    """Merging the adapters into a copy of the weights they adapt: ``B·A`` for every adapted
    module of every layer, ``2·r·d_in·d_out`` each (the scaling and the add are elementwise,
    not counted)."""
    return 2 * lora.rank * adapted_weights(arch, lora)


def batch_reward_flops(arch: Arch, lengths: Sequence[int], *, head: str = "token",
                       num_labels: int = 2, executed: bool = False,
                       padded_len: int | None = None, attn_implementation: str = "eager") -> int:
    """Reward-model forward over a padded batch (heads run at every position, padding too)."""
    if not executed:
        return sum(reward_model_flops(arch, n, head=head, num_labels=num_labels)
                   for n in lengths)
    width = _padded(lengths, padded_len)
    return len(lengths) * reward_model_flops(
        arch, width, head=head, num_labels=num_labels,
        attention=_executed_attention(attn_implementation))


# --------------------------------------------------------------------------- resolving specs


def _load_config_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read model config {str(path)!r}: {exc}") from exc


def resolve_arch(spec: str | Path, vocab: int | None = None) -> Arch:
    """The :class:`Arch` of a config.json path, a model directory (holding config.json), a
    ladder name (vocabulary ``vocab`` or :data:`LADDER_REFERENCE_VOCAB`) or a known Qwen2.5
    name ("Qwen2.5-0.5B" or "Qwen/Qwen2.5-0.5B"). ``vocab`` overrides any config's vocabulary.
    """
    from race.flops import known_configs

    text = str(spec)
    path = Path(text)
    if text in LADDER_DIALS:
        arch = Arch.from_config(ladder.config_dict(text, vocab or LADDER_REFERENCE_VOCAB))
    elif known_configs.is_known(text):
        arch = Arch.from_config(known_configs.config_dict(text))
    elif path.is_file():
        arch = Arch.from_config(_load_config_json(path))
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise ValueError(f"model directory {text!r} has no config.json")
        arch = Arch.from_config(_load_config_json(path / "config.json"))
    else:
        raise ValueError(
            f"unknown model {text!r}: not a config.json, a model directory, a ladder size "
            f"({', '.join(LADDER_DIALS)}) or a known config ({', '.join(known_configs.names())})")
    return arch if vocab is None else arch.with_vocab(vocab)
