"""Shared server links: water-filling rates and processor-sharing finish times, worked by hand; the
event-driven `Sharing` (finish_times and the SimPy link, with interruptions) against a plain oracle
that recomputes every rate from scratch at every start, stop and end."""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy
from simpy_clients import SharedLink, finish_times

from edgefl.sim.links import Links, shared_round
from edgefl.sim.round_loop import DONE_S

MB = 1e6
CAPS = np.array([2.0, 5.0, 8.0]) * MB  # the three clients' own bandwidths, bytes/s
SERVER = 10 * MB


def fair_rates(caps: np.ndarray, capacity: float) -> np.ndarray:
    """Water-filling from scratch (the oracle's): sort the caps, and the first cap above the level
    its slower ones leave sets the level for it and every faster one."""
    if caps.sum() <= capacity:
        return caps.astype(np.float64)
    order = np.argsort(caps, kind="stable")
    c = caps[order]
    below = np.concatenate([[0.0], np.cumsum(c)[:-1]])  # bytes/s the slower ones take
    levels = (capacity - below) / np.arange(len(c), 0, -1)
    over = c > levels
    if not over.any():  # the caps exceed the capacity by rounding only: they fit
        return caps.astype(np.float64)
    k = int(np.argmax(over))
    rates = np.empty(len(c))
    rates[order] = np.where(np.arange(len(c)) < k, c, levels[k])
    return rates


def oracle(start: np.ndarray, nbytes: np.ndarray, caps: np.ndarray, capacity: float,
           stop: np.ndarray | None = None) -> np.ndarray:
    """Each transfer's end (nan: stopped at stop[i] first), the rates recomputed by `fair_rates` for
    the transfers under way at every start, stop and end, and every transfer's bytes left counted
    down between them: O(n) an event."""
    n = len(start)
    stop = np.full(n, math.inf) if stop is None else stop
    left, end, now = nbytes.astype(np.float64), np.full(n, np.nan), 0.0
    waiting, active = np.ones(n, dtype=bool), np.zeros(n, dtype=bool)
    while waiting.any() or active.any():
        rates = np.zeros(n)
        if active.any():
            rates[active] = fair_rates(caps[active], capacity)
        rest = np.where(active, left / np.where(active, rates, 1.0), math.inf)
        now_next = min(start[waiting].min(initial=math.inf), (now + rest).min(),
                       stop[active].min(initial=math.inf))
        left, now = left - rates * (now_next - now), now_next
        through = active & (left / np.where(active, rates, 1.0) <= DONE_S)
        end[through] = now
        active &= ~through & (stop > now)
        arriving = waiting & (start <= now)
        active, waiting = active | arriving, waiting & ~arriving
    return end


def test_water_filling_by_hand() -> None:
    """2 + L + L = 10 gives the level L = 4: the 2 MB/s client keeps its rate, the others get 4."""
    assert (fair_rates(CAPS, SERVER) / MB).tolist() == [2.0, 4.0, 4.0]
    assert (fair_rates(CAPS, 20 * MB) / MB).tolist() == [2.0, 5.0, 8.0]  # they fit: their own rates
    assert (fair_rates(CAPS, 3 * MB) / MB).tolist() == [1.0, 1.0, 1.0]  # an equal split


def test_three_downloads_from_the_round_start_by_hand() -> None:
    """4, 10 and 20 MB. Rates 2/4/4 until the first ends at 2 s (the others have 2 and 12 MB left);
    then 5 + 5 = 10 until the second ends at 2.4 s (the third has 10 MB left); then the third alone at
    8 MB/s: 1.25 s more, 3.65 s."""
    end = finish_times(np.zeros(3), np.array([4.0, 10.0, 20.0]) * MB, CAPS, SERVER)
    assert end == pytest.approx([2.0, 2.4, 3.65], rel=1e-12)
    alone = finish_times(np.zeros(3), np.array([4.0, 10.0, 20.0]) * MB, CAPS, math.inf)
    assert alone.tolist() == [2.0, 2.0, 2.5]


def test_equal_downloads_by_hand() -> None:
    """10 MB each: 2/4/4 MB/s, the two faster end together at 2.5 s with the slow one at 5 MB of 10;
    alone it needs 2.5 s more."""
    end = finish_times(np.zeros(3), np.full(3, 10 * MB), CAPS, SERVER)
    assert end == pytest.approx([5.0, 2.5, 2.5], rel=1e-12)


