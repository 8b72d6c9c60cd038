"""An experiment: a scenario run end to end, real training against the simulated clock.

Per round: sample clients, draw their device states, let the method plan each client's workload,
train each client for real, let SimPy play the round with the cost model's durations, aggregate,
evaluate, and append a row to metrics.csv and the clients' rows to clients.csv.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import platform
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from edgefl import checkpoint, rundir
from edgefl.attacks import make_attack
from edgefl.config import Scenario, to_toml
from edgefl.data import Dataset, load_dataset, split_clients
from edgefl.data.datasets import dataset_spec, shapes_only
from edgefl.data.partition import ClientSplit, public_split
from edgefl.devices.catalog import catalog_for
from edgefl.devices.pool import DevicePool, check_fleet_memory, selected_per_round
from edgefl.errors import EdgeflError
from edgefl.execution.executor import Executor, make_executor
from edgefl.execution.local import evaluate, resolve_device, seed_everything
from edgefl.methods import METHODS, Context, Method
from edgefl.models import build_model
from edgefl.profiling import profile_model
from edgefl.report.trace import TraceSample
from edgefl.rundir import WriteFailed, write_file
from edgefl.runlog import (
    CLIENT_TYPES,
    EVENT_TYPES,
    CsvLog,
    Log,
    ParquetLog,
    log_format,
    log_names,
    pending_path,
    read_rows,
)
from edgefl.sim.cost import make_cost_model
from edgefl.sim.engine import ClientRecord, Federation, RoundRecord, Span, round_spans
from edgefl.sim.swap import min_budget
from edgefl.sim.workload import Workload

METRICS = ["round", "sim_time_s", "round_time_s", "compute_s", "data_access_s", "comm_s",
           "wait_s", "server_s", "clients", "swapped", "train_loss", "clean_acc", "adv_acc"]
CLIENTS = ["round", "client", "device", "app", "network", "flops", "mem_avail_bytes", "mem_req_bytes",
           "swapped", "compute_s", "data_access_s", "download_s", "upload_s", "wait_s",
           "finish_s", "read_bytes", "write_bytes", "real_compute_s"]
EVENTS = ["round", "client", "phase", "start_s", "end_s"]  # events.csv: the spans of trace.json
CHUNK = 8192  # rows rendered and written at a time (a Parquet row group)


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
    check_fleet_memory(scenario.fleet, where)
    device = resolve_device(scenario.device)
    if scenario.threads:
        torch.set_num_threads(scenario.threads)
    data, splits, public = _dry_data(scenario, where) if dry_run else _real_data(scenario, where, device)

    def new_model() -> Any:
        return build_model(scenario.model.name, data.num_classes, data.input_shape, data.mean,
                           data.std)

    profile = fitted_profile(scenario, new_model, data.input_shape, where)
    a = scenario.attack
    attack = None if a.name == "none" else make_attack(a.name, a.eps, a.step_size, a.steps)
    torch.manual_seed(scenario.seed)
    ctx = Context(scenario, where, data, splits, profile, new_model, device, attack, public)
    pool = DevicePool(catalog_for(where), scenario.fleet, scenario.seed)
    method = METHODS.get(scenario.method)(ctx)
    if scenario.cost.accounting == "walk":  # the paper's formulas swap any model in any budget
        check_budgets(pool, method, where)
    return Experiment(scenario, where, ctx, pool, method, dry_run)


def fitted_profile(s: Scenario, new_model: Callable[[], Any], input_shape: Any, where: str) -> Any:
    """The model's atom profile, or one line when the model does not fit the dataset's inputs."""
    try:
        return profile_model(new_model(), s.model.name)
    except (RuntimeError, ValueError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise EdgeflError(where, "model.name", f"{s.model.name} does not fit "
                          f"{s.data.dataset}'s {tuple(input_shape)} inputs ({reason})") from None


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
    if getattr(METHODS.get(s.method), "uses_public", False):  # as the real run would refuse it
        public_split(len(labels), s.distill.public_samples, s.seed, where)
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
    """Every device must hold the smallest step of the finest swapping schedule within R_min (one
    layer's tensors, one sample at a time), or no amount of paging helps."""
    first: dict[str, int] = {}  # one client per device kind, the first dealt it
    for k, d in enumerate(pool.devices):
        first.setdefault(d.name, k)
    for client in sorted(first.values()):
        device = pool.devices[client]
        budget = pool.reserved_bytes(device)  # plan as if at R_min: methods that adapt shrink there
        workload = method.plan(0, client, replace(pool.state(client, 0), memory_bytes=budget))
        need, part = min_budget(workload)
        if need > budget:
            raise EdgeflError(
                where, "fleet",
                f"device {device.name} keeps at least {budget / 1e6:.3f} MB for training but the "
                f"smallest step on {part} (paged layer by layer, one sample at a time) needs "
                f"{need / 1e6:.3f} MB; raise fleet.reserved_memory_mb (up to the device's memory) "
                "or drop the device")


def run(exp: Experiment, out: Path, progress: bool = True, resume: bool = False) -> dict[str, Any]:
    """Train and simulate every round, writing the run directory as it goes; with `resume`,
    continue from the run directory's checkpoint after checking every file it reads."""
    try:
        return _run(exp, out, progress, resume)
    except WriteFailed as exc:
        saved = not exp.dry_run and (out / checkpoint.FILE).exists()
        then = (f"then continue it with edgefl run --resume {out}" if saved
                else "then start it again with --overwrite (it has no checkpoint yet)")
        raise EdgeflError(str(exc.path), "write", f"cannot write it ({exc.reason}); everything written "
                          f"before is kept: free space or make the folder writable, {then}") from None


def _run(exp: Experiment, out: Path, progress: bool, resume: bool) -> dict[str, Any]:
    s = exp.scenario
    text = to_toml(s)
    fingerprint = rundir.fingerprint(text, exp.pool.profile_files())
    saved = resume_state(exp, out, fingerprint) if resume else None
    if saved is None:
        rundir.claim(out, "run")  # a no-op after prepare_out; library callers get the same checks
        rundir.write_marker(out, "run", fingerprint)
        write_file(out / "scenario.toml", text)
    evaluator = None if exp.dry_run else Evaluator(exp)
    cost_model = make_cost_model(s.cost)
    fed, rows, first = Federation(), [], 0
    if saved:
        rows, first = saved.state["rows"], saved.state["next_round"]
        fed = Federation(saved.state["clock"])
    started = time.perf_counter()
    extra = (evaluator.columns if evaluator else []) + list(exp.method.round_info())
    executor = make_executor(exp)
    kept = saved.logs if saved else {}
    names = log_names(output_format(s))
    sample = TraceSample(s.fleet.clients, s.output.trace_clients, s.seed)
    with (CsvLog(out / names["metrics"], METRICS + extra, kept.get(names["metrics"])) as metrics,
          _log(out, names["clients"], CLIENTS, kept) as clients,
          _log(out, names["events"], EVENTS, kept) as events):
        logs: list[Log] = [metrics, clients, events]
        sample.add(_span(r) for r in events.rows() if int(r["client"]) in sample.kept)
        bar = tqdm(range(first, s.rounds), desc=f"{s.method}", unit="round", disable=not progress,
                   initial=first, total=s.rounds)
        for t in bar:
            if exp.method.finished():  # ended before its last round (FedProphet's last module)
                break
            record, loss, real = _round(exp, executor, fed, cost_model, t)
            row = _metrics_row(record, loss, exp.method.round_info())
            last = t + 1 == s.rounds or exp.method.finished()
            if evaluator and ((t + 1) % s.evaluation.every == 0 or last):
                row.update(evaluator(exp.method.global_model()))
                bar.set_postfix(clean=f"{row['clean_acc']:.3f}", adv=f"{row['adv_acc']:.3f}",
                                sim_h=f"{fed.now / 3600:.2f}")
            metrics.write([row])
            for part in _chunks(record.clients):
                clients.write([_client_row(c, real.get(c.client, "")) for c in part])
            for spans in _chunks(round_spans(record)):
                events.write([_event_row(x) for x in spans])
                sample.add(spans)  # nothing is kept across rounds but the trace's sample
            rows.append(row)
            if not exp.dry_run and s.checkpoint_every and ((t + 1) % s.checkpoint_every == 0 or last):
                checkpoint.save(out, {"next_round": t + 1, "method": exp.method.state(), "rows": rows,
                                      "clock": fed.now, "fingerprint": fingerprint,
                                      "logs": {log.path.name: log.seal() for log in logs}})
                for log in logs:
                    log.commit()
    summary = _summary(exp, rows, time.perf_counter() - started)
    error = prediction_error(out) if emulates_host(exp) else None
    if error is not None:
        summary["time_prediction_error"] = error
    trace = sample.trace([d.name for d in exp.pool.devices])
    write_file(out / "trace.json", json.dumps(trace) + "\n")
    write_file(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


@dataclass
class Resumed:
    state: dict[str, Any]  # the checkpoint
    logs: dict[str, bytes]  # each CSV log's bytes as the checkpoint vouches for them


def resume_state(exp: Experiment, out: Path, fingerprint: dict[str, str]) -> Resumed:
    """Check that the run folder, its checkpoint and its logs belong together and to this scenario and
    code, then restore the method and the RNGs; nothing is written before every check has passed."""
    marker = rundir.read_marker(out)
    if marker is None or marker.get("kind") != "run":
        raise EdgeflError(str(out), rundir.MARKER, "missing: this folder holds no run edgefl can "
                          "resume (or an older edgefl's); start the run again")
    code = {k: marker.get(k) for k in ("edgefl", "code")}
    if code != {k: fingerprint[k] for k in code}:
        raise EdgeflError(str(out), "--resume", f"the run was started by edgefl {code['edgefl']} (code "
                          f"{code['code']}), this is edgefl {fingerprint['edgefl']} (code "
                          f"{fingerprint['code']}): resume it with that version, or start it again")
    if marker.get("scenario") != fingerprint["scenario"]:
        raise EdgeflError(str(out / "scenario.toml"), "--resume", "was edited after the run started; "
                          "restore it, or start a new run with the edited scenario")
    names = tuple(log_names(output_format(exp.scenario)).values())
    state = checkpoint.load(out, exp.scenario.rounds, names)
    path = str(out / checkpoint.FILE)
    if state["fingerprint"] != fingerprint:
        raise EdgeflError(path, "checkpoint", "belongs to another run (another scenario, seed or "
                          "edgefl); put back this run's checkpoint, or start the run again")
    logs = {name: _vouched(out / name, state["logs"][name], state["next_round"]) for name in names}
    try:
        exp.method.load_state(state["method"])
        checkpoint.set_rng_state(state["rng"])
    except Exception as exc:  # any mismatch of a plain-data file is the user's input
        raise EdgeflError(path, "checkpoint", f"does not fit this run's model and method "
                          f"({type(exc).__name__}); start the run again") from None
    return Resumed(state, logs)


def _vouched(path: Path, seal: list[Any], next_round: int) -> bytes:
    """The first `length` bytes of a log, if their SHA-256 is `digest` (the checkpoint's `seal` of
    it): the rows the checkpoint saw, from the log or, for a Parquet log whose move into place a crash
    cut short, from its pending file.
    Later bytes (rounds after the checkpoint, a row torn by a full disk) are dropped on resume."""
    found = [data for data in (_read_log(path, next_round), _pending(path))
             if data is not None and _holds(data, seal)]
    if not found:
        raise EdgeflError(str(path), "--resume", f"does not hold the rows of the checkpoint's "
                          f"{next_round} rounds (edited, cut or replaced); put back the original, or "
                          "start the run again")
    return found[0][:seal[0]]


def _holds(data: bytes, seal: list[Any]) -> bool:
    length, digest = seal
    return len(data) >= length and hashlib.sha256(data[:length]).hexdigest() == digest


def _read_log(path: Path, next_round: int) -> bytes:
    try:
        if path.is_symlink():
            raise OSError("a symbolic link")
        return path.read_bytes()
    except OSError as exc:
        if _pending(path) is not None:
            return b""
        raise EdgeflError(str(path), "--resume", f"cannot be read ({exc.strerror or exc}) but the "
                          f"checkpoint holds {next_round} rounds of it; put it back, or start the run "
                          "again") from None


def _pending(path: Path) -> bytes | None:
    pending = pending_path(path)
    try:
        return None if pending.is_symlink() else pending.read_bytes()
    except OSError:
        return None


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


def _counted(exp: Experiment, client: int, w: Workload) -> Workload:
    """The workload with the client's sample count where the `paper` accounting charges each
    epoch's short last batch, as the FedProphet release does (fleets may outnumber the samples
    of a dry run's shapes-only data, so the walk does not ask)."""
    if exp.scenario.cost.accounting != "paper":
        return w
    return replace(w, samples=len(exp.ctx.splits[client].train))


def _round(exp: Experiment, executor: Executor, fed: Federation, cost_model: Any,
           t: int) -> tuple[RoundRecord, float | str, dict[int, float]]:
    """The round's record, its mean training loss and each client's measured training seconds."""
    s, m = exp.scenario, exp.method
    states = {k: exp.pool.state(k, t) for k in exp.pool.sample_clients(t)}
    m.begin_round(t, states)
    plans = {k: m.plan(t, k, state) for k, state in states.items()}
    jobs = [(k, state, cost_model.cost(_counted(exp, k, plans[k]), state)) for k, state in states.items()]
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


def output_format(s: Scenario) -> str:
    """csv or parquet for the run's per-client logs (`output.format`; auto counts client-rounds)."""
    return log_format(s.output.format, s.output.parquet_above, s.rounds * selected_per_round(s.fleet))


def _log(out: Path, name: str, columns: list[str], kept: dict[str, bytes]) -> CsvLog | ParquetLog:
    """The per-client log `name` (clients or events, .csv or .parquet), from its kept bytes on resume."""
    if name.endswith(".parquet"):
        types = CLIENT_TYPES if name.startswith("clients") else EVENT_TYPES
        return ParquetLog(out / name, types, kept.get(name))
    return CsvLog(out / name, columns, kept.get(name))


def _chunks(items: Iterable[Any]) -> Iterator[list[Any]]:
    """`items` CHUNK at a time."""
    it = iter(items)
    while part := list(itertools.islice(it, CHUNK)):
        yield part


def _event_row(x: Span) -> dict[str, Any]:
    return {"round": x.round, "client": x.client, "phase": x.phase, "start_s": x.start_s, "end_s": x.end_s}


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
    calibrated on this host with the threads in use, training runs on its CPU one client at a time
    (`training.group_clients` off), no co-running app slows it, and the walk accounting charges
    compute."""
    s, node = exp.scenario, platform.node()
    return (not exp.dry_run and exp.ctx.device.type == "cpu" and s.cost.accounting == "walk"
            and not s.training.group_clients
            and all(d.calibrated_host == node and d.calibrated_threads == torch.get_num_threads()
                    for d in exp.pool.devices)
            and all(a.perf_left == 1 for a in exp.pool.apps))


def prediction_error(out: Path) -> float | None:
    """Simulated compute / measured compute - 1 over the run's client-rounds that were measured
    (None if none was: rows from an older edgefl have no `real_compute_s`)."""
    rows = [r for r in read_rows(out, "clients")[1] if r.get("real_compute_s")]
    real = sum(float(r["real_compute_s"]) for r in rows)
    return round(sum(float(r["compute_s"]) for r in rows) / real - 1, 4) if real > 0 else None


def prepare_out(out: Path, overwrite: bool) -> None:
    """Make `out` a new run folder: create it or take an empty one; a folder holding an edgefl run
    is replaced only with --overwrite, and only when edgefl wrote everything in it; any other
    folder is refused."""
    if rundir.probe(out, "--out") == "dir" and rundir.marker_kind(out) == "run":
        if not overwrite:
            raise EdgeflError(str(out), "--out", "already holds a run; choose another --out or "
                              "pass --overwrite to replace it")
        rundir.clear_run(out)
    rundir.claim(out, "run")
