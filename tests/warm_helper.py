"""Warm-start test helpers: :class:`Warm`, a private warm server per test, and :func:`main`, a
stand-in job (``RACE_WARM_ENTRY=warm_helper``) whose commands each do one observable thing, so
a test can check what a forked child saw and did."""

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def main(argv: list[str]) -> int:
    command, *rest = argv
    if command == "report":  # where it ran, what it saw, and which process it was
        Path(rest[0]).write_text(
            f"{os.getpid()} {os.getppid()} {os.getcwd()} {os.environ.get('WARM_PROBE', '')}")
        print("to stdout")
        print("to stderr", file=sys.stderr)
        return 0
    if command == "exit":
        return int(rest[0])
    if command == "raise":
        raise RuntimeError("boom in the job")
    if command == "sleep":  # write the pid, then wait to be signalled
        Path(rest[0]).write_text(str(os.getpid()))
        time.sleep(float(rest[1]))
        return 0
    raise SystemExit(f"unknown command {command}")


def wait_for(predicate, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return False


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


class Warm:
    """A private warm server for one test: its socket in a short temp dir (Unix socket paths
    are limited to ~107 bytes), the helper module as the job, stopped at teardown."""

    def __init__(self, preload="race.cli", entry="warm_helper", idle=30):
        self.dir = Path(tempfile.mkdtemp(prefix="rw", dir="/tmp"))
        self.socket = self.dir / "s.sock"
        self.env = {**os.environ, "RACE_WARM_SOCKET": str(self.socket),
                    "RACE_WARM_PRELOAD": preload, "RACE_WARM_IDLE": str(idle),
                    "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
        self.env.pop("RACE_WARM", None)
        self.env.pop("SLURM_JOB_ID", None)
        if entry:
            self.env["RACE_WARM_ENTRY"] = entry

    def command(self, *argv):
        return [sys.executable, "-m", "race.warm.client", *argv]

    def run(self, *argv, cwd=None, env=None):
        return subprocess.run(self.command(*argv), cwd=cwd, env=env or self.env,
                              capture_output=True, text=True, timeout=120)

    def server_pids(self) -> list[int]:
        log = Path(str(self.socket) + ".log")
        text = log.read_text() if log.exists() else ""
        return [int(p) for p in re.findall(r"race.warm.server: pid (\d+) serving", text)]

    def jobs_logged(self) -> int:
        return len(re.findall(r"race.warm.server: pid \d+ runs ", Path(str(self.socket) + ".log")
                              .read_text()))

    def stop(self):
        """SIGTERM this test's servers and wait for them to exit."""
        pids = self.server_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        wait_for(lambda: not any(alive(pid) for pid in pids), timeout=10)
