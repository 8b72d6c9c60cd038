"""FedProphet (Tang, Wang et al.): partition (Alg. 1), the release's MemReq, DMA (Eq. 12-13), APA
(Eq. 9-10), stage control, the partial average (Eq. 14-15), the strong-convexity term (Eq. 7), the
L2 feature attack, workloads, and a digits run end to end.

Expected values come from the paper's formulas and REFERENCE.md ("The release's cost accounting":
MemReq = 4 B x (s P + batch F), s = 3 for SGD with momentum; VGG16-BN / CIFAR-10 / batch 64 needs
301.7 MB and 7 modules at R_min = 60 MB; ResNet34 / Caltech-256 / batch 32 needs 1130.5 MB and 7
modules at 224 MB).
"""

from __future__ import annotations

import copy
import csv
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from edgefl.attacks.pgd import PGD
from edgefl.attacks.pgd_l2 import PGDL2
from edgefl.cli import main
from edgefl.config import CostConfig
from edgefl.devices.pool import DeviceState
from edgefl.errors import EdgeflError
from edgefl.experiment import Experiment, prepare, run
from edgefl.methods.aggregate import partial_average
from edgefl.methods.fedprophet.cascade import Exit, cascade_loss, feature_attack, output_perturbation
from edgefl.methods.fedprophet.coordinator import (
    StageControl,
    accuracy_ratio,
    adjust_alpha,
    assign_modules,
    stage_score,
)
from edgefl.methods.fedprophet.knobs import FedProphetConfig
from edgefl.methods.fedprophet.method import FedProphet, spread_sample, stage_control
from edgefl.methods.fedprophet.partition import Estimator, aux_head, head_profile, partition, partition_model
from edgefl.models import build_model
from edgefl.profiling import profile_model
from edgefl.scenario import load_scenario
from edgefl.sim.cost import PaperCost, make_cost_model
from edgefl.sim.records import AtomProfile, ModelProfile, paper_mem_req

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scenarios"
QUICKSTART = SCENARIOS / "fedprophet-quickstart.toml"
TINY = ["rounds=4", "training.local_iters=2", "attack.steps=2", "evaluation.steps=2",
        "data.test_samples=64", "fedprophet.val_samples=64", "fedprophet.apa_samples=64"]
INPUT_EPS = 0.2  # attack.eps of the quickstart
MB = 1e6


def single_thread(fn):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


def atom(name: str, params: int, weighted: int, out: int, macs: float = 100.0) -> AtomProfile:
    return AtomProfile(name=name, macs=macs, params=params, in_elems=out, out_elems=out, saved_bytes=0.0,
                       weighted_in_elems=weighted, out_shape=(out,))


# --- 1. partition in the release's accounting ------------------------------------------------------

PAPER_MODELS = {
    # name: (model, classes, input shape, scenario, batch, R_min MB, whole MemReq MB, params)
    "vgg16": ("vgg16", 10, (3, 32, 32), "fedprophet-cifar10.toml", 64, 60.0, 301.7, 15.25e6),
    "resnet34": ("resnet34", 256, (3, 224, 224), "fedprophet-caltech256.toml", 32, 224.0, 1130.5, 21.42e6),
}


@pytest.fixture(scope="module", params=list(PAPER_MODELS))
def paper_case(request: pytest.FixtureRequest):
    name, classes, shape, scenario, batch, r_min, whole, params = PAPER_MODELS[request.param]

    def build() -> ModelProfile:
        model = build_model(name, classes, shape, [0.5] * shape[0], [0.25] * shape[0])
        return profile_model(model, name)

    profile = single_thread(build)
    s = load_scenario(SCENARIOS / scenario)
    return profile, classes, shape, s, batch, r_min, whole, params


def test_scenarios_carry_the_papers_settings(paper_case):
    _, _, _, s, batch, r_min, _, _ = paper_case
    assert s.cost.accounting == "paper"
    assert s.training.batch_size == batch
    assert s.training.optimizer == "sgd" and s.training.momentum > 0
    assert s.fleet.reserved_memory_mb == r_min


def test_whole_model_memreq_matches_the_release(paper_case):
    profile, _, _, _, batch, _, whole, params = paper_case
    # the release's figures are given to four digits: 1e-3 holds their rounding
    assert profile.params == pytest.approx(params, rel=1e-3)
    # SGD with momentum: one optimizer slot, the release's s = 3
    assert paper_mem_req(profile.atoms, batch, 1) / MB == pytest.approx(whole, rel=1e-3)


def test_partition_gives_the_papers_seven_modules(paper_case):
    profile, classes, _, s, batch, r_min, _, _ = paper_case
    need, modules = partition_model(profile, classes, s, "test", make_cost_model(s.cost))
    assert (need.batch, need.slots, need.classes) == (batch, 1, classes)
    assert isinstance(need.cost, PaperCost)
    assert len(modules) == 7
    # contiguous, in order, covering every atom once
    assert modules[0].start == 0
    assert modules[-1].stop == len(profile.atoms)
    for a, b in itertools.pairwise(modules):
        assert b.start == a.stop
    assert [n for m in modules for n in m.names] == [a.name for a in profile.atoms]
    assert [m.index for m in modules] == list(range(7))
    for m in modules:
        assert m.stop > m.start
        assert m.names == tuple(a.name for a in profile.atoms[m.start:m.stop])
        assert m.mem_bytes <= r_min * MB
        assert m.out_shape == profile.atoms[m.stop - 1].out_shape
    assert modules[-1].head is None
    assert all(m.head is not None for m in modules[:-1])


def test_partition_is_greedy(paper_case):
    """Alg. 1: a module closes only when its next atom (with the head that would then follow it)
    no longer fits R_min. The last atom holds the classifier: a module ending there needs no head."""
    profile, classes, _, s, _, r_min, _, _ = paper_case
    need, modules = partition_model(profile, classes, s, "test", make_cost_model(s.cost))
    atoms = profile.atoms
    for mod, nxt in itertools.pairwise(modules):
        i = nxt.start
        head = head_profile(atoms[i].out_shape, classes) if i < len(atoms) - 1 else None
        assert need(atoms[mod.start:i + 1], head) > r_min * MB, (mod.names, atoms[i].name)
        # and the module as closed fits, with its own head
        closed = head_profile(atoms[mod.stop - 1].out_shape, classes)
        assert need(atoms[mod.start:mod.stop], closed) <= r_min * MB


