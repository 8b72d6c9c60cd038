"""DevicePool: deals a device to every client and draws each client's state per round.

Devices are assigned once with P(device) ~ (peak FLOP/s x memory)^s (FedProphet §7.1: s = 0 is
the balanced setting, s < 0 the unbalanced one). Each round, each client draws a co-running app
(its degrading factors), its available memory R_k(t) and its network, all from the scenario seed:
six counter-based words keyed by (seed, round, client) (edgefl.devices.draws), so the draw for
(round, client) does not depend on which other clients were drawn, nor in which batch. `states`
draws a round's clients as arrays (`States`); `state` draws one client, folding its key with Python
integers, and is the reference the arrays are tested against.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil
from scipy.special import ndtr, ndtri

from edgefl.config import FleetConfig, RoundConfig
from edgefl.devices import draws
from edgefl.devices.catalog import Catalog, used_files
from edgefl.devices.classes import perf_flops
from edgefl.devices.profile import DeviceProfile
from edgefl.errors import EdgeflError

# memory a fleet takes, measured on dry runs of the quickstart (bench/fleet.py, --rounds 3): the pool's
# per-client arrays and what a method keeps per client (FedBN's placeholders), and a selected client's
# columns while its round is played (about 1,050 B: 831 MB at 200,000 clients all selected against
# 616 MB at 10,000 with 10 selected; 1,500 B with a margin)
BYTES_PER_CLIENT = 160
BYTES_PER_SELECTED = 1500
# a living round's selected client (its columns and its row of the compiled loop, edgefl.sim.round_loop)
# or an async client at work (its objects besides): measured on bench/fleet.py dry runs, 1.4 kB a
# living-digits deadline round's client (20,000 against 200,000 devices, 11 of every 20 selected: 913
# -> 1,079 MB) and 2.6 kB an async-digits job (concurrency 1,000 against 20,000 at 100,000 devices:
# 887 -> 936 MB); 3,000 B with a margin (10,000 B when each was a SimPy process, 7-9 kB measured)
BYTES_PER_LIVING_SELECTED = 3_000
ASSIGN, SAMPLE, STATE, TRACE = 0, 1, 2, 3  # independent random streams (TRACE: the trace's sample)
APP, SHARE, NETWORK, UP, DOWN, LATENCY = range(6)  # a client's draws in a round (STATE's draw index)


@dataclass(frozen=True, slots=True)
class DeviceState:
    """What a client has for training in one round: R_k(t), P_k(t) and its network."""

    device: DeviceProfile
    app: str
    memory_bytes: float
    flops: float  # P_k(t): the device's perf_flops (edgefl.devices.classes) x the share its app leaves
    network: str
    up_bps: float  # bytes/s
    down_bps: float  # bytes/s
    latency_s: float


def rng(seed: int, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, *stream])


def device_weights(devices: list[DeviceProfile], s: float) -> np.ndarray:
    """P(device) proportional to (FLOP/s x memory bytes)^s."""
    w = np.array([(perf_flops(d) * d.memory_bytes) ** s for d in devices])
    return w / w.sum()


def truncated_normal(low: np.ndarray, high: np.ndarray, u: np.ndarray) -> np.ndarray:
    """The release's draw inside [low, high] from a uniform u: N((low+high)/2, high/5) truncated to
    the range, by its inverse CDF as scipy's truncnorm (low where the range is empty)."""
    mean, sd = (low + high) / 2, high / 5
    with np.errstate(divide="ignore", invalid="ignore"):  # empty ranges (high <= low) give low
        lo, hi = ndtr((low - mean) / sd), ndtr((high - mean) / sd)
        drawn = mean + sd * ndtri(lo + u * (hi - lo))
    return np.where(high <= low, low, drawn)


def selected_per_round(fleet: FleetConfig) -> int:
    """Clients selected each round: a fraction of the population, at least one."""
    return max(1, round(fleet.sample_fraction * fleet.clients))


