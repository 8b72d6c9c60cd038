"""A living fleet's availability, batteries and drains asked for many clients at once (issue 37: living
fleets in columns): each array answer equals the formula of edgefl.sim.availability's docstring worked
by hand, client by client, and a round's drains equal the per-client reference kept here."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgefl.devices import draws
from edgefl.experiment import prepare
from edgefl.experiment.async_rounds import ASYNC, IDLE_DRAWS, idle_pick
from edgefl.experiment.living import online_pick
from edgefl.experiment.round_energy import RoundEnergy
from edgefl.experiment.rounds import priced
from edgefl.scenario import load_scenario
from edgefl.sim.availability import AVAILABILITY, Diurnal, from_mapping
from edgefl.sim.battery import WH, Battery, Powered
from edgefl.sim.bulk import Pricer
from edgefl.sim.clients import Drain
from edgefl.sim.energy import phase_power

CLIENTS = np.arange(40)


def by_hand(seed: int, k: int, start_h: float, hours: float, spread_h: float, t: float) -> tuple[bool, float]:
    """(online, offline_at) of client k at t from the docstring's formula, in Python floats."""
    offset = spread_h * ((draws.key(seed, AVAILABILITY, k) >> 11) * 2.0**-53 - 0.5)
    into = (t / 3600 + offset - start_h) % 24
    return into < hours, t + (hours - into) * 3600


@pytest.mark.parametrize("t", [0.0, 5 * 3600.0, 23.5 * 3600, 1e6 + 0.25])
def test_diurnal_arrays_follow_the_formula_client_by_client(t: float) -> None:
    d = Diurnal(seed=7, start_h=21.0, hours=9.0, spread_h=24.0)
    online, off = d.online_many(CLIENTS, t), d.offline_many(CLIENTS, t)
    for k in CLIENTS.tolist():
        assert (bool(online[k]), float(off[k])) == by_hand(7, k, 21.0, 9.0, 24.0, t)
    back = d.online_at_many(CLIENTS, t)
    assert np.all(back[online] == t) and np.all(d.online_many(CLIENTS, back))
    assert np.all(back[~online] > t) and np.all(back[~online] - t <= 15 * 3600 + 1e-6)  # its next start


def test_diurnal_offsets_kept_from_earlier_asks_are_the_formulas() -> None:
    """Asked for a few ids, then for more (the kept offsets grow), in any order: each the formula's."""
    d = Diurnal(seed=7, start_h=21.0, hours=9.0, spread_h=24.0)
    for ids in ([3, 1], [0, 39, 5, 39], [], [12]):
        asked = np.array(ids, dtype=np.int64)
        by_formula = [24.0 * ((draws.key(7, AVAILABILITY, k) >> 11) * 2.0**-53 - 0.5) for k in ids]
        assert d.offsets_h(asked).tolist() == by_formula


def test_a_trace_answers_many_as_it_answers_one() -> None:
    trace = from_mapping({"0": [[0, 10], [50, 100]], "1": [[20, 110]]})
    for t in (5.0, 30.0, 60.0, 150.0):
        assert trace.online_many(CLIENTS[:6], t).tolist() == [trace.online(k, t) for k in range(6)]
        assert trace.offline_many(CLIENTS[:6], t).tolist() == [trace.offline_at(k, t) for k in range(6)]


def test_an_empty_battery_is_offline_in_the_arrays_until_plugged_in() -> None:
    charger = Diurnal(seed=0, start_h=1.0, hours=2.0, spread_h=0.0)  # plugged in 01:00-03:00
    battery = Battery(np.array([WH, WH, math.inf]), np.array([0.0, 0.5, 0.0]), charger, charge_w=5.0)
    always = Diurnal(seed=0, start_h=0.0, hours=24.0, spread_h=0.0)
    powered = Powered(always, battery)
    three = np.arange(3)
    assert powered.online_many(three, 1800.0).tolist() == [False, True, True]  # 00:30: the empty one is off
    assert powered.online_many(three, 3600.0).tolist() == [True, True, True]  # 01:00: on its charger
    assert battery.plugged_at_many(three, 1800.0).tolist() == [3600.0] * 3
    assert battery.unplugged_many(three, 5400.0).tolist() == [3 * 3600.0] * 3


