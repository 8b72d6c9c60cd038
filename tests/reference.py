"""The per-client reference of a round (issue 37: the columns are the implementation, and this
proves them right, to the bit): each client drawn (DevicePool.state), planned (Method.plan_round on
a mapping of states), priced alone (`client_cost`: the walk accounting by its scalar twin
`walk_cost`, floats through the same formulas as the columns of `WalkCost.price`) and played as its
own SimPy process (`run_round`), as edgefl played every round before its bulk engine. `per_client`
makes a run play its rounds so."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pytest
import simpy

from edgefl.devices import draws
from edgefl.devices.classes import perf_flops
from edgefl.devices.pool import LATENCY, STATE, DevicePool, DeviceState, States
from edgefl.devices.profile import DeviceProfile
from edgefl.experiment import async_rounds, living, players
from edgefl.experiment.round_energy import RoundEnergy
from edgefl.experiment.rounds import RoundTable
from edgefl.methods.base import ClientPlan, Method
from edgefl.selection import Picked
from edgefl.sim.bulk import Pricer
from edgefl.sim.clients import COMPLETED
from edgefl.sim.cost import (
    ClientCost,
    Costs,
    RoundPlan,
    WalkCost,
    plan_seconds,
    storage_seconds,
    transfer_seconds,
    walk_compute_seconds,
)
from edgefl.sim.energy import client_power, round_energy
from edgefl.sim.engine import Federation, busy_end
from edgefl.sim.swap import Traffic, Walk, cheapest, footprint, traced_walks
from edgefl.sim.workload import Workload

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


def folded_state(pool: DevicePool, client: int, round_: int) -> DeviceState:
    """The reference of DevicePool.states: one client's draws for `round_`, its words folded one by
    one (draws.key), not derived in bulk (draws.words)."""
    words = [[draws.key(pool.seed, STATE, round_, client, j) for j in range(LATENCY + 1)]]
    return pool.state_at(pool._assemble(np.array([client]), np.array(words, dtype=np.uint64)), 0)


def planned_jobs(pool: DevicePool, method: Method, pricer: Pricer, t: int, clients: np.ndarray
                 ) -> tuple[dict[int, DeviceState], RoundPlan[ClientPlan], list[Job]]:
    """Round t's `clients` drawn, planned and priced client by client: their states, the round's
    plan and each client's (client, state, cost)."""
    states = {k: pool.state(k, t) for k in clients.tolist()}
    plan = method.plan_round(t, clients, states)
    jobs = [(k, st, client_cost(pricer, plan, i, k, st)) for i, (k, st) in enumerate(states.items())]
    return states, plan, jobs


def client_cost(pricer: Pricer, plan: RoundPlan[ClientPlan], i: int, k: int, state: DeviceState
                ) -> ClientCost:
    """Client k's cost alone (the i-th of `plan`, drawn `state`): the walk accounting's by its scalar
    twin (`walk_cost`), any other's by a one-row call of its `price`."""
    model = pricer.model
    if model.walks:  # the walk accounting (edgefl.sim.cost.WalkCost)
        return walk_cost(cast(WalkCost, model), plan.workload(i), state)
    one = RoundPlan([plan.plan(i)], np.zeros(1, dtype=np.int64))
    return model.price(one, pricer.pool.gathered(np.array([k]), [state]), pricer.pool, pricer.samples).cost(0)


# The walk accounting client by client: floats through the formulas WalkCost.price takes as columns.

def walk_cost(model: WalkCost, w: Workload, state: DeviceState) -> ClientCost:
    """The walk accounting's cost of `w` on one client."""
    need = model.memory_need(w)
    traffic, evictions, micro = walk_traffic(w, state.memory_bytes, state.device)
    dev = state.device
    ops = traffic.read_ops + traffic.write_ops
    access = storage_seconds(traffic.read_bytes, traffic.write_bytes, ops, dev.storage_read_mb_s * 1e6,
                             dev.storage_write_mb_s * 1e6, dev.storage_latency_ms)
    down, up = network_seconds(w, state) if model.communication else (0.0, 0.0)
    return ClientCost(
        compute_s=walk_compute_seconds(w, state, micro),
        data_access_s=access, download_s=down, upload_s=up, mem_req_bytes=need,
        swapped=evictions > 0, read_bytes=traffic.read_bytes,
        write_bytes=traffic.write_bytes)


def walk_traffic(w: Workload, budget: float, device: DeviceProfile) -> tuple[Traffic, int, int]:
    """(traffic, evictions, micro-batches per batch) of the swap walk `device` runs fastest
    (`plan_seconds`). Every budget that holds the round's whole footprint gives the same walks
    (cached: fleets repeat budgets)."""
    walks = _walks(w, math.inf if footprint(w) <= budget else budget)
    micro, traffic, evictions = walks[cheapest(walks, plan_seconds(w, device))]
    return traffic, evictions, micro


@functools.lru_cache(maxsize=65536)
def _walks(w: Workload, budget: float) -> tuple[Walk, ...]:
    return traced_walks(w, budget)[0]


def network_seconds(w: Workload, state: DeviceState) -> tuple[float, float]:
    """(download, upload) seconds: bytes over the drawn bandwidth plus one latency each way."""
    return (transfer_seconds(w.download_bytes, state.down_bps, state.latency_s),
            transfer_seconds(w.upload_bytes, state.up_bps, state.latency_s))


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
