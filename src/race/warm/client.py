"""``python -m race.warm.client ARGS``: run ``race ARGS`` in a child forked from a warm server.

Every Snakemake job is a fresh process, and a job that touches a model first spends 5-8 s of
CPU importing torch, transformers, PEFT and TRL -- for the tiny offline ladder that is most of
the job (``bench/job_floor.py``). With ``warm_start: true`` the model rules call this client
instead of ``race.cli``: it hands its argv, working directory, environment and its stdin /
stdout / stderr file descriptors to a server (``race.warm.server``) that imported the stack
once, which forks a child to run ``race.cli.main(argv)``. The job's log redirection, exit
status and signals behave as if the command ran here:

- the child writes straight to this process's stdout/stderr (the descriptors are passed over
  the Unix socket), so ``> {log} 2>&1`` in a rule works unchanged;
- the exit status is the child's (128 + N when a signal N ended it, as a shell reports it);
- SIGINT / SIGTERM / SIGHUP sent to this client are forwarded to the child, and if the client
  dies outright (SIGKILL) the server terminates the child.

The server is started on first use (one per user, interpreter, import-time environment and
version of the package sources: editing the code starts a fresh server; its socket, lock and
log are in a private 0700 directory, ``race-warm-UID/`` under ``$XDG_RUNTIME_DIR`` or the temp
directory, and the client only talks to a server of its own uid). It exits after
``RACE_WARM_IDLE`` seconds (default 120) without jobs. Whenever it cannot be reached or
started, the client runs the command in this process instead (a cold start), so warm start
only ever changes start-up time; a job the server never started is never run twice.

This module imports only the standard library: its own start-up is tens of milliseconds.

Cold starts are forced by ``RACE_WARM=0`` and inside SLURM jobs (``SLURM_JOB_ID`` set: a server
would outlive the job's allocation). ``RACE_WARM_SOCKET`` overrides the socket path (in a
directory private to the user); ``RACE_WARM_IDLE`` the server's idle timeout (s);
``RACE_WARM_PRELOAD`` the comma-separated modules the server imports before serving (default:
:data:`PRELOAD`); ``RACE_WARM_ENTRY`` the module whose ``main(argv)`` runs the job (default
``race.cli``).
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

from race.cli import model_modules

#: What a model job imports before it computes anything (train, evaluate, pretrain, prm).
#: The model stack, then the model verbs of the command table (race.cli.COMMANDS).
PRELOAD = ("torch", "transformers", "peft", "datasets", "trl", "race.cli", *model_modules())
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


def private_dir() -> str:
    """``race-warm-UID/`` under the runtime (else temp) directory, mode 0700: the socket, lock
    and log live where no other user can bind, pre-create or read them. Raises OSError if the
    directory exists but is not this user's private directory."""
    base = os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    path = os.path.join(base, f"race-warm-{os.getuid()}")
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    check_private(path)
    return path


def check_private(path: str) -> None:
    stat = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or stat.st_uid != os.getuid() \
            or stat.st_mode & 0o077:
        raise PermissionError(f"{path} is not a private directory of this user")


def socket_path() -> str:
    """The server's Unix socket: per :func:`source_fingerprint`, in :func:`private_dir`;
    ``RACE_WARM_SOCKET`` overrides it (its directory must be private to this user too)."""
    override = os.environ.get("RACE_WARM_SOCKET")
    if override:
        check_private(os.path.dirname(os.path.abspath(override)))
        return override
    return os.path.join(private_dir(), f"{source_fingerprint()}.sock")


def peer_uid(sock: socket.socket) -> int:
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def connect(path: str) -> socket.socket | None:
    """A connection to a server of this user at ``path``, or None."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
        if peer_uid(sock) == os.getuid():
            return sock
    except OSError:
        pass
    sock.close()
    return None


def start_server(path: str) -> socket.socket | None:
    """Connect to the server at ``path``, starting it if none answers; None if that fails.
    One client starts it (an exclusive lock beside the socket); the others wait on the lock
    and then connect. Waits at most :data:`START_TIMEOUT_S`, less if the server dies."""
    deadline = time.monotonic() + START_TIMEOUT_S
    with open(path + ".lock", "w") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    return None
                time.sleep(0.05)
        sock = connect(path)
        if sock is not None:
            return sock
        if os.path.lexists(path):
            os.unlink(path)  # left by a server that was killed
        with open(path + ".log", "ab") as log:
            # A session of its own: the server outlives this job and must not get its signals.
            server = subprocess.Popen([sys.executable, "-m", "race.warm.server", path],
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                      start_new_session=True, close_fds=True)
        while time.monotonic() < deadline and server.poll() is None:
            sock = connect(path)
            if sock is not None:
                return sock
            time.sleep(0.05)
    return None


def send_request(sock: socket.socket, argv: list[str]) -> None:
    umask = os.umask(0)
    os.umask(umask)
    payload = json.dumps({"entry": entry_module(), "argv": argv, "cwd": os.getcwd(),
                          "umask": umask, "env": dict(os.environ)}).encode()
    socket.send_fds(sock, [HEADER.pack(len(payload)) + payload], [0, 1, 2])


def read_replies(sock: socket.socket):
    """Yield the server's replies (``pid N``, ``exit N``) as (word, int) pairs; stop when the
    server hangs up (a reset connection counts: an idle server may close as we connect)."""
    buffer = b""
    while True:
        try:
            chunk = sock.recv(4096)
        except OSError:
            return
        if not chunk:
            return
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            word, value = line.decode().split()
            yield word, int(value)


class NotStarted(Exception):
    """The server hung up before it started the job: nothing ran, so it may run elsewhere."""


def run_warm(sock: socket.socket, argv: list[str]) -> int:
    """Run ``argv`` in a forked child and return its exit status (raises NotStarted)."""
    child: int | None = None
    pending: list[int] = []  # signals that arrived before the child's pid

    def forward(signum, _frame):
        if child is None:
            pending.append(signum)
            return
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    previous = {signum: signal.signal(signum, forward) for signum in FORWARDED_SIGNALS}
    try:
        try:
            send_request(sock, argv)
        except OSError as exc:  # e.g. the server closed (idle) as this client connected
            raise NotStarted from exc
        for word, value in read_replies(sock):
            if word == "pid":
                child = value
                for signum in pending:
                    forward(signum, None)
            elif word == "exit":
                return value
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        if child is None:
            # Signals meant for a job that never started: deliver them to this process now.
            for signum in dict.fromkeys(pending):
                os.kill(os.getpid(), signum)
    if child is None:
        raise NotStarted
    print(f"race.warm.client: the warm server died while pid {child} ran (the job gets "
          "SIGTERM with it)", file=sys.stderr)
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
    for _attempt in range(2):  # a second try covers a server that exited (idle) as we came
        try:
            sock = start_server(socket_path())
        except OSError as exc:  # e.g. no private directory: warm start is only an optimisation
            print(f"race.warm.client: no warm server ({exc}); starting cold", file=sys.stderr)
            break
        if sock is None:
            break
        with sock:
            try:
                return run_warm(sock, argv)
            except NotStarted:
                continue
    return run_cold(argv)


if __name__ == "__main__":
    sys.exit(main())
