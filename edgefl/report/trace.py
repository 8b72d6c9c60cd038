"""The per-client event log as a Chrome trace (the JSON Trace Event Format that Perfetto and
chrome://tracing open): one track per client, one complete event per download, data access,
compute, upload and wait, in simulated microseconds. On a living fleet (edgefl.sim.clients) a client
stopped early shows an instant event named after its status (offline, late, dropped) where it
stopped.

A fleet's trace would grow with rounds x clients, so a run's trace shows a bounded sample of clients:
all of them when the fleet has at most `output.trace_clients`, else that many drawn without replacement
from the scenario seed (its own random stream, so the sample does not change the run's draws). The
sample's spans are kept as they happen; events.csv / events.parquet hold every client's spans.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from edgefl.devices.pool import TRACE, rng
from edgefl.runlog import Columns, cells
from edgefl.sim.clients import STATUSES
from edgefl.sim.engine import Span


def chrome_trace(spans: Sequence[Span], devices: Sequence[str],
                 clients: Iterable[int] | None = None) -> dict[str, Any]:
    """Trace events for `spans`; `devices[k]` names client k's track, for each of `clients` (all)."""
    shown = range(len(devices)) if clients is None else clients
    names = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": k,
              "args": {"name": f"client {k} ({devices[k]})"}} for k in shown]
    events = [{"name": s.phase, "cat": "round", "ph": "X", "pid": 0, "tid": s.client,
               "ts": s.start_s * 1e6, "dur": (s.end_s - s.start_s) * 1e6, "args": {"round": s.round}}
              for s in spans if s.end_s > s.start_s]
    events += [{"name": s.phase, "cat": "status", "ph": "i", "s": "t", "pid": 0, "tid": s.client,
                "ts": s.start_s * 1e6, "args": {"round": s.round}} for s in spans if s.phase in STATUSES]
    return {"traceEvents": [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "fleet"}},
                            *names, *events], "displayTimeUnit": "ms"}


def trace_sample(clients: int, keep: int, seed: int) -> list[int]:
    """The clients a trace shows: all of a fleet of at most `keep`, else `keep` of them, seeded."""
    if clients <= keep:
        return list(range(clients))
    return sorted(int(k) for k in rng(seed, TRACE).choice(clients, size=keep, replace=False))


class TraceSample:
    """The spans of a sample of clients, kept as they happen."""

    def __init__(self, clients: int, keep: int, seed: int) -> None:
        self.clients = trace_sample(clients, keep, seed)
        self.kept = set(self.clients)
        self.spans: list[Span] = []

    def add(self, spans: Iterable[Span]) -> None:
        self.spans.extend(s for s in spans if s.client in self.kept)

    def add_columns(self, events: Columns) -> None:
        """The sample's spans among a round's events, given as columns."""
        rows = np.flatnonzero(np.isin(events["client"], self.clients))
        picked = [cells(events[c], rows) for c in ("round", "client", "phase", "start_s", "end_s")]
        self.spans.extend(Span(*x) for x in zip(*picked, strict=True))

    def trace(self, devices: Sequence[str]) -> dict[str, Any]:
        return chrome_trace(self.spans, devices, self.clients)
