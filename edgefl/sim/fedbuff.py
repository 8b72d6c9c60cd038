"""FedBuff's server and client slots (Nguyen et al., "Federated Learning with Buffered Asynchronous
Aggregation", AISTATS 2022, Alg. 1), for async rounds on a living fleet.

`concurrency` clients work at once, a new one starts as one ends; each downloads the current model
version; the server aggregates every `buffer` uploads, each weighted by s(tau) = 1 / sqrt(1 + tau),
tau its staleness (aggregations since its download; the paper's polynomial staleness scaling, §5,
with exponent 1/2), and drops uploads with tau > `max_staleness` (status `dropped`). The server
aggregates one buffer at a time, for `server_s` each: uploads that arrive meanwhile wait for it, in
arrival order, `buffer` at a time, their staleness checked again when their aggregation starts (a
server slower than the uploads drops the backlog as it ages). `Buffered` plays it; what a client
trains and what an aggregation does are the caller's (edgefl.experiment.async_rounds).

The clients are played by the compiled loop of a living round (edgefl.sim.round_loop `Stream`, a
row a slot): their phases, shared links, offline moments and batteries follow the same rules, in one
implementation. The slots and the server are Python, stepped by the loop's reports: the order of
events at one instant is SimPy's, as the slots were SimPy processes before (their reference, which
plays each client as SimPy processes, is in the tests: tests/simpy_clients.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from edgefl.sim.availability import Availability
from edgefl.sim.clients import COMPLETED, DROPPED, Drain, Outcome, Transfer
from edgefl.sim.engine import Federation
from edgefl.sim.links import Links


def staleness_weight(tau: int) -> float:
    """FedBuff's s(tau) = 1 / sqrt(1 + tau)."""
    return 1 / math.sqrt(1 + tau)


STALL_ENDED = 10_000  # async: max(this, 20 x buffer) clients ended and no aggregation: none will come


def stall_runs(buffer: int) -> int:
    """How many clients may end between two aggregations before an async run counts as stalled: at
    least 10,000, and 20 per buffered update (fewer than 5 % of the clients bring an update)."""
    return max(STALL_ENDED, 20 * buffer)


