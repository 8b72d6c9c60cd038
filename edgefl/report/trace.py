"""The per-client event log as a Chrome trace (the JSON Trace Event Format that Perfetto and
chrome://tracing open): one track per client, one complete event per download, data access,
compute, upload and wait, in simulated microseconds."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from edgefl.sim.engine import Span


def chrome_trace(spans: Sequence[Span], devices: Sequence[str]) -> dict[str, Any]:
    """Trace events for `spans`; `devices[k]` names client k's track."""
    names = [{"name": "thread_name", "ph": "M", "pid": 0, "tid": k, "args": {"name": f"client {k} ({d})"}}
             for k, d in enumerate(devices)]
    events = [{"name": s.phase, "cat": "round", "ph": "X", "pid": 0, "tid": s.client,
               "ts": s.start_s * 1e6, "dur": (s.end_s - s.start_s) * 1e6, "args": {"round": s.round}}
              for s in spans if s.end_s > s.start_s]
    return {"traceEvents": [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "fleet"}},
                            *names, *events], "displayTimeUnit": "ms"}
