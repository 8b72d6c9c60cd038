"""Local adversarial training objectives (edgefl.training.objectives) against their papers, by hand.

TRADES (Zhang et al., ICML 2019): CE(f(x), y) + beta KL(f(x) || f(x')).
MART (Wang et al., ICLR 2020, and its release's 1.0001): CE(f(x'), y) - log(1.0001 - max_{k != y} p_k(x'))
+ beta KL(f(x) || f(x')) (1 - p_y(x)).

A 2-sample, 3-class linear model without bias, W = [[1, 0], [0, 1], [0, 0]], and a fixed "attack":
  x1 = [1, 0], y1 = 0: logits [1, 0, 0], p1 = [e, 1, 1] / (e + 2)
  x2 = [0, 2], y2 = 1: logits [0, 2, 0], p2 = [1, e^2, 1] / (e^2 + 2)
  x1' = [0, 0]:        logits [0, 0, 0], q1 = [1, 1, 1] / 3
  x2' = [1, 1]:        logits [1, 1, 0], q2 = [e, e, 1] / (2e + 1)
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from edgefl.attacks.base import Attack
from edgefl.training.objectives import MART, OBJECTIVES, PGDAT, TRADES

E = math.e
X = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
Y = torch.tensor([0, 1])
X_ADV = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=torch.float64)
BETA = 2.0

P1 = [E / (E + 2), 1 / (E + 2), 1 / (E + 2)]
P2 = [1 / (E**2 + 2), E**2 / (E**2 + 2), 1 / (E**2 + 2)]
Q1 = [1 / 3, 1 / 3, 1 / 3]
Q2 = [E / (2 * E + 1), E / (2 * E + 1), 1 / (2 * E + 1)]


def kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))


# CE on the clean batch: mean(-log p1[0], -log p2[1]) = (log(e + 2) - 1 + log(e^2 + 2) - 2) / 2
#   = (1.55144 - 1 + 2.23954 - 2) / 2 = 0.39549
CE_CLEAN = (math.log(E + 2) - 1 + math.log(E**2 + 2) - 2) / 2
KL1, KL2 = kl(P1, Q1), kl(P2, Q2)
TRADES_VALUE = CE_CLEAN + BETA * (KL1 + KL2) / 2
# MART: CE on x' = mean(-log q1[0], -log q2[1]) = (log 3 + log(2e + 1) - 1) / 2
CE_ADV = (math.log(3) + math.log(2 * E + 1) - 1) / 2
# max_{k != y} q_k: sample 1 max(q1[1], q1[2]) = 1/3; sample 2 max(q2[0], q2[2]) = e / (2e + 1)
BOOST = (-math.log(1.0001 - 1 / 3) - math.log(1.0001 - E / (2 * E + 1))) / 2
# KL weighted by 1 - p_y(x): 1 - e / (e + 2) and 1 - e^2 / (e^2 + 2)
WEIGHTED_KL = (KL1 * (1 - E / (E + 2)) + KL2 * (1 - E**2 / (E**2 + 2))) / 2
MART_VALUE = CE_ADV + BOOST + BETA * WEIGHTED_KL


def model() -> nn.Module:
    m = nn.Linear(2, 3, bias=False).double()
    with torch.no_grad():
        m.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0]], dtype=torch.float64))
    return m


class Fixed(Attack):
    """Returns X_ADV whatever it is asked; records each call: the attack that ran and its target."""

    runs: list[tuple[Fixed, torch.Tensor]] = []  # noqa: RUF012  (a record shared by the class)

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        Fixed.runs.append((self, y.detach().clone()))
        return X_ADV.clone()


@pytest.fixture
def attack() -> Fixed:
    Fixed.runs.clear()
    return Fixed(0.25, 0.05, 3)


@pytest.mark.parametrize("objective", [PGDAT, TRADES, MART])
def test_without_attack_every_objective_is_cross_entropy(objective):
    loss = objective(BETA).loss(model(), X, Y, None)
    assert loss.item() == pytest.approx(CE_CLEAN, rel=1e-12)


def test_trades_by_hand(attack):
    loss = TRADES(BETA).loss(model(), X, Y, attack)
    assert loss.item() == pytest.approx(TRADES_VALUE, rel=1e-10)
    # TRADES crafts x' with a copy of the training attack (its class, eps, step size and steps),
    # whose loss is KL(f(x) || f(x')) against the clean output, not CE against the labels
    ((kl_attack, target),) = Fixed.runs
    assert kl_attack is not attack and type(kl_attack) is Fixed
    assert (kl_attack.eps, kl_attack.step_size, kl_attack.steps) == (0.25, 0.05, 3)
    assert attack.loss is nn.functional.cross_entropy  # the given attack is left as it was
    assert torch.allclose(target, torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]], dtype=torch.float64))
    with torch.no_grad():
        crafted = kl_attack.loss(model()(X_ADV), target)
    assert crafted.item() == pytest.approx((KL1 + KL2) / 2, rel=1e-10)


def test_mart_by_hand(attack):
    loss = MART(BETA).loss(model(), X, Y, attack)
    assert loss.item() == pytest.approx(MART_VALUE, rel=1e-10)
    ((ran, labels),) = Fixed.runs  # MART's x' is crafted with the given (CE) attack on the labels
    assert ran is attack and torch.equal(labels, Y)


def test_default_beta_is_six():
    # TRADES and MART both use 6 in their papers' CIFAR-10 settings
    assert TRADES().beta == 6.0 and MART().beta == 6.0
    loss = TRADES().loss(model(), X, Y, Fixed())
    assert loss.item() == pytest.approx(CE_CLEAN + 6.0 * (KL1 + KL2) / 2, rel=1e-10)


def test_objectives_are_registered():
    assert OBJECTIVES.get("pgd_at") is PGDAT
    assert OBJECTIVES.get("trades") is TRADES
    assert OBJECTIVES.get("mart") is MART


def test_losses_backpropagate_to_the_model(attack):
    for objective in (TRADES(BETA), MART(BETA)):
        m = model()
        objective.loss(m, X, Y, attack).backward()
        assert m.weight.grad is not None and torch.isfinite(m.weight.grad).all()
        assert m.weight.grad.abs().sum() > 0


def test_trades_crafts_x_prime_in_the_training_attacks_own_ball() -> None:
    """With an L2 training attack, TRADES's x' stays in the L2 ball of radius eps (an L-inf PGD
    with that eps would move every pixel by up to eps: an L2 norm of up to eps x sqrt(d))."""
    from edgefl.attacks.pgd_l2 import PGDL2

    crafted: list[torch.Tensor] = []

    class Recorded(PGDL2):
        def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
            crafted.append(super().perturb(model, x, y) - x)
            return x + crafted[-1]

    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 3)).double()
    x = torch.rand(4, 1, 8, 8, dtype=torch.float64)
    TRADES(BETA).loss(net, x, torch.tensor([0, 1, 2, 0]), Recorded(eps=0.5, step_size=0.2, steps=5))
    (delta,) = crafted
    assert float(delta.flatten(1).norm(dim=1).max()) <= 0.5 + 1e-9
    assert float(delta.abs().max()) > 0  # it moved
