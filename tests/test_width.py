"""Width-reduced sub-models (HeteroFL-AT, FedDrop-AT, FedRolex-AT; FedProphet §7.2) against values
computed by hand: the width fraction r = min(R_k(t) / MemReq, 1) with levels and min_fraction, the
channels kept (first ceil(rC), seeded random, a window from round mod C wrapping around), the
sliced network, the element-wise partial average, what the cost model is charged, and one short
run of each method through the CLI.

digits_cnn (scenarios/quickstart.toml) at r = 0.5 keeps 8 / 16 / 32 of its 16 / 32 / 64 channels:
conv1 1x8x3x3 = 72, BN8 16, conv2 8x16x3x3 = 1152, BN16 32, conv3 16x32x3x3 = 4608, BN32 64,
linear (32 x 2 x 2) x 10 + 10 = 1290; 72 + 16 + 1152 + 32 + 4608 + 64 + 1290 = 7234 parameters.
Its state also holds the BN running means and variances 2 x (8 + 16 + 32) = 112 floats, the
normalisation's mean and std (2 floats) and three int64 BN counters: 4 x (7234 + 112 + 2) + 3 x 8
= 29416 bytes. The whole model: 25978 parameters, 2 x (16 + 32 + 64) = 224 running statistics,
4 x (25978 + 224 + 2) + 24 = 104840 bytes.
"""

from __future__ import annotations

import csv
import dataclasses

import pytest
import torch
from support import QUICKSTART, ROOT
from torch import nn

from edgefl.cli import main
from edgefl.errors import EdgeflError
from edgefl.experiment import Experiment, prepare
from edgefl.methods.aggregate import state_bytes
from edgefl.methods.feddrop import FedDropAT, random_channels
from edgefl.methods.fedrolex import rolling_channels
from edgefl.methods.heterofl import static_channels
from edgefl.methods.width import (
    WidthConfig,
    check_narrowable,
    extract,
    grid,
    hidden_counts,
    kept_count,
    width_average,
    width_fraction,
)
from edgefl.models import AtomModel, build_model
from edgefl.profiling import profile_model
from edgefl.scenario import load_scenario
from edgefl.sim.records import mem_req, paper_mem_req

WIDTH_METHODS = ["heterofl_at", "feddrop_at", "fedrolex_at"]


def experiment(method: str, *overrides: str) -> Experiment:
    scenario = load_scenario(QUICKSTART, [f"method={method}", "rounds=2", "training.local_iters=1",
                                          "attack.steps=1", "device=cpu", *overrides])
    return prepare(scenario, str(QUICKSTART))


# ============================================================================== the width fraction

@pytest.mark.parametrize(("available", "levels", "expected"), [
    (50.0, [], 0.5),              # 50 / 100
    (250.0, [], 1.0),             # min(2.5, 1)
    (1.0, [], 0.0625),            # 0.01 is below min_fraction 0.0625
    (70.0, [0.25, 0.5, 1.0], 0.5),   # largest level <= 0.7
    (100.0, [0.25, 0.5, 1.0], 1.0),  # r = 1 is a level
    (20.0, [0.25, 0.5, 1.0], 0.25),  # no level <= 0.2: the smallest
    (1.0, [0.05, 1.0], 0.05),     # clamped to 0.0625 first, then rounded down to 0.05
])
def test_width_fraction(available, levels, expected):
    assert width_fraction(available, 100.0, WidthConfig(levels=levels)) == pytest.approx(expected)


def test_kept_count_is_ceil_r_c_at_least_one():
    assert kept_count(0.5, 4) == 2      # ceil(2)
    assert kept_count(0.3, 10) == 3     # 0.3 x 10 = 3.0000000000000004 in floats, still 3
    assert kept_count(0.68, 16) == 11   # ceil(10.88)
    assert kept_count(0.01, 16) == 1    # ceil(0.16)
    assert kept_count(1.0, 64) == 64


# ============================================================================== which channels

def test_static_channels_are_the_first():
    assert static_channels(5) == [0, 1, 2, 3, 4]


def test_rolling_window_wraps_around():
    assert rolling_channels(4, kept_count(0.5, 4), 3) == [3, 0]  # C = 4, r = 0.5, round 3
    assert rolling_channels(4, 2, 5) == [1, 2]                   # 5 mod 4 = 1
    assert rolling_channels(3, kept_count(0.5, 3), 2) == [2, 0]  # ceil(1.5) = 2 from 2 mod 3


