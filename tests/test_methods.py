"""Federated adversarial training baselines against their papers, with hand-computed numbers.

SFAT (Zhu et al., ICLR 2023, App. D Alg. 1), GMA (Tenison et al., TMLR 2023, Alg. 1-2, with
FedAdam / FedYogi of Reddi et al., ICLR 2021), FedCurvAT and FedDynAT (Shah et al. §2.2, Alg. 2),
SCAFFOLD (Karimireddy et al., ICML 2020, Alg. 1 option II), FedProx (Li et al., MLSys 2020), and one
short run of every method through the CLI.

The model of scenarios/quickstart.toml (digits_cnn) has 25978 trainable parameters:
conv1 1x16x3x3 = 144, BN16 2 x 16 = 32, conv2 16x32x3x3 = 4608, BN32 64, conv3 32x64x3x3 = 18432,
BN64 128, linear 256x10 + 10 = 2570; 144 + 32 + 4608 + 64 + 18432 + 128 + 2570 = 25978, i.e.
4 x 25978 = 103912 bytes in float32.
"""

from __future__ import annotations

import copy
import csv
import math

import pytest
import torch
from support import QUICKSTART
from torch import nn

from edgefl.cli import main
from edgefl.experiment import Experiment, prepare
from edgefl.methods.base import METHODS, ClientUpdate
from edgefl.methods.fedavg import epochs_to_iters
from edgefl.methods.fedcurv import FedCurvAT, curvature_penalty, fisher_diagonal
from edgefl.methods.feddyn import DynConfig, epoch_schedule
from edgefl.methods.fedprox import proximal
from edgefl.scenario import load_scenario
from edgefl.server.gma import gma_mask
from edgefl.server.slack import SFATConfig, slack_weights
from edgefl.sim.records import AtomProfile
from edgefl.sim.workload import Workload, train_pass_flops
from edgefl.training.local import Hooks

PARAM_BYTES = 4 * 25978  # see the module docstring
BN = {f"conv{i}.1.{s}" for i in (1, 2, 3)
      for s in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}
NON_BN = {"norm.mean", "norm.std", "conv1.0.weight", "conv2.0.weight", "conv3.0.weight",
          "conv3.5.weight", "conv3.5.bias"}


def experiment(method: str, *overrides: str) -> Experiment:
    scenario = load_scenario(QUICKSTART, [
        f"method={method}", "rounds=2", "training.local_iters=1", "attack.steps=1", "device=cpu",
        *overrides])
    return prepare(scenario, str(QUICKSTART))


def filled(template: dict[str, torch.Tensor], value: float, int_value: int = 0) -> dict[str, torch.Tensor]:
    """A state dict shaped like `template`: every float tensor `value`, every integer one `int_value`."""
    return {k: torch.full_like(t, value) if t.is_floating_point() else torch.full_like(t, int_value)
            for k, t in template.items()}


def linear(weight: list[list[float]], bias: list[float] | None, dtype=torch.float32) -> nn.Linear:
    out, inp = len(weight), len(weight[0])
    model = nn.Linear(inp, out, bias=bias is not None).to(dtype)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(weight, dtype=dtype))
        if bias is not None:
            model.bias.copy_(torch.tensor(bias, dtype=dtype))
    return model


# ============================================================================== SFAT

LOSSES = [0.5, 0.2, 0.9, 0.7, 0.4]


def test_slack_weights_equal_samples_top1():
    # K = 5, N_k = 10: N_k/N L_k = L_k / 5, smallest for client 1 (0.2).
    # alpha = 1/6: (1 + 1/6) / (1 - 1/6) = (7/6) / (5/6) = 1.4; raw 1.4 + 4 x 1 = 5.4
    w = slack_weights(LOSSES, [10] * 5, 1 / 6, 1)
    assert w == pytest.approx([1 / 5.4, 1.4 / 5.4, 1 / 5.4, 1 / 5.4, 1 / 5.4], rel=1e-12)
    assert sum(w) == pytest.approx(1.0)


def test_slack_weights_top2():
    # ascending L_k: client 1 (0.2), client 4 (0.4), ... -> both boosted: raw 2 x 1.4 + 3 = 5.8
    w = slack_weights(LOSSES, [10] * 5, 1 / 6, 2)
    assert w == pytest.approx([1 / 5.8, 1.4 / 5.8, 1 / 5.8, 1 / 5.8, 1.4 / 5.8], rel=1e-12)


def test_slack_weights_alpha_zero_is_fedavg():
    # (1 + 0) / (1 - 0) = 1: plain N_k / N = [10, 20, 30, 40] / 100
    w = slack_weights([0.9, 0.5, 0.4, 0.3], [10, 20, 30, 40], 0.0, 1)
    assert w == pytest.approx([0.1, 0.2, 0.3, 0.4], rel=1e-12)


