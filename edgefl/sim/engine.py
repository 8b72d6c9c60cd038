"""The SimPy engine: one process per selected client, a synchronous round ends at the last upload.

Each client process downloads, reads/swaps, computes and uploads (one span per phase, one timeout
for the lot, since nothing else runs on the client). The round process waits for all of them (the
straggler decides the round time), then spends the server's time. Waiting is what a client idles
until the round ends.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from edgefl.devices.pool import DeviceState
from edgefl.sim.cost import ClientCost

PHASES = ("download", "data_access", "compute", "upload")
Job = tuple[int, DeviceState, ClientCost]  # (client, its state this round, its cost)


@dataclass(frozen=True)
class Span:
    round: int
    client: int
    phase: str
    start_s: float
    end_s: float


@dataclass
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

    @property
    def duration_s(self) -> float:
        return self.end_s - self.start_s

    @property
    def straggler(self) -> ClientRecord:
        return max(self.clients, key=lambda c: c.finish_s)


class Federation:
    """Keeps the simulated clock across rounds; `run_round` advances it by one round."""

    def __init__(self, start_s: float = 0.0, spans: list[Span] | None = None) -> None:
        self.env = simpy.Environment(initial_time=start_s)
        self.spans: list[Span] = spans or []

    @property
    def now(self) -> float:
        return float(self.env.now)

    def run_round(self, round_: int, jobs: list[Job], server_s: float = 0.0) -> RoundRecord:
        """Play one round; the server then spends `server_s` (aggregation, distillation)."""
        process = self.env.process(self._round(round_, jobs, server_s))
        self.env.run(until=process)
        assert isinstance(process.value, RoundRecord)
        return process.value

    def _round(
        self, round_: int, jobs: list[Job], server_s: float
    ) -> Generator[simpy.Event, Any, RoundRecord]:
        start = self.now
        records = [ClientRecord(round_, k, state, cost) for k, state, cost in jobs]
        yield simpy.AllOf(self.env, [self.env.process(self._client(r)) for r in records])
        last = self.now
        for r in records:
            r.wait_s = last - r.finish_s
            if r.wait_s > 0:
                self.spans.append(Span(round_, r.client, "wait", r.finish_s, last))
        yield self.env.timeout(server_s)
        return RoundRecord(round_, start, self.now, server_s, records)

    def _client(self, r: ClientRecord) -> Generator[simpy.Event, Any, None]:
        """The phases run back to back on the client alone, so one timeout covers them all."""
        c, start = r.cost, self.now
        for phase, seconds in zip(PHASES, (c.download_s, c.data_access_s, c.compute_s,
                                           c.upload_s), strict=True):
            self.spans.append(Span(r.round, r.client, phase, start, start + seconds))
            start += seconds
        yield self.env.timeout(start - self.now)
        r.finish_s = self.now
