"""The SimPy engine: a synchronous round ends at the last upload, then the server works.

Each client downloads, reads/swaps, computes and uploads, back to back, since nothing else runs on
it; the round waits for all of them (the straggler decides the round time), then spends the server's
time. Waiting is what a client idles until the round ends.

Two paths play a round with the same times, to the bit. `play` (the bulk path) takes the round's
costs as arrays, computes every client's finish time in one pass, exactly as SimPy's clock adds it,
and waits once for the straggler: a fleet's round costs one event, not one process per client.
`run_round` (the per-client path) runs one SimPy process per client; it is the reference the bulk
path is tested against.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import simpy

from edgefl.devices.pool import DeviceState
from edgefl.sim.cost import ClientCost

PHASES = ("download", "data_access", "compute", "upload")
Job = tuple[int, DeviceState, ClientCost]  # (client, its state this round, its cost)


@dataclass(frozen=True, slots=True)
class Span:
    round: int
    client: int
    phase: str
    start_s: float
    end_s: float


@dataclass(slots=True)
class ClientRecord:
    round: int
    client: int
    state: DeviceState
    cost: ClientCost
    finish_s: float = 0.0
    wait_s: float = 0.0


@dataclass
class RoundRecord:
    round: int
    start_s: float
    end_s: float  # after the server's time
    server_s: float
    clients: list[ClientRecord] = field(default_factory=list)


class Federation:
    """Keeps the simulated clock across rounds; `run_round` advances it by one round."""

    def __init__(self, start_s: float = 0.0) -> None:
        self.env = simpy.Environment(initial_time=start_s)

    @property
    def now(self) -> float:
        return float(self.env.now)

    def run_round(self, round_: int, jobs: list[Job], server_s: float = 0.0) -> RoundRecord:
        """Play one round; the server then spends `server_s` (aggregation, distillation)."""
        process = self.env.process(self._round(round_, jobs, server_s))
        self.env.run(until=process)
        assert isinstance(process.value, RoundRecord)
        return process.value

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

    def _round(
        self, round_: int, jobs: list[Job], server_s: float
    ) -> Generator[simpy.Event, Any, RoundRecord]:
        start = self.now
        records = [ClientRecord(round_, k, state, cost) for k, state, cost in jobs]
        yield simpy.AllOf(self.env, [self.env.process(self._client(r)) for r in records])
        last = self.now
        for r in records:
            r.wait_s = last - r.finish_s
        yield self.env.timeout(server_s)
        return RoundRecord(round_, start, self.now, server_s, records)

    def _client(self, r: ClientRecord) -> Generator[simpy.Event, Any, None]:
        """The phases run back to back on the client alone, so one timeout covers them all."""
        c = r.cost
        yield self.env.timeout(busy_end(self.now, c.download_s, c.data_access_s, c.compute_s,
                                        c.upload_s) - self.now)
        r.finish_s = self.now


def busy_end(start: Any, *phases: Any) -> Any:
    """When a client starting at `start` ends its phases, summed phase by phase (floats or arrays)."""
    for seconds in phases:
        start = start + seconds
    return start