def test_module_mem_and_flops_are_its_atoms_and_head(paper_case):
    profile, classes, _, s, _, _, _, _ = paper_case
    need, modules = partition_model(profile, classes, s, "test", make_cost_model(s.cost))
    for m in modules:
        run_ = profile.atoms[m.start:m.stop]
        head = None if m is modules[-1] else head_profile(run_[-1].out_shape, classes)
        assert m.head == head
        assert m.mem_bytes == pytest.approx(need(run_, head))
        assert m.flops == pytest.approx(sum(a.flops for a in run_) + (head.flops if head else 0.0))


@pytest.fixture(scope="module")
def vgg() -> ModelProfile:
    model = build_model("vgg16", 10, (3, 32, 32), [0.5] * 3, [0.25] * 3)
    return single_thread(lambda: profile_model(model, "vgg16"))


def cifar(r_min: float):
    return load_scenario(SCENARIOS / "fedprophet-cifar10.toml", [f"fleet.reserved_memory_mb={r_min}"])


def test_an_atom_that_cannot_fit_r_min_is_named(vgg):
    """conv1 of VGG16-BN (Conv 3->64 without bias + BN: P = 1728 + 128; its conv and BN read
    3x32x32 + 64x32x32 = 68608 elements), with the release's head (64 channels >= 10 classes:
    ceil(sqrt(10 / 64)) = 1, global average pooling, then Linear(64, 10): 650 parameters):
    4 x (3 x 1856 + 64 x 68608) + 4 x (64 x (65536 + 10) + 3 x 650) = 34 373 496 B."""
    profile = vgg
    assert profile.atoms[1].name == "conv1"
    conv1 = 4 * (3 * 1856 + 64 * 68608) + 4 * (64 * (65536 + 10) + 3 * 650)
    assert conv1 == 34_373_496
    with pytest.raises(EdgeflError) as err:
        partition_model(profile, 10, cifar(34.3), "cifar.toml", PaperCost(CostConfig()))
    text = str(err.value)
    assert "atom conv1 " in text and "34.373" in text
    assert err.value.where == "cifar.toml" and err.value.key == "fleet.reserved_memory_mb"
    # conv1 fits at 34.4 MB; conv2 (38.2 MB with its head) does not
    with pytest.raises(EdgeflError, match="atom conv2 "):
        partition_model(profile, 10, cifar(34.4), "cifar.toml", PaperCost(CostConfig()))


def sized(*sizes: int) -> list[AtomProfile]:
    return [atom(f"a{i}", params=n, weighted=0, out=4) for i, n in enumerate(sizes)]


def additive(atoms, head) -> float:
    """A MemReq that is the atoms' sizes plus the head's (sizes in `params`)."""
    return sum(a.params for a in atoms) + (head.params if head is not None else 0)


def test_partition_closes_a_module_when_the_next_atom_would_not_fit():
    """Atom sizes 3, 4, 2, 5, 1; every head costs 1, but the last atom's head costs 0 (a module
    ending there has none either way)."""
    atoms = sized(3, 4, 2, 5, 1)
    heads = sized(1, 1, 1, 1, 0)

    def cut(r_min: float) -> list[tuple[list[int], float]]:
        return [([int(n[1:]) for n in m.names], m.mem_bytes)
                for m in partition(atoms, heads, additive, r_min, where="w")]

    # 3+4+2 + 1 = 10 fits, + 5 does not; then 5+1 with no head
    assert cut(10) == [([0, 1, 2], 10), ([3, 4], 6)]
    assert cut(9) == [([0, 1], 8), ([2, 3, 4], 8)]
    assert cut(6) == [([0], 4), ([1], 5), ([2], 3), ([3, 4], 6)]
    assert cut(100) == [([0, 1, 2, 3, 4], 15)]
    modules = partition(atoms, heads, additive, 10, where="w")
    assert [m.head for m in modules] == [heads[2], None]
    assert [(m.start, m.stop, m.index) for m in modules] == [(0, 3, 0), (3, 5, 1)]
    assert [m.flops for m in modules] == [2 * 100 * 4, 2 * 100 * 2]  # atoms' + head's 2 x MACs
    with pytest.raises(EdgeflError, match="atom a3 "):  # 5 + 1 > 5
        partition(atoms, heads, additive, 5, where="w")
    # under the swap walk's accounting a3 (6 with its head) becomes a module the walk pages
    paged = partition(atoms, heads, additive, 5, where="w", paged=True)
    assert [([int(n[1:]) for n in m.names], m.mem_bytes) for m in paged] == [
        ([0], 4), ([1], 5), ([2], 3), ([3], 6), ([4], 1)]


def test_the_last_atom_is_judged_without_a_head():
    """The module ending at the last atom has no head (its mem_bytes counts none), so whether the
    last atom fits, alone or joined to the module before it, must not count `heads[-1]`."""
    atoms = sized(3, 4, 2)
    heads = sized(1, 1, 100)
    modules = partition(atoms, heads, additive, 10, where="w")
    assert [(m.names, m.mem_bytes, m.head) for m in modules] == [(("a0", "a1", "a2"), 9, None)]
    modules = partition(atoms, heads, additive, 7, where="w")
    assert [(m.names, m.mem_bytes) for m in modules] == [(("a0",), 4), (("a1", "a2"), 6)]


def test_cli_partition_json(capsys: pytest.CaptureFixture[str]):
    assert single_thread(lambda: main(["partition", str(SCENARIOS / "fedprophet-cifar10.toml"),
                                       "--json"])) == 0
    rows = json.loads(capsys.readouterr().out)
    assert isinstance(rows, list) and len(rows) == 7
    for r in rows:
        assert {"atoms", "mem_bytes", "flops"} <= set(r)
        assert r["atoms"] and 0 < r["mem_bytes"] <= 60 * MB and r["flops"] > 0
    names = [n for r in rows for n in r["atoms"]]
    assert names[0] == "norm" and names[-1] == "conv13" and len(names) == len(set(names)) == 14


# --- 2. the Estimator by hand ------------------------------------------------------------------------

def test_estimator_paper_accounting_by_hand():
    """4 B x (s P + batch F) + 4 B x (batch x (out_elems + classes) + s x head params)."""
    a1 = atom("a1", params=10, weighted=20, out=6)
    a2 = atom("a2", params=7, weighted=9, out=4)
    head = atom("head", params=15, weighted=4, out=3)
    sgd_m = Estimator(batch=5, slots=1, classes=3, cost=PaperCost(CostConfig()))  # s = 3
    assert sgd_m([a1, a2], None) == 4 * (3 * 17 + 5 * 29)  # 784
    assert sgd_m([a1, a2], head) == 784 + 4 * (5 * (4 + 3) + 3 * 15)  # + 320
    assert sgd_m([a1], head) == 4 * (3 * 10 + 5 * 20) + 4 * (5 * (6 + 3) + 3 * 15)
    adam = Estimator(batch=5, slots=2, classes=3, cost=PaperCost(CostConfig()))  # s = 5
    assert adam([a1, a2], head) == 4 * (5 * 17 + 5 * 29) + 4 * (5 * 7 + 5 * 15)
    sgd = Estimator(batch=5, slots=0, classes=3, cost=PaperCost(CostConfig()))  # s = 2
    assert sgd([a1, a2], head) == 4 * (2 * 17 + 5 * 29) + 4 * (5 * 7 + 2 * 15)