def test_slack_weights_unequal_samples():
    # N = 100; N_k/N L_k = 0.1 x 0.9 = 0.09, 0.2 x 0.5 = 0.10, 0.3 x 0.4 = 0.12, 0.4 x 0.3 = 0.12:
    # client 0 (the largest loss) has the smallest share and is boosted.
    # raw N_k P_k = [10 x 1.4, 20, 30, 40] = [14, 20, 30, 40], sum 104
    w = slack_weights([0.9, 0.5, 0.4, 0.3], [10, 20, 30, 40], 1 / 6, 1)
    assert w == pytest.approx([14 / 104, 20 / 104, 30 / 104, 40 / 104], rel=1e-12)


def test_slack_weights_sort_by_sample_share_times_loss():
    # N = 120; client 0 has the smallest loss but 100 samples:
    # 100/120 x 0.1 = 0.0833, 10/120 x 0.5 = 0.0417, 10/120 x 0.9 = 0.075 -> client 1 is boosted.
    # raw = [100, 10 x 1.4, 10] = [100, 14, 10], sum 124
    w = slack_weights([0.1, 0.5, 0.9], [100, 10, 10], 1 / 6, 1)
    assert w == pytest.approx([100 / 124, 14 / 124, 10 / 124], rel=1e-12)


def sfat_updates(template: dict[str, torch.Tensor]) -> list[ClientUpdate]:
    """Three clients: every float = 1, 2, 4 and integer buffers 4, 8, 12; N = 10, 10, 20;
    losses 0.8, 0.3, 0.6 -> N_k/N L_k = 10/40 x 0.8 = 0.2, 10/40 x 0.3 = 0.075, 20/40 x 0.6 = 0.3."""
    return [ClientUpdate(3, filled(template, 1.0, 4), 10, 0.8),
            ClientUpdate(7, filled(template, 2.0, 8), 10, 0.3),
            ClientUpdate(9, filled(template, 4.0, 12), 20, 0.6)]


# plain: (10 x 1 + 10 x 2 + 20 x 4) / 40 = 110 / 40; integers (40 + 80 + 240) / 40 = 9
# k_hat = 1 boosts client 1: (10 x 1 + 14 x 2 + 20 x 4) / (10 + 14 + 20) = 118 / 44
# k_hat = 2 boosts clients 1 and 0: (14 x 1 + 14 x 2 + 20 x 4) / (14 + 14 + 20) = 122 / 48
@pytest.mark.parametrize(("k_hat", "slack_value"), [(1, 118 / 44), (2, 122 / 48)])
def test_sfat_combine_plain_in_round_0_then_slack_on_non_bn(k_hat, slack_value):
    exp = experiment("sfat", f"sfat.k_hat={k_hat}")
    method = exp.method
    template = method.model.state_dict()
    assert set(template) == BN | NON_BN
    plain_value = 110 / 40

    first = method.combine(0, sfat_updates(template))
    for key in BN | NON_BN:
        expected = 9 if not template[key].is_floating_point() else plain_value
        assert torch.allclose(first[key].double(), torch.full(template[key].shape, float(expected),
                                                                dtype=torch.float64)), key

    later = method.combine(1, sfat_updates(template))
    for key in BN:  # BatchNorm: plain FedAvg (the release)
        expected = 9 if not template[key].is_floating_point() else plain_value
        assert torch.allclose(later[key].double(), torch.full(template[key].shape, float(expected),
                                                                dtype=torch.float64)), key
    for key in NON_BN:
        assert torch.allclose(later[key], torch.full_like(template[key], slack_value)), key
        assert later[key].dtype == template[key].dtype


def test_sfat_default_alpha_is_one_sixth_and_khat_one():
    cfg = experiment("sfat").scenario.knobs(SFATConfig)
    assert (1 + cfg.alpha) / (1 - cfg.alpha) == pytest.approx(1.4)
    assert cfg.k_hat == 1


def test_sfat_with_scaffold_base_also_updates_control_variates():
    exp = experiment("sfat", "sfat.base=\"scaffold\"")
    method = exp.method
    template = method.model.state_dict()
    updates = sfat_updates(template)
    for u, value in zip(updates, (1.0, 2.0, 6.0), strict=True):
        u.extra["delta_c"] = {n: torch.full_like(p, value) for n, p in method.model.named_parameters()}
        u.extra["c_local"] = u.extra["delta_c"]
    out = method.combine(1, updates)
    # c = 0 + |S|/N mean(delta_c) = 3/20 x (1 + 2 + 6) / 3 = 0.45
    for n, c in method.c.items():
        assert torch.allclose(c, torch.full_like(c, 0.45)), n
    assert torch.allclose(out["conv1.0.weight"], torch.full_like(template["conv1.0.weight"], 118 / 44))


