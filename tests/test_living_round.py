"""The living round's columns (edgefl.sim.living_round) against the reference that plays every client
as SimPy processes (tests/living_rounds.py `simpy_round`): the same statuses, stops, transfer seconds
and close, to the bit, on random rounds with and without shared links, batteries, offline moments
and deadlines, and the same files from whole runs of the bundled living scenarios."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from living_rounds import play_round, simpy_columns, simpy_round

from edgefl.experiment import living, prepare, run
from edgefl.scenario import load_scenario
from edgefl.sim.clients import Drain, Drains, Transfer, Transfers
from edgefl.sim.engine import Federation
from edgefl.sim.links import Links
from edgefl.sim.living_round import could_run_out

ROOT = Path(__file__).resolve().parents[1]


class Offline:
    """Each client's offline moment, as given."""

    def __init__(self, off: np.ndarray) -> None:
        self.off = off

    def offline_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        return self.off[clients]


def random_round(seed: int, n: int, links: bool, batteries: bool, deadline: bool) -> tuple:
    """A round of n clients: phases of seconds to tens of seconds (some data access of none), a third
    going offline within 80 s, transfers of 0.1-2 MB on links of 0.1-5 MB/s with own bandwidths
    above and below their shares, and batteries of 0.5-60 J (some plugged in from a moment, some on
    a charger until one) spending up to 2 W a phase plus spread joules and joules per byte; a third of
    the rounds need few uploads (their target reached, the rest are dropped)."""
    r = np.random.default_rng(seed)
    t0 = float(r.uniform(0, 5000))
    phases = np.column_stack([r.uniform(0.5, 20, n), r.uniform(0, 1, n), r.uniform(0, 30, n),
                              r.uniform(0.5, 20, n)])
    phases[r.random(n) < 0.1, 1] = 0.0
    off = np.where(r.random(n) < 0.3, t0 + r.uniform(0, 80, n), math.inf)
    nbytes = np.column_stack([r.uniform(1e5, 2e6, n), r.uniform(1e5, 2e6, n)])
    bps = np.column_stack([r.choice([1e5, 5e5, 2.5e6], n), r.choice([5e4, 2.5e5, 1e6], n)])
    latency = r.uniform(0, 0.2, n)
    capacity = (float(r.choice([2e5, 1e6, 5e6])), float(r.choice([1e5, 5e5, 2e6])))
    has = r.random(n) < 0.7
    held, watts, spread = r.uniform(0.5, 60, n), r.uniform(0.1, 2, (n, 4)), r.uniform(0, 3, (n, 4))
    per_byte = r.uniform(0, 2e-5, (n, 2))
    from_s = np.where(r.random(n) < 0.2, r.uniform(0, 30, n), 0.0)
    until_s = np.where(r.random(n) < 0.2, r.uniform(5, 80, n), math.inf)
    jobs = [(k, tuple(phases[k].tolist())) for k in range(n)]
    shared = (Links(*capacity), [Transfer(*nbytes[k].tolist(), *bps[k].tolist(), float(latency[k]))
                                 for k in range(n)]) if links else None
    drains = [Drain(float(held[k]), tuple(watts[k].tolist()), tuple(spread[k].tolist()),
                    (float(per_byte[k, 0]), float(per_byte[k, 1])), float(from_s[k]), float(until_s[k]))
              if has[k] and batteries else None for k in range(n)]
    target = int(r.integers(1, n // 4)) if seed % 3 == 0 else int(r.integers(1, n + 1))
    return (t0, jobs, Offline(off), target, float(r.uniform(10, 90)) if deadline else math.inf, shared,
            drains if batteries else None)


@pytest.mark.parametrize("links", [True, False])
@pytest.mark.parametrize("batteries", [True, False])
@pytest.mark.parametrize("deadline", [True, False])
def test_random_rounds_are_played_to_the_bit_as_simpy_plays_them(links: bool, batteries: bool,
                                                                  deadline: bool) -> None:
    for seed in range(12):
        t0, jobs, avail, target, deadline_s, shared, drains = random_round(seed, 60, links, batteries,
                                                                           deadline)
        ours = play_round(Federation(t0), jobs, avail, target, deadline_s, 1.5, shared, drains)
        theirs = simpy_round(Federation(t0), jobs, avail, target, deadline_s, 1.5, shared, drains)
        assert (ours.start_s, ours.close_s, ours.end_s) == (theirs.start_s, theirs.close_s, theirs.end_s)
        for a, b in zip(ours.outcomes, theirs.outcomes, strict=True):
            assert (a.client, a.status, a.stop_s) == (b.client, b.status, b.stop_s)
            assert a.download_s == b.download_s or (math.isnan(a.download_s) and math.isnan(b.download_s))
            assert a.upload_s == b.upload_s or (math.isnan(a.upload_s) and math.isnan(b.upload_s))


def test_the_random_rounds_stop_clients_every_way() -> None:
    """The rounds above are no walk-over: clients complete, and are stopped offline, late and dropped."""
    seen = set()
    for seed in range(12):
        t0, jobs, avail, target, deadline_s, shared, drains = random_round(seed, 60, True, True,
                                                                           seed % 2 == 0)
        seen |= {o.status for o in play_round(Federation(t0), jobs, avail, target, deadline_s, 0.0, shared,
                                              drains).outcomes}
    assert seen == {0, 1, 2, 3}


FILES = ("metrics.csv", "clients.csv", "events.csv")


@pytest.mark.parametrize("name", ["living-digits", "energy-digits", "deadline-diurnal-digits",
                                  "trace-digits"])
def test_bundled_living_scenarios_write_the_files_simpy_writes(name: str, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A dry run of each bundled living scenario (every mode but async, which SimPy plays) on 60 devices,
    with its rounds played by the columns and by the reference: the same files, byte for byte."""
    path = ROOT / "scenarios" / f"{name}.toml"
    s = load_scenario(path, ["fleet.clients=60", "rounds=4"])
    texts = []
    for engine in ("columns", "simpy"):
        if engine == "simpy":
            monkeypatch.setattr(living, "play_round", simpy_columns)
        run(prepare(s, str(path), dry_run=True), tmp_path / engine, progress=False)
        texts.append([(tmp_path / engine / f).read_text() for f in FILES])
    assert texts[0] == texts[1]
    statuses = texts[0][1]
    assert "completed" in statuses


def _drains(held: float, watts: list[float]) -> Drains:
    return Drains(np.array([True]), np.array([held]), np.array([watts]), np.array([[0.1, 0.2, 0.3, 0.4]]),
                  np.array([[1e-6, 2e-6]]), np.zeros(1), np.full(1, math.inf))


@pytest.mark.parametrize(("held", "shared", "deadline_s", "watts", "followed"), [
    # shared links, a 100 s deadline: 2 W x 100 s + (3 - 2) W x 4 s + 1 J spread + 1 J + 1 J of bytes
    (207.1, True, 100.0, [1.0, 0.5, 3.0, 2.0], False),
    (207.0001, True, 100.0, [1.0, 0.5, 3.0, 2.0], True),  # within a millionth of 207 J
    (35.1, False, 100.0, [1.0, 0.5, 3.0, 2.0], False),  # off shared links: its 14 s of phases, 35 J
    (34.9, False, 100.0, [1.0, 0.5, 3.0, 2.0], True),
    (1e9, True, math.inf, [1.0, 0.5, 3.0, 2.0], True),  # no deadline on shared links: no bound
    (16.6, True, math.inf, [0.0, 0.5, 3.0, 0.0], False),  # no watts in transfers: 1.5 + 12 + 1 + 2 J
    (1e9, True, 100.0, [1.0, -0.5, 3.0, 2.0], True),  # a negative figure: followed
])
def test_a_battery_is_followed_unless_the_round_cannot_spend_what_it_holds(
        held: float, shared: bool, deadline_s: float, watts: list[float], followed: bool) -> None:
    """could_run_out's bound by hand: phases 2, 3, 4 and 5 s; 1e6 bytes down at 1e-6 J/byte and
    5e5 up at 2e-6 J/byte; spread joules 0.1 to 0.4."""
    phases = np.array([[2.0, 3.0, 4.0, 5.0]])
    t = Transfers(np.array([[1e6, 5e5]]), np.ones((1, 2)), np.zeros(1))
    assert could_run_out(phases, t, _drains(held, watts), shared, deadline_s)[0] == followed
