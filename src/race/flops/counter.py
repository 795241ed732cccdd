"""Measured FLOP counts: torch's ``FlopCounterMode`` with every SDPA kernel counted.

``F.scaled_dot_product_attention`` (``attn_implementation="sdpa"``) dispatches to a fused
kernel that depends on the device: on a CPU ``aten._scaled_dot_product_flash_attention_for_cpu``
(and its ``_backward``), on CUDA the flash, memory-efficient or cuDNN kernel
(``aten._scaled_dot_product_{flash,efficient,cudnn}_attention`` and their ``_backward``).

- Torch's FLOP registry has no entry for the CPU kernels: ``FlopCounterMode`` would silently
  count them as 0 and a measured count would lose all attention.
  :func:`register_cpu_sdpa_formulas` adds them to the registry.
- Torch does register the CUDA kernels, but before 2.13 (e.g. 2.11) its formulas assert on a
  grouped-query call, which transformers makes with the unexpanded key/value heads of every
  Qwen2.5 model ("query/key/value shapes are incompatible"). :func:`count_flops` therefore maps
  the CUDA kernels to the formulas here, whatever the torch version.

- Torch registers ``aten.addmm`` but not its in-place ``aten.addmm_``, which TRL's chunked
  log-prob head uses for the hidden-state gradient (``acc.addmm_(a, b)``: on the CPU, and on
  CUDA in float32): uncounted, that is one LM-head pass per trained position lost.
  In bf16 on CUDA the same head calls ``torch.addmm(acc, a, b, out_dtype=torch.float32,
  out=acc)`` (``aten.addmm.dtype_out``), whose positional ``out_dtype`` torch's own addmm
  formula takes for its ``out_shape`` (``TypeError: addmm_flop() got multiple values for
  argument 'out_shape'``). :func:`count_flops` maps both packets to the product's FLOPs.

One convention for all of them, torch's own for its SDPA kernels:

- forward: the two attention matmuls over the full block, ``2 * (2·B·H_q·S_q·S_k·d)``, whatever
  ``is_causal`` or the mask (torch's CUDA formulas ignore causality too);
- backward: five block matmuls -- the recomputed scores ``Q·Kᵀ``, then ``dP``, ``dV``, ``dQ`` and
  ``dK`` -- as the fused kernel always computes every input gradient.

Query heads count: grouped keys and values (fewer heads, a divisor of the query heads) are
broadcast by the kernel, so a GQA call costs what the same call with expanded heads costs.

Measuring costs ~2.5x wall time: use it to calibrate the analytic model (tests, ``bench/``),
never to meter a production run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch.utils import flop_counter as _fc

_aten = torch.ops.aten

#: The CPU SDPA ops that need formulas (packets, as ``register_flop_formula`` wants them).
CPU_SDPA_FORWARD = _aten._scaled_dot_product_flash_attention_for_cpu
CPU_SDPA_BACKWARD = _aten._scaled_dot_product_flash_attention_for_cpu_backward
#: The CUDA SDPA kernels (flash, memory-efficient, cuDNN): forward ops take (query, key, value,
#: ...), backward ops (grad_out, query, key, value, ...), as the CPU ones do.
CUDA_SDPA_FORWARD = (_aten._scaled_dot_product_flash_attention,
                     _aten._scaled_dot_product_efficient_attention,
                     _aten._scaled_dot_product_cudnn_attention)
CUDA_SDPA_BACKWARD = (_aten._scaled_dot_product_flash_attention_backward,
                      _aten._scaled_dot_product_efficient_attention_backward,
                      _aten._scaled_dot_product_cudnn_attention_backward)


def _block_matmul(batch: int, heads: int, rows: int, inner: int, cols: int) -> int:
    """FLOPs of ``heads * batch`` matmuls of (rows × inner) @ (inner × cols): 2 per multiply-add."""
    return 2 * batch * heads * rows * inner * cols


def _check_shapes(query_shape, key_shape, value_shape) -> tuple[int, int, int, int, int, int]:
    b, h_q, s_q, d_q = query_shape
    b_k, h_kv, s_k, d_k = key_shape
    b_v, h_v, s_v, d_v = value_shape
    if not (b == b_k == b_v and h_kv == h_v and s_k == s_v and d_q == d_k):
        raise ValueError(f"incompatible SDPA shapes q={query_shape} k={key_shape} v={value_shape}")
    if h_q % h_kv:
        raise ValueError(f"query heads {h_q} are not a multiple of key/value heads {h_kv}")
    return b, h_q, s_q, s_k, d_q, d_v


def sdpa_forward_flops(query_shape, key_shape, value_shape, *args, out_shape=None,
                           **kwargs) -> int:
    """FLOPs of one SDPA forward: scores ``Q·Kᵀ`` and output ``P·V`` over the full block."""
    b, h, s_q, s_k, d_qk, d_v = _check_shapes(query_shape, key_shape, value_shape)
    return _block_matmul(b, h, s_q, d_qk, s_k) + _block_matmul(b, h, s_q, s_k, d_v)


def sdpa_backward_flops(grad_out_shape, query_shape, key_shape, value_shape, *args,
                            out_shape=None, **kwargs) -> int:
    """FLOPs of one SDPA backward: recomputed scores, then dP, dV, dQ and dK (5 matmuls)."""
    b, h, s_q, s_k, d_qk, d_v = _check_shapes(query_shape, key_shape, value_shape)
    if tuple(grad_out_shape) != (b, h, s_q, d_v):
        raise ValueError(f"grad_out shape {grad_out_shape} does not match q={query_shape}")
    scores = _block_matmul(b, h, s_q, d_qk, s_k)  # recomputed S = Q·Kᵀ
    d_p = _block_matmul(b, h, s_q, d_v, s_k)  # dP = dO·Vᵀ
    d_v_flops = _block_matmul(b, h, s_k, s_q, d_v)  # dV = Pᵀ·dO
    d_q = _block_matmul(b, h, s_q, s_k, d_qk)  # dQ = dS·K
    d_k = _block_matmul(b, h, s_k, s_q, d_qk)  # dK = dSᵀ·Q
    return scores + d_p + d_v_flops + d_q + d_k


def register_cpu_sdpa_formulas() -> None:
    """Add the CPU SDPA formulas to torch's global FLOP registry (idempotent).

    ``register_flop_formula`` raises on a duplicate registration, so an op already present --
    registered by an earlier call, or by a future torch that ships its own formula -- is left
    as it is.
    """
    formulas = {CPU_SDPA_FORWARD: sdpa_forward_flops,
                CPU_SDPA_BACKWARD: sdpa_backward_flops}
    for op, formula in formulas.items():
        if op not in _fc.flop_registry:
            _fc.register_flop_formula(op)(formula)


def cuda_sdpa_formulas() -> dict:
    """The CUDA SDPA kernels mapped to this module's formulas (``FlopCounterMode``'s
    ``custom_mapping``: it takes precedence over torch's registry)."""
    return {**{op: sdpa_forward_flops for op in CUDA_SDPA_FORWARD},
            **{op: sdpa_backward_flops for op in CUDA_SDPA_BACKWARD}}


