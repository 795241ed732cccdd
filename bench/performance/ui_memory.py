"""Memory of the MLflow UI server (`make ui`), with and without MLflow's job execution.

Starts ``mlflow ui`` on the study's tracking DB twice, side by side in one run: as `make ui`
starts it (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``) and with MLflow's default. Once the
server answers, sums the resident memory (RSS, and PSS where the kernel reports it) of the
server's whole process tree, then stops it. Prints one line per setting and their ratio.

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


def measure(db: Path, port: int, job_execution: bool, settle_s: float) -> tuple[int, int, int]:
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION=str(job_execution).lower())
    mlflow = Path(sys.executable).with_name("mlflow")
    proc = subprocess.Popen([str(mlflow), "ui", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{db}"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
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
    for job_execution in (False, True):
        rss, pss, n = measure(Path(args.db).resolve(), args.port, job_execution, args.settle)
        results[job_execution] = pss or rss
        label = "make ui (job execution off)" if not job_execution else "MLflow default"
        print(f"{label:30s} processes {n:3d}  RSS {rss / 2**20:.2f} GiB  PSS {pss / 2**20:.2f} GiB")
    print(f"make ui uses {results[False] / results[True]:.2f}x the default's memory (PSS)")


if __name__ == "__main__":
    main()
