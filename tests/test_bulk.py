"""The hybrid engine: counter-based draws, bulk plans and bulk pricing give what the per-client path
gives, to the bit, in any batch order; and whole dry runs write the same files either way."""

from __future__ import annotations

import filecmp
import math
from pathlib import Path

import numpy as np
import pytest
from reference import client_cost, folded_state, per_client
from support import QUICKSTART, ROOT

from edgefl.config import FleetConfig
from edgefl.devices import draws
from edgefl.devices.catalog import load_catalog
from edgefl.devices.pool import DevicePool, StateMap
from edgefl.experiment import prepare, run
from edgefl.methods.base import grouped
from edgefl.scenario import load_scenario
from edgefl.sim.bulk import Pricer
from edgefl.sim.cost import WalkIndex, make_cost_model, walk_key
from edgefl.sim.swap import footprint, min_budget, traced_walks

FEDPROPHET = ROOT / "scenarios" / "fedprophet-quickstart.toml"

# draws ---------------------------------------------------------------------------------------------


def test_the_key_is_splitmix64() -> None:
    """SplitMix64 seeded 0 (Steele et al.; Vigna's splitmix64.c) outputs mix(golden), mix(2 golden):
    the hash of the one-word keys 0 and golden."""
    assert draws.key(0) == 0xE220A8397B1DCDAF
    assert draws.key(draws.GOLDEN) == 0x6E789E6AA1B965F4


def test_words_are_the_key_folded_per_client() -> None:
    ids = np.array([0, 1, 7, 123_456, 2**40 + 3])
    words = draws.words(draws.key(5, 2, 9), ids, 6)
    assert words.tolist() == [[draws.key(5, 2, 9, int(k), j) for j in range(6)] for k in ids]


def test_uniforms_and_indices_span_their_ranges() -> None:
    ends = np.array([0, 2**64 - 1], dtype=np.uint64)
    assert draws.uniform(ends).tolist() == [0.0, 1.0 - 2.0**-53]
    assert draws.index(ends, 3).tolist() == [0, 2]
    u = draws.uniform(draws.words(draws.key(1), np.arange(20_000), 1))
    assert 0.49 < u.mean() < 0.51 and len(np.unique(u)) == 20_000


def test_bulk_states_equal_the_per_client_draws_in_any_order() -> None:
    fleet = FleetConfig(clients=400, pool="edge", sample_fraction=0.5)
    pool = DevicePool(load_catalog(), fleet, 11)
    for t in range(3):
        clients = pool.sampled(t)
        states = pool.states(clients, t)
        assert [pool.state_at(states, i) for i in range(len(clients))] == [
            folded_state(pool, k, t) for k in clients.tolist()]
        subset = np.random.default_rng(t).permutation(clients)[:50]  # another batch, another order
        alone = pool.states(np.sort(subset), t)
        rows = np.searchsorted(clients, np.sort(subset))
        assert alone.memory_bytes.tolist() == states.memory_bytes[rows].tolist()
        assert alone.up_bps.tolist() == states.up_bps[rows].tolist()
        view = StateMap(pool, states)
        assert view[int(clients[3])] == folded_state(pool, int(clients[3]), t) and len(view) == len(clients)


# pricing -------------------------------------------------------------------------------------------


def quickstart(*overrides: str, scenario: Path = QUICKSTART):  # type: ignore[no-untyped-def]
    s = load_scenario(scenario, ["fleet.clients=600", *overrides])
    return s, prepare(s, str(scenario), dry_run=True)


