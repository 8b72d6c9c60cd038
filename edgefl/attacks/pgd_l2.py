"""PGD in an L2 ball, for intermediate features (FedProphet §5.1, Eq. 7: the input z_{m-1} of
module m is perturbed within ||delta||_2 <= eps_{m-1}). Features have no [0, 1] box; a lower bound
(0 after a ReLU) can be kept: as the authors' release (utils/adversarial.py), the random start and
every projected step are clipped so that x + delta stays above it, so no part of the budget is spent
pushing features below the bound. FedProphet's feature attack steps 2.5 eps / T, as the release
(edgefl.methods.fedprophet.cascade.feature_attack).
"""

from __future__ import annotations

import torch
from torch import nn

from edgefl.attacks.base import ATTACKS, Attack, input_gradient, normal_like, uniform_like


def _per_sample_norm(t: torch.Tensor) -> torch.Tensor:
    return t.flatten(1).norm(dim=1).clamp_min(1e-12).view(-1, *([1] * (t.dim() - 1)))


@ATTACKS.register("pgd_l2")
class PGDL2(Attack):
    lower: float | None = None  # clamp perturbed features from below (e.g. 0 after a ReLU)

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        delta = normal_like(x)
        radius = uniform_like(torch.empty(len(x), *([1] * (x.dim() - 1)), device=x.device))
        delta = self._clip(x, delta / _per_sample_norm(delta) * self.eps * radius)
        for _ in range(self.steps):
            grad = input_gradient(model, x + delta, y, self.loss)
            delta = delta + self.step_size * grad / _per_sample_norm(grad)
            delta = self._clip(x, delta * (self.eps / _per_sample_norm(delta)).clamp(max=1.0))
        return x + delta

    def _clip(self, x: torch.Tensor, delta: torch.Tensor) -> torch.Tensor:
        """delta with x + delta at or above `lower` (its norm only shrinks: x is above it)."""
        return delta if self.lower is None else (x + delta).clamp_min(self.lower) - x