def test_online_pick_takes_the_first_online_clients_in_order() -> None:
    d = Diurnal(seed=3, start_h=22.0, hours=8.0, spread_h=24.0)
    order = np.random.default_rng(0).permutation(1000)
    for count in (1, 7, 300):
        picked = online_pick(d, order, 4000.0, count)
        assert picked == [k for k in order.tolist() if d.online(k, 4000.0)][:count]


def test_an_async_pick_is_the_first_online_idle_draw() -> None:
    """Start m's draw j is (top 32 bits of key(seed, ASYNC, m, j)) x n >> 32, in Python integers."""
    d = Diurnal(seed=3, start_h=22.0, hours=8.0, spread_h=24.0)
    busy = set(range(0, 1000, 2))
    for m in (0, 1, 77):
        drawn = ((draws.key(3, ASYNC, m, j) >> 32) * 1000 >> 32 for j in range(IDLE_DRAWS))
        first = next(k for k in drawn if k not in busy and d.online(k, 4000.0))
        assert idle_pick(d, draws.key(3, ASYNC, m), 1000, 4000.0, busy) == first


def test_async_picks_are_uniform_over_the_online_idle_devices() -> None:
    """2,000 picks among 50 devices, 10 of them busy, some offline: every online idle device about
    equally often (each expected 2000 / m times; a count off by 5 standard deviations fails), never
    another; with one device left, the look at every device finds it."""
    d = Diurnal(seed=5, start_h=22.0, hours=12.0, spread_h=24.0)
    busy = set(range(10))
    ok = {k for k in range(50) if k not in busy and d.online(k, 0.0)}
    counts = np.bincount([idle_pick(d, n, 50, 0.0, busy) for n in range(2000)], minlength=50)
    m = len(ok)
    assert set(np.flatnonzero(counts).tolist()) == ok and 5 <= m <= 40
    p = 1 / m
    assert np.all(np.abs(counts[sorted(ok)] - 2000 * p) < 5 * math.sqrt(2000 * p * (1 - p)))
    last = min(ok)
    assert idle_pick(d, 7, 50, 0.0, set(range(50)) - {last}) == last


def test_an_async_pick_with_no_device_online_says_when_one_comes() -> None:
    trace = from_mapping({"0": [[50, 60]], "1": [[70, 80]]})
    assert idle_pick(trace, 3, 2, 10.0, set()) == 50.0
    assert idle_pick(trace, 3, 2, 10.0, {0}) == 70.0


def test_a_rounds_drains_equal_the_per_client_reference() -> None:
    """RoundEnergy.drains (arrays) against the loop it replaced, client by client, on energy-digits
    with batteries and a charger, at a moment some devices are on their chargers and some not."""
    s = load_scenario("scenarios/energy-digits.toml", ["fleet.clients=60", "energy.charge_w=5.0",
                                                             "fleet.tz_spread_h=24.0"])
    exp = prepare(s, "scenarios/energy-digits.toml", dry_run=True)
    energy = RoundEnergy(s, exp.pool)
    battery, power = energy.battery, energy.power
    assert battery is not None and power is not None
    pricer = Pricer(exp.ctx.cost, exp.pool, lambda k: len(exp.ctx.splits[k].train))
    states, plan, costs = priced(exp.pool, exp.method, pricer, 0, np.arange(60))
    now = 2.5 * 3600
    drains = energy.drains(states, plan, costs, now)
    assert drains is not None
    rows, share = power.of(states), states.flops / exp.pool.kind_flops[states.kind]
    down, up = energy.sent(plan)
    plugged_some = False
    for i, k in enumerate(states.clients.tolist()):
        level = float(battery.level(np.array([k]), now)[0])
        if math.isinf(level):
            assert drains.row(i) is None
            continue
        rates = phase_power(rows.at(i), costs.cost(i), float(share[i]), float(down[i]), float(up[i]))
        if battery.plugged_many(np.array([k]), now)[0]:
            plugged_some = True
            unplug = float(battery.unplugged_many(np.array([k]), now)[0])
            held, begin, end = float(battery.level(np.array([k]), unplug)[0]), unplug - now, math.inf
        else:
            held, begin, end = level, 0.0, battery.plugged_at(k, now) - now
        assert drains.row(i) == Drain(held, *rates, begin, end)
    assert plugged_some and bool((drains.on & np.isfinite(drains.until_s)).any())
