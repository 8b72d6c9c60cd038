"""ResNet10/18/34 and CNN4: atoms, shapes, hand parameter counts and the release's MemReq for ResNet34."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from edgefl.models import MODELS, AtomModel, build_model
from edgefl.models.base import Normalize
from edgefl.profiling import profile_model
from edgefl.sim.records import ModelProfile, paper_mem_req

CALTECH = (3, 224, 224)
CIFAR = (3, 32, 32)
MEAN, STD = [0.5, 0.4, 0.3], [0.25, 0.2, 0.15]


def build(name: str, classes: int, shape: tuple[int, int, int] = CIFAR) -> AtomModel:
    torch.manual_seed(0)
    c = shape[0]
    return build_model(name, classes, shape, MEAN[:c], STD[:c])


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def resnet34_caltech() -> ModelProfile:
    return profile_model(build("resnet34", 256, CALTECH), "resnet34")


def test_registry_holds_the_caltech_family():
    assert {"resnet10", "resnet18", "resnet34", "cnn4"} <= set(MODELS.names())


@pytest.mark.parametrize(("name", "blocks"), [("resnet10", [1, 1, 1, 1]), ("resnet18", [2, 2, 2, 2]),
                                              ("resnet34", [3, 4, 6, 3])])
def test_atoms_are_norm_stem_and_one_per_basic_block(name: str, blocks: list[int]):
    model = build(name, 10)
    expected = ["norm", "stem"] + [f"layer{s + 1}_{b + 1}" for s, n in enumerate(blocks) for b in range(n)]
    assert model.atom_names == expected
    assert len(expected) == {"resnet10": 6, "resnet18": 10, "resnet34": 18}[name]
    atoms = list(model.children())
    assert isinstance(atoms[0], Normalize)
    # each block: two 3x3 convs, plus a 1x1 shortcut conv where a stage starts (stages 2-4)
    starts = {f"layer{s}_1" for s in (2, 3, 4)}
    for atom_name, atom in zip(model.atom_names[2:], atoms[2:], strict=True):
        convs = sum(isinstance(m, nn.Conv2d) for m in atom.modules())
        assert convs == (3 if atom_name in starts else 2)
    # only the last block holds pooling, flatten and the fc layer
    holds_fc = [any(isinstance(m, nn.Linear) for m in a.modules()) for a in atoms]
    assert holds_fc == [False] * (len(atoms) - 1) + [True]
    assert any(isinstance(m, nn.AdaptiveAvgPool2d) for m in atoms[-1].modules())


def test_stem_follows_the_input_side():
    big = build("resnet18", 10, CALTECH).stem
    small = build("resnet18", 10, CIFAR).stem
    assert isinstance(big[0], nn.Conv2d) and big[0].kernel_size == (7, 7) and big[0].stride == (2, 2)
    assert isinstance(big[-1], nn.MaxPool2d)
    assert isinstance(small[0], nn.Conv2d) and small[0].kernel_size == (3, 3) and small[0].stride == (1, 1)
    assert not any(isinstance(m, nn.MaxPool2d) for m in small.modules())
    assert all(m.bias is None for m in big.modules() if isinstance(m, nn.Conv2d))


@pytest.mark.parametrize("name", ["resnet10", "resnet18", "resnet34", "cnn4"])
@pytest.mark.parametrize("shape", [CIFAR, CALTECH])
def test_output_shapes_with_batch_2(name: str, shape: tuple[int, int, int]):
    model = build(name, 256 if shape == CALTECH else 10, shape).eval()
    with torch.no_grad():
        out = model(torch.rand(2, *shape))
    assert out.shape == (2, 256 if shape == CALTECH else 10)
    assert torch.isfinite(out).all()


def test_resnet_runs_on_8x8_digits_with_the_cifar_stem():
    model = build("resnet10", 10, (1, 8, 8)).eval()
    with torch.no_grad():
        assert model(torch.rand(2, 1, 8, 8)).shape == (2, 10)


def test_resnet18_cifar_parameter_count_by_hand():
    # 3x3 convs without bias (9 x cin x cout), 1x1 shortcut convs (cin x cout), BN weight + bias per channel.
    stem = 9 * 3 * 64
    layer1 = 4 * 9 * 64 * 64
    layer2 = 9 * 64 * 128 + 3 * 9 * 128 * 128 + 64 * 128
    layer3 = 9 * 128 * 256 + 3 * 9 * 256 * 256 + 128 * 256
    layer4 = 9 * 256 * 512 + 3 * 9 * 512 * 512 + 256 * 512
    bn = 2 * (64 + 4 * 64 + 5 * 128 + 5 * 256 + 5 * 512)
    fc = 512 * 10 + 10
    assert stem + layer1 + layer2 + layer3 + layer4 == 11_159_232
    assert bn == 9_600
    assert n_params(build("resnet18", 10)) == 11_173_962 == stem + layer1 + layer2 + layer3 + layer4 + bn + fc


def test_resnet34_caltech_parameter_count(resnet34_caltech: ModelProfile):
    # torchvision's resnet34 (1000 classes) has 21,797,672; swap its fc 512x1000+1000 for 512x256+256.
    expected = 21_797_672 - (512 * 1000 + 1000) + (512 * 256 + 256)
    assert expected == 21_416_000
    assert resnet34_caltech.params == expected == n_params(build("resnet34", 256, CALTECH))
    assert resnet34_caltech.params == pytest.approx(21.42e6, rel=0.005)
    assert len(resnet34_caltech.atoms) == 18


# Inputs of every conv/BN/linear layer of ResNet34 at 224x224, per sample, by hand (map = channels x side^2):
# stem: conv 3x224^2 + BN 64x112^2; then per block conv1, BN1, conv2, BN2 inputs, plus the shortcut
# conv and BN inputs where a stage starts; fc 512.
STEM_F = 3 * 224**2 + 64 * 112**2
LAYER1_F = 3 * 4 * 64 * 56**2
LAYER2_F = (64 * 56**2 + 3 * 128 * 28**2) + (64 * 56**2 + 128 * 28**2) + 3 * 4 * 128 * 28**2
LAYER3_F = (128 * 28**2 + 3 * 256 * 14**2) + (128 * 28**2 + 256 * 14**2) + 5 * 4 * 256 * 14**2
LAYER4_F = (256 * 14**2 + 3 * 512 * 7**2) + (256 * 14**2 + 512 * 7**2) + 2 * 4 * 512 * 7**2
ALL_INPUTS_F = STEM_F + LAYER1_F + LAYER2_F + LAYER3_F + LAYER4_F + 512
# a stage's first block feeds one tensor to both conv1 and the shortcut conv
SHARED_F = 64 * 56**2 + 128 * 28**2 + 256 * 14**2


def test_resnet34_weighted_inputs_by_hand(resnet34_caltech: ModelProfile):
    assert ALL_INPUTS_F == 7_175_680
    assert SHARED_F == 351_232
    # every distinct layer input once: the shared block input is one tensor, counted once
    assert sum(a.weighted_in_elems for a in resnet34_caltech.atoms) == ALL_INPUTS_F - SHARED_F


def test_resnet34_caltech_paper_mem_req_counts_the_shared_block_input_once(resnet34_caltech: ModelProfile):
    # 4 B x (3 x P + 32 x F) with SGD+momentum: counting the input shared by conv1 and the shortcut conv
    # once reproduces the release's 1130.5 MB; counting it twice would give 1175.5 MB (+4.0 %).
    once = 4 * (3 * 21_416_000 + 32 * (ALL_INPUTS_F - SHARED_F))
    assert once == 1_130_521_344 == pytest.approx(1130.5e6, rel=1e-4)
    twice = 4 * (3 * 21_416_000 + 32 * ALL_INPUTS_F)
    assert twice == pytest.approx(1175.48e6, rel=1e-4)
    assert paper_mem_req(resnet34_caltech.atoms, 32, slots=1) == once


def test_cnn4_atoms_and_parameter_count_by_hand():
    # four 3x3 convs without bias + BN, head 256 x 2 x 2 -> classes whatever the input size
    convs = 9 * (3 * 32 + 32 * 64 + 64 * 128 + 128 * 256)
    bn = 2 * (32 + 64 + 128 + 256)
    assert convs + bn == 388_896
    for shape, classes in [(CIFAR, 10), (CALTECH, 256)]:
        model = build("cnn4", classes, shape)
        assert model.atom_names == ["norm", "conv1", "conv2", "conv3", "conv4"]
        assert n_params(model) == convs + bn + 256 * 4 * classes + classes


def test_cnn4_rejects_inputs_too_small_to_pool_four_times():
    with pytest.raises(ValueError, match="side >= 16"):
        build("cnn4", 10, (1, 8, 8))
