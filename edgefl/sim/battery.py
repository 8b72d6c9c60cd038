"""Batteries: each device's charge in joules, drained by the energy model's joules, refilled while
the device is plugged in.

A device with `battery_wh = 0` is mains powered: its charge is infinite and never runs out. The
others start at a seeded share of capacity (`energy.battery_start`, U(lo, hi)).

Charging (`energy.charge_w` > 0): every device is plugged in daily from local hour
`energy.charge_start_h` for `energy.charge_hours`, in the time zone the fleet's diurnal pattern gives
it (edgefl.sim.availability.Diurnal with `fleet.tz_spread_h` and the scenario seed: a phone's night
is the same night in both), and its battery gains `charge_w` watts meanwhile, up to its capacity. A
charge is brought up to date lazily: `level(t)` adds the watts times the seconds plugged in since it
was last settled; `drain` settles to the moment the work ended first, so charging during the work
counts. A device pays for its work (`covers`) with its charge and what its charger brings while the
work lasts: a charger weaker than the work's draw no longer powers any work on an empty battery (a
1e-6 W one let empty phones finish whole rounds). The work is taken from the battery after the
charger's gain, which is capped at capacity first: an approximation that undercharges a full
battery on its charger.

An empty battery leaves its device offline (`Powered`, the fleet's availability with batteries)
until it is plugged in again. Rounds drop, at their start, every selected client whose charge cannot
cover the joules of its work priced with its transfers alone and no waiting (its waiting is drained
afterwards, down to 0 J, `drain` giving what it held): it does no work, spends nothing and sends no
update, as an FL client that checks its battery before accepting a task (Bonawitz et al., "Towards
Federated Learning at Scale", MLSys 2019: devices take part only when their state allows it). Async
clients, started one by one, accept whenever their battery is not empty. A client at work goes
offline where its battery runs out (edgefl.sim.clients `Drain`): in sync rounds only where a transfer
slowed on the server's shared links, or an unplugging, costs more than the check priced.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgefl.config import EnergyConfig
from edgefl.devices.pool import DevicePool, rng
from edgefl.errors import EdgeflError
from edgefl.sim.availability import Availability, Diurnal, OneByMany

BATTERY = 41  # the random stream of the starting charges (edgefl.devices.pool.rng)
WH = 3600.0  # joules per watt-hour
EMPTY_J = 1e-6  # a charge this low is empty (what rounding leaves of a battery drained to its end)


class Battery:
    """Every client's charge (J), inf for mains-powered devices, and the charger that refills it."""

    def __init__(self, capacity_j: np.ndarray, start: np.ndarray, charger: Diurnal | None = None,
                 charge_w: float = 0.0) -> None:
        self.capacity_j = capacity_j
        mains = np.isinf(capacity_j)
        self.charge_j = np.where(mains, np.inf, np.where(mains, 0.0, capacity_j) * start)
        self.since_s = np.zeros(len(capacity_j))  # when each charge was last brought up to date
        self.charger = charger if charge_w > 0 else None
        self.charge_w = charge_w

    @classmethod
    def of_pool(cls, pool: DevicePool, cfg: EnergyConfig, seed: int) -> Battery:
        """The fleet's batteries: capacity from each device's `battery_wh`, a seeded start share, the
        daily charging window in each device's time zone."""
        wh = np.array([d.battery_wh for d in pool.devices])
        lo, hi = cfg.battery_start
        start = rng(seed, BATTERY).uniform(lo, hi, size=len(wh))
        charger = Diurnal(seed, cfg.charge_start_h, cfg.charge_hours, pool.fleet.tz_spread_h)
        return cls(np.where(wh > 0, wh * WH, np.inf), start, charger, cfg.charge_w)

    def level(self, clients: np.ndarray, t: np.ndarray | float) -> np.ndarray:
        """Each client's charge at `t` (not before it was last settled): its charge then plus the
        charger's watts times the seconds plugged in since, at most its capacity."""
        q = self.charge_j[clients]
        if self.charger is None:
            return q.copy()
        gained = self.charge_w * self.charger.online_seconds(clients, self.since_s[clients], t)
        return np.minimum(self.capacity_j[clients], q + gained)

    def settle(self, clients: np.ndarray, t: np.ndarray | float) -> None:
        """Bring the clients' charges up to `t`."""
        self.charge_j[clients] = self.level(clients, t)
        self.since_s[clients] = t

    def plugged_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        """Whether each client's device is on its charger at `t`."""
        if self.charger is None:
            return np.zeros(len(clients), dtype=bool)
        return self.charger.online_many(clients, t)

    def plugged_at(self, client: int, t: float) -> float:
        """When the device is next on its charger: `t` if it is now (inf: it has none)."""
        return float(self.plugged_at_many(np.array([client]), t)[0])

    def plugged_at_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        """`plugged_at` of each client."""
        if self.charger is None:
            return np.full(len(clients), math.inf)
        return self.charger.online_at_many(clients, t)

    def unplugged_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        """When each device on its charger at `t` (`plugged_many`) comes off it."""
        assert self.charger is not None, "only a device on its charger is unplugged"
        return self.charger.offline_many(clients, t)

    def powered(self, client: int, t: float) -> bool:
        """Whether the device can run at `t`: charge left, or on its charger."""
        return bool(self.powered_many(np.array([client]), t)[0])

    def powered_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        """Whether each client's device can run at `t`: charge left, or on its charger."""
        return np.asarray((self.level(clients, t) > 0) | self.plugged_many(clients, t))

    def powered_at(self, client: int, t: float) -> float:
        """When the device can next run: `t` if it can now, else when it is next plugged in (inf:
        never, without a charger)."""
        return t if self.powered(client, t) else self.plugged_at(client, t)

    def covers(self, clients: np.ndarray, joules: np.ndarray, seconds: np.ndarray, t: float) -> np.ndarray:
        """Per client, whether it pays for `joules` of work of `seconds` starting at `t`: its charge
        then and the charger's watts over the seconds it is plugged in meanwhile exceed them (it
        would not end empty)."""
        gained = 0.0 if self.charger is None else self.charge_w * self.charger.online_seconds(
            clients, np.full(len(clients), t), t + seconds)
        return np.asarray(self.level(clients, t) + gained > joules)

    def filled_at(self, client: int, joules: float, t: float, horizon: float) -> float:
        """The first moment from `t` at which the client's charge alone exceeds `joules` (its charger
        filling it while plugged in), to float precision; inf when not within `horizon` seconds."""
        one = np.array([client])

        def enough(at: float) -> bool:
            return bool(self.level(one, at)[0] > joules)

        lo, hi = t, t + horizon
        if enough(lo):
            return lo
        if not enough(hi):
            return math.inf
        while lo < (mid := lo + (hi - lo) / 2) < hi:  # the level only rises: bisect to where it passes
            lo, hi = (lo, mid) if enough(mid) else (mid, hi)
        return hi

    def drain(self, clients: np.ndarray, joules: np.ndarray, t: np.ndarray | float) -> np.ndarray:
        """Take each client's joules, spent by `t`, from its charge settled to `t` (never below 0; a
        microjoule left is none); the joules taken: all of them, or the charge a battery had when
        they outgrow it (it emptied before the work, or the wait, ended)."""
        self.settle(clients, t)
        held = self.charge_j[clients]
        left = held - joules
        self.charge_j[clients] = np.where(left > EMPTY_J, left, 0.0)
        return np.minimum(joules, held)

    def state(self, t: float) -> list[float]:
        """The charges at `t`, for a checkpoint (inf where mains powered)."""
        every = np.arange(len(self.charge_j))
        self.settle(every, t)
        return [float(v) for v in self.charge_j]

    def restore(self, charges: object, where: str, t: float) -> None:
        """Charges at `t` back from a checkpoint (`state`'s list), checked: one non-negative number
        per client."""
        ok = (isinstance(charges, list) and len(charges) == len(self.charge_j)
              and all(isinstance(c, float) and c >= 0 for c in charges))
        if not ok:
            raise EdgeflError(where, "battery", "the checkpoint's battery charges are missing or damaged; "
                              "start the run again")
        self.charge_j = np.array(charges, dtype=np.float64)
        self.since_s = np.full(len(self.charge_j), t)


@dataclass(frozen=True)
class Powered(OneByMany):
    """The fleet's availability with its batteries: a device whose battery is empty is offline
    until it is plugged in (then it has charge at once: the charger's watts are positive)."""

    avail: Availability
    battery: Battery

    def online_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        return np.asarray(self.avail.online_many(clients, t) & self.battery.powered_many(clients, t))

    def offline_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        return self.avail.offline_many(clients, t)

    def online_at(self, client: int, t: float) -> float:
        powered = self.battery.powered_at(client, t)
        return powered if math.isinf(powered) else self.avail.online_at(client, powered)
