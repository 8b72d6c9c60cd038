"""PGD in an L2 ball, on images or on intermediate features (FedProphet §5.1, Eq. 7: the input
z_{m-1} of module m is perturbed within ||delta||_2 <= eps_{m-1}). As the authors' release
(utils/adversarial.py), the random start and every projected step are clipped so that x + delta
stays within [lower, upper]: [0, 1] for images; for features no upper bound, and a lower one only
where they have it (0 after a ReLU), so no part of the budget is spent outside the bounds.
FedProphet's feature attack steps 2.5 eps / T, as the release
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
    lower: float | None = 0.0  # x + delta kept at or above (None: no bound)
    upper: float | None = 1.0  # and at or below

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
        """delta with x + delta within [lower, upper] (its norm only shrinks: x is within them)."""
        if self.lower is None and self.upper is None:
            return delta
        return (x + delta).clamp(self.lower, self.upper) - x
