"""Shared server links: water-filling rates and processor-sharing finish times, worked by hand, and the
SimPy link agreeing with the exact computation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import simpy

from edgefl.sim.links import Links, SharedLink, fair_rates, finish_times, shared_round

MB = 1e6
CAPS = np.array([2.0, 5.0, 8.0]) * MB  # the three clients' own bandwidths, bytes/s
SERVER = 10 * MB


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


def simpy_finish(start: np.ndarray, nbytes: np.ndarray, caps: np.ndarray, capacity: float) -> list[float]:
    env = simpy.Environment()
    link = SharedLink(env, capacity)
    end = [0.0] * len(start)

    def client(i: int):  # type: ignore[no-untyped-def]
        yield env.timeout(float(start[i]))
        yield from link.transfer(env, float(nbytes[i]), float(caps[i]))
        end[i] = float(env.now)

    for i in range(len(start)):
        env.process(client(i))
    env.run()
    return end


def test_the_simpy_link_plays_the_hand_cases() -> None:
    assert simpy_finish(np.zeros(3), np.array([4.0, 10.0, 20.0]) * MB, CAPS, SERVER) == pytest.approx(
        [2.0, 2.4, 3.65], rel=1e-12)
    assert simpy_finish(np.array([0.0, 1.0, 3.0]), np.array([4.0, 10.0, 20.0]) * MB, CAPS,
                        SERVER) == pytest.approx([2.0, 3.0, 5.5], rel=1e-12)


@pytest.mark.parametrize("case", ["together", "staggered", "staggered with ties", "tied caps"])
def test_the_exact_times_agree_with_the_simpy_link_on_random_fleets(case: str) -> None:
    """The event-by-event computation against the SimPy link (its own water-filling at every start
    and end), 200 transfers: all starting together, at random times, on whole seconds, or with
    three distinct caps."""
    r = np.random.default_rng(7)
    if case == "together":
        start = np.zeros(200)
    else:
        start = r.uniform(0, 30, 200) if case == "staggered" else np.round(r.uniform(0, 30, 200))
    caps = r.choice([2.0, 5.0, 8.0], 200) * MB if case == "tied caps" else r.uniform(1, 20, 200) * MB
    nbytes = r.uniform(1, 50, 200) * MB
    assert simpy_finish(start, nbytes, caps, 60 * MB) == pytest.approx(
        finish_times(start, nbytes, caps, 60 * MB).tolist(), rel=1e-9)


def test_the_simpy_link_keeps_its_transfers_in_cap_order_through_starts_ends_and_interrupts() -> None:
    """The link's kept order sorts the caps under way after every change (40 transfers with tied
    caps, a third of them interrupted); among equal caps any order gives the same rates."""
    env, r = simpy.Environment(), np.random.default_rng(5)
    link = SharedLink(env, 30 * MB)
    checked = [0]

    def client(at: float, nbytes: float, cap: float):  # type: ignore[no-untyped-def]
        try:
            yield env.timeout(at)
            yield from link.transfer(env, nbytes, cap)
        except simpy.Interrupt:
            checked[0] += 1

    def stop(proc: simpy.Process, at: float):  # type: ignore[no-untyped-def]
        yield env.timeout(at)
        if proc.is_alive:
            proc.interrupt()

    for i in range(40):
        proc = env.process(client(float(r.uniform(0, 10)), float(r.uniform(1, 40)) * MB,
                                  float(r.choice([2.0, 5.0, 8.0])) * MB))
        if i % 3 == 0:
            env.process(stop(proc, float(r.uniform(0, 15))))
    while env.peek() < math.inf:
        env.step()
        assert sorted(link.order.tolist()) == list(range(len(link.cap)))
        assert np.all(np.diff(link.cap[link.order]) >= 0)
    assert checked[0] > 0 and not link.done


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
