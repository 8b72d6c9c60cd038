"""A living fleet in SimPy: devices that go offline mid-round, deadlines, buffered asynchronous
aggregation.

Each participating client is a SimPy process whose phases (download, data access, compute,
upload) are timeouts. Its device's availability (edgefl.sim.availability) schedules an interrupt at
the moment it goes offline: the process stops there, its work is lost and it uploads nothing
(status `offline`). How a round closes is `round.mode`:

* `sync` with a changing fleet: when every selected client has uploaded or gone offline.
* `deadline` (FedScale's over-commitment, Lai et al., OSDI 2021 / Yang et al. 2021): the server
  selects ceil(over_selection x target) clients and closes the round at `deadline_s` after its start
  or as soon as `target` clients have uploaded, whichever is first. Clients still working are
  interrupted: `late` at the deadline, `dropped` once the target has reported (their update is not
  needed; an upload at the very instant the target was reached, beyond it, is `dropped` too).
  These two are played in columns (edgefl.sim.living_round, which follows these processes' rules
  to the bit; they play them in the tests' reference).
* `async` (FedBuff, Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation",
  AISTATS 2022, Alg. 1): `concurrency` clients work at once, a new one starts as one ends; each
  downloads the current model version; the server aggregates every `buffer` uploads, each weighted by
  s(tau) = 1 / sqrt(1 + tau), tau its staleness (aggregations since its download; the paper's
  polynomial staleness scaling, §5, with exponent 1/2), and drops uploads with tau > `max_staleness`
  (status `dropped`). The server aggregates one buffer at a time, for `server_s` each: uploads
  that arrive meanwhile wait for it, in arrival order, `buffer` at a time, their staleness checked
  again when their aggregation starts (a server slower than the uploads drops the backlog as it
  ages). `Buffered` plays it; what a client trains and what an aggregation does are the caller's
  (edgefl.experiment.async_rounds).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from edgefl.errors import EdgeflError
from edgefl.sim.availability import Availability
from edgefl.sim.engine import Federation, busy_end
from edgefl.sim.links import Links, Progress, SharedLink

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

    def row(self, i: int) -> Transfer:
        return Transfer(float(self.nbytes[i, 0]), float(self.nbytes[i, 1]), float(self.bps[i, 0]),
                        float(self.bps[i, 1]), float(self.latency_s[i]))

    def take(self, rows: np.ndarray) -> Transfers:
        return Transfers(self.nbytes[rows], self.bps[rows], self.latency_s[rows])


@dataclass(frozen=True)
class Net:
    """A round's shared links and one client's transfers on them."""

    down: SharedLink
    up: SharedLink
    transfer: Transfer


def staleness_weight(tau: int) -> float:
    """FedBuff's s(tau) = 1 / sqrt(1 + tau)."""
    return 1 / math.sqrt(1 + tau)


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

    def row(self, i: int) -> Drain | None:
        if not self.on[i]:
            return None
        return Drain(float(self.held_j[i]), tuple(self.watts[i].tolist()), tuple(self.spread[i].tolist()),
                     (float(self.per_byte[i, 0]), float(self.per_byte[i, 1])), float(self.from_s[i]),
                     float(self.until_s[i]))

    def take(self, rows: np.ndarray) -> Drains:
        return Drains(self.on[rows], self.held_j[rows], self.watts[rows], self.spread[rows],
                      self.per_byte[rows], self.from_s[rows], self.until_s[rows])


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


BOUNDS = 8  # a shared transfer's lower bounds on the empty moment before following its every pace


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


STALL_ENDED = 10_000  # async: max(this, 20 x buffer) clients ended and no aggregation: none will come


def stall_runs(buffer: int) -> int:
    """How many clients may end between two aggregations before an async run counts as stalled: at
    least 10,000, and 20 per buffered update (fewer than 5 % of the clients bring an update)."""
    return max(STALL_ENDED, 20 * buffer)


class Halted(Exception):
    """A user's error (EdgeflError) met inside an async slot's process, carried out of SimPy
    whole: SimPy remakes a process's exception from its args, which an EdgeflError's are not."""

    def __init__(self, error: EdgeflError) -> None:
        super().__init__(error)
        self.error = error


class Stalled(Exception):
    """No next aggregation: every async slot closed (no device comes online again; `arrived` is
    None), or `stall_runs` clients ended since the last one with only `arrived` of the buffer's
    updates in, or (`serving`) while the server still worked on it."""

    def __init__(self, arrived: int | None = None, serving: bool = False) -> None:
        super().__init__(arrived, serving)  # every field in args: SimPy remakes an exception from them
        self.arrived, self.serving = arrived, serving


@dataclass
class Started:
    """A client the caller started: its phase seconds and what it trained (kept until it ends)."""

    client: int
    phases: Sequence[float]
    payload: Any = None
    transfer: Transfer | None = None  # its transfers on the server's shared links (None: unlimited)
    drain: Drain | None = None  # its battery (None: mains powered, or batteries not tracked)
    version: int = 0  # the model version it downloaded
    outcome: Outcome = field(init=False)

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.client)


