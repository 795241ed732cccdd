"""``python -m race.warm.server SOCKET``: import the model stack once, fork a child per job.

The server half of warm start (see :mod:`race.warm.client`, which starts it). It imports
:func:`race.warm.client.preload_modules`, listens on the Unix socket ``SOCKET`` (mode 0600, and
only peers of the same uid are served) and answers each request -- argv, working directory,
environment and the client's stdin/stdout/stderr descriptors -- by forking a child that takes
those on and runs ``main(argv)`` of the requested entry module (``race.cli``). It replies
``pid N`` when the child starts and ``exit N`` when it ends (a shell's exit status: 128 + N for
signal N), and logs one line per job to its own log (``SOCKET.log``).

A child is what a cold ``python -m race.cli`` would be, minus the imports: it gets the job's
environment, directory and descriptors, default signal handlers, and its exit handlers run.
Forking a process that has imported torch but never run an operator is the same thing a
DataLoader worker is. If a client disappears while its child runs, the child gets SIGTERM (and
SIGKILL ten seconds later). The server exits after ``RACE_WARM_IDLE`` seconds (default 120)
with no child running, and on SIGTERM / SIGINT (terminating its children first).
"""

from __future__ import annotations

import atexit
import fcntl
import importlib
import json
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
import traceback

from race.warm.client import HEADER, preload_modules

#: Seconds between a job's SIGTERM (its client vanished) and SIGKILL.
KILL_GRACE_S = 10.0
MAX_REQUEST_BYTES = 16 << 20


def preload() -> None:
    # Exactly what a cold training job does before importing TRL (race.grpo.run): without it TRL
    # imports MLflow, which a job only needs when it logs live.
    os.environ.setdefault("DISABLE_MLFLOW_INTEGRATION", "TRUE")
    for name in preload_modules():
        importlib.import_module(name)
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


def receive_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """One length-prefixed JSON request and the three descriptors sent with it (closed here
    if the request is malformed: a leaked copy would keep the client's pipes open)."""
    conn.settimeout(10.0)
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    try:
        if len(fds) != 3 or len(data) < HEADER.size:
            raise ValueError("malformed request")
        (length,) = HEADER.unpack(data[:HEADER.size])
        if length > MAX_REQUEST_BYTES:
            raise ValueError("request too large")
        body = data[HEADER.size:]
        while len(body) < length:
            chunk = conn.recv(length - len(body))
            if not chunk:
                raise ValueError("truncated request")
            body += chunk
        request = json.loads(body)
        if not isinstance(request, dict) or not {"entry", "argv", "cwd", "env"} <= set(request):
            raise ValueError("incomplete request")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    conn.settimeout(None)
    return request, fds


def run_child(request: dict, fds: list[int]) -> int:
    """In the forked child: become the job, run it, return its exit status."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    die_with_parent()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    argv = list(request["argv"])
    sys.argv = ["race", *argv]
    try:
        os.chdir(request["cwd"])
        os.umask(request.get("umask", 0o022))
        os.environ.clear()
        os.environ.update(request["env"])
        sys.path[0] = request["cwd"]  # what `python -m` in the job's directory would have
        status = importlib.import_module(request["entry"]).main(argv)
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            status = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            status = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        finish()
        # Die of SIGINT, as an interrupted interpreter does (the shell then reports 130).
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        status = 130
    except BaseException:
        traceback.print_exc()
        status = 1
    finish()
    return status


def die_with_parent() -> None:
    """SIGTERM this process if the server dies (Linux prctl PR_SET_PDEATHSIG): a job whose
    server is gone cannot report its exit status, so it must not run on unseen."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def finish() -> None:
    """What interpreter exit would do: wait for non-daemon threads, run exit handlers (e.g.
    MLflow ending runs), flush the streams."""
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


