"""A round's clients drawn, planned, priced and played, as columns.

The round's clients are the selection policy's picks (edgefl.selection). Two paths give the same
table, to the bit (tests/test_bulk.py). `bulk_round` (the default) draws the round's clients as
arrays (DevicePool.states), plans them (Method.plan_round), prices them (edgefl.sim.bulk.Pricer) and
plays the round with one SimPy event (Federation.play). `each_round`, the reference, draws
(DevicePool.state), plans (Method.plan) and prices (the cost model's `cost`) client by client and
runs one SimPy process per client (Federation.run_round). The table's per-client rows (clients.csv)
and spans (events.csv: each client's phases back to back from the round's start, clients in order,
then each waiting client's wait until the straggler's upload ends) are rendered as columns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from edgefl.devices.pool import DevicePool, StateMap, States
from edgefl.methods.base import ClientPlan, Method, grouped
from edgefl.runlog import Columns
from edgefl.selection import Picked
from edgefl.sim.bulk import Costs, Pricer, RoundPlan
from edgefl.sim.engine import PHASES, Federation


@dataclass
class RoundTable:
    """One played round: its clients' states, workloads and costs, and when each finished."""

    round: int
    start_s: float
    end_s: float  # after the server's time
    server_s: float
    states: States
    plan: RoundPlan
    costs: Costs
    finish_s: np.ndarray
    wait_s: np.ndarray

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def straggler(self) -> int:
        """The row of the first client to finish last."""
        return int(np.argmax(self.finish_s))


def bulk_round(pool: DevicePool, method: Method, pricer: Pricer, fed: Federation, t: int,
               server_s: Callable[[], float], clients: np.ndarray) -> RoundTable:
    """Round t of `clients` (ascending) in bulk; `server_s()` is asked once every client is planned."""
    states = pool.states(clients, t)
    view = StateMap(pool, states)
    method.begin_round(t, view)
    plan = method.plan_round(t, states.clients, view)
    method.planned(t, by_client(plan, states.clients))
    costs, server = pricer.price(plan, states), server_s()
    start, finish, last = fed.play(costs.download_s, costs.data_access_s, costs.compute_s,
                                   costs.upload_s, server)
    return RoundTable(t, start, fed.now, server, states, plan, costs, finish, last - finish)


def each_round(pool: DevicePool, method: Method, pricer: Pricer, fed: Federation, t: int,
               server_s: Callable[[], float], clients: np.ndarray) -> RoundTable:
    """Round t of `clients` (ascending) client by client, with one SimPy process per client (the
    reference)."""
    states = {k: pool.state(k, t) for k in clients.tolist()}
    method.begin_round(t, states)
    plan = grouped([method.plan(t, k, st) for k, st in states.items()])
    method.planned(t, by_client(plan, clients))
    jobs = [(k, st, pricer.model.cost(pricer.counted(k, plan.workload(i)), st))
            for i, (k, st) in enumerate(states.items())]
    r = fed.run_round(t, jobs, server_s())
    return RoundTable(t, r.start_s, r.end_s, r.server_s, pool.gathered(clients, list(states.values())),
                      plan, Costs.of([c.cost for c in r.clients]), np.array([c.finish_s for c in r.clients]),
                      np.array([c.wait_s for c in r.clients]))


def by_client(plan: RoundPlan[ClientPlan], clients: np.ndarray) -> dict[int, ClientPlan]:
    """Each client's plan, by client id (`clients` in the plan's order)."""
    return {k: plan.plan(i) for i, k in enumerate(clients.tolist())}


def names(codes: np.ndarray, table: list[str]) -> pa.Array:
    """Text from codes into `table` (an Arrow string array)."""
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(table, pa.string())).cast(
        pa.string())


def client_columns(r: RoundTable, pool: DevicePool, real_compute_s: np.ndarray,
                   picked: Picked | None = None) -> Columns:
    """clients.csv's columns for the round (real_compute_s NaN where not measured), with why each
    client was picked (`utility`, `picked_by`) when `picked` is given."""
    s, c, n = r.states, r.costs, len(r.states.clients)
    why: Columns = {} if picked is None else {"utility": picked.utility,
                                              "picked_by": pa.array(picked.reason, pa.string())}
    return {"round": np.full(n, r.round), "client": s.clients,
            "device": names(s.kind, [d.name for d in pool.kinds]),
            "app": names(s.app, [a.name for a in pool.apps]),
            "network": names(s.network, pool.network_names), "flops": s.flops,
            "mem_avail_bytes": s.memory_bytes.astype(np.int64),
            "mem_req_bytes": c.mem_req_bytes.astype(np.int64), "swapped": c.swapped.astype(np.int64),
            "compute_s": c.compute_s, "data_access_s": c.data_access_s, "download_s": c.download_s,
            "upload_s": c.upload_s, "wait_s": r.wait_s, "finish_s": r.finish_s,
            "read_bytes": c.read_bytes.astype(np.int64), "write_bytes": c.write_bytes.astype(np.int64),
            "real_compute_s": real_compute_s, **why}


def event_columns(r: RoundTable) -> Columns:
    """events.csv's columns for the round: every client's four phases, then the waits."""
    c, n = r.costs, len(r.states.clients)
    starts, ends, start = [], [], np.full(n, r.start_s)
    for seconds in (c.download_s, c.data_access_s, c.compute_s, c.upload_s):
        starts.append(start)
        start = start + seconds
        ends.append(start)
    waiting = np.flatnonzero(r.wait_s > 0)
    last = np.full(len(waiting), r.finish_s[r.straggler])
    return {"round": np.full(4 * n + len(waiting), r.round),
            "client": np.concatenate([np.repeat(r.states.clients, 4), r.states.clients[waiting]]),
            "phase": names(np.concatenate([np.tile(np.arange(4), n), np.full(len(waiting), 4)]),
                           [*PHASES, "wait"]),
            "start_s": np.concatenate([np.stack(starts, axis=1).reshape(-1), r.finish_s[waiting]]),
            "end_s": np.concatenate([np.stack(ends, axis=1).reshape(-1), last])}


def metrics_row(r: RoundTable, loss: float | str, info: dict[str, Any]) -> dict[str, Any]:
    """metrics.csv's row: the straggler's breakdown (compute + data access + comm + server = the
    round's time), the mean wait and the clients that swapped."""
    i, c, n = r.straggler, r.costs, len(r.states.clients)
    return {"round": r.round, "sim_time_s": r.end_s, "round_time_s": r.duration_s,
            "compute_s": float(c.compute_s[i]), "data_access_s": float(c.data_access_s[i]),
            "comm_s": float(c.download_s[i] + c.upload_s[i]), "wait_s": sum(r.wait_s.tolist()) / n,
            "server_s": r.server_s, "clients": n, "swapped": int(c.swapped.sum()),
            "train_loss": loss, "clean_acc": "", "adv_acc": "", **info}