def test_staggered_uploads_by_hand() -> None:
    """Starting at 0, 1 and 3 s: the first alone at 2 MB/s ends at 2 s; the second (10 MB from 1 s)
    shares 2 + 5 <= 10, so runs at 5 MB/s and ends at 3 s; the third starts alone at 3 s: 20 / 8."""
    start = np.array([0.0, 1.0, 3.0])
    assert finish_times(start, np.array([4.0, 10.0, 20.0]) * MB, CAPS, SERVER) == pytest.approx(
        [2.0, 3.0, 5.5], rel=1e-12)


def simpy_finish(start: np.ndarray, nbytes: np.ndarray, caps: np.ndarray, capacity: float,
                 stop: np.ndarray | None = None) -> np.ndarray:
    """The SimPy link's ends (nan: its client stopped at stop[i] first)."""
    env, end = simpy.Environment(), np.full(len(start), np.nan)
    link = SharedLink(env, capacity)

    def client(i: int):  # type: ignore[no-untyped-def]
        yield env.timeout(float(start[i]))
        try:
            yield from link.transfer(env, float(nbytes[i]), float(caps[i]))
        except simpy.Interrupt:
            return
        end[i] = float(env.now)

    def unplug(proc: simpy.Process, at: float):  # type: ignore[no-untyped-def]
        yield env.timeout(at)
        if proc.is_alive:
            proc.interrupt()

    for i in range(len(start)):
        proc = env.process(client(i))
        if stop is not None and math.isfinite(stop[i]):
            env.process(unplug(proc, float(stop[i])))
    env.run()
    assert not link.done and not len(link.sharing)
    return end


def test_the_simpy_link_plays_the_hand_cases() -> None:
    assert simpy_finish(np.zeros(3), np.array([4.0, 10.0, 20.0]) * MB, CAPS, SERVER) == pytest.approx(
        [2.0, 2.4, 3.65], rel=1e-12)
    assert simpy_finish(np.array([0.0, 1.0, 3.0]), np.array([4.0, 10.0, 20.0]) * MB, CAPS,
                        SERVER) == pytest.approx([2.0, 3.0, 5.5], rel=1e-12)


def random_fleet(case: str, n: int = 200) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(start, bytes, caps) of n transfers: all starting together, at random times, on whole seconds,
    or with three distinct caps."""
    r = np.random.default_rng(7)
    if case == "together":
        start = np.zeros(n)
    else:
        start = r.uniform(0, 30, n) if case == "staggered" else np.round(r.uniform(0, 30, n))
    caps = r.choice([2.0, 5.0, 8.0], n) * MB if case == "tied caps" else r.uniform(1, 20, n) * MB
    return start, r.uniform(1, 50, n) * MB, caps


CASES = ["together", "staggered", "staggered with ties", "tied caps"]


@pytest.mark.parametrize("case", CASES)
def test_the_exact_times_agree_with_the_oracle_and_the_simpy_link_on_random_fleets(case: str) -> None:
    """200 transfers on a 60 MB/s link: `finish_times`, the SimPy link and the oracle agree."""
    start, nbytes, caps = random_fleet(case)
    exact = finish_times(start, nbytes, caps, 60 * MB)
    assert exact == pytest.approx(oracle(start, nbytes, caps, 60 * MB), rel=1e-9)
    assert simpy_finish(start, nbytes, caps, 60 * MB) == pytest.approx(exact, rel=1e-9)


@pytest.mark.parametrize("case", CASES)
def test_the_simpy_link_shares_out_what_interrupted_transfers_leave(case: str) -> None:
    """A third of the clients stop at random times (those through by then end as usual): the SimPy
    link agrees with the oracle transfer by transfer, which ones ended and when."""
    start, nbytes, caps = random_fleet(case)
    r = np.random.default_rng(5)
    stop = np.where(np.arange(len(start)) % 3 == 0, start + r.uniform(0, 20, len(start)), math.inf)
    want = oracle(start, nbytes, caps, 60 * MB, stop)
    got = simpy_finish(start, nbytes, caps, 60 * MB, stop)
    assert np.isnan(want).sum() > 10
    assert np.array_equal(np.isnan(got), np.isnan(want))
    assert got[~np.isnan(got)] == pytest.approx(want[~np.isnan(want)], rel=1e-9)


def test_a_shared_round_downloads_together_and_uploads_as_clients_finish() -> None:
    """Server 10 MB/s down, 5 MB/s up. Downloads of 4/10/20 MB from the start end at 2, 2.4 and
    3.65 s (above), plus 0.1 s latency each; after 1 s of data access and compute, 1 MB uploads are
    ready at 3.1, 3.5 and 4.75 s. The first runs at 2 MB/s: at 3.5 s it has 0.2 MB left; the second
    joins, and 2 + L = 5 gives it L = 3 MB/s until the first ends at 3.6 s (0.3 MB sent), then 5 MB/s
    alone for 0.7 MB: it ends at 3.74 s (0.24 s). The third is alone at the server's 5 MB/s: 0.2 s."""
    links = Links.of_mbps(80.0, 40.0)
    assert (links.down_bps, links.up_bps) == (SERVER, 5 * MB)
    zero, half = np.zeros(3), np.full(3, 0.5)
    sent = (np.array([4.0, 10.0, 20.0]) * MB, np.full(3, MB))
    down, up = shared_round(links, (zero, half, half, zero), sent, (CAPS, CAPS), np.full(3, 0.1))
    assert down == pytest.approx([2.1, 2.5, 3.75], rel=1e-12)
    assert up == pytest.approx([0.6, 0.34, 0.3], rel=1e-12)