def test_sfat_scores_a_client_by_its_last_local_epoch_one_by_one_and_grouped(monkeypatch):
    """L_k (Zhu et al. App. D; the release's update_weights_at) is the last local epoch's mean loss:
    with 2 local epochs of a client's N_k samples at batch B, the mean of its last ceil(N_k / B)
    iterations' losses, whether it trains alone or in a group."""
    from edgefl.training import objectives

    seen: list[torch.Tensor] = []
    real = objectives.PGDAT.adversarial_loss

    def recorded(self, model, x, y, attack):
        loss = real(self, model, x, y, attack)
        seen.append(loss.detach().clone())
        return loss

    monkeypatch.setattr(objectives.PGDAT, "adversarial_loss", recorded)
    exp = experiment("sfat", "training.local_epochs=2.0")
    method, plan = exp.method, exp.method.plan(0, 0, exp.pool.state(0, 0))
    samples = len(exp.ctx.client_data(0)[0])
    epoch = math.ceil(samples / min(plan.workload.batch, samples))
    assert method.scored_iterations(plan, samples) == epoch
    assert plan.workload.iterations > epoch  # two epochs: the score is not the whole round's mean
    alone = method.train(0, 0, plan)
    assert alone.loss == pytest.approx(float(torch.stack(seen[-epoch:]).mean()), rel=1e-6)
    assert alone.loss != pytest.approx(float(torch.stack(seen).mean()), rel=1e-3)
    seen.clear()
    (grouped,) = method.train_together(0, [0], plan)
    assert grouped.loss == pytest.approx(alone.loss, rel=1e-5)


# ============================================================================== GMA


def test_gma_mask_at_and_around_tau():
    # 4 clients, one coordinate per column: agreement A = |mean sign|
    deltas = [torch.tensor([1.0, 1.0, 1.0, 2.0, -3.0, 0.5]),
              torch.tensor([2.0, 1.0, -1.0, 1.0, -1.0, 0.0]),
              torch.tensor([3.0, 1.0, 1.0, -1.0, -2.0, 0.0]),
              torch.tensor([4.0, -1.0, -1.0, -1.0, 1.0, 0.0])]
    # A = [4/4, 2/4, 0/4, 0/4, 2/4, 1/4] = [1, 0.5, 0, 0, 0.5, 0.25]
    assert torch.equal(gma_mask(deltas, 0.5), torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.25]))
    # tau = 0.6: A = 0.5 is below -> the mask is A itself
    assert torch.equal(gma_mask(deltas, 0.6), torch.tensor([1.0, 0.5, 0.0, 0.0, 0.5, 0.25]))
    # tau = 0: everything is at or above -> all ones (naive averaging, GMA App. D.1)
    assert torch.equal(gma_mask(deltas, 0.0), torch.ones(6))
    # tau = 1: only unanimous coordinates keep 1
    assert torch.equal(gma_mask(deltas, 1.0), torch.tensor([1.0, 0.5, 0.0, 0.0, 0.5, 0.25]))


