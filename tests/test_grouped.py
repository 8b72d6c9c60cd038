"""Grouped training (edgefl.training.grouped) repeats one-by-one training, through the hand-made
grouped network, of Sequential CNNs and of traced module trees (a ResNet here).

G clients of one small CNN (conv + BatchNorm + ReLU + max-pool + linear head), each from its own
start state (weights and BN running statistics differ) on its own data (sizes differ), trained
together must end where `train_local` ends each of them one by one: same states (weights, BN
running statistics, batch counters) and same mean losses. In float64 the only differences are
summation order, so the tolerance on states is 1e-9 (a different batch, random start or BN
statistic would show as 1e-2 or more); losses are summed in float32 by both, so theirs is a relative
1e-6.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from support import QUICKSTART, adam_tolerance, longest_sum, trained_one_by_one
from torch import nn

from edgefl.attacks import make_attack
from edgefl.attacks.base import Attack, client_streams, uniform_like
from edgefl.config import TrainingConfig
from edgefl.executors import executor
from edgefl.executors.executor import LocalExecutor, train_timed_group
from edgefl.experiment import prepare
from edgefl.methods import METHODS, ClientPlan, ClientUpdate, fedavg
from edgefl.methods.fedavg import FedAvgAT
from edgefl.models import build_model
from edgefl.models.base import plain_cnn
from edgefl.scenario import load_scenario
from edgefl.sim.records import AtomProfile, mem_req
from edgefl.sim.workload import Workload
from edgefl.training.grouped import (
    ClientJob,
    GroupedFlatten,
    GroupedNet,
    OneChannelConv,
    State,
    group_sums,
    groupable,
    grouped_network,
    train_group,
)
from edgefl.training.local import (
    FP32,
    TrainSettings,
    client_seed,
    make_optimizer,
    seed_everything,
    train_local,
)
from edgefl.training.objectives import OBJECTIVES

TOL = 1e-9
LOSS_TOL = 1e-6
ITERS, BATCH = 3, 8
U32, U16 = 2.0**-24, 2.0**-8  # unit roundoff of float32 and bfloat16


def new_model() -> nn.Module:
    return plain_cnn([4, 6], [False, True], 3, (1, 6, 6), [0.4], [0.3]).double()


def clients(n: int) -> list[tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor]]:
    """n (start state, images, labels): each client's weights and BN statistics perturbed apart."""
    torch.manual_seed(5)
    out = []
    for k in range(n):
        model = new_model()
        with torch.no_grad():
            for t in model.state_dict().values():
                if t.is_floating_point():
                    t.add_(0.05 * torch.randn_like(t))
                    if t.dim() == 1:  # BN variances stay positive
                        t.abs_()
        model.get_submodule("conv1.1").num_batches_tracked.fill_(3 * k)
        size = 12 + 7 * k
        out.append((model.state_dict(), torch.rand(size, 1, 6, 6, dtype=torch.float64),
                    torch.randint(3, (size,))))
    return out


def one_by_one(jobs, cfg: TrainingConfig, attack, objective,  # type: ignore[no-untyped-def]
               settings: TrainSettings = FP32, dtype: torch.dtype = torch.float64):
    states, losses = [], []
    for k, (state, x, y) in enumerate(jobs):
        model = new_model().to(dtype)
        model.load_state_dict(state)
        gen = seed_everything(0, 7, k)  # after building the model: its init draws from torch's RNG
        losses.append(train_local(model, x, y, make_optimizer(list(model.parameters()), cfg, 0.1),
                                  ITERS, BATCH, attack, gen, objective, settings=settings))
        states.append(copy.deepcopy(model.state_dict()))
    return states, losses


@pytest.mark.parametrize(("objective", "optimizer", "attack"), [
    ("pgd_at", "sgd", "pgd"), ("trades", "sgd", "pgd"), ("mart", "adam", "pgd"), ("pgd_at", "sgd", None),
    ("pgd_at", "sgd", "pgd_l2"), ("pgd_at", "sgd", "fgsm"), ("trades", "sgd", "pgd_l2"),
    ("mart", "sgd", "cw")])
