"""CW-inf and AutoAttack (SFAT's evaluation attacks) on hand-made linear models.

For a linear model z = W x + b the CW margin max_{j != y} z_j - z_y has, for 2 classes, the input
gradient w_other - w_true exactly, whatever x: its sign is the sign of the cross-entropy gradient
p_other (w_other - w_true), so CW takes PGD's steps and ends at the same corner
x + eps * sign(w_other - w_true) of the L-inf ball (clipped to [0, 1]).
"""

from __future__ import annotations

import sys
import types
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from edgefl.attacks import ATTACKS, make_attack
from edgefl.attacks.autoattack import APGDCE, AutoAttack, AutoAttackRand
from edgefl.attacks.cw import CW, cw_margin
from edgefl.attacks.pgd import PGD
from edgefl.errors import EdgeflError


def linear(weight: list[list[float]], bias: list[float] | None = None) -> nn.Sequential:
    """Flatten + Linear(d, k) with the given rows (one per class)."""
    fc = nn.Linear(len(weight[0]), len(weight))
    with torch.no_grad():
        fc.weight.copy_(torch.tensor(weight))
        fc.bias.copy_(torch.tensor(bias if bias is not None else [0.0] * len(weight)))
    return nn.Sequential(nn.Flatten(), fc)


def random_case(seed: int, n: int = 16, d: int = 12, classes: int = 2,
                ) -> tuple[nn.Sequential, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    model = linear(torch.randn(classes, d, generator=g).tolist(), torch.randn(classes, generator=g).tolist())
    x = torch.rand(n, d, generator=g)
    x[0] = 0.0  # at the borders of [0, 1], the ball must be clipped
    x[1] = 1.0
    y = torch.randint(0, classes, (n,), generator=g)
    return model, x, y


def accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(x).argmax(1) == y).float().mean())


# --- CW -------------------------------------------------------------------------------------------


def test_cw_margin_by_hand():
    logits = torch.tensor([[2.0, 1.0, -1.0],   # y = 0: max(1, -1) - 2 = -1
                           [0.5, 3.0, 3.5],    # y = 2: max(0.5, 3) - 3.5 = -0.5
                           [0.0, 4.0, 1.0]],   # y = 0, misclassified: max(4, 1) - 0 = 4
                          requires_grad=True)
    y = torch.tensor([0, 2, 0])
    loss = cw_margin(logits, y)
    assert float(loss.detach()) == pytest.approx((-1.0 - 0.5 + 4.0) / 3)
    (grad,) = torch.autograd.grad(loss, logits)
    # +1/3 on the best other class, -1/3 on the true one, 0 elsewhere
    expected = torch.tensor([[-1.0, 1.0, 0.0],
                             [0.0, 1.0, -1.0],
                             [-1.0, 1.0, 0.0]]) / 3
    torch.testing.assert_close(grad, expected)


def test_cw_is_pgd_on_the_margin_with_the_papers_defaults():
    attack = CW()
    assert isinstance(attack, PGD)
    assert (attack.eps, attack.step_size, attack.steps) == (8 / 255, 2 / 255, 20)
    assert attack.loss is cw_margin
    made = make_attack("cw", eps=0.25, step_size=0.125, steps=7)
    assert isinstance(made, CW)
    assert (made.eps, made.step_size, made.steps) == (0.25, 0.125, 7)
    assert made.loss is cw_margin


def test_registry_has_cw_and_autoattack():
    assert {"cw", "autoattack", "fgsm", "pgd"} <= set(ATTACKS.names())
    assert ATTACKS.get("cw") is CW
    assert ATTACKS.get("autoattack") is AutoAttack


@pytest.mark.parametrize("classes", [2, 5])
def test_cw_stays_in_the_eps_ball_and_the_unit_box(classes: int):
    model, x, y = random_case(1, classes=classes)
    x_before = x.clone()
    torch.manual_seed(0)
    x_adv = make_attack("cw", eps=0.1, step_size=0.03, steps=5)(model, x, y)
    assert x_adv.shape == x.shape
    assert torch.equal(x, x_before), "the attack must not modify its input"
    assert not x_adv.requires_grad
    assert float((x_adv - x).abs().max()) <= 0.1 + 1e-6
    assert float(x_adv.min()) >= 0.0
    assert float(x_adv.max()) <= 1.0
    assert accuracy(model, x_adv, y) <= accuracy(model, x, y)


