"""Warm start (race.warm.client / race.warm.server): a job forked from a warm server behaves as
the same command run cold -- directory, environment, streams, exit status, signals, results."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from warm_helper import Warm, alive, wait_for

from race.data.task import TaskSpec, write_splits
from race.warm import client as warm_client


@pytest.fixture
def warm():
    server = Warm()
    yield server
    server.stop()


def test_job_runs_in_a_forked_child_with_the_clients_directory_environment_and_streams(
        warm, tmp_path):
    env = {**warm.env, "WARM_PROBE": "probe-1"}
    first = warm.run("report", "seen.txt", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    assert first.stdout == "to stdout\n" and first.stderr == "to stderr\n"
    [server] = warm.server_pids()
    pid, ppid, cwd, probe = (tmp_path / "seen.txt").read_text().split()
    assert int(ppid) == server  # forked by the server, not run by the client
    assert (cwd, probe) == (str(tmp_path), "probe-1")
    # The second job reuses the running server and sees its own environment.
    second = warm.run("report", "again.txt", cwd=tmp_path, env={**env, "WARM_PROBE": "probe-2"})
    assert second.returncode == 0, second.stderr
    assert warm.server_pids() == [server]
    assert (tmp_path / "again.txt").read_text().split()[1:] == [str(server), str(tmp_path),
                                                                  "probe-2"]
    assert warm.jobs_logged() == 2


def test_exit_status_and_errors_are_the_jobs(warm, tmp_path):
    assert warm.run("exit", "3", cwd=tmp_path).returncode == 3
    failed = warm.run("raise", cwd=tmp_path)
    assert failed.returncode == 1
    assert "Traceback" in failed.stderr and "RuntimeError: boom in the job" in failed.stderr
    unknown = warm.run("frobnicate", cwd=tmp_path)
    assert unknown.returncode == 1 and "unknown command frobnicate" in unknown.stderr


def _start_sleeper(warm, tmp_path):
    pid_file = tmp_path / "pid"
    client = subprocess.Popen(warm.command("sleep", str(pid_file), "60"), cwd=tmp_path,
                              env=warm.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert wait_for(lambda: pid_file.exists() and pid_file.read_text()), "job never started"
    return client, int(pid_file.read_text())


def test_sigterm_to_the_client_reaches_the_job(warm, tmp_path):
    client, job = _start_sleeper(warm, tmp_path)
    assert job != client.pid
    client.send_signal(signal.SIGTERM)
    assert client.wait(timeout=20) == 128 + signal.SIGTERM
    assert wait_for(lambda: not alive(job))


def test_a_killed_client_takes_its_job_down(warm, tmp_path):
    client, job = _start_sleeper(warm, tmp_path)
    client.kill()
    client.wait(timeout=20)
    assert wait_for(lambda: not alive(job)), "the job outlived its SIGKILLed client"
    # The server survives and serves the next job.
    assert warm.run("exit", "0", cwd=tmp_path).returncode == 0


def test_cold_start_when_no_server_can_be_reached(warm, tmp_path):
    for env in ({**warm.env, "RACE_WARM_SOCKET": "/nonexistent-dir/s.sock"},
                {**warm.env, "RACE_WARM": "0"}, {**warm.env, "SLURM_JOB_ID": "42"}):
        client = subprocess.Popen(warm.command("report", "cold.txt"), cwd=tmp_path, env=env,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, _err = client.communicate(timeout=60)
        assert client.returncode == 0 and out == "to stdout\n"
        assert int((tmp_path / "cold.txt").read_text().split()[0]) == client.pid
    assert warm.server_pids() == []


def test_a_stale_socket_file_is_replaced(warm, tmp_path):
    warm.socket.write_text("left by a killed server")
    result = warm.run("exit", "0", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert len(warm.server_pids()) == 1


def test_an_idle_server_exits_and_removes_its_socket(tmp_path):
    server = Warm(idle=1)
    try:
        assert server.run("exit", "0", cwd=tmp_path).returncode == 0
        [pid] = server.server_pids()
        assert wait_for(lambda: not alive(pid) and not server.socket.exists())
    finally:
        server.stop()


def test_socket_is_per_import_time_environment(monkeypatch):
    monkeypatch.delenv("RACE_WARM_SOCKET", raising=False)
    monkeypatch.setenv("HF_HOME", "/a")
    first = warm_client.socket_path()
    assert warm_client.socket_path() == first
    monkeypatch.setenv("SOME_UNRELATED_VARIABLE", "x")
    assert warm_client.socket_path() == first
    monkeypatch.setenv("HF_HOME", "/b")
    assert warm_client.socket_path() != first
    directory = Path(first).parent
    assert directory.name == f"race-warm-{os.getuid()}"
    assert directory.stat().st_mode & 0o777 == 0o700  # no other user can bind or read there


def test_a_directory_other_users_can_write_is_refused(warm, tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    env = {**warm.env, "RACE_WARM_SOCKET": str(shared / "s.sock")}
    result = subprocess.run(warm.command("exit", "0"), cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "not a private directory" in result.stderr
    assert not (shared / "s.sock").exists()  # ran cold, no server there


def test_clients_starting_together_share_one_server(warm, tmp_path):
    clients = [subprocess.Popen(warm.command("exit", "0"), cwd=tmp_path, env=warm.env)
               for _ in range(4)]
    assert [c.wait(timeout=60) for c in clients] == [0] * 4
    assert len(warm.server_pids()) == 1 and warm.jobs_logged() == 4


def test_clients_racing_an_idle_exit_never_fail(tmp_path):
    """Jobs spaced around the idle timeout: each finds a live, retiring or no server."""
    server = Warm(idle=0.3)
    try:
        for i in range(8):
            assert server.run("exit", "0", cwd=tmp_path).returncode == 0, i
            time.sleep(0.25 + 0.02 * i)
    finally:
        server.stop()


def test_a_malformed_request_releases_the_descriptors_it_carried(warm, tmp_path):
    import socket

    assert warm.run("exit", "0", cwd=tmp_path).returncode == 0  # server up
    read_end, write_end = os.pipe()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(warm.socket))
        socket.send_fds(sock, [b"\x00\x00\x00\x05oops!"], [write_end] * 3)
        os.close(write_end)
        assert sock.recv(100) == b""  # refused, connection closed
    os.set_blocking(read_end, False)
    assert wait_for(lambda: _pipe_closed(read_end)), "server kept the client's pipe open"
    os.close(read_end)
    assert warm.run("exit", "0", cwd=tmp_path).returncode == 0  # and still serves


def _pipe_closed(read_end: int) -> bool:
    try:
        return os.read(read_end, 1) == b""
    except BlockingIOError:
        return False


def test_a_job_dies_with_its_server(warm, tmp_path):
    client, job = _start_sleeper(warm, tmp_path)
    [server] = warm.server_pids()
    os.kill(server, signal.SIGKILL)
    assert wait_for(lambda: not alive(job)), "the job outlived its server"
    assert client.wait(timeout=20) == 1
    assert "warm server died" in client.stderr.read().decode()


def test_warm_evaluation_equals_cold(tmp_path, tokenizer):
    """The real stack: a forked child evaluates a policy exactly as a fresh process does,
    sampled targets included (their seeds do not depend on the process)."""
    from race.policy.ladder import build_ladder_model

    write_splits(TaskSpec(n_train=8, n_eval_in=6, n_eval_ood=4), tmp_path / "data")
    build_ladder_model("nano", tokenizer, seed=0).save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    from race.study.jobs import EvalJob, Snapshot, to_json
    from race.study.specs import EvalSpec

    spec = EvalSpec.from_config({"targets": ["in_pass1", "maj_k"], "n_in": 4, "k": 2,
                                 "sample_prompts": 3, "max_new_tokens": 6})

    def evaluate(command, out, env):
        job = EvalJob(policy=str(tmp_path / "base"), data_dir=str(tmp_path / "data"),
                      snapshots=[Snapshot(None, str(out))], spec=spec, study="t")
        result = subprocess.run([*command, "evaluate", "--job", to_json(job)], env=env,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        return _without_wall(json.loads(out.read_text()))

    server = Warm(preload="torch,transformers,peft,race.cli,race.cli.evaluate", entry=None)
    try:
        warm = evaluate(server.command(), tmp_path / "warm.json", server.env)
        assert server.jobs_logged() == 1
        cold = evaluate([sys.executable, "-m", "race.cli"], tmp_path / "cold.json",
                        {**server.env, "RACE_WARM": "0"})
    finally:
        server.stop()
    assert warm == cold


def _without_wall(obj):
    if isinstance(obj, dict):
        return {k: _without_wall(v) for k, v in obj.items() if k != "wall_s"}
    if isinstance(obj, list):
        return [_without_wall(v) for v in obj]
    return obj