# --- 3. Differentiated Module Assignment -------------------------------------------------------------

COSTS = [10.0, 5.0, 5.0, 20.0, 1.0]  # forward FLOPs of modules 0..4


def joint_flops(m: int):
    return lambda n: sum(COSTS[m:n + 1])


def everything_fits(_n: int) -> bool:
    return True


def test_dma_memory_limited():
    assert assign_modules(0, 5, lambda n: n <= 2, joint_flops(0), perf=100.0, perf_min=1.0) == 2
    assert assign_modules(1, 5, lambda n: n <= 3, joint_flops(1), perf=100.0, perf_min=1.0) == 3
    assert assign_modules(0, 5, everything_fits, joint_flops(0), perf=100.0, perf_min=1.0) == 4


def test_dma_flops_limited():
    # perf / perf_min = 2: at most 2 x 10 = 20 FLOPs from module 0: 0..2 costs 20, 0..3 costs 40
    assert assign_modules(0, 5, everything_fits, joint_flops(0), perf=6e9, perf_min=3e9) == 2
    # from module 1 at most 2 x 5 = 10: 1..2 costs 10, 1..3 costs 30
    assert assign_modules(1, 5, everything_fits, joint_flops(1), perf=6e9, perf_min=3e9) == 2
    # ratio 1.4: 14 allowed, 0..1 costs 15
    assert assign_modules(0, 5, everything_fits, joint_flops(0), perf=1.4, perf_min=1.0) == 0
    # ratio 4: 40 allowed, 0..3 costs 40, 0..4 costs 41
    assert assign_modules(0, 5, everything_fits, joint_flops(0), perf=4.0, perf_min=1.0) == 3


def test_dma_both_limits_take_the_tighter():
    assert assign_modules(0, 5, lambda n: n <= 1, joint_flops(0), perf=4.0, perf_min=1.0) == 1
    assert assign_modules(0, 5, lambda n: n <= 3, joint_flops(0), perf=2.0, perf_min=1.0) == 2


def test_dma_slowest_client_gets_only_module_m():
    for m in range(4):
        assert assign_modules(m, 5, everything_fits, joint_flops(m), perf=3e9, perf_min=3e9) == m
    assert assign_modules(4, 5, everything_fits, joint_flops(4), perf=100.0, perf_min=1.0) == 4


def test_dma_stops_at_the_first_module_that_fails():
    """M_k = n requires training m..n jointly: a failure at n ends the search even if a later
    n' would pass (never a gap)."""
    assert assign_modules(0, 5, lambda n: n != 2, joint_flops(0), perf=100.0, perf_min=1.0) == 1
    dip = [10.0, 15.0, 20.0, 10.0, 10.0]  # not a real cumulative cost: n = 1 fails, n = 2 passes

    def flops(n: int) -> float:
        return dip[n]

    assert assign_modules(0, 5, everything_fits, flops, perf=1.2, perf_min=1.0) == 0


@pytest.fixture
def digits() -> Experiment:
    return single_thread(lambda: prepare(load_scenario(QUICKSTART, TINY), "fedprophet-quickstart.toml"))


def device_state(exp: Experiment, memory: float, flops: float) -> DeviceState:
    return DeviceState(exp.pool.devices[0], "idle", memory, flops, "wifi", 1e6, 1e6, 0.01)


def test_last_module_through_the_method(digits: Experiment):
    method = digits.method
    modules = method.modules
    assert len(modules) >= 2
    slow = device_state(digits, 1e12, 1e9)
    fast = device_state(digits, 1e12, 100e9)
    method.plan_round(0, np.array([0, 1]), {0: slow, 1: fast})
    assert method.perf_min == 1e9
    assert method.last_module(slow) == 0
    # the whole backbone's FLOPs are well within 100 x module 1's
    assert sum(a.flops for a in digits.ctx.profile.atoms) <= 100 * modules[0].flops
    assert method.last_module(fast) == len(modules) - 1
    # Eq. 12: the fast client with only module 1's memory (with its head) trains module 1 alone
    atoms = digits.ctx.profile.atoms
    two = method.need(atoms[modules[0].start:modules[1].stop], modules[1].head)
    assert two > modules[0].mem_bytes
    assert method.last_module(device_state(digits, modules[0].mem_bytes, 100e9)) == 0
    assert method.last_module(device_state(digits, two - 1, 100e9)) == 0
    assert method.last_module(device_state(digits, two, 100e9)) >= 1


# --- 11. workloads -----------------------------------------------------------------------------------

def tensor_bytes(state: dict[str, torch.Tensor], keys: list[str]) -> int:
    total = 0
    for k in keys:
        v = state[k]
        assert v.dtype in (torch.float32, torch.int64), k
        total += v.numel() * (8 if v.dtype == torch.int64 else 4)
    return total


def test_workloads_carry_the_assigned_modules_and_head(digits: Experiment):
    method = digits.method
    atoms = digits.ctx.profile.atoms
    last = len(method.modules) - 1
    slow = device_state(digits, 1e12, 1e9)
    fast = device_state(digits, 1e12, 100e9)
    planned = method.plan_round(0, np.array([0, 1]), {0: slow, 1: fast})
    state = method.net.state_dict()
    mods = method.modules
    t = digits.scenario.training

    def keys(names: tuple[str, ...], head: int | None) -> list[str]:
        out = [k for k in state if k.startswith("model.") and k.split(".")[1] in names]
        return out + ([k for k in state if k.startswith(f"heads.{head}.")] if head is not None else [])

    # the slowest client: module 1 and its head
    p = method.plan(0, 0, slow)
    w = p.workload
    head = head_profile(atoms[mods[0].stop - 1].out_shape, digits.ctx.data.num_classes,
                        digits.scenario.knobs(FedProphetConfig).head_side)
    assert w.atoms == (*atoms[:mods[0].stop], head)
    expected = tensor_bytes(state, keys(tuple(a.name for a in atoms[:mods[0].stop]), 0))
    assert w.download_bytes == w.upload_bytes == expected
    assert (w.batch, w.iterations, w.attack_steps, w.slots) == (t.batch_size, t.local_iters, 2, 1)
    # the prophet: every module, no head after the last
    q = method.plan(0, 1, fast)
    w = q.workload
    assert (p.last, q.last) == (0, last)
    assert planned.by_client(np.array([0, 1])) == {0: p, 1: q}
    assert method.assignment == {0: 0, 1: last}
    assert w.atoms == tuple(atoms)
    everything = tensor_bytes(state, [k for k in state if k.startswith("model.")])
    assert w.download_bytes == w.upload_bytes == everything
    assert everything > expected