class Buffered:
    """FedBuff's server and client slots as SimPy processes (see the module docstring).

    `pick(version, busy)` starts a client not in `busy` on the current version (a `Started`), or
    says when to look again (a time in seconds; inf: never, and the slot closes) when no device
    is online; `ended(job)` hears of each client that stopped, at once (an upload it hears of as
    completed may still be dropped, gone stale while it waited for the server); `aggregate(version,
    batch, ended)` folds the first `buffer` uploads waiting into the model as version `version` + 1,
    after the server's `server_s()` seconds, given every client that ended since the last
    aggregation but those still waiting. With `links` the clients' transfers share the server's
    links (each Started's `transfer`). After `aggregations` folds no more are served."""

    def __init__(self, fed: Federation, avail: Availability, concurrency: int, buffer: int,
                 max_staleness: int, pick: Callable[[int, set[int]], Started | float],
                 aggregate: Callable[[int, list[Started], list[Started]], None],
                 server_s: Callable[[], float], ended: Callable[[Started], None] = lambda _: None,
                 links: Links | None = None, aggregations: float = math.inf) -> None:
        self.env, self.avail = fed.env, avail
        self.size, self.max_staleness = buffer, max_staleness
        self.pick, self.fold, self.server_s, self.heard = pick, aggregate, server_s, ended
        self.links = None if links is None else (SharedLink(self.env, links.down_bps),
                                                 SharedLink(self.env, links.up_bps))
        self.version, self.busy, self.aggregations = 0, set[int](), aggregations
        self.buffer: list[Started] = []
        self.ended: list[Started] = []
        self.aggregated = self.env.event()
        self.serving = False  # an aggregation is under way (server_s > 0)
        self.unlogged: dict[int, Started] = {}  # by id: the jobs started that no aggregation logged
        self.working: set[int] = set()  # the ids of those still at work
        self.open_slots = concurrency
        for _ in range(concurrency):
            self.env.process(self._slot())

    def next_aggregation(self) -> None:
        """Play on until the next aggregation has been folded in (`aggregate` was called); Stalled
        if every slot has closed first, or if none comes after `stall_runs` ended clients."""
        try:
            self.env.run(until=self.aggregated)
        except Halted as halted:
            raise halted.error from None
        except RuntimeError:  # SimPy: nothing left to play before the aggregation
            if self.open_slots:
                raise
            raise Stalled from None
        self.aggregated = self.env.event()

    def stop(self) -> list[Started]:
        """The run ends now: the jobs no aggregation logged (at work, waiting for the server, or
        stopped since the last aggregation), those at work cut here (their outcome's `stop_s`)."""
        for i in self.working:
            self.unlogged[i].outcome.stop_s = float(self.env.now)
        return list(self.unlogged.values())

    def _slot(self) -> Generator[simpy.Event, Any, None]:
        try:
            yield from self._work()
        except EdgeflError as error:
            raise Halted(error) from None

    def _work(self) -> Generator[simpy.Event, Any, None]:
        while True:
            job = self.pick(self.version, self.busy)
            if not isinstance(job, Started):
                if not math.isfinite(job):  # no free device comes online again: the slot closes
                    self.open_slots -= 1
                    return
                yield self.env.timeout(max(job - self.env.now, 0.0))
                continue
            job.version = self.version
            self.busy.add(job.client)
            self.unlogged[id(job)] = job
            self.working.add(id(job))
            net = None if self.links is None or job.transfer is None else Net(*self.links, job.transfer)
            off = self.avail.offline_at(job.client, float(self.env.now))
            yield start_client(self.env, job.phases, off, job.outcome, lambda _: None, net, job.drain)
            self.busy.discard(job.client)
            self.working.discard(id(job))
            self._ended(job)

    def _ended(self, job: Started) -> None:
        out = job.outcome
        out.staleness = self.version - job.version
        if out.status == COMPLETED and out.staleness > self.max_staleness:
            out.status = DROPPED
        self.heard(job)
        self.ended.append(job)
        if out.status == COMPLETED:
            self.buffer.append(job)
        if len(self.buffer) < self.size:
            if len(self.ended) >= stall_runs(self.size):
                raise Stalled(len(self.buffer))  # ends the SimPy run: the caller says why
        elif not self.serving:
            self._serve()
        elif len(self.ended) >= stall_runs(self.size):  # the server cannot keep up: uploads pile up
            raise Stalled(len(self.buffer), serving=True)

    def _serve(self) -> None:
        """Aggregate the first `buffer` uploads waiting: at once, or after the server's time (clients
        starting meanwhile download the version before). Uploads gone stale while they waited for
        the server are dropped first; with too few left, nothing is served yet; after the run's last
        aggregation, nothing more (uploads arriving at its instant wait: the run ends there)."""
        if self.version >= self.aggregations:
            return
        for job in self.buffer:  # staleness as of the aggregation that folds it in
            job.outcome.staleness = self.version - job.version
            if job.outcome.staleness > self.max_staleness:
                job.outcome.status = DROPPED
        self.buffer = [job for job in self.buffer if job.outcome.status == COMPLETED]
        if len(self.buffer) < self.size:
            return
        batch, self.buffer = self.buffer[:self.size], self.buffer[self.size:]
        waiting = {id(job) for job in self.buffer}  # logged with the aggregation that folds them
        ended = [job for job in self.ended if id(job) not in waiting]
        self.ended = [job for job in self.ended if id(job) in waiting]
        server = self.server_s()
        if server > 0:
            self.serving = True
            self.env.process(self._after(server, batch, ended))
        else:
            self._aggregate(batch, ended)

    def _after(self, server_s: float, batch: list[Started], ended: list[Started]
               ) -> Generator[simpy.Event, Any, None]:
        yield self.env.timeout(server_s)
        self.serving = False
        self._aggregate(batch, ended)
        if len(self.buffer) >= self.size:  # filled while the server worked
            self._serve()

    def _aggregate(self, batch: list[Started], ended: list[Started]) -> None:
        for job in ended:
            del self.unlogged[id(job)]
        self.fold(self.version, batch, ended)
        self.version += 1
        if not self.aggregated.triggered:  # two folds at one instant: the caller keeps both
            self.aggregated.succeed()
