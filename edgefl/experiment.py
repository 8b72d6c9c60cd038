"""An experiment: a scenario run end to end, real training against the simulated clock.

Per round: sample clients, draw their device states, let the method plan each client's workload,
train each client for real, let SimPy play the round with the cost model's durations, aggregate,
evaluate, and append a row to metrics.csv and the clients' rows to clients.csv.
"""

from __future__ import annotations

import csv
import json
import os
import platform
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from edgefl import checkpoint
from edgefl.attacks import make_attack
from edgefl.config import Scenario, to_toml
from edgefl.data import Dataset, load_dataset, split_clients
from edgefl.data.datasets import dataset_spec, shapes_only
from edgefl.data.partition import ClientSplit, public_split
from edgefl.devices.catalog import load_catalog
from edgefl.devices.pool import DevicePool
from edgefl.errors import EdgeflError
from edgefl.execution.executor import Executor, make_executor
from edgefl.execution.local import evaluate, resolve_device, seed_everything
from edgefl.methods import METHODS, Context, Method
from edgefl.models import build_model
from edgefl.profiling import profile_model
from edgefl.report.trace import chrome_trace
from edgefl.sim.cost import make_cost_model
from edgefl.sim.engine import ClientRecord, Federation, RoundRecord, Span
from edgefl.sim.swap import min_budget

METRICS = ["round", "sim_time_s", "round_time_s", "compute_s", "data_access_s", "comm_s",
           "wait_s", "server_s", "clients", "swapped", "train_loss", "clean_acc", "adv_acc"]
CLIENTS = ["round", "client", "device", "app", "network", "flops", "mem_avail_bytes", "mem_req_bytes",
           "swapped", "compute_s", "data_access_s", "download_s", "upload_s", "wait_s",
           "finish_s", "read_bytes", "write_bytes", "real_compute_s"]
EVENTS = ["round", "client", "phase", "start_s", "end_s"]  # events.csv: the spans of trace.json


@dataclass
class Experiment:
    scenario: Scenario
    where: str  # the scenario file, for error messages
    ctx: Context
    pool: DevicePool
    method: Method
    dry_run: bool = False  # engine and cost model only: no data, no training, no accuracy


def prepare(scenario: Scenario, where: str, dry_run: bool = False) -> Experiment:
    """Load data (a dry run needs only its shapes), build model and fleet, and check every device
    can run the workload at all."""
    device = resolve_device(scenario.device)
    if scenario.threads:
        torch.set_num_threads(scenario.threads)
    data, splits, public = _dry_data(scenario, where) if dry_run else _real_data(scenario, where, device)

    def new_model() -> Any:
        return build_model(scenario.model.name, data.num_classes, data.input_shape, data.mean,
                           data.std)

    try:
        profile = profile_model(new_model(), scenario.model.name)
    except (RuntimeError, ValueError) as exc:
        raise EdgeflError(where, "model.name", f"{scenario.model.name} does not fit "
                          f"{scenario.data.dataset}'s {data.input_shape} inputs ({exc})") from None
    a = scenario.attack
    attack = None if a.name == "none" else make_attack(a.name, a.eps, a.step_size, a.steps)
    torch.manual_seed(scenario.seed)
    ctx = Context(scenario, where, data, splits, profile, new_model, device, attack, public)
    pool = DevicePool(load_catalog(), scenario.fleet, scenario.seed)
    method = METHODS.get(scenario.method)(ctx)
    if scenario.cost.accounting == "walk":  # the paper's formulas swap any model in any budget
        check_budgets(pool, method, where)
    return Experiment(scenario, where, ctx, pool, method, dry_run)


def _real_data(s: Scenario, where: str, device: torch.device) -> tuple[Dataset, Any, np.ndarray]:
    data = load_dataset(s.data, where)
    public, splits = client_splits(s, data.train_y.numpy(), where)
    data = type(data)(data.train_x.to(device), data.train_y.to(device), data.test_x.to(device),
                      data.test_y.to(device), data.num_classes, data.mean, data.std)
    return data, splits, public


