"""FedBuff's slots and server (edgefl.sim.fedbuff `Buffered`, its clients played by the compiled loop
of edgefl.sim.round_loop) against the reference that plays each client as SimPy processes
(tests/simpy_clients.py `SimpyBuffered`): random runs (24) with devices going offline, batteries running
out, shared links, a server that takes time and stale uploads end alike to the bit."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np
import pytest
from simpy_clients import SimpyBuffered

from edgefl.sim.availability import Availability, Diurnal
from edgefl.sim.clients import Drain, Transfer
from edgefl.sim.engine import Federation
from edgefl.sim.fedbuff import Buffered, Stalled, Started
from edgefl.sim.links import Links

DEVICES = 12


def picker(seed: int, fed: Federation, avail: Availability, batteries: bool, links: bool
           ) -> Any:
    """A pick of the `calls`-th start, drawn from (seed, calls): a device online and idle, with
    random phases (some of no seconds), transfers and battery; or, none online, when one is."""
    calls = [0]

    def pick(version: int, busy: set[int]) -> Started | float:
        rng = np.random.default_rng([seed, calls[0]])
        calls[0] += 1
        free = np.array([k for k in range(DEVICES) if k not in busy], dtype=np.int64)
        online = free[avail.online_many(free, fed.now)]
        if not len(online):
            return min((avail.online_at(int(k), fed.now) for k in free), default=math.inf)
        phases = tuple(float(x) for x in rng.exponential(40.0, 4) * (rng.random(4) < 0.85))
        transfer = Transfer(*(float(x) for x in rng.uniform(1e4, 4e5, 2)),
                            *(float(x) for x in rng.uniform(5e3, 5e4, 2)), float(rng.uniform(0, 0.5))
                            ) if links else None
        drain = Drain(float(rng.uniform(5, 400)), tuple(float(x) for x in rng.uniform(0, 3, 4)),
                      tuple(float(x) for x in rng.uniform(0, 5, 4)), (float(rng.uniform(0, 1e-4)),) * 2,
                      float(rng.uniform(0, 30)), float(rng.choice([math.inf, rng.uniform(30, 300)]))
                      ) if batteries and rng.random() < 0.7 else None
        return Started(int(rng.choice(online)), phases, fed.now, transfer, drain)  # its start, as payload
    return pick


@functools.cache
def played(kind: type, seed: int, folds: int = 8) -> list[Any]:
    """Each fold of a random run of `folds` aggregations (its version, the batch's and the window's
    clients with their outcomes, and the clock), then the jobs the run's end gives (each with its
    start)."""
    rng = np.random.default_rng(seed)
    fed = Federation()
    avail = Diurnal(seed=seed, start_h=0.0, hours=float(rng.uniform(0.05, 0.3)), spread_h=24.0)
    batteries, links = bool(rng.random() < 0.7), bool(rng.random() < 0.7)
    server = float(rng.choice([0.0, rng.uniform(1, 60)]))
    log: list[Any] = []

    def fold(version: int, batch: list[Started], ended: list[Started]) -> None:
        log.append((version, fed.now, [j.client for j in batch],
                    [(j.client, repr(j.outcome)) for j in ended]))

    heard: list[Any] = []
    b = kind(fed, avail, int(rng.integers(1, 6)), int(rng.integers(1, 4)), int(rng.integers(0, 3)),
             picker(seed, fed, avail, batteries, links), fold, lambda: server,
             lambda j: heard.append((fed.now, j.client, j.outcome.status)),
             Links(float(rng.uniform(2e4, 2e5)), float(rng.uniform(2e4, 2e5))) if links else None)
    try:
        for _ in range(folds):
            b.next_aggregation()
    except Stalled as stalled:
        log.append(("stalled", stalled.arrived, stalled.serving))
    return [*log, heard, sorted((j.client, j.payload, repr(j.outcome)) for j in b.stop()), fed.now]


SEEDS = range(24)


@pytest.mark.slow
@pytest.mark.parametrize("seed", SEEDS)
def test_fedbuff_plays_as_its_simpy_reference(seed: int) -> None:
    assert played(Buffered, seed) == played(SimpyBuffered, seed)


CUT_SEEDS = range(24)


@pytest.mark.parametrize("seed", CUT_SEEDS)
def test_a_run_s_end_cuts_its_clients_at_work_as_its_simpy_reference(seed: int) -> None:
    """The same runs ended at their second aggregation, where more clients are at work: each is cut
    there (a transfer under way noting the seconds it would take at its pace) alike to the bit."""
    assert played(Buffered, seed, 2) == played(SimpyBuffered, seed, 2)


def cut_midway(seed: int) -> int:
    """How many of the jobs the end of run `seed` (two aggregations) gives were cut in their download:
    at work at the end, their download seconds at its pace outlast it."""
    *_, ends, now = played(Buffered, seed, 2)
    down = [(start, float(o.split("download_s=")[1].split(",")[0])) for _, start, o in ends
            if f"stop_s={now!r}," in o and "status=0," in o]
    return sum(start + seconds > now for start, seconds in down)


def test_the_random_runs_meet_what_they_test() -> None:
    """The runs above stop clients offline, drop stale uploads, share links, and their ends cut
    transfers under way (not vacuous)."""
    statuses = set()
    for seed in SEEDS:
        for entry in played(Buffered, seed)[:-3]:
            if entry[0] != "stalled":
                statuses |= {o.split("status=")[1].split(",")[0] for _, o in entry[3]}
    assert statuses == {"0", "1", "3"}  # completed, dropped (stale), offline
    assert sum(cut_midway(seed) for seed in CUT_SEEDS) >= 2  # the ends above cut transfers under way