# --- 4. Adaptive Perturbation Adjustment -------------------------------------------------------------

def test_apa_raises_alpha_when_the_ratio_grew():
    assert adjust_alpha(0.3, ratio=2.2, previous=2.0, delta=0.05, step=0.1, floor=0.3) == pytest.approx(0.4)


def test_apa_lowers_alpha_when_the_ratio_fell_but_not_below_the_floor():
    assert adjust_alpha(0.5, ratio=1.8, previous=2.0, delta=0.05, step=0.1, floor=0.3) == pytest.approx(0.4)
    assert adjust_alpha(0.3, ratio=1.8, previous=2.0, delta=0.05, step=0.1, floor=0.3) == pytest.approx(0.3)
    assert adjust_alpha(0.35, ratio=1.0, previous=2.0, delta=0.05, step=0.1, floor=0.3) == pytest.approx(0.3)


def test_apa_keeps_alpha_within_the_band():
    for ratio in (1.91, 2.0, 2.09):
        assert adjust_alpha(0.4, ratio, 2.0, delta=0.05, step=0.1, floor=0.3) == 0.4
    # exactly (1 + Delta) x the previous ratio is not above it
    assert adjust_alpha(0.4, 1.05, 1.0, delta=0.05, step=0.1, floor=0.3) == 0.4


def test_accuracy_ratio():
    assert accuracy_ratio(0.6, 0.3) == pytest.approx(2.0)
    assert accuracy_ratio(0.5, 0.0) == math.inf


def test_apa_runs_every_tenth_of_a_stage_once_scored():
    # the release: 500 rounds a module, scored from its round 100 + 25; alpha moves at rounds
    # 150, 200, ... of the module (round % int(0.1 x 500) == 0 and round > 125)
    stage = StageControl(budget=500, warmup=100, grace=25, patience=50, started=1000)
    due = [age for age in range(500) if stage.apa_due(1000 + age)]
    assert due == list(range(150, 500, 50))
    small = StageControl(budget=24, warmup=0, grace=1, patience=12)  # int(2.4) = 2
    assert [age for age in range(24) if small.apa_due(age)] == list(range(2, 24, 2))


def test_apa_uses_the_mean_of_the_last_five_scored_ratios():
    stage = StageControl(budget=100, warmup=0, grace=2, patience=50)
    stage.record(0, 9.0, 100.0)  # before the grace: not kept
    stage.record(1, 9.0, 100.0)
    for r, ratio in enumerate([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0], start=2):
        stage.record(r, 0.1 * r, ratio)
    assert stage.recent_ratio() == pytest.approx((3 + 4 + 5 + 6 + 7) / 5)
    # Eq. 10 on that mean: 5.0 > 1.05 x 4.0 raises alpha by one step
    assert adjust_alpha(0.3, stage.recent_ratio(), 4.0, 0.05, 0.1, 0.3) == pytest.approx(0.4)
    stage.restart(9)
    assert stage.ratios == []


def test_stage_score_weights_robustness_by_the_last_ratio():
    # C + (C*_{m-1} / A*_{m-1}) A: the previous module ended at 0.9 / 0.45 = 2
    assert stage_score(0.8, 0.4, accuracy_ratio(0.9, 0.45)) == pytest.approx(0.8 + 2 * 0.4)
    assert stage_score(0.8, 0.4, 1.0) == pytest.approx(1.2)  # the first module: C + A
    # so a point of robustness counts double: 0.70 / 0.45 beats 0.85 / 0.36 (1.60 vs 1.57)
    assert stage_score(0.70, 0.45, 2.0) > stage_score(0.85, 0.36, 2.0)


def test_d_star_is_measured_at_the_best_alpha(digits: Experiment):
    method = digits.method
    method.m, method.d_star, method.alpha, method.lower = 1, 2.0, 0.7, 0.0
    state = copy.deepcopy(method.net.state_dict())
    method.best = (state, {}, 0.8, 0.4, 0.5)  # the best round had alpha 0.5
    method.restore_best()
    assert method.alpha == 0.5 and method.eps == pytest.approx(1.0)
    assert method.prev_ratio == pytest.approx(2.0)
    attack = method.apa_attack()
    steps = digits.scenario.attack.steps
    assert attack.eps == pytest.approx(1.0)
    assert attack.step_size == pytest.approx(2.5 * 1.0 / steps)  # the release's 2.5 eps / T


@pytest.mark.parametrize(("name", "kind"), [("pgd", PGD), ("fgsm", PGD), ("cw", PGD), ("none", PGD),
                                            ("pgd_l2", PGDL2)])
def test_d_star_of_the_first_module_is_pgd_in_the_norm_it_trained_in(name: str, kind: type) -> None:
    """Not FGSM: the loss ||module(z') - module(z)||^2 has no gradient at z' = z (but rounding),
    so FGSM, with no random start, would step by the sign of rounding noise; PGD starts at random."""
    scenario = load_scenario(QUICKSTART, [*TINY, f'attack.name="{name}"'])
    exp = single_thread(lambda: prepare(scenario, "q.toml"))
    assert exp.method.m == 0 and type(exp.method.apa_attack()) is kind


def test_feature_pgd_step_is_two_and_a_half_eps_over_t():
    attack = feature_attack(0.4, 10, 0.0)
    assert (attack.eps, attack.steps, attack.lower) == (0.4, 10, 0.0)
    assert attack.step_size == pytest.approx(0.1)


def test_validation_uses_the_evaluation_attack(digits: Experiment, monkeypatch: pytest.MonkeyPatch):
    seen = []
    monkeypatch.setattr("edgefl.methods.fedprophet.method.evaluate",
                        lambda model, x, y, attack: seen.append(attack) or (1.0, 0.5))
    digits.scenario.evaluation.steps = 20
    digits.scenario.attack.steps = 10
    assert digits.method.validate() == (1.0, 0.5)
    (attack,) = seen
    a = digits.scenario.attack
    assert (attack.steps, attack.eps, attack.step_size) == (20, a.eps, a.step_size)  # PGD-20


