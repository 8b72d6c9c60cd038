"""FedDF-AT and FedET-AT (FedProphet §7.2) against hand-computed values.

FedDF: Lin et al., NeurIPS 2020, Alg. 3 (the target is the softmax of the teachers' mean logits).
FedET: Cho et al., IJCAI 2022, §3.2, as the FedProphet release's FedET_Server (confidence = the
variance of a teacher's logits over the classes; the consensus label is the argmax of the
confidence-weighted mean logits; CE to it plus lambda x the dissenting teachers' KL; the
classifier head shared up and down). With two classes, logits (a, b) have variance (a - b)^2 / 2
(unbiased, as torch.var).
"""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from support import QUICKSTART
from torch import nn

from edgefl.cli import main
from edgefl.config import CostConfig
from edgefl.errors import EdgeflError
from edgefl.experiment import Experiment, prepare
from edgefl.methods.base import ClientUpdate
from edgefl.methods.distill import DistillAT, choose_member, distil, distill_flops, head_keys
from edgefl.methods.feddf import feddf_loss
from edgefl.methods.fedet import fedet_loss, fedet_targets
from edgefl.scenario import load_scenario
from edgefl.sim.cost import WalkCost
from edgefl.sim.records import AtomProfile, ModelProfile

FAMILY = ['model.name="smallcnn"', 'distill.family=["smallcnn", "cnn3", "digits_cnn"]',
          "distill.public_samples=100", "distill.server_iters=2", "fleet.reserved_memory_mb=2.0"]
SHORT = ["rounds=1", "training.local_iters=1", "attack.steps=1", "evaluation.steps=1",
         "data.test_samples=40"]


def experiment(name: str, *overrides: str) -> tuple[Experiment, DistillAT]:
    scenario = load_scenario(QUICKSTART, [f"method={name}", "device=cpu", *FAMILY, *SHORT, *overrides])
    exp = prepare(scenario, str(QUICKSTART))
    assert isinstance(exp.method, DistillAT)
    return exp, exp.method


def log_probs(rows: list[list[list[float]]]) -> torch.Tensor:
    """Teacher logits whose softmax (T = 1) is the given probabilities: [K, B, C]."""
    return torch.tensor(rows, dtype=torch.float64).log()


# --- the largest member that fits -----------------------------------------------------------
@pytest.mark.parametrize(("memory", "chosen"), [
    (1000.0, "vgg16"),  # everything fits: the first (largest)
    (300.0, "vgg16"),  # exactly its need fits
    (260.0, "vgg13"),  # 300 > 260 >= 250
    (199.0, "cnn3"),  # 200 > 199 >= 20
    (10.0, "cnn3"),  # nothing fits: the member needing least (it swaps)
])
def test_the_largest_member_that_fits(memory: float, chosen: str) -> None:
    needs = [("vgg16", 300.0), ("vgg13", 250.0), ("vgg11", 200.0), ("cnn3", 20.0)]
    assert choose_member(needs, memory) == chosen


def test_when_nothing_fits_the_least_need_wins_whatever_the_order() -> None:
    assert choose_member([("a", 5.0), ("b", 3.0), ("c", 4.0)], 1.0) == "b"


def test_plan_trains_the_member_that_fits_the_client_memory() -> None:
    exp, m = experiment("feddf_at")
    state = exp.pool.state(0, 0)
    base = m.plan(0, 0, state).workload
    need = {n: WalkCost(CostConfig()).memory_need(replace(base, atoms=m.profiles[n].atoms)) for n in m.names}
    assert need["smallcnn"] > need["cnn3"] > need["digits_cnn"]
    for memory, chosen in [(need["smallcnn"], "smallcnn"), (need["smallcnn"] - 1, "cnn3"),
                           (need["cnn3"] - 1, "digits_cnn"), (1.0, "digits_cnn")]:
        s = replace(state, memory_bytes=memory)
        plan = m.plan(0, 0, s)
        assert plan.workload.atoms == m.profiles[chosen].atoms
        assert plan.workload.upload_bytes == plan.workload.download_bytes == m.bytes[chosen]
        assert plan.member == chosen
        m.plan_round(0, np.array([0]), {0: s})
        assert m.members == {0: chosen}  # what server_flops charges


def test_the_family_must_start_with_the_evaluated_model() -> None:
    with pytest.raises(EdgeflError, match=r"distill\.family"):
        experiment("feddf_at", 'distill.family=["cnn3", "smallcnn"]')


def test_a_member_that_does_not_fit_the_inputs_is_named() -> None:
    with pytest.raises(EdgeflError, match="vgg11 does not fit"):
        experiment("fedet_at", 'distill.family=["smallcnn", "vgg11"]')