def test_grouped_training_repeats_one_by_one(objective: str, optimizer: str, attack: str | None) -> None:
    cfg = TrainingConfig(optimizer=optimizer, momentum=0.9, weight_decay=1e-3)
    atk = make_attack(attack, 0.1, 0.03, 3) if attack else None
    obj = OBJECTIVES.get(objective)(2.0)
    data = clients(3)
    want_states, want_losses = one_by_one(data, cfg, atk, obj)
    jobs = [ClientJob(s, x, y, client_seed(0, 7, k)) for k, (s, x, y) in enumerate(data)]
    assert_as_one_by_one(train_group(new_model(), jobs, cfg, 0.1, ITERS, BATCH, atk, obj),
                         (want_states, want_losses), data)


def assert_as_one_by_one(got: tuple[list[State], list[float]], want: tuple[list[State], list[float]],
                         data: list[tuple[State, torch.Tensor, torch.Tensor]], atol: float = TOL,
                         rtol: float = 0) -> None:
    """Grouped training's (states, losses) `got` equal one-by-one's `want` to `atol` and `rtol`, and
    every trained tensor moved from the client's start."""
    assert got[1] == pytest.approx(want[1], abs=0, rel=LOSS_TOL)
    for state, wanted, (start, _, _) in zip(got[0], want[0], data, strict=True):
        assert list(state) == list(wanted)
        for key, value in wanted.items():
            assert not torch.equal(value, start[key]) or "num_batches" in key or "norm" in key
            torch.testing.assert_close(state[key], value, atol=atol, rtol=rtol, msg=key)


def test_batch_counters_stay_per_client() -> None:
    data = clients(2)
    jobs = [ClientJob(s, x, y, client_seed(0, 7, k)) for k, (s, x, y) in enumerate(data)]
    states, _ = train_group(new_model(), jobs, TrainingConfig(), 0.1, ITERS, BATCH, None,
                            OBJECTIVES.get("pgd_at")())
    assert [int(s["conv1.1.num_batches_tracked"]) for s in states] == [ITERS, 3 + ITERS]


def test_folded_batchnorm_is_worked_out_anew_after_each_mode_switch() -> None:
    """Frozen eval passes keep the folded BatchNorm; a train-mode pass (here a no-grad one, which
    moves the running statistics without bumping their tensors' versions) must not leave it stale."""
    net = GroupedNet(new_model(), [new_model().state_dict() for _ in range(2)])
    x = torch.rand(8, 1, 6, 6, dtype=torch.float64)
    net.requires_grad_(False).eval()
    first = net(x)
    net.train()
    with torch.no_grad():
        net(3 * x)  # new running statistics
    net.eval()
    cached = net(x)
    net.requires_grad_(True)
    assert not torch.allclose(cached, first)
    assert torch.allclose(cached, net(x).detach(), rtol=0, atol=TOL)  # unfrozen: folded afresh each pass


def test_models_with_other_layers_group_or_are_refused() -> None:
    """The hand-made network takes Sequential CNNs and residual blocks (traced); a
    layer that draws random numbers (Dropout) or a cumulative-average BatchNorm cannot group."""
    assert groupable(new_model())
    assert isinstance(grouped_network(new_model(), [new_model().state_dict()] * 2), GroupedNet)
    resnet = build_model("resnet10", 3, (3, 8, 8), [0.5] * 3, [0.3] * 3)
    assert groupable(resnet)
    assert isinstance(grouped_network(resnet, [resnet.state_dict()] * 2), GroupedNet)
    odd = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Dropout(0.5))
    with pytest.raises(ValueError, match=r"layer 1 \(Dropout\) draws random numbers"):
        grouped_network(odd, [odd.state_dict()] * 2)
    with pytest.raises(ValueError, match="grouped form"):
        GroupedNet(odd, [odd.state_dict()] * 2)
    cumulative = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2, momentum=None))
    assert not groupable(cumulative)
    with pytest.raises(ValueError, match="momentum None"):
        grouped_network(cumulative, [cumulative.state_dict()] * 2)


