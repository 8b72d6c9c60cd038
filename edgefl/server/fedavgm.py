"""FedAvgM: FedAvg with server momentum (Hsu, Qi & Brown, "Measuring the Effects of Non-Identical
Data Distribution for Federated Visual Classification", 2019, §3): m = beta m + Delta, x += eta m,
Delta the clients' weighted mean update (edgefl.server.fedopt)."""

from __future__ import annotations

from dataclasses import dataclass

from edgefl.config import Check, knob_section
from edgefl.server.base import RULES
from edgefl.server.fedopt import OptKnobs, ServerOpt, Stepped


@knob_section("fedavgm")
@dataclass
class FedAvgMConfig(OptKnobs):
    """FedAvgM: server momentum beta and server learning rate eta (Hsu et al.: eta 1, beta 0.9)."""

    server_lr: float = 1.0  # the server learning rate eta: x += eta m
    momentum: float = 0.9  # beta: m = beta m + Delta (0: FedAvg)

    def checks(self) -> list[Check]:
        return [
            ("server_lr", self.server_lr > 0, "must be positive"),
            ("momentum", 0 <= self.momentum < 1, "must be in [0, 1)"),
        ]

    def server_opt(self) -> ServerOpt:
        return ServerOpt("momentum", self.server_lr, self.momentum)


@RULES.register("fedavgm")
class FedAvgM(Stepped):
    knobs = FedAvgMConfig