@pytest.mark.parametrize(("shape", "classes", "min_side", "pool", "features"), [
    ((32, 4, 4), 10, 0, 1, 32),  # C >= classes: ceil(sqrt(10 / 32)) = 1, global pooling
    ((64, 32, 32), 256, 0, 2, 256),  # Caltech-256: ceil(sqrt(256 / 64)) = 2
    ((8, 2, 2), 10, 0, None, 32),  # ceil(sqrt(10 / 8)) = 2 is the map itself: no pooling
    ((32, 4, 4), 10, 2, 2, 128),  # head_side = 2 keeps a 2 x 2 map
    ((16,), 10, 0, None, 16),  # a flat output: the linear layer alone
])
def test_aux_head_is_the_releases(shape, classes, min_side, pool, features):
    head = aux_head(shape, classes, min_side)
    pools = [m for m in head if isinstance(m, nn.AdaptiveAvgPool2d)]
    assert [p.output_size for p in pools] == ([] if pool is None else [pool])
    (linear,) = [m for m in head if isinstance(m, nn.Linear)]
    assert (linear.in_features, linear.out_features) == (features, classes)
    assert head(torch.zeros(2, *shape)).shape == (2, classes)


# --- 5. stage control --------------------------------------------------------------------------------

def test_stage_ends_when_the_budget_runs_out():
    stage = StageControl(budget=3, patience=10)
    for r, score in enumerate([0.1, 0.2, 0.3]):
        assert stage.record(r, score, 1.0)
        assert stage.done(r) == (r == 2)


def test_stage_ends_after_patience_rounds_without_improvement():
    stage = StageControl(budget=100, patience=2)
    assert stage.record(0, 0.5, 1.0)
    assert not stage.done(0)
    assert not stage.record(1, 0.4, 1.0)
    assert not stage.done(1)
    assert not stage.record(2, 0.5, 1.0)  # equal is no improvement
    assert stage.done(2)


def test_improvement_resets_the_patience():
    stage = StageControl(budget=100, patience=2)
    stage.record(0, 0.5, 1.0)
    stage.record(1, 0.4, 1.0)
    assert stage.record(2, 0.6, 1.0)
    assert not stage.done(2)
    stage.record(3, 0.1, 1.0)
    assert not stage.done(3)
    stage.record(4, 0.1, 1.0)
    assert stage.done(4)


def test_restart_gives_the_next_stage_its_own_budget():
    stage = StageControl(budget=2, patience=5)
    stage.record(0, 0.9, 1.0)
    stage.record(1, 0.95, 1.0)
    assert stage.done(1)
    stage.restart(2)  # the next stage's first round
    assert stage.record(2, 0.1, 1.0)  # a new stage keeps no best from the last one
    assert not stage.done(2)
    stage.record(3, 0.2, 1.0)
    assert stage.done(3)


def test_the_releases_schedule_for_500_rounds_a_module():
    # the release's CIFAR-10 run: 3500 rounds over 7 modules, adv_warmup 100, int(0.05 x 500) = 25
    # unscored rounds after it, patience int(0.1 x 500) = 50
    s = load_scenario(QUICKSTART, ["fedprophet.warmup_rounds=100"])
    stage = stage_control(3500, 7, s.knobs(FedProphetConfig))
    assert (stage.budget, stage.warmup, stage.grace, stage.patience) == (500, 100, 25, 50)
    stage.restart(1000)  # module 3 starts at round 1000
    assert stage.warming(1099) and not stage.warming(1100)
    for r in range(1000, 1125):  # warm-up and grace: nothing scored, the patience cannot run
        assert not stage.record(r, 0.0 if r % 2 else 1.0, 1.0)
        assert not stage.done(r)
    assert stage.record(1125, 0.5, 1.0)  # the first scored round is the module's round 125
    for r in range(1126, 1175):
        assert not stage.record(r, 0.5, 1.0) and not stage.done(r)
    assert not stage.record(1175, 0.4, 1.0)
    assert stage.done(1175)  # 50 scored rounds without gain: the module trained 176 rounds


def test_patience_is_at_least_one_round():
    s = load_scenario(QUICKSTART, ["fedprophet.patience=0.1"])
    # budget 8: int(0.8) = 0 would end every stage at once
    stage = stage_control(24, 3, s.knobs(FedProphetConfig))
    assert (stage.budget, stage.grace, stage.patience) == (8, 0, 1)


def test_the_learning_rate_restarts_for_every_module(digits: Experiment):
    lr, decay = digits.scenario.training.lr, 0.9
    digits.scenario.training.lr_decay = decay
    assert digits.ctx.lr(7) == pytest.approx(lr * decay**7)
    assert digits.ctx.lr(7, 5) == pytest.approx(lr * decay**2)  # the module began at round 5
    assert digits.ctx.lr(5, 5) == pytest.approx(lr)


def test_later_modules_train_at_the_stage_lr_decay(digits: Experiment):
    method, t = digits.method, digits.scenario.training
    t.lr, t.lr_decay = 0.05, 0.9
    method.cfg.stage_lr_decay = 0.1
    method.m, method.stage.started = 2, 10  # module 3 began at round 10
    assert method.lr(13) == pytest.approx(0.05 * 0.9**3 * 0.1**2)


def test_clean_warm_up_at_the_start_of_every_module(digits: Experiment):
    method = digits.method
    method.stage.warmup = 2
    fast = device_state(digits, 1e12, 100e9)
    for r in range(4):
        method.plan_round(r, np.array([0]), {0: fast})
        assert method.plan(r, 0, fast).workload.attack_steps == (0 if r < 2 else 2)
    method.dry = True  # no d* to measure
    method.next_module(4)
    for r in range(4, 7):  # the next module warms up again
        method.plan_round(r, np.array([0]), {0: fast})
        assert method.m == 1
        assert method.plan(r, 0, fast).workload.attack_steps == (0 if r < 6 else 2)


def test_dry_run_modules_follow_module_rounds(tmp_path: Path):
    def modules(*sets: str) -> list[int]:
        exp = prepare(load_scenario(QUICKSTART, [*TINY, "rounds=6", *sets]), "q.toml", dry_run=True)
        run(exp, tmp_path / "_".join(sets or ("none",)), progress=False)
        _, rows = read_csv(tmp_path / "_".join(sets or ("none",)) / "metrics.csv")
        return [int(r["module"]) for r in rows]

    assert modules() == [1, 1, 1, 2, 2, 2]  # ceil(6 / 2) rounds each
    assert modules("fedprophet.module_rounds=[1, 5]") == [1, 2, 2, 2, 2, 2]
    assert modules("fedprophet.module_rounds=[4, 2]") == [1, 1, 1, 1, 2, 2]
    # the run stops when the last module's stage ends, as the release (federated_main.py:410-413)
    assert modules("fedprophet.module_rounds=[1, 2]") == [1, 2, 2]