def resnet_clients(n: int) -> tuple[Callable[[], nn.Module], list[tuple[State, torch.Tensor, torch.Tensor]]]:
    """A small float64 ResNet10 on 3x8x8 images (residual blocks, downsampling shortcuts) and n
    clients' perturbed start states (BN statistics and batch counters apart) and data."""
    def model() -> nn.Module:
        torch.manual_seed(1)
        return build_model("resnet10", 3, (3, 8, 8), [0.4] * 3, [0.3] * 3).double()

    out = []
    torch.manual_seed(6)
    for k in range(n):
        state = {key: (v + 0.05 * torch.randn_like(v)).abs() if v.dim() == 1 else
                 v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v + 2 * k
                 for key, v in model().state_dict().items()}
        size = 10 + 5 * k
        out.append((state, torch.rand(size, 3, 8, 8, dtype=torch.float64), torch.randint(3, (size,))))
    return model, out


@pytest.mark.parametrize(("objective", "optimizer"), [("pgd_at", "sgd"), ("trades", "adam")])
def test_a_resnet_trains_grouped_as_one_by_one(objective: str, optimizer: str) -> None:
    """Residual blocks group (the grouped network of the traced model, its small maps as matmuls):
    states (weights, each client's BN running statistics and batch counter) and losses as
    `train_local` one by one. Float64 summation order differs between the grouped and the single
    kernels (and between CPUs' kernels). Under SGD a
    state moves by a gradient's rounding times the learning rate: TOL and 1e-9 relative hold with
    room. Adam's step lr g / (|g| + eps) turns a rounding dg of a near-zero gradient into up to
    (lr / eps) dg, and the weights carry that into every BN statistic computed from them; a float64
    gradient's sum of n terms rounds by up to n u, so Adam's states agree to (lr / eps) n u
    absolute and relative (5e-6 here, n = 4,608). A wrong batch, start or statistic moves them by
    1e-2 or more."""
    model, data = resnet_clients(3)
    cfg = TrainingConfig(optimizer=optimizer, momentum=0.9, weight_decay=1e-3)
    atk, obj = make_attack("pgd", 0.1, 0.03, 2), OBJECTIVES.get(objective)(2.0)
    want = trained_one_by_one(model, data, cfg, 0.1, ITERS, BATCH, atk, obj)
    jobs = [ClientJob(s, x, y, client_seed(0, 7, k)) for k, (s, x, y) in enumerate(data)]
    torch.set_num_threads(1)  # one part: the three clients in one grouped network
    got = train_group(model(), jobs, cfg, 0.1, ITERS, BATCH, atk, obj)
    adam = adam_tolerance(0.1, model())
    assert_as_one_by_one(got, want, data, *((adam, adam) if optimizer == "adam" else (TOL, 1e-9)))
    counters = [int(s["layer1_1.bn1.num_batches_tracked"]) for s in got[0]]  # each its own: 0, 2, 4 at start
    assert counters == [2 * k + ITERS * obj.train_pairs for k in range(3)]


def test_a_run_whose_clients_cannot_group_says_why_once(capsys: pytest.CaptureFixture[str]) -> None:
    """FedProx adds to local training: with grouping on, its clients train one by one and the run
    says so once on stderr, naming the method."""
    exp = prepare(load_scenario(QUICKSTART, ['method="fedprox_at"']), str(QUICKSTART), dry_run=True)
    plan = ClientPlan(Workload(exp.ctx.profile.atoms, 32, 3, 3, 1, 0.0, 0.0), exp.ctx.attack_for(0), 0.05)
    plans = dict.fromkeys(range(4), plan)
    for _ in range(2):
        assert [list(g) for g in executor.groups(exp.method, 0, plans)] == [[0], [1], [2], [3]]
    err = capsys.readouterr().err
    assert err == ("edgefl: note: clients train one by one, not grouped: method FedProxAT changes local "
                   "training beyond what grouped training does\n")