def test_gma_mask_five_clients_default_tau():
    # 5 clients, tau = 0.4: [+,+,+,+,-] -> A = 3/5 = 0.6 >= 0.4 -> 1;
    # [+,+,+,-,-] -> A = 1/5 = 0.2 < 0.4 -> 0.2; all negative -> 1
    signs = torch.tensor([[1.0, 1.0, -1.0], [1.0, 1.0, -1.0], [1.0, 1.0, -1.0],
                          [1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    mask = gma_mask(list(signs * 0.01), 0.4)
    assert torch.allclose(mask, torch.tensor([1.0, 0.2, 1.0]))


# per client (rows) and coordinate type (columns); client weights N = [1, 1, 1, 2] (sum 5)
GMA_DELTAS = [[1.0, 2.0, 1.0], [2.0, 2.0, 3.0], [3.0, 2.0, -1.0], [4.0, -1.0, -1.0]]
GMA_SAMPLES = [1, 1, 1, 2]
# weighted mean Delta (GMA Alg. 1: sum_n s_n / sum_k s_k Delta_n):
#   type 0: (1 + 2 + 3 + 2 x 4) / 5 = 14/5 = 2.8
#   type 1: (2 + 2 + 2 + 2 x -1) / 5 = 4/5 = 0.8
#   type 2: (1 + 3 - 1 + 2 x -1) / 5 = 1/5 = 0.2
# agreement (unweighted sign mean): type 0 |4/4| = 1, type 1 |(3 - 1)/4| = 0.5, type 2 |(2 - 2)/4| = 0
GMA_MEAN = [2.8, 0.8, 0.2]
GMA_AGREEMENT = [1.0, 0.5, 0.0]


def pattern(shape: torch.Size, values: list[float]) -> torch.Tensor:
    """A tensor whose flat element j is values[j % 3]."""
    n = math.prod(shape)
    return torch.tensor([values[j % 3] for j in range(n)], dtype=torch.float32).reshape(shape)


def gma_updates(method, sign: float = 1.0) -> list[ClientUpdate]:
    current = method.model.state_dict()
    params = {n for n, _ in method.model.named_parameters()}
    updates = []
    for k, (row, n) in enumerate(zip(GMA_DELTAS, GMA_SAMPLES, strict=True)):
        state = {}
        for key, t in current.items():
            if key in params:
                state[key] = t + sign * pattern(t.shape, row)
            elif t.is_floating_point():  # buffers: shifted by the client's type-0 value
                state[key] = t + row[0]
            else:
                state[key] = t.clone()
        updates.append(ClientUpdate(k, state, n, 0.0))
    return updates


@pytest.mark.parametrize("tau", [0.5, 0.6])
def test_gma_sgd_server_applies_masked_mean_update(tau):
    exp = experiment("gma", f"gma.tau={tau}", "gma.server=\"sgd\"", "gma.server_lr=1.0")
    method = exp.method
    before = copy.deepcopy(method.model.state_dict())
    params = {n for n, _ in method.model.named_parameters()}
    out = method.combine(0, gma_updates(method))
    # mask: type 0 -> 1; type 1 -> 1 at tau = 0.5 (A = tau), 0.5 at tau = 0.6; type 2 -> A = 0
    mask = [1.0, 1.0 if tau <= 0.5 else 0.5, 0.0]
    step = [m * d for m, d in zip(mask, GMA_MEAN, strict=True)]  # [2.8, 0.8 or 0.4, 0]
    for key, t in before.items():
        if key in params:
            assert torch.allclose(out[key], t + pattern(t.shape, step), atol=1e-6), key
        elif t.is_floating_point():  # buffers: plain average, unmasked: + 2.8
            assert torch.allclose(out[key], t + 2.8, atol=1e-6), key
        else:
            assert torch.equal(out[key], t), key


@pytest.mark.parametrize("server", ["adam", "yogi"])
def test_gma_adaptive_server_two_rounds_by_hand(server):
    b1, b2, eps, lr = 0.9, 0.99, 1e-3, 1.0
    exp = experiment("gma", "gma.tau=0.6", f"gma.server=\"{server}\"", f"gma.beta1={b1}",
                     f"gma.beta2={b2}", f"gma.adapt_eps={eps}", f"gma.server_lr={lr}")
    method = exp.method
    mask = [1.0, 0.5, 0.0]  # tau = 0.6: A = [1, 0.5, 0] -> [1, 0.5, 0]

    # Reddi et al.: z_0 = 0, v_0 = eps^2; round 1 sees Delta, round 2 sees -Delta
    def by_hand(delta: float) -> tuple[float, float]:
        z, v = 0.0, eps**2
        steps = []
        for g in (delta, -delta):
            z = b1 * z + (1 - b1) * g
            if server == "yogi":
                v = v - (1 - b2) * g * g * math.copysign(1.0, v - g * g) if v != g * g else v
            else:
                v = b2 * v + (1 - b2) * g * g
            steps.append(z / (math.sqrt(v) + eps))
        return steps[0], steps[1]

    hand = [by_hand(d) for d in GMA_MEAN]
    # e.g. type 0, Adam: z1 = 0.1 x 2.8 = 0.28, v1 = 0.99e-6 + 0.01 x 7.84 = 0.07840099,
    # step1 = 0.28 / (0.2800018 + 0.001) = 0.996434
    assert hand[0][0] == pytest.approx(0.28 / (math.sqrt(0.99e-6 + 0.0784) + 1e-3) if server == "adam"
                                       else 0.28 / (math.sqrt(1e-6 + 0.0784) + 1e-3))
    params = {n for n, _ in method.model.named_parameters()}
    w0 = copy.deepcopy(method.model.state_dict())

    method.aggregate(0, gma_updates(method))
    w1 = copy.deepcopy(method.model.state_dict())
    for key in params:
        step = [lr * m * h[0] for m, h in zip(mask, hand, strict=True)]
        assert torch.allclose(w1[key], w0[key] + pattern(w0[key].shape, step), rtol=1e-5, atol=1e-6), key

    method.aggregate(1, gma_updates(method, sign=-1.0))
    w2 = method.model.state_dict()
    for key in params:
        step = [lr * m * h[1] for m, h in zip(mask, hand, strict=True)]
        assert torch.allclose(w2[key], w1[key] + pattern(w1[key].shape, step), rtol=1e-5, atol=1e-6), key


# ============================================================================== FedCurv

# a tiny model w = (weight [[1, 2]], bias [0.5]) and two other clients' (w_j, F_j):
W = ([[1.0, 2.0]], [0.5])
CLIENT_A = ({"weight": torch.tensor([[0.0, 1.0]]), "bias": torch.tensor([0.0])},
            {"weight": torch.tensor([[1.0, 2.0]]), "bias": torch.tensor([3.0])})
CLIENT_B = ({"weight": torch.tensor([[2.0, 2.0]]), "bias": torch.tensor([1.0])},
            {"weight": torch.tensor([[0.5, 1.0]]), "bias": torch.tensor([2.0])})
# sum_j sum (w - w_j)^2 F_j:
#   A: (1 - 0)^2 x 1 + (2 - 1)^2 x 2 + (0.5 - 0)^2 x 3 = 1 + 2 + 0.75 = 3.75
#   B: (1 - 2)^2 x 0.5 + (2 - 2)^2 x 1 + (0.5 - 1)^2 x 2 = 0.5 + 0 + 0.5 = 1.0
# lambda = 0.1: 0.1 x 4.75 = 0.475
# gradient 2 lambda sum_j F_j (w - w_j):
#   weight[0]: 0.2 x (1 x 1 + 0.5 x -1) = 0.1; weight[1]: 0.2 x (2 x 1 + 1 x 0) = 0.4
#   bias: 0.2 x (3 x 0.5 + 2 x -0.5) = 0.1
CURV_VALUE = 0.475
CURV_GRAD = ([[0.1, 0.4]], [0.1])


def check_penalty(hooks: Hooks, value: float, grad: tuple[list[list[float]], list[float]]) -> None:
    model = linear(*W)
    penalty = hooks.penalty(model)
    assert penalty.item() == pytest.approx(value, rel=1e-6)
    penalty.backward()
    assert torch.allclose(model.weight.grad, torch.tensor(grad[0]), atol=1e-6)
    assert torch.allclose(model.bias.grad, torch.tensor(grad[1]), atol=1e-6)


def test_curvature_penalty_value_and_gradient():
    # the decomposition's sums, by hand:
    #   sum F_j = weight [[1.5, 3]], bias [5]
    #   sum F_j w_j = weight [[1 x 0 + 0.5 x 2, 2 x 1 + 1 x 2]] = [[1, 4]], bias [3 x 0 + 2 x 1] = [2]
    #   sum F_j w_j^2 = A: 2 x 1 = 2; B: 0.5 x 4 + 1 x 4 + 2 x 1 = 8 -> 10
    hooks = curvature_penalty(
        0.1, {"weight": torch.tensor([[1.5, 3.0]]), "bias": torch.tensor([5.0])},
        {"weight": torch.tensor([[1.0, 4.0]]), "bias": torch.tensor([2.0])}, torch.tensor(10.0))
    check_penalty(hooks, CURV_VALUE, CURV_GRAD)


def test_fedcurv_hooks_use_only_other_clients_previous_entries():
    exp = experiment("fedcurv_at", "curv.lam=0.1")
    method = exp.method
    method.model = linear(*W)  # the method only needs the parameter names from its model
    own = ({"weight": torch.tensor([[5.0, 5.0]]), "bias": torch.tensor([5.0])},
           {"weight": torch.tensor([[1.0, 1.0]]), "bias": torch.tensor([1.0])})
    assert method.hooks(0, 0, {}).penalty is None  # round 0: nobody has a Fisher yet
    # uploaded through combine: client 0 (own), 1 (A), 2 (B)
    states = [{"weight": w["weight"], "bias": w["bias"]} for w, _ in (own, CLIENT_A, CLIENT_B)]
    updates = [ClientUpdate(k, s, 10, 0.0, {"curvature": entry})
               for k, (s, entry) in enumerate(zip(states, (own, CLIENT_A, CLIENT_B), strict=True))]
    method.combine(0, updates)
    # client 0 sees only A and B
    check_penalty(method.hooks(1, 0, {}), CURV_VALUE, CURV_GRAD)
    # a client that did not train last round sees all three: own adds
    # 0.1 x ((1 - 5)^2 + (2 - 5)^2 + (0.5 - 5)^2) = 0.1 x (16 + 9 + 20.25) = 4.525 -> 5.0;
    # gradient + 0.2 x (w - 5) = [[-0.8, -0.6]], [-0.9]
    check_penalty(method.hooks(1, 5, {}), 5.0, ([[0.1 - 0.8, 0.4 - 0.6]], [0.1 - 0.9]))
    # client 1 sees own (client 0) and B: 4.525 + 0.1 = 4.625;
    # gradient: own [[-0.8, -0.6]], [-0.9] + B 0.2 x 0.5 x (1 - 2) = -0.1, 0, 0.2 x 2 x -0.5 = -0.2
    check_penalty(method.hooks(1, 1, {}), 4.625, ([[-0.9, -0.6]], [-1.1]))


def test_fisher_diagonal_is_mean_over_samples_of_squared_gradients():
    # logits = W x + b with W = 0, b = [ln 3, 0]: softmax = [3/4, 1/4] for every input;
    # dCE/dlogits = softmax - onehot(y), dW = dlogits x^T, per sample
    model = linear([[0.0, 0.0], [0.0, 0.0]], [math.log(3.0), 0.0], dtype=torch.float64)
    x = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]], dtype=torch.float64)
    y = torch.tensor([0, 1, 0])
    # sample 1 (y=0): dz = [-1/4, 1/4], dW = [[-1/4, 0], [1/4, 0]]
    # sample 2 (y=1): dz = [3/4, -3/4], dW = [[0, 3/4], [0, -3/4]]
    # sample 3 (y=0): dz = [-1/4, 1/4], dW = [[-1/4, -1/4], [1/4, 1/4]]
    # Fisher = mean over the 3 samples of the squares:
    #   W: [[(1/16 + 0 + 1/16) / 3, (0 + 9/16 + 1/16) / 3], same] = [[1/24, 5/24], [1/24, 5/24]]
    #   b: [(1/16 + 9/16 + 1/16) / 3] x 2 = [11/48, 11/48]
    # (the square of the batch-mean gradient would give b [1/144, 1/144]: not the Fisher)
    for batch in (2, 256):  # the batch only bounds memory
        fisher = fisher_diagonal(model, x, y, batch=batch)
        assert torch.allclose(fisher["weight"], torch.tensor([[1 / 24, 5 / 24], [1 / 24, 5 / 24]],
                                                             dtype=torch.float64), rtol=0, atol=1e-12)
        assert torch.allclose(fisher["bias"], torch.full((2,), 11 / 48, dtype=torch.float64),
                              rtol=0, atol=1e-12)
    assert model.training  # the mode is restored