def test_a_run_that_ends_before_its_last_module_is_evaluated_on_the_modules_it_trained(tmp_path: Path):
    """Two rounds of a first module given four: the run ends at module 1 of 2, so the model it
    reports is module 1 with its head (the release's 1..stage), not a backbone whose module 2
    never trained."""
    exp = prepare(load_scenario(QUICKSTART, [*TINY, "rounds=2", "fedprophet.module_rounds=[4, 2]"]), "q.toml",
                  dry_run=True)
    run(exp, tmp_path / "r", progress=False)
    method = exp.method
    assert isinstance(method, FedProphet) and method.final and method.m == 0 and len(method.modules) == 2
    model = method.global_model()
    assert model is not method.net.model
    assert [type(x) for x in model] == [type(x) for x in method.cascade(0)]


def test_a_round_after_a_stage_ends_is_priced_for_the_next_module_when_its_clients_are_picked(
        tmp_path: Path, monkeypatch):
    """memory_fit prices round t's workload before round t's clients are picked (workload_need):
    with module_rounds = [1, 3], round 0 trains module 1 and rounds 1-2 module 2, so round 1's
    pick must already see module 2's workload, and the metrics still say which module trained."""
    from edgefl.selection.server import Selection

    seen: list[tuple[int, int]] = []
    pick = Selection.pick

    def spy(self: Selection, round_: int, *args, **kwargs):
        seen.append((round_, exp.method.m))
        return pick(self, round_, *args, **kwargs)

    monkeypatch.setattr(Selection, "pick", spy)
    scenario = load_scenario(QUICKSTART, [*TINY, "rounds=3", "fedprophet.module_rounds=[1, 3]",
                                          'selection.policy="memory_fit"'])
    exp = prepare(scenario, "q.toml", dry_run=True)
    run(exp, tmp_path / "out", progress=False)
    assert seen == [(0, 0), (1, 1), (2, 1)]
    _, rows = read_csv(tmp_path / "out" / "metrics.csv")
    assert [int(r["module"]) for r in rows] == [1, 2, 2]


def test_a_real_run_ends_with_its_last_module_and_resumes_to_nothing_more(tmp_path: Path, monkeypatch):
    """Validation that never improves: with patience 1 each module ends one round after its first
    scored round, so module 1 is rounds 0-1, module 2 rounds 2-3, and the run stops after round 3 of
    10, evaluated and checkpointed; resumed as if killed before its summary, it trains no further
    round."""
    monkeypatch.setattr(FedProphet, "validate", lambda self: (0.5, 0.25))
    sets = [*TINY, "rounds=10", "fedprophet.warmup_rounds=0", "fedprophet.grace=0",
            "fedprophet.patience=0.1"]
    out = tmp_path / "run"
    run(prepare(load_scenario(QUICKSTART, sets), "q.toml"), out, progress=False)
    _, rows = read_csv(out / "metrics.csv")
    assert [int(r["module"]) for r in rows] == [1, 1, 2, 2]
    assert rows[-1]["clean_acc"] != ""
    (out / "summary.json").unlink()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    _, again = read_csv(out / "metrics.csv")
    assert again == rows
    assert json.loads((out / "summary.json").read_text())["rounds"] == 4


def test_module_rounds_of_the_wrong_length_is_one_line():
    with pytest.raises(EdgeflError, match=r"fedprophet\.module_rounds.*3 round counts.*2 modules"):
        prepare(load_scenario(QUICKSTART, [*TINY, "fedprophet.module_rounds=[1, 2, 3]"]), "q.toml",
                dry_run=True)


# --- 6. partial average ------------------------------------------------------------------------------

def test_partial_average_eq_14_15():
    g = {"w": torch.tensor([1.0, 1.0]), "head": torch.tensor([5.0]), "kept": torch.tensor([7.0, -7.0]),
         "count": torch.tensor(100)}
    a = {"w": torch.tensor([2.0, -4.0]), "count": torch.tensor(2)}
    b = {"w": torch.tensor([6.0, 8.0]), "count": torch.tensor(10)}
    c = {"head": torch.tensor([3.0])}
    out = partial_average(g, [a, b, c], [1.0, 3.0, 5.0])
    assert torch.allclose(out["w"], torch.tensor([(1 * 2 + 3 * 6) / 4, (1 * -4 + 3 * 8) / 4]))  # 5, 5
    assert torch.equal(out["head"], torch.tensor([3.0]))
    assert torch.equal(out["kept"], g["kept"])
    assert out["count"].dtype == torch.int64 and int(out["count"]) == (1 * 2 + 3 * 10) // 4  # 8
    assert set(out) == set(g)
    assert torch.equal(g["w"], torch.tensor([1.0, 1.0]))  # the global state is not modified


# --- 7. the strong-convexity term (Eq. 7) ------------------------------------------------------------

def test_mu_term_gradient_on_the_module_output():
    torch.manual_seed(0)
    batch, features, classes, mu = 6, 5, 4, 0.3
    fc = nn.Linear(features, classes)
    exit_ = Exit(nn.Sequential(nn.Identity()), fc)
    z = torch.randn(batch, features)
    y = torch.randint(0, classes, (batch,))

    def grad(mu_: float) -> torch.Tensor:
        zz = z.clone().requires_grad_(True)
        (g,) = torch.autograd.grad(cascade_loss(exit_, zz, y, mu_), zz)
        return g

    # CE alone, by hand: (softmax(W z + b) - onehot(y)) W / batch
    with torch.no_grad():
        p = torch.softmax(fc(z), dim=1) - nn.functional.one_hot(y, classes).float()
        ce = p @ fc.weight / batch
    assert torch.allclose(grad(0.0), ce, atol=1e-6)
    assert torch.allclose(grad(mu), ce + mu * z / batch, atol=1e-6)
    # and the loss value: CE + mean over the batch of mu / 2 ||z||^2
    with torch.no_grad():
        value = nn.functional.cross_entropy(fc(z), y) + mu / 2 * (z**2).sum(1).mean()
        assert float(cascade_loss(exit_, z, y, mu)) == pytest.approx(float(value), rel=1e-6)


def test_the_last_module_adds_no_mu_term_to_the_logits():
    """Prop. 1's l_M = l: with no auxiliary head (the exit's head is the identity) the loss is the
    model's cross-entropy alone, whatever mu."""
    torch.manual_seed(0)
    stack = nn.Sequential(nn.Linear(5, 4))
    z, y = torch.randn(6, 5), torch.randint(0, 4, (6,))
    with torch.no_grad():
        loss = cascade_loss(Exit(stack, nn.Identity()), z, y, mu=0.3)
        assert float(loss) == float(nn.functional.cross_entropy(stack(z), y))


