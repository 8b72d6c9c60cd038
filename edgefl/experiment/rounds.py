"""A round's clients drawn, planned, priced and played, as columns.

The round's clients are the selection policy's picks (edgefl.selection). `bulk_round` draws them as
arrays (DevicePool.states), plans them (Method.plan_round), prices them (edgefl.sim.bulk.Pricer) and
plays the round with one SimPy event (Federation.play); one client is a one-row call. The reference
that draws, plans and prices client by client and plays one SimPy process per client is in the
tests (tests/reference.py), which prove the columns equal to it to the bit. The table's per-client
rows (clients.csv)
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
from edgefl.experiment.round_energy import RoundEnergy
from edgefl.methods.base import ClientPlan, Method
from edgefl.runlog import Columns
from edgefl.selection import Picked
from edgefl.sim.bulk import Costs, Pricer, RoundPlan
from edgefl.sim.clients import COMPLETED, STATUSES
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
    status: np.ndarray | None = None  # a living fleet (edgefl.experiment.living): codes into STATUSES
    staleness: np.ndarray | None = None  # async rounds: each client's staleness
    begin_s: np.ndarray | None = None  # async rounds: when each client started (else the round's start)
    dropped: np.ndarray | None = None  # bool: clients whose battery could not cover the round
    energy_j: np.ndarray | None = None  # joules per client (None: energy not priced)
    charge_j: np.ndarray | None = None  # battery left after the round, J (None: not tracked)
    picked: Picked | None = None  # why each client was picked, row by row, where the round says it

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    def seen_s(self) -> np.ndarray:
        """Each client's duration as the selection policy learns it (`seen_duration`)."""
        ran = self.finish_s - (self.start_s if self.begin_s is None else self.begin_s)
        return ran if self.status is None else seen_duration(ran, self.status, self.costs)

    @property
    def straggler(self) -> int:
        """The row of the first client to finish last (of those that completed, on a living fleet
        where any did)."""
        done = self.finish_s if self.status is None or not (self.status == COMPLETED).any() else np.where(
            self.status == COMPLETED, self.finish_s, -np.inf)
        return int(np.argmax(done))


def seen_duration(ran: np.ndarray, status: np.ndarray, costs: Costs) -> np.ndarray:
    """Download to upload where a client completed; where it stopped early (late, dropped, offline),
    the longer of what it ran and its priced work (a transfer cut on the shared links counts what it
    took), so that a straggler cut at a deadline still shows the selection (Oort's t_i) how slow it is."""
    return np.where(status == COMPLETED, ran, np.maximum(ran, costs.busy_s))


def bulk_round(pool: DevicePool, method: Method, pricer: Pricer, fed: Federation, t: int,
               server_s: Callable[[], float], clients: np.ndarray,
               energy: RoundEnergy | None = None) -> RoundTable:
    """Round t of `clients` (ascending) in bulk; `server_s()` is asked once every client is planned.
    `energy` shares the server's links and prices joules."""
    states, plan, costs = priced(pool, method, pricer, t, clients)
    server = server_s()
    costs = energy.shared(states, plan, costs) if energy else costs
    start, finish, last = fed.play(costs.download_s, costs.data_access_s, costs.compute_s,
                                   costs.upload_s, server)
    r = RoundTable(t, start, fed.now, server, states, plan, costs, finish, last - finish)
    r.energy_j = energy.bulk(states, plan, costs, r.wait_s) if energy else None
    return r


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
            "real_compute_s": real_compute_s, **why, **living_columns(r), **energy_columns(r)}


def living_columns(r: RoundTable) -> Columns:
    """A living fleet's extra clients.csv columns: `status`, and `staleness` in async rounds."""
    out: Columns = {} if r.status is None else {"status": names(r.status, list(STATUSES))}
    if r.staleness is not None:
        out["staleness"] = r.staleness.astype(np.int64)
    return out


def energy_columns(r: RoundTable) -> Columns:
    """clients.csv's energy columns: energy_j where energy is priced, battery_j (charge left, inf on
    mains) and battery_dropped where batteries are tracked (edgefl.experiment.rows.energy_headers)."""
    cols: Columns = {} if r.energy_j is None else {"energy_j": r.energy_j}
    if r.charge_j is not None and r.dropped is not None:
        cols |= {"battery_j": r.charge_j, "battery_dropped": r.dropped.astype(np.int64)}
    return cols


