"""``python -m race.warm_client ARGS``: run ``race ARGS`` in a child forked from a warm server.

Every Snakemake job is a fresh process, and a job that touches a model first spends 5-8 s of
CPU importing torch, transformers, PEFT and TRL -- for the tiny offline ladder that is most of
the job (``bench/job_floor.py``). With ``warm_start: true`` the model rules call this client
instead of ``race.cli``: it hands its argv, working directory, environment and its stdin /
stdout / stderr file descriptors to a server (``race.warm_server``) that imported the stack
once, which forks a child to run ``race.cli.main(argv)``. The job's log redirection, exit
status and signals behave as if the command ran here:

- the child writes straight to this process's stdout/stderr (the descriptors are passed over
  the Unix socket), so ``> {log} 2>&1`` in a rule works unchanged;
- the exit status is the child's (128 + N when a signal N ended it, as a shell reports it);
- SIGINT / SIGTERM / SIGHUP sent to this client are forwarded to the child, and if the client
  dies outright (SIGKILL) the server terminates the child.

The server is started on first use (one per user, interpreter and version of the package
sources: editing the code starts a fresh server) and exits after ``RACE_WARM_IDLE`` seconds
(default 120) without jobs. Whenever it cannot be reached or started, the client runs the
command in this process instead (a cold start), so warm start only ever changes start-up time.

This module imports only the standard library: its own start-up is tens of milliseconds.

Cold starts are forced by ``RACE_WARM=0`` and inside SLURM jobs (``SLURM_JOB_ID`` set: a server
would outlive the job's allocation). ``RACE_WARM_SOCKET`` overrides the socket
path; ``RACE_WARM_IDLE`` the server's idle timeout (s); ``RACE_WARM_PRELOAD`` the comma-separated
modules the server imports before serving (default: :data:`PRELOAD`); ``RACE_WARM_ENTRY`` the
module whose ``main(argv)`` runs the job (default ``race.cli``).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: What a model job imports before it computes anything (train, evaluate, pretrain, prm).
PRELOAD = ("torch", "transformers", "peft", "datasets", "trl", "race.cli", "race.train_cli",
           "race.evaluate_cli", "race.pretrain", "race.prm_cli")
#: Seconds a client waits for a server it started to accept connections (the imports: ~6 s).
START_TIMEOUT_S = 60.0
#: Length prefix of a request (bytes of JSON that follow).
HEADER = struct.Struct("!I")
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
#: Environment variables read when the preloaded libraries are imported (hub and cache paths,
#: offline switches, thread counts, devices): a server only serves clients that agree on them.
IMPORT_TIME_ENV = ("HF_", "HUGGINGFACE", "TRANSFORMERS_", "TORCH", "PYTORCH_", "CUDA_", "OMP_",
                   "MKL_", "OPENBLAS_", "TOKENIZERS_", "MLFLOW_", "DISABLE_MLFLOW", "PYTHON",
                   "LD_", "ACCELERATE_", "TRL_", "DATASETS_", "XDG_CACHE_HOME", "HOME")


def preload_modules() -> list[str]:
    spec = os.environ.get("RACE_WARM_PRELOAD")
    names = PRELOAD if spec is None else spec.split(",")
    return [n.strip() for n in names if n.strip()]


def source_fingerprint() -> str:
    """Hash of what a forked child would inherit: the interpreter, the preload list, the
    import-time environment (:data:`IMPORT_TIME_ENV`), and the name, size and mtime of every
    source file of the package (so an edited module gets a new server, not a stale one)."""
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(IMPORT_TIME_ENV))
    digest = hashlib.sha256(
        f"{sys.executable}\0{sys.version}\0{preload_modules()}\0{env}".encode())
    for path in sorted(Path(__file__).resolve().parent.glob("*.py")):
        stat = path.stat()
        digest.update(f"\0{path.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def socket_path() -> str:
    """The server's Unix socket: per user and :func:`source_fingerprint`, under the runtime
    (else temp) directory; ``RACE_WARM_SOCKET`` overrides it."""
    override = os.environ.get("RACE_WARM_SOCKET")
    if override:
        return override
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    return os.path.join(base, f"race-warm-{os.getuid()}-{source_fingerprint()}.sock")


def connect(path: str) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError:
        sock.close()
        return None
    return sock


def start_server(path: str) -> socket.socket | None:
    """Connect to the server at ``path``, starting it if none answers. One client starts it
    (an exclusive lock beside the socket); the others wait on the lock and then connect."""
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        sock = connect(path)
        if sock is not None:
            return sock
        if os.path.exists(path):
            os.unlink(path)  # left by a server that was killed
        log = open(path + ".log", "ab")
        # A session of its own: the server outlives this job and must not get its signals.
        subprocess.Popen([sys.executable, "-m", "race.warm_server", path],
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         start_new_session=True, close_fds=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            sock = connect(path)
            if sock is not None:
                return sock
            time.sleep(0.05)
    return None


def send_request(sock: socket.socket, argv: list[str]) -> None:
    payload = json.dumps({"entry": entry_module(), "argv": argv, "cwd": os.getcwd(),
                          "env": dict(os.environ)}).encode()
    socket.send_fds(sock, [HEADER.pack(len(payload)) + payload], [0, 1, 2])


def read_replies(sock: socket.socket):
    """Yield the server's replies (``pid N``, ``exit N``) as (word, int) pairs."""
    buffer = b""
    while True:
        chunk = sock.recv(4096)
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            word, value = line.decode().split()
            yield word, int(value)


def run_warm(sock: socket.socket, argv: list[str]) -> int | None:
    """Run ``argv`` in a forked child and return its exit status; None if the server hung up
    before starting the child (the caller then runs it cold: nothing ran twice)."""
    send_request(sock, argv)
    child: int | None = None
    pending: list[int] = []  # signals that arrived before the child's pid

    def forward(signum, _frame):
        if child is None:
            pending.append(signum)
        else:
            os.kill(child, signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    for word, value in read_replies(sock):
        if word == "pid":
            child = value
            for signum in pending:
                os.kill(child, signum)
        elif word == "exit":
            return value
    if child is None:
        return None
    print(f"race.warm_client: the warm server hung up while pid {child} ran", file=sys.stderr)
    return 1


def entry_module() -> str:
    """The module whose ``main(argv)`` runs the job (``race.cli``; tests name their own)."""
    return os.environ.get("RACE_WARM_ENTRY", "race.cli")


def run_cold(argv: list[str]) -> int:
    return importlib.import_module(entry_module()).main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # Inside a SLURM job a server would outlive the job's allocation: start cold there.
    if os.environ.get("RACE_WARM", "1") == "0" or "SLURM_JOB_ID" in os.environ:
        return run_cold(argv)
    try:
        sock = start_server(socket_path())
    except OSError as exc:  # e.g. a read-only temp directory: warm start is only an optimisation
        print(f"race.warm_client: no warm server ({exc}); starting cold", file=sys.stderr)
        sock = None
    if sock is None:
        return run_cold(argv)
    with sock:
        status = run_warm(sock, argv)
    return run_cold(argv) if status is None else status


if __name__ == "__main__":
    sys.exit(main())
