"""Batteries: each device's charge in joules, drained by the energy model's joules per round.

A device with `battery_wh = 0` is mains powered: its charge is infinite and never runs out. The
others start at a seeded share of capacity (`energy.battery_start`, U(lo, hi)). A battery that
reaches 0 J leaves its device offline: `alive(client)` is the hook availability code asks, and
`recharge(client, joules)` the hook charging (e.g. a diurnal pattern) calls. Synchronous rounds
(edgefl.experiment.rounds) drop, at the round's start, every selected client whose charge cannot
cover the round's joules: it does no work, spends nothing and sends no update, as an FL client that
checks its battery before accepting a task (Bonawitz et al., "Towards Federated Learning at Scale",
MLSys 2019: devices take part only when their state allows it).
"""

from __future__ import annotations

import numpy as np

from edgefl.config import EnergyConfig
from edgefl.devices.pool import DevicePool, rng
from edgefl.errors import EdgeflError

BATTERY = 41  # the random stream of the starting charges (edgefl.devices.pool.rng)
WH = 3600.0  # joules per watt-hour


class Battery:
    """Every client's charge (J), inf for mains-powered devices."""

    def __init__(self, capacity_j: np.ndarray, start: np.ndarray) -> None:
        self.capacity_j = capacity_j
        mains = np.isinf(capacity_j)
        self.charge_j = np.where(mains, np.inf, np.where(mains, 0.0, capacity_j) * start)

    @classmethod
    def of_pool(cls, pool: DevicePool, cfg: EnergyConfig, seed: int) -> Battery:
        """The fleet's batteries: capacity from each device's `battery_wh`, a seeded start share."""
        wh = np.array([d.battery_wh for d in pool.devices])
        lo, hi = cfg.battery_start
        start = rng(seed, BATTERY).uniform(lo, hi, size=len(wh))
        return cls(np.where(wh > 0, wh * WH, np.inf), start)

    def alive(self, client: int) -> bool:
        """Whether the client's device has charge left (mains-powered devices always do)."""
        return bool(self.charge_j[client] > 0)

    def covers(self, clients: np.ndarray, joules: np.ndarray) -> np.ndarray:
        """Per client, whether its charge pays for `joules` (and leaves it alive)."""
        return np.asarray(self.charge_j[clients] > joules)

    def drain(self, clients: np.ndarray, joules: np.ndarray) -> None:
        """Take each client's joules from its charge (never below 0)."""
        self.charge_j[clients] = np.maximum(self.charge_j[clients] - joules, 0.0)

    def recharge(self, client: int, joules: float) -> None:
        """Give the client's battery `joules`, up to its capacity (the charging hook)."""
        self.charge_j[client] = min(self.capacity_j[client], self.charge_j[client] + joules)

    def state(self) -> list[float]:
        """The charges, for a checkpoint (inf where mains powered)."""
        return [float(v) for v in self.charge_j]

    def restore(self, charges: object, where: str) -> None:
        """Charges back from a checkpoint (`state`'s list), checked: one non-negative number per client."""
        ok = (isinstance(charges, list) and len(charges) == len(self.charge_j)
              and all(isinstance(c, float) and c >= 0 for c in charges))
        if not ok:
            raise EdgeflError(where, "battery", "the checkpoint's battery charges are missing or damaged; "
                              "start the run again")
        self.charge_j = np.array(charges, dtype=np.float64)