def check_fleet_memory(fleet: FleetConfig, where: str, available: float | None = None,
                       living: RoundConfig | None = None) -> None:
    """Refuse, before any work, a fleet whose per-client arrays and one round's clients would not fit
    in the memory available now (`available` bytes; psutil's figure if None). A living fleet's
    (`living`: its round settings) round plays its clients one by one: more memory each, a deadline
    round selects `over_selection` times as many, an async run holds `concurrency` at a time."""
    free = psutil.virtual_memory().available if available is None else available
    per, share, fixed = BYTES_PER_SELECTED, fleet.sample_fraction, 0  # bytes per selected, share selected
    if living is not None:
        per = BYTES_PER_LIVING_SELECTED
        if living.mode == "async":  # a fixed number at a time, whatever the fleet
            share, fixed = 0.0, min(living.concurrency, fleet.clients)
        elif living.mode == "deadline":
            share *= living.over_selection
    need = fleet.clients * (BYTES_PER_CLIENT + share * per) + fixed * per
    if need > free:
        most = int((free - fixed * per) // (BYTES_PER_CLIENT + share * per))
        raise EdgeflError(where, "fleet.clients", f"{fleet.clients:,} clients need about {need / 1e9:.1f} GB "
                          f"({BYTES_PER_CLIENT} B per client, {per} B per client selected in a round) but "
                          f"{free / 1e9:.1f} GB is available: use at most {most:,} clients at "
                          f"sample_fraction {fleet.sample_fraction:g}")


@dataclass(frozen=True)
class States:
    """A round's clients' draws as arrays: row i is client `clients[i]` (`DevicePool.state_at`
    makes its DeviceState)."""

    clients: np.ndarray  # int64, ascending
    kind: np.ndarray  # index into DevicePool.kinds
    app: np.ndarray  # index into DevicePool.apps
    memory_bytes: np.ndarray
    flops: np.ndarray
    network: np.ndarray  # index into DevicePool.network_names
    up_bps: np.ndarray  # bytes/s
    down_bps: np.ndarray  # bytes/s
    latency_s: np.ndarray


class DevicePool:
    """The fleet: one device per client, and the per-round draws."""

    def __init__(self, catalog: Catalog, fleet: FleetConfig, seed: int) -> None:
        self.fleet = fleet
        self.seed = seed
        self.kinds = [catalog.devices[d] for d in fleet.devices] or catalog.pool(fleet.pool)
        self.kind_of = rng(seed, ASSIGN).choice(
            len(self.kinds), size=fleet.clients, p=device_weights(self.kinds, fleet.balance_s))
        self.devices: list[DeviceProfile] = [self.kinds[i] for i in self.kind_of]
        self.apps = [catalog.apps[a] for a in fleet.apps] or list(catalog.apps.values())
        self.networks = catalog.networks
        self.network_names = list(catalog.networks)
        self.catalog = catalog
        self._tables()

    def _tables(self) -> None:
        """Per device kind, app and network, the figures the draws combine, as arrays."""
        kinds, names = self.kinds, self.network_names
        self.kind_flops = np.array([perf_flops(d) for d in kinds])  # a state's flops: x the app's share
        self.kind_memory = np.array([d.memory_bytes for d in kinds])
        self.kind_reserved = np.array([self.reserved_bytes(d) for d in kinds])
        self.kind_read_bps = np.array([d.storage_read_mb_s * 1e6 for d in kinds])  # storage, B/s
        self.kind_write_bps = np.array([d.storage_write_mb_s * 1e6 for d in kinds])
        self.kind_latency_ms = np.array([d.storage_latency_ms for d in kinds])
        self.kind_networks = np.array([len(d.networks) for d in kinds])
        self.kind_network = np.zeros((len(kinds), int(self.kind_networks.max())), dtype=np.int64)
        for i, d in enumerate(kinds):
            self.kind_network[i, :len(d.networks)] = [names.index(n) for n in d.networks]
        memory_left = [a.memory_left if self.fleet.app_memory else 1.0 for a in self.apps]
        self.app_memory, self.app_perf = np.array(memory_left), np.array([a.perf_left for a in self.apps])
        nets = [self.networks[n] for n in names]
        self.bounds = {what: (np.array([getattr(n, what)[0] for n in nets]),
                              np.array([getattr(n, what)[1] for n in nets]))
                       for what in ("up_mbit_s", "down_mbit_s", "latency_ms")}

    def profile_files(self) -> list[Path]:
        """The files of the profiles this fleet uses: its devices, apps and their networks."""
        devices = sorted({d.name: d for d in self.devices}.values(), key=lambda d: d.name)
        return used_files(self.catalog, devices, self.apps)

    def sampled(self, round_: int) -> np.ndarray:
        """The clients selected in a round (a fraction of the population, at least one), ascending."""
        n = selected_per_round(self.fleet)
        return np.sort(rng(self.seed, SAMPLE, round_).choice(self.fleet.clients, size=n, replace=False))

    def reserved_bytes(self, device: DeviceProfile) -> float:
        """R_min, but never more than the device has."""
        return min(device.memory_bytes, self.fleet.reserved_memory_mb * 1e6)

    def state(self, client: int, round_: int) -> DeviceState:
        """Client `client`'s draw for `round_`: app, available memory, network (`states` of it alone;
        tests/reference.py folds its words one by one, the reference `states` is checked against)."""
        return self.state_at(self.states(np.array([client]), round_), 0)

    def states(self, clients: np.ndarray, round_: int) -> States:
        """The draws of `clients` (ascending) for `round_`, as arrays."""
        prefix = draws.key(self.seed, STATE, round_)
        return self._assemble(clients, draws.words(prefix, clients, LATENCY + 1))

    def memory_bytes(self, clients: np.ndarray, round_: int) -> np.ndarray:
        """The memory `states` draws for `clients` (in any order) in `round_`, from their app and
        share words alone."""
        words = draws.words(draws.key(self.seed, STATE, round_), clients, SHARE + 1)
        return self._memory(self.kind_of[clients], words)[1]

    def _memory(self, kind: np.ndarray, words: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each client's app, and its memory: a share U(lo, hi) x the app's memory left, at least R_min."""
        app = draws.index(words[:, APP], len(self.apps))
        low, high = self.fleet.memory_fraction
        share = (low + (high - low) * draws.uniform(words[:, SHARE])) * self.app_memory[app]
        return app, np.maximum(self.kind_reserved[kind], self.kind_memory[kind] * share)

    def _assemble(self, clients: np.ndarray, words: np.ndarray) -> States:
        """States from each client's six words: app and memory (`_memory`), network, then its up,
        down and latency (the release's truncated normals)."""
        kind = self.kind_of[clients]
        app, memory = self._memory(kind, words)
        net = self.kind_network[kind, draws.index(words[:, NETWORK], self.kind_networks[kind])]

        def draw(what: str, column: int) -> np.ndarray:
            low, high = self.bounds[what]
            return truncated_normal(low[net], high[net], draws.uniform(words[:, column]))

        return States(clients, kind, app, memory, self.kind_flops[kind] * self.app_perf[app], net,
                      draw("up_mbit_s", UP) * 1e6 / 8, draw("down_mbit_s", DOWN) * 1e6 / 8,
                      draw("latency_ms", LATENCY) / 1e3)

    def state_at(self, s: States, i: int) -> DeviceState:
        """Row i of `s` as a DeviceState."""
        return DeviceState(self.kinds[s.kind[i]], self.apps[s.app[i]].name, float(s.memory_bytes[i]),
                           float(s.flops[i]), self.network_names[s.network[i]], float(s.up_bps[i]),
                           float(s.down_bps[i]), float(s.latency_s[i]))


    def gathered(self, clients: np.ndarray, states: list[DeviceState]) -> States:
        """Per-client DeviceStates of `clients` as States."""
        apps, networks = [a.name for a in self.apps], self.network_names

        def column(get: Callable[[DeviceState], float]) -> np.ndarray:
            return np.array([get(x) for x in states], dtype=np.float64)

        return States(clients, self.kind_of[clients], np.array([apps.index(x.app) for x in states]),
                      column(lambda x: x.memory_bytes), column(lambda x: x.flops),
                      np.array([networks.index(x.network) for x in states]), column(lambda x: x.up_bps),
                      column(lambda x: x.down_bps), column(lambda x: x.latency_s))


class StateMap(Mapping[int, DeviceState]):
    """A round's States as a read-only {client: DeviceState}, each made when asked for."""

    def __init__(self, pool: DevicePool, states: States) -> None:
        self.pool, self.states = pool, states

    def __getitem__(self, client: int) -> DeviceState:
        i = int(np.searchsorted(self.states.clients, client))
        if i == len(self.states.clients) or self.states.clients[i] != client:
            raise KeyError(client)
        return self.pool.state_at(self.states, i)

    def __iter__(self) -> Iterator[int]:
        return iter(self.states.clients.tolist())

    def __len__(self) -> int:
        return len(self.states.clients)
