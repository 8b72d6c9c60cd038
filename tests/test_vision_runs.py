"""torchvision and timm models in runs (issue 53): cut into atoms that compute the network's forward,
refused in one line where they cannot be cut, and trained by a real jFAT round."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support import QUICKSTART
from torch import nn

from edgefl.errors import EdgeflError
from edgefl.experiment import prepare, run
from edgefl.models import build_model
from edgefl.models.cut import cut
from edgefl.models.vision import network
from edgefl.scenario import load_scenario
from edgefl.training.grouped import why_one_by_one

SHAPE = (3, 32, 32)
MEAN, STD = [0.5, 0.4, 0.3], [0.2, 0.25, 0.3]
RESNET18_ATOMS = ["norm", "conv1_to_maxpool", "layer1_0", "layer1_1", "layer2_0", "layer2_1", "layer3_0",
                  "layer3_1", "layer4_0", "layer4_1", "avgpool_to_fc"]


def built(name: str) -> tuple[nn.Module, nn.Module]:
    """The model cut into atoms, and the same network (equal initial weights) uncut."""
    torch.manual_seed(0)
    atoms = build_model(name, 10, SHAPE, MEAN, STD)
    torch.manual_seed(0)
    return atoms, network(name, 10, SHAPE[0], {}, "test")


@pytest.mark.parametrize("name", ["torchvision:resnet18", "torchvision:mobilenet_v3_small"])
@pytest.mark.parametrize("training", [True, False])
def test_the_atoms_compute_the_network(name: str, training: bool) -> None:
    atoms, net = built(name)
    x = torch.rand(4, *SHAPE)
    normalised = (x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    torch.manual_seed(1)  # dropout draws alike
    got = atoms.train(training)(x)
    torch.manual_seed(1)
    assert torch.equal(got, net.train(training)(normalised))
    assert sum(p.numel() for p in atoms.parameters()) == sum(p.numel() for p in net.parameters())


def test_resnet18_is_cut_at_its_stem_blocks_and_head_and_groups() -> None:
    atoms, _ = built("torchvision:resnet18")
    assert atoms.atom_names == RESNET18_ATOMS
    assert why_one_by_one(atoms) is None


def test_mobilenet_v3_is_cut_at_its_features_and_trains_one_by_one() -> None:
    atoms, _ = built("torchvision:mobilenet_v3_small")
    assert atoms.atom_names == ["norm", *(f"features_{i}" for i in range(13)), "avgpool_to_classifier_2",
                                "classifier_3"]
    assert "Dropout" in str(why_one_by_one(atoms))


class Convs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 3, 1), nn.Conv2d(3, 3, 1)


class DenseSkip(Convs):
    """The input is used at the very end: one tensor alone never flows."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x)) + x


class DataDependent(Convs):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) if x.sum() > 0 else self.b(x)


class TrainingBranch(Convs):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.a(x) * 2 if self.training else self.a(x))


class TwoInputs(Convs):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(y)


@pytest.mark.parametrize(("net", "why"), [
    (DenseSkip(), "has no point where one tensor alone flows"),
    (TwoInputs(), "also needs y"),
    (DataDependent(), "cannot be traced by torch.fx"),
    (TrainingBranch(), "runs differently in training and evaluation"),
])
def test_a_network_that_cannot_be_cut_is_refused_in_one_line(net: nn.Module, why: str) -> None:
    with pytest.raises(EdgeflError) as e:
        cut(net, SHAPE, "timm:made_up", "s.toml")
    assert e.value.key == "model.name" and why in e.value.fix and "\n" not in str(e.value)


def test_a_zoo_model_takes_no_keywords() -> None:
    with pytest.raises(EdgeflError, match=r"model\.kwargs"):
        build_model("cnn3", 10, SHAPE, MEAN, STD, kwargs={"in_chans": 1})


def test_a_torchvision_model_trains_a_real_jfat_round(tmp_path: Path) -> None:
    s = load_scenario(QUICKSTART, [
        "model.name=torchvision:resnet18", "data.dataset=synthetic", "data.synthetic_train=64",
        "data.synthetic_test=16", "rounds=1", "fleet.clients=2", "fleet.sample_fraction=1",
        'fleet.devices=["pixel_8"]', "fleet.reserved_memory_mb=64", "training.local_iters=1",
        "training.batch_size=8", "attack.steps=1", "evaluation.steps=1", "device=cpu"])
    summary = run(prepare(s, str(QUICKSTART)), tmp_path / "run", progress=False)
    assert summary["rounds"] == 1 and 0 <= summary["clean_acc"] <= 1