def plan_bytes(method: str, client: int = 0, round_: int = 0) -> tuple[float, float]:
    exp = experiment(method)
    w = exp.method.plan(round_, client, exp.pool.state(client, round_)).workload
    return w.download_bytes, w.upload_bytes


def test_extra_bytes_of_scaffold_and_fedcurv():
    down, up = plan_bytes("fedavg_at")
    # SCAFFOLD: c down, delta c up: one model's parameters each way
    s_down, s_up = plan_bytes("scaffold_at")
    assert (s_down - down, s_up - up) == (PARAM_BYTES, PARAM_BYTES)
    # FedCurv: sum F_j and sum F_j w_j down (2x params), its own Fisher up (1x params)
    for m in ("fedcurv_at", "feddynat"):
        c_down, c_up = plan_bytes(m)
        assert (c_down - down, c_up - up) == (2 * PARAM_BYTES, PARAM_BYTES), m
    # fedavg_dynat and the penalty/aggregation-only methods send nothing extra
    for m in ("fedavg_dynat", "fedprox_at", "sfat", "gma"):
        assert plan_bytes(m) == (down, up), m


# ============================================================================== SCAFFOLD

SCAFFOLD = ("training.momentum=0.0", "training.weight_decay=0.0", "training.local_iters=3",
            "training.lr=0.05", "training.lr_decay=0.5")