def test_cw_equals_pgd_on_a_two_class_linear_model():
    # same random start (same seed), same signed steps: the same points, clipping included
    model, x, y = random_case(3)
    w = model[1].weight.detach()
    corner = (x + 0.1 * torch.where(y[:, None] == 0, w[1] - w[0], w[0] - w[1]).sign()).clamp(0, 1)
    torch.manual_seed(0)
    cw = make_attack("cw", eps=0.1, step_size=0.05, steps=10)(model, x, y)
    torch.manual_seed(0)
    pgd = make_attack("pgd", eps=0.1, step_size=0.05, steps=10)(model, x, y)
    torch.testing.assert_close(cw, corner, rtol=0, atol=1e-6)
    torch.testing.assert_close(cw, pgd, rtol=0, atol=1e-6)


# --- AutoAttack, wiring (a stand-in torchattacks: runs without the package) -----------------------


class _Sub:
    def __init__(self, **attributes: Any) -> None:
        self.__dict__.update(attributes)


class _FakeAttack:
    """Records how it was built; its call reseeds the global generator as torchattacks does."""

    made: ClassVar[list[_FakeAttack]] = []

    def __init__(self, model: nn.Module, **kwargs: Any) -> None:
        self.model, self.kwargs = model, kwargs
        _FakeAttack.made.append(self)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        torch.manual_seed(self.kwargs["seed"])
        return x + 0.0


class _FakeAutoAttack(_FakeAttack):
    def __init__(self, model: nn.Module, **kwargs: Any) -> None:
        super().__init__(model, **kwargs)
        n = kwargs["n_classes"]
        # APGD-CE, APGD-T, FAB-T and Square as torchattacks 3.5.1 builds them
        self._autoattack = _Sub(attacks=[_Sub(steps=10), _Sub(steps=10, n_target_classes=n - 1),
                                         _Sub(steps=10, n_target_classes=n - 1), _Sub(n_queries=5000)])


