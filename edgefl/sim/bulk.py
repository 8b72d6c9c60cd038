"""Pricing a round's clients in bulk: the cost model's ClientCosts for every client at once, as arrays.

The `walk` accounting (edgefl.sim.cost.WalkCost) is priced with NumPy: every figure is the same IEEE
operations on the same operands as `WalkCost.cost` takes client by client, so the columns equal the
per-client costs to the bit (tests/test_bulk.py). Its expensive part, the swap walk (edgefl.sim.swap),
depends on a client's available memory only through comparisons a larger budget passes more easily,
so the budgets that walk alike form intervals (`traced_walks`' trail tells them apart). `WalkIndex`
keeps the budgets it walked, in order, with their trails: a budget between two walked ones whose
trails are equal walks as they do, and is looked up (np.searchsorted) instead of walked; the others
are resolved by bisection, walking the middle budget of each undecided run. A fleet thus walks
a few hundred budgets per workload over a whole run instead of one per swapping client-round. The
plan each device kind runs is chosen once per (trail, kind), as `WalkCost` chooses it. Other
accountings are priced client by client.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Generic, Protocol, TypeVar

import numpy as np

from edgefl.devices.pool import DevicePool, States
from edgefl.sim.cost import (
    ClientCost,
    CostModel,
    WalkCost,
    full_speed_seconds,
    plan_seconds,
    profile_rooflines,
    shared_seconds,
    storage_seconds,
    transfer_seconds,
)
from edgefl.sim.swap import Trail, Walk, cheapest, footprint, traced_walks
from edgefl.sim.workload import Workload


class Planned(Protocol):
    """What a method's plan for one client holds for the cost model (edgefl.methods.base.ClientPlan)."""

    @property
    def workload(self) -> Workload: ...


P = TypeVar("P", bound=Planned)


@dataclass(frozen=True)
class RoundPlan(Generic[P]):
    """A round's plans: client i (of the round's States) runs `plans[which[i]]`, the distinct ones."""

    plans: list[P]
    which: np.ndarray  # int64 per client

    def plan(self, i: int) -> P:
        return self.plans[int(self.which[i])]

    def workload(self, i: int) -> Workload:
        return self.plan(i).workload

    def by_client(self, clients: np.ndarray) -> dict[int, P]:
        """Each client's plan, by client id (`clients` in the plan's order)."""
        return {k: self.plan(i) for i, k in enumerate(clients.tolist())}

    @property
    def workloads(self) -> list[Workload]:
        return [p.workload for p in self.plans]


@dataclass(frozen=True)
class Costs:
    """A round's ClientCosts as columns (row i is the round's i-th client)."""

    compute_s: np.ndarray
    data_access_s: np.ndarray
    download_s: np.ndarray
    upload_s: np.ndarray
    mem_req_bytes: np.ndarray
    swapped: np.ndarray  # bool
    read_bytes: np.ndarray
    write_bytes: np.ndarray

    @classmethod
    def of(cls, costs: Sequence[ClientCost]) -> Costs:
        """Columns of per-client costs."""
        return cls(**{f.name: np.array([getattr(c, f.name) for c in costs], dtype=bool if
                                       f.name == "swapped" else np.float64) for f in fields(cls)})

    @property
    def busy_s(self) -> np.ndarray:
        """Each client's priced work, download to upload (no waiting)."""
        return self.download_s + self.data_access_s + self.compute_s + self.upload_s

    def cost(self, i: int) -> ClientCost:
        """Row i as a ClientCost."""
        return ClientCost(**{f.name: getattr(self, f.name)[i].item() for f in fields(self)})


class WalkIndex:
    """The swap walks of one workload, by budget: the budgets walked (ascending) and the id of each
    one's trail; budgets between two walked ones with the same trail walk as they do."""

    def __init__(self, w: Workload) -> None:
        self.w = w
        self.points = np.empty(0)
        self.path = np.empty(0, dtype=np.int64)
        self.trails: dict[Trail, int] = {}
        self.results: list[tuple[Walk, ...]] = []  # per trail id: the walk of every plan that fits

    def walk(self, budget: float) -> int:
        """Walk one budget; its trail's id."""
        walks, trail = traced_walks(self.w, budget)
        if trail not in self.trails:
            self.trails[trail] = len(self.results)
            self.results.append(walks)
        return self.trails[trail]

    def lookup(self, budgets: np.ndarray) -> np.ndarray:
        """The trail id of each budget, walking only those the budgets walked before do not decide."""
        if not len(budgets):
            return np.empty(0, dtype=np.int64)
        unique, inverse = np.unique(budgets, return_inverse=True)
        ids = self._known(unique)
        walked = self._bisect(unique, ids)
        if walked:
            points = np.concatenate([self.points, unique[walked]])
            order = np.argsort(points, kind="stable")
            self.points, self.path = points[order], np.concatenate([self.path, ids[walked]])[order]
        return ids[inverse]

    def _known(self, budgets: np.ndarray) -> np.ndarray:
        """Trail ids the walked budgets decide (a budget walked, or between two of one trail); -1 else."""
        ids = np.full(len(budgets), -1, dtype=np.int64)
        n = len(self.points)
        if not n:
            return ids
        at = np.searchsorted(self.points, budgets)
        hi = np.minimum(at, n - 1)
        lo = np.maximum(at - 1, 0)
        exact = (at < n) & (self.points[hi] == budgets)
        between = (at > 0) & (at < n) & (self.path[lo] == self.path[hi])
        ids[between] = self.path[lo[between]]
        ids[exact] = self.path[hi[exact]]
        return ids

    def _bisect(self, budgets: np.ndarray, ids: np.ndarray) -> list[int]:
        """Fill every -1 of `ids` (budgets ascending): a run whose ends share a trail shares it
        throughout; otherwise its middle budget is walked and both halves are looked at. The
        positions walked."""
        walked: list[int] = []

        def known(j: int) -> int:
            if ids[j] < 0:
                ids[j] = self.walk(float(budgets[j]))
                walked.append(j)
            return int(ids[j])

        runs = [(0, len(budgets) - 1)]
        while runs:
            a, b = runs.pop()
            if known(a) == known(b):
                ids[a:b + 1] = ids[a]
            elif (ids[a + 1:b] < 0).any():
                m = (a + b) // 2
                known(m)
                runs += [(a, m), (m, b)]
        return walked


