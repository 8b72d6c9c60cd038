"""The energy model: a client's joules for one round, from its costs, its device and its network.

A device draws its idle power (`idle_w`, awake) for the whole of its part of a round: downloading,
reading and swapping, computing, uploading and waiting for the round's end. While it computes,
training adds the active-over-idle power (`active_w - idle_w`, the device at full training load)
times the share of the processor training gets, the share the co-running app leaves (the
DeviceState's FLOP/s over the device's peak, the same share that slows its compute); the app's own
load is not training's and is not charged. Storage traffic costs its nJ per byte read and written
(the swap walk's bytes, edgefl.sim.swap); the radio costs its nJ per byte sent and received plus its
base power while a transfer runs (Huang et al., "A Close Examination of Performance and Power
Characteristics of 4G LTE Networks", MobiSys 2012: P = a_u t_u + a_d t_d + b, whose a x throughput
is energy per byte):

    E = P_idle (busy + wait) + (P_active - P_idle) x share x compute_s
        + 1e-9 (read_B x e_read + write_B x e_write + down_B x e_down + up_B x e_up)
        + P_radio x (download_s + upload_s)

Where communication is not counted (`cost.communication = false`, or the paper accounting), neither
are its bytes. The paper accounting reports no storage bytes either (the release moves a batch's
bytes at one storage bandwidth and never says which are reads and which writes), so its storage
energy is 0: the walk accounting (the default) prices storage energy. One expression
(`round_energy`) serves single clients (floats) and a round's columns (arrays), so the bulk path
equals the per-client path to the bit. Figures and their sources: the device profiles and
edgefl.devices.classes (power), the network profiles (radio).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from edgefl.devices.classes import device_power, perf_flops
from edgefl.devices.pool import DevicePool, DeviceState, States
from edgefl.devices.profile import DeviceProfile, NetworkProfile

NJ = 1e-9  # joules per nanojoule
X = TypeVar("X", float, np.ndarray)


@dataclass(frozen=True)
class Power(Generic[X]):
    """A client's power figures (floats), or a round's (arrays, row i the i-th client)."""

    active_w: X
    idle_w: X
    read_nj: X  # per byte
    write_nj: X
    down_nj: X
    up_nj: X
    radio_w: X

    def at(self, i: int) -> Power[float]:
        """Row i of a round's figures."""
        return Power(**{f.name: float(getattr(self, f.name)[i]) for f in fields(self)})


class Priced(Protocol):
    """What the energy model reads of a cost: a ClientCost, or a round's Costs columns."""

    @property
    def compute_s(self) -> Any: ...
    @property
    def data_access_s(self) -> Any: ...
    @property
    def download_s(self) -> Any: ...
    @property
    def upload_s(self) -> Any: ...
    @property
    def read_bytes(self) -> Any: ...
    @property
    def write_bytes(self) -> Any: ...


def round_energy(p: Power[Any], c: Priced, share: Any, down_bytes: Any, up_bytes: Any, wait_s: Any) -> Any:
    """Joules of one round (the module's formula), for a client (floats) or a round (arrays)."""
    comm = c.download_s + c.upload_s
    busy = c.compute_s + c.data_access_s + comm
    return (p.idle_w * (busy + wait_s) + (p.active_w - p.idle_w) * share * c.compute_s
            + NJ * (c.read_bytes * p.read_nj + c.write_bytes * p.write_nj
                    + down_bytes * p.down_nj + up_bytes * p.up_nj)
            + p.radio_w * comm)


def phase_power(p: Power[Any], c: Priced, share: Any, down_bytes: Any,
                up_bytes: Any) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, Any]]:
    """`round_energy`'s work joules, phase by phase (download, data access, compute, upload), as
    watts over each phase's seconds and joules spread over them (edgefl.experiment.round_energy `worked`
    prorates them so): the idle power in every phase, the radio's base power in the transfers,
    training's extra power in the compute; a transfer's bytes, and the storage bytes over data access
    and compute together. Also the radio's joules per byte (download, upload). For a client (floats)
    or a round (arrays)."""
    storage = NJ * (c.read_bytes * p.read_nj + c.write_bytes * p.write_nj)
    busy = c.data_access_s + c.compute_s
    walk = np.divide(c.data_access_s, busy, out=np.zeros_like(busy, dtype=np.float64), where=busy > 0)
    transfer_w = p.idle_w + p.radio_w
    watts = (transfer_w, p.idle_w, p.idle_w + (p.active_w - p.idle_w) * share, transfer_w)
    spread = (NJ * down_bytes * p.down_nj, storage * walk, storage * (1 - walk), NJ * up_bytes * p.up_nj)
    return watts, spread, (NJ * p.down_nj, NJ * p.up_nj)


def client_power(device: DeviceProfile, network: NetworkProfile) -> Power[float]:
    """A device's figures (its own, else its class's) on a network."""
    d = device_power(device)
    return Power(d.active_w, d.idle_w, d.read_nj_per_byte, d.write_nj_per_byte,
                 network.down_nj_per_byte, network.up_nj_per_byte, network.radio_w)


def client_energy(pool: DevicePool, state: DeviceState, c: Priced, sent: tuple[float, float],
                  wait_s: float) -> float:
    """One client's joules: `sent` is (bytes downloaded, bytes uploaded), zeros where communication
    is not counted."""
    p = client_power(state.device, pool.networks[state.network])
    return float(round_energy(p, c, state.flops / perf_flops(state.device), sent[0], sent[1], wait_s))


class FleetPower:
    """Every device kind's and network's figures as arrays, to price a round's clients in bulk."""

    def __init__(self, pool: DevicePool) -> None:
        self.pool = pool
        nets = [pool.networks[n] for n in pool.network_names]
        table = [[client_power(d, n) for n in nets] for d in pool.kinds]  # [kind][network]
        self.table = {f.name: np.array([[getattr(p, f.name) for p in row] for row in table])
                      for f in fields(Power)}

    def of(self, s: States) -> Power[np.ndarray]:
        """The round's clients' figures."""
        return Power(**{name: t[s.kind, s.network] for name, t in self.table.items()})

    def energy(self, s: States, c: Priced, down_bytes: np.ndarray, up_bytes: np.ndarray,
               wait_s: np.ndarray) -> np.ndarray:
        """The round's joules per client (row i the i-th client of `s`)."""
        share = s.flops / self.pool.kind_flops[s.kind]
        return np.asarray(round_energy(self.of(s), c, share, down_bytes, up_bytes, wait_s))
