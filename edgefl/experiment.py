"""An experiment: a scenario run end to end, real training against the simulated clock.

Per round: sample clients, draw their device states, let the method plan each client's workload,
train each client for real, let SimPy play the round with the cost model's durations, aggregate,
evaluate, and append a row to metrics.csv and the clients' rows to clients.csv.
"""

from __future__ import annotations

import csv
import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from edgefl.attacks import make_attack
from edgefl.config import Scenario, to_toml
from edgefl.data import load_dataset, split_clients
from edgefl.data.partition import ClientSplit, public_split
from edgefl.devices.catalog import load_catalog
from edgefl.devices.pool import DevicePool
from edgefl.errors import EdgeflError
from edgefl.execution.local import evaluate, resolve_device
from edgefl.methods import METHODS, Context, Method
from edgefl.models import build_model
from edgefl.profiling import profile_model
from edgefl.report.trace import chrome_trace
from edgefl.sim.cost import make_cost_model
from edgefl.sim.engine import ClientRecord, Federation, RoundRecord
from edgefl.sim.swap import min_budget

METRICS = ["round", "sim_time_s", "round_time_s", "compute_s", "data_access_s", "comm_s",
           "wait_s", "server_s", "clients", "swapped", "train_loss", "clean_acc", "adv_acc"]
CLIENTS = ["round", "client", "device", "app", "network", "flops", "mem_avail_bytes", "mem_req_bytes",
           "swapped", "compute_s", "data_access_s", "download_s", "upload_s", "wait_s",
           "finish_s", "read_bytes", "write_bytes"]


@dataclass
class Experiment:
    scenario: Scenario
    where: str  # the scenario file, for error messages
    ctx: Context
    pool: DevicePool
    method: Method


def prepare(scenario: Scenario, where: str) -> Experiment:
    """Load data, build model and fleet, and check every device can run the workload at all."""
    device = resolve_device(scenario.device)
    if scenario.threads:
        torch.set_num_threads(scenario.threads)
    data = load_dataset(scenario.data, where)
    public, splits = client_splits(scenario, data.train_y.numpy(), where)
    data = type(data)(data.train_x.to(device), data.train_y.to(device), data.test_x.to(device),
                      data.test_y.to(device), data.num_classes, data.mean, data.std)

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
    check_budgets(pool, method, where)
    return Experiment(scenario, where, ctx, pool, method)


def client_splits(s: Scenario, labels: np.ndarray, where: str) -> tuple[np.ndarray, list[ClientSplit]]:
    """The server's public split (methods that distil) and the clients' splits of the rest."""
    public, rest = np.zeros(0, dtype=np.int64), np.arange(len(labels))
    if getattr(METHODS.get(s.method), "uses_public", False):
        public, rest = public_split(len(labels), s.distill.public_samples, s.seed, where)
    splits = split_clients(labels[rest], s.fleet.clients, s.data, s.seed, where)
    return public, [ClientSplit(rest[c.train], rest[c.val]) for c in splits]


def check_budgets(pool: DevicePool, method: Method, where: str) -> None:
    """Every device must hold one atom's step within R_min, or no amount of swapping helps."""
    for client, device in enumerate(pool.devices):
        state = pool.state(client, 0)
        workload = method.plan(0, client, state)
        budget = pool.reserved_bytes(device)
        need, atom = min_budget(workload)
        if need > budget:
            raise EdgeflError(
                where, "fleet",
                f"device {device.name} keeps at least {budget / 1e6:.3f} MB for training but one "
                f"step on atom {atom} needs {need / 1e6:.3f} MB; raise fleet.reserved_memory_mb "
                "(up to the device's memory), lower training.batch_size, or drop the device")


