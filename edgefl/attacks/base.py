"""The attack interface and registry. Inputs live in [0, 1]; models normalise inside."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import nn

from edgefl.registry import Registry

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (model output, target) -> scalar


class Attack(ABC):
    """Crafts adversarial inputs that raise `loss` (cross-entropy unless given) within an eps ball."""

    def __init__(self, eps: float = 8 / 255, step_size: float = 2 / 255, steps: int = 10,
                 loss: Loss = nn.functional.cross_entropy) -> None:
        self.eps = eps
        self.step_size = step_size
        self.steps = steps
        self.loss = loss

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Adversarial x for `model`, crafted with the model in eval mode (BN statistics fixed) and
        its parameters frozen: an attack takes gradients with respect to inputs only, so autograd
        records no parameter edges (and grouped training folds BatchNorm into constant weights).
        Not for a model another thread trains meanwhile (its backward would find them frozen)."""
        was_training = model.training
        trained = [p for p in model.parameters() if p.requires_grad]
        model.eval()
        for p in trained:
            p.requires_grad_(False)
        try:
            return self.perturb(model, x, y).detach()
        finally:
            for p in trained:
                p.requires_grad_(True)
            model.train(was_training)

    @abstractmethod
    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...


ATTACKS: Registry[type[Attack]] = Registry("attack")


def make_attack(name: str, eps: float, step_size: float, steps: int) -> Attack:
    return ATTACKS.get(name)(eps=eps, step_size=step_size, steps=steps)


def input_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                   loss: Loss = nn.functional.cross_entropy) -> torch.Tensor:
    """d loss(model(x), y) / d x."""
    x = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(model(x), y), x)
    return grad