def _dry_data(s: Scenario, where: str) -> tuple[Dataset, Any, np.ndarray]:
    """Shapes without samples, and splits of a balanced label vector of the training set's size,
    computed only if a method asks for them (local epochs): fleets may outnumber the samples."""
    spec = dataset_spec(s.data)
    labels = np.arange(spec.train_samples) % spec.num_classes
    splits = LazySplits(lambda: client_splits(s, labels, where)[1])
    return shapes_only(s.data), splits, np.zeros(0, dtype=np.int64)


class LazySplits(Sequence[ClientSplit]):
    """Client splits made on first use."""

    def __init__(self, make: Callable[[], list[ClientSplit]]) -> None:
        self.make = make

    @cached_property
    def splits(self) -> list[ClientSplit]:
        return self.make()

    def __getitem__(self, k: Any) -> Any:
        return self.splits[k]

    def __len__(self) -> int:
        return len(self.splits)


def client_splits(s: Scenario, labels: np.ndarray, where: str) -> tuple[np.ndarray, list[ClientSplit]]:
    """The server's public split (methods that distil) and the clients' splits of the rest."""
    public, rest = np.zeros(0, dtype=np.int64), np.arange(len(labels))
    if getattr(METHODS.get(s.method), "uses_public", False):
        public, rest = public_split(len(labels), s.distill.public_samples, s.seed, where)
    splits = split_clients(labels[rest], s.fleet.clients, s.data, s.seed, where)
    return public, [ClientSplit(rest[c.train], rest[c.val]) for c in splits]


def check_budgets(pool: DevicePool, method: Method, where: str) -> None:
    """Every device must hold one atom's step within R_min, or no amount of swapping helps."""
    first = {d.name: k for k, d in reversed(list(enumerate(pool.devices)))}  # one client per device kind
    for client in sorted(first.values()):
        device = pool.devices[client]
        budget = pool.reserved_bytes(device)  # plan as if at R_min: methods that adapt shrink there
        workload = method.plan(0, client, replace(pool.state(client, 0), memory_bytes=budget))
        need, atom = min_budget(workload)
        if need > budget:
            raise EdgeflError(
                where, "fleet",
                f"device {device.name} keeps at least {budget / 1e6:.3f} MB for training but one "
                f"step on atom {atom} needs {need / 1e6:.3f} MB; raise fleet.reserved_memory_mb "
                "(up to the device's memory), lower training.batch_size, or drop the device")