def test_random_channels_are_seeded_per_seed_round_client():
    first = random_channels(16, 8, 0, 3, 5)
    assert first == random_channels(16, 8, 0, 3, 5)  # the same draw again
    assert first == sorted(set(first)) and len(first) == 8 and set(first) <= set(range(16))
    # another client, round or seed draws another subset (C(16, 8) = 12870 of them)
    for key in [(1, 3, 5), (0, 4, 5), (0, 3, 6)]:
        assert random_channels(16, 8, *key) != first


# ============================================================================== the narrower network

def tiny() -> AtomModel:
    """conv 1x1 1 -> 4 (with bias) | BN4 | ReLU | flatten (4 channels x 2 positions) | linear 8 -> 3,
    every tensor filled with consecutive numbers so a slice is read off by eye."""
    body = nn.Sequential(nn.Conv2d(1, 4, 1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(8, 3))
    with torch.no_grad():
        body[0].weight.copy_(torch.arange(4.0).view(4, 1, 1, 1))
        body[0].bias.copy_(torch.arange(10.0, 14.0))
        body[1].weight.copy_(torch.arange(20.0, 24.0))
        body[1].bias.copy_(torch.arange(30.0, 34.0))
        body[1].running_mean.copy_(torch.arange(40.0, 44.0))
        body[4].weight.copy_(torch.arange(24.0).view(3, 8))
        body[4].bias.copy_(torch.tensor([100.0, 101.0, 102.0]))
    return AtomModel([("body", body)], (1, 2, 1))


def test_static_extraction_slices_conv_bn_and_the_linear_after_flatten():
    model = tiny()
    assert hidden_counts(model) == [4]  # the linear gives the classes and stays whole
    sub = extract(model, {4: torch.tensor(static_channels(2))})
    s = sub.model.state_dict()
    assert s["body.0.weight"].flatten().tolist() == [0.0, 1.0]
    assert s["body.0.bias"].tolist() == [10.0, 11.0]
    assert s["body.1.weight"].tolist() == [20.0, 21.0]
    assert s["body.1.running_mean"].tolist() == [40.0, 41.0]
    # channel c of a 2 x 1 map is flattened to features 2c, 2c + 1: channels 0, 1 -> columns 0..3
    assert s["body.4.weight"].tolist() == [[0, 1, 2, 3], [8, 9, 10, 11], [16, 17, 18, 19]]
    assert s["body.4.bias"].tolist() == [100.0, 101.0, 102.0]
    conv, linear = sub.model.body[0], sub.model.body[4]
    assert (conv.in_channels, conv.out_channels, linear.in_features, linear.out_features) == (1, 2, 4, 3)
    assert sub.model(torch.rand(5, 1, 2, 1)).shape == (5, 3)
    assert model.body[0].weight.shape == (4, 1, 1, 1)  # the global model is untouched


def test_rolling_extraction_round_3_keeps_channels_3_then_0():
    sub = extract(tiny(), {4: torch.tensor(rolling_channels(4, 2, 3))})
    s = sub.model.state_dict()
    assert s["body.0.bias"].tolist() == [13.0, 10.0]
    assert s["body.1.bias"].tolist() == [33.0, 30.0]
    # channels 3, 0 -> features 6, 7, 0, 1
    assert s["body.4.weight"].tolist() == [[6, 7, 0, 1], [14, 15, 8, 9], [22, 23, 16, 17]]
    assert [i.tolist() for i in sub.index["body.4.weight"]] == [[0, 1, 2], [6, 7, 0, 1]]


def test_random_extraction_keeps_one_subset_for_every_layer_of_a_count():
    model = AtomModel([("a", nn.Sequential(nn.Conv2d(1, 4, 1), nn.ReLU())),
                       ("b", nn.Sequential(nn.Conv2d(4, 4, 1), nn.Flatten(), nn.Linear(4, 2)))], (1, 1, 1))
    chosen = random_channels(4, 2, 7, 1, 0)
    sub = extract(model, {4: torch.tensor(chosen)})
    out_a = sub.index["a.0.weight"][0]
    out_b, in_b = sub.index["b.0.weight"]
    assert out_a.tolist() == in_b.tolist() == out_b.tolist() == chosen
    assert sub.index["b.2.weight"][1].tolist() == chosen  # 1 x 1 map: feature = channel
    with torch.no_grad():
        expected = model.a[0].weight[chosen]
    assert torch.equal(sub.model.state_dict()["a.0.weight"], expected)


SHAPES = {"vgg11": (3, 32, 32), "vgg13": (3, 32, 32), "vgg16": (3, 32, 32), "cnn4": (1, 16, 16)}


@pytest.mark.parametrize("name", ["digits_cnn", "cnn3", "cnn4", "vgg11", "vgg13", "vgg16", "resnet10",
                                  "resnet18", "resnet34", "nin", "smallcnn"])
def test_sub_model_computes_what_the_whole_model_does_with_the_rest_zeroed(name):
    # Zero every element the sub-model does not hold: a dropped channel's conv/linear row and BN
    # scale and shift are 0, so it outputs 0 after ReLU (and 0 + 0 through a residual addition) and
    # the kept channels never see it; the whole model then computes what the sub-model computes.
    torch.manual_seed(0)
    shape = SHAPES.get(name, (1, 8, 8))
    model = build_model(name, 10, shape, [0.5] * shape[0], [0.25] * shape[0]).eval()
    kept = {c: torch.tensor(rolling_channels(c, kept_count(0.4, c), 3 * c // 4))
            for c in hidden_counts(model)}  # windows that wrap around
    sub = extract(model, kept)
    with torch.no_grad():
        for key, value in model.state_dict().items():
            if key in sub.index:
                held = torch.zeros_like(value, dtype=torch.bool)
                held[grid(sub.index[key], value.shape, value.device)] = True
                value[~held] = 0
        x = torch.rand(2, *shape)
        assert torch.allclose(sub.model(x), model(x), atol=1e-5)
    params = sum(p.numel() for p in sub.model.parameters())
    assert params < 0.5 * sum(p.numel() for p in model.parameters())


def test_digits_cnn_at_half_width_has_7234_parameters():
    model = build_model("digits_cnn", 10, (1, 8, 8), [0.5], [0.25])
    sub = extract(model, {c: torch.arange(kept_count(0.5, c)) for c in hidden_counts(model)})
    assert sum(p.numel() for p in sub.model.parameters()) == 7234  # see the module docstring
    assert state_bytes(sub.model.state_dict()) == 29416


def test_unsupported_layer_names_the_model():
    model = AtomModel([("a", nn.Sequential(nn.Conv2d(1, 4, 1), nn.LayerNorm([4, 2, 2]), nn.Flatten(),
                                           nn.Linear(16, 2)))], (1, 2, 2))
    with pytest.raises(EdgeflError, match=r"s\.toml: model\.name: heterofl_at cannot narrow weird's layer "
                                          r"a\.1 \(LayerNorm\)"):
        check_narrowable(model, "s.toml", "weird", "heterofl_at")
    grouped = AtomModel([("a", nn.Sequential(nn.Conv2d(1, 4, 1), nn.Conv2d(4, 4, 1, groups=2),
                                             nn.Flatten(), nn.Linear(4, 2)))], (1, 1, 1))
    with pytest.raises(EdgeflError, match="Conv2d"):
        check_narrowable(grouped, "s.toml", "grouped", "fedrolex_at")


# ============================================================================== the partial average

def test_width_average_over_the_clients_that_held_each_element():
    g = {"w": torch.tensor([1.0, 2.0, 3.0, 4.0]), "m": torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]),
         "n": torch.tensor(10), "z": torch.tensor([5.0])}
    a = {"w": torch.tensor([10.0, 20.0]), "m": torch.tensor([[7.0, 9.0]]), "n": torch.tensor(12)}
    a_index = {"w": (torch.tensor([0, 1]),), "m": (torch.tensor([0]), torch.tensor([0, 2]))}
    b = {"w": torch.tensor([30.0, 60.0]), "m": torch.tensor([[1.0], [2.0]]), "n": torch.tensor(13)}
    b_index = {"w": (torch.tensor([1, 2]),), "m": (torch.tensor([0, 1]), torch.tensor([2]))}
    out = width_average(g, [a, b], [a_index, b_index], [1.0, 3.0])
    # w: [A only 10, (1 x 20 + 3 x 30) / 4 = 27.5, B only 60, nobody: 4]
    assert out["w"].tolist() == [10.0, 27.5, 60.0, 4.0]
    # m: (0,0) A 7; (0,1) nobody 2; (0,2) (1 x 9 + 3 x 1) / 4 = 3; (1,0), (1,1) nobody 4, 5; (1,2) B 2
    assert out["m"].tolist() == [[7.0, 2.0, 3.0], [4.0, 5.0, 2.0]]
    # n (a counter both hold): (1 x 12 + 3 x 13) / 4 = 12.75 -> 13, still an integer
    assert out["n"].item() == 13 and out["n"].dtype == torch.int64
    assert out["z"].tolist() == [5.0]  # no client sent it


# ============================================================================== the method

def test_plan_charges_the_sub_model_and_train_updates_only_what_it_held():
    exp = experiment("heterofl_at")
    state = exp.pool.state(0, 0)
    atoms = exp.ctx.profile.atoms
    whole = mem_req(atoms, 32, 1)  # batch 32, SGD with momentum, adversarial
    plan = exp.method.plan(0, 0, dataclasses.replace(state, memory_bytes=0.5 * whole))  # r = 0.5
    half = plan.workload
    assert plan.fraction == 0.5
    assert sum(a.params for a in half.atoms) == 7234
    assert half.download_bytes == half.upload_bytes == 29416  # see the module docstring
    assert exp.ctx.cost.memory_need(half) < 0.5 * whole
    full = exp.method.plan(0, 0, dataclasses.replace(state, memory_bytes=10 * whole)).workload  # r = 1
    assert full.atoms == atoms and full.download_bytes == full.upload_bytes == 104840
    assert "fractions" not in exp.method.state()  # r travels in the plan (to Ray workers too)
    before = {k: v.clone() for k, v in exp.method.model.state_dict().items()}
    update = exp.method.train(0, 0, plan)
    assert update.state["conv1.0.weight"].shape == (8, 1, 3, 3)
    assert update.state["conv3.5.weight"].shape == (10, 128)  # 32 channels x 2 x 2 positions
    exp.method.aggregate(0, [update])
    after = exp.method.model.state_dict()
    assert torch.equal(after["conv1.0.weight"][:8], update.state["conv1.0.weight"])
    assert torch.equal(after["conv1.0.weight"][8:], before["conv1.0.weight"][8:])  # nobody held them
    assert not torch.equal(after["conv1.0.weight"][:8], before["conv1.0.weight"][:8])  # trained


def test_paper_accounting_sizes_the_width_with_the_release_mem_req():
    exp = experiment("fedrolex_at", "cost.accounting=\"paper\"")
    whole = paper_mem_req(exp.ctx.profile.atoms, 32, 1)
    state = dataclasses.replace(exp.pool.state(0, 0), memory_bytes=0.5 * whole)
    w = exp.method.plan(0, 0, state).workload
    assert sum(a.params for a in w.atoms) == 7234  # r = 0.5


def test_feddrop_clients_hold_different_channels():
    exp = experiment("feddrop_at")
    assert isinstance(exp.method, FedDropAT)
    kept = {}
    for client in range(4):
        kept[client] = tuple(exp.method.kept(0, client, 0.5)[64].tolist())
        assert list(kept[client]) == random_channels(64, 32, 0, 0, client)  # scenario seed 0, round 0
    assert len(set(kept.values())) > 1


@pytest.mark.slow
@pytest.mark.parametrize("method", WIDTH_METHODS)
def test_short_run_through_cli_charges_narrow_clients_less(method, tmp_path):
    out = tmp_path / "run"
    code = main(["run", str(QUICKSTART), "--out", str(out), "--quiet", "--set", f"method={method}",
                 "--set", "rounds=1", "--set", "training.local_iters=1", "--set", "attack.steps=1",
                 "--set", "evaluation.steps=1", "--set", "data.test_samples=32", "--set", "device=\"cpu\""])
    assert code == 0
    whole = mem_req(profile_model(build_model("digits_cnn", 10, (1, 8, 8), [0.5], [0.25])).atoms, 32, 1)
    with open(out / "clients.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    narrow = [r for r in rows if float(r["mem_avail_bytes"]) < whole]
    wide = [r for r in rows if float(r["mem_avail_bytes"]) >= whole]
    assert narrow and wide  # quickstart round 0 selects microcontrollers (1.3 MB) and larger devices
    assert all(float(r["mem_req_bytes"]) < whole for r in narrow)
    assert all(float(r["mem_req_bytes"]) == pytest.approx(whole) for r in wide)
    with open(out / "metrics.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert 0 <= float(row["clean_acc"]) <= 1


def test_bundled_scenario_loads_heterofl():
    scenario = load_scenario(ROOT / "scenarios" / "heterofl-digits.toml")
    assert scenario.method == "heterofl_at" and scenario.knobs(WidthConfig).levels[-1] == 1.0


def test_the_budget_check_plans_at_r_min(tmp_path):
    """At R_min = 0.2 MB the whole digits_cnn cannot run even paged layer by layer (0.230 MB for
    one sample's step on conv3's convolution), but a width method plans a narrower model there, so
    the scenario is valid."""
    assert main(["run", str(ROOT / "scenarios" / "heterofl-digits.toml"), "--set", "rounds=1",
                 "--set", "fleet.reserved_memory_mb=0.2", "--out", str(tmp_path / "r"), "--quiet",
                 "--dry-run"]) == 0
