"""A Flower run's edgefl run folder: the files `edgefl run` writes, so `edgefl plot` and `edgefl report`
read a Flower run unchanged.

The folder is claimed and marked as `edgefl run` claims one (edgefl.experiment `prepare_out`, the
run marker with the scenario's fingerprint), with `scenario.toml` (the resolved scenario); each
round appends `metrics.csv`'s row and the clients' rows of `clients.csv` and `events.csv` with
edgefl's own renderers (edgefl.experiment.rounds `metrics_row`, `client_columns`,
`event_columns`); the end writes `trace.json` and `summary.json`. Beside edgefl's columns,
`clients.csv` has `status` (on every fleet) and `reason` (why a node was dropped: its ClientApp's
error), and `metrics.csv` the count of each status.
"""

from __future__ import annotations

import json
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from edgefl import rundir
from edgefl.experiment.loop import prepare_out
from edgefl.experiment.rounds import RoundTable, client_columns, event_columns, metrics_row
from edgefl.experiment.rows import (
    CLIENTS,
    EVENTS,
    METRICS,
    PICKED,
    energy_headers,
    extra_columns,
    living_client_columns,
    open_log,
    output_format,
    run_summary,
)
from edgefl.flower.shadow import Shadow
from edgefl.report.trace import TraceSample
from edgefl.rundir import write_file
from edgefl.runlog import CsvLog, log_names
from edgefl.selection.server import Selection
from edgefl.sim.availability import trace_file
from edgefl.sim.clients import STATUSES

ACCURACIES = ("clean_acc", "adv_acc")  # metrics.csv's, from a centralised evaluation's MetricRecord


class RunFolder:
    """The run folder `out` of a Flower run of `shadow`'s scenario, written round by round."""

    def __init__(self, out: Path, shadow: Shadow, selection: Selection, overwrite: bool = False) -> None:
        self.out, self.shadow, self.selection = out, shadow, selection
        exp, s = shadow.exp, shadow.scenario
        trace = trace_file(s.fleet, exp.where)
        files = [*exp.pool.profile_files(), *([trace] if trace else [])]
        prepare_out(out, overwrite)
        self.stack = ExitStack()
        self.stack.callback(rundir.let_go, out)
        marker = {**rundir.fingerprint(shadow.text, files), **rundir.profile_digests(files),
                  rundir.ORIGIN: str(Path(exp.where).resolve()), "flower": "1"}
        rundir.write_marker(out, "run", marker)
        write_file(out / "scenario.toml", shadow.text)
        self.metric_headers, self.client_headers = self._headers()
        names = log_names(output_format(s))
        self.metrics = self.stack.enter_context(CsvLog(out / names["metrics"], self.metric_headers, None))
        self.clients = open_log(out, names["clients"], self.client_headers, {})
        self.events = open_log(out, names["events"], EVENTS, {})
        for log in (self.clients, self.events):
            self.stack.enter_context(log)
        self.sample = TraceSample(s.fleet.clients, s.output.trace_clients, s.seed)
        self.rows: list[dict[str, Any]] = []
        self.pending: dict[str, Any] | None = None
        self.started = time.perf_counter()
        self.closed = False

    def _headers(self) -> tuple[list[str], list[str]]:
        """edgefl's columns for the scenario (edgefl.experiment.loop `_headers`), with `status` (and
        each status's count) on every fleet, and `reason`."""
        exp, s = self.shadow.exp, self.shadow.scenario
        energy_clients, energy_metrics = energy_headers(s)
        metrics = METRICS + extra_columns(s) + list(exp.method.round_info()) + list(STATUSES) + energy_metrics
        living = living_client_columns(s) or ["status"]
        clients = (CLIENTS + (PICKED if self.selection.logged else []) + living + energy_clients + ["reason"])
        return metrics, clients

    def round(self, table: RoundTable, loss: float | str, real_s: dict[int, float],
              reasons: dict[int, str]) -> None:
        """Round `table`'s rows; its metrics row waits for the round's evaluation (`evaluated`)."""
        self._flush()
        exp = self.shadow.exp
        clients = table.states.clients.tolist()
        real = np.array([real_s.get(k, np.nan) for k in clients], dtype=np.float64)
        columns = client_columns(table, exp.pool, real, self.client_headers)
        columns["reason"] = np.array([reasons.get(k, "") for k in clients], dtype=object)
        self.clients.write_columns(columns)
        spans = event_columns(table)
        self.events.write_columns(spans)
        self.sample.add_columns(spans)
        row = metrics_row(table, loss, exp.method.round_info())
        row.update(dict.fromkeys(extra_columns(self.shadow.scenario), ""))
        self.pending = row

    def evaluated(self, metrics: dict[str, Any]) -> None:
        """The round's accuracies from a centralised evaluation (`clean_acc`, `adv_acc`, or
        `accuracy` as clean_acc)."""
        if self.pending is None:
            return
        if "accuracy" in metrics and "clean_acc" not in metrics:
            metrics = {**metrics, "clean_acc": metrics["accuracy"]}
        for name in (*ACCURACIES, *extra_columns(self.shadow.scenario)):
            if name in metrics:
                self.pending[name] = round(float(metrics[name]), 4)

    def _flush(self) -> None:
        if self.pending is not None:
            self.metrics.write([self.pending])
            self.rows.append(self.pending)
            self.pending = None

    def close(self, trained: bool = True) -> dict[str, Any]:
        """Write the last row, trace.json and summary.json (a run with no round: no summary)."""
        if self.closed:
            return {}
        self.closed = True
        try:
            self._flush()
            summary: dict[str, Any] = {}
            if self.rows:
                summary = run_summary(self.shadow.exp, self.rows, time.perf_counter() - self.started)
                summary.update(dry_run=not trained, training_device="flower", runtime="flower")
                trace = self.sample.trace([d.name for d in self.shadow.exp.pool.devices])
                write_file(self.out / "trace.json", json.dumps(trace) + "\n")
                write_file(self.out / "summary.json", json.dumps(summary, indent=2) + "\n")
            return summary
        finally:
            self.stack.close()
