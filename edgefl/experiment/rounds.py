"""A round's clients drawn, planned, priced and played, as columns.

The round's clients are the selection policy's picks (edgefl.selection). `bulk_round` draws them as
arrays (DevicePool.states), plans them (Method.plan_round), prices them (edgefl.sim.bulk.Pricer) and
plays the round with one SimPy event (Federation.play); one client is a one-row call. The reference
that draws, plans and prices client by client and plays one SimPy process per client is in the
tests (tests/reference.py), which prove the columns equal to it to the bit.

A played round is a `RoundTable`, the same in every round mode (edgefl.experiment.players): a plain
fleet's, a living fleet's (edgefl.experiment.living) and an async aggregation's
(edgefl.experiment.async_rounds). Its per-client rows (clients.csv, with the columns the scenario
has: edgefl.experiment.rows) and spans (events.csv: each client's phases back to back from its
start, cut where it stopped, clients in order; then each early stop's status, and each waiting
client's wait until the round closed) are rendered as columns.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from edgefl.devices.pool import DevicePool, StateMap, States
from edgefl.experiment.round_energy import RoundEnergy
from edgefl.methods.base import ClientPlan, Method
from edgefl.runlog import Columns
from edgefl.selection import Picked
from edgefl.sim.bulk import Pricer
from edgefl.sim.clients import COMPLETED, STATUSES
from edgefl.sim.cost import Costs, RoundPlan
from edgefl.sim.engine import PHASES, Federation


@dataclass
class RoundTable:
    """One played round (in async mode, one aggregation's window): its clients' states, workloads
    and costs, when each began and stopped, how it ended, and what its work cost a battery. Every
    mode fills every field: a plain fleet's clients all complete, at once, on mains power."""

    round: int
    start_s: float
    close_s: float  # when the round closed, before the server's time (its waits end there)
    end_s: float  # after the server's time
    server_s: float
    states: States
    plan: RoundPlan
    costs: Costs
    begin_s: np.ndarray  # when each client started (the round's start but in async mode)
    finish_s: np.ndarray  # when each stopped: its upload's end, or where it was stopped
    wait_s: np.ndarray
    status: np.ndarray  # codes into STATUSES
    staleness: np.ndarray  # int: aggregations since each client's download (async mode; else 0)
    dropped: np.ndarray  # bool: clients whose battery could not cover the round
    energy_j: np.ndarray  # joules per client (NaN: energy not priced)
    charge_j: np.ndarray  # battery left after the round, J (inf: mains powered, or not tracked)
    picked: Picked  # why each client was picked

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def seen_s(self) -> np.ndarray:
        """Each client's duration as the selection policy learns it (`seen_duration`)."""
        return seen_duration(self.finish_s - self.begin_s, self.status, self.costs)

    @property
    def straggler(self) -> int:
        """The row of the first client to finish last of those that completed (where none did, of
        all)."""
        done = self.status == COMPLETED
        return int(np.argmax(np.where(done, self.finish_s, -np.inf) if done.any() else self.finish_s))


def seen_duration(ran: np.ndarray, status: np.ndarray, costs: Costs) -> np.ndarray:
    """Download to upload where a client completed; where it stopped early (late, dropped, offline),
    the longer of what it ran and its priced work (a transfer cut on the shared links counts what it
    took), so that a straggler cut at a deadline still shows the selection (Oort's t_i) how slow it is."""
    return np.where(status == COMPLETED, ran, np.maximum(ran, costs.busy_s))


def bulk_round(pool: DevicePool, method: Method, pricer: Pricer, fed: Federation, t: int,
               server_s: Callable[[], float], picked: Picked, energy: RoundEnergy) -> RoundTable:
    """Round t of the `picked` clients (ascending) in bulk; `server_s()` is asked once every client is
    planned. `energy` shares the server's links and prices joules."""
    states, plan, costs = priced(pool, method, pricer, t, picked.clients)
    server = server_s()
    costs = energy.shared(states, plan, costs)
    start, finish, last = fed.play(costs.download_s, costs.data_access_s, costs.compute_s,
                                   costs.upload_s, server)
    n, wait = len(finish), last - finish
    return RoundTable(t, start, last, fed.now, server, states, plan, costs, np.full(n, start), finish, wait,
                      np.full(n, COMPLETED), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool),
                      energy.bulk(states, plan, costs, wait), energy.charge(states), picked)


def priced(pool: DevicePool, method: Method, pricer: Pricer, t: int, clients: np.ndarray
           ) -> tuple[States, RoundPlan[ClientPlan], Costs]:
    """Round t's `clients` (ascending) drawn, planned and priced in bulk."""
    states = pool.states(clients, t)
    view = StateMap(pool, states)
    plan = method.plan_round(t, states.clients, view)
    return states, plan, pricer.price(plan, states)


def names(codes: np.ndarray, table: list[str]) -> pa.Array:
    """Text from codes into `table` (an Arrow string array)."""
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), pa.array(table, pa.string())).cast(
        pa.string())


