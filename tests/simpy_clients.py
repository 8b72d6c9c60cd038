"""The reference for a living fleet's clients, for the tests: a link's transfers sharing its
bandwidth by water-filling (`Sharing`, played forward event by event; `finish_times`), each client's
work as SimPy processes (its phases, its transfers on a `SharedLink`, an interrupt at its going
offline, a watcher of its battery: `start_client`) and FedBuff's slots and server as SimPy
processes (`SimpyBuffered`), as edgefl played every living round and async run before its compiled
loop (edgefl.sim.round_loop), which is tested against them to the bit (tests/living_rounds.py,
tests/test_fedbuff.py, tests/test_links.py)."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

from edgefl.sim.availability import Availability
from edgefl.sim.clients import COMPLETED, OFFLINE, Drain, Outcome, Transfer
from edgefl.sim.engine import Federation, busy_end
from edgefl.sim.fedbuff import Buffered, Stalled, Started
from edgefl.sim.links import Links
from edgefl.sim.round_loop import BOUNDS, DONE_S

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


@dataclass(frozen=True)
class Progress:
    """A transfer under way on a SharedLink: `sent()` its bytes through so far, `rate()` its bytes/s
    now (which changes when the link's `changed` succeeds), never more than `cap` (its own bandwidth
    or the link's, whichever is less)."""

    sent: Callable[[], float]
    rate: Callable[[], float]
    cap: float


class SharedLink:
    """A processor-sharing link for SimPy processes: `yield from link.transfer(env, nbytes, bps)`
    (the bytes only: a caller adds its latency); its transfers under way are a `Sharing`, and one
    SimPy timeout stands for the next end. `changed` succeeds whenever the rates change (a transfer
    starts, stops or ends) while something waits on it, and is then replaced."""

    def __init__(self, env: simpy.Environment, capacity_bps: float) -> None:
        self.env, self.capacity = env, capacity_bps
        self.sharing = Sharing(capacity_bps, float(env.now))
        self.done: dict[int, simpy.Event] = {}
        self._names = itertools.count()
        self._wake, self._at = 0, math.nan  # the pending wake-up's number (older ones are stale), time
        self.changed = env.event()

    def transfer(self, env: simpy.Environment, nbytes: float, client_bps: float,
                 cut: Callable[[float], None] | None = None,
                 started: Callable[[Progress], None] | None = None) -> Generator[simpy.Event, Any, None]:
        """Send `nbytes` at most `client_bps` bytes/s, sharing the link with every transfer under way;
        a transfer interrupted first tells `cut` the share of its bytes that got through. `started`
        is told how to follow the transfer (`Progress`)."""
        if math.isinf(self.capacity):
            begin = float(env.now)
            if started is not None and nbytes > 0 and math.isfinite(client_bps):  # else it takes no time
                done_s = begin + nbytes / client_bps
                started(Progress(lambda: min(nbytes, (float(env.now) - begin) * client_bps),
                                 lambda: client_bps if float(env.now) < done_s else 0.0, client_bps))
            try:
                yield env.timeout(nbytes / client_bps)
            except simpy.Interrupt:
                if cut is not None:
                    cut(min((float(env.now) - begin) * client_bps / nbytes, 1.0) if nbytes > 0 else 1.0)
                raise
            return
        i = next(self._names)
        done = self.done[i] = env.event()
        self.sharing.advance(float(env.now))
        self.sharing.start(i, float(nbytes), float(client_bps))
        if started is not None:
            started(Progress(lambda: nbytes - self.sharing.left_at(i, float(env.now)),
                             lambda: self.sharing.rate(i), min(client_bps, self.capacity)))
        self._schedule()
        try:
            yield done
        except simpy.Interrupt:  # its client stopped: the others share the link without it
            left = 0.0
            if self.done.pop(i, None) is not None:  # (not through at this same instant)
                self.sharing.advance(float(env.now))
                left = self.sharing.stop(i)
                self._schedule()
            if cut is not None:
                cut(1.0 - left / nbytes if nbytes > 0 else 1.0)
            raise

    def _schedule(self) -> None:
        if self.changed.callbacks:  # someone follows the rates (edgefl.sim.processes `_watch`)
            changed, self.changed = self.changed, self.env.event()
            changed.succeed()
        for i in self.sharing.ended():
            self.done.pop(i).succeed()
        at = self.sharing.next_end()
        if not self.done or at == self._at:  # the pending wake-up stands
            return
        self._wake, self._at = self._wake + 1, at
        wake = self._wake
        self.env.timeout(max(at - float(self.env.now), 0.0)).callbacks.append(lambda _: self._woken(wake))

    def _woken(self, wake: int) -> None:
        if wake == self._wake:
            self._at = math.nan
            self.sharing.advance(float(self.env.now))
            self._schedule()


@dataclass(frozen=True)
class Net:
    """A round's shared links and one client's transfers on them."""

    down: SharedLink
    up: SharedLink
    transfer: Transfer


def _send(env: simpy.Environment, net: Net, up: bool, out: Outcome,
          meter: Meter | None = None) -> Generator[simpy.Event, Any, None]:
    """The client's download (or upload) on its shared link, then its latency; its seconds noted.
    One interrupted midway notes the seconds it would have taken at the pace it had, s / share (the
    share of its bytes through), so that prorating its phases (edgefl.experiment.round_energy `worked`)
    charges the seconds it ran and the bytes it sent, and no later phase. A `meter` follows the
    transfer's pace on the link."""
    t, begin, name = net.transfer, float(env.now), "upload_s" if up else "download_s"
    link = net.up if up else net.down

    def cut(share: float) -> None:
        if share > 0 and env.now > begin:  # one cut where it started keeps its time alone: no bytes sent
            setattr(out, name, (float(env.now) - begin) / share)

    def started(progress: Progress) -> None:
        if meter is not None:
            meter.on(link, progress)

    nbytes, bps = (t.up_bytes, t.up_bps) if up else (t.down_bytes, t.down_bps)
    yield from link.transfer(env, nbytes, bps, cut, started)
    if meter is not None:
        meter.on(None)  # the latency: no bytes
    try:
        yield env.timeout(t.latency_s)
    finally:  # through, or interrupted in the latency: its bytes all sent
        setattr(out, name, float(env.now) - begin)


def _work(env: simpy.Environment, phases: Sequence[float], out: Outcome, reported: Callable[[Outcome], None],
          net: Net | None = None, meter: Meter | None = None) -> Generator[simpy.Event, Any, None]:
    """The client's phases back to back (with `net`, its download and upload on the shared links);
    an interrupt (its cause a status) stops it. A `meter` hears of each phase."""
    try:
        for i, seconds in enumerate(phases):
            if meter is not None:
                meter.enter(i, seconds)
            if net is not None and i in (0, 3):
                yield from _send(env, net, i == 3, out, meter)
            else:
                yield env.timeout(seconds)
    except simpy.Interrupt as stop:
        out.status, out.stop_s = int(stop.cause or 0), float(env.now)
        return
    out.stop_s = float(env.now)
    reported(out)


class Meter:
    """The joules a client's work has spent (`spent()`) and spends per second now (`power()`, at
    most `peak()`): `_work` tells it each phase (`enter`), `_send` each transfer on a shared link
    (`on`), whose bytes it reads from the link; `changed` succeeds at each (when the watcher waits
    on it: one that does not reads the state afresh when it resumes) and is then replaced."""

    def __init__(self, env: simpy.Environment, drain: Drain) -> None:
        self.env, self.drain = env, drain
        self.base, self.since = 0.0, float(env.now)  # the joules spent when this stretch began, and when
        self.phase, self.watts = 0, 0.0  # the phase, and its watts with its spread joules' pace
        self.lump = 0.0  # the spread joules of a phase of no seconds, spent at once
        self.end = math.inf  # when the phase ends, where known
        self.link: SharedLink | None = None  # a transfer under way on a shared link, and its progress
        self.progress: Progress | None = None
        self.changed = env.event()

    def spent(self) -> float:
        now = float(self.env.now)
        joules = self.base + self.watts * (now - self.since)
        if self.progress is not None:
            joules += self._per_byte() * self.progress.sent()
        return joules

    def power(self) -> float:
        return self.watts + (0.0 if self.progress is None else self._per_byte() * self.progress.rate())

    def peak(self) -> float:
        """The most `power` can be until the next change of phase (a transfer at `Progress.cap`)."""
        return self.watts + (0.0 if self.progress is None else self._per_byte() * self.progress.cap)

    def enter(self, phase: int, seconds: float) -> None:
        """The work enters `phase`, `seconds` long alone: its spread joules go at an even pace over
        them (all at once when they are none), unless `on` puts its bytes on a link."""
        self._restart()
        self.phase, self.watts, self.end = phase, self.drain.watts[phase], self.since + seconds
        self.lump = 0.0 if seconds > 0 else self.drain.spread[phase]
        if seconds > 0:
            self.watts += self.drain.spread[phase] / seconds
        self.base += self.lump
        self._changed()

    def on(self, link: SharedLink | None, progress: Progress | None = None) -> None:
        """The phase's bytes go on `link` as `progress` says (None: they are through); those of a
        phase of no seconds alone, spent at once on entering it, are spent at its pace instead."""
        self._restart()
        if progress is not None:
            self.base, self.lump = self.base - self.lump, 0.0
        self.link, self.progress = link, progress
        self.watts, self.end = self.drain.watts[self.phase], math.inf
        self._changed()

    def _restart(self) -> None:
        self.base, self.since = self.spent(), float(self.env.now)
        self.link, self.progress = None, None

    def _per_byte(self) -> float:
        return self.drain.per_byte[self.phase // 3]

    def _changed(self) -> None:
        if self.changed.callbacks:  # the watcher waits on it
            changed, self.changed = self.changed, self.env.event()
            changed.succeed()




def _watch(env: simpy.Environment, proc: simpy.Process, meter: Meter) -> Generator[simpy.Event, Any, None]:
    """Interrupt `proc` (status offline) when its work has spent what its battery holds. The moment
    is worked out at every change of phase from the power then. On a shared link, whose pace changes
    as other transfers come and go, it is first bounded from below, BOUNDS times, by the most the
    transfer can spend (at the lesser of its own and the link's bandwidth: the battery cannot run out
    sooner; each bound starts from the joules really spent by then, so the gap shrinks by the ratio
    of the pace to that bandwidth at least); from then on it follows the pace at every change of the
    link's rates.
    Following every client's pace from the start would wake each at every other's transfer."""
    drain, start = meter.drain, float(env.now)
    plugged, bounds = start + drain.until_s, 0
    while proc.is_alive:
        listening = bounds >= BOUNDS
        now, left = float(env.now), drain.held_j - meter.spent()
        exact = meter.link is None or listening
        rate = meter.power() if exact else meter.peak()
        eta = 0.0 if left <= 0 else left / rate if rate > 0 else math.inf
        at = min(max(now + eta, start + drain.from_s), plugged)
        if at <= now:
            if at < plugged:
                proc.interrupt(OFFLINE)
            return
        events: list[simpy.Event] = [proc, meter.changed]
        if listening and meter.link is not None:
            events.append(meter.link.changed)
        timer = env.timeout(at - now) if at < meter.end and math.isfinite(at) else None
        phase = meter.changed
        yield simpy.AnyOf(env, events if timer is None else [timer, *events])
        if phase.processed:  # another phase: worked out afresh
            bounds = 0
        elif timer is not None and timer.processed and proc.is_alive:
            if not exact:  # a bound reached: the next one, from the joules spent by now
                bounds += 1
            elif at < plugged:
                proc.interrupt(OFFLINE)
                return
            else:
                return  # plugged in before it ran out


def _unplug(env: simpy.Environment, proc: simpy.Process, at: float) -> Generator[simpy.Event, Any, None]:
    """Interrupt `proc` at `at`, when its device goes offline, if it is still working."""
    yield env.timeout(at - env.now)
    if proc.is_alive:
        proc.interrupt(OFFLINE)


def start_client(env: simpy.Environment, phases: Sequence[float], off: float, out: Outcome,
                 reported: Callable[[Outcome], None], net: Net | None = None,
                 drain: Drain | None = None) -> simpy.Process:
    """The client's process, with the interrupt of its device going offline at `off` before it would
    finish (on shared links, when it finishes is not known in advance: whenever it goes offline),
    and with a `drain`, of its battery running out (`_watch`)."""
    meter = None if drain is None else Meter(env, drain)
    proc = env.process(_work(env, phases, out, reported, net, meter))
    if off < (math.inf if net is not None else busy_end(float(env.now), *phases)):
        env.process(_unplug(env, proc, off))
    if meter is not None:
        env.process(_watch(env, proc, meter))
    return proc


class SimpyBuffered(Buffered):
    """FedBuff's slots and server (edgefl.sim.fedbuff `Buffered`) with each client played as SimPy
    processes (`start_client`), as edgefl played them before its compiled loop: a slot hears of its
    client's end as a SimPy process waiting on it did (the process's first callback), its waits and
    the server's time are SimPy timeouts."""

    def __init__(self, fed: Federation, avail: Availability, concurrency: int, buffer: int,
                 max_staleness: int, pick: Callable[[int, set[int]], Started | float],
                 aggregate: Callable[[int, list[Started], list[Started]], None],
                 server_s: Callable[[], float], ended: Callable[[Started], None] = lambda _: None,
                 links: Links | None = None, aggregations: float = math.inf) -> None:
        super().__init__(fed, avail, concurrency, buffer, max_staleness, pick, aggregate, server_s, ended,
                         links, aggregations)
        self.env = fed.env
        self.procs: dict[int, simpy.Process] = {}  # by slot: its client's process
        self.links = None if links is None else (SharedLink(self.env, links.down_bps),
                                                 SharedLink(self.env, links.up_bps))

    def next_aggregation(self) -> None:
        self._open()
        self.folded = False
        while not self.folded:
            try:
                self.env.step()
            except simpy.core.EmptySchedule:
                raise Stalled from None

    def stop(self) -> list[Started]:
        """The clients at work interrupted now (status completed), in slot order, as the round's
        close interrupts its clients; the interrupts played, the ends of their processes unheard."""
        working = [self.procs[slot] for slot, job in enumerate(self.slots)
                   if job is not None and self.procs[slot].is_alive]
        for proc in working:
            proc.interrupt(COMPLETED)
        while any(proc.is_alive for proc in working):
            self.env.step()
        for job in self.slots:
            if job is not None:
                job.outcome.stop_s = float(self.env.now)
        return list(self.unlogged.values())

    def _play(self, slot: int, job: Started, off: float) -> None:
        net = None if self.links is None or job.transfer is None else Net(*self.links, job.transfer)
        proc = self.procs[slot] = start_client(self.env, job.phases, off, job.outcome, lambda _: None, net,
                                               job.drain)
        proc.callbacks.append(lambda _: self._done(slot))

    def _wait(self, slot: int, delay_s: float) -> None:
        self.env.timeout(delay_s).callbacks.append(lambda _: self._next(slot))

    def _after(self, server_s: float) -> None:
        self.env.timeout(server_s).callbacks.append(lambda _: self._served())
