"""Shared test setup: one thread, fixed seeds, and small on-disk fixtures built per session."""

import os
import random
import subprocess
from pathlib import Path

import pytest
import torch


def pytest_configure(config):
    """One thread from the start: module- and session-scoped fixtures (a reference training
    run, say) are set up before the function-scoped autouse fixture below, and a reduction
    split over two threads rounds differently (by an ulp) from the same one on one thread, so
    a test run alone would compare against a reference built on another thread count."""
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    """Test files that run a study (those with ``slow`` tests, the most first) lead the
    collection: pytest-xdist hands whole files to its workers in this order (pyproject.toml),
    so the long ones start at once on separate workers and the unit tests fill in beside
    them, instead of one study starting last on a worker that already ran everything else."""
    slow: dict[str, int] = {}
    for item in items:
        slow[item.path.name] = slow.get(item.path.name, 0) + bool(item.get_closest_marker("slow"))
    items.sort(key=lambda item: -slow[item.path.name])  # stable: file order kept otherwise


def pytest_xdist_auto_num_workers(config):
    """One worker more than cores (pyproject.toml's ``--numprocesses=auto``): the files that
    run a study leave a core idle while their jobs start up, wait on SLURM's status polls or
    run one at a time, and a third worker runs the unit tests in those gaps."""
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
def slurm_cluster():
    """The single-node SLURM cluster of tools/slurm-cluster.sh for the tests that submit jobs,
    brought up once per test run (and down at its end, if it was not already running); else
    the reason it cannot be. While it is up, no snakemake call waits on it: with the SLURM
    client installed but no controller, each waits ~10 s (the executor plugin asks
    `scontrol show config` as it loads)."""
    script = ["bash", str(Path(__file__).resolve().parents[1] / "tools" / "slurm-cluster.sh")]
    running = subprocess.run([*script, "status"], capture_output=True).returncode == 0
    up = subprocess.run([*script, "up"], capture_output=True, text=True, timeout=600)
    yield None if up.returncode == 0 else (up.stderr.strip() or up.stdout.strip())
    if up.returncode == 0 and not running:
        subprocess.run([*script, "down"], capture_output=True)
