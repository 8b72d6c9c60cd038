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

import heapq
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


def fair_rates(caps: np.ndarray, capacity: float, order: np.ndarray | None = None) -> np.ndarray:
    """Water-filling: each transfer's rate, min(its cap, the level) with the rates summing to at most
    `capacity` (all caps when they fit). `order`: an ascending order of the caps, if known."""
    if not len(caps) or caps.sum() <= capacity:
        return caps.astype(np.float64)
    order = np.argsort(caps, kind="stable") if order is None else order
    c = caps[order]
    below = np.concatenate([[0.0], np.cumsum(c)[:-1]])  # bytes/s the slower ones take
    levels = (capacity - below) / np.arange(len(c), 0, -1)
    k = int(np.argmax(c > levels))  # the first that the level caps (one exists: the caps do not fit)
    rates = np.empty(len(c))
    rates[order] = np.where(np.arange(len(c)) < k, c, levels[k])
    return rates


def finish_times(start: np.ndarray, nbytes: np.ndarray, caps: np.ndarray, capacity: float) -> np.ndarray:
    """When each transfer ends: transfer i starts at start[i] with nbytes[i] bytes at most caps[i]
    bytes/s, all sharing `capacity` bytes/s (inf: each alone). Event by event (`_Sharing`), each
    event O(log n) plus the transfers it moves across the water level."""
    if math.isinf(capacity):
        return start + nbytes / caps
    return _Sharing(caps, capacity).play(start, nbytes)


class _Sharing:
    """Processor sharing with caps, exactly, in O(log n) an event. The transfers are ranked by cap;
    water-filling caps the lowest-ranked active ones (rank <= `pos`, each at its own cap) and gives
    the rest the level L. A capped transfer's end is fixed while it stays capped; the others share a
    virtual clock V (dV/dt = L), and one ends when V reaches its key (V at its start plus its bytes).
    A Fenwick tree over the ranks holds the active count and caps, so the boundary is one descent;
    when an event moves it, only the active transfers between the old and new boundary change side."""

    def __init__(self, caps: np.ndarray, capacity: float) -> None:
        self.n, self.capacity = len(caps), capacity
        order = np.argsort(caps, kind="stable")
        self.rank = np.empty(self.n, dtype=np.int64)
        self.rank[order] = np.arange(1, self.n + 1)
        self.by_rank = [-1, *order.tolist()]  # rank -> transfer
        self.cap = caps.astype(np.float64).tolist()
        self.count, self.sum = [0] * (self.n + 1), [0.0] * (self.n + 1)
        self.active, self.pos, self.level = 0, 0, math.inf

    def _add(self, r: int, c: int, s: float) -> None:
        while r <= self.n:
            self.count[r] += c
            self.sum[r] += s
            r += r & -r

    def _boundary(self) -> tuple[int, float, int]:
        """The largest rank p whose transfers all fit under the level: S(p) + cap_(p) (a - N(p)) <= C,
        with S and N the active caps' sum and count up to p (nondecreasing in p); and S(p), N(p)."""
        p, s, c, step = 0, 0.0, 0, 1 << self.n.bit_length()
        while step:
            q = p + step
            if q <= self.n and s + self.sum[q] + self.cap[self.by_rank[q]] * (
                    self.active - c - self.count[q]) <= self.capacity:
                p, s, c = q, s + self.sum[q], c + self.count[q]
            step >>= 1
        return p, s, c

    def _next_active(self, p: int) -> int:
        """The lowest active rank above p (n + 1 if none)."""
        want, r, c = self._prefix(p) + 1, 0, 0
        step = 1 << self.n.bit_length()
        while step:
            q = r + step
            if q <= self.n and c + self.count[q] < want:
                r, c = q, c + self.count[q]
            step >>= 1
        return r + 1

    def _prefix(self, p: int) -> int:
        c = 0
        while p > 0:
            c += self.count[p]
            p -= p & -p
        return c

    def play(self, start: np.ndarray, nbytes: np.ndarray) -> np.ndarray:
        n, end = self.n, np.full(self.n, np.nan)
        arrivals = np.argsort(start, kind="stable").tolist()
        starts, sizes = start.astype(np.float64).tolist(), nbytes.astype(np.float64).tolist()
        side = [0] * n  # 0 waiting or done, 1 capped (key: end time), 2 at the level (key: V at end)
        key, version = [0.0] * n, [0] * n
        capped: list[tuple[float, int, int]] = []
        shared: list[tuple[float, int, int]] = []
        now, v, nxt = (starts[arrivals[0]] if n else 0.0), 0.0, 0
        while nxt < n or self.active:
            t_arrive = starts[arrivals[nxt]] if nxt < n else math.inf
            t_capped = _top(capped, version)
            t_shared = now + (_top(shared, version) - v) / self.level if self.active > 0 and math.isfinite(
                self.level) else math.inf
            t = min(t_arrive, t_capped, t_shared)
            if math.isfinite(self.level):
                v += self.level * (t - now)
            now = t
            for heap, clock, rate in ((capped, now, 1.0), (shared, v, self.level)):
                while math.isfinite(top := _top(heap, version)) and through(now, top - clock, rate):
                    i = heapq.heappop(heap)[2]
                    end[i], side[i] = now, 0
                    version[i] += 1
                    self.active -= 1
                    self._add(int(self.rank[i]), -1, -self.cap[i])
            arriving = []
            while nxt < n and starts[arrivals[nxt]] <= now:
                i = arrivals[nxt]
                nxt += 1
                arriving.append(i)
                self.active += 1
                self._add(int(self.rank[i]), 1, self.cap[i])
            self._settle(now, v, side, key, version, capped, shared)
            for i in arriving:
                self._place(i, sizes[i], now, v, side, key, version, capped, shared)
        return end

    def _settle(self, now: float, v: float, side: list[int], key: list[float], version: list[int],
                capped: list[tuple[float, int, int]], shared: list[tuple[float, int, int]]) -> None:
        """The new boundary and level; the transfers between the old and new boundary change side."""
        old = self.pos
        self.pos, s, c = self._boundary()
        free = self.active - c
        self.level = (self.capacity - s) / free if free > 0 else math.inf
        r = self._next_active(min(old, self.pos))
        while r <= max(old, self.pos):
            i = self.by_rank[r]
            if side[i]:  # not one arriving now
                left = (key[i] - now) * self.cap[i] if side[i] == 1 else key[i] - v
                self._place(i, left, now, v, side, key, version, capped, shared)
            r = self._next_active(r)

    def _place(self, i: int, left: float, now: float, v: float, side: list[int], key: list[float],
               version: list[int], capped: list[tuple[float, int, int]],
               shared: list[tuple[float, int, int]]) -> None:
        """Transfer i, `left` bytes to go, on its side of the boundary."""
        version[i] += 1
        if self.rank[i] <= self.pos:
            side[i], key[i] = 1, now + left / self.cap[i]
            heapq.heappush(capped, (key[i], version[i], i))
        else:
            side[i], key[i] = 2, v + left
            heapq.heappush(shared, (key[i], version[i], i))


