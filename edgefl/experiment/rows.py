"""A run's records: the rows of metrics.csv, clients.csv and events.csv (or their Parquet twins),
the logs they go to, the summary, and the check of simulated against measured compute time."""

from __future__ import annotations

import platform
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from edgefl.config import Scenario
from edgefl.devices.pool import selected_per_round
from edgefl.experiment.prepare import Experiment
from edgefl.runlog import CLIENT_TYPES, ENERGY_TYPES, EVENT_TYPES, CsvLog, ParquetLog, log_format, read_rows
from edgefl.sim.engine import Span

METRICS = ["round", "sim_time_s", "round_time_s", "compute_s", "data_access_s", "comm_s",
           "wait_s", "server_s", "clients", "swapped", "train_loss", "clean_acc", "adv_acc"]
CLIENTS = ["round", "client", "device", "app", "network", "flops", "mem_avail_bytes", "mem_req_bytes",
           "swapped", "compute_s", "data_access_s", "download_s", "upload_s", "wait_s",
           "finish_s", "read_bytes", "write_bytes", "real_compute_s"]
EVENTS = ["round", "client", "phase", "start_s", "end_s"]  # events.csv: the spans of trace.json
PICKED = ["utility", "picked_by"]  # clients.csv under a selection policy other than uniform
PICKED_TYPES = {"utility": pa.float64(), "picked_by": pa.string()}



def living_client_columns(s: Scenario) -> list[str]:
    """clients.csv's columns for a living fleet: `status`, and `staleness` in async mode; none
    with the default availability and round mode and no batteries."""
    if s.round.mode == "async":
        return ["status", "staleness"]
    return ["status"] if s.living else []


def energy_headers(s: Scenario) -> tuple[list[str], list[str]]:
    """The columns clients.csv and metrics.csv gain with `energy.enabled` (energy_j) and
    `energy.batteries` (battery_j, the charge left, and battery_dropped)."""
    clients = ["energy_j"] if s.energy.enabled else []
    metrics = ["energy_j"] if s.energy.enabled else []
    if s.energy.batteries:
        clients, metrics = [*clients, "battery_j", "battery_dropped"], [*metrics, "battery_dropped"]
    return clients, metrics


def output_format(s: Scenario) -> str:
    """csv or parquet for the run's per-client logs (`output.format`; auto counts client-rounds)."""
    return log_format(s.output.format, s.output.parquet_above, s.rounds * selected_per_round(s.fleet))


def open_log(out: Path, name: str, columns: list[str], kept: dict[str, bytes]) -> CsvLog | ParquetLog:
    """The per-client log `name` (clients or events, .csv or .parquet), from its kept bytes on resume."""
    if name.endswith(".parquet"):
        clients = {**CLIENT_TYPES, **ENERGY_TYPES, **PICKED_TYPES}
        known = clients if name.startswith("clients") else EVENT_TYPES
        return ParquetLog(out / name, {c: known[c] for c in columns}, kept.get(name))
    return CsvLog(out / name, columns, kept.get(name))


def span(row: dict[str, str]) -> Span:
    """A span back from events.csv (floats round-trip exactly through their repr)."""
    return Span(int(row["round"]), int(row["client"]), row["phase"], float(row["start_s"]),
                float(row["end_s"]))


def extra_columns(s: Scenario) -> list[str]:
    """metrics.csv's column of each `evaluation.extra` attack (empty in a dry run)."""
    return [f"{name}_acc" for name in s.evaluation.extra]


def run_summary(exp: Experiment, rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Totals of the run; accuracies (with each `evaluation.extra` attack's) are the last evaluated
    round's (None in a dry run)."""
    accuracies = ["clean_acc", "adv_acc", *extra_columns(exp.scenario)]
    last = next((r for r in reversed(rows) if r["clean_acc"] != ""), dict.fromkeys(accuracies))
    devices = exp.pool.devices
    return {
        "method": exp.scenario.method, "rounds": len(rows), "seed": exp.scenario.seed,
        "dry_run": exp.dry_run, "sim_time_s": rows[-1]["sim_time_s"], "wall_time_s": round(wall_s, 2),
        **{name: last[name] for name in accuracies},
        "compute_s": sum(r["compute_s"] for r in rows),
        "data_access_s": sum(r["data_access_s"] for r in rows),
        "comm_s": sum(r["comm_s"] for r in rows),
        "server_s": sum(r["server_s"] for r in rows),
        "client_rounds": sum(r["clients"] for r in rows),
        "client_rounds_swapped": sum(r["swapped"] for r in rows),
        "fleet": {d: sum(x.name == d for x in devices) for d in sorted({x.name for x in devices})},
        "training_device": str(exp.ctx.device),
    }


def emulates_host(exp: Experiment) -> bool:
    """Whether the emulated devices are the machine that trains: every client has a profile
    calibrated on this host with the threads in use, training runs on its CPU one client at a time
    (`training.group_clients` off), no co-running app slows it, and the walk accounting charges
    compute."""
    node = platform.node()
    return (not exp.dry_run and exp.ctx.device.type == "cpu" and exp.ctx.cost.walks
            and all(d.calibrated_host == node and d.calibrated_threads == torch.get_num_threads()
                    for d in exp.pool.devices)
            and all(a.perf_left == 1 for a in exp.pool.apps)
            and not exp.scenario.training.group_clients)


def prediction_error(out: Path) -> float | None:
    """Simulated compute / measured compute - 1 over the run's client-rounds that were measured
    (None if none was: rows from an older edgefl have no `real_compute_s`)."""
    rows = [r for r in read_rows(out, "clients")[1] if r.get("real_compute_s")]
    real = sum(float(r["real_compute_s"]) for r in rows)
    return round(sum(float(r["compute_s"]) for r in rows) / real - 1, 4) if real > 0 else None


