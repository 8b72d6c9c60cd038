"""edgefl's own dry run of a scenario, as a Flower app's client mod and strategy wrapper use it.

A `Shadow` is the scenario prepared without data or training (edgefl.experiment.prepare with
`dry_run`): its fleet (DevicePool, drawn from the scenario's pool or device list with its seed, as
`edgefl run` draws it), its method (which plans each client's round: the Workload the cost model
prices), its cost model (Pricer: compute, data access and swap, download, upload) and its energy
(RoundEnergy: the server's links, power figures, batteries). This module does not import flwr.

A client's price travels as plain numbers (`PRICES`, keys `edgefl.<name>` of the reply's
MetricRecord); `costs_of` turns a round's prices back into edgefl's `Costs` columns, the very
numbers the node's one-row pricing gave (floats travel as IEEE doubles, so to the bit).

The layers priced are the scenario's `model.name`, or the app's own network (`model`, a function
making the torch module the nodes train): cut into atoms as edgefl cuts a torchvision model
(edgefl.models.cut), profiled, and the method remade on it, so its plans carry that network's
atoms and bytes.
"""

from __future__ import annotations

import tomllib
from collections.abc import Callable
from dataclasses import fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from edgefl.config import Scenario
from edgefl.devices.pool import StateMap, States
from edgefl.errors import EdgeflError
from edgefl.experiment.prepare import Experiment, check_budgets, prepare
from edgefl.experiment.round_energy import RoundEnergy
from edgefl.methods import METHODS
from edgefl.methods.base import ClientPlan
from edgefl.models.base import AtomModel
from edgefl.models.cut import cut
from edgefl.profiling import profile_model
from edgefl.scenario import load_scenario, scenario_from_toml, to_toml, validate
from edgefl.sim.bulk import Pricer
from edgefl.sim.cost import Costs, RoundPlan
from edgefl.sim.workload import Workload

KEY = "edgefl"  # the prefix of every key edgefl adds to a Flower message's records
PRICES = tuple(f.name for f in fields(Costs))  # compute_s, data_access_s, download_s, upload_s, ...
PLANNED = ("batch", "iterations", "attack_steps", "slots", "download_bytes", "upload_bytes", "train_pairs",
           "extra_forwards", "extra_flops", "samples")  # a Workload's numbers (its atoms: the model's)
DID = ("iterations", "batch", "attack_steps")  # what a ClientApp may say it did (`edgefl.did.<name>`)
INTS = {"batch", "iterations", "attack_steps", "slots", "train_pairs", "extra_forwards", "samples"}


def key(name: str) -> str:
    return f"{KEY}.{name}"


