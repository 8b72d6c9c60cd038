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
is energy per byte). After its last byte a cellular radio stays in its high-power state for
seconds before it drops to idle (LTE's RRC tail, a Wi-Fi radio's short one; same paper): the radio
draws its tail power P_tail for T_tail seconds after each transfer, or until the next transfer
starts if that is sooner. The download's tail runs into the data access and compute that follow it
and is cut by the upload; the upload's tail is charged in full (the device keeps it after the
round's last byte, while it waits for the round's end or after; a next round's download starting
within it is not netted off):

    E = P_idle (busy + wait) + (P_active - P_idle) x share x compute_s
        + 1e-9 (read_B x e_read + write_B x e_write + down_B x e_down + up_B x e_up)
        + P_radio x (download_s + upload_s)
        + P_tail x (min(T_tail, data_access_s + compute_s) + T_tail)

A transfer of no bytes has no tail. A client stopped early (edgefl.experiment.round_energy `worked`)
is charged the download's tail as if spread at an even pace over the data access and compute (as
their storage bytes are; the radio really spends it first), in proportion to the data access and
compute it did, and the upload's tail with the upload's bytes, in proportion to those it sent; a
battery that runs out mid-work stops its client where the same joules are spent
(edgefl.sim.clients `Drain`: a battery that cannot pay for the upload's tail stops its client
before the last byte, where the radio would spend it after). The radio's promotion from idle to
connected before a transfer is not charged.

Where communication is not counted (`cost.communication = false`, or the paper accounting), neither
are its bytes, nor its tails. The paper accounting reports no storage bytes either (the release
moves a batch's bytes at one storage bandwidth and never says which are reads and which writes), so
its storage energy is 0: the walk accounting (the default) prices storage energy. One expression
(`round_energy`) serves single clients (floats) and a round's columns (arrays), so the bulk path
equals the per-client path to the bit. Figures and their sources: the device profiles and
edgefl.devices.classes (power), the network profiles (radio, its tail).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Generic, Protocol, TypeVar

import numpy as np

from edgefl.devices.classes import device_power
from edgefl.devices.pool import DevicePool, States
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
    tail_s: X = 0.0  # type: ignore[assignment]  # the radio's tail after its last byte, s (0: none)
    tail_w: X = 0.0  # type: ignore[assignment]  # its power then, W

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


def round_energy(p: Power[Any], c: Priced, share: Any, down_bytes: Any, up_bytes: Any, wait_s: Any,
                 tails: tuple[Any, Any] | None = None) -> Any:
    """Joules of one round (the module's formula), for a client (floats) or a round (arrays); `tails`
    the seconds of the radio's tail after the download and after the upload (`radio_tail`; None:
    those of the work `c` done whole)."""
    comm = c.download_s + c.upload_s
    busy = c.compute_s + c.data_access_s + comm
    down_tail, up_tail = radio_tail(p, c, down_bytes, up_bytes) if tails is None else tails
    return (p.idle_w * (busy + wait_s) + (p.active_w - p.idle_w) * share * c.compute_s
            + NJ * (c.read_bytes * p.read_nj + c.write_bytes * p.write_nj
                    + down_bytes * p.down_nj + up_bytes * p.up_nj)
            + p.radio_w * comm + p.tail_w * (down_tail + up_tail))


def radio_tail(p: Power[Any], c: Priced, down_bytes: Any, up_bytes: Any, done: Priced | None = None,
               uploaded: Any = 1.0) -> tuple[Any, Any]:
    """The seconds of the radio's tail after the download (min(T_tail, data access + compute): cut by
    the upload) and after the upload (T_tail) of the work `c`, where its transfers carry bytes. A
    client stopped early did `done` of that work and `uploaded` of its upload (a share; both as
    edgefl.experiment.round_energy `worked` gives them): the download's tail goes at an even pace
    over the data access and compute (as their storage bytes) and the upload's with the upload's
    bytes, so each is prorated by the share of those done. For a client (floats) or a round
    (arrays)."""
    busy = c.data_access_s + c.compute_s
    down = np.minimum(p.tail_s, busy) * (down_bytes > 0)
    if done is not None:
        down = down * np.divide(done.data_access_s + done.compute_s, busy,
                                out=np.zeros_like(busy, dtype=np.float64), where=busy > 0)
    return down, p.tail_s * ((up_bytes > 0) * uploaded)


def phase_power(p: Power[Any], c: Priced, share: Any, down_bytes: Any,
                up_bytes: Any) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, Any]]:
    """`round_energy`'s work joules, phase by phase (download, data access, compute, upload), as
    watts over each phase's seconds and joules spread over them (edgefl.experiment.round_energy `worked`
    prorates them so): the idle power in every phase, the radio's base power in the transfers,
    training's extra power in the compute; a transfer's bytes, the storage bytes and the download's
    tail over data access and compute together, and the upload's tail with the upload's bytes. Also
    the radio's joules per byte (download, upload; the upload's carrying its share of the tail). For
    a client (floats) or a round (arrays)."""
    busy = c.data_access_s + c.compute_s
    walk = np.divide(c.data_access_s, busy, out=np.zeros_like(busy, dtype=np.float64), where=busy > 0)
    down_tail, up_tail = radio_tail(p, c, down_bytes, up_bytes)
    over_busy = NJ * (c.read_bytes * p.read_nj + c.write_bytes * p.write_nj) + p.tail_w * down_tail
    up_tail_j = p.tail_w * up_tail
    transfer_w = p.idle_w + p.radio_w
    watts = (transfer_w, p.idle_w, p.idle_w + (p.active_w - p.idle_w) * share, transfer_w)
    spread = (NJ * down_bytes * p.down_nj, over_busy * walk, over_busy * (1 - walk),
              NJ * up_bytes * p.up_nj + up_tail_j)
    tail_per_byte = np.divide(up_tail_j, up_bytes, out=np.zeros_like(up_bytes, dtype=np.float64),
                              where=up_bytes > 0)
    return watts, spread, (NJ * p.down_nj, NJ * p.up_nj + tail_per_byte)


def client_power(device: DeviceProfile, network: NetworkProfile) -> Power[float]:
    """A device's figures (its own, else its class's) on a network."""
    d = device_power(device)
    return Power(d.active_w, d.idle_w, d.read_nj_per_byte, d.write_nj_per_byte,
                 network.down_nj_per_byte, network.up_nj_per_byte, network.radio_w, network.tail_s,
                 network.tail_w)


class FleetPower:
    """Every device kind's and network's figures as arrays, to price a round's clients in bulk."""

    def __init__(self, pool: DevicePool) -> None:
        self.pool = pool
        nets = [pool.networks[n] for n in pool.network_names]
        self.networks = len(nets)
        pairs = [client_power(d, n) for d in pool.kinds for n in nets]  # kind-major
        self.table = {f.name: np.array([getattr(p, f.name) for p in pairs]) for f in fields(Power)}

    def of(self, s: States) -> Power[np.ndarray]:
        """The round's clients' figures."""
        pair = s.kind * self.networks + s.network
        return Power(**{name: t[pair] for name, t in self.table.items()})

    def energy(self, s: States, c: Priced, down_bytes: np.ndarray, up_bytes: np.ndarray,
               wait_s: np.ndarray, tails: tuple[np.ndarray, np.ndarray] | None = None) -> np.ndarray:
        """The round's joules per client (row i the i-th client of `s`); `tails` as `round_energy`'s."""
        share = s.flops / self.pool.kind_flops[s.kind]
        return np.asarray(round_energy(self.of(s), c, share, down_bytes, up_bytes, wait_s, tails))
