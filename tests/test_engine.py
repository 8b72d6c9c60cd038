"""The SimPy engine: straggler-bound rounds, waits, spans; and seeded runs end to end."""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path

import numpy as np
import pytest
from reference import run_round, walk_cost
from support import QUICKSTART, round_spans, simulated_rows

from edgefl.devices.pool import DeviceState
from edgefl.devices.profile import DeviceProfile
from edgefl.experiment import prepare, run
from edgefl.scenario import load_scenario
from edgefl.sim.availability import Always
from edgefl.sim.clients import COMPLETED, Transfers
from edgefl.sim.cost import ClientCost, make_cost_model
from edgefl.sim.engine import PHASES, Federation
from edgefl.sim.links import Links, shared_round
from edgefl.sim.living_round import play_round

DEV = DeviceProfile(name="toy", description="", source="hand", memory_mb=1.0, compute_gflops=1.0,
                    storage_read_mb_s=1.0, storage_write_mb_s=1.0, storage_latency_ms=0.0)
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
        jobs = [(k, st, walk_cost(cost_model, exp.method.plan(t, k, st).workload, st))
                for k, st in states.items()]
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


@pytest.mark.slow
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


def plain_round(seed: int) -> tuple[float, np.ndarray, float]:
    """A random plain round: its start (0 in a third of them), its clients' phase seconds (n, 4;
    a tenth of them none) and the server's seconds."""
    rng = np.random.default_rng([50, seed])
    n = int(rng.integers(1, 80))
    phases = rng.exponential(rng.uniform(0.01, 500.0), (n, 4)) * (rng.random((n, 4)) < 0.9)
    start = float(rng.choice([0.0, rng.uniform(0.0, 1e6), rng.exponential(300.0)]))
    return start, phases, float(rng.choice([0.0, rng.uniform(0.0, 60.0)]))


PLAIN_SEEDS = range(400)


def test_play_times_a_plain_round_as_the_compiled_loop_does() -> None:
    """engine.play times a plain fleet's round (its devices always online, on mains, the server's
    links unshared) in one pass; the compiled loop of a living round (edgefl.sim.living_round
    `play_round`) plays the same round event by event. With S a client's phases summed one by one
    from the start (the loop's stop), play's finish is start + (S - start): SimPy adds a client's
    whole delay to the clock. S - start is off by at most u S (u = 2^-53, S >= start >= 0) and
    adding start back by half a spacing of the result, so the finish is S or a neighbouring float:
    at most one spacing of S apart, and S itself where S - start is exact (from start 0, or S <= 2
    start). The close is the latest finish in both; the server's seconds added to a close one spacing
    apart give ends at most two spacings apart. Over 400 random rounds; the apart ones are counted."""
    apart = 0
    for seed in PLAIN_SEEDS:
        start, phases, server_s = plain_round(seed)
        n, engine, loop = len(phases), Federation(start), Federation(start)
        begin, finish, last = engine.play(*phases.T, server_s)
        r = play_round(loop, np.arange(n), phases, Always(), n, math.inf, server_s)
        assert begin == r.start_s == start and (r.status == COMPLETED).all()
        assert (np.abs(finish - r.stop_s) <= np.spacing(r.stop_s)).all()
        assert last == finish.max() and r.close_s == r.stop_s.max()
        assert abs(engine.now - loop.now) <= 2 * np.spacing(loop.now)
        exact = (start == 0.0) | (r.stop_s <= 2 * start)
        assert finish[exact].tolist() == r.stop_s[exact].tolist()
        apart += int((finish != r.stop_s).sum())
    assert apart > 0  # the tolerance is needed: SimPy's clock arithmetic rounds some finishes apart


def test_play_times_a_plain_round_on_shared_links_as_the_compiled_loop_does() -> None:
    """On shared links a plain round's transfers are played by the compiled loop (links
    `shared_round`, from time 0), and play sums the seconds they took with the other phases. From
    start 0 every clock value of the loop is play's sum but the upload's end: the upload's seconds
    are its end less its start, rounded, then added back, so the finish is at most one spacing of the
    loop's stop apart (as in the test above), the close too. Over 400 random rounds."""
    for seed in PLAIN_SEEDS:
        _, phases, server_s = plain_round(seed)
        rng = np.random.default_rng([51, seed])
        n = len(phases)
        links = Links(*(float(x) for x in rng.uniform(1e3, 1e6, 2)))
        t = Transfers(rng.uniform(0.0, 1e6, (n, 2)), rng.uniform(1e3, 1e6, (n, 2)), rng.uniform(0.0, 0.5, n))
        down, up = shared_round(links, tuple(phases.T), (t.nbytes[:, 0], t.nbytes[:, 1]),
                                (t.bps[:, 0], t.bps[:, 1]), t.latency_s)
        engine, loop = Federation(), Federation()
        _, finish, last = engine.play(down, phases[:, 1], phases[:, 2], up, server_s)
        r = play_round(loop, np.arange(n), phases, Always(), n, math.inf, server_s, (links, t))
        assert (r.status == COMPLETED).all()
        assert (np.abs(finish - r.stop_s) <= np.spacing(r.stop_s)).all()
        assert abs(last - r.close_s) <= np.spacing(r.close_s)
        assert abs(engine.now - loop.now) <= 2 * np.spacing(loop.now)
