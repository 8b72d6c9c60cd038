"""Shared test set-up: PyTorch on one thread (tiny models train fastest so on a small machine)."""

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Each test starts on one thread: a scenario's `threads` (the quickstart's 2) sets the whole
    process's count when a test prepares it."""
    torch.set_num_threads(1)
    yield
