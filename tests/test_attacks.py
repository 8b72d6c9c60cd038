"""FGSM and PGD on hand-made linear models, the attack registry, and evaluate().

For a 2-class linear model z = W x + b and y the true class, the cross-entropy input gradient is
W^T (softmax(z) - e_y) = p_wrong (w_wrong - w_true), with p_wrong > 0: its sign per feature is
sign(w_wrong - w_true), the same at every x. So FGSM moves every feature by eps in that direction,
and PGD with enough steps ends at the corner x + eps * sign(w_wrong - w_true) of the L-inf ball.
"""

from __future__ import annotations

import itertools
from contextlib import nullcontext

import pytest
import torch
from support import QUICKSTART
from torch import nn

from edgefl.attacks import ATTACKS, Attack, make_attack
from edgefl.errors import EdgeflError
from edgefl.experiment import prepare
from edgefl.scenario import load_scenario
from edgefl.training.local import evaluate


def linear(w_0: list[float], w_1: list[float], bias: tuple[float, float] = (0.0, 0.0)) -> nn.Sequential:
    """Flatten + Linear(d, 2) with rows w_0 (class 0) and w_1 (class 1)."""
    fc = nn.Linear(len(w_0), 2)
    with torch.no_grad():
        fc.weight.copy_(torch.tensor([w_0, w_1]))
        fc.bias.copy_(torch.tensor(bias))
    return nn.Sequential(nn.Flatten(), fc)


# w_1 - w_0 = [-2, 2, 0.5, -1, 0]: for y = 0 the gradient's sign is [-1, +1, +1, -1, 0], for y = 1 its
# opposite; the model ignores the last feature (zero weights), its gradient is exactly 0 and FGSM
# leaves it alone.
W0 = [1.0, -1.0, 0.5, -2.0, 0.0]
W1 = [-1.0, 1.0, 1.0, -3.0, 0.0]


