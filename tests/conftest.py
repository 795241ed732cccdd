"""Shared test setup: one thread, fixed seeds, and small on-disk fixtures built per session."""

import random

import pytest
import torch


@pytest.fixture(autouse=True)
def _deterministic():
    torch.set_num_threads(1)
    torch.manual_seed(0)
    random.seed(0)


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory):
    from race.data.tokenizer import save_tokenizer

    return save_tokenizer(tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="session")
def tokenizer(tokenizer_dir):
    from race.data.tokenizer import load_tokenizer

    return load_tokenizer(tokenizer_dir)
