"""The radio's tail (issue 36, item 6): after its last byte a radio stays in its high-power state for
`tail_s` seconds at `tail_w` watts (Huang et al., MobiSys 2012), charged as edgefl.sim.energy's
formula says, worked by hand: tail_w x (min(tail_s, data_access_s + compute_s) + tail_s)."""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from edgefl.devices.catalog import load_catalog, load_profile
from edgefl.devices.profile import NetworkProfile
from edgefl.errors import EdgeflError
from edgefl.experiment.round_energy import RoundEnergy, worked
from edgefl.sim.cost import ClientCost, Costs
from edgefl.sim.energy import FleetPower, Power, client_power, phase_power, radio_tail, round_energy

ROOT = Path(__file__).resolve().parents[1]
LTE = Power(4.0, 0.2, 1.0, 3.0, 416.0, 3507.0, 1.288, tail_s=11.576, tail_w=1.060)
NO_TAIL = Power(4.0, 0.2, 1.0, 3.0, 416.0, 3507.0, 1.288)
# download 2 s, data access 0.5 s, compute 3 s, upload 1 s; no storage bytes
COST = ClientCost(compute_s=3.0, data_access_s=0.5, download_s=2.0, upload_s=1.0, mem_req_bytes=0.0,
                  swapped=False, read_bytes=0.0, write_bytes=0.0)


def test_an_lte_round_by_hand() -> None:
    """Idle 0.2 W over 6.5 s busy: 1.3 J; training's extra 3.8 W at half the processor for 3 s:
    5.7 J; radio 1 MB received at 416 nJ/B and 0.5 MB sent at 3507: 2.1695 J; base 1.288 W for
    3 s: 3.864 J; the tails: the download's cut by the upload 3.5 s after it, the upload's whole,
    1.060 x (min(11.576, 3.5) + 11.576) = 15.98056 J."""
    tail = 1.060 * (min(11.576, 0.5 + 3.0) + 11.576)
    assert tail == pytest.approx(15.98056, rel=1e-12)
    assert round_energy(LTE, COST, 0.5, 1e6, 5e5, 0.0) == pytest.approx(13.0335 + tail, rel=1e-12)
    assert round_energy(NO_TAIL, COST, 0.5, 1e6, 5e5, 0.0) == pytest.approx(13.0335, rel=1e-12)
    long = replace(COST, compute_s=20.0)  # the download's tail runs out before the upload
    assert (round_energy(LTE, long, 0.5, 1e6, 5e5, 0.0) - round_energy(NO_TAIL, long, 0.5, 1e6, 5e5, 0.0)
            == pytest.approx(1.060 * 2 * 11.576, rel=1e-12))


def test_no_bytes_no_tail_and_a_network_without_one_adds_nothing() -> None:
    """Where communication is not counted (no bytes) there is no tail; a zero tail (the default, 5G
    here: no published figure is used) adds nothing, to the bit."""
    assert round_energy(LTE, COST, 0.5, 0.0, 0.0, 0.0) == round_energy(NO_TAIL, COST, 0.5, 0.0, 0.0, 0.0)
    assert (round_energy(LTE, COST, 0.5, 1e6, 0.0, 0.0) - round_energy(NO_TAIL, COST, 0.5, 1e6, 0.0, 0.0)
            == pytest.approx(1.060 * 3.5, rel=1e-12))  # the download's tail alone
    cat = load_catalog(ROOT / "device_profiles")
    phone = cat.devices["pixel_4a"]
    fiveg = client_power(phone, cat.networks["5g"])
    assert (fiveg.tail_s, fiveg.tail_w) == (0.0, 0.0)
    plain = Power(fiveg.active_w, fiveg.idle_w, fiveg.read_nj, fiveg.write_nj, fiveg.down_nj, fiveg.up_nj,
                  fiveg.radio_w)  # no tail given
    assert round_energy(fiveg, COST, 0.5, 1e6, 5e5, 3.0) == round_energy(plain, COST, 0.5, 1e6, 5e5, 3.0)


def test_bundled_networks_carry_their_tails() -> None:
    """Huang et al. (MobiSys 2012), Table 3: LTE's tail 11.576 s at 1.060 W, Wi-Fi's 0.238 s at
    0.119 W, also charged on the home lines, which the device reaches through its Wi-Fi."""
    cat = load_catalog(ROOT / "device_profiles")
    tails = {n: (p.tail_s, p.tail_w) for n, p in cat.networks.items()}
    assert tails["4g"] == (11.576, 1.060)
    assert tails["5g"] == (0.0, 0.0)
    for name in ("wifi", "cable", "dsl", "fiber", "satellite"):
        assert tails[name] == (0.2381, 0.1193), name
    assert all("Table 3" in cat.networks[n].energy_source for n in tails if n != "5g")
    lte = client_power(cat.devices["pixel_4a"], cat.networks["4g"])
    assert (lte.tail_s, lte.tail_w) == (11.576, 1.060)


def test_a_negative_tail_is_refused(tmp_path: Path) -> None:
    base = ('name = "slow"\ndescription = "Slow"\nsource = "made up"\nup_mbit_s = [1.0, 2.0]\n'
            'down_mbit_s = [1.0, 2.0]\nlatency_ms = [10.0, 20.0]\n')
    path = tmp_path / "slow.toml"
    path.write_text(base + "tail_s = 2.5\ntail_w = 0.5\n")
    made = load_profile(path, NetworkProfile)
    assert (made.tail_s, made.tail_w) == (2.5, 0.5)
    for key in ("tail_s", "tail_w"):
        path.write_text(base + f"{key} = -1.0\n")
        with pytest.raises(EdgeflError, match=key):
            load_profile(path, NetworkProfile)