def test_a_batchnorm_without_affine_or_running_statistics_groups() -> None:
    """A BatchNorm with no state at all (batch statistics only, no scale or shift) groups and
    trains as one by one: both normalise each client's batch by its own statistics."""
    def bare() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Conv2d(1, 3, 3, padding=1), nn.BatchNorm2d(3, affine=False,
                             track_running_stats=False), nn.ReLU(), nn.Flatten(), nn.Linear(108, 3)).double()

    data = [(bare().state_dict(), x, y) for _, x, y in clients(2)]
    cfg, atk, obj = TrainingConfig(), make_attack("pgd", 0.1, 0.03, 2), OBJECTIVES.get("pgd_at")()
    jobs = [ClientJob(s, x, y, client_seed(0, 7, k)) for k, (s, x, y) in enumerate(data)]
    states, _ = train_group(bare(), jobs, cfg, 0.1, ITERS, BATCH, atk, obj)
    wanted = trained_one_by_one(bare, data, cfg, 0.1, ITERS, BATCH, atk, obj)[0]
    for (start, _, _), got, want in zip(data, states, wanted, strict=True):
        for key, value in want.items():
            assert not torch.equal(value, start[key])
            torch.testing.assert_close(got[key], value, atol=TOL, rtol=0, msg=key)


def test_random_draws_follow_each_client_stream() -> None:
    gens = [torch.Generator().manual_seed(s) for s in (1, 2)]
    with client_streams(gens):
        x = uniform_like(torch.empty(4, 3), -1, 1)
    for rows, seed in zip(x.chunk(2), (1, 2), strict=True):
        torch.manual_seed(seed)
        assert torch.equal(rows, torch.empty(2, 3).uniform_(-1, 1))


class GlobalDraw(Attack):
    """An attack that draws its start from torch's global generator, not through uniform_like."""

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x + 0.01 * torch.rand_like(x)).clamp(0, 1)


def test_grouped_training_leaves_the_global_generator_alone() -> None:
    """Random starts come from the clients' generators and the grouped layers are not randomly
    initialised (their weights are the clients'): torch's global stream is as one-by-one left it."""
    jobs = [ClientJob(s, x, y, client_seed(0, 7, k)) for k, (s, x, y) in enumerate(clients(2))]
    model, before = new_model(), torch.random.get_rng_state()
    train_group(model, jobs, TrainingConfig(), 0.1, ITERS, BATCH, make_attack("pgd", 0.1, 0.03, 2),
                OBJECTIVES.get("pgd_at")())
    assert torch.equal(torch.random.get_rng_state(), before)


def test_grouped_training_refuses_draws_from_the_global_generator() -> None:
    jobs = [ClientJob(s, x, y, client_seed(0, 7, k)) for k, (s, x, y) in enumerate(clients(2))]
    with pytest.raises(RuntimeError, match="global random generator"):
        train_group(new_model(), jobs, TrainingConfig(), 0.1, ITERS, BATCH, GlobalDraw(),
                    OBJECTIVES.get("pgd_at")())


def work(flops: float) -> ClientPlan:
    """One iteration of batch 1 through one weightless atom: 2 MACs x forward = `flops`."""
    atom = AtomProfile("a", flops / 2, 0, 1, 1, 0.0, 1)
    return ClientPlan(Workload((atom,), 1, 1, 0, 1, 0.0, 0.0), None, 0.1)


