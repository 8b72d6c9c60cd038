"""The server's shared links: concurrent transfers share its bandwidth by processor sharing.

Each active transfer gets min(its client's bandwidth, its fair share of the server's link), the
share found by water-filling: clients slower than the level keep their own rate and the rest split
what is left equally (max-min fairness, Bertsekas & Gallager, "Data Networks", 1992, §6.5.2). Rates
change only when a transfer starts or ends, so finish times are exact event by event.

`Sharing` holds the transfers under way and plays them forward, O(log n) an event. `finish_times`
computes with it, for transfers starting at given times, when each ends (a synchronous round's
downloads all start at its start, its uploads as each client finishes computing); `shared_round`
applies it to a round's phases. A living round's and an async run's transfers start and stop as
their clients do: the compiled loop of edgefl.sim.round_loop plays them, with the same arithmetic.
A capacity of inf (`server.down_mbps = 0`, the default) leaves every transfer at its own rate.

`Links.of_server` sizes the links from a scenario's `[server]` (`server_mbps`, the one place that
does): a fixed Mbit/s plus a share per device of the fleet (`down_mbps_per_device`,
`up_mbps_per_device`), so that a fleet a thousand times larger meets a link a thousand times wider,
as a content delivery network deploys capacity in proportion to the users it serves (Nygren,
Sitaraman & Sun, "The Akamai Network: A Platform for High-Performance Internet Applications", ACM
SIGOPS Operating Systems Review 44(3), 2010).
"""

from __future__ import annotations

import heapq
import itertools
import math
from dataclasses import dataclass

import numpy as np

from edgefl.config import ServerConfig

DONE_S = 1e-9  # a transfer with at most this many seconds of bytes left is through (float rounding)

Heap = list[tuple[float, int, int]]  # (key, serial, transfer); stale unless serial is the transfer's


def through(now: float, rest_s: float) -> bool:
    """Whether a transfer `rest_s` seconds from its end is through at `now`: at most DONE_S seconds,
    or less than the clock can still add."""
    return rest_s <= DONE_S or now + rest_s == now


class Sharing:
    """Transfers sharing `capacity` bytes/s by water-filling, played forward event by event.

    Those whose caps are at most the level L run at their caps (capped: a capped transfer's end is
    fixed while it stays capped); the others (shared) run at L = (capacity - the capped caps) /
    their number and share a virtual clock V (dV/dt = L): one ends when V reaches its key, V at its
    start plus its bytes. Two heaps by cap hold the boundary (the largest capped cap, the smallest
    shared one) and two by key the ends, so a start, a stop or an end is O(log n) plus the
    transfers it moves across the level. The caller names transfers by ints and calls `advance`
    to the time of each start, stop or `next_end`."""

    def __init__(self, capacity: float, now: float = 0.0) -> None:
        self.capacity, self.now, self.v, self.level = capacity, now, 0.0, math.inf
        self.capped_sum, self.shared = 0.0, 0  # the capped caps' sum, the shared transfers' count
        self.cap: dict[int, float] = {}
        self.key: dict[int, float] = {}  # capped: its end time; shared: V at its end
        self.capped: dict[int, bool] = {}
        self.serial: dict[int, int] = {}
        self._serials = itertools.count()
        self.low: Heap = []  # the shared by cap, smallest first
        self.high: Heap = []  # the capped by cap, largest first (caps negated)
        self.capped_ends: Heap = []
        self.shared_ends: Heap = []

    def __len__(self) -> int:
        return len(self.cap)

    def advance(self, now: float) -> None:
        """Play on to `now` (no later than `next_end`)."""
        if self.shared:
            self.v += self.level * (now - self.now)
        self.now = now

    def next_end(self) -> float:
        """When the next transfer ends if none starts or stops before (inf: none under way)."""
        key = self._top(self.shared_ends)
        shared = self.now + (key - self.v) / self.level if math.isfinite(key) else math.inf
        return min(self._top(self.capped_ends), shared)

    def start(self, i: int, nbytes: float, cap: float) -> None:
        """Transfer i starts now: `nbytes` bytes at most `cap` bytes/s."""
        self.cap[i] = cap
        self._place(i, nbytes, capped=False)
        self._settle()

    def stop(self, i: int) -> float:
        """Transfer i stops now, its bytes not through; returns how many those are."""
        left = self._left(i)
        self._remove(i)
        self._settle()
        return max(left, 0.0)

    def rate(self, i: int) -> float:
        """Transfer i's bytes/s now (0 once it is through)."""
        if i not in self.cap:
            return 0.0
        return self.cap[i] if self.capped[i] else self.level

    def left_at(self, i: int, now: float) -> float:
        """Transfer i's bytes to go at `now` (no later than `next_end`; 0 once it is through), read
        without playing the link on: its own float path stays what it is without readers."""
        if i not in self.cap:
            return 0.0
        if self.capped[i]:
            return max((self.key[i] - now) * self.cap[i], 0.0)
        return max(self.key[i] - (self.v + self.level * (now - self.now)), 0.0)

    def ended(self) -> list[int]:
        """The transfers through by now, removed: the capped ones, then the shared ones."""
        out = []
        capped, shared = self.capped_ends, self.shared_ends
        while math.isfinite(end := self._top(capped)) and through(self.now, end - self.now):
            out.append(self._remove(capped[0][2]))
        while math.isfinite(key := self._top(shared)) and through(self.now, (key - self.v) / self.level):
            out.append(self._remove(shared[0][2]))
        if out:
            self._settle()
        return out

    def _place(self, i: int, left: float, capped: bool) -> None:
        """Transfer i, `left` bytes to go, on the capped or the shared side."""
        serial = self.serial[i] = next(self._serials)
        self.capped[i] = capped
        if capped:
            self.key[i] = self.now + left / self.cap[i]
            self.capped_sum += self.cap[i]
            heapq.heappush(self.high, (-self.cap[i], serial, i))
            heapq.heappush(self.capped_ends, (self.key[i], serial, i))
        else:
            self.key[i] = self.v + left
            self.shared += 1
            heapq.heappush(self.low, (self.cap[i], serial, i))
            heapq.heappush(self.shared_ends, (self.key[i], serial, i))

    def _detach(self, i: int) -> None:
        """Transfer i off its side (its heap entries go stale with its next serial)."""
        if self.capped[i]:
            self.capped_sum -= self.cap[i]
        else:
            self.shared -= 1

    def _remove(self, i: int) -> int:
        self._detach(i)
        for d in (self.cap, self.key, self.capped, self.serial):
            del d[i]
        if self.shared == len(self.cap):  # none capped: the sum is 0, without its rounding
            self.capped_sum = 0.0
        return i

    def _left(self, i: int) -> float:
        """Transfer i's bytes to go."""
        return (self.key[i] - self.now) * self.cap[i] if self.capped[i] else self.key[i] - self.v

    def _move(self, i: int) -> None:
        """Transfer i across the level, its bytes to go carried over."""
        left = self._left(i)
        self._detach(i)
        self._place(i, left, not self.capped[i])

    def _settle(self) -> None:
        """Move transfers across the level until the capped ones are those with caps at most L: first
        the capped above L to the shared side, then the shared at most L to the capped side. With C
        the capacity, S the capped caps' sum and m the shared count, L = (C - S) / m, and either move
        raises it (a cap c > L freed: (C - S + c) / (m + 1) > L; a cap c <= L taken: (C - S - c) /
        (m - 1) >= L), so the second loop keeps every capped cap at most L, as the first left them."""
        while math.isfinite(self._top(self.high)) and -self.high[0][0] > self._level():
            self._move(self.high[0][2])
        while self.shared and self._top(self.low) <= self._level():
            self._move(self.low[0][2])
        self.level = self._level()

    def _level(self) -> float:
        return (self.capacity - self.capped_sum) / self.shared if self.shared else math.inf

    def _top(self, heap: Heap) -> float:
        """The heap's smallest key, stale entries (of a transfer since moved or ended) dropped."""
        while heap and self.serial.get(heap[0][2]) != heap[0][1]:
            heapq.heappop(heap)
        return heap[0][0] if heap else math.inf


