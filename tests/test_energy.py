"""The energy model worked by hand, the bundled power figures, batteries, and the two round paths
writing the same joules to the bit."""

from __future__ import annotations

import csv
import filecmp
import math
from pathlib import Path

import numpy as np
import pytest
from reference import per_client

from edgefl.devices.catalog import ENV, load_catalog
from edgefl.devices.classes import POWER_DEFAULTS, device_power
from edgefl.errors import EdgeflError
from edgefl.experiment import prepare, run
from edgefl.scenario import load_scenario
from edgefl.sim.availability import Always, Diurnal
from edgefl.sim.battery import WH, Battery, Powered
from edgefl.sim.cost import ClientCost
from edgefl.sim.energy import Power, client_power, phase_power, round_energy

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "device_profiles"
SCENARIO = ROOT / "scenarios" / "energy-digits.toml"


def test_one_round_by_hand() -> None:
    """Idle 0.2 W over busy 10 + 2 + 1 + 0.5 s and 3 s waiting: 3.3 J; training's extra 3.8 W at half
    the processor for 10 s: 19 J; storage 1 MB read at 1 nJ/B, 2 MB written at 3: 0.007 J; radio
    1 MB received at 416 nJ/B and 0.5 MB sent at 3507: 2.1695 J, base 1.288 W for 1.5 s: 1.932 J."""
    p = Power(4.0, 0.2, 1.0, 3.0, 416.0, 3507.0, 1.288)
    c = ClientCost(compute_s=10.0, data_access_s=2.0, download_s=1.0, upload_s=0.5, mem_req_bytes=0.0,
                   swapped=True, read_bytes=1e6, write_bytes=2e6)
    by_hand = 3.3 + 19 + 0.007 + 2.1695 + 1.932
    assert round_energy(p, c, 0.5, 1e6, 5e5, 3.0) == pytest.approx(by_hand, rel=1e-12)


def test_profiles_carry_power_and_radio_figures() -> None:
    """Huang et al. (MobiSys 2012): LTE a_u 438.39 mW/(Mbit/s) is 438.39e-3 J / 1e6 bit = 3507 nJ per
    byte; the phones' batteries are their labels' Wh; a class fills what a profile omits."""
    cat = load_catalog(PROFILES)
    assert cat.networks["4g"].up_nj_per_byte == pytest.approx(438.39 * 8, abs=1)
    assert cat.networks["wifi"].down_nj_per_byte == pytest.approx(137.01 * 8, abs=1)
    assert cat.devices["iphone_12"].battery_wh == pytest.approx(2.815 * 3.83, abs=0.01)
    assert cat.devices["raspberry_pi_4"].battery_wh == 0  # mains
    esp = cat.devices["esp32_s3"]
    assert device_power(esp) == POWER_DEFAULTS["microcontroller"]
    pi = client_power(cat.devices["raspberry_pi_4"], cat.networks["wifi"])
    assert (pi.active_w, pi.idle_w, pi.read_nj) == (6.4, 2.7, POWER_DEFAULTS["sbc"].read_nj_per_byte)