def addmm_flops(self_shape, a_shape, b_shape, *args, out_shape=None, **kwargs) -> int:
    """``torch.addmm(c, a, b)`` in every overload (``out=``, ``out_dtype=``) and in place
    (``acc.addmm_(a, b)``): the product ``a @ b`` (the accumulation is not a matmul). ``*args``
    takes the ``out_dtype`` of ``aten.addmm.dtype``/``dtype_out``."""
    (rows, inner), (_, cols) = a_shape, b_shape
    return 2 * rows * inner * cols


@dataclass
class FlopCount:
    """Result holder of :func:`count_flops`; ``total`` is filled when the block exits."""

    total: int = 0
    by_op: dict[str, int] | None = None
    _mode: _fc.FlopCounterMode | None = field(default=None, repr=False, compare=False)

    def so_far(self) -> int:
        """The running total inside the block (e.g. around one phase of a training step)."""
        return int(self._mode.get_total_flops()) if self._mode is not None else self.total


@contextmanager
def count_flops(display: bool = False) -> Iterator[FlopCount]:
    """Count the FLOPs torch executes inside the block (every SDPA kernel, GQA included).

    Usage::

        with count_flops() as fc:
            model(ids).logits.sum().backward()
        fc.total      # int FLOPs, forward + backward
        fc.by_op      # {"aten.mm": ..., "aten._scaled_dot_product_flash_attention_for_cpu": ...}

    Only ops with a formula are counted (matmuls and attention kernels): norms, activations,
    softmax and element-wise ops count 0, the same convention as the analytic model.
    """
    register_cpu_sdpa_formulas()
    result = FlopCount()
    mapping = {**cuda_sdpa_formulas(), _aten.addmm: addmm_flops, _aten.addmm_: addmm_flops}
    mode = _fc.FlopCounterMode(display=display, custom_mapping=mapping)
    result._mode = mode
    with mode:
        yield result
    result.total = int(mode.get_total_flops())
    result.by_op = {str(op): int(n) for op, n in mode.get_flop_counts().get("Global", {}).items()}


def measure_flops(fn, *args, **kwargs) -> int:
    """FLOPs of ``fn(*args, **kwargs)`` as counted by :func:`count_flops`."""
    with count_flops() as fc:
        fn(*args, **kwargs)
    return fc.total


# --------------------------------------------------------------------------- measurements
# Small drivers that run one phase of a transformers model under count_flops, shared by the
# tests and bench/calibration/flops_calibration.py.


def measure_forward(model, input_ids, attention_mask=None, logits_to_keep: int = 0) -> int:
    """FLOPs of one no-grad forward (``logits_to_keep=0``: logits at every position)."""
    kwargs = {"attention_mask": attention_mask}
    if logits_to_keep:
        kwargs["logits_to_keep"] = logits_to_keep
    with torch.no_grad(), count_flops() as fc:
        model(input_ids=input_ids, **kwargs)
    return fc.total


def measure_train_step(model, input_ids, attention_mask=None, logits_to_keep: int = 0,
                       loss: str = "cross_entropy") -> int:
    """FLOPs of forward + backward of one loss over the kept logits.

    ``loss``: "cross_entropy" (next-token loss on the kept positions) or "sum" (logits.sum()).
    """
    kwargs = {"attention_mask": attention_mask}
    if logits_to_keep:
        kwargs["logits_to_keep"] = logits_to_keep
    with count_flops() as fc:
        logits = model(input_ids=input_ids, **kwargs).logits
        if loss == "sum":
            value = logits.sum()
        else:
            targets = input_ids[:, -logits.shape[1]:]
            value = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                      targets.flatten())
        value.backward()
    return fc.total


def measure_generate(model, input_ids, new_tokens: int, attention_mask=None) -> tuple[int, int]:
    """(FLOPs, generated width) of a greedy KV-cached ``model.generate``.

    ``min_new_tokens = max_new_tokens = new_tokens`` fixes the length (EOS is suppressed until
    then), so the width is ``new_tokens`` unless the model's config says otherwise.
    """
    with torch.no_grad(), count_flops() as fc:
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask,
                             max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, use_cache=True)
    return fc.total, int(out.shape[1] - input_ids.shape[1])
