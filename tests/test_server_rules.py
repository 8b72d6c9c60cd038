"""The server rules (edgefl.server) against updates worked by hand from their papers' formulas, and
composed with client rules from the scenario alone (issue 53).

Each rule runs in float32 on a tiny model; its reference is worked in float64 (Python floats) from
the same float32 inputs, so the only difference is float32's rounding in the rule: a few operations
per coordinate, each within float32's unit roundoff u = 2^-24 of values below 4, so TOL = 64 u x 4
(about 1.5e-5) bounds two rounds with room to spare.

The FedOpt example (Reddi et al., ICLR 2021, Alg. 2; FedAvgM, Hsu et al. 2019): x_0 = [1, -2];
round 1, client A (1 sample) moves by [0.3, -0.1] and client B (3 samples) by [0.1, 0.3]; round 2,
A by [-0.1, 0.2] and B by [0.3, -0.2]. eta = 0.5, beta1 = 0.5, beta2 = 0.75, tau = 0.1.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch
from support import QUICKSTART
from torch import nn

from edgefl.errors import EdgeflError
from edgefl.experiment import Experiment, prepare, run
from edgefl.methods.base import method_class
from edgefl.methods.fedavg import FedAvgAT
from edgefl.methods.fedprox import FedProxAT
from edgefl.scenario import load_scenario
from edgefl.server import RULES, State, Updates
from edgefl.server.krum import krum_scores
from edgefl.server.trimmed_mean import trimmed

TOL = 64 * 2.0**-24 * 4
X0 = [1.0, -2.0]
MOVES = [([0.3, -0.1], [0.1, 0.3]), ([-0.1, 0.2], [0.3, -0.2])]  # (A, B) per round
SAMPLES = [1, 3]
OPT = ["server_lr=0.5", "beta1=0.5", "tau=0.1"]


def tiny() -> nn.Module:
    """One parameter `weight` of two coordinates, float32."""
    model = nn.Linear(2, 1, bias=False)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([X0]))
    return model


def rule(name: str, *sets: str, model: nn.Module | None = None):
    s = load_scenario(QUICKSTART, [f"server.rule={name}", *sets])
    return RULES.get(name)(s, model if model is not None else tiny())


def states(*rows: list[float]) -> list[State]:
    return [{"weight": torch.tensor([row], dtype=torch.float32)} for row in rows]


def two_rounds(server) -> list[float]:
    """The rule's x_1 and x_2 for the example, one after the other."""
    x, out = torch.tensor([X0], dtype=torch.float32), []
    for a, b in MOVES:
        moved = [x + torch.tensor([d]) for d in (a, b)]
        folded = Updates([{"weight": m} for m in moved], SAMPLES, [0.0, 0.0])
        x = server.combine(0, {"weight": x}, folded)["weight"]
        out += x[0].double().tolist()
    return out


def reference(v_update, eta: float = 0.5, b1: float = 0.5, tau: float = 0.1, adaptive: bool = True):
    """Alg. 2 per coordinate in float64 from the float32 inputs the rule sees: Delta the weighted
    mean of w_n - x; adaptive: m = b1 m + (1 - b1) Delta, v = v_update(v, Delta), x += eta m /
    (sqrt(v) + tau) from m = 0, v = tau^2; else (FedAvgM) m = b1 m + Delta, x += eta m. x_1 and x_2,
    one after the other."""
    f32 = lambda value: float(torch.tensor(value, dtype=torch.float32))  # noqa: E731
    x, m, v, out = [f32(c) for c in X0], [0.0, 0.0], [tau**2, tau**2], []
    for a, b in MOVES:
        wa, wb = ([f32(xi + d) for xi, d in zip(x, move, strict=True)] for move in (a, b))
        delta = [(1 * (wa[i] - x[i]) + 3 * (wb[i] - x[i])) / 4 for i in range(2)]
        for i in range(2):
            if adaptive:
                m[i] = b1 * m[i] + (1 - b1) * delta[i]
                v[i] = v_update(v[i], delta[i])
                x[i] = f32(x[i] + eta * m[i] / (math.sqrt(v[i]) + tau))
            else:
                m[i] = b1 * m[i] + delta[i]
                x[i] = f32(x[i] + eta * m[i])
        out += x
    return out


