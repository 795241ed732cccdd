"""The workflow's JSON outputs: read them validated, and find the damaged ones so that a rerun
rebuilds them.

RACE writes every JSON output through :mod:`race.core.atomic` (complete or absent), so a file that
does not parse was damaged from outside: a full disk, a copy cut short, an edit by hand. Reading
one raises :class:`CorruptOutputError` naming the file and the job that writes it, never a bare
``JSONDecodeError``. Snakemake cannot tell such a file from a good one (it looks at existence
and modification times only), so the workflow calls :func:`set_aside_corrupt` when it starts:
each damaged output is renamed ``<name>.corrupt`` (kept for inspection, not deleted), Snakemake
then sees it missing and reruns the job that writes it. A finished run's ``metrics.jsonl`` (appended
per step, not written whole) is damaged when it does not hold one readable row for each step its
``train.json`` counts: a file cut at a line boundary parses but is short.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

#: What a dry run adds to each repair it would make: Snakemake plans from the files as they
#: are (a workflow cannot add to a dry run's plan when it starts), so the plan it prints leaves
#: out the job that the repair reruns.
DRY_RUN_NOTE = "dry run: left in place, and left out of the plan below"

#: file name -> the workflow job (rule, and the command it runs) that writes it
PRODUCERS = {
    "spec.json": "data (race data)",
    "pre.json": "base (race pretrain)",
    "prm.json": "prm (race prm)",
    "ledger.json": "train (race train)",
    "train.json": "train (race train)",
    "perf.json": "train (race train)",
    "race_state.json": "train (race train, a checkpoint)",
    "metrics.jsonl": "train (race train)",
    "eval.json": "evaluate (race evaluate)",
    "selected.json": "select (race select)",
    "initialized.json": "mlflow_init (race mlflow-init)",
    "logged.json": "mlflow_log (race mlflow-log)",
    "mlflow_synced.json": "mlflow_log (race mlflow-log)",
}
CORRUPT_SUFFIX = ".corrupt"
METRICS = "metrics.jsonl"


class CorruptOutputError(ValueError):
    """An output file exists but is not the JSON object its job writes."""


def producer(path: str | Path) -> str:
    return PRODUCERS.get(Path(path).name, "workflow")


def read_output(path: str | Path) -> dict:
    """The JSON object in ``path``; a missing or damaged file raises an error naming the file
    and the job that writes it."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"missing output {path} (written by the {producer(path)} job)")
    try:
        payload = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CorruptOutputError(
            f"{path} is damaged ({exc}); it is written by the {producer(path)} job: rerun the "
            f"workflow (it sets the file aside as {path.name}{CORRUPT_SUFFIX} and reruns that "
            f"job)") from None
    if not isinstance(payload, dict):
        raise CorruptOutputError(f"{path} holds a JSON {type(payload).__name__}, not the object "
                                 f"the {producer(path)} job writes")
    return payload


def is_corrupt(path: Path) -> bool:
    try:
        read_output(path)
    except CorruptOutputError:
        return True
    return False


def metrics_problem(path: str | Path, steps: list[int]) -> str | None:
    """What is wrong with the ``metrics.jsonl`` at ``path`` for a run of these ``steps``
    (one JSON object per step, in step order), or None when nothing is."""
    try:
        lines = Path(path).read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        return f"unreadable ({exc})"
    found = []
    for i, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            return f"line {i} is damaged (not JSON)"
        found.append(row.get("step") if isinstance(row, dict) else None)
    if found != steps:
        return (f"cut short or damaged: {len(found)} rows (last step {found[-1] if found else '-'})"
                f" for the {len(steps)} steps the run recorded")
    return None


def finished_metrics_problem(path: Path) -> str | None:
    """:func:`metrics_problem` of a finished run's ``metrics.jsonl`` (``DONE`` beside it)
    against the ``steps`` of its ``train.json``, the run's own count; None for a run still
    training, or one whose ``train.json`` cannot say."""
    run = path.parent
    if not (run / "DONE").exists():
        return None
    try:
        steps = read_output(run / "train.json").get("steps")
    except (OSError, CorruptOutputError):
        return None
    return metrics_problem(path, list(range(1, steps + 1))) if isinstance(steps, int) else None


def damage(path: Path) -> str | None:
    """Why an output named in :data:`PRODUCERS` is damaged, or None."""
    if path.name == METRICS:
        return finished_metrics_problem(path)
    return "damaged (not valid JSON)" if is_corrupt(path) else None


def corrupt_outputs(results_dir: str | Path) -> list[tuple[Path, str]]:
    """Every damaged output under ``results_dir`` named in :data:`PRODUCERS`, with why
    (:func:`damage`).

    Checkpoints are left out: resuming skips a damaged checkpoint and takes the one before
    (race.grpo.resume.latest_checkpoint)."""
    root = Path(results_dir)
    if not root.is_dir():
        return []
    found = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d != "checkpoints" and not d.startswith(".")]
        for path in (Path(folder) / f for f in files if f in PRODUCERS):
            reason = damage(path)
            if reason is not None:
                found.append((path, reason))
    return sorted(found)


#: A run folder's own files (not a rung's) that its training job writes beside its declared
#: outputs: Snakemake reruns the job for one of them only when the run's DONE goes too.
RUN_LEVEL = ("train.json", "ledger.json", METRICS)


def set_aside(path: Path, reason: str) -> str:
    """Rename ``path`` to ``<path>.corrupt`` (replacing an older one); returns a log line.
    A run-level :data:`RUN_LEVEL` file takes the run's ``DONE`` with it, so that the training
    job reruns (it resumes from its checkpoints); a damaged ``perf.json`` stays missing (a
    finished run is reused, not retrained, and its utilisation columns are then empty)."""
    path.replace(path.with_name(path.name + CORRUPT_SUFFIX))
    done = path.parent / "DONE"
    if path.name in RUN_LEVEL and not path.parent.name.startswith("budget~") and done.exists():
        done.unlink()
    elif path.name == "perf.json":
        return (f"race: {path}: {reason}; set aside as {path.name}{CORRUPT_SUFFIX}: the run's "
                "device and utilisation columns stay empty (a finished run is not retrained)")
    return (f"race: {path}: {reason}; set aside as {path.name}{CORRUPT_SUFFIX}, the "
            f"{producer(path)} job reruns")


def set_aside_corrupt(results_dir: str | Path, dry_run: bool = False) -> list[str]:
    """Set every damaged output under ``results_dir`` aside; returns one log line per file.
    ``dry_run``: only say which (a dry run changes no file)."""
    if dry_run:
        return [f"race: {p}: {reason}; a real run sets it aside and the {producer(p)} job "
                f"reruns ({DRY_RUN_NOTE})" for p, reason in corrupt_outputs(results_dir)]
    return [set_aside(p, reason) for p, reason in corrupt_outputs(results_dir)]