class Shadow:
    """A scenario prepared as `edgefl run --dry-run` prepares it: fleet, method, cost model, energy."""

    def __init__(self, scenario: Scenario, where: str, model: Callable[[], Any] | None = None) -> None:
        self.scenario, self.where = scenario, where
        self.exp: Experiment = prepare(scenario, where, dry_run=True)
        if model is not None:
            self.exp = own_model(self.exp, model)
        exp = self.exp
        self.pricer = Pricer(exp.ctx.cost, exp.pool, lambda k: len(exp.ctx.splits[k].train))
        self.energy = RoundEnergy(scenario, exp.pool)
        self.text = to_toml(scenario)

    @classmethod
    def load(cls, scenario: str | Path | Scenario, overrides: list[str] | None = None,
             model: Callable[[], Any] | None = None) -> Shadow:
        """From a scenario file (with `--set`-style `overrides`) or a Scenario (checked as a file is)."""
        check_model(model, "scenario")
        if isinstance(scenario, Scenario):
            if overrides:
                raise EdgeflError("scenario", "overrides", "apply --set overrides to a scenario file, not "
                                  "to a Scenario object (use dataclasses.replace)")
            validate(scenario, "scenario")
            return cls(scenario, "scenario", model)
        if not isinstance(scenario, str | Path):
            raise EdgeflError("scenario", "type", f"give a scenario file or an edgefl Scenario, not "
                              f"{type(scenario).__name__}")
        return cls(load_scenario(scenario, overrides), str(Path(scenario).resolve()), model)

    @classmethod
    def from_text(cls, text: str, where: str, model: Callable[[], Any] | None = None) -> Shadow:
        """From a resolved scenario (`to_toml`) that a server sent, found beside the file `where`."""
        return cls(scenario_from_toml(tomllib.loads(text), where), where, model)

    @property
    def clients(self) -> int:
        return self.scenario.fleet.clients

    def planned(self, t: int, clients: np.ndarray) -> tuple[States, RoundPlan[ClientPlan]]:
        """Round t's draws and plans of `clients` (ascending), as edgefl.experiment.rounds `priced`."""
        states = self.exp.pool.states(clients, t)
        return states, self.exp.method.plan_round(t, states.clients, StateMap(self.exp.pool, states))

    def price(self, client: int, t: int, sent: dict[str, Any] | None = None,
              did: dict[str, Any] | None = None) -> dict[str, float]:
        """Client `client`'s round t on its device: the method's plan, with the numbers the server
        `sent` (its plan, PLANNED) and what the node says it `did` (DID) in their place, priced by
        the cost model (a one-row call of the Pricer every edgefl round uses) with the joules of
        the work alone (NaN without `energy.enabled`)."""
        if not 0 <= client < self.clients:
            raise EdgeflError(self.where, "fleet.clients", f"partition-id {client} has no device: the fleet "
                              f"has {self.clients} clients (0 to {self.clients - 1}); give the Flower "
                              "federation as many nodes, or the scenario as many clients")
        states, plan = self.planned(t, np.array([client], dtype=np.int64))
        plan = with_numbers(plan, {**(sent or {}), **(did or {})})
        costs = self.pricer.price(plan, states)
        joules = self.energy.bulk(states, plan, costs, np.zeros(1))
        out = {name: float(getattr(costs, name)[0]) for name in PRICES}
        out["energy_j"] = float(joules[0])
        return out


def check_model(model: Any, where: str) -> None:
    """One line unless `model` is None or a function making a network (not a network itself)."""
    if model is not None and (not callable(model) or isinstance(model, torch.nn.Module)):
        raise EdgeflError(where, "model", f"is a function making the network the nodes train (e.g. the "
                          f"class Net), not a {type(model).__name__} object")


def own_model(exp: Experiment, model: Callable[[], Any]) -> Experiment:
    """The dry experiment on the app's own network: its atoms (cut as edgefl cuts a torchvision
    model) profiled, the method remade on them and every device checked to hold them."""
    shape = tuple(exp.ctx.data.input_shape)

    def new_model() -> AtomModel:
        net = model()
        if isinstance(net, AtomModel):
            return net
        return AtomModel(cut(net, shape, "the app's model", exp.where), shape)

    ctx = replace(exp.ctx, new_model=new_model, profile=profile_model(new_model(), "flower"))
    method = METHODS.get(exp.scenario.method)(ctx)
    check_budgets(exp.pool, method, exp.where)
    return replace(exp, ctx=ctx, method=method)


def with_numbers(plan: RoundPlan[ClientPlan], numbers: dict[str, Any]) -> RoundPlan[ClientPlan]:
    """The one-client `plan` with the workload's numbers in `numbers` (PLANNED) in place of its own."""
    given: dict[str, Any] = {k: (int(v) if k in INTS else float(v))
                             for k, v in numbers.items() if k in PLANNED}
    if not given:
        return plan
    p = plan.plan(0)
    return RoundPlan([replace(p, workload=replace(p.workload, **given))], np.zeros(1, dtype=np.int64))


def plan_numbers(w: Workload) -> dict[str, float | int]:
    """The numbers of a workload a server sends a node with its plan (PLANNED)."""
    return {k: getattr(w, k) for k in PLANNED}


def costs_of(prices: list[dict[str, float]]) -> Costs:
    """Costs columns of per-client prices (`Shadow.price`), in order."""
    return Costs(**{name: np.array([p[name] for p in prices], dtype=bool if name == "swapped" else np.float64)
                    for name in PRICES})