def set_params(model: nn.Module, value: float) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.fill_(value)


def test_scaffold_after_local_control_variate_by_hand():
    exp = experiment("scaffold_at", *SCAFFOLD)
    method = exp.method
    names = [n for n, _ in method.model.named_parameters()]
    method.c = {n: torch.full_like(p, 0.1) for n, p in method.model.named_parameters()}
    method.c_local[4] = {n: torch.full_like(p, 0.3) for n, p in method.model.named_parameters()}
    set_params(method.model, 1.0)  # x
    local = copy.deepcopy(method.model)
    set_params(local, 0.7)  # y_k
    # round 2: lr = 0.05 x 0.5^2 = 0.0125; K = 3: (x - y) / (K lr) = 0.3 / 0.0375 = 8
    # c_k+ = c_k - c + 8 = 0.3 - 0.1 + 8 = 8.2; delta c = 8.2 - 0.3 = 7.9
    plan = method.plan(2, 4, exp.pool.state(4, 2))
    assert (plan.lr, plan.workload.iterations) == (pytest.approx(0.0125), 3)
    update = ClientUpdate(4, {}, 58, 0.0)
    method.after_local(2, 4, local, update, plan)
    for n in names:
        assert torch.allclose(update.extra["c_local"][n], torch.full_like(method.c[n], 8.2), atol=1e-5), n
        assert torch.allclose(update.extra["delta_c"][n], torch.full_like(method.c[n], 7.9), atol=1e-5), n
    # a first-time client has c_k = 0: c_k+ = 0 - 0.1 + 8 = 7.9 = delta c
    fresh = ClientUpdate(6, {}, 58, 0.0)
    method.after_local(2, 6, local, fresh, plan)
    for n in names:
        assert torch.allclose(fresh.extra["c_local"][n], torch.full_like(method.c[n], 7.9), atol=1e-5), n
        assert torch.allclose(fresh.extra["delta_c"][n], torch.full_like(method.c[n], 7.9), atol=1e-5), n


def test_scaffold_correction_adds_c_minus_ck():
    method = experiment("scaffold_at", *SCAFFOLD).method
    method.c = {n: torch.full_like(p, 0.5) for n, p in method.model.named_parameters()}
    method.c_local[2] = {n: torch.full_like(p, 0.2) for n, p in method.model.named_parameters()}
    for client, expected in ((2, 1.0 + 0.5 - 0.2), (3, 1.0 + 0.5 - 0.0)):  # g - c_k + c
        model = copy.deepcopy(method.model)
        for p in model.parameters():
            p.grad = torch.ones_like(p)
        method.hooks(0, client, model.state_dict()).correct(model)
        for n, p in model.named_parameters():
            assert torch.allclose(p.grad, torch.full_like(p, expected)), (client, n)