# --- the distillation losses ----------------------------------------------------------------
@pytest.mark.parametrize(("temperature", "expected"), [
    # mean logits (2, 0); softmax (e^2, 1) / (e^2 + 1) = (0.880797, 0.119203) against the student's
    # (1/2, 1/2): 0.880797 ln(1.761594) + 0.119203 ln(0.238406) = 0.327813
    (1.0, 0.32781332547273767),
    # (2, 0) / 2 = (1, 0): (0.731059, 0.268941): 0.731059 ln(1.462117) + 0.268941 ln(0.537883)
    (2.0, 0.11094407167172735),
])
def test_feddf_distils_the_softmax_of_the_mean_logits(temperature: float, expected: float) -> None:
    teachers = torch.tensor([[[1.0, 0.0]], [[3.0, 0.0]]], dtype=torch.float64)  # [K=2, B=1, C=2]
    student = torch.zeros(1, 2, dtype=torch.float64)
    assert feddf_loss(student, teachers, temperature).item() == pytest.approx(expected, rel=1e-9)


def test_fedet_weighted_consensus_and_diversity_on_two_samples() -> None:
    teachers = torch.tensor([[[4.0, 0.0], [1.0, 0.0]],
                             [[0.0, 1.0], [3.0, 0.0]],
                             [[0.0, 1.0], [2.0, 0.0]]], dtype=torch.float64)  # [K=3, B=2, C=2]
    labels, dissent, mask = fedet_targets(teachers)
    # sample 1: confidences 16/2 = 8, 1/2, 1/2 (sum 9); weighted logits (32/9, 1/9): label 0,
    #   though two of the three teachers vote 1; they dissent: (0.5 (0, 1) + 0.5 (0, 1)) / 1 = (0, 1)
    # sample 2: confidences 0.5, 4.5, 2; every teacher says 0: label 0, no dissent, target 0
    assert labels.tolist() == [0, 0]
    assert dissent.flatten().tolist() == pytest.approx([0.0, 1.0, 0.0, 0.0], abs=1e-9)
    assert mask.tolist() == [True, False]
    # against zero student logits, lambda 0.05, T = 1: CE = ln 2 on each sample;
    # KL(softmax(0, 1) || 1/2) = 0.268941 ln 0.537883 + 0.731059 ln 1.462117 = 0.110944 on sample 1 only:
    # ln 2 + 0.05 x 0.110944 / 2 = 0.695921
    loss = fedet_loss(torch.zeros(2, 2, dtype=torch.float64), teachers, 1.0, 0.05)
    assert loss.item() == pytest.approx(math.log(2) + 0.05 * 0.11094407167172735 / 2, rel=1e-9)


def test_fedet_confidence_is_the_variance_of_the_logits_not_a_vote() -> None:
    # one teacher each way: (0, 3) has variance 4.5 against (2, 0)'s 2: label 1, (2, 0) dissents
    labels, dissent, mask = fedet_targets(torch.tensor([[[2.0, 0.0]], [[0.0, 3.0]]], dtype=torch.float64))
    assert labels.tolist() == [1]
    assert dissent[0].tolist() == pytest.approx([2.0, 0.0], rel=1e-9)
    assert mask.tolist() == [True]


def filled(state: dict[str, torch.Tensor], value: float) -> dict[str, torch.Tensor]:
    """`state` with every floating-point entry set to `value`."""
    return {k: torch.full_like(v, value) if v.is_floating_point() else v.clone() for k, v in state.items()}


def floats(model: nn.Module, keys: set[str] | None = None) -> set[float]:
    """The distinct values of the model's floating-point state entries (at `keys`, else all)."""
    state = model.state_dict()
    return {x for k, v in state.items() if v.is_floating_point() and (keys is None or k in keys)
            for x in v.flatten().tolist()}


def test_fedet_shares_the_head_up_and_down_and_keeps_its_server_model_apart() -> None:
    _, m = experiment("fedet_at", "distill.server_iters=0")  # the steps around the distillation only
    head = set(distill_head(m.model))
    server_before = {k: v.clone() for k, v in m.model.state_dict().items()}
    cnn3_before = {k: v.clone() for k, v in m.net("cnn3").state_dict().items()}
    big, small = m.net("smallcnn").state_dict(), m.net("digits_cnn").state_dict()
    updates = [ClientUpdate(0, filled(big, 1.0), 10, 0.0, {"member": "smallcnn"}),
               ClientUpdate(1, filled(big, 3.0), 30, 0.0, {"member": "smallcnn"}),
               ClientUpdate(2, filled(small, 7.0), 10, 0.0, {"member": "digits_cnn"})]
    m.aggregate(0, updates)
    # server model: its previous state, but the head is the plain mean of the 10 x 200 heads (1 + 3) / 2;
    # digits_cnn's 10 x 256 head has another shape and takes no part
    assert floats(m.model, head) == {2.0}
    for key, value in m.model.state_dict().items():
        if key not in head:
            assert torch.equal(value, server_before[key])
    # the clients' copy of smallcnn: FedAvg (10 x 1 + 30 x 3) / 40 = 2.5, then the server's head, 2
    assert floats(m.net("smallcnn"), set(big) - head) == {2.5}
    assert floats(m.net("smallcnn"), head) == {2.0}
    # digits_cnn keeps its average (7) head and all; cnn3, trained by nobody, is untouched
    assert floats(m.net("digits_cnn")) == {7.0}
    for key, value in m.net("cnn3").state_dict().items():
        assert torch.equal(value, cnn3_before[key])