def test_d_star_and_validation_sample_every_clients_data():
    """Eq. 9 averages over all the clients' data: 15 of three clients' 30 indices, drawn from all
    three sets (not the first client's), sorted, the same for the same seed; all of them when n
    is larger."""
    parts = [np.arange(0, 10), np.arange(10, 20), np.arange(20, 30)]
    picked = spread_sample(parts, 15, seed=0)
    assert len(picked) == 15 and len(set(picked.tolist())) == 15 and list(picked) == sorted(picked)
    assert set((picked // 10).tolist()) == {0, 1, 2}
    assert np.array_equal(picked, spread_sample(parts, 15, seed=0))
    assert not np.array_equal(picked, spread_sample(parts, 15, seed=1))
    assert np.array_equal(spread_sample(parts, 100, seed=0), np.arange(30))


# --- 8. PGD in an L2 ball ----------------------------------------------------------------------------

def free(attack: PGDL2) -> PGDL2:
    """`attack` on unbounded features (no [0, 1] box, no lower bound), as these tests' inputs are."""
    attack.lower = attack.upper = None
    return attack


def test_pgd_l2_stays_in_the_ball_per_sample():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    x = torch.randn(10, 3, 2, 2)
    x[0] *= 100  # samples of very different sizes share no radius
    y = torch.randint(0, 3, (10,))
    eps = 0.3
    x_adv = free(PGDL2(eps=eps, step_size=0.2, steps=7))(model, x, y)
    assert x_adv.shape == x.shape
    norms = (x_adv - x).flatten(1).norm(dim=1)
    assert (norms <= eps * (1 + 1e-5)).all()
    assert (norms > 0).all()


def test_pgd_l2_projects_only_what_leaves_the_ball():
    """A loss -||x' - (x + c)||^2 with ||c|| = eps / 2 peaks inside the ball: normalised steps of
    size s end within s of x + c, not on the sphere."""
    torch.manual_seed(6)
    x = torch.randn(5, 4)
    c = torch.randn(5, 4)
    eps, s = 1.0, 0.02
    c = 0.5 * eps * c / c.norm(dim=1, keepdim=True)
    attack = free(PGDL2(eps=eps, step_size=s, steps=200))
    attack.loss = lambda out, target: -(out - target).pow(2).sum()
    x_adv = attack(nn.Identity(), x, x + c)
    assert ((x_adv - (x + c)).norm(dim=1) <= s * (1 + 1e-3)).all()


def test_pgd_l2_respects_the_lower_bound():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(8, 3))
    x = torch.relu(torch.randn(16, 8))  # post-ReLU features, many exact zeros
    y = torch.randint(0, 3, (16,))
    attack = free(PGDL2(eps=2.0, step_size=1.0, steps=5))
    attack.lower = 0.0
    x_adv = attack(model, x, y)
    assert float(x_adv.min()) >= 0.0
    assert ((x_adv - x).flatten(1).norm(dim=1) <= 2.0 * (1 + 1e-5)).all()
    attack.lower = None  # without a bound a large radius does go negative
    assert float(attack(model, x, y).min()) < 0.0


def test_pgd_l2_spends_its_budget_only_above_the_lower_bound():
    """The loss grows along w = (-1, 1) from x = (0, 1) with features bounded below by 0. As the
    release, each step moves delta by s = 0.1 / sqrt 2 per coordinate, projects it into the ball of
    eps = 0.5, then clips it so that x + delta >= 0: the first coordinate ends each step at 0, and
    the second settles where one step and projection give it back, d = eps (d + s) / sqrt(s^2 +
    (d + s)^2) = 0.4962. An unclipped delta would keep half its length in the first coordinate,
    which the bound then throws away: the second would reach only 0.5 / sqrt 2 = 0.354."""
    torch.manual_seed(4)
    w = torch.tensor([-1.0, 1.0])
    attack = free(PGDL2(eps=0.5, step_size=0.1, steps=50))
    attack.lower = 0.0
    attack.loss = lambda out, target: (out * w).sum()
    x_adv = attack(nn.Identity(), torch.tensor([[0.0, 1.0]]), torch.zeros(1))
    s, d = 0.1 / math.sqrt(2), 0.0
    for _ in range(1000):
        d = 0.5 * (d + s) / math.hypot(s, d + s)
    assert d == pytest.approx(0.4962, abs=1e-4)
    torch.testing.assert_close(x_adv, torch.tensor([[0.0, 1.0 + d]]), rtol=0, atol=1e-6)


def test_pgd_l2_reaches_the_boundary_on_a_linear_model():
    """Two-class linear model: the CE input gradient is p_wrong (w_wrong - w_true), the same
    direction at every point, so the L2-optimal perturbation is eps (w_wrong - w_true) / ||.||."""
    torch.manual_seed(3)
    fc = nn.Linear(6, 2)
    x = torch.randn(8, 6)
    y = torch.randint(0, 2, (8,))
    eps = 0.5
    x_adv = free(PGDL2(eps=eps, step_size=eps / 2, steps=40))(fc, x, y)
    with torch.no_grad():
        w = fc.weight
        direction = w[1 - y] - w[y]
        best = eps * direction / direction.norm(dim=1, keepdim=True)
    delta = x_adv - x
    assert torch.allclose(delta.norm(dim=1), torch.full((8,), eps), rtol=1e-4)
    assert torch.allclose(delta, best, atol=1e-3)


# --- 9. d* (Eq. 9) -----------------------------------------------------------------------------------

def test_output_perturbation_on_a_diagonal_linear_module():
    """z -> W z with W = diag(3, 1, -0.5, 0.2): the largest ||W d|| over ||d|| <= eps is
    eps x sigma_max(W) = 3 eps, reached along the first axis."""
    torch.manual_seed(4)
    lin = nn.Linear(4, 4, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.diag(torch.tensor([3.0, 1.0, -0.5, 0.2])))
    eps = 0.5
    x = torch.randn(32, 4)
    attack = free(PGDL2(eps=eps, step_size=eps / 2, steps=30))
    d_star = output_perturbation(nn.Sequential(), nn.Sequential(lin), x, attack)
    assert d_star == pytest.approx(3 * eps, rel=0.01)
    assert d_star <= 3 * eps * (1 + 1e-5)  # never beyond the operator norm


def test_output_perturbation_goes_through_the_prefix():
    """A fixed prefix z -> 2 z before the module changes the input it is measured on, not the
    bound: a linear module's output change depends only on the perturbation."""
    torch.manual_seed(5)
    lin = nn.Linear(3, 3, bias=False)
    with torch.no_grad():
        lin.weight.copy_(torch.diag(torch.tensor([0.5, 2.0, 1.0])))
    prefix = nn.Sequential(nn.Linear(3, 3, bias=False))
    with torch.no_grad():
        prefix[0].weight.copy_(2 * torch.eye(3))
    d_star = output_perturbation(prefix, nn.Sequential(lin), torch.randn(16, 3),
                                 free(PGDL2(eps=0.25, step_size=0.125, steps=30)))
    assert d_star == pytest.approx(2.0 * 0.25, rel=0.01)


# --- 10. digits end to end ---------------------------------------------------------------------------

def read_csv(path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        rows = list(reader)
        return list(reader.fieldnames or []), rows


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Path]:
    out = tmp_path_factory.mktemp("fedprophet") / "run"
    rc = single_thread(lambda: main(["run", str(QUICKSTART), "--out", str(out), "--quiet", *sets(TINY)]))
    return rc, out


@pytest.fixture(scope="module")
def api_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Experiment, Path]:
    out = tmp_path_factory.mktemp("fedprophet_api") / "run"

    def go() -> Experiment:
        exp = prepare(load_scenario(QUICKSTART, TINY), str(QUICKSTART))
        run(exp, out, progress=False)
        return exp

    return single_thread(go), out


