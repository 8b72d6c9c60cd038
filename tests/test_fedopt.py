"""The server optimizer of Reddi et al., "Adaptive Federated Optimization" (ICLR 2021, Alg. 2) and
server momentum (FedAvgM), against numbers worked by hand; the methods fedadam_at, fedyogi_at and
fedadagrad_at on the bundled digits.

The hand example: x_0 = [1, -2]; round 1, client A (1 sample) moved by [0.3, -0.1] and client B
(3 samples) by [0.1, 0.3], so Delta_1 = (1 x [0.3, -0.1] + 3 x [0.1, 0.3]) / 4 = [0.6, 0.8] / 4
= [0.15, 0.2]; round 2, A by [-0.1, 0.2] and B by [0.3, -0.2]: Delta_2 = [0.8, -0.4] / 4
= [0.2, -0.1]. eta = 0.5, beta1 = 0.5, beta2 = 0.75, tau = 0.1 (tau^2 = 0.01), for short sums.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from support import QUICKSTART

from edgefl.experiment import Experiment, prepare, run
from edgefl.methods.base import ClientUpdate
from edgefl.scenario import load_scenario
from edgefl.server.fedopt import ServerOpt, second_moment, server_step
from edgefl.server.mean import fedavg

X0 = [1.0, -2.0]
CLIENTS = [([0.3, -0.1], [0.1, 0.3]), ([-0.1, 0.2], [0.3, -0.2])]  # (A, B) per round
SAMPLES = [1, 3]


def t(values: list[float]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64)


def two_rounds(kind: str) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    opt = ServerOpt(kind, lr=0.5, beta1=0.5, beta2=0.75, tau=0.1)
    x, moments, xs = t(X0), {}, []
    for a, b in CLIENTS:
        delta = fedavg([{"p": t(a)}, {"p": t(b)}], SAMPLES)["p"]
        x, moments = server_step(x, delta, moments, opt)
        xs.append(x)
    return xs[0], xs[1], moments


def test_the_hand_example_pseudo_gradients():
    deltas = [fedavg([{"p": t(a)}, {"p": t(b)}], SAMPLES)["p"] for a, b in CLIENTS]
    assert torch.allclose(deltas[0], t([0.15, 0.2]), rtol=0, atol=1e-15)
    assert torch.allclose(deltas[1], t([0.2, -0.1]), rtol=0, atol=1e-15)


def test_sgd_is_fedavg_at_server_lr():
    x1, x2, moments = two_rounds("sgd")
    # x1 = [1, -2] + 0.5 [0.15, 0.2] = [1.075, -1.9]; x2 = x1 + 0.5 [0.2, -0.1] = [1.175, -1.95]
    assert torch.allclose(x1, t([1.075, -1.9]), rtol=0, atol=1e-12)
    assert torch.allclose(x2, t([1.175, -1.95]), rtol=0, atol=1e-12)
    assert moments == {}


def test_server_momentum():
    x1, x2, moments = two_rounds("momentum")
    # m1 = Delta_1 = [0.15, 0.2]; x1 = [1.075, -1.9]
    # m2 = 0.5 m1 + Delta_2 = [0.075 + 0.2, 0.1 - 0.1] = [0.275, 0]; x2 = x1 + 0.5 m2 = [1.2125, -1.9]
    assert torch.allclose(x1, t([1.075, -1.9]), rtol=0, atol=1e-12)
    assert torch.allclose(x2, t([1.2125, -1.9]), rtol=0, atol=1e-12)
    assert set(moments) == {"m"} and torch.allclose(moments["m"], t([0.275, 0.0]), rtol=0, atol=1e-12)


# the adaptive three share m: m1 = 0.5 x 0 + 0.5 Delta_1 = [0.075, 0.1];
# m2 = 0.5 m1 + 0.5 Delta_2 = [0.0375 + 0.1, 0.05 - 0.05] = [0.1375, 0]; Delta_1^2 = [0.0225, 0.04],
# Delta_2^2 = [0.04, 0.01]; x_t = x_{t-1} + 0.5 m_t / (sqrt(v_t) + 0.1)
ADAPTIVE_V = {
    # v1 = 0.01 + Delta_1^2 = [0.0325, 0.05]; v2 = v1 + Delta_2^2 = [0.0725, 0.06]
    "adagrad": ([0.0325, 0.05], [0.0725, 0.06]),
    # v1 = 0.75 x 0.01 + 0.25 Delta_1^2 = [0.0075 + 0.005625, 0.0075 + 0.01] = [0.013125, 0.0175]
    # v2 = 0.75 v1 + 0.25 Delta_2^2 = [0.00984375 + 0.01, 0.013125 + 0.0025] = [0.01984375, 0.015625]
    "adam": ([0.013125, 0.0175], [0.01984375, 0.015625]),
    # v1: 0.01 < Delta_1^2 in both, sign -1: 0.01 + 0.25 Delta_1^2 = [0.015625, 0.02]
    # v2: 0.015625 < 0.04 -> + 0.25 x 0.04 = 0.025625; 0.02 > 0.01 -> - 0.25 x 0.01 = 0.0175
    "yogi": ([0.015625, 0.02], [0.025625, 0.0175]),
}


@pytest.mark.parametrize("kind", list(ADAPTIVE_V))
def test_adaptive_servers_two_rounds(kind):
    (a1, b1), (a2, b2) = ADAPTIVE_V[kind]
    x1, x2, moments = two_rounds(kind)
    want1 = [1.0 + 0.5 * 0.075 / (math.sqrt(a1) + 0.1), -2.0 + 0.5 * 0.1 / (math.sqrt(b1) + 0.1)]
    want2 = [want1[0] + 0.5 * 0.1375 / (math.sqrt(a2) + 0.1), want1[1]]  # m2 = 0 on the second
    assert torch.allclose(x1, t(want1), rtol=0, atol=1e-12)
    assert torch.allclose(x2, t(want2), rtol=0, atol=1e-12)
    assert torch.allclose(moments["v"], t([a2, b2]), rtol=0, atol=1e-15)
    assert torch.allclose(moments["m"], t([0.1375, 0.0]), rtol=0, atol=1e-15)


def test_yogi_first_step_by_hand():
    # sqrt(0.015625) = 0.125: x1[0] = 1 + 0.5 x 0.075 / 0.225 = 1 + 1/6
    x1, _, _ = two_rounds("yogi")
    assert float(x1[0]) == pytest.approx(7 / 6, abs=1e-12)


def test_second_moments_beta2_0_99():
    # paper's beta2 = 0.99; v = [0.04, 0.25, 0.25], g = [0.3, 0.3, 0.5], g^2 = [0.09, 0.09, 0.25]
    v, g = t([0.04, 0.25, 0.25]), t([0.3, 0.3, 0.5])
    # Adam: 0.99 v + 0.01 g^2 = [0.0396 + 0.0009, 0.2475 + 0.0009, 0.2475 + 0.0025]
    assert torch.allclose(second_moment("adam", v, g, 0.99), t([0.0405, 0.2484, 0.25]), rtol=0, atol=1e-15)
    # Yogi: 0.04 < 0.09 -> + 0.0009; 0.25 > 0.09 -> - 0.0009; 0.25 = 0.5^2 -> sign 0, unchanged
    assert torch.allclose(second_moment("yogi", v, g, 0.99), t([0.0409, 0.2491, 0.25]), rtol=0, atol=1e-15)
    # Adagrad ignores beta2: v + g^2
    assert torch.allclose(second_moment("adagrad", v, g, 0.99), t([0.13, 0.34, 0.5]), rtol=0, atol=1e-15)


# ============================================================================== the methods

def experiment(method: str, *overrides: str) -> Experiment:
    scenario = load_scenario(QUICKSTART, [
        f"method={method}", "rounds=1", "training.local_iters=1", "attack.steps=1", "device=cpu",
        "evaluation.steps=1", "data.test_samples=32", "fleet.sample_fraction=0.1", *overrides])
    return prepare(scenario, str(QUICKSTART))


def shifted(method, shifts: tuple[float, float]) -> list[ClientUpdate]:
    """Two clients (1 and 3 samples): every float tensor of the global state plus their shift."""
    current = method.model.state_dict()
    moved = [{key: v + s if v.is_floating_point() else v.clone() for key, v in current.items()}
             for s in shifts]
    return [ClientUpdate(k, state, n, 0.0) for k, (state, n) in enumerate(zip(moved, SAMPLES, strict=True))]


def test_fedadam_at_steps_parameters_and_averages_buffers():
    method = experiment("fedadam_at").method
    before = copy.deepcopy(method.model.state_dict())
    params = {n for n, _ in method.model.named_parameters()}
    method.aggregate(0, shifted(method, (0.3, 0.1)))
    after = method.model.state_dict()
    # Delta = (0.3 + 3 x 0.1) / 4 = 0.15; defaults lr 0.01, beta1 0.9, beta2 0.99, tau 1e-3:
    # m = 0.1 x 0.15 = 0.015; v = 0.99 x 1e-6 + 0.01 x 0.0225 = 0.00000099 + 0.000225 = 0.00022599
    step = 0.01 * 0.015 / (math.sqrt(0.00022599) + 1e-3)
    for key, v in before.items():
        if key in params:
            assert torch.allclose(after[key], v + step, rtol=0, atol=1e-6), key
        elif v.is_floating_point():  # BN statistics: the plain average, + 0.15
            assert torch.allclose(after[key], v + 0.15, rtol=0, atol=1e-6), key
        else:
            assert torch.equal(after[key], v), key
    assert set(method.server.moments) == params


def test_moments_survive_a_checkpoint(tmp_path):
    method = experiment("fedyogi_at").method
    method.aggregate(0, shifted(method, (0.3, 0.1)))
    torch.save(method.state(), tmp_path / "state.pt")
    twin = experiment("fedyogi_at").method
    twin.load_state(torch.load(tmp_path / "state.pt", weights_only=True))
    mine, theirs = method.server.moments, twin.server.moments
    assert all(torch.equal(theirs[n][k], mine[n][k]) for n in mine for k in "mv")
    method.aggregate(1, shifted(method, (-0.2, 0.05)))
    twin.aggregate(1, shifted(twin, (-0.2, 0.05)))
    mine, theirs = method.model.state_dict(), twin.model.state_dict()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine)


@pytest.mark.parametrize("name", ["fedadam_at", "fedyogi_at", "fedadagrad_at"])
def test_a_real_round_changes_the_global_model(name, tmp_path):
    exp = experiment(name)
    before = copy.deepcopy(exp.method.model.state_dict())
    run(exp, tmp_path / "run", progress=False)
    after = exp.method.model.state_dict()
    moved = [k for k, _ in exp.method.model.named_parameters() if not torch.equal(before[k], after[k])]
    assert moved == [k for k, _ in exp.method.model.named_parameters()]
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())
    assert (tmp_path / "run" / "metrics.csv").read_text().count("\n") == 2  # header and round 0
