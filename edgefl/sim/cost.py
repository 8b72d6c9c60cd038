"""The cost model: a Workload on a DeviceState becomes compute, data-access and network seconds.

Two accountings share one interface:

* `walk` (default): compute from the per-layer roofline model (edgefl.sim.compute: per layer kind
  and pass, max(FLOPs / sustained FLOP/s, bytes / bandwidth) + per-operator overhead, over the
  share of the device the co-running app leaves); data access from the swap walk
  (edgefl.sim.swap) within the available memory R_k(t), or just the batch reads and one parameter
  read when MemReq fits; communication from the bytes really sent over the drawn network.
* `paper`: the FedProphet release's formulas (Tang et al., FedProphet, §7 and its code), kept to
  check the paper's published times: compute 2 x MACs x (1 + T) / perf per batch; when the release's
  MemReq exceeds memory, 4 x (2F + 4P + 2(s-2)P) bytes over the effective bandwidth plus
  0.17 s per storage access; no communication.

One interface prices every accounting: `CostModel.price(plan, states, pool, samples)` takes a
round's plans (`RoundPlan`), its clients' drawn states (`States` columns), the fleet's `DevicePool`
and each client's training-set size, and returns the round's `Costs` columns. The walk accounting
prices in bulk, with NumPy (`WalkCost.price`: every figure the same IEEE operations on the same
operands for every client, its swap walks cached per workload on the model in `WalkIndex`es); the
paper accounting client by client. No caller asks which accounting it holds.

The choice is made once, here: whoever needs a memory requirement, a module's MemReq, the round's
batches, a budget check or a round's prices asks the scenario's cost model (`make_cost_model`),
never the accounting.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from edgefl.config import CostConfig
from edgefl.devices.classes import perf_flops
from edgefl.devices.pool import DevicePool, DeviceState, States
from edgefl.devices.profile import DeviceProfile
from edgefl.sim.classes import device_rooflines
from edgefl.sim.compute import Rooflines, iteration_of, round_seconds
from edgefl.sim.records import BYTES, AtomProfile, mem_req, paper_mem_req, paper_scale
from edgefl.sim.swap import PlanSeconds, Traffic, Trail, Walk, cheapest, footprint, min_budget, traced_walks
from edgefl.sim.workload import Workload, train_pass_flops


@dataclass(frozen=True, slots=True)
class ClientCost:
    compute_s: float
    data_access_s: float
    download_s: float
    upload_s: float
    mem_req_bytes: float
    swapped: bool
    read_bytes: float = 0.0
    write_bytes: float = 0.0


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


class CostModel(Protocol):
    """An accounting: what a round costs, and the memory figures methods plan with."""

    walks: bool  # the swap walk pages what does not fit (edgefl's accounting; False: the release's)

    def price(self, plan: RoundPlan[P], states: States, pool: DevicePool,
              samples: Callable[[int], int]) -> Costs:
        """The round's costs: client i (row i of `states`, a client of `pool`) runs
        `plan.workload(i)`; `samples(client)` is a client's training-set size, asked only by an
        accounting that charges it."""
        ...

    def memory_need(self, w: Workload) -> float:
        """MemReq of a workload, in the estimator this accounting charges."""
        ...

    def module_need(self, atoms: Sequence[AtomProfile], head: AtomProfile | None, batch: int,
                    slots: int, classes: int) -> float:
        """MemReq of training a run of atoms with an optional auxiliary head (FedProphet, Alg. 1)."""
        ...

    def counted(self, w: Workload, samples: Callable[[], int]) -> Workload:
        """The workload as this accounting prices it, given the client's training-set size."""
        ...

    def min_budget(self, w: Workload) -> tuple[float, str]:
        """The smallest memory the workload runs in at all, and the piece that sets it."""
        ...


# The walk accounting's formulas, for a round's clients (NumPy columns, `WalkCost.price`) or one
# client (floats: tests/reference.py's `walk_cost`, which proves the columns right to the bit).

def transfer_seconds(nbytes: Any, bps: Any, latency_s: Any) -> Any:
    """Bytes over a link's bandwidth plus its latency."""
    return nbytes / bps + latency_s


def storage_seconds(read_bytes: Any, write_bytes: Any, ops: Any, read_bps: Any, write_bps: Any,
                    latency_ms: Any) -> Any:
    """Storage traffic: bytes over each direction's bandwidth plus one latency per access."""
    return read_bytes / read_bps + write_bytes / write_bps + ops * latency_ms / 1e3


def shared_seconds(full_speed_s: Any, flops: Any, peak_flops: Any) -> Any:
    """Full-speed seconds on the share `flops / peak_flops` of a device a co-running app leaves."""
    return full_speed_s / (flops / peak_flops)