def test_scaffold_combine_moves_c_by_share_of_mean_delta():
    method = experiment("scaffold_at", *SCAFFOLD).method
    method.c = {n: torch.full_like(p, 0.1) for n, p in method.model.named_parameters()}
    template = method.model.state_dict()
    updates = [ClientUpdate(k, filled(template, value, 2), n, 0.0,
                            {"delta_c": {name: torch.full_like(c, dc) for name, c in method.c.items()},
                             "c_local": {}})
               for k, value, n, dc in ((0, 1.0, 10, 1.0), (5, 3.0, 30, 3.0))]
    out = method.combine(0, updates)
    # c + |S|/N mean(delta c) = 0.1 + 2/20 x (1 + 3)/2 = 0.1 + 0.2 = 0.3
    for n, c in method.c.items():
        assert torch.allclose(c, torch.full_like(c, 0.3)), n
    # the model: FedAvg, (10 x 1 + 30 x 3) / 40 = 2.5
    assert torch.allclose(out["conv2.0.weight"], torch.full_like(template["conv2.0.weight"], 2.5))


def test_scaffold_training_with_plain_sgd_makes_ck_the_mean_gradient():
    """y = x - lr sum_i (g_i - c_k + c) over K plain SGD steps, so option II's
    c_k+ = c_k - c + (x - y)/(K lr) is exactly the mean of the raw gradients g_i."""
    exp = experiment("scaffold_at", *SCAFFOLD)
    method = exp.method
    method.c = {n: torch.full_like(p, 0.01) for n, p in method.model.named_parameters()}
    method.c_local[0] = {n: torch.full_like(p, -0.02) for n, p in method.model.named_parameters()}
    raw: list[dict[str, torch.Tensor]] = []
    real_hooks = method.hooks

    def spy(round_, client, start):
        inner = real_hooks(round_, client, start)

        def correct(model):
            raw.append({n: p.grad.detach().clone() for n, p in model.named_parameters()})
            inner.correct(model)

        return Hooks(penalty=inner.penalty, correct=correct)

    method.hooks = spy
    plan = method.plan(1, 0, exp.pool.state(0, 1))
    assert plan.workload.iterations == 3
    update = method.train(1, 0, plan)
    assert len(raw) == 3
    for n, ck in update.extra["c_local"].items():
        mean = sum(g[n] for g in raw) / 3
        assert torch.allclose(ck, mean, atol=2e-5), n


# ============================================================================== FedProx


def test_proximal_penalty_gradient():
    # mu = 0.1, w = ([[1, 2]], [0.5]), anchor = ([[0, 1]], [1]):
    # mu/2 ||w - anchor||^2 = 0.05 x (1 + 1 + 0.25) = 0.1125; gradient mu (w - anchor) = [[0.1, 0.1]], [-0.05]
    anchor = {"weight": torch.tensor([[0.0, 1.0]]), "bias": torch.tensor([1.0])}
    exp = experiment("fedprox_at", "prox.mu=0.1")
    for hooks in (proximal(0.1, anchor), exp.method.hooks(0, 0, anchor)):
        check_penalty(hooks, 0.1125, ([[0.1, 0.1]], [-0.05]))


# ============================================================================== FedDynAT


@pytest.mark.parametrize(("t", "epochs"), [
    # floor(50 x 0.5^floor(t/5)): 50, 25, floor(12.5) = 12, floor(6.25) = 6, floor(3.125) = 3,
    # floor(1.5625) = 1, floor(0.78125) = 0 -> at least 1
    (0, 50), (1, 50), (4, 50), (5, 25), (9, 25), (10, 12), (14, 12), (15, 6), (20, 3), (25, 1), (30, 1),
    (100, 1)])
def test_epoch_schedule(t, epochs):
    assert epoch_schedule(t, DynConfig(e0=50, gamma=0.5, f=5)) == epochs


def test_epochs_to_iters():
    assert epochs_to_iters(50, 58, 32) == 91  # 2900 / 32 = 90.625 -> 91
    assert epochs_to_iters(1, 58, 32) == 2  # 58 / 32 = 1.81 -> 2
    assert epochs_to_iters(25, 57, 32) == 45  # 1425 / 32 = 44.53 -> 45
    assert epochs_to_iters(1, 64, 32) == 2  # exactly 2
    assert epochs_to_iters(0.1, 10, 32) == 1  # at least one step


def test_feddynat_is_fedcurv_and_fedavg_dynat_is_not():
    assert isinstance(experiment("feddynat").method, FedCurvAT)
    assert not isinstance(experiment("fedavg_dynat").method, FedCurvAT)


