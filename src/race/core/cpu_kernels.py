"""One CPU kernel path on every x86-64 machine with AVX2, so a study gives the same bits on each
Intel one (on other vendors' processors MKL ignores the pin: see "What not").

Why: PyTorch picks its vectorised CPU kernels (ATen's ``CPU_CAPABILITY``: DEFAULT, AVX2,
AVX512) and MKL its GEMM code path by the processor it finds. The paths sum in different
orders, so a forward and backward pass on an AVX-512 machine differs in the last bits from the
same pass on an AVX2 machine; a few thousand optimizer steps turn that into a different model.
Measured on one AVX-512 machine: the same code and seed pretrained nano to greedy eval-in 0.29
on its own path and 0.3225 pinned (``bench/performance/cpu_kernels.py`` prints the bit-level check).

What: :func:`pin_cpu_kernels` sets ``ATEN_CPU_CAPABILITY=avx2`` and ``MKL_CBWR=AVX2`` (MKL's
conditional numerical reproducibility) in this process's environment -- inherited by every job
it starts -- when the processor supports AVX2 and the user has not set them. Both are read at
the first CPU kernel call, not at ``import torch``, so importing :mod:`race` (which calls it)
before any tensor is computed is enough. A value the user sets wins: ``ATEN_CPU_CAPABILITY=
avx512`` (or ``default``) and ``MKL_CBWR=AUTO`` give the machine's own, unpinned path.

The ATen kernels are then the same compiled code on every such machine, and MKL's
reproducibility branch promises the same results across Intel processors at the same thread
count (each job's ``threads``).

What not: MKL honours branches other than ``AUTO`` and ``COMPATIBLE`` on Intel processors only;
on others (AMD) it silently computes on its ``AUTO`` branch instead (Intel's oneMKL developer
guide, "Specifying Code Branches"), so their numbers match only processors of their own kind.
Measured: the default study, same code and seed, on an AMD EPYC (AVX-512) machine gave other
base policies and another draw of every number than the machine its committed reports came
from (docs/design.md, §7). Each run records the processor's vendor beside the path
(:func:`race.policy.device.kernel_path`), so two runs say whether they should agree.
``COMPATIBLE`` (SSE2) would hold across vendors, at a cost ``bench/performance/cpu_kernels.py``
measures (its *compatible* path: 2.04x per training step there). Machines without AVX2 and
other architectures (ARM) keep their own kernels; GPU kernels are not affected (CUDA
determinism is a separate matter).
``bench/performance/cpu_kernels.py`` measures what the pin costs in speed.
"""

from __future__ import annotations

import os
import platform
from collections.abc import MutableMapping
from pathlib import Path

#: The pinned values: the AVX2 path exists on every x86-64 server and laptop since about 2013.
PINNED = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2"}


def _cpuinfo_field(key: str, cpuinfo: str | None) -> str | None:
    """The value of the first ``key`` line of ``cpuinfo`` (default: this machine's
    ``/proc/cpuinfo``); None where there is no such line or no such file (not Linux)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    for line in cpuinfo.splitlines():
        if line.startswith(key):
            return line.split(":", 1)[1].strip()
    return None


def has_avx2(cpuinfo: str | None = None, machine: str | None = None) -> bool:
    """Whether this is an x86-64 processor with AVX2 and FMA (Linux: ``/proc/cpuinfo``'s
    flags; elsewhere unknown, so False: an AVX2 kernel on a processor without it would crash,
    while an unpinned path only loses cross-machine identity)."""
    machine = (machine or platform.machine()).lower()
    if machine not in ("x86_64", "amd64"):
        return False
    flags = _cpuinfo_field("flags", cpuinfo)
    return flags is not None and {"avx2", "fma"} <= set(flags.split())


def cpu_vendor(cpuinfo: str | None = None) -> str:
    """The processor's vendor as Linux names it (``GenuineIntel``, ``AuthenticAMD``; from
    ``/proc/cpuinfo``), ``unknown`` where it says none: whether MKL's pinned branch applies."""
    return _cpuinfo_field("vendor_id", cpuinfo) or "unknown"


def pin_cpu_kernels(environ: MutableMapping[str, str] | None = None,
                    avx2: bool | None = None) -> dict[str, str]:
    """Set the :data:`PINNED` variables in ``environ`` (default ``os.environ``) where unset and
    the processor supports them; returns the ones this call set (empty when it set none)."""
    environ = os.environ if environ is None else environ
    if not (has_avx2() if avx2 is None else avx2):
        return {}
    unset = {k: v for k, v in PINNED.items() if k not in environ}
    environ.update(unset)
    return unset


def kernel_settings() -> dict[str, str]:
    """The kernel-path variables as this process (and the jobs it starts) sees them, ``unset``
    where none is set, and the processor's vendor: what a study run records, without importing
    torch."""
    return {**{f"cpu_kernels.{k}": os.environ.get(k, "unset") for k in PINNED},
            "cpu_kernels.vendor": cpu_vendor()}
