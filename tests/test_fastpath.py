"""The device fast path of local training (edgefl.training.local): fp32 results equal to the
plain Madry PGD-AT loop (Madry et al., ICLR 2018), bf16 autocast, channels_last, one host read."""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from edgefl.attacks import Attack, make_attack
from edgefl.config import TrainingConfig
from edgefl.methods.fedprophet.cascade import Cascade, Exit, feature_attack
from edgefl.training.local import (
    FP32,
    TrainSettings,
    batch_indices,
    device_batches,
    evaluate,
    make_optimizer,
    train_local,
)

ITERS, BATCH = 4, 8
BF16, NHWC = TrainSettings("bf16"), TrainSettings(channels_last=True)


def tiny() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.Flatten(), nn.Linear(64, 3))


def data(n: int = 20) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.rand(n, 3, 4, 4, generator=g), torch.randint(3, (n,), generator=g)


def pgd() -> Attack:
    return make_attack("pgd", eps=0.1, step_size=0.05, steps=3)


def optimizer(model: nn.Module) -> torch.optim.Optimizer:
    cfg = TrainingConfig()
    return make_optimizer(list(model.parameters()), cfg, cfg.lr)


def run_edgefl(settings: TrainSettings = FP32, iters: int = ITERS) -> tuple[float, nn.Module]:
    model, (x, y) = tiny(), data()
    torch.manual_seed(7)  # the attacks' random starts
    loss = train_local(model, x, y, optimizer(model), iters, BATCH, pgd(), torch.Generator().manual_seed(3),
                       settings=settings)
    return loss, model


