"""DevicePool: deals a device to every client and draws each client's state per round.

Devices are assigned once with P(device) ~ (peak FLOP/s x memory)^s (FedProphet §7.1: s = 0 is
the balanced setting, s < 0 the unbalanced one). Each round, each client draws a co-running app
(its degrading factors), its available memory R_k(t) and its network, all from the scenario seed:
the draw for (round, client) does not depend on which other clients were drawn before it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
from scipy.special import ndtr, ndtri

from edgefl.config import FleetConfig
from edgefl.devices.catalog import Catalog, used_files
from edgefl.devices.profile import DeviceProfile, NetworkProfile
from edgefl.errors import EdgeflError

# memory a fleet takes, measured on dry runs of the quickstart (bench/fleet.py): the pool's per-client
# arrays and the dealing's temporaries, and a selected client's objects while its round is played
BYTES_PER_CLIENT = 160
BYTES_PER_SELECTED = 4000
ASSIGN, SAMPLE, STATE, TRACE = 0, 1, 2, 3  # independent random streams (TRACE: the trace's sample)


@dataclass(frozen=True, slots=True)
class DeviceState:
    """What a client has for training in one round: R_k(t), P_k(t) and its network."""

    device: DeviceProfile
    app: str
    memory_bytes: float
    flops: float
    network: str
    up_bps: float  # bytes/s
    down_bps: float  # bytes/s
    latency_s: float


def rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])


def device_weights(devices: list[DeviceProfile], s: float) -> np.ndarray:
    """P(device) proportional to (FLOP/s x memory bytes)^s."""
    w = np.array([(d.flops * d.memory_bytes) ** s for d in devices])
    return w / w.sum()


def truncated_normal(bounds: list[float], r: np.random.Generator) -> float:
    """The release's draw inside [low, high]: N((low+high)/2, high/5) truncated to the range."""
    low, high = bounds
    if high <= low:
        return low
    mean, sd = (low + high) / 2, high / 5
    lo, hi = ndtr((low - mean) / sd), ndtr((high - mean) / sd)
    return float(mean + sd * ndtri(lo + r.uniform() * (hi - lo)))  # inverse-CDF, as scipy's truncnorm


def selected_per_round(fleet: FleetConfig) -> int:
    """Clients selected each round: a fraction of the population, at least one."""
    return max(1, round(fleet.sample_fraction * fleet.clients))


def check_fleet_memory(fleet: FleetConfig, where: str, available: float | None = None) -> None:
    """Refuse, before any work, a fleet whose per-client arrays and one round's clients would not fit
    in the memory available now (`available` bytes; psutil's figure if None)."""
    free = psutil.virtual_memory().available if available is None else available
    need = fleet.clients * BYTES_PER_CLIENT + selected_per_round(fleet) * BYTES_PER_SELECTED
    if need > free:
        per = BYTES_PER_CLIENT + fleet.sample_fraction * BYTES_PER_SELECTED
        most = int(free // per)
        raise EdgeflError(where, "fleet.clients", f"{fleet.clients:,} clients need about {need / 1e9:.1f} GB "
                          f"({BYTES_PER_CLIENT} B per client, {BYTES_PER_SELECTED} B per client selected in "
                          f"a round) but {free / 1e9:.1f} GB is available: use at most {most:,} clients at "
                          f"sample_fraction {fleet.sample_fraction:g}")


class DevicePool:
    """The fleet: one device per client, and the per-round draws."""

    def __init__(self, catalog: Catalog, fleet: FleetConfig, seed: int) -> None:
        self.fleet = fleet
        self.seed = seed
        choices = [catalog.devices[d] for d in fleet.devices] or catalog.pool(fleet.pool)
        picks = rng(seed, ASSIGN).choice(
            len(choices), size=fleet.clients, p=device_weights(choices, fleet.balance_s))
        self.devices: list[DeviceProfile] = [choices[i] for i in picks]
        self.apps = [catalog.apps[a] for a in fleet.apps] or list(catalog.apps.values())
        self.networks = catalog.networks
        self.catalog = catalog

    def profile_files(self) -> list[Path]:
        """The files of the profiles this fleet uses: its devices, apps and their networks."""
        devices = sorted({d.name: d for d in self.devices}.values(), key=lambda d: d.name)
        return used_files(self.catalog, devices, self.apps)

    def sample_clients(self, round_: int) -> list[int]:
        """The clients selected in a round (a fraction of the population, at least one)."""
        n = selected_per_round(self.fleet)
        picked = rng(self.seed, SAMPLE, round_).choice(self.fleet.clients, size=n, replace=False)
        return sorted(int(k) for k in picked)

    def reserved_bytes(self, device: DeviceProfile) -> float:
        """R_min, but never more than the device has."""
        return min(device.memory_bytes, self.fleet.reserved_memory_mb * 1e6)

    def state(self, client: int, round_: int) -> DeviceState:
        """Client `client`'s draw for `round_`: app, available memory, network."""
        r = rng(self.seed, STATE, round_, client)
        device = self.devices[client]
        app = self.apps[int(r.integers(len(self.apps)))]
        low, high = self.fleet.memory_fraction
        share = r.uniform(low, high) * (app.memory_left if self.fleet.app_memory else 1.0)
        memory = max(self.reserved_bytes(device), device.memory_bytes * share)
        net = self.networks[device.networks[int(r.integers(len(device.networks)))]]
        up, down, latency = _draw_network(net, r)
        return DeviceState(device, app.name, memory, device.flops * app.perf_left,
                           net.name, up, down, latency)


def _draw_network(net: NetworkProfile, r: np.random.Generator) -> tuple[float, float, float]:
    """(up bytes/s, down bytes/s, latency s)."""
    up = truncated_normal(net.up_mbps, r) * 1e6 / 8
    down = truncated_normal(net.down_mbps, r) * 1e6 / 8
    latency = truncated_normal(net.latency_ms, r) / 1e3
    return up, down, latency
