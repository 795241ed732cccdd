"""A compact decode loop for Qwen2 causal LMs: the ``fused`` rollout engine (race.core.engines).

On the small policies of a CPU study, ``model.generate`` is bound by per-call overhead, not
arithmetic: each decoded token walks transformers' module tree, mask builders, cache objects
and logits processors, a few hundred Python-level calls for a few dozen matmuls.
:class:`FusedDecoder` runs the same arithmetic with fewer, larger calls:

- the query, key and value projections as one matmul (their weights and biases concatenated),
  the gate and up projections as one, rotary embeddings applied to queries and keys together;
- a key/value cache allocated once per call and written in place;
- rotary cos/sin from the model's own rotary module (so every rope type it supports), built
  once per call for every position the call can reach.

What it computes is Qwen2's forward as transformers writes it (RMSNorm in float32, SDPA with
scale ``head_dim^-1/2``, grouped-query attention), so logits agree with the model's to float
rounding (tested). The FLOPs are the same matmuls as ``generate`` with a dynamic cache: one
prefill over the left-padded prompt with logits at its last position, then one decode per
further token attending to every cached position so far; the batch keeps decoding finished
rows (fed the pad token, as ``generate`` does) until every row has produced EOS or the cap.
Sampling is ``generate``'s at ``top_k=0, top_p=1``: softmax of float32 logits over the
temperature, one multinomial draw per row; greedy is the argmax. Random draws are not
``generate``'s (another order of calls), so samples agree in distribution, not token for token.

Only what the decoder reads is supported: a ``qwen2`` model without sliding-window layers,
attention dropout or a rope type whose frequencies depend on the sequence length; anything
else is refused by :func:`check_supported` with the key that rules it out. Sampling settings
that add logits processors (a repetition penalty, suppressed tokens, ...) are ``generate``'s
business: :func:`plain_sampling` tells a caller when the decoder may stand in for it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def check_supported(config) -> None:
    """Raise ValueError naming the config key that keeps a model off the fused decoder."""
    if getattr(config, "model_type", None) != "qwen2":
        raise ValueError(f"the fused rollout engine decodes qwen2 models, got model_type "
                         f"{getattr(config, 'model_type', None)!r}")
    if getattr(config, "hidden_act", "silu") != "silu":
        raise ValueError(f"the fused rollout engine needs hidden_act 'silu', got "
                         f"{config.hidden_act!r}")
    if getattr(config, "use_sliding_window", False) or any(
            t != "full_attention" for t in getattr(config, "layer_types", None) or ()):
        raise ValueError("the fused rollout engine has no sliding-window attention "
                         "(config use_sliding_window / layer_types)")
    if getattr(config, "attention_dropout", 0.0):
        raise ValueError(f"the fused rollout engine applies no attention dropout, config "
                         f"attention_dropout is {config.attention_dropout}")
    rope = (getattr(config, "rope_parameters", None) or {}).get("rope_type", "default")
    if rope in ("dynamic", "longrope"):
        # Their frequencies follow the longest position of each forward; the decoder builds
        # cos/sin once per call.
        raise ValueError(f"the fused rollout engine has no {rope!r} rope (config "
                         f"rope_parameters.rope_type)")


#: Generation-config fields that make ``generate`` add a logits processor (or a length rule)
#: beyond temperature sampling, and their neutral values.
_NEUTRAL = {"repetition_penalty": 1.0, "encoder_repetition_penalty": 1.0,
            "no_repeat_ngram_size": 0, "bad_words_ids": None, "suppress_tokens": None,
            "begin_suppress_tokens": None, "forced_bos_token_id": None,
            "forced_eos_token_id": None, "min_new_tokens": 0, "min_length": 0,
            "sequence_bias": None, "exponential_decay_length_penalty": None,
            "min_p": None, "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0}


def plain_sampling(generation_config) -> bool:
    """Whether ``generate`` with this config (and ``top_k=0, top_p=1`` passed, as RACE does)
    samples exactly as the decoder: no field of ``_NEUTRAL`` away from its neutral value."""
    return all(getattr(generation_config, k, v) in (v, None) or
               (v is None and not getattr(generation_config, k)) for k, v in _NEUTRAL.items())


def supports(model) -> bool:
    """Whether ``model`` is a plain Qwen2 causal LM the decoder can read (no PEFT wrapper:
    merge its adapters first)."""
    from transformers import Qwen2ForCausalLM

    try:
        check_supported(model.config)
    except ValueError:
        return False
    return isinstance(model, Qwen2ForCausalLM) and not any(
        hasattr(m, "base_layer") for m in model.modules())


def _linear(module):
    """The nn.Linear under a PEFT LoRA wrapper (whose weight, under
    race.policy.engines.merged_weights, is the merged copy), or the module itself."""
    return getattr(module, "base_layer", module)


class _Layer:
    """One decoder layer's weights, fused where two matmuls read the same input."""

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        q, k, v = (_linear(m) for m in (attn.q_proj, attn.k_proj, attn.v_proj))
        gate, up = _linear(mlp.gate_proj), _linear(mlp.up_proj)
        self.norm1 = layer.input_layernorm.weight
        self.norm2 = layer.post_attention_layernorm.weight
        self.qkv_w = torch.cat([q.weight, k.weight, v.weight]).detach()
        self.qkv_b = torch.cat([q.bias, k.bias, v.bias]).detach()
        self.o_w = _linear(attn.o_proj).weight.detach()
        self.gate_up_w = torch.cat([gate.weight, up.weight]).detach()
        self.down_w = _linear(mlp.down_proj).weight.detach()