def stopped_energy(p: Power[float], elapsed: list[float]) -> np.ndarray:
    """RoundEnergy.work_j on one COST client per `elapsed` (1 MB down, 0.5 MB up, half the
    processor), no waiting."""
    n = len(elapsed)
    energy = RoundEnergy.__new__(RoundEnergy)
    energy.power = FleetPower.__new__(FleetPower)
    energy.power.pool = SimpleNamespace(kind_flops=np.ones(1))  # type: ignore[assignment]
    energy.power.of = lambda s: Power(*(np.full(n, getattr(p, f.name)) for f in fields(p)))  # type: ignore[method-assign]
    energy.sent = lambda plan: (np.full(n, 1e6), np.full(n, 5e5))  # type: ignore[method-assign]
    s = SimpleNamespace(clients=np.arange(n), flops=np.full(n, 0.5), kind=np.zeros(n, dtype=np.int64))
    return energy.work_j(s, None, Costs.of([COST] * n), np.array(elapsed), np.zeros(n))  # type: ignore[arg-type]


def test_a_client_stopped_early_pays_the_tails_of_what_it_did() -> None:
    """The same client stopped 4 s in (1.5 s of its 3 s compute: the download's tail, spread over
    data access and compute, 2 of their 3.5 s; no upload, no upload tail), 6 s in (half its
    upload: half the upload's tail, as half its bytes), and done (both tails whole)."""
    extra = stopped_energy(LTE, [4.0, 6.0, np.inf]) - stopped_energy(NO_TAIL, [4.0, 6.0, np.inf])
    by_hand = [1.060 * 3.5 * 2.0 / 3.5, 1.060 * (3.5 + 11.576 / 2), 1.060 * (3.5 + 11.576)]
    assert extra == pytest.approx(by_hand, rel=1e-12)
    # a tail shorter than data access and compute: 1 s of their 3.5, spread; 2 of 3.5 s done
    short = replace(LTE, tail_s=1.0, tail_w=2.0)
    assert (stopped_energy(short, [4.0]) - stopped_energy(NO_TAIL, [4.0]) == pytest.approx([2.0 * 2.0 / 3.5]))


def test_the_phases_carry_the_tails() -> None:
    """The download's tail goes with the storage bytes over data access and compute (0.5 and 3 s of
    3.5), the upload's with the upload's bytes: the phases add up to the round's joules, and the
    upload's joules per byte carry its tail."""
    watts, spread, per_byte = phase_power(LTE, COST, 0.5, 1e6, 5e5)
    down_tail = 1.060 * 3.5
    assert spread[1:3] == pytest.approx((down_tail * 0.5 / 3.5, down_tail * 3 / 3.5))
    assert spread[3] == pytest.approx(5e5 * 3507e-9 + 1.060 * 11.576)
    assert per_byte[1] * 5e5 == pytest.approx(spread[3])
    seconds = (2.0, 0.5, 3.0, 1.0)
    total = sum(w * t for w, t in zip(watts, seconds, strict=True)) + sum(spread)
    assert total == pytest.approx(round_energy(LTE, COST, 0.5, 1e6, 5e5, 0.0), rel=1e-12)


def test_arrays_and_floats_price_the_tails_alike_to_the_bit() -> None:
    """One expression for a round's columns and for one client: random figures, some transfers of
    no bytes, some clients stopped early."""
    rng = np.random.default_rng(7)
    n = 64
    figures = [f.name for f in fields(Power)]
    p = Power(**{k: rng.uniform(0, 12, n) if k == "tail_s" else rng.uniform(0.1, 5.0, n) for k in figures})
    seconds = {k: rng.uniform(0, 10, n) for k in ("compute_s", "data_access_s", "download_s", "upload_s")}
    c = Costs(**seconds, mem_req_bytes=np.zeros(n), swapped=rng.uniform(size=n) < 0.5,
              read_bytes=rng.uniform(0, 1e6, n), write_bytes=rng.uniform(0, 1e6, n))
    down = np.where(rng.uniform(size=n) < 0.2, 0.0, rng.uniform(1, 1e6, n))
    up = np.where(rng.uniform(size=n) < 0.2, 0.0, rng.uniform(1, 1e6, n))
    share, wait = rng.uniform(0, 1, n), rng.uniform(0, 100, n)
    done, down_share, up_share = worked(c, rng.uniform(0, 30, n))
    tails = radio_tail(p, c, down, up, done, up_share)
    whole = round_energy(p, c, share, down, up, wait)
    part = round_energy(p, done, share, down * down_share, up * up_share, wait, tails)
    phases = phase_power(p, c, share, down, up)
    for i in range(n):
        pi, ci, di = p.at(i), c.cost(i), done.cost(i)
        alone = round_energy(pi, ci, float(share[i]), float(down[i]), float(up[i]), float(wait[i]))
        assert float(whole[i]) == alone
        one = radio_tail(pi, ci, float(down[i]), float(up[i]), di, float(up_share[i]))
        assert (float(tails[0][i]), float(tails[1][i])) == (float(one[0]), float(one[1]))
        assert float(part[i]) == round_energy(pi, di, float(share[i]), float(down[i] * down_share[i]),
                                              float(up[i] * up_share[i]), float(wait[i]), one)
        rows = phase_power(pi, ci, float(share[i]), float(down[i]), float(up[i]))
        assert [float(x[i]) for group in phases for x in group] == [float(x) for group in rows for x in group]
    assert (tails[1][up == 0] == 0).all() and (tails[0][down == 0] == 0).all()
