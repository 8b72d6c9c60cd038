"""Plugins (issue 38, item 4): an installed package adds a method (with a knob section), a selection
policy (with a knob) and a folder of device profiles through entry points, with no edit to edgefl.

The package is built and installed for real (`pip install --target`, no network, no build
isolation) and edgefl runs in a fresh process with it on the path; a broken plugin is one warning
line, and stops only the runs that name what it would have provided, with one error line."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "edgefl-demo-plugin"
version = "0.1"

[tool.setuptools]
packages = ["edgefl_demo", "edgefl_demo.boards"]

[tool.setuptools.package-data]
"edgefl_demo.boards" = ["*.toml"]

[project.entry-points."edgefl.methods"]
damped_avg = "edgefl_demo.damped"

[project.entry-points."edgefl.policies"]
lowest_ids = "edgefl_demo.lowest:LowestIds"

[project.entry-points."edgefl.devices"]
demo_boards = "edgefl_demo.boards"
"""

DAMPED = '''\
"""A method in one file: FedAvg-AT whose server moves only `factor` of the way to the average."""
from dataclasses import dataclass

from edgefl.config import Check, Knobs, knob_section
from edgefl.methods import METHODS
from edgefl.methods.fedavg import FedAvgAT


@knob_section("damped")
@dataclass
class DampedConfig(Knobs):
    factor: float = 0.5

    def checks(self) -> list[Check]:
        return [("factor", 0 <= self.factor <= 1, "must be in [0, 1]")]


@METHODS.register("damped_avg")
class DampedAvg(FedAvgAT):
    def combine(self, round_, updates):
        factor = self.ctx.scenario.knobs(DampedConfig).factor
        average, old = super().combine(round_, updates), self.model.state_dict()
        return {k: old[k] + factor * (v - old[k]) if v.is_floating_point() else v
                for k, v in average.items()}
'''

LOWEST = '''\
"""A policy in one file, registered by its entry point's name: clients offset, offset + 1, ..."""
from dataclasses import dataclass

import numpy as np

from edgefl.config import Knobs, knob_section
from edgefl.selection import Picked, Selector


@knob_section("lowest_ids")
@dataclass
class LowestIdsConfig(Knobs):
    offset: int = 0


class LowestIds(Selector):
    def __init__(self, s):
        self.offset = s.knobs(LowestIdsConfig).offset

    def select(self, ask, known):
        clients = np.arange(self.offset, self.offset + ask.count)
        return Picked.of(clients, np.full(ask.count, np.nan), ["lowest"] * ask.count)
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo plugin, built and installed into a folder of its own."""
    src = tmp_path_factory.mktemp("plugin-src")
    (src / "pyproject.toml").write_text(PYPROJECT)
    pkg = src / "edgefl_demo"
    (pkg / "boards").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "damped.py").write_text(DAMPED)
    (pkg / "lowest.py").write_text(LOWEST)
    (pkg / "boards" / "__init__.py").write_text("")
    board = (ROOT / "device_profiles" / "raspberry_pi_4.toml").read_text()
    board = board.replace('name = "raspberry_pi_4"', 'name = "demo_board"')
    (pkg / "boards" / "demo_board.toml").write_text(board)
    target = tmp_path_factory.mktemp("plugin-site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                    "--no-build-isolation", "--target", str(target), str(src)], check=True)
    return target


def edgefl(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    paths = [str(site), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    return subprocess.run([sys.executable, "-m", "edgefl", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=600)


SMALL = ["--set", "rounds=2", "--set", "fleet.clients=6", "--set", "fleet.sample_fraction=0.5",
         "--set", "training.local_iters=2", "--set", "attack.steps=1", "--set", "evaluation.steps=1",
         "--set", "data.test_samples=16", "--set", "threads=1"]


@pytest.mark.slow
def test_a_plugin_adds_a_method_a_policy_and_a_device_folder(site: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    done = edgefl(site, "run", "quickstart", "--out", str(out), "--quiet", *SMALL,
                  "--set", 'method="damped_avg"', "--set", "damped.factor=0.25",
                  "--set", 'selection.policy="lowest_ids"', "--set", "lowest_ids.offset=2",
                  "--set", 'fleet.devices=["demo_board"]')
    assert done.returncode == 0, done.stderr
    with open(out / "clients.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert {(r["round"], r["client"]) for r in rows} == {(t, k) for t in "01" for k in "234"}
    assert {r["device"] for r in rows} == {"demo_board"} and {r["picked_by"] for r in rows} == {"lowest"}
    resolved = (out / "scenario.toml").read_text()
    assert "\n[damped]\nfactor = 0.25\n" in resolved and "\n[lowest_ids]\noffset = 2\n" in resolved


@pytest.mark.slow
def test_a_plugin_knob_is_checked_like_edgefl_s_own(site: Path, tmp_path: Path) -> None:
    done = edgefl(site, "run", "quickstart", "--dry-run", "--out", str(tmp_path / "r"),
                  "--set", 'method="damped_avg"', "--set", "damped.factor=2")
    assert done.returncode == 2 and done.stderr.strip().endswith("damped.factor: must be in [0, 1]")
    assert "Traceback" not in done.stderr


@contextmanager
def broken(site: Path, module: str) -> Iterator[None]:
    """The plugin's `module` (a file of its package) raises on import, until the block ends."""
    path = site / "edgefl_demo" / module
    kept = path.read_text()
    path.write_text("raise ImportError('needs numpy 9')\n")
    try:
        yield
    finally:
        path.write_text(kept)


def test_a_broken_plugin_warns_once_and_a_run_not_using_it_completes(site: Path, tmp_path: Path) -> None:
    with broken(site, "lowest.py"):
        done = edgefl(site, "run", "quickstart", "--dry-run", "--quiet", "--out", str(tmp_path / "r"))
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == [
        "edgefl: warning: plugin edgefl-demo-plugin (entry point edgefl.policies: lowest_ids = "
        "edgefl_demo.lowest:LowestIds) failed to load: ImportError: needs numpy 9; runs that use it will "
        "stop"]
    assert (tmp_path / "r" / "metrics.csv").is_file()


@pytest.mark.parametrize(("module", "setting", "key", "point"), [
    ("damped.py", 'method="damped_avg"', "method", "edgefl.methods: damped_avg = edgefl_demo.damped"),
    ("lowest.py", 'selection.policy="lowest_ids"', "selection.policy",
     "edgefl.policies: lowest_ids = edgefl_demo.lowest:LowestIds"),
    ("boards/__init__.py", 'fleet.devices=["demo_board"]', "fleet.devices",
     "edgefl.devices: demo_boards = edgefl_demo.boards"),
])
def test_a_run_naming_what_a_broken_plugin_provides_stops_with_one_error_line(
        site: Path, tmp_path: Path, module: str, setting: str, key: str, point: str) -> None:
    with broken(site, module):
        done = edgefl(site, "run", "quickstart", "--dry-run", "--quiet", "--out", str(tmp_path / "r"),
                      "--set", setting)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    warning, error = done.stderr.splitlines()
    assert warning.startswith("edgefl: warning: plugin edgefl-demo-plugin") and point in warning
    assert error.startswith("edgefl: error:") and f": {key}: unknown " in error
    assert error.endswith(f"plugin edgefl-demo-plugin (entry point {point}) failed to load "
                          "(ImportError: needs numpy 9) and may have provided it")