def plan_seconds(w: Workload, device: DeviceProfile) -> PlanSeconds:
    """What a plan's walk costs `device` at full speed: its storage traffic and its compute in the
    plan's micro-batches. A runtime picks its schedule for its device, not for the share a
    co-running app leaves it at one moment (which scales every plan's compute alike)."""
    roof = profile_rooflines(device)
    read_bps, write_bps = device.storage_read_mb_s * 1e6, device.storage_write_mb_s * 1e6

    def seconds(micro: int, t: Traffic) -> float:
        return (storage_seconds(t.read_bytes, t.write_bytes, t.read_ops + t.write_ops, read_bps, write_bps,
                                device.storage_latency_ms) + full_speed_seconds(w, roof, micro))
    return seconds


class WalkIndex:
    """The swap walks of one workload, by budget: the budgets walked (ascending) and the id of each
    one's trail (`traced_walks`' trail tells apart the budgets that walk differently). A budget
    between two walked ones with the same trail walks as they do, and is looked up
    (np.searchsorted) instead of walked; the others are resolved by bisection, walking the middle
    budget of each undecided run."""

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


class WalkCost:
    """edgefl's default accounting, priced in bulk (NumPy columns). Its expensive part, the swap
    walk (edgefl.sim.swap), depends on a client's available memory only through comparisons a larger
    budget passes more easily, so the budgets that walk alike form intervals: each workload's
    `WalkIndex` (kept on the model, for the whole run) looks most budgets up instead of walking
    them, and a fleet walks a few hundred budgets per workload over a run instead of one per
    swapping client-round. The plan each device kind runs is chosen once per (trail, kind), the
    cheapest at full speed (`plan_seconds`)."""

    walks = True

    def __init__(self, cfg: CostConfig) -> None:
        self.communication = cfg.communication
        self.indexes: dict[Workload, WalkIndex] = {}  # the swap walks, per workload (walk_key)

    def memory_need(self, w: Workload) -> float:
        return mem_req(w.atoms, w.batch, w.slots, adversarial=w.attack_steps > 0)

    def module_need(self, atoms: Sequence[AtomProfile], head: AtomProfile | None, batch: int,
                    slots: int, classes: int) -> float:
        return mem_req([*atoms, *([head] if head else [])], batch, slots)

    def counted(self, w: Workload, samples: Callable[[], int]) -> Workload:
        """As it is: every batch is full (fleets may outnumber the samples of a dry run's
        shapes-only data, so the walk does not ask)."""
        return w

    def min_budget(self, w: Workload) -> tuple[float, str]:
        """The largest step of the finest paging schedule (edgefl.sim.swap.min_budget)."""
        return min_budget(w)

    def price(self, plan: RoundPlan[P], states: States, pool: DevicePool,
              samples: Callable[[int], int]) -> Costs:
        """In bulk: each distinct workload's clients as NumPy columns (`samples` is not asked)."""
        n = len(states.clients)
        columns = {f.name: np.empty(n, dtype=bool if f.name == "swapped" else np.float64)
                   for f in fields(Costs)}
        for g, w in enumerate(plan.workloads):
            rows = np.flatnonzero(plan.which == g)
            for name, values in self._columns(w, rows, states, pool).items():
                columns[name][rows] = values
        return Costs(**columns)

    def _columns(self, w: Workload, rows: np.ndarray, s: States, pool: DevicePool) -> dict[str, np.ndarray]:
        """The costs of workload `w` for the clients at `rows`, as columns."""
        key = walk_key(w)
        index = self.indexes.get(key) or self.indexes.setdefault(key, WalkIndex(key))
        budgets = s.memory_bytes[rows]  # the whole footprint walks as at infinity
        ids = index.lookup(np.where(footprint(w) <= budgets, math.inf, budgets))
        kind = s.kind[rows]
        pairs, inverse = np.unique(ids * len(pool.kinds) + kind, return_inverse=True)
        walks = [index.results[i] for i in pairs // len(pool.kinds)]
        chosen = [found[cheapest(found, plan_seconds(w, pool.kinds[k]))]
                  for found, k in zip(walks, pairs % len(pool.kinds), strict=True)]
        read = np.array([c[1].read_bytes for c in chosen])[inverse]
        write = np.array([c[1].write_bytes for c in chosen])[inverse]
        ops = np.array([c[1].read_ops + c[1].write_ops for c in chosen])[inverse]
        micro = np.array([c[0] for c in chosen])[inverse]
        access = storage_seconds(read, write, ops, pool.kind_read_bps[kind], pool.kind_write_bps[kind],
                                 pool.kind_latency_ms[kind])
        if self.communication:
            down = transfer_seconds(w.download_bytes, s.down_bps[rows], s.latency_s[rows])
            up = transfer_seconds(w.upload_bytes, s.up_bps[rows], s.latency_s[rows])
        else:
            down = up = np.zeros(len(rows))
        compute = shared_seconds(_compute(w, pool, kind, micro), s.flops[rows], pool.kind_flops[kind])
        return {"compute_s": compute, "data_access_s": access, "download_s": down, "upload_s": up,
                "mem_req_bytes": np.full(len(rows), self.memory_need(w)),
                "swapped": np.array([c[2] > 0 for c in chosen])[inverse],
                "read_bytes": read, "write_bytes": write}


def _compute(w: Workload, pool: DevicePool, kind: np.ndarray, micro: np.ndarray) -> np.ndarray:
    """Full-speed compute seconds per client, one roofline sum per (device kind, micro)."""
    base = w.batch + 1  # micro-batches divide the batch
    pairs, inverse = np.unique(kind * base + micro, return_inverse=True)
    full = [full_speed_seconds(w, profile_rooflines(pool.kinds[k]), int(m))
            for k, m in zip(*divmod(pairs, base), strict=True)]
    return np.array(full)[inverse]


def walk_compute_seconds(w: Workload, state: DeviceState, micro: int = 1) -> float:
    """Compute seconds of the round by the roofline model (in `micro` micro-batches per batch when
    the swap walk splits the batch), slowed by the co-running app's share."""
    return shared_seconds(full_speed_seconds(w, profile_rooflines(state.device), micro), state.flops,
                          perf_flops(state.device))


@functools.lru_cache(maxsize=65536)
def full_speed_seconds(w: Workload, roof: Rooflines, micro: int) -> float:
    """Seconds of `w` on rooflines `roof` at full speed (no co-running app), in `micro` micro-batches."""
    return round_seconds(iteration_of(w, micro), w.iterations, w.extra_flops, roof, 1.0)


def profile_rooflines(device: DeviceProfile) -> Rooflines:
    """A profile's rooflines, built once per profile object (profiles are immutable)."""
    key = id(device)
    if key not in _ROOFLINES or _ROOFLINES[key][0] is not device:
        _ROOFLINES[key] = (device, device_rooflines(device))
    return _ROOFLINES[key][1]


_ROOFLINES: dict[int, tuple[DeviceProfile, Rooflines]] = {}


HEAD = "head"  # the name FedProphet's auxiliary head atom is profiled under (methods/fedprophet)


@dataclass(frozen=True)
class PaperRun:
    """What the release's training_latency sums over a run of atoms, per sample (hardware/
    sys_utils.py:341-346): MACs (fvcore), parameters, and the summed inputs of every conv/BN/linear
    layer, plus the last atom's output when a module is charged (FedProphet: module_list is atoms);
    the whole model ('total') adds none. The auxiliary head is not charged (the release leaves it
    out of module_list); its module's output is what it reads."""

    macs: float
    params: int
    features: float
    inputs: int  # the batch's own elements (images, or features after a fixed prefix)

    @classmethod
    def of(cls, atoms: tuple[AtomProfile, ...]) -> PaperRun:
        body = tuple(a for a in atoms if a.name != HEAD)
        out = body[-1].out_elems if len(body) < len(atoms) else 0
        return cls(sum(a.macs for a in body), sum(a.params for a in body),
                   sum(a.weighted_in_elems for a in body) + out, body[0].in_elems)


class PaperCost:
    """The FedProphet release's accounting (src/hardware/sys_utils.py, model_summary.training_latency,
    lines 314-411), summed over the round's batches as its clients list them (client/atclient.py:
    76-100: every epoch's short last batch included). Per batch of n samples, with F = n x features,
    P = parameters, s = parameter copies (2 SGD, 3 momentum, 5 Adam), M the available memory and
    bw the effective storage bandwidth:

    * compute: 2 x n x MACs / perf for the training pass (line 362), 2 x n x MACs x T / perf for
      PGD-T (line 381);
    * MemReq = 4 B x (s P + F) (line 357); when it exceeds M (line 365): 4 B x (2F + 4P + 2(s-2)P)
      over bw (368-370) plus 0.17 s x (ceil(4(F+P) / M) + ceil(MemReq / M)) (371-374); otherwise the
      batch's input over bw plus 0.17 s (377), and the parameters once in the round (378-379);
    * each PGD step whose need 4 B x (F + P) exceeds M (385-387): 4 B x (2F + 4P) over bw plus
      0.17 s x 2 ceil(4(F+P) / M) (390-394);
    * no communication (line 409 leaves it out), and no bytes read or written reported (one bandwidth
      for all moved bytes: storage energy is the walk accounting's).

    Passes the release never runs are charged in its units: TRADES/MART's second (forward, training
    backward) pair as a PGD step (2 n MACs, and a PGD step's traffic when the batch swaps: the
    optimiser state moves once per batch); a forward-only pass half a pair (n MACs), moving the
    parameters in and out (4 B x 2P) with ceil(4(F+P) / M) accesses when 4(F+P) exceeds M; FedCurv's
    Fisher pass (extra_flops, a forward and a training backward per sample) as clean training
    batches over those samples.
    """

    walks = False

    def __init__(self, cfg: CostConfig) -> None:
        self.access_s = cfg.paper_access_s

    def memory_need(self, w: Workload) -> float:
        return paper_mem_req(w.atoms, w.batch, w.slots)

    def module_need(self, atoms: Sequence[AtomProfile], head: AtomProfile | None, batch: int,
                    slots: int, classes: int) -> float:
        """The release's MemReq of the atoms, plus the head's input, weights and logits."""
        extra = 0.0 if head is None else BYTES * (
            batch * (atoms[-1].out_elems + classes) + paper_scale(slots) * head.params)
        return paper_mem_req(atoms, batch, slots) + extra

    def counted(self, w: Workload, samples: Callable[[], int]) -> Workload:
        """With the client's sample count: the release charges each epoch's short last batch."""
        return replace(w, samples=samples())

    def min_budget(self, w: Workload) -> tuple[float, str]:
        """No minimum: the release's formulas swap any model in any budget."""
        return 0.0, "no piece"

    def price(self, plan: RoundPlan[P], states: States, pool: DevicePool,
              samples: Callable[[int], int]) -> Costs:
        """Client by client, each workload with the client's sample count (`counted`)."""
        return Costs.of([self._cost(self.counted(plan.workload(i), functools.partial(samples, int(k))),
                                    pool.state_at(states, i))
                         for i, k in enumerate(states.clients)])

    def _cost(self, w: Workload, state: DeviceState) -> ClientCost:
        run = PaperRun.of(w.atoms)
        s = paper_scale(w.slots)
        compute = access = 0.0
        sizes = w.batch_sizes()
        batches = [(n, w.attack_steps, w.train_pairs, w.extra_forwards) for n in sizes]
        batches += [(n, 0, 1, 0) for n in fisher_batches(w)]
        for n, steps, pairs, forwards in batches:
            c, a = self._batch(run, s, n, steps, pairs, forwards, state)
            compute, access = compute + c, access + a
        if sizes and BYTES * (s * run.params + sizes[0] * run.features) <= state.memory_bytes:
            access += BYTES * run.params / (state.device.storage_read_mb_s * 1e6)  # once (379)
        need = BYTES * (s * run.params + w.batch * run.features)
        return ClientCost(
            compute_s=compute, data_access_s=access, download_s=0.0, upload_s=0.0,
            mem_req_bytes=need, swapped=need > state.memory_bytes)

    def _batch(self, run: PaperRun, s: int, n: int, steps: int, pairs: int, forwards: int,
               state: DeviceState) -> tuple[float, float]:
        """(compute, data access) seconds of one batch of n samples."""
        mem, bw = state.memory_bytes, state.device.storage_read_mb_s * 1e6
        feats, params = n * run.features, run.params
        macs = n * run.macs
        compute = (2 * macs * (pairs + steps) + macs * forwards) / state.flops
        fwd_need = BYTES * (feats + params)
        need = BYTES * (s * params + feats)
        step = self._swap(BYTES * (2 * feats + 4 * params), 2 * self._fills(fwd_need, mem), bw)
        if need > mem:
            access = self._swap(BYTES * (2 * feats + 4 * params + 2 * (s - 2) * params),
                                self._fills(fwd_need, mem) + self._fills(need, mem), bw)
            access += (pairs - 1) * step
        else:
            access = BYTES * n * run.inputs / bw + self.access_s
        if fwd_need > mem:
            access += steps * step + forwards * self._swap(BYTES * 2 * params,
                                                           self._fills(fwd_need, mem), bw)
        return compute, access

    @staticmethod
    def _fills(need: float, mem: float) -> int:
        """Storage accesses to stream `need` bytes through `mem`: one per memory-full."""
        return math.ceil(need / mem)

    def _swap(self, moved: float, accesses: int, bw: float) -> float:
        return moved / bw + self.access_s * accesses


def fisher_batches(w: Workload) -> list[int]:
    """FedCurv's Fisher pass as batches: extra_flops is a forward and a training backward over the
    client's samples (methods/fedcurv.py), so it holds extra_flops / train_pass_flops samples."""
    if not w.extra_flops:
        return []
    full, rest = divmod(round(w.extra_flops / train_pass_flops(w.atoms)), w.batch)
    return [w.batch] * full + ([rest] if rest else [])


def make_cost_model(cfg: CostConfig) -> CostModel:
    return PaperCost(cfg) if cfg.accounting == "paper" else WalkCost(cfg)
