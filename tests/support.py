"""Helpers shared by the test modules (fixtures live in conftest.py): no test module imports another."""

from __future__ import annotations

import csv
import errno
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from reference import RoundRecord

from edgefl import checkpoint, rundir
from edgefl.experiment import CLIENTS, METRICS, Experiment, prepare, run
from edgefl.scenario import Scenario
from edgefl.sim.engine import PHASES, Span

ROOT = Path(__file__).resolve().parents[1]

def one_error_line(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("edgefl: error:")
    assert "Traceback" not in err
    return lines[0]


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in folder.rglob("*") if p.is_file()}


def simulated_rows(clients_csv: Path) -> list[dict[str, str]]:
    """clients.csv less the measured wall time, which differs from run to run."""
    with open(clients_csv, newline="") as f:
        return [{k: v for k, v in r.items() if k != "real_compute_s"} for r in csv.DictReader(f)]


QUICKSTART = ROOT / "scenarios" / "quickstart.toml"


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


DEVICE = """\
name = "{name}"
description = "A test board"
source = "made up"
pools = ["test"]
memory_mb = {memory_mb}
compute_gflops = 10.0
storage_read_mb_s = 100.0
storage_write_mb_s = 50.0
storage_latency_ms = 0.1
networks = {networks}
"""


def device_text(name: str = "board", memory_mb: str = "100.0",
                networks: str = '["wifi", "4g"]') -> str:
    return DEVICE.format(name=name, memory_mb=memory_mb, networks=networks)


# client rows: round, mem_avail, mem_req, download, data access, compute, upload, wait (seconds);
# per client download + data access + compute + upload + wait = round time - server time
JFAT_CLIENTS = [(0, 1e6, 2e6, 1, 9, 80, 10, 0), (0, 4e6, 2e6, 1, 1, 38, 0, 60),  # round 0: 100 - 0
                (1, 3e6, 2e6, 2, 18, 100, 20, 0), (1, 1.5e6, 1.5e6, 2, 2, 56, 0, 80)]  # round 1: 150 - 10


PROPHET_CLIENTS = [(t, 2e6, 1e6, 1, 1, 36, 2, 0) for t in range(3)]  # rounds of 40, 40, 45 - 5