def walk_key(w: Workload) -> Workload:
    """The fields of a workload the swap walk reads (not what is sent, nor one-off FLOPs)."""
    return replace(w, download_bytes=0.0, upload_bytes=0.0, extra_flops=0.0, samples=0)


class Pricer:
    """Prices a round: the walk accounting in bulk, any other client by client. `counted(client,
    workload)` is the workload the cost model charges (the paper accounting's sample count)."""

    def __init__(self, model: CostModel, pool: DevicePool,
                 counted: Callable[[int, Workload], Workload]) -> None:
        self.model, self.pool, self.counted = model, pool, counted
        self.walks: dict[Workload, WalkIndex] = {}
        kinds = pool.kinds
        self.read_bw = np.array([d.storage_read_mb_s * 1e6 for d in kinds])
        self.write_bw = np.array([d.storage_write_mb_s * 1e6 for d in kinds])
        self.latency_ms = np.array([d.storage_latency_ms for d in kinds])

    def price(self, plan: RoundPlan[P], states: States) -> Costs:
        if not isinstance(self.model, WalkCost):
            return Costs.of([self.model.cost(self.counted(int(k), plan.workload(i)),
                                             self.pool.state_at(states, i))
                             for i, k in enumerate(states.clients)])
        n = len(states.clients)
        columns = {f.name: np.empty(n, dtype=bool if f.name == "swapped" else np.float64)
                   for f in fields(Costs)}
        for g, w in enumerate(plan.workloads):
            rows = np.flatnonzero(plan.which == g)
            for name, values in self._walk_costs(w, rows, states, self.model.communication).items():
                columns[name][rows] = values
        return Costs(**columns)

    def _walk_costs(self, w: Workload, rows: np.ndarray, s: States,
                    communication: bool) -> dict[str, np.ndarray]:
        """WalkCost.cost of workload `w` for the clients at `rows`, as columns."""
        key = walk_key(w)
        index = self.walks.setdefault(key, WalkIndex(key))
        budgets = s.memory_bytes[rows]  # as walk_traffic: the whole footprint walks as at infinity
        ids = index.lookup(np.where(footprint(w) <= budgets, math.inf, budgets))
        kind = s.kind[rows]
        pairs, inverse = np.unique(ids * len(self.pool.kinds) + kind, return_inverse=True)
        walks = [index.results[i] for i in pairs // len(self.pool.kinds)]
        chosen = [found[cheapest(found, plan_seconds(w, self.pool.kinds[k]))]
                  for found, k in zip(walks, pairs % len(self.pool.kinds), strict=True)]
        read = np.array([c[1].read_bytes for c in chosen])[inverse]
        write = np.array([c[1].write_bytes for c in chosen])[inverse]
        ops = np.array([c[1].read_ops + c[1].write_ops for c in chosen])[inverse]
        micro = np.array([c[0] for c in chosen])[inverse]
        access = storage_seconds(read, write, ops, self.read_bw[kind], self.write_bw[kind],
                                 self.latency_ms[kind])
        if communication:
            down = transfer_seconds(w.download_bytes, s.down_bps[rows], s.latency_s[rows])
            up = transfer_seconds(w.upload_bytes, s.up_bps[rows], s.latency_s[rows])
        else:
            down = up = np.zeros(len(rows))
        compute = shared_seconds(self._compute(w, kind, micro), s.flops[rows], self.pool.kind_flops[kind])
        return {"compute_s": compute, "data_access_s": access, "download_s": down, "upload_s": up,
                "mem_req_bytes": np.full(len(rows), self.model.memory_need(w)),
                "swapped": np.array([c[2] > 0 for c in chosen])[inverse],
                "read_bytes": read, "write_bytes": write}

    def _compute(self, w: Workload, kind: np.ndarray, micro: np.ndarray) -> np.ndarray:
        """Full-speed compute seconds per client, one roofline sum per (device kind, micro)."""
        base = w.batch + 1  # micro-batches divide the batch
        pairs, inverse = np.unique(kind * base + micro, return_inverse=True)
        full = [full_speed_seconds(w, profile_rooflines(self.pool.kinds[k]), int(m))
                for k, m in zip(*divmod(pairs, base), strict=True)]
        return np.array(full)[inverse]