def test_a_battery_drains_dies_and_recharges() -> None:
    """1 Wh at half charge; plugged in daily from 01:00 for 2 h at 0.5 W: an hour on the charger
    gains 1800 J, two hours fill it (3600 J) and more is capped; empty, the device is offline until
    01:00, when it runs on its charger."""
    charger = Diurnal(seed=0, start_h=1.0, hours=2.0, spread_h=0.0)
    b = Battery(np.array([1.0 * WH, math.inf]), np.array([0.5, 1.0]), charger, charge_w=0.5)
    assert b.charge_j.tolist() == [1800.0, math.inf]
    ten = np.array([10.0, 10.0])  # seconds of work, before its charger's window
    assert b.covers(np.array([0, 1]), np.array([1799.0, 1e12]), ten, 0.0).tolist() == [True, True]
    assert b.covers(np.array([0]), np.array([1800.0]), ten[:1], 0.0).tolist() == [False]  # it would end empty
    assert b.drain(np.array([0, 1]), np.array([1000.0, 1e12]), 0.0).tolist() == [1000.0, 1e12]  # all taken
    assert b.charge_j.tolist() == [800.0, math.inf] and b.powered(0, 0.0) and b.powered(1, 0.0)
    assert b.drain(np.array([0]), np.array([900.0]), 0.0).tolist() == [800.0]  # what it held
    assert b.charge_j[0] == 0.0 and not b.powered(0, 0.0) and b.powered_at(0, 0.0) == 3600.0
    powered = Powered(Always(), b)
    assert not powered.online(0, 1800.0) and powered.online_at(0, 1800.0) == 3600.0
    assert powered.online(0, 3600.0)
    # on its charger at 01:30 with 900 J: an hour's work gains 0.5 W x 3600 s, so 2700 J in all;
    # two hours' work is plugged in until 03:00 only, 5400 s: 900 + 2700 = 3600 J
    hour = np.array([3600.0])
    assert b.covers(np.array([0]), np.array([2699.0]), hour, 5400.0).tolist() == [True]
    assert b.covers(np.array([0]), np.array([2700.0]), hour, 5400.0).tolist() == [False]
    assert b.covers(np.array([0]), np.array([3599.0]), 2 * hour, 5400.0).tolist() == [True]
    assert b.covers(np.array([0]), np.array([1e6]), 2 * hour, 5400.0).tolist() == [False]  # was True
    assert b.level(np.array([0]), 5400.0).tolist() == [900.0]
    assert b.level(np.array([0]), 7200.0).tolist() == [1800.0]
    assert b.level(np.array([0]), 20000.0).tolist() == [WH]  # full at 03:00, capped after
    b.settle(np.array([0]), 5400.0)
    assert b.charge_j[0] == 900.0 and b.level(np.array([0]), 86400.0 + 4500.0).tolist() == [WH]
    zero = np.array([0])
    assert b.plugged_many(zero, 5400.0)[0] and b.unplugged_many(zero, 5400.0)[0] == 10800.0  # 01:00-03:00
    assert Battery(np.array([WH]), np.array([0.0])).powered_at(0, 0.0) == math.inf  # no charger


def test_an_empty_battery_on_a_weak_charger_pays_for_no_work() -> None:
    """Empty at 0 s, on a 1e-6 W charger around the clock: a 30 J round of 60 s is refused (issue 39:
    such phones finished whole rounds for 1.3e-5 J each); a 1 W charger brings 60 J in those 60 s,
    enough for 30 J, not for 60 (it would end empty)."""
    always = Diurnal(seed=0, start_h=0.0, hours=24.0, spread_h=0.0)
    weak = Battery(np.array([10.0 * WH]), np.array([0.0]), always, charge_w=1e-6)
    assert weak.covers(np.array([0]), np.array([30.0]), np.array([60.0]), 0.0).tolist() == [False]
    strong = Battery(np.array([10.0 * WH]), np.array([0.0]), always, charge_w=1.0)
    assert strong.covers(np.array([0]), np.array([30.0]), np.array([60.0]), 0.0).tolist() == [True]
    assert strong.covers(np.array([0]), np.array([60.0]), np.array([60.0]), 0.0).tolist() == [False]


@pytest.mark.slow
def test_seconds_online_follow_the_window() -> None:
    """Diurnal.online_seconds against a one-second count of `online`, time zones spread."""
    d = Diurnal(seed=3, start_h=22.0, hours=8.0, spread_h=24.0)
    clients = np.arange(5)
    a, b = np.array([0.0, 5000.0, 30000.0, 70000.0, 100.0]), 2 * 86400.0 + 1234.0
    counted = [sum(d.online(int(k), s + 0.5) for s in range(int(a0), int(b)))
               for k, a0 in zip(clients, a, strict=True)]
    assert np.abs(d.online_seconds(clients, a, b) - np.array(counted)).max() <= 1.0
    assert d.online_seconds(clients, a, a + 86400.0).tolist() == pytest.approx([8 * 3600.0] * 5)