class Keyed:
    """A method stand-in: clients 1, 3 and 4 share a key, 2 has another alone, 5 trains alone."""

    def __init__(self, group_clients: bool) -> None:
        self.ctx = SimpleNamespace(device=torch.device("cpu"),
                                   scenario=SimpleNamespace(training=TrainingConfig(group_clients=group_clients)))
        self.trained: list[list[int]] = []

    groups = True

    def group_key(self, round_: int, client: int, plan: ClientPlan) -> str | None:
        return {1: "a", 3: "a", 4: "a", 2: "b"}.get(client)

    def global_model(self) -> nn.Module:
        return nn.Linear(1, 1)

    def train(self, round_: int, client: int, plan: ClientPlan) -> ClientUpdate:
        self.trained.append([client])
        return ClientUpdate(client, {}, 1, 0.0)

    def train_group(self, round_: int, plans: dict[int, ClientPlan]) -> list[ClientUpdate]:
        self.trained.append(list(plans))
        return [ClientUpdate(k, {}, 1, 0.0) for k in plans]


def test_clients_with_one_key_train_together_in_plan_order() -> None:
    plans = {k: work(1.0) for k in (1, 2, 3, 5, 4)}
    method = Keyed(group_clients=True)
    updates = LocalExecutor(method).train(0, plans)  # type: ignore[arg-type]
    assert [u.client for u in updates] == [1, 2, 3, 5, 4]
    assert method.trained == [[1, 3, 4], [2], [5]]
    off = Keyed(group_clients=False)
    LocalExecutor(off).train(0, plans)  # type: ignore[arg-type]
    assert off.trained == [[1], [2], [3], [5], [4]]


def test_a_group_time_is_shared_by_flops() -> None:
    ticks = iter([10.0, 16.0])  # the group trains for 6 s
    updates = train_timed_group(Keyed(True), 0, {1: work(1.0), 3: work(2.0), 4: work(3.0)},  # type: ignore[arg-type]
                                clock=lambda: next(ticks))
    assert [u.real_compute_s for u in updates] == pytest.approx([1.0, 2.0, 3.0])


# every registered method: those that add to local training (hooks, work after it, their own optimizer
# or loop) train one by one
GROUPS = {"jfat": True, "fedavg_at": True, "sfat": True, "gma": True, "fedavg_dynat": True,
          "fedadam_at": True, "fedyogi_at": True, "fedadagrad_at": True, "fedprox_at": False,
          "scaffold_at": False,
          "fedcurv_at": False, "feddynat": False, "heterofl_at": False, "feddrop_at": False,
          "fedrolex_at": False, "feddf_at": False, "fedet_at": False, "fedprophet": False}


def test_every_method_says_whether_it_groups() -> None:
    assert sorted(GROUPS) == METHODS.names()


@pytest.mark.parametrize(("method", "grouped"), sorted(GROUPS.items()))
def test_which_methods_train_in_groups(method: str, grouped: bool) -> None:
    exp = prepare(load_scenario(QUICKSTART, [f'method="{method}"']), str(QUICKSTART), dry_run=True)
    w = ClientPlan(Workload(exp.ctx.profile.atoms, 32, 3, 3, 1, 0.0, 0.0), exp.ctx.attack_for(0), 0.05)
    assert (exp.method.group_key(0, 0, w) is not None) is grouped


def test_attacks_that_cannot_be_grouped_train_one_by_one() -> None:
    """AutoAttack probes the model with one row and re-attacks subsets of rows, which a grouped
    network's client-major rows do not allow: a plan carrying it (a method that attacked with it)
    trains one by one. (Scenarios refuse it as the training attack: it is an evaluation attack.)"""
    exp = prepare(load_scenario(QUICKSTART), str(QUICKSTART), dry_run=True)
    w = Workload(exp.ctx.profile.atoms, 32, 3, 3, 1, 0.0, 0.0)
    autoattack = make_attack("autoattack", 0.1, 0.03, 3)
    assert exp.method.group_key(0, 0, ClientPlan(w, autoattack, 0.05)) is None
    assert exp.method.group_key(0, 0, ClientPlan(w, make_attack("pgd", 0.1, 0.03, 3), 0.05)) is not None