def run(exp: Experiment, out: Path, progress: bool = True, resume: bool = False) -> dict[str, Any]:
    """Train and simulate every round, writing the run directory as it goes; with `resume`,
    continue from the run directory's checkpoint."""
    s = exp.scenario
    evaluator = None if exp.dry_run else Evaluator(exp)
    cost_model = make_cost_model(s.cost)
    fed, rows, first = Federation(), [], 0
    saved = checkpoint.load(out) if resume else None
    if saved:
        exp.method.load_state(saved["method"])
        rows, first = saved["rows"], saved["next_round"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenario.toml").write_text(to_toml(s))
    started = time.perf_counter()
    extra = (evaluator.columns if evaluator else []) + list(exp.method.round_info())
    executor = make_executor(exp)
    with (CsvLog(out / "metrics.csv", METRICS + extra, first) as metrics,
          CsvLog(out / "clients.csv", CLIENTS, first) as clients,
          CsvLog(out / "events.csv", EVENTS, first) as events):
        if saved:
            fed = Federation(saved["clock"], [_span(r) for r in events.kept])
        bar = tqdm(range(first, s.rounds), desc=f"{s.method}", unit="round", disable=not progress,
                   initial=first, total=s.rounds)
        for t in bar:
            logged = len(fed.spans)
            record, loss, real = _round(exp, executor, fed, cost_model, t)
            row = _metrics_row(record, loss, exp.method.round_info())
            if evaluator and ((t + 1) % s.evaluation.every == 0 or t + 1 == s.rounds):
                row.update(evaluator(exp.method.global_model()))
                bar.set_postfix(clean=f"{row['clean_acc']:.3f}", adv=f"{row['adv_acc']:.3f}",
                                sim_h=f"{fed.now / 3600:.2f}")
            metrics.write([row])
            clients.write([_client_row(c, real.get(c.client, "")) for c in record.clients])
            events.write([asdict(x) for x in fed.spans[logged:]])
            rows.append(row)
            if not exp.dry_run and s.checkpoint_every and (
                    (t + 1) % s.checkpoint_every == 0 or t + 1 == s.rounds):
                checkpoint.save(out, {"next_round": t + 1, "method": exp.method.state(), "rows": rows,
                                      "clock": fed.now})
    summary = _summary(exp, rows, time.perf_counter() - started)
    error = prediction_error(out / "clients.csv") if emulates_host(exp) else None
    if error is not None:
        summary["time_prediction_error"] = error
    trace = chrome_trace(fed.spans, [d.name for d in exp.pool.devices])
    (out / "trace.json").write_text(json.dumps(trace) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


class Evaluator:
    """Clean and adversarial test accuracy of a model: `adv_acc` and one `<name>_acc` per extra."""

    def __init__(self, exp: Experiment) -> None:
        s, e = exp.scenario, exp.scenario.evaluation
        self.attacks = {name: make_attack(name, e.eps or s.attack.eps, e.step_size or s.attack.step_size,
                                          e.steps) for name in [e.attack, *e.extra]}
        self.columns = [f"{name}_acc" for name in e.extra]
        n = s.data.test_samples or len(exp.ctx.data.test_y)
        self.x, self.y = exp.ctx.data.test_x[:n], exp.ctx.data.test_y[:n]

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        (_, attack), *extras = self.attacks.items()
        clean, adv = evaluate(model, self.x, self.y, attack)
        row = {"clean_acc": round(clean, 4), "adv_acc": round(adv, 4)}
        for name, extra in extras:
            row[f"{name}_acc"] = round(evaluate(model, self.x, self.y, extra)[1], 4)
        return row


class CsvLog:
    """An append-only CSV log that, on resume, first drops the rows of rounds >= `first`
    (written after the last checkpoint), so no round appears twice; `kept` holds the rest."""

    def __init__(self, path: Path, columns: list[str], first: int) -> None:
        self.path, self.columns, self.first = path, columns, first
        self.kept: list[dict[str, str]] = []

    def __enter__(self) -> CsvLog:
        if self.path.exists():
            with open(self.path, newline="") as f:
                self.kept = [r for r in csv.DictReader(f) if r["round"] and int(r["round"]) < self.first]
        tmp = self.path.with_suffix(".tmp")
        with open(tmp, "w", newline="") as f:
            writer = csv.DictWriter(f, self.columns)
            writer.writeheader()
            writer.writerows(self.kept)
        os.replace(tmp, self.path)
        self.file = open(self.path, "a", newline="")  # closed in __exit__
        self.writer = csv.DictWriter(self.file, self.columns)
        return self

    def write(self, rows: list[dict[str, Any]]) -> None:
        self.writer.writerows(rows)
        self.file.flush()

    def __exit__(self, *exc: object) -> None:
        self.file.close()


def _round(exp: Experiment, executor: Executor, fed: Federation, cost_model: Any,
           t: int) -> tuple[RoundRecord, float | str, dict[int, float]]:
    """The round's record, its mean training loss and each client's measured training seconds."""
    s, m = exp.scenario, exp.method
    states = {k: exp.pool.state(k, t) for k in exp.pool.sample_clients(t)}
    m.begin_round(t, states)
    plans = {k: m.plan(t, k, state) for k, state in states.items()}
    jobs = [(k, state, cost_model.cost(plans[k], state)) for k, state in states.items()]
    server_s = s.cost.server_s + m.server_flops(t) / (s.cost.server_gflops * 1e9)
    record = fed.run_round(t, jobs, server_s)
    if exp.dry_run:
        m.skip(t, list(states))
        return record, "", {}
    updates = executor.train(t, plans)
    seed_everything(s.seed, t, -1)  # the server's stream: the same wherever the clients trained
    m.aggregate(t, updates)
    return (record, round(sum(u.loss for u in updates) / len(updates), 5),
            {u.client: u.real_compute_s for u in updates})


def _span(row: dict[str, str]) -> Span:
    """A span back from events.csv (floats round-trip exactly through their repr)."""
    return Span(int(row["round"]), int(row["client"]), row["phase"], float(row["start_s"]),
                float(row["end_s"]))


def _metrics_row(r: RoundRecord, loss: float | str, info: dict[str, Any]) -> dict[str, Any]:
    """The straggler's breakdown: compute + data access + comm + server = the round's time."""
    c = r.straggler.cost
    return {"round": r.round, "sim_time_s": r.end_s, "round_time_s": r.duration_s,
            "compute_s": c.compute_s, "data_access_s": c.data_access_s, "comm_s": c.comm_s,
            "wait_s": sum(x.wait_s for x in r.clients) / len(r.clients), "server_s": r.server_s,
            "clients": len(r.clients), "swapped": sum(x.cost.swapped for x in r.clients),
            "train_loss": loss, "clean_acc": "", "adv_acc": "", **info}


def _client_row(c: ClientRecord, real_compute_s: float | str) -> dict[str, Any]:
    st, co = c.state, c.cost
    return {"round": c.round, "client": c.client, "device": st.device.name, "app": st.app,
            "network": st.network, "flops": st.flops, "mem_avail_bytes": int(st.memory_bytes),
            "mem_req_bytes": int(co.mem_req_bytes), "swapped": int(co.swapped),
            "compute_s": co.compute_s, "data_access_s": co.data_access_s,
            "download_s": co.download_s, "upload_s": co.upload_s, "wait_s": c.wait_s,
            "finish_s": c.finish_s, "read_bytes": int(co.read_bytes),
            "write_bytes": int(co.write_bytes), "real_compute_s": real_compute_s}


def _summary(exp: Experiment, rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Totals of the run; accuracies are the last evaluated round's (None in a dry run)."""
    last = next((r for r in reversed(rows) if r["clean_acc"] != ""), {"clean_acc": None, "adv_acc": None})
    devices = exp.pool.devices
    return {
        "method": exp.scenario.method, "rounds": len(rows), "seed": exp.scenario.seed,
        "dry_run": exp.dry_run, "sim_time_s": rows[-1]["sim_time_s"], "wall_time_s": round(wall_s, 2),
        "clean_acc": last["clean_acc"], "adv_acc": last["adv_acc"],
        "compute_s": sum(r["compute_s"] for r in rows),
        "data_access_s": sum(r["data_access_s"] for r in rows),
        "comm_s": sum(r["comm_s"] for r in rows),
        "client_rounds": sum(r["clients"] for r in rows),
        "client_rounds_swapped": sum(r["swapped"] for r in rows),
        "fleet": {d: sum(x.name == d for x in devices) for d in sorted({x.name for x in devices})},
        "training_device": str(exp.ctx.device),
    }


def emulates_host(exp: Experiment) -> bool:
    """Whether the emulated devices are the machine that trains: every client has a profile
    calibrated on this host with the threads in use, training runs on its CPU, no co-running app
    slows it, and the walk accounting charges compute."""
    s, node = exp.scenario, platform.node()
    return (not exp.dry_run and exp.ctx.device.type == "cpu" and s.cost.accounting == "walk"
            and all(d.calibrated_host == node and d.calibrated_threads == torch.get_num_threads()
                    for d in exp.pool.devices)
            and all(a.perf_left == 1 for a in exp.pool.apps))


def prediction_error(clients_csv: Path) -> float | None:
    """Simulated compute / measured compute - 1 over the run's client-rounds that were measured
    (None if none was: rows from an older edgefl have no `real_compute_s`)."""
    with open(clients_csv, newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("real_compute_s")]
    real = sum(float(r["real_compute_s"]) for r in rows)
    return round(sum(float(r["compute_s"]) for r in rows) / real - 1, 4) if real > 0 else None


def prepare_out(out: Path, overwrite: bool, where: str) -> None:
    """Refuse to mix a new run into an existing run directory unless told to replace it."""
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise EdgeflError(str(out), "--out", "already holds a run; choose another --out or "
                              "pass --overwrite to replace it")
        shutil.rmtree(out)
