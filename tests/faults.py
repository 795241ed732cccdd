"""Fault injection helpers shared by the training and workflow tests: where a run stands on
disk, and a SIGKILL at the moment a condition holds."""

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def checkpoint(run: Path) -> tuple[int, int]:
    """(step, rungs done) of the run's readable checkpoint; (0, 0) before the first one."""
    for state in (run / "checkpoints").glob("checkpoint-*/race_state.json"):
        try:
            payload = json.loads(state.read_text())
            return payload["step"], len(payload["rungs_done"])
        except (OSError, ValueError, KeyError):
            pass
    return 0, 0


def steps_done(run: Path) -> int:
    """Steps the run has finished (metrics.jsonl is appended once per step)."""
    metrics = run / "metrics.jsonl"
    return len(metrics.read_text().splitlines()) if metrics.exists() else 0


def wait_for(pid_to_kill: Callable[[], int | None], process: subprocess.Popen,
             timeout: float = 600) -> int | None:
    """Poll ``pid_to_kill()`` while ``process`` runs; returns the first pid it gives (None if
    the process ended first or the time ran out)."""
    deadline = time.time() + timeout
    while process.poll() is None and time.time() < deadline:
        pid = pid_to_kill()
        if pid is not None:
            return pid
        time.sleep(0.02)
    return None
