"""The Ray executor on a local Ray: the same model and simulated times as in-process, and a worker
that dies is retried."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from edgefl import rundir
from edgefl.cli import main

ray = pytest.importorskip("ray")
from test_fidelity import simulated_rows  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = ROOT / "scenarios" / "quickstart.toml"
SMALL = ["rounds=2", "fleet.clients=6", "training.local_iters=4", "attack.steps=2", "evaluation.steps=2",
         "data.test_samples=32", "threads=1", "ray.workers=2"]


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def test_ray_matches_in_process_and_survives_a_dead_worker(tmp_path, monkeypatch):
    fault = tmp_path / "kill-one-worker"
    fault.touch()
    monkeypatch.setenv("EDGEFL_FAULT_ONCE", str(fault))  # inherited by the local Ray's workers
    try:
        assert main(["run", str(QUICKSTART), *sets(SMALL), "--out", str(tmp_path / "ray"), "--quiet",
                     "--executor", "ray"]) == 0
    finally:
        ray.shutdown()
    assert not fault.exists(), "no worker died, so the retry was not exercised"
    monkeypatch.delenv("EDGEFL_FAULT_ONCE")
    assert main(["run", str(QUICKSTART), *sets(SMALL), "--out", str(tmp_path / "local"), "--quiet"]) == 0
    ray_run, local_run = tmp_path / "ray", tmp_path / "local"
    assert (ray_run / "metrics.csv").read_text() == (local_run / "metrics.csv").read_text()
    assert simulated_rows(ray_run / "clients.csv") == simulated_rows(local_run / "clients.csv")
    ours, theirs = (torch.load(tmp_path / d / rundir.CHECKPOINT, weights_only=True)["method"]
                    for d in ("ray", "local"))
    assert ours["model"].keys() == theirs["model"].keys()
    for key, tensor in ours["model"].items():
        assert torch.equal(tensor, theirs["model"][key]), key
    assert os.environ.get("EDGEFL_FAULT_ONCE") is None
