"""Dry runs: the engine and cost model without data or training, on the schedule a real run follows."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
from support import QUICKSTART, ROOT

from edgefl.cli import main

SMALL = ["rounds=2", "fleet.clients=6", "training.local_iters=3", "attack.steps=2", "evaluation.steps=2",
         "data.test_samples=32"]
TIMES = ["round", "sim_time_s", "round_time_s", "compute_s", "data_access_s", "comm_s", "wait_s", "swapped"]


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_dry_run_gives_a_real_runs_simulated_times(tmp_path):
    assert main(["run", str(QUICKSTART), *sets(SMALL), "--out", str(tmp_path / "real"), "--quiet"]) == 0
    assert main(["run", str(QUICKSTART), *sets(SMALL), "--out", str(tmp_path / "dry"), "--quiet",
                 "--dry-run"]) == 0
    real, dry = rows(tmp_path / "real" / "metrics.csv"), rows(tmp_path / "dry" / "metrics.csv")
    assert [{k: r[k] for k in TIMES} for r in dry] == [{k: r[k] for k in TIMES} for r in real]
    assert all(r["clean_acc"] == r["adv_acc"] == r["train_loss"] == "" for r in dry)
    summary = json.loads((tmp_path / "dry" / "summary.json").read_text())
    assert summary["dry_run"] is True and summary["clean_acc"] is None
    assert not (tmp_path / "dry" / "checkpoint.pt").exists()


def test_fedprophet_dry_run_advances_a_module_every_rounds_over_m(tmp_path):
    """The quickstart model splits into M = 2 modules; 6 rounds give each ceil(6 / 2) = 3."""
    out = tmp_path / "fp"
    assert main(["run", str(ROOT / "scenarios" / "fedprophet-quickstart.toml"), "--set", "rounds=6",
                 "--out", str(out), "--quiet", "--dry-run"]) == 0
    metrics = rows(out / "metrics.csv")
    assert [r["modules"] for r in metrics] == ["2"] * 6
    assert [r["module"] for r in metrics] == ["1", "1", "1", "2", "2", "2"]


def test_dry_run_needs_no_dataset_files(tmp_path):
    """CIFAR-10 is not on this machine: a dry run only needs its shapes."""
    out = tmp_path / "cifar"
    assert main(["run", str(ROOT / "scenarios" / "jfat-cifar10.toml"), "--set", "rounds=2",
                 "--set", "model.name=\"cnn3\"", "--set", f"data.root=\"{tmp_path / 'none'}\"",
                 "--out", str(out), "--quiet", "--dry-run"]) == 0
    assert len(rows(out / "metrics.csv")) == 2


def test_a_fleet_larger_than_the_dataset_plans_without_splitting_it(tmp_path, capsys):
    """Digits has 1437 training samples; 3000 clients with fixed local iterations need no split,
    while local epochs do, and then fail with one clear line."""
    big = ["fleet.clients=3000", "fleet.sample_fraction=0.01", "rounds=2"]
    assert main(["run", str(QUICKSTART), *sets(big), "--out", str(tmp_path / "a"), "--quiet",
                 "--dry-run"]) == 0
    assert sum(int(r["clients"]) for r in rows(tmp_path / "a" / "metrics.csv")) == 60
    capsys.readouterr()
    code = main(["run", str(QUICKSTART), *sets([*big, "training.local_epochs=1"]), "--out",
                 str(tmp_path / "b"), "--quiet", "--dry-run"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "fleet.clients" in err


def test_paper_accounting_prices_the_clients_own_sample_count():
    """The release charges each epoch's short last batch, so the paper accounting needs each
    client's training-set size; the walk does not ask for it."""
    from edgefl.experiment import prepare
    from edgefl.scenario import load_scenario

    for accounting, counted in (("paper", True), ("walk", False)):
        s = load_scenario(QUICKSTART, [f"cost.accounting=\"{accounting}\"", "fleet.clients=6"])
        exp = prepare(s, str(QUICKSTART), dry_run=True)
        state = exp.pool.state(3, 0)
        exp.method.plan_round(0, np.array([3]), {3: state})
        size = len(exp.ctx.splits[3].train)
        w = exp.ctx.cost.counted(exp.method.plan(0, 3, state).workload, lambda size=size: size)
        assert w.samples == (len(exp.ctx.splits[3].train) if counted else 0)
        assert not counted or 0 < w.samples < 1437


def test_paper_fedprophet_scenarios_give_one_module_length_per_module(tmp_path):
    """module_rounds must match the partition at each paper scenario's R_min (7 modules)."""
    for name in ("fedprophet-cifar10", "fedprophet-cifar10-unbalanced"):
        out = tmp_path / name
        assert main(["run", str(ROOT / "scenarios" / f"{name}.toml"), "--set", "rounds=2",
                     "--out", str(out), "--quiet", "--dry-run"]) == 0
        assert [r["modules"] for r in rows(out / "metrics.csv")] == ["7", "7"]
