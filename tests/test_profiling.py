"""Per-atom profiles and the memory estimators, checked against hand counts on tiny models."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn

from edgefl.models import AtomModel, build_model
from edgefl.profiling import profile_model
from edgefl.sim.records import AtomProfile, mem_req, optimizer_slots, paper_mem_req

CIFAR_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR_STD = (0.2470, 0.2435, 0.2616)


def linear_model() -> AtomModel:
    torch.manual_seed(0)
    return AtomModel([("fc", nn.Linear(4, 3))], (4,))


def conv_model() -> AtomModel:
    """conv: Conv2d(1, 2, 3, padding=1) + ReLU on 1x4x4; flat: no weights; fc: Linear(32, 3)."""
    torch.manual_seed(0)
    return AtomModel([
        ("conv", nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU())),
        ("flat", nn.Flatten()),
        ("fc", nn.Linear(32, 3)),
    ], (1, 4, 4))


def test_linear_atom_profile():
    (atom,) = profile_model(linear_model(), "lin").atoms
    assert atom.name == "fc"
    assert atom.macs == 4 * 3  # one MAC per weight per sample
    assert atom.flops == 2 * 4 * 3
    assert atom.params == 4 * 3 + 3  # weight + bias
    assert atom.param_bytes == 4 * (4 * 3 + 3)
    assert (atom.in_elems, atom.out_elems) == (4, 3)
    assert atom.weighted_in_elems == 4  # the Linear's input
    assert atom.saved_bytes == 4 * 4  # Linear saves its input: 4 floats x 4 B per sample


def test_conv_model_profile():
    profile = profile_model(conv_model(), "conv")
    conv, flat, fc = profile.atoms
    assert [a.name for a in profile.atoms] == ["conv", "flat", "fc"]
    # conv 1 -> 2 channels, 3x3 kernel, 4x4 output positions (padding 1): 2 x 16 x 9
    assert conv.macs == 2 * 16 * 9 == 288
    assert conv.params == 2 * 1 * 3 * 3 + 2
    assert (conv.in_elems, conv.out_elems) == (1 * 4 * 4, 2 * 4 * 4)
    assert conv.weighted_in_elems == 16
    # the conv saves its input (16 floats) and the ReLU its output (32 floats)
    assert conv.saved_bytes == 4 * (16 + 32)
    assert (flat.macs, flat.params, flat.weighted_in_elems) == (0, 0, 0)
    assert (flat.in_elems, flat.out_elems) == (32, 32)
    assert fc.macs == 32 * 3
    assert fc.params == 32 * 3 + 3
    assert fc.weighted_in_elems == 32
    assert profile.params == 20 + 0 + 99
    assert profile.atoms[0].in_elems == 16  # one 1x4x4 sample


def test_weighted_inputs_sum_conv_and_bn_inputs():
    model = AtomModel([("block", nn.Sequential(
        nn.Conv2d(1, 2, 3, padding=1, bias=False), nn.BatchNorm2d(2), nn.ReLU()))], (1, 4, 4))
    (atom,) = profile_model(model).atoms
    assert atom.weighted_in_elems == 16 + 32  # conv input 1x4x4 + BN input 2x4x4
    assert atom.params == 18 + 2 + 2  # conv weight, BN weight and bias


def test_profile_does_not_depend_on_profiling_batch():
    a = profile_model(conv_model(), batch=2).atoms
    b = profile_model(conv_model(), batch=5).atoms
    assert a == b


@pytest.mark.parametrize(("optimizer", "momentum", "slots"), [
    ("sgd", 0.0, 0), ("sgd", 0.9, 1), ("adam", 0.0, 2), ("adam", 0.9, 2)])
def test_optimizer_slots(optimizer, momentum, slots):
    assert optimizer_slots(optimizer, momentum) == slots


def test_mem_req_linear_by_hand():
    atoms = profile_model(linear_model()).atoms
    batch, slots = 8, 1
    state = (2 + slots) * 4 * 15  # params, grads, momentum: 3 x 60 B
    saved = batch * 16
    adv_workspace = 4 * batch * (2 * 4 + (4 + 3))  # clean + adversarial batch, largest in+out
    clean_workspace = 4 * batch * (4 + (4 + 3))
    assert mem_req(atoms, batch, slots) == state + saved + adv_workspace == 788
    assert mem_req(atoms, batch, slots, adversarial=False) == state + saved + clean_workspace


def test_mem_req_three_atoms_by_hand():
    atoms = profile_model(conv_model()).atoms
    batch, slots = 4, 0
    state = 2 * 4 * (20 + 99)
    # conv saves its input (16) and ReLU its output (32); Flatten is a view of that ReLU output,
    # so the Linear's saved input shares its storage and is counted once, in the conv atom
    saved = batch * (4 * (16 + 32) + 0 + 0)
    # largest in+out: conv 16 + 32 = 48, flat 32 + 32 = 64, fc 32 + 3 = 35
    workspace = 4 * batch * (2 * 16 + 64)
    assert mem_req(atoms, batch, slots) == state + saved + workspace


def test_paper_mem_req_by_hand():
    lin = profile_model(linear_model()).atoms
    assert paper_mem_req(lin, 8, 1) == 4 * ((2 + 1) * 15 + 8 * 4) == 308
    atoms = profile_model(conv_model()).atoms
    params, features = 20 + 99, 16 + 32
    assert paper_mem_req(atoms, 64, 0) == 4 * (2 * params + 64 * features)
    assert paper_mem_req(atoms, 64, 1) == 4 * (3 * params + 64 * features)


def test_paper_mem_req_adam_uses_release_s5():
    """REFERENCE.md and memory.py's docstring: s = 5 for Adam in the release's MemReq."""
    atom = AtomProfile("a", macs=0.0, params=100, in_elems=1, out_elems=1, saved_bytes=0.0,
                       weighted_in_elems=10)
    slots = optimizer_slots("adam", 0.9)
    assert paper_mem_req([atom], 2, slots) == 4 * (5 * 100 + 2 * 10)


def test_vgg16_cifar10_matches_release_figures():
    model = build_model("vgg16", 10, (3, 32, 32), CIFAR_MEAN, CIFAR_STD)
    profile = profile_model(model, "vgg16")
    # the release's figures, given to four digits
    assert profile.params == pytest.approx(15.25e6, rel=1e-3)
    assert paper_mem_req(profile.atoms, 64, slots=1) == pytest.approx(301.7e6, rel=1e-3)
    # norm atom + 13 conv atoms, the last holding the classifier
    assert len(profile.atoms) == 14
    assert profile.atoms[0].params == 0


def test_conv_model_layers_by_hand():
    conv, flat, fc = profile_model(conv_model(), "conv").atoms
    assert [(lay.name, lay.kind) for lay in conv.layers] == [("conv.0", "conv3x3"), ("conv.1", "activation")]
    c, relu = conv.layers
    assert (c.macs, c.params, c.in_elems, c.out_elems) == (288, 20, 16, 32)
    assert (c.saved_bytes, relu.saved_bytes) == (4 * 16, 4 * 32)  # conv input, ReLU output
    assert [(lay.kind, lay.macs, lay.params) for lay in flat.layers] == [("reshape", 0, 0)]
    assert [(lay.kind, lay.macs, lay.params) for lay in fc.layers] == [("linear", 96, 99)]


@pytest.mark.parametrize(("name", "shape"), [("digits_cnn", (1, 8, 8)), ("resnet10", (3, 32, 32))])
def test_layers_sum_to_their_atom(name, shape):
    profile = profile_model(build_model(name, 10, shape, (0.5,) * shape[0], (0.5,) * shape[0]), name)
    for atom in profile.atoms:
        assert atom.layers
        assert sum(lay.macs for lay in atom.layers) == pytest.approx(atom.macs)
        assert sum(lay.params for lay in atom.layers) == atom.params
        assert sum(lay.saved_bytes for lay in atom.layers) == pytest.approx(atom.saved_bytes)


def test_residual_block_layers():
    """A basic block: its ReLU module runs twice (two layers, parameters once) and the residual
    `out + identity` is an elementwise layer of its own."""
    profile = profile_model(build_model("resnet10", 10, (3, 32, 32), (0.5,) * 3, (0.5,) * 3), "r")
    block = next(a for a in profile.atoms if a.name == "layer1_1")
    names = [lay.name for lay in block.layers]
    assert names == ["layer1_1.conv1", "layer1_1.bn1", "layer1_1.relu", "layer1_1.conv2",
                     "layer1_1.bn2", "layer1_1.add", "layer1_1.relu#2"]
    add = block.layers[5]
    assert (add.kind, add.in_elems, add.out_elems) == ("elementwise", 64 * 32 * 32, 64 * 32 * 32)
    assert block.layers[0].macs == 64 * 64 * 9 * 32 * 32  # 3x3 conv 64 -> 64 on 32x32


@pytest.mark.slow
def test_profiling_imports_fvcore_without_torch_jit_warnings() -> None:
    """fvcore scripts helpers with torch.jit at import, which torch warns of as deprecated; edgefl
    silences that one warning where it imports fvcore, so benches and Ray workers start quietly too."""
    command = [sys.executable, "-W", "error::FutureWarning", "-c", "import edgefl.profiling.atoms"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
    assert (done.returncode, done.stderr) == (0, "")


@pytest.mark.parametrize(("conv", "kind"), [
    (nn.Conv2d(8, 8, 3, padding=1), "conv3x3"),
    (nn.Conv2d(8, 8, 3, stride=2, padding=1), "conv"),
    (nn.Conv2d(8, 16, 1), "conv"),
    (nn.Conv2d(8, 8, 3, padding=1, groups=8), "dwconv"),
    (nn.Conv2d(8, 16, 3, padding=1, groups=4), "dwconv"),
    (nn.ReLU6(), "activation"),
    (nn.Hardswish(), "activation"),
])
def test_a_layer_is_profiled_as_the_kernels_that_run_it(conv, kind):
    """Depthwise and grouped convolutions, and 3x3 stride-1 ones, are kinds of their own (issue 36);
    MobileNet's activations out of place are activations."""
    (layer,) = profile_model(AtomModel([("layer", conv)], (8, 8, 8)), "one").atoms[0].layers
    assert layer.kind == kind


def test_an_in_place_relu6_is_a_clamp_of_its_own():
    """In place, PyTorch clamps into a new tensor and copies it back: two passes where an in-place
    ReLU makes one, so its kernels are a kind of their own."""
    model = nn.Sequential(nn.Conv2d(8, 8, 1), nn.ReLU6(inplace=True), nn.Hardtanh(inplace=True),
                          nn.ReLU(inplace=True))
    layers = profile_model(AtomModel([("layer", model)], (8, 8, 8)), "one").atoms[0].layers
    assert [layer.kind for layer in layers] == ["conv", "clamp", "clamp", "activation"]
