"""A device's peak FLOP/s: what achieved FLOP/s are divided by to give utilisation (MFU).

Two sources, in this order:

- ``table``: the dense (no structured sparsity) tensor-core peak from the vendor's datasheet
  for the GPUs listed in :data:`GPU_PEAKS`, per compute dtype: ``bfloat16``, and ``float32``
  as TF32 (which :mod:`race.policy.device` enables for float32 matmuls on CUDA).
- ``measured``: anything else (every CPU, an unlisted GPU): the best rate of square matmuls in
  the job's dtype on this device and thread count (512 wide on a CPU, 8192 on a GPU, where
  small products would time kernel launches), timed for about 0.2 s. It is the rate this
  process can reach on a matmul-only workload, so utilisation against it says how far the
  phase's kernels (small shapes, attention, launch overhead) are from the device's matmul rate
  -- not from the hardware's theoretical peak.

FLOPs here are counted as everywhere in RACE: 2 per multiply-add.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

#: Dense peak FLOP/s by (name fragment, dtype), from NVIDIA's datasheets. The first fragment
#: found in ``torch.cuda.get_device_name()`` wins, so the more specific ones come first.
GPU_PEAKS: tuple[tuple[str, dict[str, float]], ...] = (
    ("H100 NVL", {}),  # not the SXM part, and not listed here: measured
    ("H100 PCIe", {"bfloat16": 756.0e12, "float32": 378.0e12}),
    ("H100", {"bfloat16": 989.4e12, "float32": 494.7e12}),  # SXM
    ("H200 NVL", {}),  # not the SXM part, and not listed here: measured
    ("H200", {"bfloat16": 989.4e12, "float32": 494.7e12}),
    ("A100", {"bfloat16": 312.0e12, "float32": 156.0e12}),
)


#: Side of the square matmuls timed for an unlisted GPU's measured peak.
GPU_MEASURE_SIZE = 8192


@dataclass(frozen=True)
class Peak:
    """``flops_per_s`` of ``name`` (a GPU's name, or "cpu") in ``dtype``; ``source``: table or
    measured (module docstring)."""

    flops_per_s: float
    source: str
    name: str
    dtype: str


def table_peak(name: str, dtype: str) -> float | None:
    """The datasheet peak of the GPU called ``name`` in ``dtype``, or None when not listed."""
    for fragment, peaks in GPU_PEAKS:
        if fragment in name:
            return peaks.get(dtype)
    return None


def measured_peak(device: str = "cpu", dtype: str = "float32", size: int = 512,
                  seconds: float = 0.2) -> float:
    """The best FLOP/s of ``size`` x ``size`` matmuls in ``dtype`` on ``device``, over a few
    timed batches filling about ``seconds`` (after one warm-up matmul)."""
    import torch

    # Not the global RNG (a training seed follows); on the device (8192-wide on a GPU).
    gen = torch.Generator(device=device).manual_seed(0)
    a, b = (torch.randn(size, size, generator=gen, device=device, dtype=getattr(torch, dtype))
            for _ in range(2))
    flops = 2 * size ** 3
    best, spent = 0.0, 0.0
    torch.mm(a, b)
    while spent < seconds:
        if device != "cpu":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(4):
            torch.mm(a, b)
        if device != "cpu":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - t0
        spent += elapsed
        best = max(best, 4 * flops / elapsed)
    return best


def utilisation(executed_flops: int, seconds: float, peak_flops: float | None) -> float | None:
    """Achieved over peak FLOP/s (MFU, from executed FLOPs: what the kernels ran); None
    without a peak or without time spent (a phase a step did not run)."""
    if not peak_flops or seconds <= 0:
        return None
    return executed_flops / seconds / peak_flops


def device_peak(device: str, dtype: str) -> Peak:
    """The peak of a resolved ``device`` (``cpu`` or ``cuda``) in ``dtype``: the table's for a
    listed GPU, else measured here."""
    if device == "cpu":
        return Peak(measured_peak("cpu", dtype), "measured", "cpu", dtype)
    import torch

    name = torch.cuda.get_device_name()
    listed = table_peak(name, dtype)
    if listed is not None:
        return Peak(listed, "table", name, dtype)
    # A GPU's matmul rate needs large products: at 512 x 512 one would time launches.
    return Peak(measured_peak(device, dtype, size=GPU_MEASURE_SIZE), "measured", name, dtype)