def test_zero_means_unlimited() -> None:
    links = Links.of_mbps(0.0, 0.0)
    assert links.unlimited and math.isinf(links.down_bps)


@pytest.mark.slow
def test_random_small_fleets_against_the_oracle() -> None:
    """300 random fleets of 1-120 transfers covering the corners: tied caps, zero and tiny bytes,
    simultaneous starts, starts on whole seconds at 1e6 s, clients stopping the instant they start,
    capacities from a tenth of one cap to far more than all, and byte scales from 1e-3 to 1e6.
    `finish_times` and the SimPy link (40 % of its clients stopping) agree with the oracle."""
    r = np.random.default_rng(11)
    for trial in range(300):
        n, kind = int(r.integers(1, 121)), trial % 6
        caps = r.choice([1.0, 3.0], n) if kind == 1 else r.uniform(0.5, 20, n)
        tiny = np.where(r.random(n) < 0.3, 0.0, r.uniform(1e-6, 1e3, n))
        nbytes = tiny if kind == 2 else r.uniform(0, 50, n)
        start = {3: np.zeros(n), 4: np.round(r.uniform(0, 10, n)) + 1e6}.get(kind, r.uniform(0, 20, n))
        capacity = float(r.choice([0.1, 1.0, 10.0, 100.0, 1e4])) * caps.mean()
        scale = float(r.choice([1.0, 1e6, 1e-3]))
        caps, nbytes, capacity = caps * scale, nbytes * scale, capacity * scale
        stop = np.where(r.random(n) < 0.4, start + (0.0 if kind == 5 else r.uniform(0, 15, n)), math.inf)
        for got, want in ((finish_times(start, nbytes, caps, capacity),
                           oracle(start, nbytes, caps, capacity)),
                          (simpy_finish(start, nbytes, caps, capacity, stop),
                           oracle(start, nbytes, caps, capacity, stop))):
            assert np.array_equal(np.isnan(got), np.isnan(want)), trial
            assert got - start == pytest.approx(want - start, rel=1e-8, abs=1e-9, nan_ok=True), trial


def test_random_shared_rounds_against_the_oracle() -> None:
    """100 random synchronous rounds of 1-60 clients on shared links (edgefl.sim.links
    `shared_round`, played by the compiled loop): each download, from the round's start, and each
    upload, from its client's end of compute, ends where the oracle says, plus its latency."""
    r = np.random.default_rng(3)
    for trial in range(100):
        n = int(r.integers(1, 61))
        caps = r.uniform(0.5, 20, (2, n)) * MB
        sent = r.uniform(0, 30, (2, n)) * MB * (r.random((2, n)) < 0.9)
        capacity = r.choice([0.3, 3.0, 30.0, math.inf], 2) * MB
        latency, access, compute = r.uniform(0, 0.2, n), r.uniform(0, 3, n), r.uniform(0, 10, n)
        down, up = shared_round(Links(*capacity), (np.zeros(n), access, compute, np.zeros(n)),
                                (sent[0], sent[1]), (caps[0], caps[1]), latency)
        want_down = oracle(np.zeros(n), sent[0], caps[0], capacity[0]) + latency
        ready = want_down + access + compute
        want_up = oracle(ready, sent[1], caps[1], capacity[1]) - ready + latency
        assert down == pytest.approx(want_down, rel=1e-8, abs=1e-9), trial
        assert up == pytest.approx(want_up, rel=1e-8, abs=1e-9), trial
