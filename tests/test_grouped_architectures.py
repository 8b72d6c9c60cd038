"""Which architectures train grouped (edgefl.training.grouped): any model whose forward torch.fx
traces to layers with a grouped form joined by channel-wise operators (residual blocks, functional
ReLU, in-place adds, torch.flatten) trains as one grouped network, and that network repeats
one-by-one training to float64 summation order; convolutions of small maps run as batched matmuls
over the kernel taps that read the map, or (frozen weights, every output reading every input) by
each client's dense matrix, the same sums as the convolution; every other model, and on the CPU one
whose operators already fill a core, trains one by one, and a run says why once.

Tolerances as tests/test_grouped.py's for the ResNet: states within 1e-9 absolute and relative (the
batched matmul and the convolution sum in other orders), losses within a relative 1e-6 (summed in
float32 by both); a wrong batch, start or statistic shows as 1e-2 or more.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from support import adam_tolerance, trained_one_by_one
from torch import nn

from edgefl.attacks import make_attack
from edgefl.config import TrainingConfig
from edgefl.executors import executor
from edgefl.methods import ClientPlan
from edgefl.models.base import Normalize
from edgefl.sim.records import AtomProfile
from edgefl.sim.workload import Workload
from edgefl.training.grouped import (
    ClientJob,
    ConvBN,
    GroupedBatchNorm2d,
    GroupedConv2d,
    State,
    Taps,
    dense_start,
    live_taps,
    train_group,
    why_not_worth_it,
    why_one_by_one,
)
from edgefl.training.local import client_seed
from edgefl.training.objectives import OBJECTIVES

TOL = 1e-9
ITERS, BATCH = 3, 8


class Block(nn.Module):
    """A torchvision-style residual block on 3x3 maps: functional ReLU, a strided convolution to a
    2x2 map (a small map: batched matmuls), a 1x1 strided shortcut with a bias, added in place."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1), nn.BatchNorm2d(2 * c)
        self.shortcut = nn.Conv2d(c, 2 * c, 1, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = nn.functional.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out += self.shortcut(x)
        return torch.relu(out)


class Net(nn.Module):
    """1x6x6 images: a stem convolution read by its BatchNorm and by an add (so not folded into it),
    an in-place ReLU whose input a pooling reads after it (so not moved after the max-pooling),
    the block, torch.flatten and a linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = Normalize([0.4], [0.3])
        self.stem, self.bn = nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4)
        self.relu = nn.ReLU(inplace=True)
        self.pool, self.mean = nn.MaxPool2d(2, ceil_mode=True), nn.AvgPool2d(2, ceil_mode=True)
        self.block = Block(4)
        self.fc = nn.Linear(8 * 2 * 2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stem(self.norm(x))
        y = self.bn(s) + s
        z = self.pool(self.relu(y)) + self.mean(y)
        return self.fc(torch.flatten(self.block(z), 1))


def new_net() -> nn.Module:
    torch.manual_seed(1)
    return Net().double()


def perturbed_clients(n: int) -> list[tuple[State, torch.Tensor, torch.Tensor]]:
    """n (start state, images, labels): weights, BN statistics and batch counters apart."""
    torch.manual_seed(6)
    out = []
    for k in range(n):
        state = {key: (v + 0.05 * torch.randn_like(v)).abs() if "running" in key else
                 v + 0.05 * torch.randn_like(v) if v.is_floating_point() else v + 2 * k
                 for key, v in new_net().state_dict().items()}
        size = 10 + 5 * k
        out.append((state, torch.rand(size, 1, 6, 6, dtype=torch.float64), torch.randint(3, (size,))))
    return out


@pytest.mark.parametrize(("objective", "optimizer"), [("pgd_at", "sgd"), ("trades", "adam")])
def test_a_model_of_blocks_and_functional_operators_trains_grouped_as_one_by_one(objective: str,
                                                                                  optimizer: str) -> None:
    data = perturbed_clients(3)
    cfg = TrainingConfig(optimizer=optimizer, momentum=0.9, weight_decay=1e-3)
    attack, obj = make_attack("pgd", 0.1, 0.03, 2), OBJECTIVES.get(objective)(2.0)
    assert why_one_by_one(new_net()) is None
    want_states, want_losses = trained_one_by_one(new_net, data, cfg, 0.1, ITERS, BATCH, attack, obj)
    jobs = [ClientJob(s, x, y, client_seed(0, 7, k)) for k, (s, x, y) in enumerate(data)]
    states, losses = train_group(new_net(), jobs, cfg, 0.1, ITERS, BATCH, attack, obj)
    tol = adam_tolerance(0.1, new_net()) if optimizer == "adam" else TOL  # summation order (support.py)
    assert losses == pytest.approx(want_losses, abs=0, rel=1e-6)
    for got, want, (start, _, _) in zip(states, want_states, data, strict=True):
        assert list(got) == list(want)
        for key, value in want.items():
            assert not torch.equal(value, start[key]) or key.startswith("norm.")  # fixed normalisation
            torch.testing.assert_close(got[key], value, atol=tol, rtol=tol, msg=key)


def test_a_model_that_is_one_layer_trains_grouped_as_one_by_one() -> None:
    def linear() -> nn.Module:
        torch.manual_seed(2)
        return nn.Linear(5, 3).double()

    torch.manual_seed(3)
    data = [(linear().state_dict(), torch.rand(12 + k, 5, dtype=torch.float64), torch.randint(3, (12 + k,)))
            for k in range(2)]
    cfg, attack, obj = TrainingConfig(), make_attack("pgd", 0.1, 0.03, 2), OBJECTIVES.get("pgd_at")()
    jobs = [ClientJob(s, x, y, client_seed(0, 7, k)) for k, (s, x, y) in enumerate(data)]
    states, _ = train_group(linear(), jobs, cfg, 0.1, ITERS, BATCH, attack, obj)
    for state, want in zip(states, trained_one_by_one(linear, data, cfg, 0.1, ITERS, BATCH, attack, obj)[0],
                           strict=True):
        for key, value in want.items():
            torch.testing.assert_close(state[key], value, atol=TOL, rtol=0, msg=key)


def test_live_taps_are_those_that_read_the_map() -> None:
    assert live_taps(1, 3, 1, 1, 1) == Taps(1, 2, 0, 0, 1)  # a 1x1 map: the centre tap alone
    assert live_taps(2, 3, 1, 2, 1) == Taps(1, 3, 0, 0, 1)  # stride 2: the first tap reads padding
    assert live_taps(2, 3, 2, 1, 2) == Taps(1, 2, 0, 0, 2)  # dilation 2: the outer taps read padding
    assert live_taps(3, 3, 0, 2, 1) == Taps(0, 3, 0, 0, 1)  # no padding: every tap
    assert live_taps(2, 3, 1, 1, 1) == Taps(0, 3, 1, 1, 2)
    assert live_taps(1, 1, 1, 2, 1) is None  # outputs at -1 and 1: padding only


def test_dense_start_is_the_tap_joining_the_first_input_and_the_last_output() -> None:
    assert dense_start(1, 3, 1, 1, 1) == 1  # a 1x1 map: the centre tap
    assert dense_start(2, 3, 1, 1, 1) == 0  # a 2x2 map: input 0 reads output 1 through tap 0
    assert dense_start(2, 3, 1, 2, 1) == 1  # stride 2: one output
    assert dense_start(4, 3, 1, 2, 1) is None  # output 1 misses input 0
    assert dense_start(2, 3, 2, 1, 2) is None  # dilated


@pytest.mark.parametrize("frozen", [False, True])
@pytest.mark.parametrize(("size", "kernel", "padding", "stride", "dilation", "bias", "dense"), [
    ((1, 1), 3, 1, 1, 1, False, True), ((2, 2), 3, 1, 2, 1, True, True), ((2, 2), 3, 2, 1, 2, True, False),
    ((2, 1), (3, 1), (1, 0), 1, 1, False, True), ((3, 3), 3, 0, 2, 1, True, True),
    ((4, 4), 1, 0, 2, 1, True, False), ((2, 2), 3, 1, 1, 1, True, True)])
def test_convolutions_of_small_maps_run_as_batched_matmuls_with_the_convolution_values(
        size: tuple[int, int], kernel: int | tuple[int, int], padding: int | tuple[int, int], stride: int,
        dilation: int, bias: bool, dense: bool, frozen: bool) -> None:
    """Three clients' convolutions of 2 -> 4 channels to maps of at most 4 positions: values and input,
    weight and bias gradients those of the grouped convolution (float64: summation order only); with
    the weights frozen (an attack's passes), where every output reads every input, by each client's
    dense matrix (`dense_matmul`), kept."""
    torch.manual_seed(0)
    layers = [nn.Conv2d(2, 4, kernel, stride, padding, dilation, bias=bias).double() for _ in range(3)]
    conv = GroupedConv2d.of(layers[0], [layer.state_dict() for layer in layers]).requires_grad_(not frozen)
    x = torch.randn(5, 6, *size, dtype=torch.float64).to(memory_format=torch.channels_last)
    x.requires_grad_(True)
    assert conv.small_map(x) is not None
    assert (conv.spanned(x) is not None) == dense
    got = conv(x)
    want = nn.functional.conv2d(x, conv.weight, conv.bias, stride, padding, dilation, groups=3)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert (("dense", *size) in conv.kept) == (frozen and dense)
    torch.testing.assert_close(conv(x), want, atol=1e-12, rtol=0)  # from what was kept
    leaves = [x, *([] if frozen else [conv.weight, *([conv.bias] if conv.bias is not None else [])])]
    grad = torch.randn_like(want)
    grads = torch.autograd.grad(got, leaves, grad), torch.autograd.grad(want, leaves, grad)
    for g, h in zip(*grads, strict=True):
        torch.testing.assert_close(g, h, atol=1e-12, rtol=0)


@pytest.mark.parametrize("frozen", [False, True])
def test_a_batchnorm_after_a_small_map_convolution_runs_in_eval_mode_as_its_affine_map(frozen: bool) -> None:
    """In eval mode (an attack's passes) a BatchNorm reading a small map's convolution is applied as
    x x scale + shift (`GroupedConv2d.scaled`): values and gradients BatchNorm's own (float64: its
    kernel and the product round differently, a few ulps), the map kept while frozen."""
    torch.manual_seed(0)
    convs = [nn.Conv2d(2, 4, 3, padding=1).double() for _ in range(3)]
    bns = [nn.BatchNorm2d(4).double() for _ in range(3)]
    for bn in bns:
        bn.running_mean.uniform_(-1, 1), bn.running_var.uniform_(0.5, 2), bn.weight.data.uniform_(0.5, 2)
        bn.bias.data.uniform_(-1, 1)
    conv = GroupedConv2d.of(convs[0], [c.state_dict() for c in convs])
    norm = GroupedBatchNorm2d.of(bns[0], [b.state_dict() for b in bns])
    pair = ConvBN(conv, norm)
    conv.eval(), norm.eval(), norm.requires_grad_(not frozen)
    x = torch.randn(5, 6, 2, 2, dtype=torch.float64).to(memory_format=torch.channels_last)
    x.requires_grad_(True)
    assert conv.small_map(x) is not None
    got, want = pair(x), norm(conv(x))
    torch.testing.assert_close(got, want, atol=1e-12, rtol=0)
    assert got.is_contiguous(memory_format=torch.channels_last)
    assert ("affine" in conv.kept) == frozen
    leaves = [x, *([] if frozen else [norm.weight, norm.bias])]
    grad = torch.randn_like(want)
    grads = torch.autograd.grad(got, leaves, grad), torch.autograd.grad(want, leaves, grad)
    for g, h in zip(*grads, strict=True):
        torch.testing.assert_close(g, h, atol=1e-12, rtol=0)


class Concat(nn.Module):
    """Two branches joined along the channels: client-major channel blocks would interleave."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(1, 2, 3, padding=1), nn.Conv2d(1, 2, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x), self.b(x)], 1)


class Branchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.unused = nn.Conv2d(1, 2, 3), nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) if x.sum() > 0 else -self.a(x)


class Uncalled(Branchy):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x)


