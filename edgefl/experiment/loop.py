"""The round loop: a scenario run end to end, real training against the simulated clock.

Per round: sample clients, draw their device states, let the method plan each client's workload,
train each client for real, let SimPy play the round with the cost model's durations, aggregate,
evaluate, and append a row to metrics.csv and the clients' rows to clients.csv.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from edgefl import checkpoint, rundir
from edgefl.attacks import make_attack
from edgefl.config import RayConfig
from edgefl.errors import EdgeflError
from edgefl.executors.executor import Executor, LocalExecutor
from edgefl.executors.ray import RayExecutor
from edgefl.experiment.players import RoundPlayer, make_player
from edgefl.experiment.prepare import Experiment, Rebuild
from edgefl.experiment.resume import Resumed, restore, resume_state
from edgefl.experiment.round_energy import RoundEnergy
from edgefl.experiment.rounds import client_columns, event_columns, metrics_row
from edgefl.experiment.rows import (
    CLIENTS,
    EVENTS,
    METRICS,
    PICKED,
    emulates_host,
    energy_headers,
    extra_columns,
    living_client_columns,
    open_log,
    output_format,
    prediction_error,
    run_summary,
    span,
)
from edgefl.report.trace import TraceSample
from edgefl.rundir import CHECKPOINT, WriteFailed, write_file
from edgefl.runlog import CsvLog, Log, log_names
from edgefl.scenario import Scenario, to_toml
from edgefl.selection.server import Selection, workload_need
from edgefl.sim.availability import trace_file
from edgefl.sim.bulk import Pricer
from edgefl.sim.clients import STATUSES
from edgefl.sim.engine import Federation
from edgefl.training.local import evaluate


def run(exp: Experiment, out: Path, progress: bool = True, resume: bool = False) -> dict[str, Any]:
    """Train and simulate every round, writing the run directory as it goes; with `resume`,
    continue from the run directory's checkpoint after checking every file it reads."""
    try:
        return _run(exp, out, progress, resume)
    finally:
        rundir.let_go(out)


def _run(exp: Experiment, out: Path, progress: bool, resume: bool) -> dict[str, Any]:
    """`run`, its failed writes said in one line with what to do next."""
    try:
        return _rounds(exp, out, progress, resume)
    except WriteFailed as exc:
        saved = not exp.dry_run and (out / CHECKPOINT).exists()
        then = (f"then continue it with edgefl run --resume {out}" if saved
                else "then start it again with --overwrite (it has no checkpoint yet)")
        raise EdgeflError(str(exc.path), "write", f"cannot write it ({exc.reason}); everything written "
                          f"before is kept: free space or make the folder writable, {then}") from None


def _start(exp: Experiment, out: Path, resume: bool, text: str) -> tuple[dict[str, str], Resumed | None]:
    """The run's fingerprint, and its checkpoint when resuming (checked: resume_state); a new run
    claims its folder and writes its marker and scenario.toml first."""
    s = exp.scenario
    trace = trace_file(s.fleet, exp.where)
    files = [*exp.pool.profile_files(), *([trace] if trace else [])]
    _outside(out, files)
    fingerprint, digests = rundir.fingerprint(trained_alike(s), files), rundir.profile_digests(files)
    if resume:
        rundir.hold(out, "--resume")
        state = resume_state(exp, out, fingerprint, digests)
        rundir.drop_temporary(out)  # a killed run's, left beside the files it was writing
        return fingerprint, state
    rundir.claim(out, "run")  # a no-op after prepare_out; library callers get the same checks
    rundir.hold(out)
    rundir.write_marker(out, "run", {**fingerprint, **digests, rundir.ORIGIN: str(Path(exp.where).resolve())})
    write_file(out / "scenario.toml", text)
    return fingerprint, None


