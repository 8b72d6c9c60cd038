"""Executors: where the clients' real local training runs.

`local` trains the round's clients in this process. `ray` (edgefl.executors.ray) sends them to Ray
workers, which remake the method from a recipe the experiment gives. The run loop
(edgefl.experiment.loop) picks one. Both call `Method.train` with each client's plan on the same
method state, and training is seeded per (seed, round, client), so they produce the same updates.

With `training.group_clients` (the default) the clients a method gives one `group_key` train
together by `Method.train_group` (edgefl.execution.grouped; a group per Ray task), and the group's
measured time is shared out among its clients by their FLOPs as `real_compute_s`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Protocol

import torch

from edgefl.execution.grouped import start_parts
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
        """The updates, trained on a fork of torch's random state: a client seeds and draws its own
        stream (seeded per seed, round and client), and leaves this process's state as a Ray worker
        leaves the driver's, untouched, so what the driver draws next (the evaluation attack's random
        starts, between an async run's client starts) is the same whichever executor trained."""
        cuda = [self.method.ctx.device] if self.method.ctx.device.type == "cuda" else []
        with torch.random.fork_rng(devices=cuda):
            updates = [u for group in groups(self.method, round_, plans)
                       for u in train_timed_group(self.method, round_, group)]
        return in_order(updates, plans)


def groups(method: Method, round_: int, plans: dict[int, ClientPlan]) -> list[dict[int, ClientPlan]]:
    """The round's clients split into the groups that train together, in the order of `plans`:
    one client each unless `training.group_clients` is on and the method gives them a key."""
    if not method.ctx.scenario.training.group_clients:
        return [{k: p} for k, p in plans.items()]
    keyed: dict[Hashable, dict[int, ClientPlan]] = {}
    out: list[dict[int, ClientPlan]] = []
    for k, p in plans.items():
        key = method.group_key(round_, k, p)
        if key is None:
            out.append({k: p})
        elif key in keyed:
            keyed[key][k] = p
        else:
            keyed[key] = {k: p}
            out.append(keyed[key])
    return out


def train_timed_group(method: Method, round_: int, plans: dict[int, ClientPlan],
                      clock: Callable[[], float] = time.perf_counter) -> list[ClientUpdate]:
    """A group's updates, its measured time shared by the clients' FLOPs as `real_compute_s`
    (one client: `train_timed`)."""
    if len(plans) == 1:
        (k, p), = plans.items()
        return [train_timed(method, round_, k, p, clock)]
    device: torch.device = method.ctx.device
    start_parts(len(plans), device)
    updates, seconds = timed(device, lambda: method.train_group(round_, plans), clock)
    flops = [p.workload.flops() for p in plans.values()]
    return [replace(u, real_compute_s=seconds * f / sum(flops)) for u, f in zip(updates, flops, strict=True)]


def in_order(updates: list[ClientUpdate], plans: dict[int, ClientPlan]) -> list[ClientUpdate]:
    """`updates` in the order of `plans`."""
    by_client = {u.client: u for u in updates}
    return [by_client[k] for k in plans]


def train_timed(method: Method, round_: int, client: int, plan: ClientPlan,
                clock: Callable[[], float] = time.perf_counter) -> ClientUpdate:
    """`method.train`, with its time on the training device (wall time unless another `clock` is
    given) as `real_compute_s`."""
    device: torch.device = method.ctx.device
    update, seconds = timed(device, lambda: method.train(round_, client, plan), clock)
    return replace(update, real_compute_s=seconds)

