"""Preparing an experiment: data (or its shapes, for a dry run), the clients' splits, the model's atom
profile, the fleet and the method, and the check that every device can run the workload at all.

`Rebuild` is the recipe a worker process (edgefl.executors.ray) remakes the method from: the same
data, splits, profile and model factory, without the fleet.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np
import torch

from edgefl.attacks import make_attack
from edgefl.config import Scenario
from edgefl.data import Dataset, load_dataset, split_clients
from edgefl.data.datasets import dataset_spec, shapes_only
from edgefl.data.partition import ClientSplit, public_split
from edgefl.devices.catalog import catalog_for
from edgefl.devices.pool import DevicePool, check_fleet_memory
from edgefl.errors import EdgeflError
from edgefl.executors.ray import check_reachable
from edgefl.methods import METHODS, Context, Method
from edgefl.methods.base import method_class
from edgefl.models import AtomModel, build_model
from edgefl.profiling import profile_model
from edgefl.scenario import scenario_from_toml
from edgefl.training.allocator import keep_freed_memory
from edgefl.training.local import resolve_device


@dataclass
class Experiment:
    scenario: Scenario
    where: str  # the scenario file, for error messages
    ctx: Context
    pool: DevicePool
    method: Method
    dry_run: bool = False  # engine and cost model only: no data, no training, no accuracy
    clients_here: bool = False  # clients train in this process whatever `executor` says: the run is
    # itself a Ray task (edgefl.experiment.spread)


def prepare(scenario: Scenario, where: str, dry_run: bool = False) -> Experiment:
    """Load data (a dry run needs only its shapes), build model and fleet, and check every device
    can run the workload at all, and that a Ray cluster named by its address answers (before any
    run folder is touched)."""
    check_fleet_memory(scenario.fleet, where, living=scenario.round if scenario.living else None)
    if scenario.executor == "ray" and not dry_run:
        check_reachable(scenario.ray.address, where)
    ctx = method_context(scenario, where, dry_run)
    pool = DevicePool(catalog_for(where), scenario.fleet, scenario.seed)
    method = METHODS.get(scenario.method)(ctx)
    check_budgets(pool, method, where)
    return Experiment(scenario, where, ctx, pool, method, dry_run)


def method_context(scenario: Scenario, where: str, dry_run: bool = False) -> Context:
    """What the method is built from: the training device, the data and splits, the model factory
    and its profile, the training attack; the torch seed is set last, for the method's own draws."""
    device = resolve_device(scenario.device)
    if scenario.threads:
        torch.set_num_threads(scenario.threads)
    if not dry_run:
        keep_freed_memory()
    data, splits, public = _dry_data(scenario, where) if dry_run else _real_data(scenario, where, device)

    new_model = model_factory(scenario, data, where)
    profile = fitted_profile(scenario, new_model, data.input_shape, where)
    a = scenario.attack
    attack = None if a.name == "none" else make_attack(a.name, a.eps, a.step_size, a.steps)
    torch.manual_seed(scenario.seed)
    return Context(scenario, where, data, splits, profile, new_model, device, attack, public)


@dataclass(frozen=True)
class Rebuild:
    """The method remade in another process from the resolved scenario (`to_toml`) and its file: a
    small picklable recipe, equal for equal scenarios, so a worker builds its method once."""

    text: str  # the resolved scenario
    where: str  # its file, for error messages

    def __call__(self) -> Method:
        scenario = scenario_from_toml(tomllib.loads(self.text), self.where)
        return METHODS.get(scenario.method)(method_context(scenario, self.where))


def model_factory(s: Scenario, data: Any, where: str) -> Callable[[], AtomModel]:
    """The scenario's model for the data's inputs (a zoo model, or a torchvision or timm one with
    `model.kwargs`: edgefl.models.build), built anew at each call."""
    def new_model() -> AtomModel:
        return build_model(s.model.name, data.num_classes, data.input_shape, data.mean, data.std,
                           s.model.width, s.model.kwargs, where)

    return new_model