def plain_loop() -> tuple[float, nn.Module]:
    """The loop as written before the fast path: one batch at a time from batch_indices, the
    PGD example, one SGD step, the loss read on the host every step."""
    model, (x, y) = tiny(), data()
    opt, attack, gen = optimizer(model), pgd(), torch.Generator().manual_seed(3)
    torch.manual_seed(7)
    model.train()
    losses = []
    for idx in batch_indices(len(x), BATCH, ITERS, gen):
        loss = F.cross_entropy(model(attack(model, x[idx], y[idx])), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return sum(losses) / ITERS, model


def test_fp32_equals_the_plain_loop():
    loss, model = run_edgefl()
    ref_loss, ref = plain_loop()
    assert loss == pytest.approx(ref_loss, rel=1e-6)  # float32 sum on the device vs a float sum
    for (name, w), w_ref in zip(model.state_dict().items(), ref.state_dict().values(), strict=True):
        assert torch.equal(w, w_ref), name


def test_bf16_autocasts_every_forward_and_trains():
    model, (x, y) = tiny(), data()
    start = copy.deepcopy(model.state_dict())
    dtypes: list[torch.dtype] = []
    model[0].register_forward_hook(lambda _m, _i, out: dtypes.append(out.dtype))
    loss = train_local(model, x, y, optimizer(model), ITERS, BATCH, pgd(), torch.Generator().manual_seed(3),
                       settings=BF16)
    assert isinstance(loss, float) and torch.isfinite(torch.tensor(loss))
    assert len(dtypes) == ITERS * (3 + 1)  # 3 attack steps + 1 training forward per iteration
    assert set(dtypes) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights stay fp32
    assert not torch.equal(model[0].weight, start["0.weight"])


def test_channels_last_matches_contiguous():
    # FGSM, not PGD: PGD's random start is drawn in the input's memory order (empty_like), so
    # NHWC batches get other (equally seeded) starts; everything else must agree to rounding.
    x, y = data()
    runs = []
    for settings in (FP32, NHWC):
        model, seen = tiny(), []
        model[0].register_forward_pre_hook(
            lambda _m, inp, seen=seen: seen.append(inp[0].is_contiguous(memory_format=torch.channels_last)))
        loss = train_local(model, x, y, optimizer(model), ITERS, BATCH, make_attack("fgsm", 0.1, 0.1, 1),
                           torch.Generator().manual_seed(3), settings=settings)
        runs.append((loss, model, seen))
    (loss, model, seen), (loss_cl, model_cl, seen_cl) = runs
    assert all(seen_cl) and not any(seen)
    assert model_cl[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert loss_cl == pytest.approx(loss, rel=1e-5)
    for w, w_cl in zip(model.state_dict().values(), model_cl.state_dict().values(), strict=True):
        assert torch.allclose(w, w_cl, atol=1e-5)


def test_channels_last_leaves_flat_inputs_alone():
    x = torch.rand(5, 7)
    assert NHWC.layout(x) is x
    model = nn.Linear(7, 2)
    NHWC.adopt(x, model)
    assert model.weight.is_contiguous()


def test_batches_follow_batch_indices():
    n, batch, iters = 10, 4, 6  # 24 indices: three permutations of range(10), cut in batches of 4
    x = torch.arange(n, dtype=torch.float32).view(n, 1, 1, 1).expand(n, 3, 4, 4).contiguous()
    y = torch.arange(n) % 3
    model = tiny()
    seen: list[torch.Tensor] = []
    model[0].register_forward_pre_hook(lambda _m, inp: seen.append(inp[0][:, 0, 0, 0].long()))
    train_local(model, x, y, optimizer(model), iters, batch, None, torch.Generator().manual_seed(5))
    expected = batch_indices(n, batch, iters, torch.Generator().manual_seed(5))
    assert len(seen) == iters
    for got, want in zip(seen, expected, strict=True):
        assert torch.equal(got, want)
    batches = list(device_batches(x, y, 99, 2, torch.Generator().manual_seed(5)))  # batch capped at n
    assert [len(yb) for _, yb in batches] == [n, n]
    assert sorted(batches[0][0][:, 0, 0, 0].long().tolist()) == list(range(n))  # one permutation


HOST_READS = ("item", "tolist", "cpu", "numpy", "__float__", "__int__", "__bool__", "__index__")


def host_reads(monkeypatch: pytest.MonkeyPatch, fn: Callable[[], object]) -> int:
    """How many times `fn` reads a tensor's value back on the host."""
    calls: list[str] = []

    def counted(name: str) -> Callable[..., object]:
        real = getattr(torch.Tensor, name)
        return lambda self, *a, **k: (calls.append(name), real(self, *a, **k))[1]

    with monkeypatch.context() as m:
        for name in HOST_READS:
            m.setattr(torch.Tensor, name, counted(name))
        fn()
    return len(calls)


def test_host_reads_do_not_grow_with_iterations(monkeypatch):
    # one read in all: the mean loss at the end
    assert host_reads(monkeypatch, lambda: run_edgefl(iters=1)) == 1
    assert host_reads(monkeypatch, lambda: run_edgefl(iters=6)) == 1
    model, (x, y) = tiny(), data()
    # evaluate reads its two hit counts once, whatever the number of batches
    assert host_reads(monkeypatch, lambda: evaluate(model, x, y, pgd(), batch=3)) == 2


def test_settings_from_the_scenario():
    cfg = TrainingConfig(precision="bf16", channels_last=True)
    assert TrainSettings.of(cfg) == TrainSettings("bf16", True)
    assert TrainSettings.of(TrainingConfig()) == TrainSettings("fp32", False)


def test_cascade_runs_in_bf16_channels_last():
    torch.manual_seed(0)
    prefix = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU())
    exit_ = Exit(nn.Sequential(nn.Conv2d(4, 4, 3, padding=1), nn.ReLU()), nn.Sequential(nn.Flatten(),
                                                                                      nn.Linear(64, 3)))
    fixed, start = copy.deepcopy(prefix.state_dict()), copy.deepcopy(exit_.state_dict())
    x, y = data()
    loss = train_local(exit_, x, y, optimizer(exit_), ITERS, BATCH, feature_attack(0.5, 3, 0.0),
                       torch.Generator().manual_seed(3), Cascade(prefix, 1e-5),
                       settings=TrainSettings("bf16", True))
    assert torch.isfinite(torch.tensor(loss))
    assert not prefix.training and exit_.training  # the fixed prefix runs in eval mode
    assert prefix[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert all(torch.equal(v, prefix.state_dict()[k]) for k, v in fixed.items())
    assert not torch.equal(exit_.state_dict()["stack.0.weight"], start["stack.0.weight"])
