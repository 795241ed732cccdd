"""Where a model job computes: the config's ``device`` key, resolved in the job's own process.

``auto`` (the default) is CUDA when torch sees a GPU, else the CPU; ``cpu`` and ``cuda`` force
one (``cuda`` on a machine without a visible GPU is an error that names the key, raised before
any model is loaded). The key is resolved where the job runs, not where the workflow is parsed:
on a cluster, the login node that parses the Snakefile has no GPU while the training node does.

Every model verb (pretrain, prm, train, evaluate) and every feedback model it loads compute on
the resolved device; on the CPU nothing moves, so the CPU default's results are unchanged.
On CUDA, float32 matmuls may use TF32 (``torch.set_float32_matmul_precision("high")``): about
10 mantissa bits instead of 23 for each product, with float32 accumulation -- what PyTorch
recommends for float32 training on Ampere and later GPUs. bfloat16 weights (``training.dtype``)
are not affected by it. The FLOP ledger counts the same matmuls on every device.
"""

from __future__ import annotations

import os

from race.core.cpu_kernels import cpu_vendor
from race.core.errors import ConfigError
from race.core.specs import DEVICES


def resolve_device(name: str | None = "auto") -> str:
    """``"cpu"`` or ``"cuda"`` for the ``device`` key's ``name`` (None: ``auto``)."""
    import torch

    name = name or "auto"
    if name not in DEVICES:
        raise ConfigError(f"device: expected one of {', '.join(DEVICES)}, got {name!r}")
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device: cuda, but torch sees no CUDA device on this machine "
                          "(set device: auto or cpu, or run the job where a GPU is visible)")
    return name


def prepare_device(name: str | None = "auto", dtype: str | None = None, *,
                   one_gpu: bool = False) -> str:
    """:func:`resolve_device`, and on CUDA let float32 matmuls use TF32 (module docstring).

    Refused on CUDA, before anything is loaded (a :class:`ConfigError` naming the key):
    ``dtype`` ``bfloat16`` (``training.dtype``) on a GPU without native bfloat16 (before
    Ampere; torch would emulate it, slowly); and with ``one_gpu``, for the trainer, whose meter
    counts one process's FLOPs: a distributed launch (``WORLD_SIZE`` above 1), or several
    visible GPUs outside a launch, where TRL would wrap the policy in DataParallel and fail
    only after the models are loaded. A job given one GPU (SLURM's ``gpu: 1``,
    ``CUDA_VISIBLE_DEVICES``, ``torchrun --nproc_per_node 1``) passes, and so does a job of a
    local Snakemake run, which claims its own device first (:mod:`race.policy.gpus`)."""
    import torch

    device = resolve_device(name)
    if device != "cuda":
        return device
    if dtype == "bfloat16" and not torch.cuda.is_bf16_supported(including_emulation=False):
        raise ConfigError(f"training.dtype: bfloat16, but {torch.cuda.get_device_name()} has "
                          "no native bfloat16 (set training.dtype: float32)")
    if one_gpu:
        launched = int(os.environ.get("WORLD_SIZE", "0") or 0)
        if launched > 1:
            raise ConfigError(f"device: a distributed launch of {launched} processes, and a "
                              "training job runs in one (its FLOP meter counts one process)")
        visible = torch.cuda.device_count()
        if visible > 1 and not launched:
            raise ConfigError(f"device: {visible} GPUs are visible, and a training job runs "
                              "on one: give each job one GPU (CUDA_VISIBLE_DEVICES, or the "
                              "SLURM profile's gpu: 1)")
    torch.set_float32_matmul_precision("high")
    return device


def kernel_path() -> dict[str, str]:
    """The kernel path this process computes with (recorded beside a run's device): ATen's CPU
    capability, MKL's reproducibility branch as set (``auto`` when unset) and the processor's
    vendor (a branch other than ``AUTO`` / ``COMPATIBLE`` holds on ``GenuineIntel`` only)."""
    import torch

    return {"cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "mkl_cbwr": os.environ.get("MKL_CBWR", "auto"), "cpu_vendor": cpu_vendor()}
