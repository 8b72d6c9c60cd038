"""SmallCNN (TRADES) and NIN (Lin et al.): shapes, atoms, hand parameter counts and profiling."""

from __future__ import annotations

import pytest
import torch

from edgefl.models import MODELS, AtomModel, build_model
from edgefl.profiling import profile_model

SHAPES = [(1, 28, 28), (1, 8, 8), (3, 32, 32)]
ATOMS = {
    "smallcnn": ["norm", "conv1", "conv2", "conv3", "conv4"],
    "nin": ["norm", "mlpconv1", "mlpconv2", "mlpconv3"],
}


def build(name: str, shape: tuple[int, int, int], classes: int = 10) -> AtomModel:
    torch.manual_seed(0)
    c = shape[0]
    return build_model(name, classes, shape, [0.5] * c, [0.25] * c)


def n_params(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def test_both_are_registered():
    assert {"smallcnn", "nin"} <= set(MODELS.names())


@pytest.mark.parametrize("name", sorted(ATOMS))
@pytest.mark.parametrize("shape", SHAPES)
def test_output_shape_and_atoms(name: str, shape: tuple[int, int, int]):
    model = build(name, shape, classes=7)
    assert model.atom_names == ATOMS[name]
    assert model.input_shape == shape
    model.eval()
    with torch.no_grad():
        out = model(torch.rand(2, *shape))
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()


def test_smallcnn_has_one_conv_per_atom_and_the_head_in_the_last():
    model = build("smallcnn", (1, 28, 28))
    for atom in list(model.children())[1:]:
        assert sum(isinstance(m, torch.nn.Conv2d) for m in atom.modules()) == 1
    assert sum(isinstance(m, torch.nn.Linear) for m in model.conv4.modules()) == 3


def test_smallcnn_parameter_count_by_hand():
    # 3x3 convs with bias: 9 x c_in x c_out + c_out. Unpadded on 28x28:
    # 28 -> 26 -> 24 -> pool 12 -> 10 -> 8 -> pool 4, so fc1 sees 64 x 4 x 4 = 1024 inputs.
    conv1 = 9 * 1 * 32 + 32  # 320
    conv2 = 9 * 32 * 32 + 32  # 9_248
    conv3 = 9 * 32 * 64 + 64  # 18_496
    conv4 = 9 * 64 * 64 + 64  # 36_928
    fc1 = 64 * 4 * 4 * 200 + 200  # 205_000
    fc2 = 200 * 200 + 200  # 40_200
    fc3 = 200 * 10 + 10  # 2_010
    total = conv1 + conv2 + conv3 + conv4 + fc1 + fc2 + fc3
    assert total == 312_202
    model = build("smallcnn", (1, 28, 28))
    assert n_params(model) == total
    assert [n_params(a) for a in model.children()] == [0, conv1, conv2, conv3, conv4 + fc1 + fc2 + fc3]


def first_fc_inputs(model: AtomModel) -> int:
    return next(m for m in model.modules() if isinstance(m, torch.nn.Linear)).in_features


def test_smallcnn_pads_small_inputs():
    # 8x8 digits: padded convs keep the side, the pools give 8 -> 4 -> 2: fc1 sees 64 x 2 x 2 = 256.
    assert first_fc_inputs(build("smallcnn", (1, 8, 8))) == 64 * 2 * 2
    # 3x32x32 keeps the unpadded convs: 32 -> 30 -> 28 -> 14 -> 12 -> 10 -> 5.
    assert first_fc_inputs(build("smallcnn", (3, 32, 32))) == 64 * 5 * 5
    with pytest.raises(ValueError, match="side >= 4"):
        build("smallcnn", (1, 3, 3))


def test_nin_parameter_count_by_hand():
    # Convs with bias: k x k x c_in x c_out + c_out; pools, dropout and the global pool have none.
    block1 = (25 * 3 * 192 + 192) + (192 * 160 + 160) + (160 * 96 + 96)  # 14_592 + 30_880 + 15_456
    block2 = (25 * 96 * 192 + 192) + 2 * (192 * 192 + 192)  # 460_992 + 2 x 37_056
    block3 = (9 * 192 * 192 + 192) + (192 * 192 + 192) + (192 * 10 + 10)  # 331_968 + 37_056 + 1_930
    assert (block1, block2, block3) == (60_928, 535_104, 370_954)
    total = block1 + block2 + block3
    assert total == 966_986
    model = build("nin", (3, 32, 32))
    assert n_params(model) == total
    assert [n_params(a) for a in model.children()] == [0, block1, block2, block3]


@pytest.mark.parametrize(("name", "shape"), [("smallcnn", (1, 28, 28)), ("smallcnn", (1, 8, 8)),
                                             ("nin", (3, 32, 32)), ("nin", (1, 8, 8))])
def test_profile_model_sees_every_atom(name: str, shape: tuple[int, int, int]):
    model = build(name, shape)
    profile = profile_model(model, name)
    assert [a.name for a in profile.atoms] == ATOMS[name]
    assert len(profile.atoms) == len(model.atom_names)
    assert sum(a.params for a in profile.atoms) == n_params(model)
    assert profile.atoms[-1].out_shape == (10,)
    assert all(a.macs > 0 for a in profile.atoms[1:])
