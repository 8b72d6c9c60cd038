"""The fit reaches every run (issue 51): a dry run charges a client what `edgefl price` charges the
same step on the same fitted profile, and a user's profile that names a family but carries no
`[fitted]` table of its own runs on its family's figures (edgefl.devices.families)."""

from __future__ import annotations

import csv
from dataclasses import replace

from support import QUICKSTART

from edgefl.cli import main
from edgefl.devices.catalog import load_catalog
from edgefl.devices.classes import perf_flops, provenance
from edgefl.devices.families import family_figures
from edgefl.devices.profile import Fitted
from edgefl.price import Step, atoms_of, price
from edgefl.sim.classes import device_rooflines

LOCAL_ITERS = 10  # the quickstart's


def test_a_dry_runs_client_compute_is_the_price_of_its_steps(tmp_path):
    out = tmp_path / "run"
    assert main(["run", str(QUICKSTART), "--dry-run", "--out", str(out), "--set", "rounds=1",
                 "--set", 'fleet.devices=["raspberry_pi_5"]', "--set", 'fleet.apps=["idle"]',
                 "--set", "fleet.reserved_memory_mb=100"]) == 0
    rows = list(csv.DictReader((out / "clients.csv").open()))
    pi5 = load_catalog().devices["raspberry_pi_5"]
    assert pi5.fitted.basis == "device"  # the fitted figures, not the class defaults
    # the quickstart's step: digits_cnn, batch 32 of 1x8x8, 10 classes, PGD-10, SGD with momentum
    step = Step("digits_cnn", 32, (1, 8, 8), 10, attack_steps=10, optimizer="momentum")
    expected = LOCAL_ITERS * price(step, atoms_of(step), pi5).seconds
    assert rows and {r["app"] for r in rows} == {"idle"}  # the whole device: no app's share taken
    for r in rows:  # the same sum of the same terms, in another order: float64 rounding only
        assert abs(float(r["compute_s"]) - expected) <= 1e-12 * expected


def test_a_profile_of_a_family_without_a_table_runs_on_its_familys_figures():
    pi5 = load_catalog().devices["raspberry_pi_5"]
    mine = replace(pi5, name="my_board", fitted=Fitted())  # a user's new Cortex-A76 board
    figures = family_figures()["cortex-a76"]
    assert figures.efficiency and figures.basis == "family"
    assert device_rooflines(mine) == device_rooflines(replace(mine, fitted=figures))
    # and not the class defaults it ran on before the fit reached runs
    assert device_rooflines(mine) != device_rooflines(replace(mine, family="", fitted=Fitted()))
    # what `devices show` says and what pools draw by follow the same figures the run charges
    assert any("families.toml" in line and "cortex-a76" in line for line in provenance(mine))
    assert perf_flops(mine) == mine.flops * figures.efficiency["conv"]
    # a family no row measured (no Mali GPU trains in the evidence) gets its architecture's figures
    mali, gpu = family_figures()["mali"], family_figures()["nvidia-pascal"]
    assert mali.basis == "arch" and gpu.basis == "family" and mali.efficiency != gpu.efficiency