def run(exp: Experiment, out: Path, progress: bool = True) -> dict[str, Any]:
    """Train and simulate every round, writing the run directory as it goes."""
    s = exp.scenario
    eval_cfg = s.evaluation
    eval_attack, *extras = [make_attack(name, eval_cfg.eps or s.attack.eps,
                                        eval_cfg.step_size or s.attack.step_size, eval_cfg.steps)
                            for name in [eval_cfg.attack, *eval_cfg.extra]]
    test_x, test_y = _test_set(exp)
    cost_model = make_cost_model(s.cost)
    fed = Federation()
    out.mkdir(parents=True, exist_ok=True)
    (out / "scenario.toml").write_text(to_toml(s))
    started = time.perf_counter()
    rows: list[dict[str, Any]] = []
    with (open(out / "metrics.csv", "w", newline="") as mf,
          open(out / "clients.csv", "w", newline="") as cf):
        extra = [f"{name}_acc" for name in eval_cfg.extra] + list(exp.method.round_info())
        metrics = csv.DictWriter(mf, METRICS + extra)
        clients = csv.DictWriter(cf, CLIENTS)
        metrics.writeheader()
        clients.writeheader()
        bar = tqdm(range(s.rounds), desc=f"{s.method}", unit="round", disable=not progress)
        for t in bar:
            record, loss = _round(exp, fed, cost_model, t)
            row = _metrics_row(record, loss, exp.method.round_info())
            if (t + 1) % eval_cfg.every == 0 or t + 1 == s.rounds:
                model = exp.method.global_model()
                clean, adv = evaluate(model, test_x, test_y, eval_attack)
                row.update(clean_acc=round(clean, 4), adv_acc=round(adv, 4))
                for name, attack in zip(eval_cfg.extra, extras, strict=True):
                    row[f"{name}_acc"] = round(evaluate(model, test_x, test_y, attack)[1], 4)
                bar.set_postfix(clean=f"{clean:.3f}", adv=f"{adv:.3f}", sim_h=f"{fed.now / 3600:.2f}")
            metrics.writerow(row)
            clients.writerows(_client_row(c) for c in record.clients)
            mf.flush()
            cf.flush()
            rows.append(row)
    summary = _summary(exp, rows, time.perf_counter() - started)
    trace = chrome_trace(fed.spans, [d.name for d in exp.pool.devices])
    (out / "trace.json").write_text(json.dumps(trace) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def _test_set(exp: Experiment) -> tuple[torch.Tensor, torch.Tensor]:
    n = exp.scenario.data.test_samples or len(exp.ctx.data.test_y)
    return exp.ctx.data.test_x[:n], exp.ctx.data.test_y[:n]


def _round(exp: Experiment, fed: Federation, cost_model: Any, t: int) -> tuple[RoundRecord, float]:
    s, jobs, updates = exp.scenario, [], []
    states = {k: exp.pool.state(k, t) for k in exp.pool.sample_clients(t)}
    exp.method.begin_round(t, states)
    for k, state in states.items():
        workload = exp.method.plan(t, k, state)
        updates.append(exp.method.train(t, k, workload))
        jobs.append((k, state, cost_model.cost(workload, state)))
    server_s = s.cost.server_s + exp.method.server_flops(t) / (s.cost.server_gflops * 1e9)
    record = fed.run_round(t, jobs, server_s)
    exp.method.aggregate(t, updates)
    return record, sum(u.loss for u in updates) / len(updates)


def _metrics_row(r: RoundRecord, loss: float, info: dict[str, Any]) -> dict[str, Any]:
    """The straggler's breakdown: compute + data access + comm + server = the round's time."""
    c = r.straggler.cost
    return {"round": r.round, "sim_time_s": r.end_s, "round_time_s": r.duration_s,
            "compute_s": c.compute_s, "data_access_s": c.data_access_s, "comm_s": c.comm_s,
            "wait_s": sum(x.wait_s for x in r.clients) / len(r.clients), "server_s": r.server_s,
            "clients": len(r.clients), "swapped": sum(x.cost.swapped for x in r.clients),
            "train_loss": round(loss, 5), "clean_acc": "", "adv_acc": "", **info}


def _client_row(c: ClientRecord) -> dict[str, Any]:
    st, co = c.state, c.cost
    return {"round": c.round, "client": c.client, "device": st.device.name, "app": st.app,
            "network": st.network, "flops": st.flops, "mem_avail_bytes": int(st.memory_bytes),
            "mem_req_bytes": int(co.mem_req_bytes), "swapped": int(co.swapped),
            "compute_s": co.compute_s, "data_access_s": co.data_access_s,
            "download_s": co.download_s, "upload_s": co.upload_s, "wait_s": c.wait_s,
            "finish_s": c.finish_s, "read_bytes": int(co.read_bytes),
            "write_bytes": int(co.write_bytes)}


def _summary(exp: Experiment, rows: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    last = next(r for r in reversed(rows) if r["clean_acc"] != "")
    devices = exp.pool.devices
    return {
        "method": exp.scenario.method, "rounds": len(rows), "seed": exp.scenario.seed,
        "sim_time_s": rows[-1]["sim_time_s"], "wall_time_s": round(wall_s, 2),
        "clean_acc": last["clean_acc"], "adv_acc": last["adv_acc"],
        "compute_s": sum(r["compute_s"] for r in rows),
        "data_access_s": sum(r["data_access_s"] for r in rows),
        "comm_s": sum(r["comm_s"] for r in rows),
        "client_rounds": sum(r["clients"] for r in rows),
        "client_rounds_swapped": sum(r["swapped"] for r in rows),
        "fleet": {d: sum(x.name == d for x in devices) for d in sorted({x.name for x in devices})},
        "training_device": str(exp.ctx.device),
    }


def prepare_out(out: Path, overwrite: bool, where: str) -> None:
    """Refuse to mix a new run into an existing run directory unless told to replace it."""
    if out.exists() and any(out.iterdir()):
        if not overwrite:
            raise EdgeflError(str(out), "--out", "already holds a run; choose another --out or "
                              "pass --overwrite to replace it")
        shutil.rmtree(out)
