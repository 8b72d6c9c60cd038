"""FedDF-AT and FedET-AT (FedProphet §7.2) against hand-computed values.

FedDF: Lin et al., NeurIPS 2020, Alg. 3 (the target is the softmax of the teachers' mean logits).
FedET: Cho et al., IJCAI 2022, §3.2 (confidence = the variance of a teacher's prediction over the
classes; the confidence-weighted consensus of the teachers backing the majority label; lambda x the
dissenting teachers' KL). With two classes a prediction (a, 1 - a) has variance (a - 1/2)^2.
"""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from edgefl.cli import main
from edgefl.config import load_scenario
from edgefl.errors import EdgeflError
from edgefl.experiment import Experiment, prepare
from edgefl.methods.distill import DistillAT, choose_member, distil, distill_flops
from edgefl.methods.feddf import feddf_loss
from edgefl.methods.fedet import fedet_loss, fedet_targets
from edgefl.profiling.atoms import AtomProfile, ModelProfile
from edgefl.sim.cost import mem_need

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "scenarios" / "quickstart.toml"
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
    base = m.plan(0, 0, state)
    need = {n: mem_need(replace(base, atoms=m.profiles[n].atoms), "walk") for n in m.names}
    assert need["smallcnn"] > need["cnn3"] > need["digits_cnn"]
    for memory, chosen in [(need["smallcnn"], "smallcnn"), (need["smallcnn"] - 1, "cnn3"),
                           (need["cnn3"] - 1, "digits_cnn"), (1.0, "digits_cnn")]:
        s = replace(state, memory_bytes=memory)
        m.begin_round(0, {0: s})
        workload = m.plan(0, 0, s)
        assert workload.atoms == m.profiles[chosen].atoms
        assert workload.upload_bytes == workload.download_bytes == m.bytes[chosen]
        assert m.members == {0: chosen}


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
    teachers = log_probs([[[0.9, 0.1], [0.7, 0.3]],
                          [[0.6, 0.4], [0.8, 0.2]],
                          [[0.2, 0.8], [0.6, 0.4]]])  # [K=3, B=2, C=2]
    consensus, dissent, mask = fedet_targets(teachers, 1.0)
    # sample 1: votes 0, 0, 1 -> label 0 backed by teachers 1, 2 with confidences 0.4^2 = 0.16 and
    # 0.1^2 = 0.01: (0.16 x 0.9 + 0.01 x 0.6) / 0.17 = 15/17; teacher 3 dissents: (0.2, 0.8).
    # sample 2: all vote 0, confidences 0.04, 0.09, 0.01: (0.028 + 0.072 + 0.006) / 0.14 = 0.106/0.14.
    assert consensus[:, 0].tolist() == pytest.approx([15 / 17, 0.106 / 0.14], rel=1e-9)
    assert dissent[0].tolist() == pytest.approx([0.2, 0.8], rel=1e-9)
    assert mask.tolist() == [True, False]
    # against a uniform student, lambda 0.05:
    # KL(15/17, 2/17 || 1/2) = 15/17 ln(30/17) + 2/17 ln(4/17) = 0.330937
    # KL(0.757143, 0.242857 || 1/2) = 0.138796; KL(0.2, 0.8 || 1/2) = 0.2 ln 0.4 + 0.8 ln 1.6 = 0.192745
    # (0.330937 + 0.138796) / 2 + 0.05 x 0.192745 / 2 = 0.239685
    loss = fedet_loss(torch.zeros(2, 2, dtype=torch.float64), teachers, 1.0, 0.05)
    assert loss.item() == pytest.approx(0.23968503037321467, rel=1e-9)


def test_fedet_breaks_a_tied_vote_by_confidence() -> None:
    # one vote each; confidences 0.4^2 = 0.16 for label 0 against 0.2^2 = 0.04 for label 1
    consensus, dissent, mask = fedet_targets(log_probs([[[0.9, 0.1]], [[0.3, 0.7]]]), 1.0)
    assert consensus[0].tolist() == pytest.approx([0.9, 0.1], rel=1e-9)
    assert dissent[0].tolist() == pytest.approx([0.3, 0.7], rel=1e-9)
    assert mask.tolist() == [True]


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


def test_feddf_counts_a_teacher_per_client_fedet_one_per_member() -> None:
    flops = {}
    for name in ("feddf_at", "fedet_at"):
        _, m = experiment(name)
        m.members = {0: "smallcnn", 1: "smallcnn", 2: "digits_cnn"}
        flops[name] = m.server_flops(0)
    forward = sum(a.flops for a in m.profiles["smallcnn"].atoms)
    # the same student work; FedDF runs one more smallcnn forward per sample (2 teachers, not 1),
    # at batch min(64, 100) = 64 and 2 server steps
    assert flops["feddf_at"] - flops["fedet_at"] == pytest.approx(2 * 64 * forward, rel=1e-12)


# --- end to end -----------------------------------------------------------------------------
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


def test_the_state_restores_every_member_and_the_round_assignment() -> None:
    _, saved = experiment("fedet_at")
    _, fresh = experiment("fedet_at", "seed=1")
    for p in saved.small.parameters():
        p.data.add_(1.0)
    saved.members = {3: "cnn3"}
    fresh.load_state(saved.state())
    assert fresh.members == {3: "cnn3"}
    for name in saved.names:
        for key, value in saved.net(name).state_dict().items():
            assert torch.equal(fresh.net(name).state_dict()[key], value)
