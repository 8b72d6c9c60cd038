"""GMA's server: Gradient Masked Averaging (Tenison et al., TMLR 2023, Alg. 1 and App.): the server
takes each client's update Delta_n = w_n - w, averages them (weights s_n), and scales every
coordinate by the soft mask m = 1 where A = |mean_n sign(Delta_n)| >= tau, else A. A drop-in
aggregator ("for FedAvg, FedProx, FedAdam, FedYogi"): the masked update is applied with plain SGD
(FedAvg), server momentum (FedAvgM), FedAdagrad, FedAdam or FedYogi (`gma.server`; Reddi et al.'s
optimizer of edgefl.server.fedopt). Buffers (BN statistics) are averaged. `gma.tau = 0` masks
nothing (every agreement is >= 0): the server optimizer unmasked.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from edgefl.config import Check, Scenario, knob_section
from edgefl.server.base import RULES
from edgefl.server.fedopt import SERVER_OPTS, OptKnobs, ServerOpt, Stepped

GMA_BASES = ("fedavg", "fedprox")  # the client rules of method `gma` (`gma.base`): fedavg_at, fedprox_at


@knob_section("gma")
@dataclass
class GMAConfig(OptKnobs):
    """GMA (Tenison et al., TMLR): sign-agreement soft mask on the averaged update."""

    tau: float = 0.4  # the agreement threshold: coordinates below it are scaled by their agreement
    base: str = "fedavg"  # method gma's client side: fedavg | fedprox (any method: [server] rule = "gma")
    server: str = "sgd"  # server optimizer: sgd (FedAvg) | momentum (FedAvgM) | adagrad | adam | yogi
    server_lr: float = 1.0  # the server learning rate eta
    beta1: float = 0.9  # the first moment's decay (momentum, adagrad, adam, yogi)
    beta2: float = 0.99  # the second moment's decay (adam, yogi)
    adapt_eps: float = 1e-3  # tau of Reddi et al.'s adaptive optimizers

    def checks(self) -> list[Check]:
        return [
            ("tau", 0 <= self.tau <= 1, "must be in [0, 1]"),
            ("base", self.base in GMA_BASES, f"must be one of: {', '.join(GMA_BASES)}"),
            ("server", self.server in SERVER_OPTS, f"must be one of: {', '.join(SERVER_OPTS)}"),
            ("server_lr", self.server_lr > 0, "must be positive"),
            ("beta1", 0 <= self.beta1 < 1, "must be in [0, 1)"),
            ("beta2", 0 <= self.beta2 < 1, "must be in [0, 1)"),
            ("adapt_eps", self.adapt_eps > 0, "must be positive"),
        ]

    def server_opt(self) -> ServerOpt:
        return ServerOpt(self.server, self.server_lr, self.beta1, self.beta2, self.adapt_eps)


def gma_mask(deltas: Sequence[torch.Tensor], tau: float) -> torch.Tensor:
    """GMA's soft mask (Tenison et al., Alg. 1): A = |mean_n sign(delta_n)|; 1 where A >= tau,
    else A."""
    agreement = torch.stack([d.sign() for d in deltas]).mean(0).abs()
    return torch.where(agreement >= tau, torch.ones_like(agreement), agreement)


@RULES.register("gma")
class GMA(Stepped):
    """The server optimizer of `gma.server` with every coordinate's step scaled by GMA's mask."""

    knobs = GMAConfig

    def __init__(self, s: Scenario, model: nn.Module) -> None:
        super().__init__(s, model)
        self.tau = s.knobs(GMAConfig).tau

    def scale(self, deltas: list[torch.Tensor]) -> torch.Tensor | float:
        return gma_mask(deltas, self.tau)
