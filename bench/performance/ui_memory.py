"""Memory of the MLflow UI server as `make ui` starts it, beside MLflow's default.

Starts ``mlflow ui`` on the study's tracking DB twice, side by side in one run: as `make ui`
starts it (``race.tracking.ui.ui_command``: one worker, job execution off) and with MLflow's
defaults (its workers, job execution on). Once the server answers, sums the resident memory
(RSS, and PSS where the kernel reports it) of the server's whole process tree, then stops it.
Prints one line per setting and their ratio.

    python bench/performance/ui_memory.py [--db results/mlflow/mlflow.db] [--port 5077]
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return out


def memory_kib(pids: list[int]) -> tuple[int, int]:
    """(RSS, PSS) summed over ``pids``, in KiB (PSS: shared pages split among sharers)."""
    rss = pss = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Rss:"):
                    rss += int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss += int(line.split()[1])
        except OSError:
            pass
    return rss, pss


def command(db: Path, port: int, as_make_ui: bool) -> tuple[list[str], dict[str, str]]:
    """``make ui``'s server command on ``db``, or MLflow's default one."""
    from race.core.specs import MlflowSpec
    from race.tracking.ui import ui_command

    if as_make_ui:
        return ui_command(MlflowSpec(experiment="", tracking_uri=f"sqlite:///{db}"), port)
    argv = [sys.executable, "-m", "mlflow", "ui", "--host", "127.0.0.1", "--port", str(port),
            "--backend-store-uri", f"sqlite:///{db}"]
    return argv, dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="true")


def measure(db: Path, port: int, as_make_ui: bool, settle_s: float) -> tuple[int, int, int]:
    argv, env = command(db, port, as_make_ui)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(1)
        else:
            raise RuntimeError("the MLflow server did not answer within 120 s")
        time.sleep(settle_s)  # workers start after the first answer
        pids = tree(proc.pid)
        rss, pss = memory_kib(pids)
        return rss, pss, len(pids)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="results/mlflow/mlflow.db")
    ap.add_argument("--port", type=int, default=5077)
    ap.add_argument("--settle", type=float, default=15.0, help="seconds after the first answer")
    args = ap.parse_args()
    results = {}
    for as_make_ui in (True, False):
        rss, pss, n = measure(Path(args.db).resolve(), args.port, as_make_ui, args.settle)
        results[as_make_ui] = pss or rss
        label = "make ui (1 worker, no jobs)" if as_make_ui else "MLflow default"
        print(f"{label:30s} processes {n:3d}  RSS {rss / 2**20:.2f} GiB  PSS {pss / 2**20:.2f} GiB")
    print(f"make ui uses {results[True] / results[False]:.2f}x the default's memory (PSS)")


if __name__ == "__main__":
    main()