def client_columns(r: RoundTable, pool: DevicePool, real_compute_s: np.ndarray, wanted: Collection[str]
                   ) -> Columns:
    """clients.csv's columns for the round (real_compute_s NaN where not measured): the fixed ones,
    and those of the `wanted` ones that a scenario's selection, living fleet or energy adds
    (edgefl.experiment.rows)."""
    s, c, n = r.states, r.costs, len(r.states.clients)
    extra = {"utility": lambda: r.picked.utility, "picked_by": lambda: pa.array(r.picked.reason, pa.string()),
             "status": lambda: names(r.status, list(STATUSES)), "staleness": lambda: r.staleness,
             "energy_j": lambda: r.energy_j, "battery_j": lambda: r.charge_j,
             "battery_dropped": lambda: r.dropped.astype(np.int64)}
    return {"round": np.full(n, r.round), "client": s.clients,
            "device": names(s.kind, [d.name for d in pool.kinds]),
            "app": names(s.app, [a.name for a in pool.apps]),
            "network": names(s.network, pool.network_names), "flops": s.flops,
            "mem_avail_bytes": s.memory_bytes.astype(np.int64),
            "mem_req_bytes": c.mem_req_bytes.astype(np.int64), "swapped": c.swapped.astype(np.int64),
            "compute_s": c.compute_s, "data_access_s": c.data_access_s, "download_s": c.download_s,
            "upload_s": c.upload_s, "wait_s": r.wait_s, "finish_s": r.finish_s,
            "read_bytes": c.read_bytes.astype(np.int64), "write_bytes": c.write_bytes.astype(np.int64),
            "real_compute_s": real_compute_s, **{k: make() for k, make in extra.items() if k in wanted}}


def event_columns(r: RoundTable) -> Columns:
    """events.csv's columns for the round: each client's phases back to back from its start, cut
    where it stopped (none for a phase a stopped client never entered), a zero-length span named
    after the status of a client stopped early (offline, late, dropped) where it stopped, and each
    completed client's wait until the round closed."""
    c, n, stop = r.costs, len(r.states.clients), r.finish_s
    starts, ends, start = [], [], r.begin_s
    for seconds in (c.download_s, c.data_access_s, c.compute_s, c.upload_s):
        starts.append(start)
        start = start + seconds
        ends.append(start)
    done = r.status == COMPLETED
    early = np.flatnonzero(~done)
    rows: slice | np.ndarray = slice(None)  # the (client, phase) spans entered: all, where all completed
    if len(early):
        rows = (done[:, None] | (np.stack(starts, axis=1) < stop[:, None])).reshape(-1)
    starts, ends = [np.minimum(x, stop) for x in starts], [np.minimum(x, stop) for x in ends]
    waiting = np.flatnonzero((r.wait_s > 0) & done)
    tail = np.concatenate([early, waiting])
    entered = 4 * n if isinstance(rows, slice) else int(rows.sum())
    return {"round": np.full(entered + len(tail), r.round),
            "client": np.concatenate([np.repeat(r.states.clients, 4)[rows], r.states.clients[tail]]),
            "phase": names(np.concatenate([np.tile(np.arange(4), n)[rows], 5 + r.status[early],
                                           np.full(len(waiting), 4)]), [*PHASES, "wait", *STATUSES]),
            "start_s": np.concatenate([np.stack(starts, axis=1).reshape(-1)[rows], stop[tail]]),
            "end_s": np.concatenate([np.stack(ends, axis=1).reshape(-1)[rows], stop[early],
                                     np.full(len(waiting), r.close_s)])}


def metrics_row(r: RoundTable, loss: float | str, info: dict[str, Any]) -> dict[str, Any]:
    """metrics.csv's row: the straggler's breakdown (compute + data access + comm + server = the
    round's time), the mean wait, the clients that swapped, the count of each status (a living
    fleet's columns), the round's joules over all its clients and the clients dropped for their
    battery (energy's columns; edgefl.experiment.rows)."""
    c, n = r.costs, len(r.states.clients)
    down, data, compute, up = straggler_phases(r)
    return {"round": r.round, "sim_time_s": r.end_s, "round_time_s": r.duration_s,
            "compute_s": compute, "data_access_s": data, "comm_s": down + up,
            "wait_s": sum(r.wait_s.tolist()) / n,
            "server_s": r.server_s, "clients": n, "swapped": int(c.swapped.sum()),
            "train_loss": loss, "clean_acc": "", "adv_acc": "", **info,
            **{name: int((r.status == i).sum()) for i, name in enumerate(STATUSES)},
            "energy_j": float(r.energy_j.sum()), "battery_dropped": int(r.dropped.sum())}


def straggler_phases(r: RoundTable) -> list[float]:
    """The straggler's download, data access, compute and upload seconds; cut where it stopped when
    it did not complete (a living round none of whose clients completed: its whole plan would
    outlast the round)."""
    i, c = r.straggler, r.costs
    phases = [float(x[i]) for x in (c.download_s, c.data_access_s, c.compute_s, c.upload_s)]
    if r.status[i] == COMPLETED:
        return phases
    left = float(r.finish_s[i]) - float(r.begin_s[i])
    cut = []
    for seconds in phases:
        cut.append(min(seconds, max(left, 0.0)))
        left -= cut[-1]
    return cut
