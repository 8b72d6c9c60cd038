"""The SimPy engine: straggler-bound rounds, waits, spans; and seeded runs end to end."""

from __future__ import annotations

import csv
import itertools
from pathlib import Path

import numpy as np
import pytest
from reference import run_round
from support import QUICKSTART, round_spans, simulated_rows

from edgefl.devices.pool import DeviceState
from edgefl.devices.profile import DeviceProfile
from edgefl.experiment import prepare, run
from edgefl.scenario import load_scenario
from edgefl.sim.cost import ClientCost, make_cost_model
from edgefl.sim.engine import PHASES, Federation

DEV = DeviceProfile(name="toy", description="", source="hand", memory_mb=1.0, compute_gflops=1.0,
                    storage_read_mbps=1.0, storage_write_mbps=1.0, storage_latency_ms=0.0)
STATE = DeviceState(DEV, "idle", 1e6, 1e9, "wifi", 1.0, 1.0, 0.0)


def cost(download: float, access: float, compute: float, upload: float) -> ClientCost:
    return ClientCost(compute_s=compute, data_access_s=access, download_s=download,
                      upload_s=upload, mem_req_bytes=0.0, swapped=False)


# busy: client 3: 1 + 2 + 3 + 4 = 10 s; client 7: 0.5 + 0 + 20 + 1.5 = 22 s; client 9: 4 s
JOBS = [(3, STATE, cost(1.0, 2.0, 3.0, 4.0)), (7, STATE, cost(0.5, 0.0, 20.0, 1.5)),
        (9, STATE, cost(1.0, 1.0, 1.0, 1.0))]


def test_round_time_is_the_straggler_plus_server_time():
    fed = Federation()
    record = run_round(fed, 0, JOBS, 5.0)
    assert record.start_s == 0.0
    assert record.end_s == pytest.approx(22.0 + 5.0)
    assert record.server_s == 5.0
    assert fed.now == pytest.approx(27.0)
    finish = {c.client: c.finish_s for c in record.clients}
    assert finish == pytest.approx({3: 10.0, 7: 22.0, 9: 4.0})
    # waiting: from a client's last upload to the straggler's
    waits = {c.client: c.wait_s for c in record.clients}
    assert waits == pytest.approx({3: 22.0 - 10.0, 7: 0.0, 9: 22.0 - 4.0})


def test_two_rounds_accumulate_the_clock():
    fed = Federation()
    first = run_round(fed, 0, JOBS, 5.0)
    second = run_round(fed, 1, [(3, STATE, cost(1.0, 1.0, 1.0, 1.0))], 5.0)
    assert second.start_s == pytest.approx(first.end_s) == pytest.approx(27.0)
    assert second.end_s == pytest.approx(27.0 + 4.0 + 5.0)
    assert second.end_s - second.start_s == pytest.approx(9.0)
    assert second.clients[0].finish_s == pytest.approx(31.0)
    assert second.clients[0].wait_s == 0.0
    assert fed.now == pytest.approx(36.0)


def test_spans_cover_each_client_contiguously():
    fed = Federation()
    records = [run_round(fed, 0, JOBS, 5.0), run_round(fed, 1, JOBS, 5.0)]
    every = [s for r in records for s in round_spans(r)]
    for round_, start in ((0, 0.0), (1, 27.0)):
        for k, _, c in JOBS:
            spans = sorted((s for s in every if s.round == round_ and s.client == k),
                           key=lambda s: s.start_s)
            phases = [s.phase for s in spans]
            durations = (c.download_s, c.data_access_s, c.compute_s, c.upload_s)
            assert phases[:4] == list(PHASES)
            assert spans[0].start_s == pytest.approx(start)
            for a, b in itertools.pairwise(spans):
                assert b.start_s == pytest.approx(a.end_s)
            for s, seconds in zip(spans, durations, strict=False):
                assert s.end_s - s.start_s == pytest.approx(seconds)
            if k == 7:  # the straggler does not wait
                assert phases == list(PHASES)
            else:
                assert phases == [*PHASES, "wait"]
                assert spans[-1].end_s == pytest.approx(start + 22.0)


@pytest.mark.parametrize("server_s", [0.0, 5.0])
def test_play_and_the_per_client_processes_give_the_same_times_to_the_bit(server_s):
    """The quickstart's fleet priced for 3 rounds: both paths give the same floats (not approx)."""
    scenario = load_scenario(QUICKSTART, ["fleet.clients=200", "fleet.sample_fraction=0.5"])
    exp = prepare(scenario, str(QUICKSTART), dry_run=True)
    cost_model = make_cost_model(scenario.cost)
    bulk, each = Federation(1234.5678), Federation(1234.5678)
    for t in range(3):
        states = {k: exp.pool.state(k, t) for k in exp.pool.sampled(t).tolist()}
        jobs = [(k, st, cost_model.cost(exp.method.plan(t, k, st).workload, st)) for k, st in states.items()]
        phases = [np.array([getattr(c, f) for _, _, c in jobs])
                  for f in ("download_s", "data_access_s", "compute_s", "upload_s")]
        start, finish, last = bulk.play(*phases, server_s)
        record = run_round(each, t, jobs, server_s)
        assert (start, bulk.now) == (record.start_s, record.end_s)
        assert finish.tolist() == [c.finish_s for c in record.clients]
        assert (last - finish).tolist() == [c.wait_s for c in record.clients]
        assert len(set(finish.tolist())) > 1  # clients really differ


def _run(out: Path) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    scenario = load_scenario(QUICKSTART, [
        "rounds=2", "training.local_iters=2", "attack.steps=2", "evaluation.steps=2",
        "data.test_samples=64", "fleet.sample_fraction=0.25", "device=cpu"])
    run(prepare(scenario, str(QUICKSTART)), out, progress=False)
    with open(out / "metrics.csv", newline="") as f:
        metrics = list(csv.DictReader(f))
    return metrics, simulated_rows(out / "clients.csv")


def test_same_seed_same_simulated_times(tmp_path):
    metrics_a, clients_a = _run(tmp_path / "a")
    metrics_b, clients_b = _run(tmp_path / "b")
    assert len(metrics_a) == 2
    columns = ["sim_time_s", "compute_s", "data_access_s", "comm_s"]
    assert [[r[c] for c in columns] for r in metrics_a] == [
        [r[c] for c in columns] for r in metrics_b]
    assert clients_a == clients_b
    assert float(metrics_a[1]["sim_time_s"]) > float(metrics_a[0]["sim_time_s"]) > 0
    assert len(clients_a) == 2 * 5  # 5 clients (20 x 0.25) x 2 rounds
