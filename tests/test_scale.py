"""Fleet scale: streamed CSV and Parquet logs, the trace's bounded sample, the fleet memory check,
compact uint8 datasets converted per batch, and resume from Parquet logs."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from reference import run_round, walk_cost
from support import QUICKSTART, SMALL, full_disk, nth, one_error_line, round_spans, sets

from edgefl import rundir
from edgefl.cli import main
from edgefl.config import FleetConfig, RoundConfig
from edgefl.data.datasets import to_float, with_stats
from edgefl.devices.pool import check_fleet_memory
from edgefl.errors import EdgeflError
from edgefl.experiment import prepare, run
from edgefl.report.compare import load_run
from edgefl.report.trace import trace_sample
from edgefl.runlog import log_format, read_rows
from edgefl.scenario import load_scenario
from edgefl.sim.cost import make_cost_model
from edgefl.sim.engine import Federation
from edgefl.training.local import device_batches, evaluate


def dry(out: Path, *overrides: str) -> Path:
    s = load_scenario(QUICKSTART, ["rounds=3", "fleet.clients=40", *overrides])
    run(prepare(s, str(QUICKSTART), dry_run=True), out, progress=False)
    return out


def test_the_streamed_events_are_the_per_client_engines_spans(tmp_path: Path) -> None:
    """events.csv, written round by round, holds what the per-client SimPy path plays, row for row."""
    out = dry(tmp_path / "csv", "output.format=csv")
    s = load_scenario(QUICKSTART, ["rounds=3", "fleet.clients=40"])
    exp = prepare(s, str(QUICKSTART), dry_run=True)
    fed, cost_model, expected, m = Federation(), make_cost_model(s.cost), [], exp.method
    for t in range(3):  # the experiment's round, with the reference engine
        states = {k: exp.pool.state(k, t) for k in exp.pool.sampled(t).tolist()}
        plans = m.plan_round(t, np.array(list(states)), states).by_client(np.array(list(states)))
        jobs = [(k, st, walk_cost(cost_model, plans[k].workload, st)) for k, st in states.items()]
        expected += [{"round": str(x.round), "client": str(x.client), "phase": x.phase,
                      "start_s": repr(x.start_s), "end_s": repr(x.end_s)}
                     for x in round_spans(run_round(fed, t, jobs, m.server_flops(t) / 1e13))]
        m.skip(t, list(states))
    assert read_rows(out, "events")[1] == expected
    assert len(read_rows(out, "clients")[1]) == 3 * 20


def test_parquet_rows_equal_csv_rows(tmp_path: Path) -> None:
    a, b = dry(tmp_path / "csv", "output.format=csv"), dry(tmp_path / "pq", "output.format=parquet")
    assert not (b / "clients.csv").exists() and (b / "clients.parquet").is_file()
    for name in ("clients", "events"):
        assert read_rows(a, name) == read_rows(b, name), name
    assert (a / "metrics.csv").read_bytes() == (b / "metrics.csv").read_bytes()
    assert load_run(a).clients == load_run(b).clients  # what compare and plot read


def test_auto_picks_parquet_above_the_client_rounds_threshold() -> None:
    assert log_format("auto", 100, 100) == "csv"
    assert log_format("auto", 100, 101) == "parquet"
    assert log_format("csv", 0, 10**9) == "csv"
    assert log_format("parquet", 10**9, 1) == "parquet"


def test_the_trace_sample_is_bounded_and_seeded(tmp_path: Path) -> None:
    assert trace_sample(5, 8, 0) == [0, 1, 2, 3, 4]  # a small fleet: every client
    sample = trace_sample(10**6, 16, 3)
    assert len(sample) == len(set(sample)) == 16 and sample == sorted(sample)
    assert sample == trace_sample(10**6, 16, 3) != trace_sample(10**6, 16, 4)
    out = dry(tmp_path / "run", "output.trace_clients=3")
    events = json.loads((out / "trace.json").read_text())["traceEvents"]
    named = [e["tid"] for e in events if e["name"] == "thread_name"]
    assert named == trace_sample(40, 3, 0)
    assert {e["tid"] for e in events if e["ph"] == "X"} <= set(named)
    logged = {int(r["client"]) for r in read_rows(out, "events")[1]}
    assert len(logged) > 3  # the events log keeps every client


def test_a_fleet_too_large_for_memory_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    fleet = FleetConfig(clients=10_000_000, sample_fraction=0.5)
    # need 1e7 x 160 + 5e6 x 1500 = 9.1e9 bytes; at most 1e9 / (160 + 0.5 x 1500) = 1,098,901 clients
    with pytest.raises(EdgeflError, match=r"about 9\.1 GB .* use at most 1,098,901 clients"):
        check_fleet_memory(fleet, "here", available=1e9)
    check_fleet_memory(FleetConfig(clients=400_000, sample_fraction=0.5), "here", available=1e9)
    assert main(["run", str(QUICKSTART), "--dry-run", "--set", "fleet.clients=1000000000"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "fleet.clients" in line and "use at most" in line


def test_a_living_fleet_is_priced_per_client_it_plays() -> None:
    """Deadline rounds select 1.3 x half of 100,000 clients, 3,000 B each: 1e5 x (160 + 0.65 x 3,000)
    = 0.211 GB; at most 2e8 // 2,110 = 94,786 clients fit 0.2 GB. Async holds 8 at a time: 1e5 x 160 +
    8 x 3,000 B = 16.02 MB."""
    fleet = FleetConfig(clients=100_000, sample_fraction=0.5)
    deadline = RoundConfig(mode="deadline", over_selection=1.3)
    with pytest.raises(EdgeflError, match=r"about 0\.2 GB .* use at most 94,786 clients"):
        check_fleet_memory(fleet, "here", available=2e8, living=deadline)
    check_fleet_memory(fleet, "here", available=2e8)  # not living: 1e5 x (160 + 750) = 91 MB
    check_fleet_memory(fleet, "here", available=1.7e7, living=RoundConfig(mode="async", concurrency=8))
    with pytest.raises(EdgeflError, match=r"use at most 99,850 clients"):  # (1.6e7 - 8 x 3,000) // 160
        check_fleet_memory(fleet, "here", available=1.6e7, living=RoundConfig(mode="async", concurrency=8))


def test_uint8_batches_equal_the_float_dataset() -> None:
    r = np.random.default_rng(0)
    raw = r.integers(0, 256, size=(50, 3, 4, 4), dtype=np.uint8)
    labels = r.integers(10, size=50).astype(np.int64)
    compact = with_stats(raw, labels, raw[:20], labels[:20], 10)
    floats = with_stats(raw.astype(np.float32) / 255.0, labels, raw[:20].astype(np.float32) / 255.0,
                         labels[:20], 10)
    assert compact.train_x.dtype == torch.uint8 and floats.train_x.dtype == torch.float32
    assert torch.equal(to_float(compact.train_x), floats.train_x)
    pairs = zip(device_batches(compact.train_x, compact.train_y, 8, 5, torch.Generator().manual_seed(1)),
                device_batches(floats.train_x, floats.train_y, 8, 5, torch.Generator().manual_seed(1)),
                strict=True)
    for (xa, ya), (xb, yb) in pairs:
        assert xa.dtype == torch.float32 and torch.equal(xa, xb) and torch.equal(ya, yb)
    # exact statistics: channel mean and std of v / 255 from the counts, as float64 computes them
    values = raw.transpose(1, 0, 2, 3).reshape(3, -1).astype(np.float64) / 255
    assert compact.mean == pytest.approx(tuple(values.mean(1)), abs=1e-12)
    assert compact.std == pytest.approx(tuple(values.std(1)), abs=1e-12)
    assert floats.mean == pytest.approx(compact.mean, abs=1e-6)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(48, 10))
    attack = lambda m, x, y: x  # noqa: E731 - no perturbation: clean twice
    assert evaluate(model, compact.test_x, compact.test_y, attack) == evaluate(
        model, floats.test_x, floats.test_y, attack)


def simulated(out: Path) -> list[dict[str, str]]:
    return [{k: v for k, v in r.items() if k != "real_compute_s"} for r in read_rows(out, "clients")[1]]


def test_resume_from_parquet_logs(tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch) -> None:
    args = [*sets([*SMALL, "output.format=parquet"]), "--quiet"]
    whole = tmp_path / "whole"
    assert main(["run", str(QUICKSTART), *args, "--out", str(whole)]) == 0
    out = tmp_path / "stopped"
    monkeypatch.setattr(rundir, "_write_all", full_disk(nth("checkpoint.pt", 2), errno.EROFS))
    assert main(["run", str(QUICKSTART), *args, "--out", str(out)]) == 2  # stopped after round 0's seal
    assert "--resume" in one_error_line(capsys.readouterr().err)
    monkeypatch.undo()
    # round 1's seals wait for a checkpoint that never came; no writer's temporary file is left
    assert {p.name for p in out.iterdir() if p.name.endswith(".tmp")} == {
        ".clients.parquet.sealed.tmp", ".events.parquet.sealed.tmp"}
    assert {int(r["round"]) for r in read_rows(out, "clients")[1]} == {0}  # the sealed rows only
    edited = tmp_path / "edited"
    edited.mkdir()
    for p in out.iterdir():
        (edited / p.name).write_bytes(p.read_bytes())
    data = bytearray((edited / "events.parquet").read_bytes())
    data[len(data) // 2] ^= 1
    (edited / "events.parquet").write_bytes(bytes(data))
    assert main(["run", "--resume", str(edited), "--quiet"]) == 2
    assert "events.parquet" in one_error_line(capsys.readouterr().err)
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    assert read_rows(out, "events") == read_rows(whole, "events")
    assert simulated(out) == simulated(whole)
    assert (out / "metrics.csv").read_text().count("\n") == (whole / "metrics.csv").read_text().count("\n")