def fitted_profile(s: Scenario, new_model: Callable[[], Any], input_shape: Any, where: str) -> Any:
    """The model's atom profile, or one line when the model does not fit the dataset's inputs."""
    try:
        return profile_model(new_model(), s.model.name)
    except (RuntimeError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EdgeflError(where, "model.name", f"{s.model.name} does not fit "
                          f"{s.data.dataset}'s {tuple(input_shape)} inputs ({reason})") from None


def _real_data(s: Scenario, where: str, device: torch.device) -> tuple[Dataset, Any, np.ndarray]:
    data = load_dataset(s.data, where)
    public, splits = client_splits(s, data.train_y.numpy(), where)
    data = type(data)(data.train_x.to(device), data.train_y.to(device), data.test_x.to(device),
                      data.test_y.to(device), data.num_classes, data.mean, data.std)
    return data, splits, public


def _dry_data(s: Scenario, where: str) -> tuple[Dataset, Any, np.ndarray]:
    """Shapes without samples, and splits of a balanced label vector of the training set's size,
    computed only if a method asks for them (local epochs): fleets may outnumber the samples."""
    spec = dataset_spec(s.data)
    labels = np.arange(spec.train_samples) % spec.num_classes
    if public := method_class(s.method, s).public_samples(s):  # as the real run would refuse it
        public_split(len(labels), public, s.seed, where)
    splits = LazySplits(lambda: client_splits(s, labels, where)[1])
    return shapes_only(s.data), splits, np.zeros(0, dtype=np.int64)


class LazySplits(Sequence[ClientSplit]):
    """Client splits made on first use."""

    def __init__(self, make: Callable[[], list[ClientSplit]]) -> None:
        self.make = make

    @cached_property
    def splits(self) -> list[ClientSplit]:
        return self.make()

    def __getitem__(self, k: Any) -> Any:
        return self.splits[k]

    def __len__(self) -> int:
        return len(self.splits)


def client_splits(s: Scenario, labels: np.ndarray, where: str) -> tuple[np.ndarray, list[ClientSplit]]:
    """The server's public split (methods that distil) and the clients' splits of the rest."""
    public, rest = np.zeros(0, dtype=np.int64), np.arange(len(labels))
    if samples := method_class(s.method, s).public_samples(s):
        public, rest = public_split(len(labels), samples, s.seed, where)
    splits = split_clients(labels[rest], s.fleet.clients, s.data, s.seed, where)
    return public, [ClientSplit(rest[c.train], rest[c.val]) for c in splits]


def check_budgets(pool: DevicePool, method: Method, where: str) -> None:
    """Every device must hold the smallest step of the finest swapping schedule within R_min (one
    layer's tensors, one sample at a time), or no amount of paging helps."""
    first: dict[str, int] = {}  # one client per device kind, the first dealt it
    for k, d in enumerate(pool.devices):
        first.setdefault(d.name, k)
    for client in sorted(first.values()):
        device = pool.devices[client]
        budget = pool.reserved_bytes(device)  # plan as if at R_min: methods that adapt shrink there
        workload = method.plan(0, client, replace(pool.state(client, 0), memory_bytes=budget)).workload
        need, part = method.ctx.cost.min_budget(workload)
        if need > budget:
            fits = need <= device.memory_bytes
            fix = ("raise fleet.reserved_memory_mb (up to the device's memory) or drop the device" if fits
                   else "drop the device or choose a smaller model")
            devices = "fleet.devices" if pool.fleet.devices else "fleet.pool"
            raise EdgeflError(
                where, "fleet.reserved_memory_mb" if fits else devices,
                f"device {device.name} keeps at least {budget / 1e6:.3f} MB for training but the "
                f"smallest step on {part} (paged layer by layer, one sample at a time) needs "
                f"{need / 1e6:.3f} MB; {fix}")

