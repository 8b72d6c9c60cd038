"""Shared test set-up: PyTorch on one thread (tiny models train fastest so on a small machine), its
OpenMP threads waiting passively, and the round loop compiled once."""

import os
from collections.abc import Iterator

# Before torch (and its OpenMP runtime) loads, here and in every process a test starts: an OpenMP thread
# that waits spins on its core by default, and beside pytest-xdist's other workers (or a scenario's
# `threads = 2` on two cores) that spinning took the cores' time: 26 s of CPU against 11 s for three
# short runs of tests/test_methods.py on this 2-core host with one other process busy.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    """Each test starts on one thread: a scenario's `threads` (the quickstart's 2) sets the whole
    process's count when a test prepares it."""
    torch.set_num_threads(1)
    yield


def pytest_configure(config: pytest.Config) -> None:
    """The round loop compiled into numba's cache once, before the first test: in the controller of
    pytest-xdist (which has no `workerinput`) before its workers start, or else each worker's first
    run would compile it again (about a minute of CPU each on a fresh clone)."""
    if not hasattr(config, "workerinput"):
        from edgefl.sim.round_loop import ready

        ready()