class Server:
    """The accept / fork / reap loop (single-threaded: the process forks, so no threads)."""

    def __init__(self, path: str, idle_s: float):
        self.path = path
        self.idle_s = idle_s
        self.selector = selectors.DefaultSelector()
        self.children: dict[int, socket.socket] = {}  # pid -> its client's connection
        self.kill_at: dict[int, float] = {}  # pid -> when SIGKILL follows the SIGTERM
        self.stopping = False
        old_umask = os.umask(0o077)
        try:
            self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.listener.bind(path)
        finally:
            os.umask(old_umask)
        stat = os.stat(path)
        self.identity = (stat.st_dev, stat.st_ino)
        self.retired = False
        self.listener.listen(64)
        self.selector.register(self.listener, selectors.EVENT_READ)

    def serve(self) -> None:
        self.log(f"pid {os.getpid()} serving {self.path}")
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self.stop)
        last_busy = time.monotonic()
        try:
            while not self.stopping:
                events = self.selector.select(timeout=0.2)
                for key, _events in events:
                    if key.fileobj is self.listener:
                        self.accept()
                    else:
                        self.client_readable(key.fileobj, key.data)
                self.reap()
                self.escalate()
                if self.children or events:
                    last_busy = time.monotonic()
                elif self.retired:
                    break  # unreachable by path, and the backlog is served
                elif time.monotonic() - last_busy > self.idle_s:
                    self.retire()
        finally:
            self.close()

    def retire(self) -> None:
        """Idle: remove the socket from its path under the clients' lock, so no client can be
        connecting right then; the loop then serves what is queued and exits."""
        with open(self.path + ".lock", "w") as lock:
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    time.sleep(0.05)
            self.unlink_if_ours()
        self.retired = True

    def unlink_if_ours(self) -> None:
        try:
            stat = os.stat(self.path)
            if (stat.st_dev, stat.st_ino) == self.identity:  # not a successor's socket
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    def stop(self, _signum, _frame) -> None:
        self.stopping = True

    def accept(self) -> None:
        """Serve one connection. Nothing that goes wrong with one request stops the server."""
        try:
            conn, _ = self.listener.accept()
        except OSError as exc:  # e.g. out of descriptors: the client retries or starts cold
            self.log(f"could not accept: {exc}")
            return
        try:
            if peer_uid(conn) != os.getuid():
                raise PermissionError("peer of another user")
            request, fds = receive_request(conn)
        except (OSError, ValueError) as exc:
            self.log(f"refused a request: {exc}")
            conn.close()
            return
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError as exc:
            self.log(f"could not fork: {exc}")
            for fd in fds:
                os.close(fd)
            conn.close()  # the client sees no pid and runs the job cold
            return
        if pid == 0:
            status = 1
            try:  # the child must never return into the server's loop
                self.selector.close()
                self.listener.close()
                conn.close()
                for other in self.children.values():
                    other.close()
                status = run_child(request, fds)
            except BaseException:
                traceback.print_exc()
            finally:
                os._exit(status)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ, pid)
        self.reply(conn, f"pid {pid}")
        self.log(f"pid {pid} runs {request['entry']} {' '.join(map(str, request['argv']))}")

    @staticmethod
    def log(line: str) -> None:
        try:
            print(f"race.warm.server: {line}", flush=True)
        except (OSError, ValueError):
            pass  # e.g. a full disk: the log is for people, the jobs do not need it

    def client_readable(self, conn: socket.socket, pid: int) -> None:
        """A client only ever closes its end: it died, so its job must not run on."""
        try:
            data = conn.recv(4096)
        except OSError:
            data = b""
        if data:
            return
        self.selector.unregister(conn)
        if pid in self.children and pid not in self.kill_at:
            self.signal_child(pid, signal.SIGTERM)
            self.kill_at[pid] = time.monotonic() + KILL_GRACE_S

    def signal_child(self, pid: int, signum: int) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    def escalate(self) -> None:
        now = time.monotonic()
        for pid, when in list(self.kill_at.items()):
            if now >= when and pid in self.children:
                self.signal_child(pid, signal.SIGKILL)
                del self.kill_at[pid]

    def reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            self.kill_at.pop(pid, None)
            if conn is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            self.reply(conn, f"exit {code if code >= 0 else 128 - code}")
            try:
                self.selector.unregister(conn)
            except (KeyError, ValueError):
                pass
            conn.close()

    @staticmethod
    def reply(conn: socket.socket, line: str) -> None:
        try:
            conn.sendall(line.encode() + b"\n")
        except OSError:
            pass  # the client is gone; client_readable handles it

    def close(self) -> None:
        for pid in list(self.children):
            self.signal_child(pid, signal.SIGTERM)
        self.listener.close()
        self.unlink_if_ours()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) != 1:
        print("usage: python -m race.warm.server SOCKET", file=sys.stderr)
        return 2
    preload()
    Server(argv[0], float(os.environ.get("RACE_WARM_IDLE", "120"))).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
