"""The per-client reference of a round (issue 37: the columns are the implementation, and this
proves them right, to the bit): each client drawn (DevicePool.state), planned (Method.plan_round on
a mapping of states), priced by the cost model's `cost` and played as its own SimPy process
(`run_round`), as edgefl played every round before its bulk engine. `per_client` makes a run
play its rounds so."""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import simpy

from edgefl.devices.classes import perf_flops
from edgefl.devices.pool import DevicePool, DeviceState, States
from edgefl.experiment import async_rounds, living, players
from edgefl.experiment.round_energy import RoundEnergy
from edgefl.experiment.rounds import RoundTable
from edgefl.methods.base import ClientPlan, Method
from edgefl.selection import Picked
from edgefl.sim.bulk import Costs, Pricer, RoundPlan
from edgefl.sim.clients import COMPLETED
from edgefl.sim.cost import ClientCost
from edgefl.sim.energy import client_power, round_energy
from edgefl.sim.engine import Federation, busy_end

Job = tuple[int, DeviceState, ClientCost]  # (client, its state this round, its cost)


@dataclass(slots=True)
class ClientRecord:
    round: int
    client: int
    state: DeviceState
    cost: ClientCost
    finish_s: float = 0.0
    wait_s: float = 0.0


@dataclass
class RoundRecord:
    round: int
    start_s: float
    end_s: float  # after the server's time
    server_s: float
    clients: list[ClientRecord] = field(default_factory=list)


def run_round(fed: Federation, round_: int, jobs: list[Job], server_s: float = 0.0) -> RoundRecord:
    """Play one round on `fed`'s clock, one SimPy process per client; the server then spends
    `server_s`."""
    env = fed.env

    def client(r: ClientRecord) -> Generator[simpy.Event, Any, None]:
        c = r.cost  # the phases back to back on the client alone: one timeout covers them
        yield env.timeout(busy_end(fed.now, c.download_s, c.data_access_s, c.compute_s, c.upload_s) - fed.now)
        r.finish_s = fed.now

    def play() -> Generator[simpy.Event, Any, RoundRecord]:
        start = fed.now
        records = [ClientRecord(round_, k, state, cost) for k, state, cost in jobs]
        yield simpy.AllOf(env, [env.process(client(r)) for r in records])
        last = fed.now
        for r in records:
            r.wait_s = last - r.finish_s
        yield env.timeout(server_s)
        return RoundRecord(round_, start, fed.now, server_s, records)

    process = env.process(play())
    env.run(until=process)
    assert isinstance(process.value, RoundRecord)
    return process.value


def planned_jobs(pool: DevicePool, method: Method, pricer: Pricer, t: int, clients: np.ndarray
                 ) -> tuple[dict[int, DeviceState], RoundPlan[ClientPlan], list[Job]]:
    """Round t's `clients` drawn, planned and priced client by client: their states, the round's
    plan and each client's (client, state, cost)."""
    states = {k: pool.state(k, t) for k in clients.tolist()}
    plan = method.plan_round(t, clients, states)
    jobs = [(k, st, pricer.model.cost(pricer.counted(k, plan.workload(i)), st))
            for i, (k, st) in enumerate(states.items())]
    return states, plan, jobs


def each_priced(pool: DevicePool, method: Method, pricer: Pricer, t: int, clients: np.ndarray
                ) -> tuple[States, RoundPlan[ClientPlan], Costs]:
    """As edgefl.experiment.rounds `priced`, client by client."""
    states, plan, jobs = planned_jobs(pool, method, pricer, t, clients)
    return pool.gathered(clients, list(states.values())), plan, Costs.of([c for *_, c in jobs])


def each_round(pool: DevicePool, method: Method, pricer: Pricer, fed: Federation, t: int,
               server_s: Callable[[], float], picked: Picked, energy: RoundEnergy) -> RoundTable:
    """As edgefl.experiment.rounds `bulk_round`, client by client, one SimPy process each."""
    clients = picked.clients
    states, plan, jobs = planned_jobs(pool, method, pricer, t, clients)
    table = pool.gathered(clients, list(states.values()))
    settled = energy.shared(table, plan, Costs.of([c for _, _, c in jobs]))
    jobs = [(k, st, settled.cost(i)) for i, (k, st, _) in enumerate(jobs)]
    r = run_round(fed, t, jobs, server_s())
    n, costs = len(clients), Costs.of([c.cost for c in r.clients])
    finish, wait = np.array([c.finish_s for c in r.clients]), np.array([c.wait_s for c in r.clients])
    joules = each_energy(energy, list(states.values()), plan, costs, wait)
    return RoundTable(t, r.start_s, max(finish, default=r.start_s), r.end_s, r.server_s, table, plan, costs,
                      np.full(n, r.start_s), finish, wait, np.full(n, COMPLETED), np.zeros(n, dtype=np.int64),
                      np.zeros(n, dtype=bool), np.full(n, np.nan) if joules is None else joules,
                      energy.charge(table), picked)


def each_energy(energy: RoundEnergy, states: list[DeviceState], plan: RoundPlan, costs: Costs,
                wait_s: np.ndarray) -> np.ndarray | None:
    """RoundEnergy's joules of a round, client by client (edgefl.sim.energy's formula on floats)."""
    if energy.power is None:
        return None
    down, up = energy.sent(plan)
    return np.array([client_energy(energy.pool, st, costs.cost(i), (down[i], up[i]), float(wait_s[i]))
                     for i, st in enumerate(states)])


def client_energy(pool: DevicePool, state: DeviceState, c: ClientCost, sent: tuple[float, float],
                  wait_s: float) -> float:
    """One client's joules: `sent` is (bytes downloaded, bytes uploaded), zeros where communication
    is not counted."""
    p = client_power(state.device, pool.networks[state.network])
    return float(round_energy(p, c, state.flops / perf_flops(state.device), sent[0], sent[1], wait_s))


def per_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Runs from now on play their rounds client by client: plain rounds (`each_round`), living
    and async rounds priced client by client (`each_priced`)."""
    monkeypatch.setattr(players, "bulk_round", each_round)
    monkeypatch.setattr(living, "priced", each_priced)
    monkeypatch.setattr(async_rounds, "priced", each_priced)
