"""The SimPy engine: a synchronous round ends at the last upload, then the server works.

Each client downloads, reads/swaps, computes and uploads, back to back, since nothing else runs on
it; the round waits for all of them (the straggler decides the round time), then spends the server's
time. Waiting is what a client idles until the round ends.

`play` takes the round's costs as arrays, computes every client's finish time in one pass, exactly
as SimPy's clock adds it, and waits once for the straggler: a fleet's round costs one event, not one
process per client. The reference that plays one SimPy process per client, which the arrays are
tested against, is in the tests (tests/reference.py).

`play` is the one timing of a plain fleet's round (always online, on mains; on shared links it is
given the seconds the transfers took there, played by the compiled loop: edgefl.sim.links
`shared_round`). The compiled loop of a living round (edgefl.sim.living_round) would time the same
round event by event, to within one spacing of each finish (SimPy adds a client's whole delay to
the clock: start + (S - start), not S), for 135 times the cost (1.0 s against 7 ms at 100,000
clients on this 2-core machine); tests/test_engine.py holds the two together over random rounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import simpy

PHASES = ("download", "data_access", "compute", "upload")


@dataclass(frozen=True, slots=True)
class Span:
    round: int
    client: int
    phase: str
    start_s: float
    end_s: float


class Federation:
    """Keeps the simulated clock across rounds, through SimPy's public calls alone: `play` advances
    it by one round, `wait` by a span, `reach` to a moment. `env`, its SimPy environment, is the
    tests' references' (one SimPy process per client, tests/reference.py); the package never
    reaches into it."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.env = simpy.Environment(initial_time=start_s)

    @property
    def now(self) -> float:
        return float(self.env.now)

    def wait(self, seconds: float) -> None:
        """Move the clock on by `seconds`, as SimPy adds a timeout (now + seconds)."""
        self.env.run(until=self.env.timeout(seconds))

    def reach(self, t: float) -> None:
        """Move the clock on to `t` (not before now), exactly: a round played in columns closed
        there. SimPy stops `run(until=t)` at now + (t - now), which is t whenever now >= t / 2 (t -
        now is then exact, Sterbenz's lemma); from further back the clock stops first at about 3t/4."""
        if t == self.now:
            return
        if self.now < t / 2:
            self.env.run(until=0.75 * t)
        self.env.run(until=t)

    def play(self, down: np.ndarray, access: np.ndarray, compute: np.ndarray, up: np.ndarray,
             server_s: float = 0.0) -> tuple[float, np.ndarray, float]:
        """Play one round in bulk from its clients' phase seconds: (start, finish times, the
        straggler's end); the server then spends `server_s`."""
        start = self.now
        delays = busy_end(start, down, access, compute, up) - start
        self.wait(float(delays.max()))
        last = self.now
        self.wait(server_s)
        return start, start + delays, last  # as SimPy's clock adds a client's timeout


def busy_end(start: Any, *phases: Any) -> Any:
    """When a client starting at `start` ends its phases, summed phase by phase (floats or arrays)."""
    for seconds in phases:
        start = start + seconds
    return start
