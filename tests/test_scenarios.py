"""Every bundled scenario validates and prepares for a dry run (the paper settings without their data)."""

from pathlib import Path

import pytest

from edgefl.experiment import prepare
from edgefl.scenario import load_scenario

SCENARIOS = sorted(Path(__file__).resolve().parents[1].glob("scenarios/*.toml"))


def test_the_bundled_scenarios_are_there():
    names = {p.stem for p in SCENARIOS}
    assert {"quickstart", "fedprophet-quickstart", "sfat-digits", "feddynat-digits", "gma-digits",
            "sfat-cifar10", "feddynat-cifar10", "gma-cifar10", "fedprophet-cifar10", "jfat-cifar10",
            "fedprophet-caltech256", "jfat-caltech256"} <= names


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_prepares(path: Path):
    """Past the scenario's own checks, the ones that run before work: data shapes, model, fleet
    memory and every device's budget (a dry run: no dataset download)."""
    exp = prepare(load_scenario(path), str(path), dry_run=True)
    assert exp.dry_run and len(exp.pool.kind_of) == exp.scenario.fleet.clients
