"""A living fleet's clients: how each one's work ended (`Outcome`, its status one of STATUSES),
its transfers on the server's shared links (`Transfer`, `Transfers`: edgefl.sim.links) and its
battery over its work (`Drain`, `Drains`: edgefl.sim.battery, edgefl.experiment.round_energy).

A client runs its phases (download, data access, compute, upload) back to back; it stops early where
its device goes offline (edgefl.sim.availability) or its battery runs out (`offline`), where its
round's deadline falls (`late`: FedScale's deadline, Lai et al., OSDI 2021), or once its round's
target has uploaded (`dropped`: over-commitment; in async rounds, an update gone stale, FedBuff).
edgefl.sim.living_round plays a round of them, edgefl.sim.fedbuff an async run's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

STATUSES = ("completed", "dropped", "late", "offline")
COMPLETED, DROPPED, LATE, OFFLINE = range(4)


@dataclass
class Outcome:
    """How a client's participation ended: its status code (STATUSES) and when it stopped (its
    upload's end, or the interrupt)."""

    client: int
    status: int = COMPLETED
    stop_s: float = 0.0
    staleness: int = 0  # async: aggregations between its download and its upload
    download_s: float = math.nan  # on shared links: its download's seconds, once it has ended
    upload_s: float = math.nan  # the same for its upload


@dataclass(frozen=True)
class Transfer:
    """A client's transfers on the server's shared links: bytes, its own bandwidths (bytes/s) and the
    latency added after each transfer's bytes (edgefl.sim.links)."""

    down_bytes: float
    up_bytes: float
    down_bps: float
    up_bps: float
    latency_s: float


@dataclass(frozen=True)
class Transfers:
    """Clients' transfers on the server's shared links as columns, a `Transfer` a row: bytes and
    their own bandwidths (bytes/s), each (n, 2) for (down, up), and the latency after each."""

    nbytes: np.ndarray
    bps: np.ndarray
    latency_s: np.ndarray

    @classmethod
    def none(cls, n: int) -> Transfers:
        """n clients with no bytes to send (their transfers take their phases' seconds)."""
        return cls(np.zeros((n, 2)), np.ones((n, 2)), np.zeros(n))

    def row(self, i: int) -> Transfer:
        return Transfer(float(self.nbytes[i, 0]), float(self.nbytes[i, 1]), float(self.bps[i, 0]),
                        float(self.bps[i, 1]), float(self.latency_s[i]))

    def take(self, rows: np.ndarray) -> Transfers:
        return Transfers(self.nbytes[rows], self.bps[rows], self.latency_s[rows])


@dataclass(frozen=True)
class Drain:
    """A client's battery over its work (edgefl.experiment.round_energy `RoundEnergy.drains`): the
    `held_j` joules it can spend, which each phase (download, data access, compute, upload) spends
    at `watts` plus its `spread` joules at an even pace over its seconds (edgefl.sim.energy
    `phase_power`), or, for a transfer on a shared link, `per_byte` joules (download, upload) per
    byte at the transfer's pace. It can run out only from `from_s` seconds into its work (on its
    charger until then: `held_j` is its charge at the unplugging) and not once `until_s` seconds
    in (plugged in then)."""

    held_j: float
    watts: tuple[float, ...]
    spread: tuple[float, ...]
    per_byte: tuple[float, float]
    from_s: float = 0.0
    until_s: float = math.inf


@dataclass(frozen=True)
class Drains:
    """Clients' batteries over their work as columns, a `Drain` a row where `on` (a battery
    followed; elsewhere mains powered, or batteries not tracked): `watts` and `spread` (n, 4) by
    phase, `per_byte` (n, 2) for (download, upload)."""

    on: np.ndarray
    held_j: np.ndarray
    watts: np.ndarray
    spread: np.ndarray
    per_byte: np.ndarray
    from_s: np.ndarray
    until_s: np.ndarray

    @classmethod
    def none(cls, n: int) -> Drains:
        """n clients on mains power (no battery followed)."""
        return cls(np.zeros(n, dtype=bool), np.zeros(n), np.zeros((n, 4)), np.zeros((n, 4)), np.zeros((n, 2)),
                   np.zeros(n), np.full(n, math.inf))

    def row(self, i: int) -> Drain | None:
        if not self.on[i]:
            return None
        return Drain(float(self.held_j[i]), tuple(self.watts[i].tolist()), tuple(self.spread[i].tolist()),
                     (float(self.per_byte[i, 0]), float(self.per_byte[i, 1])), float(self.from_s[i]),
                     float(self.until_s[i]))

    def take(self, rows: np.ndarray) -> Drains:
        return Drains(self.on[rows], self.held_j[rows], self.watts[rows], self.spread[rows],
                      self.per_byte[rows], self.from_s[rows], self.until_s[rows])