def distill_head(model: nn.Module) -> tuple[str, str]:
    keys = head_keys(model)
    assert keys is not None
    return keys


def test_feddf_distils_every_member_even_one_nobody_trained() -> None:
    _, m = experiment("feddf_at")
    before = {n: {k: v.clone() for k, v in m.net(n).state_dict().items()} for n in m.names}
    state = m.net("smallcnn").state_dict()
    own = {k: v.clone() for k, v in state.items()}
    m.aggregate(0, [ClientUpdate(0, own, 10, 0.0, {"member": "smallcnn"})])
    for name in m.names:  # two Adam steps move every member, cnn3 and digits_cnn included
        after = m.net(name).state_dict()
        assert any(not torch.equal(after[k], v) for k, v in before[name].items())


LOSSES = {"feddf": lambda s, t: feddf_loss(s, t, 2.0), "fedet": lambda s, t: fedet_loss(s, t, 1.0, 0.05)}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_distillation_lowers_the_loss_on_a_toy_case(name: str) -> None:
    loss = LOSSES[name]
    torch.manual_seed(0)
    x = torch.randn(64, 4)
    teachers = [nn.Linear(4, 3), nn.Linear(4, 3), nn.Linear(4, 3)]
    student = nn.Linear(4, 3)

    def full() -> float:
        with torch.no_grad():
            return loss(student(x), torch.stack([t(x) for t in teachers])).item()

    before = full()
    distil(student, teachers, x, loss, 60, 16, 0.05, torch.Generator().manual_seed(0))
    assert full() < 0.5 * before


# --- server time ----------------------------------------------------------------------------
def atom(name: str, macs: float, params: int) -> AtomProfile:
    return AtomProfile(name, macs, params, in_elems=1, out_elems=1, saved_bytes=0.0, weighted_in_elems=1)


def test_server_flops_by_hand() -> None:
    teacher_a = ModelProfile("a", (atom("a1", 10, 0), atom("a2", 20, 5)))  # forward 2 x 30 = 60
    teacher_b = ModelProfile("b", (atom("b1", 5, 2),))  # forward 10
    student = ModelProfile("s", (atom("s1", 100, 3), atom("s2", 50, 0)))
    # student per sample: forward 200 + 100 = 300; backward: weight gradients of s1 (200) and the
    # input gradient of s2 (100), none for s1's input: 300 + 300 = 600.
    # 3 steps x batch 4 x (60 + 10 + 600) = 8040
    assert distill_flops([teacher_a, teacher_b], student, 3, 4) == 8040


def test_both_count_a_teacher_per_client_feddf_a_student_per_member() -> None:
    flops = {}
    for name in ("feddf_at", "fedet_at"):
        _, m = experiment(name)
        m.members = {0: "smallcnn", 1: "smallcnn", 2: "digits_cnn"}
        flops[name] = m.server_flops(0)
    teachers = [m.profiles[n] for n in ("smallcnn", "smallcnn", "digits_cnn")]
    # batch min(64, 100) = 64, 2 server steps; FedET distils its server model, FedDF every member
    assert flops["fedet_at"] == distill_flops(teachers, m.profiles["smallcnn"], 2, 64)
    assert flops["feddf_at"] == pytest.approx(
        sum(distill_flops(teachers, m.profiles[n], 2, 64) for n in m.names), rel=1e-12)
    # only clients 0 and 2 arrive (a deadline round): only their models teach (FedET's server model)
    arrived = [m.profiles[n] for n in ("smallcnn", "digits_cnn")]
    assert m.server_flops(0, [0, 2]) == distill_flops(arrived, m.profiles["smallcnn"], 2, 64)
    assert m.server_flops(0, []) == 0.0  # no update arrived: the round distils nothing


# --- end to end -----------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("name", ["feddf_at", "fedet_at"])
def test_one_round_through_the_cli(name: str, tmp_path: Path) -> None:
    args = ["run", str(QUICKSTART), "--set", f"method={name}"]
    for item in [*FAMILY, *SHORT]:
        args += ["--set", item]
    assert main([*args, "--out", str(tmp_path), "--quiet"]) == 0
    with open(tmp_path / "metrics.csv") as f:
        (row,) = list(csv.DictReader(f))
    assert float(row["server_s"]) > 0
    assert math.isfinite(float(row["clean_acc"]))
    with open(tmp_path / "clients.csv") as f:
        needs = {int(r["mem_req_bytes"]) for r in csv.DictReader(f)}
    assert len(needs) >= 2  # the microcontrollers train a smaller member than the phones


def test_the_state_restores_every_member() -> None:
    _, saved = experiment("fedet_at")
    _, fresh = experiment("fedet_at", "seed=1")
    for p in saved.small.parameters():
        p.data.add_(1.0)
    fresh.load_state(saved.state())
    for name in saved.names:
        for key, value in saved.net(name).state_dict().items():
            assert torch.equal(fresh.net(name).state_dict()[key], value)
