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
    """Keeps the simulated clock across rounds; `play` advances it by one round."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.env = simpy.Environment(initial_time=start_s)

    @property
    def now(self) -> float:
        return float(self.env.now)

    def reach(self, t: float) -> None:
        """Move the clock on to `t`, exactly (a round played in columns closed there: SimPy would
        add t - now to now, which can round away from t)."""
        self.env.run(until=self.env.timeout(t - self.now))
        self.env._now = t

    def play(self, down: np.ndarray, access: np.ndarray, compute: np.ndarray, up: np.ndarray,
             server_s: float = 0.0) -> tuple[float, np.ndarray, float]:
        """Play one round in bulk from its clients' phase seconds: (start, finish times, the
        straggler's end); the server then spends `server_s`."""
        start = self.now
        delays = busy_end(start, down, access, compute, up) - start
        self.env.run(until=self.env.timeout(float(delays.max())))
        last = self.now
        self.env.run(until=self.env.timeout(server_s))
        return start, start + delays, last  # as SimPy's clock adds a client's timeout


def busy_end(start: Any, *phases: Any) -> Any:
    """When a client starting at `start` ends its phases, summed phase by phase (floats or arrays)."""
    for seconds in phases:
        start = start + seconds
    return start