@pytest.fixture
def fake_torchattacks(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    module = types.ModuleType("torchattacks")
    module.AutoAttack = _FakeAutoAttack  # type: ignore[attr-defined]
    module.APGD = _FakeAttack  # type: ignore[attr-defined]
    _FakeAttack.made = []
    monkeypatch.setitem(sys.modules, "torchattacks", module)
    return module


@pytest.mark.parametrize(("classes", "targets"), [(4, 3), (10, 9), (100, 9)])
def test_autoattack_passes_classes_seed_and_the_papers_settings(fake_torchattacks, classes: int,
                                                                targets: int):
    model = linear([[0.0] * 4] * classes)
    x, y = torch.full((3, 1, 2, 2), 0.5), torch.zeros(3, dtype=torch.long)
    attack = make_attack("autoattack", eps=8 / 255, step_size=2 / 255, steps=20)
    assert attack.version == "standard" and attack.seed == 0
    attack(model, x, y)
    (made,) = _FakeAttack.made
    assert made.model is model
    assert made.kwargs == {"norm": "Linf", "eps": 8 / 255, "version": "standard", "n_classes": classes,
                           "seed": 0}
    apgd, apgd_t, fab_t, square = made._autoattack.attacks
    assert apgd.steps == apgd_t.steps == fab_t.steps == 100
    assert apgd_t.n_target_classes == fab_t.n_target_classes == targets
    assert square.n_queries == 5000


def test_autoattack_apgd_ce_subset(fake_torchattacks):
    attack = APGDCE(eps=0.1)
    model = linear([[1.0, 0.0, 0.0, 0.0], [0.0, 1.0, 0.0, 0.0]])  # 2 classes: enough for APGD-CE
    attack(model, torch.full((2, 1, 2, 2), 0.5), torch.tensor([0, 1]))
    (made,) = _FakeAttack.made
    assert not isinstance(made, _FakeAutoAttack)
    assert made.kwargs == {"norm": "Linf", "eps": 0.1, "steps": 100, "n_restarts": 1, "seed": 0, "loss": "ce"}


def test_autoattack_keeps_the_callers_random_stream(fake_torchattacks):
    model = linear([[0.0] * 4] * 10)
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    AutoAttack()(model, torch.full((2, 1, 2, 2), 0.5), torch.tensor([0, 1]))  # reseeds inside
    assert torch.equal(torch.rand(3), expected)


def test_autoattack_without_torchattacks_says_how_to_install(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setitem(sys.modules, "torchattacks", None)  # import torchattacks raises ImportError
    with pytest.raises(EdgeflError) as info:
        AutoAttack()(linear([[0.0] * 4] * 10), torch.full((2, 1, 2, 2), 0.5), torch.tensor([0, 1]))
    assert "pip install 'edgefl[autoattack]'" in str(info.value)


def test_autoattack_rejects_non_images_and_too_few_classes(fake_torchattacks):
    with pytest.raises(EdgeflError, match=r"\(N, C, H, W\)"):
        AutoAttack()(linear([[0.0] * 4] * 10), torch.full((2, 4), 0.5), torch.tensor([0, 1]))
    with pytest.raises(EdgeflError, match=r"at least 4 classes.*'apgd_ce'"):
        AutoAttack()(linear([[0.0] * 4] * 2), torch.full((2, 1, 2, 2), 0.5), torch.tensor([0, 1]))
    with pytest.raises(EdgeflError, match="at least 3 classes"):
        AutoAttackRand()(linear([[0.0] * 4] * 2), torch.full((2, 1, 2, 2), 0.5), torch.tensor([0, 1]))
    assert not _FakeAttack.made


# --- AutoAttack, the real package -----------------------------------------------------------------


def image_case(classes: int, n: int = 16) -> tuple[nn.Sequential, torch.Tensor, torch.Tensor]:
    """A random linear model on 3x3 images, labelled by its own predictions but for 3 wrong labels."""
    g = torch.Generator().manual_seed(0)
    model = linear(torch.randn(classes, 9, generator=g).tolist())
    x = torch.rand(n, 1, 3, 3, generator=g)
    with torch.no_grad():
        y = model(x).argmax(1)
    y[:3] = (y[:3] + 1) % classes
    return model, x, y


def certified_accuracy(model: nn.Sequential, x: torch.Tensor, y: torch.Tensor, eps: float) -> float:
    """Samples no L-inf perturbation of eps can flip: z_y - z_j > eps ||w_y - w_j||_1 for every j != y."""
    w = model[1].weight.detach()
    with torch.no_grad():
        z = model(x)
    gap = z.gather(1, y[:, None]) - z - eps * (w[y][:, None, :] - w[None, :, :]).abs().sum(-1)
    gap = gap.masked_fill(nn.functional.one_hot(y, z.shape[1]).bool(), float("inf"))
    return float((gap.amin(1) > 0).float().mean())


def test_autoattack_apgd_ce_on_a_two_class_linear_model_reaches_the_corner_accuracy():
    pytest.importorskip("torchattacks")
    model, x, y = image_case(classes=2)
    w = model[1].weight.detach()
    eps = 0.1
    # the worst point of the ball for a 2-class linear model
    corner = (x + eps * torch.where(y[:, None] == 0, w[1] - w[0], w[0] - w[1]).view(-1, 1, 3, 3).sign())
    corner = corner.clamp(0, 1)
    assert accuracy(model, x, y) > accuracy(model, corner, y), "the case must have samples to flip"
    x_adv = APGDCE(eps=eps)(model, x, y)  # about 0.05 s
    assert float((x_adv - x).abs().max()) <= eps + 1e-6
    assert float(x_adv.min()) >= 0.0 and float(x_adv.max()) <= 1.0
    assert accuracy(model, x_adv, y) == accuracy(model, corner, y)


@pytest.mark.slow
def test_autoattack_standard_on_a_tiny_linear_model():
    # 4 classes (the fewest the standard version runs on), 16 images of 3x3, 3 of them mislabelled
    pytest.importorskip("torchattacks")
    model, x, y = image_case(classes=4)
    eps = 0.05
    model.train()
    x_adv = AutoAttack(eps=eps)(model, x, y)  # about 2 s on one CPU thread, Square the most of it
    assert model.training
    assert float((x_adv - x).abs().max()) <= eps + 1e-6
    assert float(x_adv.min()) >= 0.0 and float(x_adv.max()) <= 1.0
    robust = accuracy(model, x_adv, y)
    assert certified_accuracy(model, x, y, eps) <= robust < accuracy(model, x, y)
    first = APGDCE(eps=eps)(model, x, y)
    assert robust <= accuracy(model, first, y), "the worst case over APGD-CE and three more"
    assert torch.equal(AutoAttack(eps=eps)(model, x, y), x_adv), "seeded: the same points again"
