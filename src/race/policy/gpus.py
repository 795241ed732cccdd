"""GPU jobs on a workstation: how many run at once, and which device each one computes on.

Snakemake limits a resource only where it is given a total (``--resources gpu=N``); without
one, every job that asks for a GPU (``resources.<group>.gpu``) may start at once and load its
models onto the same device. On the local executor the workflow gives the total itself
(workflow/rules/common.smk): the GPUs it may use (``resources.gpus``, else every device this
machine shows it) times ``resources.jobs_per_gpu`` -- unless the command line (or a profile)
gives ``--resources gpu=N``, which wins. On a cluster the scheduler places GPUs and nothing
here applies.

The workflow hands the jobs the devices and where their locks live in :data:`ENV`
(:class:`GpuSlots`); each GPU job claims free device slots (:func:`claim_devices`, from
``race.cli.jobs.load_job``) and sets ``CUDA_VISIBLE_DEVICES`` to them before torch starts
CUDA. A slot is a kernel lock (``flock`` on ``<results>/.gpus/gpu<i>.<slot>.lock``), held for
the life of the job's process and released when it ends, killed or not: it never goes stale.
Nothing here imports torch or starts CUDA (the count comes from ``CUDA_VISIBLE_DEVICES`` or
from NVML, as ``torch.cuda.device_count`` does before CUDA is initialised).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from race.core.errors import ConfigError

#: The environment variable that hands the jobs their :class:`GpuSlots` (JSON).
ENV = "RACE_GPU_SLOTS"
#: The verb each model rule group's jobs run: a verb's jobs ask for their group's
#: ``resources.<group>.gpu`` (workflow/rules: base, prm_samples and prm, train, evaluate).
VERB_GROUPS = {"pretrain": "base", "prm-samples": "prm", "prm": "prm", "train": "train",
               "evaluate": "evaluate"}
_HELD: list = []  # the open lock files of this process's claim (closed when it exits)


@dataclass(frozen=True)
class GpuSlots:
    """The devices the workflow's GPU jobs share and how many jobs each takes at once."""

    devices: tuple[str, ...]  # CUDA_VISIBLE_DEVICES entries, one per GPU
    per_device: int  # jobs one GPU runs at once
    lock_dir: str  # where the slots' lock files are
    verbs: Mapping[str, int] = field(default_factory=dict)  # GPUs a job of each verb asks for
    # False where the workflow saw no GPU (devices are then only counted: a job's claim leaves
    # CUDA_VISIBLE_DEVICES as it found it, so a GPU hidden with CUDA_VISIBLE_DEVICES= stays so)
    visible: bool = True

    @property
    def cap(self) -> int:
        """How many GPU jobs (one GPU each) run at once: Snakemake's total for ``gpu``."""
        return len(self.devices) * self.per_device

    def summary(self) -> str:
        where = (f"on CUDA devices {','.join(self.devices)}" if self.visible else
                 f"on {len(self.devices)} GPU(s) counted, none seen here")
        return (f"jobs that ask for a GPU run {self.cap} at a time, {self.per_device} per GPU "
                f"{where} (resources.gpus and resources.jobs_per_gpu, or snakemake "
                "--resources gpu=N)")

    def to_env(self) -> str:
        return json.dumps({"devices": list(self.devices), "per_device": self.per_device,
                           "lock_dir": self.lock_dir, "verbs": dict(self.verbs),
                           "visible": self.visible})

    @classmethod
    def from_env(cls, text: str) -> GpuSlots:
        d = json.loads(text)
        return cls(tuple(d["devices"]), int(d["per_device"]), d["lock_dir"], d["verbs"],
                   bool(d["visible"]))


def parse_visible(value: str) -> list[str]:
    """The devices ``CUDA_VISIBLE_DEVICES`` names, read as CUDA reads it: up to the first entry
    that is neither an index nor a GPU / MIG UUID (``-1``, empty), nothing when one repeats."""
    out: list[str] = []
    for entry in (e.strip() for e in value.split(",")):
        if not (entry.isdigit() or entry.startswith(("GPU-", "MIG-"))):
            break
        if entry in out:
            return []
        out.append(entry)
    return out