def _rounds(exp: Experiment, out: Path, progress: bool, resume: bool) -> dict[str, Any]:
    s = exp.scenario
    text = to_toml(s)
    selection = Selection(s, exp.pool, exp.dry_run, exp.ctx.splits,
                          workload_need(exp.method, exp.pool))
    fingerprint, saved = _start(exp, out, resume, text)
    if not saved:
        _warn_idle(s)
    evaluator = None if exp.dry_run else Evaluator(exp)
    pricer = Pricer(exp.ctx.cost, exp.pool, lambda k: len(exp.ctx.splits[k].train))
    fed, rows, first, before_s = Federation(), [], 0, 0.0
    energy = RoundEnergy(s, exp.pool)
    if saved:  # wall seconds: those of the sessions before, and this one's
        rows, first, before_s = saved.state["rows"], saved.state["next_round"], saved.state["wall_s"]
    started = time.perf_counter()
    player = make_player(exp, _executor(exp, text), fed, pricer, energy, selection)
    if saved:
        player.resume(first, saved.state["player"], str(out / CHECKPOINT))
        restore(exp, out, saved, selection)
    kept = saved.logs if saved else {}
    names = log_names(output_format(s))
    sample = TraceSample(s.fleet.clients, s.output.trace_clients, s.seed)
    metric_headers, client_headers = _headers(exp, selection)
    with (CsvLog(out / names["metrics"], metric_headers, kept.get(names["metrics"])) as metrics,
          open_log(out, names["clients"], client_headers, kept) as clients,
          open_log(out, names["events"], EVENTS, kept) as events):
        logs: list[Log] = [metrics, clients, events]
        sample.add(span(r) for r in events.rows() if int(r["client"]) in sample.kept)
        bar = tqdm(range(first, s.rounds), desc=f"{s.method}", unit="round", disable=not progress,
                   initial=first, total=s.rounds)
        diverged = False
        for t in bar:
            if exp.method.finished():  # ended before its last round (FedProphet's last module)
                break
            exp.method.start_round(t)
            table, loss, real = player.play(t)
            diverged = diverged or _warn_diverged(t, loss)  # said once
            row = metrics_row(table, loss, exp.method.round_info())
            last = t + 1 == s.rounds or exp.method.finished()
            row.update(dict.fromkeys(extra_columns(s), ""))  # as clean_acc: empty unless evaluated
            if evaluator and ((t + 1) % s.evaluation.every == 0 or last):
                row.update(evaluator(exp.method.global_model()))
                bar.set_postfix(clean=f"{row['clean_acc']:.3f}", adv=f"{row['adv_acc']:.3f}",
                                sim_h=f"{fed.now / 3600:.2f}")
            metrics.write([row])
            clients.write_columns(client_columns(table, exp.pool, real, client_headers))
            spans = event_columns(table)
            events.write_columns(spans)
            sample.add_columns(spans)  # nothing is kept across rounds but the trace's sample
            rows.append(row)
            del table, spans  # not held while the next round plays (a million devices': 0.3 GB)
            if resumable(exp) and ((t + 1) % s.checkpoint_every == 0 or last):
                wall_s = before_s + time.perf_counter() - started
                _save(out, t + 1, exp, rows, selection, fingerprint, logs, wall_s, player)
        tail = player.ending()
        if tail is not None:
            events.write_columns(tail)
            sample.add_columns(tail)
    return _finish(exp, out, rows, before_s + time.perf_counter() - started, sample)


def resumable(exp: Experiment) -> bool:
    """Whether the run checkpoints (`checkpoint_every`): not a dry run."""
    return not exp.dry_run and exp.scenario.checkpoint_every > 0


def _warn_idle(s: Scenario) -> None:
    """Say on stderr what a setting cannot do in this run (`_idle_settings`)."""
    for message in _idle_settings(s):
        tqdm.write(f"edgefl: warning: {message}", file=sys.stderr)


def _idle_settings(s: Scenario) -> list[str]:
    """Settings that do less than they say: a clean warm-up (`training.warmup_rounds`) covering
    every round of a run with an attack, which never trains against it; an async run's
    `round.concurrency` above its fleet, of which at most all train at once."""
    out = []
    w, c, n = s.training.warmup_rounds, s.round.concurrency, s.fleet.clients
    if s.attack.name != "none" and w >= s.rounds:
        out.append(f"training.warmup_rounds ({w}) covers all {s.rounds} rounds: no round trains against "
                   'the attack (lower it, or set attack.name = "none" for a clean run)')
    if s.round.mode == "async" and c > n:
        out.append(f"round.concurrency ({c}) is above fleet.clients ({n}): at most {n} clients train at once")
    return out


def _warn_diverged(t: int, loss: float | str) -> bool:
    """Say on stderr that local training diverged when round t's training loss is not finite (the
    run goes on: its models and accuracies are what they are); True when it did."""
    if isinstance(loss, str) or np.isfinite(loss):
        return False
    tqdm.write(f"edgefl: warning: round {t}: the training loss is {loss}: local training diverged "
               "(lower training.lr); the run goes on", file=sys.stderr)
    return True


def _save(out: Path, next_round: int, exp: Experiment, rows: list[dict[str, Any]], selection: Selection,
          fingerprint: dict[str, str], logs: list[Log], wall_s: float, player: RoundPlayer) -> None:
    """The checkpoint after a round, sealing each log's rows so far; then the logs commit them."""
    checkpoint.save(out, {"next_round": next_round, "method": exp.method.state(), "rows": rows,
                          "selection": selection.state(), "fingerprint": fingerprint,
                          "wall_s": wall_s, "player": player.state(),
                          "logs": {log.path.name: log.seal() for log in logs}})
    for log in logs:
        log.commit()


