"""edgefl.flower: a Flower app on edgefl's fleet and clock gives edgefl's own simulated times.

The same scenario played by `edgefl run --dry-run` and as a Flower app (the nodes' prices from the
client mod, the rounds from DeviceClock's clock) writes the same times, statuses and joules per
client and round, to the bit: on a plain fleet and on a living one (availability, deadline,
over-selection, batteries), through the clock alone, and through Flower's simulation
(run_simulation) with the example app. A node whose ClientApp raises is a dropped client with its
reason; bad wrapper arguments are one line; without flwr, the import says which extra to install.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgefl.errors import EdgeflError
from edgefl.experiment import prepare, prepare_out, run
from edgefl.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "flower"
EXAMPLE_SCENARIO = EXAMPLE / "edgefl_digits" / "scenario.toml"
QUICKSTART = ROOT / "scenarios" / "quickstart.toml"
LIVING = ROOT / "scenarios" / "living-digits.toml"
# deadline rounds of a diurnal fleet with over-selection, batteries that run out and a weak charger:
# clients complete, are cut at the deadline, go offline, are dropped for their battery or by
# over-selection
LIVING_SETS = ["rounds=4", "round.deadline_s=40", "energy.battery_start=[0.0,0.0005]", "energy.charge_w=0.5"]
NOT_COMPARED = {"real_compute_s", "train_loss"}  # measured here, or the training's


@pytest.fixture
def flwr():
    return pytest.importorskip("flwr")


def rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def edgefl_dry_run(scenario: Path, sets: list[str], out: Path) -> Path:
    s = load_scenario(scenario, sets)
    prepare_out(out, True)
    run(prepare(s, str(scenario), dry_run=True), out, progress=False)
    return out


def assert_same_times(ours: Path, flower: Path) -> None:
    """Every column edgefl writes, in every row of the three logs, equal as text (floats are
    written as their repr: equal text is equal bits)."""
    for name in ("clients.csv", "metrics.csv", "events.csv"):
        a, b = rows(ours / name), rows(flower / name)
        assert len(a) == len(b) > 0, name
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            for column, value in x.items():
                if column not in NOT_COMPARED:
                    assert y[column] == value, (name, i, column)


def clock_run(scenario: Path, sets: list[str], out: Path, fail: dict[int, str] | None = None) -> Path:
    """The scenario's rounds as DeviceClock plays them, without Flower's runtime: each picked
    client priced as its node's mod prices it (a Shadow of the resolved scenario the server
    sends), the round played on those prices."""
    from edgefl.flower.clock import Clock
    from edgefl.flower.runfolder import RunFolder
    from edgefl.flower.shadow import Shadow

    server = Shadow.load(scenario, sets)
    node = Shadow.from_text(server.text, server.where)
    clock = Clock(server)
    folder = RunFolder(out, server, clock.selection, overwrite=True)
    for t in range(server.scenario.rounds):
        plans = clock.begin(t)
        failed = {k: why for k, why in (fail or {}).items() if k in plans}
        prices = {k: node.price(k, t, numbers) for k, numbers in plans.items() if k not in failed}
        folder.round(clock.end(t, prices, failed, {}), "", {}, failed)
    folder.close(trained=False)
    return out


def test_without_flwr_the_import_names_the_extra():
    code = "import sys; sys.modules['flwr'] = None\nimport edgefl.flower"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("ImportError: edgefl.flower needs Flower (flwr), which is not installed: "
                    "pip install 'edgefl[flower]'")
    assert "During handling" not in done.stderr  # one cause, not a chain


def test_a_plain_fleet_through_the_clock_gives_edgefls_times(flwr, tmp_path):
    sets = ["rounds=3", "energy.enabled=true"]
    ours = edgefl_dry_run(QUICKSTART, sets, tmp_path / "edgefl")
    flower = clock_run(QUICKSTART, sets, tmp_path / "flower")
    assert_same_times(ours, flower)
    clients = rows(flower / "clients.csv")
    assert {r["status"] for r in clients} == {"completed"}
    assert all(float(r["energy_j"]) > 0 for r in clients)


def test_a_living_fleet_through_the_clock_gives_edgefls_times(flwr, tmp_path):
    ours = edgefl_dry_run(LIVING, LIVING_SETS, tmp_path / "edgefl")
    flower = clock_run(LIVING, LIVING_SETS, tmp_path / "flower")
    assert_same_times(ours, flower)
    clients = rows(flower / "clients.csv")
    assert {"completed", "late", "offline", "dropped"} <= {r["status"] for r in clients}
    assert any(r["battery_dropped"] == "1" for r in clients)  # a battery too low to take part
    assert any(float(r["energy_j"]) > 0 for r in clients)


def test_a_failed_node_is_a_dropped_client_with_its_reason(flwr, tmp_path):
    sets = ["rounds=2", "fleet.sample_fraction=1.0", "fleet.clients=4"]
    why = "the ClientApp failed: ValueError: boom"
    out = clock_run(EXAMPLE_SCENARIO, sets, tmp_path / "flower", fail={1: why})
    clients = rows(out / "clients.csv")
    failed = [r for r in clients if r["client"] == "1"]
    assert [r["status"] for r in failed] == ["dropped", "dropped"]
    assert {r["reason"] for r in failed} == {why}
    assert all(float(r["compute_s"]) == 0 for r in failed)
    assert {r["status"] for r in clients if r["client"] != "1"} == {"completed"}
    assert [int(r["dropped"]) for r in rows(out / "metrics.csv")] == [1, 1]
    assert any(r["phase"] == "dropped" for r in rows(out / "events.csv"))


def test_bad_wrapper_arguments_are_one_line(flwr, tmp_path):
    from flwr.serverapp.strategy import FedAvg

    from edgefl.flower import DeviceClock

    cases = [
        (lambda: DeviceClock("FedAvg", QUICKSTART), "DeviceClock: strategy: wraps a Flower strategy"),
        (lambda: DeviceClock(FedAvg(), tmp_path / "missing.toml"), "missing.toml"),
        (lambda: DeviceClock(FedAvg(), QUICKSTART, out=3), "DeviceClock: out:"),
        (lambda: DeviceClock(FedAvg(), QUICKSTART, overrides="rounds=2"), "DeviceClock: overrides:"),
        (lambda: DeviceClock(FedAvg(), QUICKSTART, overrides=["round.mode=async"]), "round.mode: async"),
        (lambda: DeviceClock(FedAvg(), QUICKSTART, overrides=["fleet.clients=zero"]), "fleet.clients"),
        (lambda: DeviceClock(FedAvg(), QUICKSTART, timeout=-1), "DeviceClock: timeout:"),
    ]
    for make, says in cases:
        with pytest.raises(EdgeflError) as info:
            make()
        assert says in str(info.value)
        assert "\n" not in str(info.value)


def test_the_apps_own_network_is_priced_by_its_layers(flwr):
    """`model=`: the network the nodes train, cut and profiled as edgefl cuts a torchvision model;
    edgefl's own digits_cnn given that way prices as the scenario's model.name does."""
    import math

    from torch import nn

    from edgefl.flower.shadow import Shadow
    from edgefl.models import build_model

    def wide() -> nn.Module:
        return nn.Sequential(nn.Conv2d(1, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 3, padding=1),
                             nn.ReLU(), nn.Flatten(), nn.Linear(64 * 8 * 8, 10))

    named = Shadow.load(EXAMPLE_SCENARIO)
    same = Shadow.load(EXAMPLE_SCENARIO, model=lambda: build_model("digits_cnn", 10, (1, 8, 8), [0.5], [0.5]))
    other = Shadow.load(EXAMPLE_SCENARIO, model=wide)
    for k in range(3):
        a, b, c = named.price(k, 0), same.price(k, 0), other.price(k, 0)
        assert {n: v for n, v in a.items() if not math.isnan(v)} == {n: v for n, v in b.items()
                                                                     if not math.isnan(v)}
        assert c["compute_s"] > a["compute_s"] and c["upload_s"] > a["upload_s"]
    with pytest.raises(EdgeflError, match=r"model: is a function making the network .* not a Sequential"):
        Shadow.load(EXAMPLE_SCENARIO, model=wide())


def test_a_federation_with_fewer_nodes_than_the_fleet_is_one_line(flwr):
    from edgefl.flower.shadow import Shadow
    from edgefl.flower.strategy import every_client

    shadow = Shadow.load(QUICKSTART, ["fleet.clients=4"])
    assert every_client({0: 11, 1: 12, 2: 13, 3: 14, 4: 15}, 5, shadow) == {0: 11, 1: 12, 2: 13, 3: 14, 4: 15}
    with pytest.raises(EdgeflError) as info:
        every_client({0: 11, 1: 12}, 2, shadow)
    assert str(info.value).endswith("fleet.clients: the fleet has 4 clients but the Flower federation has 2 "
                                    "nodes (partition-ids 0 to 1); run 4 nodes (num-supernodes) or set "
                                    "fleet.clients = 2")


def _simulate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, server: object, client: object,
              nodes: int) -> None:
    from flwr.simulation import run_simulation

    monkeypatch.syspath_prepend(str(EXAMPLE))
    path = os.pathsep.join([str(EXAMPLE), str(ROOT), os.environ.get("PYTHONPATH", "")])
    monkeypatch.setenv("PYTHONPATH", path)  # the local Ray's workers import the example
    monkeypatch.chdir(tmp_path)
    run_simulation(server_app=server, client_app=client, num_supernodes=nodes,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": 2, "include_dashboard": False}})


@pytest.mark.slow
def test_the_example_app_in_flowers_simulation_gives_edgefls_times_and_a_report(flwr, tmp_path, monkeypatch):
    """The example's ServerApp and ClientApp in run_simulation, 5 nodes, 2 rounds, priced dry (the
    nodes do not train); its run folder equals edgefl's own dry run of the scenario and `edgefl
    report` makes a page of it."""
    monkeypatch.syspath_prepend(str(EXAMPLE))
    from edgefl_digits.client_app import make_client_app
    from edgefl_digits.server_app import make_server_app

    out = tmp_path / "flower"
    server = make_server_app(**{"num-server-rounds": 2, "out": str(out), "dry-price": True,
                                "edgefl-set": "fleet.clients=5"})
    _simulate(tmp_path, monkeypatch, server, make_client_app(dry_price=True), 5)
    ours = edgefl_dry_run(EXAMPLE_SCENARIO, ["fleet.clients=5", "rounds=2"], tmp_path / "edgefl")
    assert_same_times(ours, out)
    from edgefl.cli import main

    assert main(["report", str(out)]) == 0
    assert (out / "report.html").stat().st_size > 1000


@pytest.mark.slow
def test_a_clientapp_that_raises_is_dropped_and_the_run_goes_on(flwr, tmp_path, monkeypatch):
    from flwr.app import Context, Message
    from flwr.clientapp import ClientApp

    monkeypatch.syspath_prepend(str(EXAMPLE))
    from edgefl_digits.client_app import make_client_app
    from edgefl_digits.server_app import make_server_app

    from edgefl.flower import device_time

    inner = make_client_app(dry_price=True)
    app = ClientApp(mods=[device_time()])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        if context.node_config["partition-id"] == 1:
            raise ValueError("boom on node 1")
        return inner(msg, context)

    out = tmp_path / "flower"
    server = make_server_app(**{"num-server-rounds": 2, "out": str(out), "dry-price": True,
                                "edgefl-set": "fleet.clients=3;fleet.sample_fraction=1.0"})
    _simulate(tmp_path, monkeypatch, server, app, 3)
    clients = rows(out / "clients.csv")
    ones = [(r["round"], r["status"]) for r in clients if r["client"] == "1"]
    assert ones == [("0", "dropped"), ("1", "dropped")]
    assert all("boom on node 1" in r["reason"] for r in clients if r["client"] == "1")
    assert {r["status"] for r in clients if r["client"] != "1"} == {"completed"}
    assert len(rows(out / "metrics.csv")) == 2 and (out / "summary.json").exists()
