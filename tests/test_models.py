"""The model zoo: one smoke test per registered model, VGG atom counts and a hand parameter count."""

from __future__ import annotations

import pytest
import torch

from edgefl.models import MODELS, AtomModel, build_model
from edgefl.models.base import Normalize


def input_shape(name: str) -> tuple[int, int, int]:
    return (1, 8, 8) if name == "digits_cnn" else (3, 32, 32)


def stats(c: int) -> tuple[list[float], list[float]]:
    """Per-channel mean 0.1, 0.2, ... and std 0.2, 0.4, ..."""
    return [0.1 * (i + 1) for i in range(c)], [0.2 * (i + 1) for i in range(c)]


def build(name: str, classes: int = 10) -> AtomModel:
    c = input_shape(name)[0]
    torch.manual_seed(0)
    return build_model(name, classes, input_shape(name), *stats(c))


def test_registry_holds_the_zoo():
    assert {"digits_cnn", "cnn3", "vgg11", "vgg13", "vgg16"} <= set(MODELS.names())


@pytest.mark.parametrize("name", MODELS.names())
def test_every_model_builds_and_runs(name: str):
    model = build(name, classes=7)
    assert isinstance(model, AtomModel)
    assert model.input_shape == input_shape(name)
    assert model.atom_names == [n for n, _ in model.named_children()]
    assert len(model.atom_names) >= 2
    assert len(set(model.atom_names)) == len(model.atom_names)
    first = model.atom_names[0]
    assert isinstance(getattr(model, first), Normalize)
    assert all(not isinstance(m, Normalize) for m in list(model.children())[1:])
    model.eval()
    x = torch.rand(3, *input_shape(name))
    with torch.no_grad():
        out = model(x)
    assert out.shape == (3, 7)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", MODELS.names())
def test_the_normalize_atom_uses_mean_and_std(name: str):
    model = build(name)
    norm = next(iter(model.children()))
    x = torch.rand(2, *input_shape(name))
    mean, std = stats(x.shape[1])
    expected = torch.stack([(x[:, i] - m) / s for i, (m, s) in enumerate(zip(mean, std, strict=True))], 1)
    torch.testing.assert_close(norm(x), expected)


@pytest.mark.parametrize(("name", "convs"), [("vgg11", 8), ("vgg13", 10), ("vgg16", 13)])
def test_vgg_has_one_atom_per_conv_after_the_norm(name: str, convs: int):
    model = build(name)
    assert len(model.atom_names) == 1 + convs
    for atom in list(model.children())[1:]:
        assert sum(isinstance(m, torch.nn.Conv2d) for m in atom.modules()) == 1


def test_vgg16_parameter_count_by_hand():
    # conv 3x3 without bias: 9 x c_in x c_out; BN: weight and bias per channel (running stats are
    # buffers); classifier 512 -> 512 -> 512 -> 10 with biases (32x32 input after 5 pools: 1x1x512).
    channels = [(3, 64), (64, 64), (64, 128), (128, 128), (128, 256), (256, 256), (256, 256),
                (256, 512), (512, 512), (512, 512), (512, 512), (512, 512), (512, 512)]
    convs = 9 * (3 * 64 + 64 * 64 + 64 * 128 + 128 * 128 + 128 * 256 + 2 * 256 * 256 + 256 * 512
                 + 5 * 512 * 512)
    bn = 2 * (64 + 64 + 128 + 128 + 3 * 256 + 6 * 512)
    head = (512 * 512 + 512) + (512 * 512 + 512) + (512 * 10 + 10)
    assert len(channels) == 13
    assert convs == 9 * sum(a * b for a, b in channels) == 14_710_464
    assert bn == 8_448
    assert head == 530_442
    model = build("vgg16", classes=10)
    assert sum(p.numel() for p in model.parameters()) == convs + bn + head == 15_249_354


def test_unknown_model_lists_the_known_ones():
    with pytest.raises(KeyError) as info:
        build_model("resnet9000", 10, (3, 32, 32), [0.5] * 3, [0.25] * 3)
    assert "resnet9000" in str(info.value)
    assert "vgg16" in str(info.value)
    assert "digits_cnn" in str(info.value)
