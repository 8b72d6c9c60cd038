"""PGD-Linf with a uniform random start (Madry et al., ICLR 2018).

Defaults as in FedProphet §7.1: eps 8/255, step 2/255, 10 steps for training (PGD-20 to evaluate).
"""

from __future__ import annotations

import torch
from torch import nn

from edgefl.attacks.base import ATTACKS, Attack, input_gradient, uniform_like


@ATTACKS.register("pgd")
class PGD(Attack):
    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        delta = uniform_like(x, -self.eps, self.eps)
        x_adv = (x + delta).clamp(0, 1)
        for _ in range(self.steps):
            x_adv = x_adv + self.step_size * input_gradient(model, x_adv, y, self.loss).sign()
            x_adv = torch.min(torch.max(x_adv, x - self.eps), x + self.eps).clamp(0, 1)
        return x_adv