SECOND_MOMENTS = {  # Reddi et al. Alg. 2, beta2 = 0.75
    "fedadagrad": lambda v, g: v + g * g,
    "fedadam": lambda v, g: 0.75 * v + 0.25 * g * g,
    "fedyogi": lambda v, g: v - 0.25 * g * g * math.copysign(1.0, v - g * g) if v != g * g else v,
}


@pytest.mark.parametrize("name", sorted(SECOND_MOMENTS))
def test_fedopt_rules_two_rounds_of_reddi_alg_2(name: str) -> None:
    sets = [f"{name}.{kv}" for kv in OPT] + ([f"{name}.beta2=0.75"] if name != "fedadagrad" else [])
    server = rule(name, *sets)
    got, want = two_rounds(server), reference(SECOND_MOMENTS[name])
    assert got == pytest.approx(want, abs=TOL)
    # by hand, FedAdam's first step: Delta_1 = [0.15, 0.2], m_1 = [0.075, 0.1],
    # v_1 = 0.75 x 0.01 + 0.25 Delta_1^2 = [0.013125, 0.0175]; x_1 = x_0 + 0.5 m_1 / (sqrt(v_1) + 0.1)
    if name == "fedadam":
        assert want[:2] == pytest.approx([1 + 0.0375 / (math.sqrt(0.013125) + 0.1),
                                         -2 + 0.05 / (math.sqrt(0.0175) + 0.1)], abs=TOL)
    assert set(server.moments["weight"]) == {"m", "v"}


def test_fedavgm_two_rounds_of_server_momentum() -> None:
    server = rule("fedavgm", "fedavgm.server_lr=0.5", "fedavgm.momentum=0.5")
    got, want = two_rounds(server), reference(None, adaptive=False)
    # by hand: m_1 = Delta_1 = [0.15, 0.2], x_1 = [1.075, -1.9]; m_2 = 0.5 m_1 + [0.2, -0.1]
    # = [0.275, 0], x_2 = [1.2125, -1.9]
    assert want == pytest.approx([1.075, -1.9, 1.2125, -1.9], abs=TOL)
    assert got == pytest.approx(want, abs=TOL)


def test_fedavgm_defaults_are_hsu_et_al() -> None:
    server = rule("fedavgm")
    assert (server.opt.kind, server.opt.lr, server.opt.beta1) == ("momentum", 1.0, 0.9)


def test_median_of_odd_and_even_counts() -> None:
    # coordinate 0: [1, 5, 2] -> 2; coordinate 1: [-3, 0, 7] -> 0
    odd = rule("fedmedian").combine(0, {}, Updates(states([1, -3], [5, 0], [2, 7]), [1, 1, 1], [0] * 3))
    assert odd["weight"].tolist() == [[2.0, 0.0]]
    # even: [1, 5, 2, 10] -> (2 + 5) / 2 = 3.5; [-3, 0, 7, -1] -> (-1 + 0) / 2 = -0.5; samples ignored
    even = rule("fedmedian").combine(0, {}, Updates(states([1, -3], [5, 0], [2, 7], [10, -1]),
                                                    [100, 1, 1, 1], [0] * 4))
    assert even["weight"].tolist() == [[3.5, -0.5]]


def test_median_rounds_integer_buffers() -> None:
    ints = [{"n": torch.tensor(v)} for v in (3, 4, 8, 9)]  # (4 + 8) / 2 = 6
    assert trimmed(ints, 1)["n"].item() == 6 and trimmed(ints, 1)["n"].dtype == torch.int64


