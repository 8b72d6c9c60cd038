"""Executors: where the clients' real local training runs.

`local` trains the round's clients in this process. `ray` (edgefl.executors.ray) sends them to Ray
workers, which remake the method from a recipe the experiment gives. The run loop
(edgefl.experiment.loop) picks one. Both call `Method.train` with each client's plan on the same
method state, and training is seeded per (seed, round, client), so they produce the same updates.

With `training.group_clients` (the default) the clients a method gives one `group_key` train
together by `Method.train_group` (edgefl.training.grouped; a group per Ray task), where their model's
architecture groups and grouping their work pays (`groups`), and the group's measured time is
shared out among its clients by their FLOPs as `real_compute_s`.
"""

from __future__ import annotations

import sys
import time
import weakref
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Protocol

import torch
from tqdm import tqdm

from edgefl.methods import ClientPlan, ClientUpdate, Method
from edgefl.training.grouped import why_not_worth_it, why_one_by_one
from edgefl.training.local import timed


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
    one client each unless `training.group_clients` is on, the model's architecture groups
    (edgefl.training.grouped.why_one_by_one), grouping their work pays (`why_not_worth_it`) and the
    method gives them a key (one without a key: `say_alone`)."""
    if not method.ctx.scenario.training.group_clients:
        return [{k: p} for k, p in plans.items()]
    alone = not method.groups or why_one_by_one(method.global_model()) is not None
    keyed: dict[Hashable, dict[int, ClientPlan]] = {}
    out: list[dict[int, ClientPlan]] = []
    for k, p in plans.items():
        worth_it = not alone and why_not_worth_it(p.workload, method.ctx.device) is None
        key = method.group_key(round_, k, p) if worth_it else None
        if key is None:
            say_alone(method, p)
            out.append({k: p})
        elif key in keyed:
            keyed[key][k] = p
        else:
            keyed[key] = {k: p}
            out.append(keyed[key])
    return out


TOLD: weakref.WeakSet[Method] = weakref.WeakSet()  # the methods (one a run) `say_alone` spoke for


def say_alone(method: Method, plan: ClientPlan) -> None:
    """Say once per method (per run) on stderr why its clients train one by one although
    `training.group_clients` is on."""
    if method in TOLD:
        return
    TOLD.add(method)
    tqdm.write(f"edgefl: note: clients train one by one, not grouped: {why_alone(method, plan)}",
               file=sys.stderr)


def why_alone(method: Method, plan: ClientPlan) -> str:
    """Why a client of `method` with `plan` trains one by one (`groups`)."""
    name = type(method).__name__
    if not method.groups:
        return f"method {name} changes local training beyond what grouped training does"
    if plan.attack is not None and not plan.attack.groupable:
        return f"the training attack {type(plan.attack).__name__} cannot attack a group's stacked batches"
    reason = why_one_by_one(method.global_model())
    if reason:
        return f"its model's {reason}"
    costly = why_not_worth_it(plan.workload, method.ctx.device)
    return f"its model's {costly}" if costly else f"method {name} gave the client no group key"


def train_timed_group(method: Method, round_: int, plans: dict[int, ClientPlan],
                      clock: Callable[[], float] = time.perf_counter) -> list[ClientUpdate]:
    """A group's updates, its measured time shared by the clients' FLOPs as `real_compute_s`
    (one client: `train_timed`)."""
    if len(plans) == 1:
        (k, p), = plans.items()
        return [train_timed(method, round_, k, p, clock)]
    device: torch.device = method.ctx.device
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

