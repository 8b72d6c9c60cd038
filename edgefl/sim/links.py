"""The server's shared links: concurrent transfers share its bandwidth by processor sharing.

Each active transfer gets min(its client's bandwidth, its fair share of the server's link), the
share found by water-filling: clients slower than the level keep their own rate and the rest split
what is left equally (max-min fairness, Bertsekas & Gallager, "Data Networks", 1992, §6.5.2). Rates
change only when a transfer starts or ends, so finish times are exact event by event.

Two forms. `SharedLink` is a SimPy object for event-driven rounds: `yield from link.transfer(env,
nbytes, client_bps)` returns when the bytes are through. `finish_times` computes, for transfers
starting at given times, when each ends (a synchronous round's downloads all start at its start,
its uploads as each client finishes computing); `shared_round` applies it to a round's phases.
A capacity of inf (`server.down_mbps = 0`, the default) leaves every transfer at its own rate.
"""

from __future__ import annotations

import math
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

DONE_S = 1e-9  # a transfer with at most this many seconds of bytes left is through (float rounding)


def through(now: Any, left: Any, rate: Any) -> Any:
    """Whether transfers with `left` bytes at `rate` are through at `now`: at most DONE_S seconds
    left, or less than the clock can still add (floats or arrays)."""
    rest = left / rate
    return (rest <= DONE_S) | (now + rest == now)


def fair_rates(caps: np.ndarray, capacity: float) -> np.ndarray:
    """Water-filling: each transfer's rate, min(its cap, the level) with the rates summing to at most
    `capacity` (all caps when they fit)."""
    if not len(caps) or caps.sum() <= capacity:
        return caps.astype(np.float64)
    order = np.argsort(caps, kind="stable")
    c = caps[order]
    below = np.concatenate([[0.0], np.cumsum(c)[:-1]])  # bytes/s the slower ones take
    levels = (capacity - below) / np.arange(len(c), 0, -1)
    k = int(np.argmax(c > levels))  # the first that the level caps (one exists: the caps do not fit)
    rates = np.empty(len(c))
    rates[order] = np.where(np.arange(len(c)) < k, c, levels[k])
    return rates


def finish_times(start: np.ndarray, nbytes: np.ndarray, caps: np.ndarray, capacity: float) -> np.ndarray:
    """When each transfer ends: transfer i starts at start[i] with nbytes[i] bytes at most caps[i]
    bytes/s, all sharing `capacity` bytes/s (inf: each alone)."""
    if math.isinf(capacity):
        return start + nbytes / caps
    left, end = nbytes.astype(np.float64), np.full(len(start), np.nan)
    order = np.argsort(start, kind="stable")
    starts = start[order]
    act, arrived = np.empty(0, dtype=np.int64), 0
    now = float(starts[0]) if len(starts) else 0.0
    while arrived < len(order) or len(act):
        upto = int(np.searchsorted(starts, now, side="right"))
        act, arrived = np.concatenate([act, order[arrived:upto]]), max(arrived, upto)
        rates = fair_rates(caps[act], capacity)
        step = min(float((left[act] / rates).min()) if len(act) else math.inf,
                   float(starts[arrived]) - now if arrived < len(order) else math.inf)
        left[act] -= rates * step
        now += step
        done = through(now, left[act], rates)
        end[act[done]] = now
        act = act[~done]
    return end


@dataclass(frozen=True)
class Links:
    """The server's download and upload capacities, bytes/s (inf = unlimited)."""

    down_bps: float
    up_bps: float

    @classmethod
    def of_mbps(cls, down_mbps: float, up_mbps: float) -> Links:
        return cls(*(m * 1e6 / 8 if m > 0 else math.inf for m in (down_mbps, up_mbps)))

    @property
    def unlimited(self) -> bool:
        return math.isinf(self.down_bps) and math.isinf(self.up_bps)


def shared_round(links: Links, phases: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
                 sent: tuple[np.ndarray, np.ndarray], bps: tuple[np.ndarray, np.ndarray],
                 latency_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A synchronous round's (download_s, upload_s) on shared links. `phases` are the clients'
    (download, data access, compute, upload) seconds alone, `sent` the bytes (down, up), `bps` their
    own (down, up) bandwidths: every download starts at the round's start, every upload when its
    client has computed; each transfer's latency is added after its bytes."""
    down_s, access_s, compute_s, _ = phases
    zero = np.zeros(len(down_s))
    down = finish_times(zero, sent[0], bps[0], links.down_bps) + latency_s
    ready = down + access_s + compute_s
    return down, finish_times(ready, sent[1], bps[1], links.up_bps) - ready + latency_s


@dataclass
class _Transfer:
    left: float  # bytes
    cap: float  # bytes/s
    done: simpy.Event
    rate: float = 0.0


class SharedLink:
    """A processor-sharing link for SimPy processes: `yield from link.transfer(env, nbytes, bps)`
    (the bytes only: a caller adds its latency)."""

    def __init__(self, env: simpy.Environment, capacity_bps: float) -> None:
        self.env, self.capacity = env, capacity_bps
        self.active: list[_Transfer] = []
        self._last = float(env.now)
        self._wake = 0  # the current wake-up's number (older ones are stale)

    def transfer(self, env: simpy.Environment, nbytes: float, client_bps: float
                 ) -> Generator[simpy.Event, Any, None]:
        """Send `nbytes` at most `client_bps` bytes/s, sharing the link with every transfer under way."""
        if math.isinf(self.capacity):
            yield env.timeout(nbytes / client_bps)
            return
        self._advance()
        t = _Transfer(float(nbytes), float(client_bps), env.event())
        self.active.append(t)
        self._schedule()
        try:
            yield t.done
        except simpy.Interrupt:  # its client stopped: the others share the link without it
            self._advance()
            self.active.remove(t)
            self._schedule()
            raise

    def _advance(self) -> None:
        dt, self._last = float(self.env.now) - self._last, float(self.env.now)
        for t in self.active:
            t.left -= t.rate * dt

    def _schedule(self) -> None:
        now = float(self.env.now)
        for t in [t for t in self.active if t.rate > 0 and through(now, t.left, t.rate)]:
            self.active.remove(t)
            t.done.succeed()
        if not self.active:
            return
        rates = fair_rates(np.array([t.cap for t in self.active]), self.capacity)
        for t, r in zip(self.active, rates, strict=True):
            t.rate = float(r)
        self._wake += 1
        wake, soonest = self._wake, min(t.left / t.rate for t in self.active)
        self.env.timeout(soonest).callbacks.append(lambda _: self._woken(wake))

    def _woken(self, wake: int) -> None:
        if wake == self._wake:
            self._advance()
            self._schedule()