@pytest.mark.parametrize(("beta", "want"), [
    (0.0, (1 + 2 + 3 + 4 + 100) / 5),  # floor(0 x 5) = 0 dropped: the plain mean 22
    (0.1, (1 + 2 + 3 + 4 + 100) / 5),  # floor(0.5) = 0
    (0.2, (2 + 3 + 4) / 3),  # floor(1) = 1 dropped at each end: 3
    (0.4, 3.0),  # floor(2): the median
])
def test_trimmed_mean_drops_floor_beta_n_at_each_end(beta: float, want: float) -> None:
    values = [4, 100, 1, 3, 2]
    got = rule("trimmed_mean", f"trimmed_mean.beta={beta}").combine(
        0, {}, Updates(states(*[[v, -v] for v in values]), [1] * 5, [0] * 5))
    assert got["weight"][0].tolist() == pytest.approx([want, -want], rel=2.0**-22)  # float32 of 22 or 3


# Krum's 5 points (weight, bias) with f = 1: each scores its n - f - 2 = 2 nearest others
KRUM_POINTS = [(0, 0), (1, 0), (0, 2), (1, 1), (6, 5)]
# squared distances: P0 to P1..P4: 1, 4, 2, 61 -> 1 + 2 = 3
#                    P1 (1, 0): 1, 5, 1, 50 -> 1 + 1 = 2
#                    P2 (0, 2): 4, 5, 2, 45 -> 2 + 4 = 6
#                    P3 (1, 1): 2, 1, 2, 41 -> 1 + 2 = 3
#                    P4 (6, 5): 61, 50, 45, 41 -> 41 + 45 = 86
KRUM_SCORES = [3.0, 2.0, 6.0, 3.0, 86.0]


def test_krum_scores_five_points_by_hand() -> None:
    points = torch.tensor(KRUM_POINTS, dtype=torch.float64)
    assert krum_scores(points, 1).tolist() == KRUM_SCORES


@pytest.mark.parametrize(("m", "want"), [(1, (1.0, 0.0)), (3, (2 / 3, 1 / 3))])
def test_krum_picks_the_lowest_score_and_multi_krum_averages_the_m_lowest(m: int, want: tuple) -> None:
    model = nn.Linear(1, 1)
    updates = Updates([{"weight": torch.tensor([[float(w)]]), "bias": torch.tensor([float(b)])}
                       for w, b in KRUM_POINTS], [1, 1, 1, 1, 100], [0] * 5)
    got = rule("krum", "krum.f=1", f"krum.m={m}", model=model).combine(0, {}, updates)
    # m = 1: P1 (score 2); m = 3: P1, P0 and P3 (scores 2, 3, 3): ((1 + 0 + 1) / 3, (0 + 0 + 1) / 3)
    assert (got["weight"].item(), got["bias"].item()) == pytest.approx(want, abs=TOL)


def test_slack_boosts_the_lowest_loss_after_round_0() -> None:
    # N_k / N L_k = 1/4 x 0.8 = 0.2 and 3/4 x 0.1 = 0.075: client B boosted, weights 1 : 3 x 1.4
    server = rule("slack")  # alpha = 1/6: (1 + alpha) / (1 - alpha) = 1.4
    updates = Updates(states([0, 0], [1, 2]), SAMPLES, [0.8, 0.1])
    assert server.combine(0, {}, updates)["weight"][0].tolist() == pytest.approx([0.75, 1.5], abs=TOL)
    later = server.combine(1, {}, updates)["weight"][0].tolist()
    assert later == pytest.approx([4.2 / 5.2, 8.4 / 5.2], abs=TOL)


# ============================================================================== composition


def experiment(method: str, server_rule: str, *sets: str) -> Experiment:
    s = load_scenario(QUICKSTART, [
        f"method={method}", f"server.rule={server_rule}", "rounds=1", "training.local_iters=1",
        "attack.steps=1", "device=cpu", "evaluation.steps=1", "data.test_samples=32",
        "fleet.sample_fraction=0.25", *sets])
    return prepare(s, str(QUICKSTART))