def write_run(path: Path, method: str, metrics: list[dict[str, object]],
              clients: Sequence[tuple[float, ...]]) -> Path:
    """A run directory as `edgefl run` writes it, with only the columns the report reads filled."""
    path.mkdir()
    (path / "scenario.toml").write_text(
        f'method = "{method}"\nseed = 0\n\n[fleet]\npool = "edge"\nbalance_s = 0.0\n'
        "reserved_memory_mb = 1.0\n")
    extra = [k for k in metrics[0] if k not in METRICS]
    with open(path / "metrics.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, METRICS + extra, restval="")
        writer.writeheader()
        writer.writerows(metrics)
    with open(path / "clients.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, CLIENTS, restval="")
        writer.writeheader()
        for k, (t, avail, req, down, data, comp, up, wait) in enumerate(clients):
            writer.writerow({"round": int(t), "client": k % 2, "device": "d", "flops": 1e9 * (k + 1),
                             "mem_avail_bytes": int(avail), "mem_req_bytes": int(req),
                             "download_s": down, "data_access_s": data, "compute_s": comp,
                             "upload_s": up, "wait_s": wait})
    return path


def round_spans(record: RoundRecord) -> Iterator[Span]:
    """The per-client path's spans, as events.csv lays them out (edgefl.experiment.rounds.event_columns):
    each client's phases back to back from the round's start (clients in order), then each waiting
    client's wait until the straggler's upload ends."""
    for r in record.clients:
        c, start = r.cost, record.start_s
        for phase, seconds in zip(PHASES, (c.download_s, c.data_access_s, c.compute_s, c.upload_s),
                                  strict=True):
            yield Span(r.round, r.client, phase, start, start + seconds)
            start += seconds
    last = max(r.finish_s for r in record.clients)
    for r in record.clients:
        if r.wait_s > 0:
            yield Span(r.round, r.client, "wait", r.finish_s, last)


SMALL = ["rounds=3", "fleet.clients=6", "training.local_iters=4", "attack.steps=2", "evaluation.steps=2",
         "data.test_samples=32", "threads=1"]


def full_disk(when: Callable[[str], bool], code: int = errno.ENOSPC) -> Callable[[int, bytes], None]:
    """A `_write_all` that, for a file `when` picks, writes half the bytes and fails as a full disk
    (or read-only storage) would."""
    real = rundir._write_all

    def write_all(fd: int, payload: bytes) -> None:
        if when(Path(os.readlink(f"/proc/self/fd/{fd}")).name):
            os.write(fd, payload[:len(payload) // 2])
            raise OSError(code, os.strerror(code))
        real(fd, payload)
    return write_all


def nth(name: str, n: int) -> Callable[[str], bool]:
    """True on the n-th write (from 1) to a file whose name starts with `name`, and after it."""
    seen = [0]

    def pick(written: str) -> bool:
        if written.lstrip(".").startswith(name):
            seen[0] += 1
        return seen[0] >= n
    return pick


@contextmanager
def dies_before_checkpoint(next_round: int) -> Iterator[None]:
    """Within: a run raises KeyboardInterrupt (exit 130 from the CLI) where it would save the
    checkpoint whose `next_round` is `next_round`; the real save is back afterwards."""
    real = checkpoint.save

    def save(path: Path, state: dict[str, Any]) -> None:
        if state["next_round"] == next_round:
            raise KeyboardInterrupt
        real(path, state)

    checkpoint.save = save  # type: ignore[assignment]
    try:
        yield
    finally:
        checkpoint.save = real


def dry_twice(s: Scenario, where: Path, out: Path, files: tuple[str, ...]) -> tuple[Experiment, list[str]]:
    """Dry runs of `s` (read from `where`) into out/a and out/b, each of `files` written the same by
    both: the second run's experiment and the texts of the files."""
    texts = []
    for name in ("a", "b"):
        exp = prepare(s, str(where), dry_run=True)
        run(exp, out / name, progress=False)
        texts.append([(out / name / f).read_text() for f in files])
    assert texts[0] == texts[1], "the same scenario and seed must give the same files"
    return exp, texts[0]


def sleeper(module: str, name: str, ready: str) -> str:
    """A `python -c` script: `edgefl` run on its arguments but the last (the run's checkpoint, as
    `checkpoint`), with `module`.`name` patched to touch the file $MARK and sleep until it is killed
    once `ready` (an expression of `checkpoint`) holds."""
    return f"""
import os, sys, time
from pathlib import Path
import torch
import {module} as patched
from edgefl.cli import main
real, checkpoint, mark = patched.{name}, Path(sys.argv[-1]), Path(os.environ["MARK"])
def sleeps(*args, **kwargs):
    if {ready}:
        mark.touch()
        time.sleep(600)
    return real(*args, **kwargs)
patched.{name} = sleeps
raise SystemExit(main(sys.argv[1:-1]))
"""


def kill_at(cmd: list[str], mark: Path, cwd: Path, what: str) -> None:
    """Run `cmd` (a `sleeper`) until it makes the file `mark` (within 120 s), then SIGKILL it; `what`
    says what the run never reached if it does not."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env={**os.environ, "MARK": str(mark)})
    try:
        deadline = time.monotonic() + 120
        while not mark.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert mark.exists(), f"the run never reached {what}"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        proc.kill()


U64 = 2.0**-53  # float64's unit roundoff
ADAM_EPS = 1e-8  # torch.optim.Adam's default, which edgefl.training.local.make_optimizer keeps


def longest_sum(model: Any) -> int:
    """The most terms one convolution or linear layer adds up (forward: a filter's inputs;
    backward: an input's outputs). A sum of n terms reordered moves by at most about n u of the
    terms' magnitude (Higham's gamma_n), which bounds what summation order alone can change."""
    from torch import nn

    return max(max(m.weight[0].numel(), m.weight[:, 0].numel()) for m in model.modules()
               if isinstance(m, nn.Conv2d | nn.Linear))


def adam_tolerance(lr: float, model: Any) -> float:
    """How far two float64 Adam trainings that differ only in summation order may end apart (absolute
    and relative): Adam's step lr g / (|g| + eps) turns a rounding dg of a near-zero gradient into up
    to (lr / eps) dg, a gradient's sum of n terms rounds by up to n u, and the weights carry that into
    every BatchNorm statistic computed from them."""
    return lr / ADAM_EPS * longest_sum(model) * U64


def trained_one_by_one(build: Callable[[], Any], data: Sequence[tuple[dict[str, Any], Any, Any]], cfg: Any,
                       lr: float, iters: int, batch: int, attack: Any, objective: Any,
                       ) -> tuple[list[dict[str, Any]], list[float]]:
    """Grouped training's reference: each client's (start state, images, labels) trained by
    `train_local` from its own random stream; the end states and mean losses."""
    import copy

    from edgefl.training.local import make_optimizer, seed_everything, train_local

    states, losses = [], []
    for k, (state, x, y) in enumerate(data):
        model = build()
        model.load_state_dict(state)
        gen = seed_everything(0, 7, k)  # after building the model: its init draws from torch's RNG
        losses.append(train_local(model, x, y, make_optimizer(list(model.parameters()), cfg, lr),
                                  iters, batch, attack, gen, objective))
        states.append(copy.deepcopy(model.state_dict()))
    return states, losses