class Stalled(Exception):
    """No next aggregation: every async slot closed (no device comes online again; `arrived` is
    None), or `stall_runs` clients ended since the last one with only `arrived` of the buffer's
    updates in, or (`serving`) while the server still worked on it."""

    def __init__(self, arrived: int | None = None, serving: bool = False) -> None:
        super().__init__(arrived, serving)  # every field in args: an exception is remade from them
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
    """FedBuff's server and client slots (see the module docstring), the clients played by the
    compiled loop of a living round (edgefl.sim.round_loop `Stream`, a row a slot; the reference
    that plays each as SimPy processes is in the tests, tests/simpy_clients.py).

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
        from edgefl.sim.round_loop import Stream  # here: Numba's import costs a plain fleet's run 0.1 GB

        self.fed, self.avail = fed, avail
        self.size, self.max_staleness = buffer, max_staleness
        self.pick, self.fold, self.server_s, self.heard = pick, aggregate, server_s, ended
        capacity = (math.inf, math.inf) if links is None else (links.down_bps, links.up_bps)
        self.stream = Stream(concurrency, capacity, links is not None, fed.now)
        self.version, self.busy, self.aggregations = 0, set[int](), aggregations
        self.buffer: list[Started] = []
        self.ended: list[Started] = []
        self.serving: tuple[list[Started], list[Started]] | None = None  # the aggregation under way
        self.folded = False
        self.unlogged: dict[int, Started] = {}  # by id: the jobs started that no aggregation logged
        self.slots: list[Started | None] = [None] * concurrency  # the job at work in each
        self.begun = False  # the slots pick their first clients when first played

    def next_aggregation(self) -> None:
        """Play on until the next aggregation has been folded in (`aggregate` was called); Stalled
        if every slot has closed first, or if none comes after `stall_runs` ended clients."""
        self._open()
        self.folded = False
        while not self.folded:
            report = self.stream.step()
            if report is None:  # nothing left to play: every slot has closed
                raise Stalled
            if self.stream.now != self.fed.now:
                self.fed.reach(self.stream.now)
            ended, arg = report
            if ended:
                self._finished(arg)
            elif arg == len(self.slots):  # the server's timer
                self._served()
            else:
                self._next(arg)

    def stop(self) -> list[Started]:
        """The run ends now: the jobs no aggregation logged (at work, waiting for the server, or
        stopped since the last aggregation), those at work cut here as a round's close cuts its
        clients (`Stream.cut`: their outcome's `stop_s` now, a transfer under way on the shared links
        the seconds it would take at its pace), their status kept completed. Nothing plays after."""
        working = [(slot, job) for slot, job in enumerate(self.slots) if job is not None]
        for slot, _ in working:
            self.stream.cut(slot)
        if working:
            self.stream.step()  # the cuts played: the report, a cut client's end, goes unheard
        for slot, job in working:
            out = job.outcome
            out.status, out.stop_s, out.download_s, out.upload_s = self.stream.ended(slot)
        return list(self.unlogged.values())

    def _open(self) -> None:
        """The slots pick their first clients, when the run is first played."""
        if not self.begun:
            self.begun = True
            for slot in range(len(self.slots)):
                self._next(slot)

    def _next(self, slot: int) -> None:
        """The slot starts its next client, or waits until one comes online (or closes: never)."""
        job = self.pick(self.version, self.busy)
        if not isinstance(job, Started):
            if math.isfinite(job):  # else no free device comes online again: the slot closes
                self._wait(slot, max(job - self.fed.now, 0.0))
            return
        job.version = self.version
        self.busy.add(job.client)
        self.unlogged[id(job)] = job
        self.slots[slot] = job
        self._play(slot, job, self.avail.offline_at(job.client, self.fed.now))

    def _play(self, slot: int, job: Started, off: float) -> None:
        """The slot's client starts its work now; its device goes offline at `off`."""
        self.stream.start(slot, inputs(job, off), job.drain is not None)

    def _wait(self, slot: int, delay_s: float) -> None:
        """The slot picks again `delay_s` from now."""
        self.stream.timer(delay_s, slot)

    def _after(self, server_s: float) -> None:
        """The aggregation under way is folded in `server_s` from now."""
        self.stream.timer(server_s, len(self.slots))

    def _finished(self, slot: int) -> None:
        """The slot's client ended, as the stream reports."""
        job = self.slots[slot]
        assert job is not None
        job.outcome.status, job.outcome.stop_s, job.outcome.download_s, job.outcome.upload_s = \
            self.stream.ended(slot)
        self._done(slot)

    def _done(self, slot: int) -> None:
        """The slot's client ended (its outcome filled): heard, then the slot's next."""
        job, self.slots[slot] = self.slots[slot], None
        assert job is not None
        self.busy.discard(job.client)
        self._ended(job)
        self._next(slot)

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
                raise Stalled(len(self.buffer))  # the caller says why
        elif self.serving is None:
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
            self.serving = batch, ended
            self._after(server)
        else:
            self._aggregate(batch, ended)

    def _served(self) -> None:
        assert self.serving is not None
        (batch, ended), self.serving = self.serving, None
        self._aggregate(batch, ended)
        if len(self.buffer) >= self.size:  # filled while the server worked
            self._serve()

    def _aggregate(self, batch: list[Started], ended: list[Started]) -> None:
        for job in ended:
            del self.unlogged[id(job)]
        self.fold(self.version, batch, ended)
        self.version += 1
        self.folded = True  # two folds at one instant: the caller keeps both


def inputs(job: Started, off: float) -> list[float]:
    """A job's row of the compiled loop (edgefl.sim.round_loop `Stream.start`): its phases, its
    offline moment, its transfers (none: no bytes) and its battery (none: nothing held, never
    followed)."""
    t = job.transfer or Transfer(0.0, 0.0, 1.0, 1.0, 0.0)
    d = job.drain or Drain(0.0, (0.0,) * 4, (0.0,) * 4, (0.0, 0.0))
    return [*job.phases, off, t.down_bytes, t.up_bytes, t.down_bps, t.up_bps, t.latency_s, d.held_j,
            *d.watts, *d.spread, *d.per_byte, d.from_s, d.until_s]