def event_columns(r: RoundTable) -> Columns:
    """events.csv's columns for the round: every client's four phases, then the waits."""
    c, n = r.costs, len(r.states.clients)
    starts, ends, start = [], [], np.full(n, r.start_s) if r.begin_s is None else r.begin_s
    for seconds in (c.download_s, c.data_access_s, c.compute_s, c.upload_s):
        starts.append(start)
        start = start + seconds
        ends.append(start)
    if r.status is not None:
        return stopped_events(r, starts, ends)
    waiting = np.flatnonzero(r.wait_s > 0)
    last = np.full(len(waiting), r.finish_s[r.straggler])
    return {"round": np.full(4 * n + len(waiting), r.round),
            "client": np.concatenate([np.repeat(r.states.clients, 4), r.states.clients[waiting]]),
            "phase": names(np.concatenate([np.tile(np.arange(4), n), np.full(len(waiting), 4)]),
                           [*PHASES, "wait"]),
            "start_s": np.concatenate([np.stack(starts, axis=1).reshape(-1), r.finish_s[waiting]]),
            "end_s": np.concatenate([np.stack(ends, axis=1).reshape(-1), last])}


def stopped_events(r: RoundTable, starts: list[np.ndarray], ends: list[np.ndarray]) -> Columns:
    """A living fleet's events: each client's phases cut where it stopped (none for a phase a stopped
    client never entered), a zero-length span named after the status of a client stopped early
    (offline, late, dropped) where it stopped, and each completed client's wait until the round
    closed."""
    assert r.status is not None
    n, stop = len(r.states.clients), r.finish_s
    began = (r.status == COMPLETED)[:, None] | (np.stack(starts, axis=1) < stop[:, None])  # (client, phase)
    rows = began.reshape(-1)
    cut_s = [np.stack([np.minimum(x, stop) for x in xs], axis=1).reshape(-1)[rows] for xs in (starts, ends)]
    early = np.flatnonzero(r.status != COMPLETED)
    waiting = np.flatnonzero((r.wait_s > 0) & (r.status == COMPLETED))
    close = stop + r.wait_s
    tail = np.concatenate([early, waiting])
    return {"round": np.full(int(rows.sum()) + len(tail), r.round),
            "client": np.concatenate([np.repeat(r.states.clients, 4)[rows], r.states.clients[tail]]),
            "phase": names(np.concatenate([np.tile(np.arange(4), n)[rows], 5 + r.status[early],
                                           np.full(len(waiting), 4)]), [*PHASES, "wait", *STATUSES]),
            "start_s": np.concatenate([cut_s[0], stop[tail]]),
            "end_s": np.concatenate([cut_s[1], close[tail]])}


def metrics_row(r: RoundTable, loss: float | str, info: dict[str, Any]) -> dict[str, Any]:
    """metrics.csv's row: the straggler's breakdown (compute + data access + comm + server = the
    round's time), the mean wait and the clients that swapped."""
    c, n = r.costs, len(r.states.clients)
    down, data, compute, up = straggler_phases(r)
    return {"round": r.round, "sim_time_s": r.end_s, "round_time_s": r.duration_s,
            "compute_s": compute, "data_access_s": data, "comm_s": down + up,
            "wait_s": sum(r.wait_s.tolist()) / n,
            "server_s": r.server_s, "clients": n, "swapped": int(c.swapped.sum()),
            "train_loss": loss, "clean_acc": "", "adv_acc": "", **status_counts(r), **info,
            **energy_totals(r)}


def straggler_phases(r: RoundTable) -> list[float]:
    """The straggler's download, data access, compute and upload seconds; cut where it stopped when
    it did not complete (a living round none of whose clients completed: its whole plan would
    outlast the round)."""
    i, c = r.straggler, r.costs
    phases = [float(x[i]) for x in (c.download_s, c.data_access_s, c.compute_s, c.upload_s)]
    if r.status is None or r.status[i] == COMPLETED:
        return phases
    left = float(r.finish_s[i]) - (r.start_s if r.begin_s is None else float(r.begin_s[i]))
    cut = []
    for seconds in phases:
        cut.append(min(seconds, max(left, 0.0)))
        left -= cut[-1]
    return cut


def status_counts(r: RoundTable) -> dict[str, int]:
    """A living fleet's per-round count of each status (metrics.csv's `completed`, ... columns)."""
    if r.status is None:
        return {}
    return {name: int((r.status == i).sum()) for i, name in enumerate(STATUSES)}


def energy_totals(r: RoundTable) -> dict[str, Any]:
    """metrics.csv's energy columns: the round's joules over all its clients, the clients dropped."""
    row: dict[str, Any] = {} if r.energy_j is None else {"energy_j": float(r.energy_j.sum())}
    if r.charge_j is not None and r.dropped is not None:
        row["battery_dropped"] = int(r.dropped.sum())
    return row