@pytest.mark.parametrize("per_group", [3, 2])
def test_jfat_trains_a_round_in_groups_as_one_by_one(per_group: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The wired path: jFAT's `train_group` against its `train`, on the quickstart's digits in
    float64, in a round where FedBN hands some clients their own BatchNorm; with room for 3 clients
    per group, then for 2 (groups of 2 and 1)."""
    exp = prepare(load_scenario(QUICKSTART, ["training.local_iters=3", "attack.steps=3", "threads=1",
                                             "device=cpu"]), str(QUICKSTART))
    exp.ctx.data = replace(exp.ctx.data, train_x=exp.ctx.data.train_x.double())
    method = exp.method
    assert isinstance(method, FedAvgAT) and method.fedbn
    method.model.double()
    w = Workload(exp.ctx.profile.atoms, 32, 3, 3, 1, 0.0, 0.0)
    monkeypatch.setattr(fedavg, "GROUP_BYTES", per_group * mem_req(w.atoms, w.batch, w.slots))
    p0, p = (ClientPlan(w, exp.ctx.attack_for(t), exp.ctx.lr(t)) for t in (0, 1))
    method.aggregate(0, [method.train(0, k, p0) for k in (0, 1)])  # clients 0 and 1 keep their BN
    plans = dict.fromkeys((2, 0, 1), p)
    assert method.group_key(1, 0, p) == method.group_key(1, 2, p) is not None
    trained: list[int] = []  # each group's size

    def counted(template: nn.Module, jobs: list[ClientJob], *args: object, **kw: object) -> object:
        trained.append(len(jobs))
        return train_group(template, jobs, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(fedavg, "train_group", counted)
    for got, want in zip(method.train_group(1, plans), [method.train(1, k, p) for k in plans], strict=True):
        assert (got.client, got.num_samples) == (want.client, want.num_samples)
        assert got.loss == pytest.approx(want.loss, rel=LOSS_TOL)
        for key, value in want.state.items():
            torch.testing.assert_close(got.state[key], value, atol=TOL, rtol=0, msg=key)
    assert trained == ([3] if per_group == 3 else [2, 1])


def test_clients_smaller_than_the_batch_group_by_their_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """At batch 58 the quickstart's clients 15, 17, 16 and 18 hold 58, 57, 58 and 57 digits: a client
    trains on batches of min(batch, its samples), so the round trains two groups, each as one by one."""
    exp = prepare(load_scenario(QUICKSTART, ["training.local_iters=2", "attack.steps=2", "threads=1",
                                             "device=cpu", "training.batch_size=58"]), str(QUICKSTART))
    exp.ctx.data = replace(exp.ctx.data, train_x=exp.ctx.data.train_x.double())
    method = exp.method
    method.model.double()
    assert [len(exp.ctx.splits[k].train) for k in (15, 17, 16, 18)] == [58, 57, 58, 57]
    w = Workload(exp.ctx.profile.atoms, 58, 2, 2, 1, 0.0, 0.0)
    p = ClientPlan(w, exp.ctx.attack_for(0), exp.ctx.lr(0))
    plans = dict.fromkeys((15, 17, 16, 18), p)
    sizes: list[list[int]] = []

    def counted(template: nn.Module, jobs: list[ClientJob], *args: object, **kw: object) -> object:
        sizes.append([len(job.x) for job in jobs])
        return train_group(template, jobs, *args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(fedavg, "train_group", counted)
    got = LocalExecutor(method).train(0, plans)
    assert sizes == [[58, 58], [57, 57]]
    for g, k in zip(got, plans, strict=True):
        want = method.train(0, k, p)
        assert g.client == k and g.loss == pytest.approx(want.loss, rel=LOSS_TOL)
        for key, value in want.state.items():
            torch.testing.assert_close(g.state[key], value, atol=TOL, rtol=0, msg=key)


def test_grouped_training_runs_under_bf16_autocast() -> None:
    """`training.precision = "bf16"` reaches grouped training and trains as well as one by one.
    Measured as the relative root-mean-square distance of all states from one-by-one float32's
    (a statistic over every element, not one element's, which a flipped attack sign decides):
    - bf16 reaches it: grouped bf16 lies more than bfloat16's unit roundoff u16 = 2^-8 from grouped
      float32, which differs from one-by-one float32 by float32's summation order only, at most
      n u32 for the longest sum of n terms (54 here: 3e-6);
    - as well as one by one: grouped bf16 rounds what one-by-one bf16 rounds plus, in its attack,
      each BatchNorm folded into the convolution's weights (one more rounding per weight, at most
      twice as many roundings), so it lies at most twice one-by-one bf16's distance from float32.
    Both hold on every CPU kernel: bfloat16's rounding is the same everywhere."""
    data = [({k: v.float() if v.is_floating_point() else v for k, v in s.items()}, x.float(), y)
            for s, x, y in clients(2)]
    attack, objective = make_attack("pgd", 0.1, 0.03, 2), OBJECTIVES.get("pgd_at")()

    def grouped(precision: str) -> list[State]:
        jobs = [ClientJob(s, x, y, client_seed(0, 7, k)) for k, (s, x, y) in enumerate(data)]
        return train_group(new_model().float(), jobs, TrainingConfig(), 0.1, ITERS, BATCH, attack, objective,
                           TrainSettings(precision))[0]

    def apart(a: list[State], b: list[State]) -> float:
        pairs = [(s[k].double(), t[k].double()) for s, t in zip(a, b, strict=True) for k in s
                 if s[k].is_floating_point()]
        return (sum(float((x - y).square().sum()) for x, y in pairs) /
                sum(float(y.square().sum()) for _, y in pairs)) ** 0.5

    reference = one_by_one(data, TrainingConfig(), attack, objective, FP32, torch.float32)[0]
    bf16_one_by_one = apart(one_by_one(data, TrainingConfig(), attack, objective, TrainSettings("bf16"),
                                       torch.float32)[0], reference)
    fp32, bf16 = grouped("fp32"), grouped("bf16")
    assert apart(fp32, reference) < longest_sum(new_model()) * U32
    assert apart(bf16, fp32) > U16
    assert apart(bf16, reference) < 2 * bf16_one_by_one


@pytest.mark.parametrize(("padding", "kernel", "bias", "layout"),
                         [((1, 1), (3, 3), True, torch.contiguous_format),
                          ((0, 2), (3, 3), False, torch.contiguous_format),
                          ((2, 0), (3, 5), True, torch.contiguous_format),
                          ((1, 1), (3, 3), True, torch.channels_last)])
def test_one_channel_convolution_has_the_convolution_gradients(
        padding: tuple[int, int], kernel: tuple[int, int], bias: bool, layout: torch.memory_format) -> None:
    """The input gradient of a convolution with one input channel per group is the transposed
    convolution: the output gradient correlated with the flipped kernels, summed over the group's
    output channels (along memory on channels_last tensors, the grouped network's). It must equal
    autograd's through `conv2d` (float64: summation order only)."""
    torch.manual_seed(0)
    x = torch.randn(4, 3, 7, 6, dtype=torch.float64).to(memory_format=layout).requires_grad_(True)
    w = torch.randn(12, 1, *kernel, dtype=torch.float64).to(memory_format=layout).requires_grad_(True)
    b = torch.randn(12, dtype=torch.float64, requires_grad=True) if bias else None
    got = OneChannelConv.apply(x, w, b, padding, 3)
    want = nn.functional.conv2d(x, w, b, padding=padding, groups=3)
    assert torch.equal(got, want)
    leaves = (x, w, b) if b is not None else (x, w)
    grad = torch.randn_like(want)
    grads = torch.autograd.grad(got, leaves, grad), torch.autograd.grad(want, leaves, grad)
    for g, h in zip(*grads, strict=True):
        torch.testing.assert_close(g, h, atol=1e-12, rtol=0)


def test_group_sums_add_each_group_channels_in_either_layout() -> None:
    x = torch.arange(2 * 6 * 2 * 3, dtype=torch.float64).view(2, 6, 2, 3)  # 3 groups of 2 channels
    want = x[:, 0::2] + x[:, 1::2]
    for layout in (torch.contiguous_format, torch.channels_last):
        got = group_sums(x.to(memory_format=layout), 3)
        assert torch.equal(got, want)
        assert got.is_contiguous(memory_format=layout)


def test_grouped_flatten_gives_a_channels_last_input_a_channels_last_gradient() -> None:
    """Same values as nn.Flatten forward and backward; the gradient keeps the input's layout."""
    x = torch.randn(3, 4, 2, 2, dtype=torch.float64).to(memory_format=torch.channels_last)
    x.requires_grad_(True)
    grad = torch.randn(3, 16, dtype=torch.float64)
    out = GroupedFlatten()(x)
    assert torch.equal(out, nn.Flatten()(x))
    (got,) = torch.autograd.grad(out, x, grad)
    assert torch.equal(got, grad.view(3, 4, 2, 2))
    assert got.is_contiguous(memory_format=torch.channels_last) and not got.is_contiguous()
    plain = torch.randn(3, 4, 2, 2, requires_grad=True)  # contiguous: a view, as nn.Flatten gives
    assert torch.equal(GroupedFlatten()(plain), plain.flatten(1))


def test_only_single_input_channel_convolutions_take_the_depthwise_input_gradient() -> None:
    assert OneChannelConv.fits(nn.Conv2d(3, 12, 3, padding=1, groups=3))
    assert not OneChannelConv.fits(nn.Conv2d(6, 12, 3, padding=1, groups=3))  # two channels per group
    assert not OneChannelConv.fits(nn.Conv2d(3, 12, 3, padding=1, groups=3, stride=2))
    assert not OneChannelConv.fits(nn.Conv2d(3, 12, 3, padding=3, groups=3))  # padding above kernel - 1
    assert not OneChannelConv.fits(nn.Conv2d(3, 12, 3, padding="same", groups=3))
    assert not OneChannelConv.fits(nn.Conv2d(3, 12, 3, padding=1, groups=3, padding_mode="reflect"))


def test_grouped_training_on_two_threads_repeats_one_by_one() -> None:
    """Two torch threads: the 3 clients train as one group in this process and end where one-by-one
    training ends them; torch is left on two threads."""
    cfg, atk, obj = TrainingConfig(momentum=0.9), make_attack("pgd", 0.1, 0.03, 3), OBJECTIVES.get("pgd_at")()
    data = clients(3)
    want = one_by_one(data, cfg, atk, obj)
    jobs = [ClientJob(s, x, y, client_seed(0, 7, k)) for k, (s, x, y) in enumerate(data)]
    torch.set_num_threads(2)
    got = train_group(new_model(), jobs, cfg, 0.1, ITERS, BATCH, atk, obj)
    assert torch.get_num_threads() == 2
    assert_as_one_by_one(got, want, data)


def test_one_channel_convolution_under_bf16_autocast_gives_gradients_in_the_input_dtypes() -> None:
    """A forward under bf16 autocast and a backward outside it (as `loss.backward()` after the
    autocast block): the float32 input and weight get float32 gradients, near the float32 ones
    (bf16's 8-bit mantissa: within 5 % of the largest)."""
    torch.manual_seed(1)
    x = torch.rand(4, 2, 6, 6, requires_grad=True)
    w = torch.randn(8, 1, 3, 3, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = OneChannelConv.apply(x, w, None, (1, 1), 2)
    assert low.dtype == torch.bfloat16
    got = torch.autograd.grad(low.float().square().sum(), (x, w))
    full = nn.functional.conv2d(x, w, padding=1, groups=2)
    want = torch.autograd.grad(full.square().sum(), (x, w))
    for g, h in zip(got, want, strict=True):
        assert g.dtype == torch.float32
        torch.testing.assert_close(g, h, atol=0.05 * float(h.abs().max()), rtol=0)
