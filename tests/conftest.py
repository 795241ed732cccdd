"""Shared test setup: one thread, fixed seeds, and small on-disk fixtures built per session."""

import json
import os
import random
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from once import once_per_run


def pytest_configure(config):
    """One thread from the start: module- and session-scoped fixtures (a reference training
    run, say) are set up before the function-scoped autouse fixture below, and a reduction
    split over two threads rounds differently (by an ulp) from the same one on one thread, so
    a test run alone would compare against a reference built on another thread count."""
    torch.set_num_threads(1)


SLURM_CLUSTER = ["bash", str(Path(__file__).resolve().parents[1] / "tools" / "slurm-cluster.sh")]
SLURM_RECORD = "slurm-cluster"  # its record's name in the folder the run's workers share

#: Test files in the order pytest-xdist's workers take them (pyproject.toml: whole files, in
#: collection order): those that run a study first, so that they start at once on separate
#: workers and the unit tests fill in beside them. A worker is handed its next file once at
#: most two of its tests are left, and that file then waits for the study: so the study files
#: keep more than two tests pending while their study runs (test_rehearsal.py's study test
#: comes first; test_smoke_study.py holds the fault tests that read its study), and the
#: memory test on the rehearsal's models, which needs no finished study, goes to the third
#: worker and runs beside the studies.
FIRST = ("test_smoke_study.py", "test_rehearsal.py", "test_gpus.py", "test_rehearsal_memory.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = item.path.name
        return FIRST.index(name) if name in FIRST else len(FIRST)

    items.sort(key=rank)  # stable: file order kept otherwise


def pytest_xdist_auto_num_workers(config):
    """One worker more than cores (pyproject.toml's ``--numprocesses=auto``): the files that
    run a study leave a core idle while their jobs start up, wait on SLURM's status polls or
    run one at a time, and the third worker runs the unit tests in those gaps."""
    return (os.cpu_count() or 1) + 1


@pytest.fixture(autouse=True)
def _deterministic():
    # again per test: a test may change the process's thread count (a CLI run in-process)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)


@pytest.fixture()
def umask_002():
    """The umask of a study shared with a group: every output should come out 0664."""
    old = os.umask(0o002)
    yield
    os.umask(old)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    from race.data.tokenizer import save_tokenizer

    return save_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from race.data.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_dir)


@pytest.fixture(scope="session")
def slurm_cluster(shared_tmp):
    """The single-node SLURM cluster of tools/slurm-cluster.sh for the tests that submit jobs,
    brought up once per test run by the first worker to ask (the others wait on the lock),
    and taken down at the run's end if it was not already running; else the reason it
    cannot be. While it is up, no snakemake call waits on it: with the SLURM client installed
    but no controller, each waits ~10 s (the executor plugin asks `scontrol show config` as
    it loads)."""
    def bring_up() -> dict:
        running = subprocess.run([*SLURM_CLUSTER, "status"], capture_output=True)
        up = subprocess.run([*SLURM_CLUSTER, "up"], capture_output=True, text=True, timeout=600)
        return {"error": None if up.returncode == 0 else (up.stderr.strip() or up.stdout.strip()),
                "take_down": up.returncode == 0 and running.returncode != 0}

    return once_per_run(shared_tmp, SLURM_RECORD, bring_up)["error"]


def pytest_sessionfinish(session):
    """At the end of the run (in pytest-xdist's controller, or the one process), take down a
    cluster that `slurm_cluster` brought up."""
    if hasattr(session.config, "workerinput"):
        return
    record = session.config._tmp_path_factory.getbasetemp() / f"{SLURM_RECORD}.json"
    if record.exists() and json.loads(record.read_text())["take_down"]:
        subprocess.run([*SLURM_CLUSTER, "down"], capture_output=True)


@pytest.fixture(scope="session")
def shared_tmp(tmp_path_factory, worker_id) -> Path:
    """A folder every pytest-xdist worker of this test run shares (the run's own temporary
    folder when it runs in one process)."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


@pytest.fixture(scope="session")
def smoke_study(shared_tmp, request) -> dict:
    """The smoke study, run once per test run across the workers (tests/smoke.py)."""
    from smoke import finished_study

    return finished_study(shared_tmp, lambda: request.getfixturevalue("slurm_cluster"))


@pytest.fixture(scope="session")
def install_stand_ins(shared_tmp):
    """Puts the rehearsal's stand-ins for the hub (`race stand-ins`) at a folder: written once
    per test run across the workers, then hard-linked (their files are only read)."""
    from race.cli import main

    hub = shared_tmp / "rehearsal-hub"

    def write() -> dict:
        shutil.rmtree(hub, ignore_errors=True)  # what a failed build left
        assert main(["stand-ins", "--out", str(hub)]) == 0
        return {"hub": str(hub)}

    once_per_run(shared_tmp, "rehearsal-hub", write)

    def install(to: Path) -> None:
        shutil.copytree(hub, to, copy_function=os.link)

    return install
