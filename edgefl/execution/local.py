"""Real local training and evaluation in PyTorch, in-process, on the chosen torch device.

Local adversarial training is Madry's min-max: each iteration crafts the attack on the batch, then
takes one optimizer step on the adversarial batch. Batches cycle through seeded permutations of
the client's samples, so a (seed, round, client) always sees the same batches.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from edgefl.attacks import Attack
from edgefl.config import TrainingConfig
from edgefl.execution.objectives import PGDAT, Objective


def resolve_device(name: str) -> torch.device:
    """`auto` picks CUDA when available, else the CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def seed_everything(*keys: int) -> torch.Generator:
    """Seed torch's global RNG (attack random starts) and return a batch-order generator."""
    seed = hash(keys) % 2**63
    torch.manual_seed(seed)
    return torch.Generator().manual_seed(seed)


def make_optimizer(params: list[nn.Parameter], cfg: TrainingConfig, lr: float) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay)


def batch_indices(n: int, batch: int, iters: int, gen: torch.Generator) -> list[torch.Tensor]:
    """`iters` batches of up to `batch` indices, walking through fresh permutations of range(n)."""
    order = torch.cat([torch.randperm(n, generator=gen) for _ in range(-(-iters * batch // n))])
    return [order[i * batch:(i + 1) * batch] for i in range(iters)]


@dataclass
class Hooks:
    """What a method adds to local training: a penalty on the loss (FedProx, FedCurv) and a
    correction of the gradients before each step (SCAFFOLD's control variates)."""

    penalty: Callable[[nn.Module], torch.Tensor] | None = None
    correct: Callable[[nn.Module], None] | None = None


def train_local(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer,
    iters: int, batch: int, attack: Attack | None, gen: torch.Generator,
    objective: Objective | None = None, hooks: Hooks | None = None,
) -> float:
    """Run `iters` (adversarial) SGD steps; returns the mean training loss (penalty excluded)."""
    objective = objective or PGDAT()
    hooks = hooks or Hooks()
    model.train()
    total = torch.zeros((), device=x.device)
    for idx in batch_indices(len(x), min(batch, len(x)), iters, gen):
        xb, yb = x[idx.to(x.device)], y[idx.to(x.device)]
        loss = objective.loss(model, xb, yb, attack)
        optimizer.zero_grad(set_to_none=True)
        (loss + hooks.penalty(model) if hooks.penalty else loss).backward()
        if hooks.correct:
            hooks.correct(model)
        optimizer.step()
        total += loss.detach()
    return float(total) / iters


def evaluate(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, attack: Attack, batch: int = 512
) -> tuple[float, float]:
    """(clean accuracy, accuracy under `attack`) in [0, 1]."""
    model.eval()
    clean = adv = 0
    for i in range(0, len(x), batch):
        xb, yb = x[i:i + batch], y[i:i + batch]
        with torch.no_grad():
            clean += int((model(xb).argmax(1) == yb).sum())
        xa = attack(model, xb, yb)
        with torch.no_grad():
            adv += int((model(xa).argmax(1) == yb).sum())
    return clean / len(x), adv / len(x)