def dry(tmp_path: Path, bulk: bool, *overrides: str) -> Path:
    s = load_scenario(SCENARIO, list(overrides))
    exp = prepare(s, str(SCENARIO), dry_run=True)
    out = tmp_path / f"bulk{bulk}"
    with pytest.MonkeyPatch.context() as patch:
        if not bulk:
            per_client(patch)  # the reference (tests/reference.py)
        run(exp, out, progress=False)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["csv", "parquet"])
def test_bulk_and_per_client_joules_are_equal_to_the_bit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         fmt: str) -> None:
    monkeypatch.setenv(ENV, str(PROFILES))
    outs = [dry(tmp_path, bulk, "fleet.clients=60", "rounds=4", f"output.format={fmt}")
            for bulk in (True, False)]
    files = sorted(p.name for p in outs[0].iterdir() if p.name != "summary.json")
    assert f"clients.{fmt}" in files
    assert all(filecmp.cmp(outs[0] / f, outs[1] / f, shallow=False) for f in files), files


def test_batteries_drain_by_energy_and_drop_who_cannot_pay(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each battery client's charge falls by its joules round by round; a client whose charge cannot
    pay for its work is dropped, does nothing and spends nothing; an emptied one is never picked
    again; mains devices never drop; the round's energy_j is its clients' sum."""
    monkeypatch.setenv(ENV, str(PROFILES))
    out = dry(tmp_path, True, "rounds=12", "energy.battery_start=[0.0,0.00003]")  # 0-1.2 J in an iPhone 12
    rows = list(csv.DictReader((out / "clients.csv").open()))
    left: dict[str, float] = {}
    drops = 0
    for r in rows:
        charge, joules = float(r["battery_j"]), float(r["energy_j"])
        if math.isinf(charge):
            assert r["battery_dropped"] == "0"
            continue
        if r["client"] in left:
            assert left[r["client"]] > 0  # an empty battery's device is offline
            assert charge == pytest.approx(max(left[r["client"]] - joules, 0.0), rel=1e-12, abs=1e-9)
        left[r["client"]] = charge
        if r["battery_dropped"] == "1":
            drops += 1
            assert joules == 0 and float(r["compute_s"]) == 0 and float(r["download_s"]) == 0
    assert drops > 0 and left  # the scenario's phones start nearly empty
    metrics = list(csv.DictReader((out / "metrics.csv").open()))
    for m in metrics:
        mine = [float(r["energy_j"]) for r in rows if r["round"] == m["round"]]
        assert float(m["energy_j"]) == pytest.approx(sum(mine), rel=1e-12)
        assert int(m["battery_dropped"]) == sum(r["battery_dropped"] == "1" for r in rows
                                                if r["round"] == m["round"])


def test_a_shared_link_slows_the_downloads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV, str(PROFILES))
    shared = list(csv.DictReader((dry(tmp_path / "a", True, "rounds=1") / "clients.csv").open()))
    alone = list(csv.DictReader((dry(tmp_path / "b", True, "rounds=1", "server.down_mbit_s=0",
                                     "server.up_mbit_s=0") / "clients.csv").open()))
    assert shared and all(float(a["download_s"]) < float(s["download_s"])
                          for a, s in zip(alone, shared, strict=True))


@pytest.mark.parametrize("bulk", [True, False])
def test_the_paper_accounting_prices_no_transfer_even_on_shared_links(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     bulk: bool) -> None:
    """The paper accounting counts no communication (as the FedProphet release): server links and
    energy must not bring its transfers back, in time or in radio joules. With energy on, a client's
    joules are then those of its busy and waiting seconds and its storage bytes only."""
    monkeypatch.setenv(ENV, str(PROFILES))
    out = dry(tmp_path, bulk, "rounds=1", "cost.accounting=paper", "server.down_mbit_s=100",
              "server.up_mbit_s=100")
    rows = list(csv.DictReader((out / "clients.csv").open()))
    assert rows and all(float(r["download_s"]) == float(r["upload_s"]) == 0.0 for r in rows)
    alone = list(csv.DictReader((dry(tmp_path / "alone", bulk, "rounds=1", "cost.accounting=paper",
                                     "server.down_mbit_s=0", "server.up_mbit_s=0") / "clients.csv").open()))
    assert [r["energy_j"] for r in rows] == [r["energy_j"] for r in alone]


def test_a_damaged_checkpoint_battery_is_refused() -> None:
    b = Battery(np.array([WH, math.inf]), np.array([1.0, 1.0]))
    b.restore([5.0, math.inf], "ckpt", 0.0)
    assert b.charge_j.tolist() == [5.0, math.inf]
    for bad in (None, [5.0], [5.0, -1.0], [5.0, "x"]):
        with pytest.raises(EdgeflError, match="battery"):
            b.restore(bad, "ckpt", 0.0)


def test_phase_power_adds_up_to_the_rounds_work_joules() -> None:
    """Idle 1 W, active 3 W at half the processor, radio 0.5 W; download 1 s (1 GB at 1 nJ/B),
    data access 2 s and compute 4 s (1 GB read at 2 nJ/B), upload 2 s (2 GB at 1 nJ/B). By hand:
    idle 1 x 9 s, training (3 - 1) x 0.5 x 4 s = 4 J, storage 2 J, radio bytes 1 + 2 J, radio base
    0.5 x 3 s: 19.5 J. Phase by phase: 1.5 W, 1 W, 2 W and 1.5 W, the storage's 2 J spread over
    data access and compute by their seconds (2/3 and 4/3 J), the bytes' over the transfers."""
    p = Power(active_w=3.0, idle_w=1.0, read_nj=2.0, write_nj=0.0, down_nj=1.0, up_nj=1.0, radio_w=0.5)
    c = ClientCost(compute_s=4.0, data_access_s=2.0, download_s=1.0, upload_s=2.0, mem_req_bytes=0.0,
                   swapped=False, read_bytes=1e9, write_bytes=0.0)
    watts, spread, per_byte = phase_power(p, c, 0.5, 1e9, 2e9)
    assert watts == (1.5, 1.0, 2.0, 1.5)
    assert spread == pytest.approx((1.0, 2 / 3, 4 / 3, 2.0))
    assert per_byte == (1e-9, 1e-9)
    seconds = (1.0, 2.0, 4.0, 2.0)
    total = sum(w * t for w, t in zip(watts, seconds, strict=True)) + sum(spread)
    assert total == pytest.approx(19.5) == round_energy(p, c, 0.5, 1e9, 2e9, 0.0)


def test_a_battery_is_filled_enough_when_its_charger_has_brought_the_joules() -> None:
    """Empty at 00:00, on a 0.5 W charger 01:00-03:00: 900 J are in at 01:30 (5400 s), 1800 J at
    02:00 (7200 s); never more than 3600 J, its capacity."""
    charger = Diurnal(seed=0, start_h=1.0, hours=2.0, spread_h=0.0)
    b = Battery(np.array([1.0 * WH]), np.array([0.0]), charger, charge_w=0.5)
    assert b.filled_at(0, 900.0, 0.0, 1e9) == pytest.approx(5400.0)
    assert b.filled_at(0, 1800.0, 0.0, 1e9) == pytest.approx(7200.0)
    assert b.filled_at(0, 3600.0, 0.0, 1e9) == math.inf  # the full battery holds 3600 J: never more
    assert b.filled_at(0, 900.0, 0.0, 3000.0) == math.inf  # not within the horizon