def ce(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    with torch.no_grad():
        return float(nn.functional.cross_entropy(model(x), y))


def test_fgsm_is_x_plus_eps_sign_of_w_wrong_minus_w_true_clipped():
    model = linear(W0, W1)
    x = torch.tensor([[0.05, 0.5, 0.97, 0.5, 0.4],
                      [0.05, 0.5, 0.97, 0.5, 0.4]]).view(2, 1, 1, 5)
    y = torch.tensor([0, 1])
    x_before = x.clone()
    x_adv = make_attack("fgsm", eps=0.1, step_size=0.0, steps=1)(model, x, y)
    expected = torch.tensor([
        # y = 0, sign [-1, +1, +1, -1, 0]: 0.05 - 0.1 -> clipped to 0, 0.97 + 0.1 -> clipped to 1
        [0.0, 0.6, 1.0, 0.4, 0.4],
        # y = 1, sign [+1, -1, -1, +1, 0]
        [0.15, 0.4, 0.87, 0.6, 0.4],
    ]).view(2, 1, 1, 5)
    torch.testing.assert_close(x_adv, expected, rtol=0, atol=1e-6)
    assert torch.equal(x, x_before), "the attack must not modify its input"
    assert not x_adv.requires_grad
    assert ce(model, x_adv, y) > ce(model, x, y)


def test_fgsm_ignores_step_size_and_steps():
    model = linear(W0, W1)
    x = torch.full((1, 5), 0.5)
    y = torch.tensor([0])
    one = make_attack("fgsm", eps=0.1, step_size=0.0, steps=1)(model, x, y)
    other = make_attack("fgsm", eps=0.1, step_size=0.3, steps=7)(model, x, y)
    assert torch.equal(one, other)


def random_case(seed: int, n: int = 16, d: int = 12) -> tuple[nn.Sequential, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    model = linear(torch.randn(d, generator=g).tolist(), torch.randn(d, generator=g).tolist())
    x = torch.rand(n, d, generator=g)
    x[0] = 0.0  # at the borders of [0, 1], the ball must be clipped
    x[1] = 1.0
    y = torch.randint(0, 2, (n,), generator=g)
    return model, x, y


@pytest.mark.parametrize("name", ["fgsm", "pgd"])
def test_attacks_stay_in_the_eps_ball_and_the_unit_box(name: str):
    model, x, y = random_case(1)
    torch.manual_seed(0)
    x_adv = make_attack(name, eps=0.1, step_size=0.03, steps=5)(model, x, y)
    assert x_adv.shape == x.shape
    assert float((x_adv - x).abs().max()) <= 0.1 + 1e-6
    assert float(x_adv.min()) >= 0.0
    assert float(x_adv.max()) <= 1.0


@pytest.mark.parametrize("name", ["pgd", "cw"])
def test_signed_attacks_reach_the_corner_of_the_ball_on_a_linear_model(name):
    # interior x (x +- eps inside [0, 1]); the random start is within eps of x, so the corner is at
    # most 2 eps = 0.2 away per feature: 4 steps of 0.05 reach it, 10 are plenty. On two classes
    # CW's margin z_other - z_true has the gradient w_other - w_true, cross-entropy's sign: one corner.
    model = linear([1.0, -1.0, 0.5, -2.0], [-1.0, 1.0, 1.0, -3.0])  # w_1 - w_0 = [-2, 2, 0.5, -1]
    x = torch.tensor([[0.3, 0.5, 0.7, 0.4],
                      [0.3, 0.5, 0.7, 0.4]])
    y = torch.tensor([0, 1])
    torch.manual_seed(0)
    x_adv = make_attack(name, eps=0.1, step_size=0.05, steps=10)(model, x, y)
    expected = torch.tensor([[0.2, 0.6, 0.8, 0.3],   # y = 0: x + 0.1 x [-1, +1, +1, -1]
                             [0.4, 0.4, 0.6, 0.5]])  # y = 1: the opposite corner
    torch.testing.assert_close(x_adv, expected, rtol=0, atol=1e-6)


def test_pgd_more_steps_never_lower_the_loss_on_a_linear_model():
    model, x, y = random_case(2)
    losses = []
    for steps in (1, 2, 3, 5, 10, 20):
        torch.manual_seed(0)  # the same random start for every step count
        losses.append(ce(model, make_attack("pgd", eps=0.1, step_size=0.02, steps=steps)(model, x, y), y))
    assert all(b >= a - 1e-6 for a, b in itertools.pairwise(losses)), losses
    assert losses[-1] > losses[0]
    assert losses[-1] > ce(model, x, y)


def test_pgd_with_enough_steps_equals_the_clipped_corner():
    # with x anywhere in [0, 1] the end point is x + eps * sign, clipped to [0, 1], for every
    # feature whose weights differ
    model, x, y = random_case(3)
    w = model[1].weight.detach()
    direction = torch.where(y[:, None] == 0, w[1] - w[0], w[0] - w[1]).sign()
    torch.manual_seed(0)
    x_adv = make_attack("pgd", eps=0.1, step_size=0.05, steps=10)(model, x, y)
    torch.testing.assert_close(x_adv, (x + 0.1 * direction).clamp(0, 1), rtol=0, atol=1e-6)


class ModeSpy(nn.Module):
    """Records the training flag of every forward pass."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[bool] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.training)
        return x


@pytest.mark.parametrize("name", ["fgsm", "pgd"])
@pytest.mark.parametrize("training", [True, False])
def test_attack_crafts_in_eval_mode_and_restores_the_mode(name: str, training: bool):
    spy = ModeSpy()
    model = nn.Sequential(spy, *linear(W0, W1))
    model.train(training)
    make_attack(name, eps=0.1, step_size=0.05, steps=3)(model, torch.full((2, 5), 0.5), torch.tensor([0, 1]))
    assert spy.seen and not any(spy.seen), "the attack must run the model in eval mode"
    assert model.training is training
    assert all(m.training is training for m in model.modules())


def test_attack_restores_the_mode_when_it_fails():
    model = nn.Sequential(*linear(W0, W1))
    model.train()
    with pytest.raises(RuntimeError):
        make_attack("fgsm", eps=0.1, step_size=0.0, steps=1)(model, torch.zeros(2, 7), torch.tensor([0, 1]))
    assert model.training


class GradSpy(nn.Module):
    """Records whether the next layer's weight asked for gradients while the model ran."""

    def __init__(self, layer: nn.Linear) -> None:
        super().__init__()
        self.layer, self.seen = layer, []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.append(self.layer.weight.requires_grad)
        return x


@pytest.mark.parametrize("fails", [False, True])
def test_attack_freezes_the_parameters_and_restores_each_flag(fails: bool):
    model = nn.Sequential(*linear(W0, W1))
    model[1].bias.requires_grad_(False)  # a parameter frozen before the attack stays frozen
    spy = GradSpy(model[1])
    model.insert(0, spy)
    x = torch.zeros(2, 7 if fails else 5)
    with pytest.raises(RuntimeError) if fails else nullcontext():  # 7 features into a 5-input layer
        make_attack("pgd", eps=0.1, step_size=0.05, steps=3)(model, x, torch.tensor([0, 1]))
    assert spy.seen and not any(spy.seen), "the attack must run with the parameters frozen"
    assert model[2].weight.requires_grad and not model[2].bias.requires_grad


def test_registry_and_make_attack():
    assert {"fgsm", "pgd"} <= set(ATTACKS.names())
    attack = make_attack("pgd", eps=0.25, step_size=0.125, steps=7)
    assert isinstance(attack, Attack)
    assert (attack.eps, attack.step_size, attack.steps) == (0.25, 0.125, 7)
    with pytest.raises(KeyError) as info:
        make_attack("cw-l7", eps=0.1, step_size=0.1, steps=1)
    assert "cw-l7" in str(info.value)
    assert "fgsm" in str(info.value)
    assert "pgd" in str(info.value)


def pixel_sign_model(d: int = 4) -> nn.Sequential:
    """Class 1 iff the first pixel exceeds 0.5: logits (5 - 10 x0, 10 x0 - 5); other pixels unused."""
    return linear([-10.0] + [0.0] * (d - 1), [10.0] + [0.0] * (d - 1), bias=(5.0, -5.0))


def test_evaluate_all_correct_then_all_flipped():
    model = pixel_sign_model()
    x = torch.full((6, 1, 2, 2), 0.3)
    x[:, 0, 0, 0] = torch.tensor([0.55, 0.45, 0.55, 0.45, 0.54, 0.46])
    y = torch.tensor([1, 0, 1, 0, 1, 0])
    # within 0.05 of the boundary: an eps of 0.1 pushes every sample across it
    for name in ("fgsm", "pgd"):
        torch.manual_seed(0)
        assert evaluate(model, x, y, make_attack(name, eps=0.1, step_size=0.05, steps=5)) == (1.0, 0.0)


def test_evaluate_counts_over_batches():
    model = pixel_sign_model()
    x = torch.full((5, 1, 2, 2), 0.3)
    x[:, 0, 0, 0] = torch.tensor([0.55, 0.45, 0.75, 0.25, 0.45])
    y = torch.tensor([1, 0, 1, 0, 1])  # the last one is wrong already
    # clean: 4 of 5 right; FGSM eps 0.1: 0.55 -> 0.45 and 0.45 -> 0.55 flip, 0.75 -> 0.65 and
    # 0.25 -> 0.35 hold, the wrong one stays wrong (0.45 -> 0.35): 2 of 5
    attack = make_attack("fgsm", eps=0.1, step_size=0.0, steps=1)
    clean, adv = evaluate(model, x, y, attack, batch=2)
    assert clean == pytest.approx(4 / 5)
    assert adv == pytest.approx(2 / 5)


@pytest.mark.parametrize("name, steps", [("pgd", 10), ("fgsm", 1), ("cw", 10)])
def test_a_round_is_charged_the_attack_passes_it_runs(name, steps):
    """FGSM runs one forward and input-gradient pair whatever attack.steps says; PGD and CW run
    attack.steps of them. The workload the cost model prices carries that count."""
    s = load_scenario(QUICKSTART, [f'attack.name="{name}"', "attack.steps=10"])
    exp = prepare(s, str(QUICKSTART), dry_run=True)
    assert exp.method.plan(0, 0, exp.pool.state(0, 0)).workload.attack_steps == steps


def test_autoattack_is_refused_as_the_training_attack():
    with pytest.raises(EdgeflError) as info:
        load_scenario(QUICKSTART, ['attack.name="autoattack"'])
    assert info.value.key == "attack.name" and "evaluation attack" in info.value.fix


def test_pgd_l2_on_images_stays_in_the_unit_box_and_features_keep_their_own_bounds() -> None:
    """Inputs live in [0, 1]: pixels at 0 or 1 pushed outwards are clipped back, as the release's
    input attack clips after every step; FedProphet's feature attack has no upper bound."""
    from edgefl.attacks.pgd_l2 import PGDL2
    from edgefl.methods.fedprophet.cascade import feature_attack

    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(16, 2))
    x = torch.randint(0, 2, (8, 1, 4, 4)).float()  # every pixel on the box's faces
    x_adv = PGDL2(eps=1.0, step_size=0.5, steps=5)(net, x, torch.randint(0, 2, (8,)))
    assert float(x_adv.min()) >= 0.0 and float(x_adv.max()) <= 1.0
    assert float((x_adv - x).flatten(1).norm(dim=1).max()) <= 1.0 + 1e-6
    features = feature_attack(eps=1.0, steps=5, lower=0.0)
    assert (features.lower, features.upper) == (0.0, None)


def test_random_starts_do_not_depend_on_the_memory_format() -> None:
    """A channels_last batch draws the same random start as its NCHW copy (one-by-one training may
    keep channels_last batches, grouped training stacks NCHW ones)."""
    from edgefl.attacks.base import normal_like, uniform_like

    x = torch.rand(2, 3, 4, 4)
    for draw in (lambda t: uniform_like(t, -1.0, 1.0), normal_like):
        torch.manual_seed(5)
        nchw = draw(x)
        torch.manual_seed(5)
        last = draw(x.contiguous(memory_format=torch.channels_last))
        assert torch.equal(nchw, last)
