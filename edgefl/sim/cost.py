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

The choice is made once, here: whoever needs a memory requirement, a module's MemReq, the round's
batches or a budget check asks the scenario's cost model (`make_cost_model`), never the accounting.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from edgefl.config import CostConfig
from edgefl.devices.classes import perf_flops
from edgefl.devices.pool import DeviceState
from edgefl.devices.profile import DeviceProfile
from edgefl.sim.classes import device_rooflines
from edgefl.sim.compute import Rooflines, iteration_of, round_seconds
from edgefl.sim.records import BYTES, AtomProfile, mem_req, paper_mem_req, paper_scale
from edgefl.sim.swap import PlanSeconds, Traffic, Walk, cheapest, footprint, min_budget, traced_walks
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


class CostModel(Protocol):
    """An accounting: what a round costs, and the memory figures methods plan with."""

    walks: bool  # the swap walk pages what does not fit (edgefl's accounting; False: the release's)

    def cost(self, w: Workload, state: DeviceState) -> ClientCost: ...

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


def network_seconds(w: Workload, state: DeviceState) -> tuple[float, float]:
    """(download, upload) seconds: bytes over the drawn bandwidth plus one latency each way."""
    return (transfer_seconds(w.download_bytes, state.down_bps, state.latency_s),
            transfer_seconds(w.upload_bytes, state.up_bps, state.latency_s))


# The walk accounting's formulas, for one client (floats) or a round's clients (NumPy columns,
# edgefl.sim.bulk): the same operations in the same order, so both give the same bits.

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


def walk_traffic(w: Workload, budget: float, device: DeviceProfile) -> tuple[Traffic, int, int]:
    """(traffic, evictions, micro-batches per batch) of the swap walk `device` runs fastest
    (`plan_seconds`). Every budget that holds the round's whole footprint gives the same walks, and
    fleets repeat budgets (R_min), so walks are cached."""
    walks = _walks(w, math.inf if footprint(w) <= budget else budget)
    micro, traffic, evictions = walks[cheapest(walks, plan_seconds(w, device))]
    return traffic, evictions, micro


@functools.lru_cache(maxsize=65536)
def _walks(w: Workload, budget: float) -> tuple[Walk, ...]:
    return traced_walks(w, budget)[0]


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


class WalkCost:
    """edgefl's default accounting."""

    walks = True

    def __init__(self, cfg: CostConfig) -> None:
        self.communication = cfg.communication

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

    def cost(self, w: Workload, state: DeviceState) -> ClientCost:
        need = self.memory_need(w)
        traffic, evictions, micro = walk_traffic(w, state.memory_bytes, state.device)
        dev = state.device
        ops = traffic.read_ops + traffic.write_ops
        access = storage_seconds(traffic.read_bytes, traffic.write_bytes, ops, dev.storage_read_mb_s * 1e6,
                                 dev.storage_write_mb_s * 1e6, dev.storage_latency_ms)
        down, up = network_seconds(w, state) if self.communication else (0.0, 0.0)
        return ClientCost(
            compute_s=walk_compute_seconds(w, state, micro),
            data_access_s=access, download_s=down, upload_s=up, mem_req_bytes=need,
            swapped=evictions > 0, read_bytes=traffic.read_bytes,
            write_bytes=traffic.write_bytes)


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

    def cost(self, w: Workload, state: DeviceState) -> ClientCost:
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
