"""The quickstart scenario end to end on a tiny budget, through the CLI in-process, then plotted."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest
import torch
from support import QUICKSTART, sets

from edgefl.cli import main
from edgefl.experiment import CLIENTS
from edgefl.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
# A tiny budget. The quickstart's own sample_fraction (0.5: 10 of its 20 clients a round) is kept so
# that its microcontrollers (8 of the 20 clients with seed 0) take part in both rounds.
TINY = ["rounds=2", "training.local_iters=2", "attack.steps=2", "evaluation.steps=2",
        "data.test_samples=64", "fleet.sample_fraction=0.5"]
PER_ROUND = 10  # round(0.5 x 20)
REQUIRED = ["round", "sim_time_s", "compute_s", "data_access_s", "comm_s", "clean_acc", "adv_acc"]
MICROCONTROLLERS = {"esp32_s3": 8.5e6, "stm32h747": 9.0e6}  # memory_mb in device_profiles/, bytes
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        out = tmp_path_factory.mktemp("quickstart") / "run"
        assert main(["run", str(QUICKSTART), *sets(TINY), "--out", str(out), "--quiet"]) == 0
    finally:
        torch.set_num_threads(threads)
    return out


@pytest.mark.slow
def test_run_writes_the_run_directory(run_dir: Path):
    for name in ("scenario.toml", "metrics.csv", "clients.csv", "summary.json"):
        assert (run_dir / name).is_file(), name


def test_the_saved_scenario_is_the_resolved_one(run_dir: Path):
    saved = load_scenario(run_dir / "scenario.toml")
    assert saved == load_scenario(QUICKSTART, TINY)
    assert (saved.rounds, saved.training.local_iters, saved.attack.steps) == (2, 2, 2)
    assert (saved.evaluation.steps, saved.data.test_samples) == (2, 64)


def test_metrics_one_row_per_round_with_the_time_breakdown(run_dir: Path):
    header, rows = read_csv(run_dir / "metrics.csv")
    assert set(REQUIRED) <= set(header)
    assert len(header) == len(set(header))
    assert [int(r["round"]) for r in rows] == [0, 1]
    clock = 0.0
    for r in rows:
        parts = [float(r[k]) for k in ("compute_s", "data_access_s", "comm_s", "server_s")]
        assert all(p >= 0 for p in parts)
        round_time = float(r["round_time_s"])
        assert round_time > 0
        assert math.isclose(sum(parts), round_time, rel_tol=1e-9)
        # sim_time_s is the clock at the end of the round: the rounds' times add up
        clock += round_time
        assert math.isclose(float(r["sim_time_s"]), clock, rel_tol=1e-9)
        assert int(r["clients"]) == PER_ROUND
        for key in ("clean_acc", "adv_acc"):  # evaluated every round on 64 test samples
            acc = float(r[key])
            assert 0.0 <= acc <= 1.0
            assert abs(acc * 64 - round(acc * 64)) < 64 * 5e-5 + 1e-9  # k / 64, rounded to 4 places
    times = [float(r["sim_time_s"]) for r in rows]
    assert times[0] < times[1]


def test_clients_log_one_row_per_client_per_round(run_dir: Path):
    header, rows = read_csv(run_dir / "clients.csv")
    assert header == CLIENTS
    assert len(rows) == 2 * PER_ROUND
    _, metrics = read_csv(run_dir / "metrics.csv")
    for m in metrics:
        mine = [r for r in rows if r["round"] == m["round"]]
        assert len(mine) == PER_ROUND
        assert len({r["client"] for r in mine}) == PER_ROUND
        assert sum(int(r["swapped"]) for r in mine) == int(m["swapped"])
        # the round ends at the last upload, plus server time
        last = max(float(r["finish_s"]) for r in mine)
        assert math.isclose(last + float(m["server_s"]), float(m["sim_time_s"]), rel_tol=1e-9)


def test_swapping_happens_exactly_when_memreq_exceeds_available_memory(run_dir: Path):
    _, rows = read_csv(run_dir / "clients.csv")
    for r in rows:
        avail, need = int(r["mem_avail_bytes"]), int(r["mem_req_bytes"])
        assert int(r["swapped"]) == int(need > avail), r
        if r["swapped"] == "1":
            assert int(r["read_bytes"]) > 0
            assert int(r["write_bytes"]) > 0  # evicting trained parameters writes them back
            assert float(r["data_access_s"]) > 0
        else:
            assert int(r["write_bytes"]) == 0  # only the training data (and parameters) are read


def test_microcontrollers_cannot_hold_the_model_and_swap(run_dir: Path):
    _, rows = read_csv(run_dir / "clients.csv")
    small = [r for r in rows if r["device"] in MICROCONTROLLERS]
    assert small, "the quickstart fleet's microcontrollers should take part"
    for r in small:
        # available memory is at most 20 % (fleet.memory_fraction high) of 8.5 / 9 MB, or R_min = 1.2 MB
        assert int(r["mem_avail_bytes"]) <= max(0.2 * MICROCONTROLLERS[r["device"]], 1.2e6) + 1
        assert int(r["mem_avail_bytes"]) < int(r["mem_req_bytes"])
        assert r["swapped"] == "1"
    assert any(r["swapped"] == "0" for r in rows), "the phones and boards should mostly fit"


def test_summary_matches_the_metrics(run_dir: Path):
    summary = json.loads((run_dir / "summary.json").read_text())
    _, metrics = read_csv(run_dir / "metrics.csv")
    _, clients = read_csv(run_dir / "clients.csv")
    assert summary["method"] == "jfat"
    assert summary["rounds"] == 2
    assert summary["client_rounds"] == 2 * PER_ROUND
    assert summary["client_rounds_swapped"] == sum(int(r["swapped"]) for r in clients) >= 1
    assert math.isclose(summary["sim_time_s"], float(metrics[-1]["sim_time_s"]), rel_tol=1e-9)
    # the straggler's breakdown: each round's compute + data access + comm + server is its time
    parts = [sum(float(r[c]) for r in metrics) for c in ("compute_s", "data_access_s", "comm_s", "server_s")]
    assert [summary[c] for c in ("compute_s", "data_access_s", "comm_s", "server_s")] == pytest.approx(parts)
    assert sum(parts) == pytest.approx(sum(float(r["round_time_s"]) for r in metrics))
    assert math.isclose(summary["clean_acc"], float(metrics[-1]["clean_acc"]))
    assert math.isclose(summary["adv_acc"], float(metrics[-1]["adv_acc"]))
    assert sum(summary["fleet"].values()) == 20


@pytest.mark.slow
def test_plot_writes_a_png(run_dir: Path, capsys: pytest.CaptureFixture[str]):
    png = run_dir / "figures" / "accuracy.png"
    png.unlink(missing_ok=True)
    assert main(["plot", str(run_dir)]) == 0
    data = png.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert len(data) > 1000
    assert str(png) in capsys.readouterr().out


def test_a_device_too_small_for_any_atom_stops_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """The nRF52840 keeps 256 KB. Paged layer by layer, one sample at a time, SGD with momentum fits
    there (conv3's convolution: 3 x 73.7 KB of weights, momentum and gradient); with Adam's two
    moments its step needs 4 x 73.7 KB and more, so no schedule runs."""
    out = tmp_path / "run"
    code = main(["run", str(QUICKSTART), *sets([*TINY, 'fleet.devices=["nrf52840"]',
                                                 'training.optimizer="adam"']),
                 "--out", str(out), "--quiet"])
    assert code == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("edgefl: error:")
    assert "nrf52840" in lines[0]
    assert "Traceback" not in err
    assert not out.exists()


def test_rounds_not_evaluated_leave_every_accuracy_empty(tmp_path: Path):
    """evaluation.every = 2 over 3 rounds evaluates rounds 1 and 2 (the last): round 0's clean,
    PGD and extra-attack cells are empty (an extra attack's column once crashed the run there)."""
    out = tmp_path / "run"
    extra = ["rounds=3", "evaluation.every=2", 'evaluation.extra=["fgsm"]', "fleet.clients=4"]
    assert main(["run", str(QUICKSTART), *sets(TINY + extra), "--out", str(out), "--quiet"]) == 0
    _, rows = read_csv(out / "metrics.csv")
    cells = [(r["clean_acc"] != "", r["adv_acc"] != "", r["fgsm_acc"] != "") for r in rows]
    assert cells == [(False, False, False), (True, True, True), (True, True, True)]


def test_the_summary_holds_the_extra_attacks_final_accuracies(tmp_path: Path) -> None:
    out = tmp_path / "run"
    args = ["rounds=2", "evaluation.every=2", 'evaluation.extra=["fgsm"]', "data.test_samples=40",
            "evaluation.steps=2", "training.local_iters=2", "attack.steps=2", "fleet.clients=4", "threads=1"]
    assert main(["run", str(QUICKSTART), *[a for s in args for a in ("--set", s)], "--out", str(out),
                 "--quiet"]) == 0
    last = list(csv.DictReader((out / "metrics.csv").open()))[-1]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fgsm_acc"] == float(last["fgsm_acc"]) and summary["adv_acc"] == float(last["adv_acc"])
