"""A sync or deadline round on a living fleet, played in columns by one compiled event loop.

The round's clients run their phases back to back (download, data access, compute, upload; on the
server's shared links, each transfer's bytes then its latency) from the round's start. A client
stops where its device goes offline, where its battery runs out, or when the round closes: at
`deadline_s` (FedScale's deadline, Lai et al., OSDI 2021; the clients still working are `late`),
once `target` clients have uploaded (the rest `dropped`: over-commitment), or once every client has
stopped. The server's links share their bandwidth by water-filling among the transfers under way
(max-min fairness, Bertsekas & Gallager, "Data Networks", 1992, §6.5.2; edgefl.sim.links), O(log
n) an event: a virtual clock for the transfers at the level, heaps by cap and by end. A battery is
followed by a watcher: its empty moment is worked out at every change of phase, on a shared link
first bounded from below by the transfer's most costly pace `BOUNDS` times, then at every change of
the link's rates.

`play_round` is the implementation (its loop in edgefl.sim.round_loop): every clock value is worked
out as SimPy's clock adds it (an event `d` seconds after `now` falls at `now + d`), and events at
one instant run in the order SimPy runs them (an interrupt first, then in the order they were
scheduled; a watcher hears of a change once the step that made it is done). Instead of one SimPy
process, an offline interrupt and a battery watcher per client, the round is one loop over a heap of
events, compiled by Numba (its first call in a fresh checkout compiles it, then it is cached; an
async run's clients are played by the same loop: round_loop `Stream`, edgefl.sim.fedbuff): the
loop of a round of 65,000 clients of living-digits takes 0.6-1.2 s on this 2-core machine, against
30 s and more as SimPy processes (docs/benchmarks.md, "Shared links"); a battery watcher following a
link's rates is woken only when its battery could be empty before the link's next wake-up
(round_loop `_schedule`). The reference that plays the round as SimPy processes, against which it
is tested to the bit (random rounds, and whole runs of the bundled living scenarios), is in the
tests (tests/living_rounds.py `simpy_round`, tests/simpy_clients.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from edgefl.sim.availability import Availability
from edgefl.sim.clients import COMPLETED, Drains, Transfers
from edgefl.sim.engine import Federation
from edgefl.sim.links import Links


@dataclass(frozen=True)
class LiveRound:
    """How a round went: when it started, closed (before the server's time) and ended; each client's
    status (edgefl.sim.clients STATUSES) and stop (its upload's end, or its interrupt), and its
    transfers' seconds on the shared links (n, 2: down, up; NaN where it has none: never started,
    or the links not shared)."""

    start_s: float
    close_s: float
    end_s: float
    status: np.ndarray
    stop_s: np.ndarray
    transfer_s: np.ndarray


def play_round(fed: Federation, clients: np.ndarray, phases: np.ndarray, avail: Availability, target: int,
               deadline_s: float, server_s: float | Callable[[np.ndarray], float],
               shared: tuple[Links, Transfers] | None = None, drains: Drains | None = None) -> LiveRound:
    """One round of `clients` (their phase seconds alone, (n, 4)) from now: closed at `deadline_s`
    (inf: none), once `target` clients have uploaded, or once every client has stopped; then the
    server spends `server_s` (or `server_s(the clients whose uploads count)`, asked at the close).
    With `shared` (the server's links, the clients' transfers) downloads and uploads share the
    links; with `drains`, a client whose battery runs out stops there."""
    n, start = len(clients), fed.now
    off = avail.offline_many(np.asarray(clients, dtype=np.int64), start)
    t = shared[1] if shared is not None else Transfers.none(n)
    b = drains if drains is not None else Drains.none(n)
    capacity = (shared[0].down_bps, shared[0].up_bps) if shared is not None else (math.inf, math.inf)
    b = replace(b, on=b.on & could_run_out(phases, t, b, shared is not None, deadline_s))
    from edgefl.sim import round_loop  # here: Numba's import costs a plain fleet's run 0.1 GB and time

    status, stop, transfer, close = round_loop.play(phases, off, t, b, capacity, shared is not None, start,
                                                    target, deadline_s)
    fed.reach(float(close))
    counted = np.asarray(clients)[status == COMPLETED]
    fed.wait(server_s(counted) if callable(server_s) else server_s)
    return LiveRound(start, float(close), fed.now, status, stop, transfer)


def could_run_out(phases: np.ndarray, t: Transfers, b: Drains, shared: bool, deadline_s: float) -> np.ndarray:
    """Which clients' batteries could run out in the round: the rest are not followed (their
    watchers' events change nothing, and leave the order of the others' as it was). A battery runs
    out only once the work has spent what it holds; by the round's last moment (its deadline, or,
    off shared links, the client's last phase's end) the work has spent at most its spread joules,
    its bytes' joules and, each second, its costliest phase's watts (data access and compute last
    their seconds, transfers the rest). Where that bound is not finite and non-negative, or held
    within a millionth of it, the battery is followed."""
    last = np.full(len(phases), deadline_s) if shared else np.minimum(deadline_s, phases.sum(axis=1))
    moving = np.maximum(b.watts[:, 0], b.watts[:, 3])
    busy = (np.maximum(b.watts[:, 1:3] - moving[:, None], 0.0) * phases[:, 1:3]).sum(axis=1)
    bound = (np.multiply(moving, last, out=np.zeros(len(last)), where=moving > 0) + busy
             + b.spread.sum(axis=1) + (b.per_byte * t.nbytes).sum(axis=1))
    known = (np.isfinite(bound) & (b.watts >= 0).all(axis=1) & (b.spread >= 0).all(axis=1)
             & (b.per_byte >= 0).all(axis=1) & (t.nbytes >= 0).all(axis=1))
    return ~(known & (b.held_j > bound * (1 + 1e-6) + 1e-6))
