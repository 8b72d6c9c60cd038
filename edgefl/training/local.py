"""Real local training and evaluation in PyTorch, in-process, on the chosen torch device.

Local adversarial training is Madry's min-max: each iteration crafts the attack on the batch, then
takes one optimizer step on the adversarial batch. Batches cycle through seeded permutations of
the client's samples, so a (seed, round, client) always sees the same batches.

The loop never waits on the device: the client's data already lives there, the batch indices go
there in one transfer, and the loss is summed there and read once at the end. `training.precision
= "bf16"` runs the forward passes (attack included) under bfloat16 autocast and
`training.channels_last` puts conv weights and image batches in NHWC order.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from edgefl.attacks import Attack
from edgefl.config import TrainingConfig
from edgefl.data.datasets import to_float
from edgefl.training.objectives import PGDAT, Objective

T = TypeVar("T")


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when available, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


SERVER = -1  # the client key of the server's own stream in a round (clients are 0, 1, ...)


def client_seed(*keys: int) -> int:
    """The seed of a (seed, round, client) key: CPython's hash of the tuple, which for integers is
    the same in every process and run (PYTHONHASHSEED salts only str and bytes)."""
    return hash(keys) % 2**63


def seed_everything(*keys: int) -> torch.Generator:
    """Seed torch's global RNG (attack random starts) and return a batch-order generator."""
    seed = client_seed(*keys)
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def timed(device: torch.device, fn: Callable[[], T],
          clock: Callable[[], float] = time.perf_counter) -> tuple[T, float]:
    """(fn(), its seconds on `clock`, wall time by default), the device synchronised before and
    after (CUDA runs asynchronously)."""
    synchronize(device)
    start = clock()
    out = fn()
    synchronize(device)
    return out, clock() - start


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def make_optimizer(params: list[nn.Parameter], cfg: TrainingConfig, lr: float) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def batch_indices(n: int, batch: int, iters: int, gen: torch.Generator) -> list[torch.Tensor]:
    """`iters` batches of up to `batch` indices, walking through fresh permutations of range(n)."""
    order = torch.cat([torch.randperm(n, generator=gen) for _ in range(-(-iters * batch // n))])
    return [order[i * batch:(i + 1) * batch] for i in range(iters)]


@dataclass(frozen=True)
class TrainSettings:
    """How local training runs on its device: `precision` fp32 | bf16 (autocast) and NHWC layout."""

    precision: str = "fp32"
    channels_last: bool = False

    @classmethod
    def of(cls, cfg: TrainingConfig) -> TrainSettings:
        return cls(cfg.precision, cfg.channels_last)

    def autocast(self, device: torch.device) -> torch.autocast:
        """bfloat16 autocast on `device` when `precision` is bf16 (a no-op context otherwise)."""
        return torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.precision == "bf16")

    def adopt(self, x: torch.Tensor, *modules: nn.Module) -> None:
        """Put the modules' conv weights in channels_last order when asked and `x` holds images."""
        if self.channels_last and x.dim() == 4:
            for module in modules:
                module.to(memory_format=torch.channels_last)

    def layout(self, xb: torch.Tensor) -> torch.Tensor:
        """An image batch in channels_last order when asked; anything else as it is."""
        if self.channels_last and xb.dim() == 4:
            return xb.contiguous(memory_format=torch.channels_last)
        return xb


FP32 = TrainSettings()


def device_batches(
    x: torch.Tensor, y: torch.Tensor, batch: int, iters: int, gen: torch.Generator,
    settings: TrainSettings = FP32,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches of `batch_indices` (batch capped at len(x)), indices sent to x's device at once."""
    rows = torch.stack(batch_indices(len(x), min(batch, len(x)), iters, gen)).to(x.device)
    for idx in rows:
        yield settings.layout(to_float(x[idx])), y[idx]


@dataclass
class Hooks:
    """What a method adds to local training: a penalty on the loss (FedProx, FedCurv) and a
    correction of the gradients before each step (SCAFFOLD's control variates)."""

    penalty: Callable[[nn.Module], torch.Tensor] | None = None
    correct: Callable[[nn.Module], None] | None = None


def train_local(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer,
    iters: int, batch: int, attack: Attack | None, gen: torch.Generator,
    objective: Objective | None = None, hooks: Hooks | None = None, settings: TrainSettings = FP32,
    tail: int = 0,
) -> float:
    """Run `iters` (adversarial) optimizer steps; returns the mean training loss (penalty excluded)
    of the last `tail` of them (0: of all; `tail_mean`).

    Every method's client trains through here (edgefl.methods.base `Method.train`). With
    `settings.channels_last` the model (and the objective's fixed modules) is left in
    channels_last order."""
    objective = objective or PGDAT()
    hooks = hooks or Hooks()
    fixed = objective.fixed()
    settings.adopt(x, *fixed, model)
    for module in fixed:
        module.eval()
    model.train()
    losses = torch.zeros(iters, device=x.device)
    for i, (xb, yb) in enumerate(device_batches(x, y, batch, iters, gen, settings)):
        with settings.autocast(x.device):
            loss = objective.loss(model, xb, yb, attack)
        optimizer.zero_grad(set_to_none=True)
        (loss + hooks.penalty(model) if hooks.penalty else loss).backward()
        if hooks.correct:
            hooks.correct(model)
        optimizer.step()
        losses[i] = loss.detach()
    return tail_mean(losses, tail)


def tail_mean(losses: torch.Tensor, tail: int) -> float:
    """The mean of the last `tail` of a run's per-iteration losses (all of them for 0, or more
    than there are)."""
    n = len(losses) if tail <= 0 else min(tail, len(losses))
    return float(losses[len(losses) - n:].sum()) / n


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, attack: Attack, batch: int = 512
) -> tuple[float, float]:
    """(clean accuracy, accuracy under `attack`) in [0, 1]; the hits are counted on x's device."""
    model.eval()
    clean = torch.zeros((), dtype=torch.long, device=x.device)
    adv = torch.zeros_like(clean)
    for i in range(0, len(x), batch):
        xb, yb = to_float(x[i:i + batch]), y[i:i + batch]
        with torch.no_grad():
            clean += (model(xb).argmax(1) == yb).sum()
        xa = attack(model, xb, yb)
        with torch.no_grad():
            adv += (model(xa).argmax(1) == yb).sum()
    return int(clean) / len(x), int(adv) / len(x)