class FusedDecoder:
    """The weights of a Qwen2 causal LM, read once (no copy but the fused concatenations) and
    decoded by :meth:`generate`. Build it from the weights to generate with: under the
    ``merged`` scheme (race.policy.engines.merged_weights), from inside that block, where a
    LoRA-wrapped projection reads as its base layer holding the merged weight.

    A decoder class of race.core.engines' table has this interface: the class built from a
    model, :meth:`generate`, and the three checks below (race.policy.engines)."""

    check_supported = staticmethod(check_supported)
    supports = staticmethod(supports)
    plain_sampling = staticmethod(plain_sampling)

    def __init__(self, model):
        check_supported(model.config)
        c = model.config
        body = model.model
        self.heads = c.num_attention_heads
        self.kv_heads = c.num_key_value_heads
        self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.eps = c.rms_norm_eps
        self.embed = body.embed_tokens.weight.detach()  # no autograd hooks on its reads
        self.layers = [_Layer(layer) for layer in body.layers]
        self.final_norm = body.norm.weight
        self.head = model.lm_head.weight
        self.rotary = body.rotary_emb
        self.dtype = self.embed.dtype
        self.device = self.embed.device

    def _norm(self, x, weight):
        # transformers' Qwen2RMSNorm: statistics in float32, the weight in the model's dtype.
        if x.dtype == torch.float32:
            return F.rms_norm(x, weight.shape, weight, self.eps)
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return weight * x32.to(x.dtype)

    def _rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    def _forward(self, hidden, cos, sin, keys, values, start, mask):
        """Run every layer on ``hidden`` (batch, new positions, hidden) whose positions start
        at cache column ``start``; ``mask`` (bool, broadcastable to batch × heads × new ×
        keys) says which cached keys each new position may read."""
        b, n, _ = hidden.shape
        h, kv, d = self.heads, self.kv_heads, self.head_dim
        end = start + n
        for i, layer in enumerate(self.layers):
            x = self._norm(hidden, layer.norm1)
            qkv = F.linear(x, layer.qkv_w, layer.qkv_b).view(b, n, h + 2 * kv, d).transpose(1, 2)
            qk = self._rope(qkv[:, :h + kv], cos, sin)
            keys[i][:, :, start:end] = qk[:, h:]
            values[i][:, :, start:end] = qkv[:, h + kv:]
            k, v = keys[i][:, :, :end], values[i][:, :, :end]
            q = qk[:, :h]
            if n == 1 and h != kv:
                # One query per row: the heads that share a key/value head become that head's
                # queries (transformers' pack_gqa), so nothing is repeated.
                q = q.reshape(b, kv, h // kv, d)
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
                out = out.reshape(b, h, 1, d)
            else:
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                                     enable_gqa=h != kv)
            hidden = hidden + F.linear(out.transpose(1, 2).reshape(b, n, h * d), layer.o_w)
            x = self._norm(hidden, layer.norm2)
            gate, up = F.linear(x, layer.gate_up_w).chunk(2, dim=-1)
            hidden = hidden + F.linear(F.silu(gate) * up, layer.down_w)
        return hidden

    def _logits(self, hidden):
        return F.linear(self._norm(hidden, self.final_norm), self.head).float()

    @torch.no_grad()
    def generate(self, input_ids, attention_mask, *, max_new_tokens: int, do_sample: bool,
                 temperature: float = 1.0, eos_token_ids=(), pad_token_id: int | None = None):
        """New tokens of a left-padded batch: a (batch, width) tensor where width is the
        number of columns decoded (the longest completion, EOS included, at most
        ``max_new_tokens``) and a row's columns after its first EOS hold ``pad_token_id``,
        as in ``generate``'s output past the prompt (no pad token: the first EOS id)."""
        b, p = input_ids.shape
        if max_new_tokens == 0:
            return input_ids.new_zeros(b, 0)
        total = p + max_new_tokens
        mask = attention_mask.bool()
        positions = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
        steps = torch.arange(1, max_new_tokens + 1, device=input_ids.device)
        positions = torch.cat([positions, positions[:, -1:] + steps], dim=1)
        cos, sin = self.rotary(self.embed[:1], positions)  # (batch, total, head_dim)
        cos, sin = cos[:, None], sin[:, None]
        shape = (b, self.kv_heads, total, self.head_dim)
        keys = [torch.empty(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        values = [torch.empty(shape, dtype=self.dtype, device=self.device) for _ in self.layers]
        # Decode reads every cached key of a row but its prompt's padding: an additive mask,
        # built once (a boolean one is converted on every attention call).
        valid = torch.cat([mask, mask.new_ones(b, max_new_tokens)], dim=1)
        key_bias = torch.zeros(b, 1, 1, total, dtype=self.dtype, device=self.device)
        key_bias.masked_fill_(~valid[:, None, None, :], float("-inf"))
        # Prefill: causal over the real prompt tokens; a padding position also reads itself,
        # so that no row of the softmax is empty (its output is never read).
        causal = torch.ones(p, p, dtype=torch.bool, device=self.device).tril()
        eye = torch.eye(p, dtype=torch.bool, device=self.device)
        prefill_mask = (causal & mask[:, None, :]) | eye
        hidden = self._forward(F.embedding(input_ids, self.embed), cos[:, :, :p], sin[:, :, :p],
                               keys, values, 0, prefill_mask[:, None])
        logits = self._logits(hidden[:, -1])
        eos_ids = [int(t) for t in eos_token_ids if t is not None]
        eos = torch.tensor(eos_ids, dtype=torch.long, device=self.device)
        # Without a pad token, generate pads finished rows with the first EOS id.
        pad = pad_token_id if pad_token_id is not None else (eos_ids[0] if eos_ids else 0)
        unfinished = torch.ones(b, dtype=torch.bool, device=self.device)
        new = []
        for t in range(max_new_tokens):
            if do_sample:
                token = torch.multinomial(torch.softmax(logits / temperature, dim=-1), 1)[:, 0]
            else:
                token = logits.argmax(dim=-1)
            token = torch.where(unfinished, token, pad)
            new.append(token)
            unfinished &= ~torch.isin(token, eos)
            if t + 1 == max_new_tokens or not bool(unfinished.any()):
                break
            at = p + t
            hidden = self._forward(F.embedding(token[:, None], self.embed),
                                   cos[:, :, at:at + 1], sin[:, :, at:at + 1], keys, values,
                                   at, key_bias[..., :at + 1])
            logits = self._logits(hidden[:, -1])
        return torch.stack(new, dim=1)
