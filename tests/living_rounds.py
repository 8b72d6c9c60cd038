"""A living round's two players, for the tests: `simpy_round`, the reference, plays each client as
SimPy processes (tests/simpy_clients.py: its phases, an interrupt at its going offline, a watcher of
its battery), as edgefl played every sync and deadline round on a living fleet before its columns;
`play_round` is the implementation (edgefl.sim.living_round) behind the same call. Both take the
round as jobs (client, phase seconds), `Transfer`s and `Drain`s, and give a `LiveRound` of
`Outcome`s."""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy
from simpy_clients import Net, SharedLink, start_client

from edgefl.sim import living_round
from edgefl.sim.availability import Availability
from edgefl.sim.clients import DROPPED, LATE, Drain, Drains, Outcome, Transfer, Transfers
from edgefl.sim.engine import Federation
from edgefl.sim.links import Links

ServerS = float | Callable[[list[int]], float]


@dataclass
class LiveRound:
    start_s: float
    close_s: float  # when the round closed (before the server's time)
    end_s: float
    outcomes: list[Outcome]


def play_round(fed: Federation, jobs: Sequence[tuple[int, Sequence[float]]], avail: Availability,
               target: int, deadline_s: float, server_s: ServerS,
               shared: tuple[Links, Sequence[Transfer]] | None = None,
               drains: Sequence[Drain | None] | None = None) -> LiveRound:
    """The round played by edgefl.sim.living_round (`simpy_round`'s call)."""
    clients = np.array([k for k, _ in jobs], dtype=np.int64)
    phases = np.array([list(p) for _, p in jobs], dtype=np.float64).reshape(-1, 4)
    n = len(jobs)
    transfers = None if shared is None else Transfers(
        np.array([[t.down_bytes, t.up_bytes] for t in shared[1]]).reshape(-1, 2),
        np.array([[t.down_bps, t.up_bps] for t in shared[1]]).reshape(-1, 2),
        np.array([t.latency_s for t in shared[1]], dtype=np.float64))
    batteries = None
    if drains is not None:
        rows = [d or Drain(0.0, (0.0,) * 4, (0.0,) * 4, (0.0, 0.0)) for d in drains]
        batteries = Drains(np.array([d is not None for d in drains], dtype=bool).reshape(n),
                           np.array([d.held_j for d in rows], dtype=np.float64),
                           np.array([d.watts for d in rows], dtype=np.float64).reshape(-1, 4),
                           np.array([d.spread for d in rows], dtype=np.float64).reshape(-1, 4),
                           np.array([d.per_byte for d in rows], dtype=np.float64).reshape(-1, 2),
                           np.array([d.from_s for d in rows], dtype=np.float64),
                           np.array([d.until_s for d in rows], dtype=np.float64))
    seconds = server_s if not callable(server_s) else (lambda counted: server_s(counted.tolist()))
    r = living_round.play_round(fed, clients, phases, avail, target, deadline_s, seconds,
                                None if transfers is None else (shared[0], transfers), batteries)
    outcomes = [Outcome(int(k), int(r.status[i]), float(r.stop_s[i]), 0, float(r.transfer_s[i, 0]),
                        float(r.transfer_s[i, 1])) for i, k in enumerate(clients.tolist())]
    return LiveRound(r.start_s, r.close_s, r.end_s, outcomes)


def simpy_round(fed: Federation, jobs: Sequence[tuple[int, Sequence[float]]], avail: Availability,
                target: int, deadline_s: float, server_s: ServerS,
                shared: tuple[Links, Sequence[Transfer]] | None = None,
                drains: Sequence[Drain | None] | None = None) -> LiveRound:
    """One round of `jobs` (client, phase seconds): closed at `deadline_s` (inf: none), once `target`
    clients have uploaded, or once every client has stopped; then the server spends `server_s` (or
    `server_s(the clients whose uploads count)`, asked at the close).
    With `shared` (the server's links, each job's transfers) downloads and uploads share the links
    (their seconds in each Outcome); with `drains`, a client whose battery runs out stops there."""
    env = fed.env
    nets: list[Net | None] = [None] * len(jobs)
    if shared is not None:
        down, up = SharedLink(env, shared[0].down_bps), SharedLink(env, shared[0].up_bps)
        nets = [Net(down, up, t) for t in shared[1]]
    result: list[LiveRound] = []

    def round_() -> Generator[simpy.Event, Any, None]:
        start = float(env.now)
        outcomes = [Outcome(k) for k, _ in jobs]
        enough, counted = env.event(), list[int]()

        def reported(o: Outcome) -> None:
            if len(counted) >= target:
                o.status = DROPPED
                return
            counted.append(o.client)
            if len(counted) == target:
                enough.succeed()

        batteries = [None] * len(jobs) if drains is None else drains
        offs = avail.offline_many(np.array([k for k, _ in jobs], dtype=np.int64), start).tolist()
        procs = [start_client(env, phases, off, o, reported, net, drain) for (_, phases), off, o, net, drain
                 in zip(jobs, offs, outcomes, nets, batteries, strict=True)]
        ends: list[simpy.Event] = [simpy.AllOf(env, procs), enough]
        if math.isfinite(deadline_s):
            ends.append(env.timeout(deadline_s))
        yield simpy.AnyOf(env, ends)
        cause = DROPPED if enough.triggered else LATE
        for p in procs:
            if p.is_alive:
                p.interrupt(cause)
        close = float(env.now)
        yield env.timeout(server_s(counted) if callable(server_s) else server_s)
        result.append(LiveRound(start, close, float(env.now), outcomes))

    env.run(until=env.process(round_()))
    return result[0]




def simpy_columns(fed: Federation, clients: np.ndarray, phases: np.ndarray, avail: Availability,
                  target: int, deadline_s: float, server_s: float | Callable[[np.ndarray], float],
                  shared: tuple[Links, Transfers] | None = None,
                  drains: Drains | None = None) -> living_round.LiveRound:
    """edgefl.sim.living_round `play_round`'s call played by the reference (`simpy_round`), for
    whole runs on it (monkeypatch edgefl.experiment.living's `play_round`)."""
    n = len(clients)
    jobs = [(int(k), tuple(phases[i].tolist())) for i, k in enumerate(clients.tolist())]
    seconds = server_s if not callable(server_s) else (
        lambda counted: server_s(np.array(counted, dtype=np.int64)))
    r = simpy_round(fed, jobs, avail, target, deadline_s, seconds,
                    None if shared is None else (shared[0], [shared[1].row(i) for i in range(n)]),
                    None if drains is None else [drains.row(i) for i in range(n)])
    o = r.outcomes
    transfer_s = np.array([[x.download_s, x.upload_s] for x in o], dtype=np.float64).reshape(n, 2)
    status = np.array([x.status for x in o], dtype=np.int64)
    return living_round.LiveRound(r.start_s, r.close_s, r.end_s, status,
                                  np.array([x.stop_s for x in o], dtype=np.float64), transfer_s)
