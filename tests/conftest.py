"""Shared test setup: one thread, fixed seeds, and small on-disk fixtures built per session."""

import os
import random

import pytest
import torch


def pytest_configure(config):
    """One thread from the start: module- and session-scoped fixtures (a reference training
    run, say) are set up before the function-scoped autouse fixture below, and a reduction
    split over two threads rounds differently (by an ulp) from the same one on one thread, so
    a test run alone would compare against a reference built on another thread count."""
    torch.set_num_threads(1)


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