@pytest.mark.parametrize(("method", "server_rule", "client"), [
    ("fedprox_at", "fedyogi", FedProxAT), ("fedavg_at", "gma", FedAvgAT),
    ("fedavg_at", "fedmedian", FedAvgAT), ("fedavg_at", "krum", FedAvgAT),
])
def test_a_client_rule_with_a_server_rule_runs_a_real_round(method: str, server_rule: str, client: type,
                                                            tmp_path) -> None:
    exp = experiment(method, server_rule)
    assert type(exp.method) is client and exp.method.server is not None
    assert type(exp.method.server) is RULES.get(server_rule)
    before = copy.deepcopy(exp.method.model.state_dict())
    run(exp, tmp_path / "run", progress=False)
    after = exp.method.model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in after)
    assert all(torch.isfinite(v).all() for v in after.values() if v.is_floating_point())
    assert (tmp_path / "run" / "metrics.csv").read_text().count("\n") == 2  # header and round 0


def test_fedprox_at_with_fedyogi_steps_the_mean_of_proximal_clients(tmp_path) -> None:
    """The composed server is FedYogi's: its moments hold every parameter once a round is folded, and
    a checkpoint names them `moments` (as fedyogi_at's did)."""
    exp = experiment("fedprox_at", "fedyogi")
    run(exp, tmp_path / "run", progress=False)
    params = {n for n, _ in exp.method.model.named_parameters()}
    assert set(exp.method.server.moments) == params
    assert set(exp.method.state()) == {"model", "local_states", "moments"}


def test_named_pairs_are_a_client_rule_and_a_server_rule() -> None:
    for method, server_rule in [("fedavg_at", "mean"), ("fedyogi_at", "fedyogi"), ("gma", "gma"),
                                ("sfat", "slack"), ("fedadam_at", "fedadam"), ("scaffold_at", "mean")]:
        s = load_scenario(QUICKSTART, [f"method={method}", "device=cpu"])
        assert type(prepare(s, str(QUICKSTART), dry_run=True).method.server) is RULES.get(server_rule)
    s = load_scenario(QUICKSTART, ["method=gma", 'gma.base="fedprox"'])
    assert method_class("gma", s) is FedProxAT and method_class("gma") is FedAvgAT


@pytest.mark.parametrize("method", ["heterofl_at", "feddf_at", "fedprophet"])
def test_methods_whose_updates_are_not_whole_models_refuse_a_server_rule(method: str) -> None:
    with pytest.raises(EdgeflError) as info:
        load_scenario(QUICKSTART, [f"method={method}", "server.rule=krum"])
    assert info.value.key == "server.rule" and "\n" not in info.value.fix
    assert f"method {method} folds its updates its own way" in info.value.fix
    assert "choose one of: fedadagrad_at, fedadam_at, fedavg_at, fedavg_dynat, fedcurv_at" in info.value.fix


def test_an_unknown_rule_is_refused_with_the_known_ones() -> None:
    with pytest.raises(EdgeflError) as info:
        load_scenario(QUICKSTART, ["method=fedavg_at", "server.rule=fedavgx"])
    assert info.value.key == "server.rule"
    assert info.value.fix == f"unknown 'fedavgx'; choose one of: {', '.join(RULES.names())}"
    for rule in ("mean", "fedavgm", "fedadam", "fedyogi", "fedadagrad", "gma", "slack", "fedmedian",
                 "trimmed_mean", "krum"):  # every rule the issue names, typed here, not read from RULES
        assert rule in RULES.names()


def test_capabilities_follow_the_steps_a_class_overrides() -> None:
    class Penalised(FedAvgAT):
        def hooks(self, round_, client, start):
            return super().hooks(round_, client, start)

    class Scheduled(FedAvgAT):
        def iterations(self, round_, client):
            return 1

    class Remembering(FedAvgAT):
        def after_local(self, round_, client, model, update, plan):
            pass

    assert (Penalised.groups, Penalised.bulk_plans, Penalised.takes_rule) == (False, True, True)
    assert (Scheduled.groups, Scheduled.bulk_plans, "async" in Scheduled.modes) == (True, False, True)
    assert (Remembering.takes_rule, Remembering.modes) == (True, ("sync", "deadline"))