def finish_times(start: np.ndarray, nbytes: np.ndarray, caps: np.ndarray, capacity: float) -> np.ndarray:
    """When each transfer ends: transfer i starts at start[i] with nbytes[i] bytes at most caps[i]
    bytes/s, all sharing `capacity` bytes/s (inf: each alone), played by `Sharing`."""
    if math.isinf(capacity):
        return start + nbytes / caps
    arrivals = np.argsort(start, kind="stable").tolist()
    starts, sizes, cap = start.astype(np.float64).tolist(), nbytes.tolist(), caps.tolist()
    end, link, nxt = np.full(len(start), np.nan), Sharing(capacity), 0
    while nxt < len(arrivals) or len(link):
        now = min(starts[arrivals[nxt]] if nxt < len(arrivals) else math.inf, link.next_end())
        link.advance(now)
        end[link.ended()] = now
        while nxt < len(arrivals) and starts[arrivals[nxt]] <= now:
            i = arrivals[nxt]
            link.start(i, float(sizes[i]), float(cap[i]))
            nxt += 1
    return end


def server_mbps(server: ServerConfig, clients: int) -> tuple[float, float]:
    """The server's (down, up) Mbit/s for a fleet of `clients` devices: each link's fixed Mbit/s plus
    its share per device times the fleet (0 in all = unlimited)."""
    return (server.down_mbps + server.down_mbps_per_device * clients,
            server.up_mbps + server.up_mbps_per_device * clients)


@dataclass(frozen=True)
class Links:
    """The server's download and upload capacities, bytes/s (inf = unlimited)."""

    down_bps: float
    up_bps: float

    @classmethod
    def of_mbps(cls, down_mbps: float, up_mbps: float) -> Links:
        return cls(*(m * 1e6 / 8 if m > 0 else math.inf for m in (down_mbps, up_mbps)))

    @classmethod
    def of_server(cls, server: ServerConfig, clients: int) -> Links:
        """The links of a scenario's `[server]` for a fleet of `clients` devices (`server_mbps`)."""
        return cls.of_mbps(*server_mbps(server, clients))

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