def nvml_device_count() -> int:
    """The GPUs the NVIDIA driver reports, through NVML (no CUDA context, so a process that
    forks later is unharmed; torch.cuda.device_count does the same); 0 without the driver."""
    import ctypes

    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return 0
    if nvml.nvmlInit_v2() != 0:
        return 0
    try:
        count = ctypes.c_uint(0)
        return int(count.value) if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else 0
    finally:
        nvml.nvmlShutdown()


def visible_devices(environ: Mapping[str, str] = os.environ) -> list[str]:
    """The GPUs a job started from here would see: ``CUDA_VISIBLE_DEVICES`` when set, else the
    driver's count (indices)."""
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is not None:
        return parse_visible(value)
    return [str(i) for i in range(nvml_device_count())]


def local_slots(resources: Mapping, lock_dir: str, given: int | None = None,
                visible: list[str] | None = None) -> GpuSlots | None:
    """The slots of a local run of a study whose ``resources`` section (schema defaults filled)
    asks for a GPU in some group, else None (no job asks: nothing changes).

    ``given``: the total of ``--resources gpu=N`` when the command line or a profile gives one
    (it wins: the slots then fit it, N spread over the devices). Else ``resources.gpus`` GPUs
    (the first visible ones), or every visible one; ``resources.jobs_per_gpu`` each. Where no
    GPU is visible, ``resources.gpus`` (else one) counted GPUs: the jobs still take turns, and
    compute where ``device`` and the job's environment say (a pretend GPU for a CPU test)."""
    verbs = {verb: int(resources[group]["gpu"]) for verb, group in VERB_GROUPS.items()
             if resources[group]["gpu"] > 0}
    if not verbs or given == 0:  # nothing asks for a GPU, or --resources gpu=0: no limit
        return None
    visible = visible_devices() if visible is None else visible
    wanted = resources.get("gpus")
    if wanted is None:
        devices = visible or ["0"]
    elif visible and wanted > len(visible):
        raise ConfigError(f"resources.gpus: {wanted}, but {len(visible)} GPU(s) are visible "
                          f"here ({', '.join(visible)}): set at most {len(visible)}, or leave "
                          "it unset to use every visible GPU")
    else:
        devices = visible[:wanted] if visible else [str(i) for i in range(wanted)]
    per_device = (math.ceil(given / len(devices)) if given is not None
                  else int(resources["jobs_per_gpu"]))
    return GpuSlots(tuple(devices), per_device, lock_dir, verbs, visible=bool(visible))


def try_claim(slots: GpuSlots, need: int) -> list[tuple[str, object]] | None:
    """One free slot on each of ``need`` distinct devices, as (device, open lock file), or
    None (then nothing is held). Slots are tried round-robin over the devices, so jobs spread
    over the GPUs before any GPU takes a second one."""
    import fcntl

    os.makedirs(slots.lock_dir, exist_ok=True)
    held: list[tuple[str, object]] = []
    for slot in range(slots.per_device):
        for i, device in enumerate(slots.devices):
            if len(held) == need:
                return held
            if any(d == device for d, _ in held):
                continue
            handle = open(os.path.join(slots.lock_dir, f"gpu{i}.{slot}.lock"), "a+")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                continue
            handle.truncate(0)  # who holds it, for a person looking
            handle.write(f"pid {os.getpid()} device {device}\n")
            handle.flush()
            held.append((device, handle))
    if len(held) == need:
        return held
    for _, handle in held:
        handle.close()
    return None


def claim_devices(verb: str, environ=os.environ, poll_s: float = 2.0) -> list[str] | None:
    """For a job of ``verb`` started by a local workflow that shares GPUs (:data:`ENV` set):
    claim its GPUs (waiting while another process holds them: a job left running by a killed
    workflow, say), set ``CUDA_VISIBLE_DEVICES`` to them (counted GPUs, none seen: left as it
    is) and return them. None, and nothing changed, for a job that asks for no GPU or one
    started otherwise (by hand, on SLURM)."""
    text = environ.get(ENV)
    slots = GpuSlots.from_env(text) if text else None
    need = min(slots.verbs.get(verb, 0), len(slots.devices)) if slots else 0
    if not need:
        return None
    waited = False
    while (held := try_claim(slots, need)) is None:
        if not waited:
            print(f"race {verb}: waiting for a free GPU (another process holds the slots "
                  f"in {slots.lock_dir})", flush=True)
            waited = True
        time.sleep(poll_s)
    _HELD.extend(handle for _, handle in held)
    devices = [device for device, _ in held]
    if slots.visible:
        environ["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    return devices
