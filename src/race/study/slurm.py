"""What a SLURM cluster must offer a study, checked before the first job is submitted.

The SLURM executor plugin submits each model job with ``sbatch`` and learns its fate from a
status command: ``sacct`` (the accounting database) or ``squeue`` (the controller's memory of
jobs, which forgets a finished job ``MinJobAge`` seconds after it ends). Two cluster setups
make a run wait forever or fail late, with the plugin's words rather than the study's:

- ``sacct`` on a cluster without an accounting database (``AccountingStorageType =
  accounting_storage/none``) reports nothing, finished jobs drop out of Snakemake's view and the
  workflow never ends. ``squeue`` works there, and the plugin keeps it only while
  ``MinJobAge`` is at least three times its first status wait (else it falls back to ``sacct``).
- A job that asks for a GPU on a partition whose nodes have no GPU GRES is refused at
  submission ("Invalid generic resource").

:func:`check_cluster` runs from the workflow's ``onstart`` (after the DAG is built, before any
job runs) when the executor is SLURM, and raises :class:`ClusterError` naming the setting to
change. The cluster is read with ``scontrol show config`` and ``sinfo``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping

from race.core.errors import ConfigError

#: Rule groups whose jobs are submitted to the cluster (the rest are Snakemake localrules).
MODEL_GROUPS = ("base", "prm", "train", "evaluate")
NO_ACCOUNTING = "accounting_storage/none"


class ClusterError(ConfigError):
    """The cluster cannot run the study as configured; the message names the fix."""


def _run(*cmd: str) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=True,
                              timeout=30).stdout
    except FileNotFoundError as e:
        raise ClusterError(f"{cmd[0]} is not on PATH: run Snakemake on a node of the "
                           "cluster (a login node), where the SLURM client commands are") from e
    except subprocess.CalledProcessError as e:
        raise ClusterError(f"`{' '.join(cmd)}` failed: {e.stderr.strip()}") from e


def cluster_config(text: str | None = None) -> dict[str, str]:
    """``scontrol show config`` as a dict (``KEY = value`` lines)."""
    text = _run("scontrol", "show", "config") if text is None else text
    pairs = (line.split("=", 1) for line in text.splitlines() if "=" in line)
    return {k.strip(): v.strip() for k, v in pairs}


def seconds(value: str | None) -> int | None:
    """A duration as ``scontrol`` prints it (``300 sec``, ``1h``, ``600``) in seconds."""
    m = re.match(r"^(\d+)\s*([a-zA-Z]*)", value or "")
    if not m:
        return None
    return int(m.group(1)) * (3600 if m.group(2).lower() in ("h", "hour", "hours") else 1)


def check_status_command(command: str, init_seconds: int, config: Mapping[str, str]) -> str:
    """The status command the plugin will really use, or :class:`ClusterError` where it would
    never learn that a job ended. Returns a line saying which applies and why."""
    accounting = config.get("AccountingStorageType", "")
    min_job_age = seconds(config.get("MinJobAge"))
    needed = 3 * init_seconds  # the plugin's own threshold for keeping squeue
    if command == "squeue" and (min_job_age is None or min_job_age < needed):
        command = "sacct"  # what the plugin falls back to
        why = f"MinJobAge {min_job_age} s is under 3 x the first status wait ({needed} s)"
        if accounting == NO_ACCOUNTING:
            raise ClusterError(
                f"SLURM: squeue would forget finished jobs ({why}) and sacct has no accounting "
                f"database here ({NO_ACCOUNTING}): lower --slurm-init-seconds-before-status-"
                f"checks to at most {(min_job_age or 0) // 3} s, or ask for a longer MinJobAge")
        return f"SLURM job states from sacct ({why})"
    if command == "sacct" and accounting == NO_ACCOUNTING:
        raise ClusterError(
            f"SLURM: this cluster keeps no job accounting ({NO_ACCOUNTING}), so sacct cannot "
            "report job states and the workflow would wait forever: use "
            "--slurm-status-command squeue (profiles/slurm sets it)")
    return (f"SLURM job states from {command}"
            + (f" (MinJobAge {min_job_age} s)" if command == "squeue" else ""))


def partition_gres(partition: str | None) -> tuple[str, list[str]]:
    """The partition (None: the cluster's default) and the GRES of each of its nodes, from
    ``sinfo``."""
    lines = _run("sinfo", "--noheader", "--format", "%P|%G").splitlines()
    rows = [line.split("|", 1) for line in lines if "|" in line]
    if partition is None:
        default = [p for p, _ in rows if p.endswith("*")]
        if not default:
            raise ClusterError("slurm.partition: the cluster has no default partition; "
                               "name one")
        partition = default[0]
    name = partition.rstrip("*")
    gres = [g for p, g in rows if p.rstrip("*") == name]
    if not gres:
        known = sorted({p.rstrip("*") for p, _ in rows})
        raise ClusterError(f"slurm.partition: no SLURM partition {name!r} (sinfo lists "
                           f"{', '.join(known)})")
    return name, gres


def check_gpu_partition(resources: Mapping, partition: str | None) -> str | None:
    """:class:`ClusterError` when a model job asks for a GPU that ``partition`` cannot give."""
    asking = [g for g in MODEL_GROUPS if (resources.get(g) or {}).get("gpu", 0) > 0]
    if not asking:
        return None
    name, gres = partition_gres(partition)
    if not any("gpu" in g for g in gres):
        which = "slurm.partition" if partition else "the cluster's default partition"
        raise ClusterError(
            f"resources.{asking[0]}.gpu: {resources[asking[0]]['gpu']} asks for a GPU, but "
            f"SLURM partition {name!r} ({which}) has no GPU on any node (sinfo GRES: "
            f"{', '.join(sorted(set(gres)))}): set slurm.partition to a GPU partition, or "
            f"resources.<group>.gpu: 0 for {', '.join(asking)} to run them on CPUs")
    return f"model jobs' GPUs from partition {name!r}"


def check_cluster(study, executor_settings) -> list[str]:
    """Every check above for ``study`` under the plugin's ``executor_settings``; the lines
    saying what was found (the workflow logs them)."""
    slurm = study.slurm or {}
    found = [check_status_command(executor_settings.status_command,
                                  int(executor_settings.init_seconds_before_status_checks),
                                  cluster_config())]
    gpu = check_gpu_partition(study.resources or {}, slurm.get("partition"))
    return found + ([gpu] if gpu else [])