def _headers(exp: Experiment, selection: Selection) -> tuple[list[str], list[str]]:
    """metrics.csv's and clients.csv's columns: the fixed ones, then the evaluation's, the method's,
    a living fleet's, the selection's and energy's where the scenario has them."""
    s = exp.scenario
    energy_clients, energy_metrics = energy_headers(s)
    metrics = (METRICS + extra_columns(s) + list(exp.method.round_info())
               + (list(STATUSES) if s.living else []) + energy_metrics)
    clients = CLIENTS + (PICKED if selection.logged else []) + living_client_columns(s) + energy_clients
    return metrics, clients


def _finish(exp: Experiment, out: Path, rows: list[dict[str, Any]], wall_s: float,
            sample: TraceSample) -> dict[str, Any]:
    """summary.json (with the time-prediction check on a host-emulating run) and trace.json."""
    summary = run_summary(exp, rows, wall_s)
    error = prediction_error(out) if emulates_host(exp) else None
    if error is not None:
        summary["time_prediction_error"] = error
    trace = sample.trace([d.name for d in exp.pool.devices])
    write_file(out / "trace.json", json.dumps(trace) + "\n")
    write_file(out / "summary.json", json.dumps(summary, indent=2) + "\n")
    return summary


def _executor(exp: Experiment, text: str) -> Executor:
    """In-process, or (`executor = "ray"`, not in a dry run, and the run not itself a Ray task) Ray
    workers that remake the method from the resolved scenario `text`."""
    if exp.scenario.executor == "ray" and not exp.dry_run and not exp.clients_here:
        return RayExecutor(exp.scenario.ray, exp.where, exp.method, Rebuild(text, exp.where))
    return LocalExecutor(exp.method)


class Evaluator:
    """Clean and adversarial test accuracy of a model: `adv_acc` and one `<name>_acc` per extra."""

    def __init__(self, exp: Experiment) -> None:
        s, e = exp.scenario, exp.scenario.evaluation
        self.attacks = {name: make_attack(name, e.eps or s.attack.eps, e.step_size or s.attack.step_size,
                                          e.steps) for name in [e.attack, *e.extra]}
        self.columns = extra_columns(s)
        n = s.data.test_samples or len(exp.ctx.data.test_y)
        self.x, self.y = exp.ctx.data.test_x[:n], exp.ctx.data.test_y[:n]
        self.cuda = [exp.ctx.device] if exp.ctx.device.type == "cuda" else []

    def __call__(self, model: torch.nn.Module) -> dict[str, float]:
        """The row's accuracies; the attacks' random starts come from a fork of torch's random
        state, so how often and how a run is evaluated never changes what training draws next
        (FedProphet's d* at the next module, for one)."""
        (_, attack), *extras = self.attacks.items()
        with torch.random.fork_rng(devices=self.cuda):
            clean, adv = evaluate(model, self.x, self.y, attack)
            row = {"clean_acc": round(clean, 4), "adv_acc": round(adv, 4)}
            for name, extra in extras:
                row[f"{name}_acc"] = round(evaluate(model, self.x, self.y, extra)[1], 4)
        return row


def start_or_resume(exp: Experiment, out: Path, progress: bool) -> dict[str, Any]:
    """A comparison's run in `out`: resumed from its checkpoint when it has one, else started again in
    a folder emptied of edgefl's files."""
    resume = (out / CHECKPOINT).exists()
    if not resume:
        prepare_out(out, True)
    return run(exp, out, progress=progress, resume=resume)


def trained_alike(s: Scenario) -> str:
    """The scenario as its run's fingerprint sees it: where the clients train (`executor`, `[ray]`)
    left out, since in-process and Ray workers give the same updates, so a run begun on a cluster
    that is gone resumes on another, or in-process (`edgefl run --resume --executor local`)."""
    return to_toml(replace(s, executor="local", ray=RayConfig()))


def _outside(out: Path, inputs: list[Path]) -> None:
    """Refuse an input (a trace, a profile) that is one of the files the run writes in `out`."""
    folder = out.resolve()
    for path in inputs:
        if path.resolve().parent == folder and path.name in rundir.RUN_FILES:
            raise EdgeflError(str(path), "file", f"is an input of the run, inside its run folder, where the "
                              f"run writes its own {path.name}; keep the run's inputs outside --out")


def prepare_out(out: Path, overwrite: bool) -> None:
    """Make `out` a new run folder: create it or take an empty one; a folder holding an edgefl run
    is replaced only with --overwrite, and only when edgefl wrote everything in it; any other
    folder is refused."""
    there = rundir.probe(out, "--out") == "dir"
    if there:  # held before anything in it is judged or removed: another run's folder is refused
        rundir.hold(out)
    try:
        if there and rundir.marker_kind(out) == "run":
            if not overwrite:
                raise EdgeflError(str(out), "--out", "already holds a run; choose another --out or "
                                  "pass --overwrite to replace it")
            rundir.clear_run(out)
        rundir.claim(out, "run")
        rundir.hold(out)
    except BaseException:
        rundir.let_go(out)
        raise
