"""Every real run measures its clients' training; on the calibrated host it says how good the
simulated compute was (time_prediction_error)."""

from __future__ import annotations

import csv
import json
import platform
from pathlib import Path

import pytest
import torch
from support import QUICKSTART, sets

from edgefl.calibration.calibrate import Calibration, Compute, Storage, render_profile, write_profile
from edgefl.cli import main
from edgefl.devices import catalog
from edgefl.sim.compute import FORWARD, Roofline

TINY = ["rounds=1", "training.local_iters=2", "attack.steps=2", "evaluation.steps=2", "data.test_samples=32",
        "fleet.clients=4", "fleet.sample_fraction=0.5", "device=cpu", "threads=1"]


@pytest.fixture
def host(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A catalog with `my_host`, calibrated (as `edgefl devices calibrate` writes it) on this
    machine with the threads in use."""
    root = tmp_path / "profiles"
    root.mkdir()
    cal = Calibration(16000.0, Compute(100.0, 100.0), Storage(1000.0, 1000.0, 0.1, 0.1, True),
                      ((("conv", FORWARD), Roofline(50e9, 10e9, 5e-6)),), threads=torch.get_num_threads())
    write_profile(root / "my_host.toml", render_profile("my_host", "host", cal))
    monkeypatch.setenv(catalog.ENV, str(root))  # scenarios find it along EDGEFL_PROFILE_PATH
    cat = catalog.load_catalog()
    assert cat.devices["my_host"].calibrated_host == platform.node()
    return "my_host"


def run(out: Path, extra: list[str]) -> tuple[dict, list[dict[str, str]]]:
    assert main(["run", str(QUICKSTART), "--out", str(out), "--quiet", *sets(TINY + extra)]) == 0
    with open(out / "clients.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    return json.loads((out / "summary.json").read_text()), rows


def test_real_compute_is_measured_and_no_error_off_host(tmp_path: Path) -> None:
    summary, rows = run(tmp_path / "r", [])
    assert rows and all(float(r["real_compute_s"]) > 0 for r in rows)
    assert "time_prediction_error" not in summary  # the quickstart's fleet is not this machine


def test_prediction_error_on_the_calibrated_host(tmp_path: Path, host: str,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    summary, rows = run(tmp_path / "h", [f'fleet.devices=["{host}"]', 'fleet.apps=["idle"]',
                                         "training.group_clients=false"])
    simulated = sum(float(r["compute_s"]) for r in rows)
    real = sum(float(r["real_compute_s"]) for r in rows)
    assert summary["time_prediction_error"] == pytest.approx(simulated / real - 1, abs=1e-4)
    assert "vs measured on this host" in capsys.readouterr().out


def test_no_error_when_clients_train_in_groups(tmp_path: Path, host: str) -> None:
    summary, rows = run(tmp_path / "g", [f'fleet.devices=["{host}"]', 'fleet.apps=["idle"]'])
    assert rows and all(float(r["real_compute_s"]) > 0 for r in rows)
    assert "time_prediction_error" not in summary  # a group's time is shared out, not measured


def test_no_error_when_an_app_slows_the_host(tmp_path: Path, host: str) -> None:
    """Everything as in the calibrated-host run above but the app: only the app can withhold the error
    (grouped training, which also withholds it, is off)."""
    summary, _ = run(tmp_path / "a", [f'fleet.devices=["{host}"]', 'fleet.apps=["video_4k"]',
                                      "training.group_clients=false"])
    assert "time_prediction_error" not in summary