def test_the_walk_index_gives_every_budgets_walk() -> None:
    """Budgets from R_min to the footprint, densely: looked up, each equals its own walk."""
    s, exp = quickstart()
    w = walk_key(exp.method.plan(0, 0, exp.pool.state(0, 0)).workload)
    budgets = np.linspace(s.fleet.reserved_memory_mb * 1e6, footprint(w), 600)
    index = WalkIndex(w)
    for part in np.array_split(np.random.default_rng(0).permutation(budgets), 3):  # three rounds
        ids = index.lookup(part)
        for b, i in zip(part.tolist(), ids.tolist(), strict=True):
            assert index.results[i] == traced_walks(w, b)[0]
    assert len(index.results) > 5  # the budgets really walk differently
    assert len(index.points) < len(budgets) / 4  # and most were looked up
    assert min_budget(w)[0] < budgets[0]


@pytest.mark.parametrize(("scenario", "overrides"), [
    (QUICKSTART, []), (QUICKSTART, ["cost.communication=false"]), (FEDPROPHET, []),
    (QUICKSTART, ["cost.accounting=paper"])])
def test_bulk_prices_equal_the_per_client_costs(scenario: Path, overrides: list[str]) -> None:
    s, exp = quickstart(*overrides, scenario=scenario)
    model = make_cost_model(s.cost)
    pricer = Pricer(model, exp.pool, lambda k: len(exp.ctx.splits[k].train))
    for t in range(3):
        states = exp.pool.states(exp.pool.sampled(t), t)
        plan = exp.method.plan_round(t, states.clients, StateMap(exp.pool, states))
        costs = pricer.price(plan, states)
        for i, k in enumerate(states.clients.tolist()):
            assert costs.cost(i) == client_cost(pricer, plan, i, k, exp.pool.state_at(states, i))
        exp.method.skip(t, states.clients.tolist())


@pytest.mark.parametrize("overrides", [[], ["training.local_epochs=1.5", "training.fedbn=false"]])
def test_the_fedavg_family_plans_in_bulk_as_client_by_client(overrides: list[str]) -> None:
    _, exp = quickstart(*overrides)
    m = exp.method
    for t in range(3):
        states = StateMap(exp.pool, exp.pool.states(exp.pool.sampled(t), t))
        clients = np.array(list(states))
        bulk = m.plan_round(t, clients, states)
        each = [m.plan(t, k, states[k]) for k in clients.tolist()]
        assert [bulk.plan(i) for i in range(len(clients))] == each
        assert len(bulk.plans) == len(grouped(each).plans)
        m.skip(t, clients.tolist())


# whole runs ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(("scenario", "overrides"), [
    (QUICKSTART, ["output.format=csv"]), (QUICKSTART, ["output.format=parquet"]),
    (FEDPROPHET, []), (QUICKSTART, ["cost.accounting=paper", "training.local_epochs=1"]),
    *((ROOT / "scenarios" / f"{name}-digits.toml", []) for name in ("gma", "heterofl", "feddf")),
    (ROOT / "scenarios" / "feddynat-digits.toml", ["fleet.clients=12"]),  # its skewed split: few clients
    (ROOT / "scenarios" / "living-digits.toml", []),  # diurnal, deadline, batteries, memory_fit
    (ROOT / "scenarios" / "living-digits.toml", ["round.mode=sync", "selection.policy=uniform"])])
def test_bulk_and_per_client_runs_write_the_same_files(tmp_path: Path, scenario: Path, overrides: list[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    outs = []
    for bulk in (True, False):
        if not bulk:
            per_client(monkeypatch)  # the reference (tests/reference.py)
        s = load_scenario(scenario, ["fleet.clients=300", "rounds=4", *overrides])
        exp = prepare(s, str(scenario), dry_run=True)
        out = tmp_path / f"bulk{bulk}"
        run(exp, out, progress=False)
        outs.append(out)
    files = sorted(p.name for p in outs[0].iterdir() if p.name != "summary.json")
    assert {"metrics.csv", "trace.json"} <= set(files)
    assert all(filecmp.cmp(outs[0] / f, outs[1] / f, shallow=False) for f in files), files
    rows = (outs[0] / "metrics.csv").read_text().splitlines()
    assert len(rows) == 5 and not math.isnan(float(rows[-1].split(",")[1]))
