"""Executors: where the clients' real local training runs.

`local` trains the round's clients one after another in this process. `ray` (edgefl.execution.ray)
sends them to Ray workers, which remake the method from a recipe the experiment gives. The run loop
(edgefl.experiment.loop) picks one. Both call `Method.train` with each client's plan on the same
method state, and training is seeded per (seed, round, client), so they produce the same updates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from typing import Protocol

import torch

from edgefl.execution.local import timed
from edgefl.methods import ClientPlan, ClientUpdate, Method


class Executor(Protocol):
    def train(self, round_: int, plans: dict[int, ClientPlan]) -> list[ClientUpdate]:
        """Each planned client's update, in the order of `plans`."""
        ...


class LocalExecutor:
    def __init__(self, method: Method) -> None:
        self.method = method

    def train(self, round_: int, plans: dict[int, ClientPlan]) -> list[ClientUpdate]:
        return [train_timed(self.method, round_, k, p) for k, p in plans.items()]


def train_timed(method: Method, round_: int, client: int, plan: ClientPlan,
                clock: Callable[[], float] = time.perf_counter) -> ClientUpdate:
    """`method.train`, with its time on the training device (wall time unless another `clock` is
    given) as `real_compute_s`."""
    device: torch.device = method.ctx.device
    update, seconds = timed(device, lambda: method.train(round_, client, plan), clock)
    return replace(update, real_compute_s=seconds)