def _top(heap: list[tuple[float, int, int]], version: list[int]) -> float:
    """The heap's smallest key, stale entries (a transfer since moved or ended) dropped."""
    while heap and version[heap[0][2]] != heap[0][1]:
        heapq.heappop(heap)
    return heap[0][0] if heap else math.inf


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


class SharedLink:
    """A processor-sharing link for SimPy processes: `yield from link.transfer(env, nbytes, bps)`
    (the bytes only: a caller adds its latency). The transfers under way are columns (bytes left,
    cap, rate, in the order they started), so each start, end or interruption is a few array
    operations."""

    def __init__(self, env: simpy.Environment, capacity_bps: float) -> None:
        self.env, self.capacity = env, capacity_bps
        self.left, self.cap, self.rate = np.empty(0), np.empty(0), np.empty(0)
        self.done: list[simpy.Event] = []
        self.order = np.empty(0, dtype=np.int64)  # the caps' stable ascending order
        self._last = float(env.now)
        self._wake = 0  # the current wake-up's number (older ones are stale)

    def transfer(self, env: simpy.Environment, nbytes: float, client_bps: float
                 ) -> Generator[simpy.Event, Any, None]:
        """Send `nbytes` at most `client_bps` bytes/s, sharing the link with every transfer under way."""
        if math.isinf(self.capacity):
            yield env.timeout(nbytes / client_bps)
            return
        self._advance()
        done = env.event()
        at = int(np.searchsorted(self.cap[self.order], client_bps, side="right"))  # after equal caps
        self.order = np.insert(self.order, at, len(self.done))
        self.left, self.cap = np.append(self.left, float(nbytes)), np.append(self.cap, float(client_bps))
        self.rate = np.append(self.rate, 0.0)
        self.done.append(done)
        self._schedule()
        try:
            yield done
        except simpy.Interrupt:  # its client stopped: the others share the link without it
            self._advance()
            self._drop(np.array([self.done.index(done)]))
            self._schedule()
            raise

    def _drop(self, rows: np.ndarray) -> None:
        """Remove the transfers at `rows` (ascending)."""
        self.left, self.cap, self.rate = (np.delete(a, rows) for a in (self.left, self.cap, self.rate))
        for i in reversed(rows.tolist()):
            del self.done[i]
        self.order = self.order[~np.isin(self.order, rows)]
        self.order -= np.searchsorted(rows, self.order)  # rows renumbered after the removed ones

    def _advance(self) -> None:
        dt, self._last = float(self.env.now) - self._last, float(self.env.now)
        self.left = self.left - self.rate * dt

    def _schedule(self) -> None:
        now = float(self.env.now)
        moving = self.rate > 0
        ended = moving & through(now, self.left, np.where(moving, self.rate, 1.0))
        if ended.any():
            rows = np.flatnonzero(ended)
            finished = [self.done[i] for i in rows.tolist()]
            self._drop(rows)
            for event in finished:
                event.succeed()
        if not self.done:
            return
        self.rate = fair_rates(self.cap, self.capacity, self.order)
        self._wake += 1
        wake, soonest = self._wake, float((self.left / self.rate).min())
        self.env.timeout(soonest).callbacks.append(lambda _: self._woken(wake))

    def _woken(self, wake: int) -> None:
        if wake == self._wake:
            self._advance()
            self._schedule()
