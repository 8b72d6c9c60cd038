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
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Protocol

from edgefl.config import CostConfig
from edgefl.devices.classes import device_rooflines
from edgefl.devices.pool import DeviceState
from edgefl.devices.profile import DeviceProfile
from edgefl.profiling.atoms import BYTES
from edgefl.profiling.memory import mem_req, paper_mem_req, paper_scale
from edgefl.sim.compute import Rooflines, iteration_of, round_seconds
from edgefl.sim.swap import SwapWalk, Traffic, footprint
from edgefl.sim.workload import Workload


@dataclass(frozen=True)
class ClientCost:
    compute_s: float
    data_access_s: float
    download_s: float
    upload_s: float
    mem_req_bytes: float
    swapped: bool
    read_bytes: float = 0.0
    write_bytes: float = 0.0

    @property
    def comm_s(self) -> float:
        return self.download_s + self.upload_s

    @property
    def busy_s(self) -> float:
        return self.compute_s + self.data_access_s + self.comm_s


class CostModel(Protocol):
    def cost(self, w: Workload, state: DeviceState) -> ClientCost: ...


def network_seconds(w: Workload, state: DeviceState) -> tuple[float, float]:
    """(download, upload) seconds: bytes over the drawn bandwidth plus one latency each way."""
    return (w.download_bytes / state.down_bps + state.latency_s,
            w.upload_bytes / state.up_bps + state.latency_s)


def mem_need(w: Workload, accounting: str) -> float:
    """MemReq of a workload in the estimator the scenario's cost model charges."""
    if accounting == "paper":
        return paper_mem_req(w.atoms, w.batch, w.slots)
    return mem_req(w.atoms, w.batch, w.slots, adversarial=w.attack_steps > 0)


def walk_traffic(w: Workload, budget: float) -> tuple[Traffic, int]:
    """(traffic, evictions) of the swap walk. Every budget that holds the round's whole footprint
    gives the same walk, and fleets repeat budgets (R_min), so walks are cached."""
    return _walk(w, math.inf if footprint(w) <= budget else budget)


@functools.lru_cache(maxsize=65536)
def _walk(w: Workload, budget: float) -> tuple[Traffic, int]:
    walk = SwapWalk(w, budget)
    return walk.run(), walk.evictions


class WalkCost:
    """edgefl's default accounting."""

    def __init__(self, cfg: CostConfig) -> None:
        self.communication = cfg.communication

    def cost(self, w: Workload, state: DeviceState) -> ClientCost:
        need = mem_req(w.atoms, w.batch, w.slots, adversarial=w.attack_steps > 0)
        traffic, evictions = walk_traffic(w, state.memory_bytes)
        dev = state.device
        access = (traffic.read_bytes / (dev.storage_read_mbps * 1e6)
                  + traffic.write_bytes / (dev.storage_write_mbps * 1e6)
                  + (traffic.read_ops + traffic.write_ops) * dev.storage_latency_ms / 1e3)
        down, up = network_seconds(w, state) if self.communication else (0.0, 0.0)
        return ClientCost(
            compute_s=walk_compute_seconds(w, state),
            data_access_s=access, download_s=down, upload_s=up, mem_req_bytes=need,
            swapped=evictions > 0, read_bytes=traffic.read_bytes,
            write_bytes=traffic.write_bytes)


def walk_compute_seconds(w: Workload, state: DeviceState) -> float:
    """Compute seconds of the round by the roofline model, slowed by the co-running app's share."""
    return _full_speed_seconds(w, _rooflines(state.device)) / (state.flops / state.device.flops)


@functools.lru_cache(maxsize=65536)
def _full_speed_seconds(w: Workload, roof: Rooflines) -> float:
    return round_seconds(iteration_of(w), w.iterations, w.extra_flops, roof, 1.0)


def _rooflines(device: DeviceProfile) -> Rooflines:
    """A profile's rooflines, built once per profile object (profiles are immutable)."""
    key = id(device)
    if key not in _ROOFLINES or _ROOFLINES[key][0] is not device:
        _ROOFLINES[key] = (device, device_rooflines(device))
    return _ROOFLINES[key][1]


_ROOFLINES: dict[int, tuple[DeviceProfile, Rooflines]] = {}


class PaperCost:
    """The FedProphet release's accounting, per batch, with 0.17 s per storage access."""

    def __init__(self, cfg: CostConfig) -> None:
        self.access_s = cfg.paper_access_s

    def cost(self, w: Workload, state: DeviceState) -> ClientCost:
        params = sum(a.params for a in w.atoms)
        features = w.batch * sum(a.weighted_in_elems for a in w.atoms)
        macs = w.batch * sum(a.macs for a in w.atoms)
        need = paper_mem_req(w.atoms, w.batch, w.slots)
        mem, bw = state.memory_bytes, state.device.storage_read_mbps * 1e6
        s = paper_scale(w.slots)
        if need > mem:
            per_batch = self._swap(BYTES * (2 * features + 4 * params + 2 * (s - 2) * params),
                                   [BYTES * (features + params), need], mem, bw)
            step_need = BYTES * (features + params)
            if step_need > mem:
                per_batch += w.attack_steps * self._swap(
                    BYTES * (2 * features + 4 * params), [step_need, step_need], mem, bw)
            access = w.iterations * per_batch
        else:
            access = (w.iterations * (w.batch_bytes / bw + self.access_s)
                      + BYTES * params / bw)
        return ClientCost(
            compute_s=w.iterations * 2 * macs * (1 + w.attack_steps) / state.flops,
            data_access_s=access, download_s=0.0, upload_s=0.0, mem_req_bytes=need,
            swapped=need > mem)

    def _swap(self, moved: float, needs: list[float], mem: float, bw: float) -> float:
        """Seconds to move `moved` bytes with one access per memory-full of each need."""
        return moved / bw + self.access_s * sum(math.ceil(n / mem) for n in needs)


def make_cost_model(cfg: CostConfig) -> CostModel:
    return PaperCost(cfg) if cfg.accounting == "paper" else WalkCost(cfg)
