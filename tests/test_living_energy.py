"""Energy on a living fleet: a client stopped early is charged for the work it did, worked by hand
from edgefl.sim.energy's formula on the 3-client deadline round of tests/test_living.py."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from living_rounds import play_round
from support import dies_before_checkpoint, dry_twice, simulated_rows

from edgefl.cli import main
from edgefl.experiment import prepare, run
from edgefl.experiment.living import Live
from edgefl.experiment.round_energy import RoundEnergy, worked
from edgefl.scenario import load_scenario
from edgefl.selection import SELECTORS
from edgefl.sim.availability import Always
from edgefl.sim.clients import COMPLETED, LATE, Transfer
from edgefl.sim.cost import Costs
from edgefl.sim.energy import Power, round_energy
from edgefl.sim.engine import Federation
from edgefl.sim.links import Links

POLICIES = [p for p in SELECTORS.names() if p != "uniform"]  # a living fleet draws uniform ones itself

ROOT = Path(__file__).resolve().parent.parent
# A ends its upload at 1+0+2+1 = 4 s, B at 7 s, C at 13 s
JOBS = [(0, (1.0, 0.0, 2.0, 1.0)), (1, (1.0, 0.0, 5.0, 1.0)), (2, (2.0, 0.0, 10.0, 1.0))]


def test_a_deadline_round_charges_each_client_for_the_work_it_did() -> None:
    """Deadline 6 s, target 2: A completes at 4 s and waits 2 s; B (download 1, compute 5 of 5, no
    upload) and C (download 2, compute 4 of 10) are late at 6 s. Each reads 1 MB and writes 2 MB
    over its data access and compute, downloads 1 MB and uploads 0.5 MB; training gets half the
    processor. With idle 0.2 W, active 4 W, 1 / 3 nJ per byte read / written, 416 / 3507 nJ per
    byte received / sent and radio 1.288 W:
    A: 0.2 (4 + 2) + 3.8 x 0.5 x 2 + 0.007 + 0.416 + 1.7535 + 1.288 x 2 = 9.7525 J
    B: 0.2 x 6 + 3.8 x 0.5 x 5 + 0.007 + 0.416 + 1.288 x 1 = 12.411 J
    C: 0.2 x 6 + 3.8 x 0.5 x 4 + 0.4 x 0.007 + 0.416 + 1.288 x 2 = 11.7948 J"""
    r = play_round(Federation(100.0), JOBS, Always(), target=2, deadline_s=6.0, server_s=0.5)
    assert [o.status for o in r.outcomes] == [COMPLETED, LATE, LATE]
    stop = np.array([o.stop_s for o in r.outcomes])
    wait = np.where(stop < r.close_s, r.close_s - stop, 0.0)
    spans = np.array([p for _, p in JOBS]).T
    three = np.ones(3)
    costs = Costs(compute_s=spans[2], data_access_s=spans[1], download_s=spans[0], upload_s=spans[3],
                  mem_req_bytes=0 * three, swapped=three > 0, read_bytes=1e6 * three,
                  write_bytes=2e6 * three)
    done, down_share, up_share = worked(costs, stop - r.start_s)
    p = Power(4.0, 0.2, 1.0, 3.0, 416.0, 3507.0, 1.288)
    joules = round_energy(p, done, 0.5, 1e6 * down_share, 5e5 * up_share, wait)
    assert joules == pytest.approx([9.7525, 12.411, 11.7948], rel=1e-12)


def test_a_completed_client_is_charged_its_whole_work() -> None:
    c = Costs(*(np.array([v]) for v in (3.0, 1.0, 2.0, 0.5, 0.0)), np.array([False]), np.array([4.0]),
              np.array([8.0]))
    done, down, up = worked(c, np.array([6.5]))
    assert (done, down.tolist(), up.tolist()) == (c, [1.0], [1.0])


NEARLY_EMPTY = ["energy.enabled=true", "energy.batteries=true", "energy.battery_start=[0.0005,0.001]"]


@pytest.mark.parametrize(("name", "overrides"), [
    ("deadline-diurnal-digits", NEARLY_EMPTY),
    ("async-digits", ["energy.enabled=true"]),
    # an async client never waits
    ("async-digits", [*NEARLY_EMPTY, "energy.battery_start=[0.00001,0.00003]"]),
])
def test_living_runs_write_joules(tmp_path: Path, name: str, overrides: list[str]) -> None:
    """Joules are non-negative and the rounds' sums, and a battery emptied (no charger) leaves its
    device offline for good: it never reappears. (These phones empty before any is dropped; drops,
    with nothing done, are tests/test_energy.py's batteries test.)"""
    path = ROOT / "scenarios" / f"{name}.toml"
    exp = prepare(load_scenario(path, ["rounds=4", *overrides]), str(path), dry_run=True)
    run(exp, tmp_path / "out", progress=False)
    rows = list(csv.DictReader((tmp_path / "out" / "clients.csv").open()))
    joules = [float(r["energy_j"]) for r in rows]
    assert all(j >= 0 for j in joules) and sum(joules) > 0
    metrics = list(csv.DictReader((tmp_path / "out" / "metrics.csv").open()))
    assert sum(float(m["energy_j"]) for m in metrics) == pytest.approx(sum(joules))
    if "battery_dropped" in rows[0]:
        emptied = [i for i, r in enumerate(rows) if float(r["battery_j"]) == 0]
        assert emptied  # the phones start nearly empty
        for i in emptied:
            assert all(r["client"] != rows[i]["client"] for r in rows[i + 1:])


@pytest.mark.parametrize("policy", POLICIES)
def test_a_policy_picks_among_the_online_clients_seeded(tmp_path: Path, policy: str) -> None:
    path = ROOT / "scenarios" / "deadline-diurnal-digits.toml"
    s = load_scenario(path, ["rounds=5", f"selection.policy={policy}"])
    exp, _ = dry_twice(s, path, tmp_path, ("metrics.csv", "clients.csv"))
    live = Live.of(exp, RoundEnergy(s, exp.pool))
    avail, clients = live.avail, s.fleet.clients
    start = {int(m["round"]): float(m["sim_time_s"]) - float(m["round_time_s"])
             for m in csv.DictReader((tmp_path / "a" / "metrics.csv").open())}
    rows = list(csv.DictReader((tmp_path / "a" / "clients.csv").open()))
    assert rows and all(avail.online(int(r["client"]), start[int(r["round"])]) for r in rows)
    assert {r["picked_by"] for r in rows} != {""}
    for t, at in start.items():  # over-selected, or every client online when fewer are
        online = sum(avail.online(k, at) for k in range(clients))
        assert sum(int(r["round"]) == t for r in rows) == min(live.selected, online)


@pytest.mark.parametrize("policy", POLICIES)
def test_an_async_policy_starts_online_idle_clients_seeded(tmp_path: Path, policy: str) -> None:
    """In async mode the policy picks each client among the devices online and not working: every
    download starts while its device is online, a device's jobs never overlap, the run is seeded."""
    path = ROOT / "scenarios" / "deadline-diurnal-digits.toml"
    s = load_scenario(path, ["rounds=6", "round.mode=async", f"selection.policy={policy}"])
    exp, _ = dry_twice(s, path, tmp_path, ("metrics.csv", "clients.csv", "events.csv"))
    avail = Live.of(exp, RoundEnergy(s, exp.pool)).avail
    rows = list(csv.DictReader((tmp_path / "a" / "clients.csv").open()))
    assert rows and {r["picked_by"] for r in rows} - {"uniform", ""}
    starts: dict[int, list[float]] = {}
    for e in csv.DictReader((tmp_path / "a" / "events.csv").open()):
        if e["phase"] == "download":
            starts.setdefault(int(e["client"]), []).append(float(e["start_s"]))
    assert all(avail.online(k, at) for k, ats in starts.items() for at in ats)
    for k, ats in starts.items():
        ends = sorted(float(r["finish_s"]) for r in rows if int(r["client"]) == k)
        assert all(end <= nxt for end, nxt in zip(ends, sorted(ats)[1:], strict=False))


def test_an_emptied_phone_is_offline_until_it_is_plugged_in(tmp_path: Path) -> None:
    """Every device online all day, plugged in from 00:30 to 01:30 (one time zone) at 10 W; the phones
    start nearly empty and the first rounds' waiting empties them. None is picked again before
    00:30 (1800 s); from then on they are, charged."""
    path = ROOT / "scenarios" / "living-digits.toml"
    s = load_scenario(path, ["rounds=30", "round.mode=sync", "selection.policy=uniform",
                             "fleet.online_hours=24", "fleet.tz_spread_h=0", "energy.charge_start_h=0.5",
                             "energy.charge_hours=1",
                             "energy.battery_start=[0.0005,0.001]", "server.down_mbit_s=0",
                             "server.up_mbit_s=0"])
    run(prepare(s, str(path), dry_run=True), tmp_path / "out", progress=False)
    rows = list(csv.DictReader((tmp_path / "out" / "clients.csv").open()))
    start = {m["round"]: float(m["sim_time_s"]) - float(m["round_time_s"])
             for m in csv.DictReader((tmp_path / "out" / "metrics.csv").open())}
    emptied = {r["client"]: int(r["round"]) for r in rows if float(r["battery_j"]) == 0}
    assert emptied and max(start.values()) > 1800
    back = [r for r in rows if r["client"] in emptied and int(r["round"]) > emptied[r["client"]]]
    assert back and all(start[r["round"]] >= 1800 and float(r["battery_j"]) > 0 for r in back)


@pytest.mark.slow
def test_a_deadline_run_with_batteries_resumes_to_the_same_rows(tmp_path: Path) -> None:
    """living-digits (deadline, diurnal, memory_fit, charging batteries, shared links), trained for
    real, dies after round 1's checkpoint: resumed, its rows are those of a run that never stopped
    (the batteries' charges come back from the checkpoint)."""
    path = ROOT / "scenarios" / "living-digits.toml"
    small = ["rounds=4", "training.local_iters=3", "attack.steps=2", "evaluation.steps=2",
             "data.test_samples=32", "energy.battery_start=[0.0005,0.001]", "checkpoint_every=1"]
    args = [a for s in small for a in ("--set", s)]
    whole, out = tmp_path / "whole", tmp_path / "late"
    assert main(["run", str(path), *args, "--out", str(whole), "--quiet"]) == 0
    with dies_before_checkpoint(2):
        assert main(["run", str(path), *args, "--out", str(out), "--quiet"]) == 130
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert (out / "metrics.csv").read_text() == (whole / "metrics.csv").read_text()
    assert simulated_rows(out / "clients.csv") == simulated_rows(whole / "clients.csv")
    assert any(float(r["battery_j"]) == 0 for r in csv.DictReader((whole / "clients.csv").open()))


def test_three_clients_share_the_server_links_in_a_deadline_round() -> None:
    """Each downloads 4 B at its own 4 B/s on a 4 B/s link: 4/3 B/s each, through at 3 s, +0.5 s
    latency. A computes 1 s and uploads 2 B (own 2 B/s, link 2 B/s) from 4.5 s: alone to 5 s (1 B),
    then 1 B/s each with B until 6 s, +0.5: 6.5 s. B from 5 s: 1 B by 6 s, the last 1 B alone at 2 B/s
    by 6.5 s, +0.5: 7 s. C computes 4 s, starts its upload at 7.5 s and is late at the 8 s deadline,
    1 B of its 2 B through (alone at 2 B/s for 0.5 s): its upload is noted as 0.5 s / (1/2) = 1 s,
    the time it would have taken at that pace, so that energy prorates half its bytes."""
    jobs = [(0, (1.5, 0.0, 1.0, 1.5)), (1, (1.5, 0.0, 1.5, 1.5)), (2, (1.5, 0.0, 4.0, 1.5))]
    t = Transfer(down_bytes=4.0, up_bytes=2.0, down_bps=4.0, up_bps=2.0, latency_s=0.5)
    r = play_round(Federation(), jobs, Always(), target=3, deadline_s=8.0, server_s=0.0,
                   shared=(Links(4.0, 2.0), [t, t, t]))
    assert [(o.status, o.stop_s) for o in r.outcomes] == [(COMPLETED, 6.5), (COMPLETED, 7.0), (LATE, 8.0)]
    assert [o.download_s for o in r.outcomes] == [3.5, 3.5, 3.5]
    assert [o.upload_s for o in r.outcomes] == [2.0, 2.0, 1.0]


def test_a_living_run_on_limited_links_is_slower(tmp_path: Path) -> None:
    path = ROOT / "scenarios" / "deadline-diurnal-digits.toml"
    times = []
    for links in ("0", "1"):
        s = load_scenario(path, ["rounds=3", f"server.down_mbit_s={links}"])
        exp = prepare(s, str(path), dry_run=True)
        run(exp, tmp_path / links, progress=False)
        metrics = csv.DictReader((tmp_path / links / "metrics.csv").open())
        times.append([float(m["sim_time_s"]) for m in metrics])
    assert times[1][0] > times[0][0]


@pytest.mark.parametrize("mode", ["sync", "deadline", "async"])
def test_the_living_digits_scenario_is_seeded_with_everything_on(tmp_path: Path, mode: str) -> None:
    path = ROOT / "scenarios" / "living-digits.toml"
    _, texts = dry_twice(load_scenario(path, ["rounds=3", f"round.mode={mode}"]), path, tmp_path,
                         ("metrics.csv", "clients.csv", "events.csv"))
    head = texts[1].splitlines()[0].split(",")
    assert {"status", "energy_j", "battery_j", "picked_by"} <= set(head)


PHONES = ["--set", 'fleet.devices=["pixel_4a", "iphone_12"]', "--set", "rounds=4", "--dry-run", "--quiet"]


def test_a_round_whose_every_client_cannot_pay_waits_until_one_can(tmp_path: Path, capsys) -> None:
    """Phones only, empty, on 1e-6 W chargers: every selected client is dropped for its battery, and
    such rounds once lasted 0 s at one instant forever (issue 39). A round now waits until the first
    of its clients has charged enough to pay for its work, then plays: every round has a client that
    works, and the clock moves by what the chargers need (weeks at a microwatt)."""
    out = tmp_path / "run"
    assert main(["run", str(ROOT / "scenarios" / "energy-digits.toml"), "--set",
                 "energy.battery_start=[0.0, 0.0]", "--set", "energy.charge_w=1e-6", *PHONES,
                 "--out", str(out)]) == 0
    rows = list(csv.DictReader((out / "metrics.csv").open()))
    assert all(int(r["dropped"]) < int(r["clients"]) for r in rows)
    assert float(rows[0]["sim_time_s"]) > 7 * 86400  # a microwatt charges slowly
    times = [float(r["sim_time_s"]) for r in rows]
    assert times == sorted(times) and len(set(times)) == len(times)


def test_a_round_no_battery_or_charger_can_ever_pay_for_is_one_line(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    assert main(["run", str(ROOT / "scenarios" / "energy-digits.toml"), "--set",
                 "energy.battery_start=[0.000001, 0.000001]", *PHONES, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "energy.charge_w: round 0: the battery of every one of its 10 clients " \
        "is too low to pay for its work, and no charger fills one within 1e+09 s" in err


def test_every_wait_ends_exactly_at_its_round_s_close(tmp_path: Path) -> None:
    """A completed client's wait span ends where its round closed: the last completed upload (the
    straggler's finish_s). Written as its stop plus its wait, it ended an ulp short of it: in
    energy-digits' first round, client 15 (stop 6.386147337793233 s, wait 285.28372921421646 s)
    waited until 291.66987655200967 s, while client 11 uploaded at 291.6698765520097 s."""
    out = tmp_path / "run"
    assert main(["run", str(ROOT / "scenarios" / "energy-digits.toml"), "--set", "rounds=3", "--dry-run",
                 "--quiet", "--out", str(out)]) == 0
    clients = list(csv.DictReader((out / "clients.csv").open()))
    close = {t: max(float(r["finish_s"]) for r in clients if r["round"] == t and r["status"] == "completed")
             for t in {r["round"] for r in clients}}
    waits = [e for e in csv.DictReader((out / "events.csv").open()) if e["phase"] == "wait"]
    assert any(e["round"] == "0" and e["client"] == "15" for e in waits)
    assert all(float(e["end_s"]) == close[e["round"]] for e in waits)