@pytest.mark.parametrize("method", ["feddynat", "fedavg_dynat"])
def test_dyn_plan_iterations_follow_schedule(method):
    exp = experiment(method, "dyn.e0=4", "dyn.gamma=0.5", "dyn.f=2", "training.local_iters=7")
    # E_t = floor(4 x 0.5^floor(t/2)): t = 0, 1 -> 4; 2, 3 -> 2; 4, 5 -> 1; 6 -> floor(0.5) = 0 -> 1
    schedule = {0: 4, 1: 4, 2: 2, 3: 2, 4: 1, 5: 1, 6: 1}
    for client in (0, 19):
        n = len(exp.ctx.splits[client].train)
        for t, e in schedule.items():
            w = exp.method.plan(t, client, exp.pool.state(client, t)).workload
            assert w.iterations == math.ceil(e * n / 32), (client, t)  # batch 32
    # (quickstart's clients hold 57-58 training samples: 4 x 58 / 32 = 7.25 -> 8, 2 x 58 / 32 = 3.6 -> 4,
    # 58 / 32 = 1.8 -> 2; the rounding itself is checked by hand in test_epochs_to_iters)
    assert exp.method.plan(0, 0, exp.pool.state(0, 0)).workload.iterations != 7  # not training.local_iters


# ============================================================================== the CLI, every method

@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS.names())  # every registered method, a new one included
def test_short_run_through_cli(method, tmp_path):
    out = tmp_path / "run"
    code = main(["run", str(QUICKSTART), "--out", str(out), "--quiet", "--set", f"method={method}",
                 "--set", "rounds=2", "--set", "training.local_iters=2", "--set", "attack.steps=1",
                 "--set", "evaluation.steps=1", "--set", "data.test_samples=32",
                 "--set", "fleet.sample_fraction=0.2", "--set", "dyn.e0=1", "--set", "distill.server_iters=2",
                 "--set", "device=\"cpu\""])
    assert code == 0
    with open(out / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["round"]) for r in rows] == [0, 1]
    for r in rows:
        assert int(r["clients"]) == 4  # 0.2 x 20
        assert math.isfinite(float(r["train_loss"])) and float(r["train_loss"]) > 0
    assert 0 <= float(rows[-1]["clean_acc"]) <= 1


def test_slack_weights_boost_every_client_tied_with_the_k_hat_th():
    # Alg. 1 line 8: P_k is raised where N_k/N L_k <= L_sorted[K-hat]; two clients tie at the
    # smallest score, so with K-hat = 1 both get (1 + 1/6) / (1 - 1/6) = 1.4: [1.4, 1.4, 1] / 3.8
    weights = slack_weights([0.2, 0.2, 0.9], [10, 10, 10], 1 / 6, 1)
    assert weights == pytest.approx([1.4 / 3.8, 1.4 / 3.8, 1 / 3.8])


# --- what the cost model charges for objectives and FedCurv ------------------------------------------

def test_flops_per_iteration_counts_trades_branches_and_forwards():
    # atoms: a (100 MACs, weights) then b (50 MACs, weights); forward = 2 x MACs = 200 + 100 = 300
    # a training pass = forward 300 + backward (input grads but the first atom: 100; weights: 300) = 700
    # TRADES with T = 2: batch 4 x (2 x 2 x 300 + 2 x 700 + 1 x 300) = 4 x 2900 = 11600
    a = AtomProfile("a", macs=100.0, params=1, in_elems=1, out_elems=1, saved_bytes=0.0, weighted_in_elems=1)
    b = AtomProfile("b", macs=50.0, params=1, in_elems=1, out_elems=1, saved_bytes=0.0, weighted_in_elems=1)
    w = Workload((a, b), batch=4, iterations=3, attack_steps=2, slots=0, download_bytes=0, upload_bytes=0,
                 train_pairs=2, extra_forwards=1, extra_flops=5.0)
    assert w.flops_per_iteration() == 11600
    assert w.flops() == 3 * 11600 + 5.0


@pytest.mark.parametrize(("objective", "pairs", "forwards"),
                         [("pgd_at", 1, 0), ("trades", 2, 1), ("mart", 2, 0)])
def test_workload_follows_the_objective(objective, pairs, forwards):
    exp = experiment("fedavg_at", f"training.objective={objective}", "training.warmup_rounds=1")
    warm = exp.method.plan(0, 0, exp.pool.state(0, 0)).workload  # clean warm-up round: plain CE
    assert (warm.train_pairs, warm.extra_forwards, warm.attack_steps) == (1, 0, 0)
    w = exp.method.plan(1, 0, exp.pool.state(0, 1)).workload
    assert (w.train_pairs, w.extra_forwards) == (pairs, forwards)


def test_fedcurv_charges_its_fisher_pass():
    exp = experiment("fedcurv_at")
    n = len(exp.ctx.splits[3].train)
    w = exp.method.plan(0, 3, exp.pool.state(3, 0)).workload
    assert w.extra_flops == n * train_pass_flops(exp.ctx.profile.atoms) > 0
    assert experiment("fedavg_at").method.plan(0, 3, exp.pool.state(3, 0)).workload.extra_flops == 0
