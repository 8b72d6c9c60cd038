"""FGSM: x + eps * sign(grad_x CE) (Goodfellow, Shlens & Szegedy, ICLR 2015)."""

from __future__ import annotations

import torch
from torch import nn

from edgefl.attacks.base import ATTACKS, Attack, input_gradient


@ATTACKS.register("fgsm")
class FGSM(Attack):
    """One signed-gradient step of size eps (step_size and steps are not used)."""

    gradient_steps = 1  # one pass pair, whatever `steps` says

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x + self.eps * input_gradient(model, x, y, self.loss).sign()).clamp(0, 1)