def test_cli_run_trains_two_modules_without_swapping(cli_run: tuple[int, Path]):
    rc, out = cli_run
    assert rc == 0
    header, rows = read_csv(out / "metrics.csv")
    assert {"module", "eps", "alpha", "val_clean", "val_adv"} <= set(header)
    assert [int(r["round"]) for r in rows] == [0, 1, 2, 3]
    modules = [int(r["module"]) for r in rows]
    assert modules[0] == 1 and max(modules) == 2
    assert modules == sorted(modules)
    for r in rows:
        assert 0.0 <= float(r["val_clean"]) <= 1.0 and 0.0 <= float(r["val_adv"]) <= 1.0
        if int(r["module"]) == 1:
            assert float(r["eps"]) == pytest.approx(INPUT_EPS)
        else:
            assert float(r["eps"]) > 0 and float(r["eps"]) != pytest.approx(INPUT_EPS)
    _, clients = read_csv(out / "clients.csv")
    assert clients and all(int(c["swapped"]) == 0 for c in clients)


def test_feature_eps_is_alpha_times_d_star(api_run: tuple[Experiment, Path]):
    exp, out = api_run
    method = exp.method
    header, rows = read_csv(out / "metrics.csv")
    assert {"module", "eps", "alpha", "val_clean", "val_adv"} <= set(header)
    assert len(method.modules) == 2  # 4 rounds, 2 modules: a budget of 2 rounds each
    assert method.stage.budget == 2
    later = [r for r in rows if int(r["module"]) == 2]
    assert later, "module 2 was never trained"
    assert method.d_star > 0
    for r in later:
        alpha = float(r["alpha"])
        assert alpha >= exp.scenario.knobs(FedProphetConfig).alpha - 1e-9  # never below its start
        assert float(r["eps"]) == pytest.approx(alpha * method.d_star, abs=1e-5)
        assert float(r["eps"]) != pytest.approx(INPUT_EPS)
    _, clients = read_csv(out / "clients.csv")
    assert all(int(c["swapped"]) == 0 for c in clients)


def test_after_the_last_round_the_global_model_is_the_backbone(api_run: tuple[Experiment, Path]):
    exp, _ = api_run
    assert exp.method.final
    assert exp.method.global_model() is exp.method.net.model


def test_the_cli_and_the_api_run_agree(cli_run: tuple[int, Path], api_run: tuple[Experiment, Path]):
    _, cli_rows = read_csv(cli_run[1] / "metrics.csv")
    _, api_rows = read_csv(api_run[1] / "metrics.csv")
    keys = ("module", "eps", "alpha", "val_clean", "val_adv", "clean_acc", "adv_acc")
    assert [[r[k] for k in keys] for r in cli_rows] == [[r[k] for k in keys] for r in api_rows]


def test_how_a_run_is_evaluated_does_not_change_its_training(tmp_path: Path):
    """d* at module 2 draws PGD random starts from torch's global generator after the previous
    round's evaluation; evaluating every round, or every fourth with CW besides, must leave every
    training figure (loss, eps, alpha, validation) as it was."""
    def trained(name: str, evaluation: list[str]) -> list[dict[str, str]]:
        s = load_scenario(QUICKSTART, [*TINY, *evaluation])
        single_thread(lambda: run(prepare(s, str(QUICKSTART)), tmp_path / name, progress=False))
        rows = list(csv.DictReader((tmp_path / name / "metrics.csv").open()))
        keys = ("module", "train_loss", "eps", "alpha", "val_clean", "val_adv")
        return [{k: r[k] for k in keys} for r in rows]

    every = trained("every", ["evaluation.every=1"])
    assert [r["module"] for r in every] == ["1", "1", "2", "2"]  # d* measured once, at round 2
    assert trained("sparse", ["evaluation.every=4", 'evaluation.extra=["cw"]']) == every


def test_a_dry_run_writes_the_real_runs_columns_and_leaves_unmeasured_figures_empty(tmp_path: Path):
    """README: a dry run writes the same files with empty accuracy columns. FedProphet's validation
    and the feature eps of modules after the first need training: empty, not 0."""
    s = load_scenario(QUICKSTART, [*TINY, 'evaluation.extra=["fgsm"]'])
    run(prepare(s, str(QUICKSTART), dry_run=True), tmp_path / "dry", progress=False)
    rows = list(csv.DictReader((tmp_path / "dry" / "metrics.csv").open()))
    assert "fgsm_acc" in rows[0] and {r["fgsm_acc"] for r in rows} == {""}
    assert {r["val_clean"] for r in rows} == {r["val_adv"] for r in rows} == {""}
    assert [r["eps"] for r in rows if r["module"] == "2"] and all(
        r["eps"] == "" for r in rows if r["module"] == "2")
    assert all(float(r["eps"]) == s.attack.eps for r in rows if r["module"] == "1")


def test_fedprophet_refuses_clients_without_validation_slices() -> None:
    """APA and the stage score (Eq. 10) read the clients' validation accuracy: with
    data.val_fraction = 0 there is none, so the scenario is refused before work, naming the key."""
    with pytest.raises(EdgeflError) as info:
        prepare(load_scenario(QUICKSTART, [*TINY, "data.val_fraction=0"]), "q.toml", dry_run=True)
    assert info.value.key == "data.val_fraction"
