"""FedProx-AT (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020; used as a
base optimiser in SFAT §5.2): local adversarial training with the proximal term
mu/2 ||w - w_global||^2 that keeps clients near the round's global model."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from edgefl.config import Check, Knobs, knob_section
from edgefl.methods.base import METHODS
from edgefl.methods.fedavg import FedAvgAT
from edgefl.server.base import State
from edgefl.training.local import Hooks


@knob_section("prox")
@dataclass
class ProxConfig(Knobs):
    """FedProx (Li et al., MLSys 2020): mu/2 ||w - w_global||^2 on the local loss."""

    mu: float = 0.01  # the proximal weight mu

    def checks(self) -> list[Check]:
        return [
            ("mu", self.mu >= 0, "must be non-negative"),
        ]


def proximal(mu: float, anchor: dict[str, torch.Tensor]) -> Hooks:
    """mu/2 sum ||w - anchor||^2 over the trainable parameters; its gradient is mu (w - anchor)."""

    def penalty(model: nn.Module) -> torch.Tensor:
        gaps = [((p - anchor[n]) ** 2).sum() for n, p in model.named_parameters()]
        return 0.5 * mu * torch.stack(gaps).sum()

    return Hooks(penalty=penalty)


@METHODS.register("fedprox_at")
class FedProxAT(FedAvgAT):
    def hooks(self, round_: int, client: int, start: State) -> Hooks:
        return proximal(self.ctx.scenario.knobs(ProxConfig).mu, start)