def test_models_with_no_grouped_form_say_why() -> None:
    assert why_one_by_one(Concat()) == "call_function cat has no grouped form"
    assert why_one_by_one(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU6())) == ("layer 1 (ReLU6) has no grouped "
                                                                             "form")
    assert (why_one_by_one(nn.Sequential(nn.Conv2d(1, 2, 3), nn.Dropout(0.5)))
            == "layer 1 (Dropout) draws random numbers in training")
    assert why_one_by_one(Uncalled()) == "state unused.weight is held by no layer its forward calls"
    reason = why_one_by_one(Branchy())
    assert reason is not None and reason.startswith("forward cannot be traced by torch.fx")
    job = ClientJob(Concat().state_dict(), torch.rand(4, 1, 3, 3), torch.zeros(4, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="cannot train grouped: its call_function cat"):
        train_group(Concat(), [job], TrainingConfig(), 0.1, 1, 4, None, OBJECTIVES.get("pgd_at")())


class Together:
    """A method stand-in that gives every client one key, on `model`."""

    groups = True

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.ctx = SimpleNamespace(device=torch.device("cpu"),
                                   scenario=SimpleNamespace(training=TrainingConfig()))

    def group_key(self, round_: int, client: int, plan: ClientPlan) -> str:
        return "all"

    def global_model(self) -> nn.Module:
        return self.model


def plans_of(macs: float, batch: int = 32) -> dict[int, ClientPlan]:
    """Three clients' plans: a forward of one operator doing `macs` multiply-accumulates a sample."""
    work = Workload((AtomProfile("a", macs, 0, 1, 1, 0.0, 1),), batch, 1, 0, 1, 0.0, 0.0)
    return dict.fromkeys(range(3), ClientPlan(work, None, 0.1))


def test_clients_of_an_architecture_that_does_not_group_train_one_by_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    plans = plans_of(1e6)
    assert [list(g) for g in executor.groups(Together(new_net()), 0, plans)] == [[0, 1, 2]]  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""
    assert [list(g) for g in executor.groups(Together(Concat()), 0, plans)] == [[0], [1], [2]]  # type: ignore[arg-type]
    assert capsys.readouterr().err == ("edgefl: note: clients train one by one, not grouped: its model's "
                                       "call_function cat has no grouped form\n")


def test_clients_whose_operators_already_fill_a_core_train_one_by_one(
        capsys: pytest.CaptureFixture[str]) -> None:
    """On the CPU grouping pays below OPERATOR_MACS multiply-accumulates per operator and client batch
    (a rule by the work, measured in docs/benchmarks.md); on a GPU it stays on."""
    assert [list(g) for g in executor.groups(Together(new_net()), 0, plans_of(1.5e6))] == [[0, 1, 2]]  # type: ignore[arg-type]
    assert [list(g) for g in executor.groups(Together(new_net()), 0, plans_of(1.6e6))] == [[0], [1], [2]]  # type: ignore[arg-type]
    assert capsys.readouterr().err == (
        "edgefl: note: clients train one by one, not grouped: its model's operators average 51 M "
        "multiply-accumulates per client batch, which one by one already run near a CPU core's peak "
        "(grouping pays below 50 M)\n")
    assert why_not_worth_it(plans_of(1e9)[0].workload, torch.device("cuda")) is None
