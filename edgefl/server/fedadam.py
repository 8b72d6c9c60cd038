"""FedAdam's server (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Alg. 2;
edgefl.server.fedopt): v = beta2 v + (1 - beta2) Delta^2."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from edgefl.config import knob_section
from edgefl.server.base import RULES
from edgefl.server.fedopt import DecayedConfig, Stepped


@knob_section("fedadam")
@dataclass
class FedAdamConfig(DecayedConfig):
    """FedAdam: v = beta2 v + (1 - beta2) Delta^2. beta1, beta2, tau: Reddi et al. §5; server_lr
    0.01: the FedAdam server lr of GMA's digits bench (edgefl.methods.gma)."""

    kind: ClassVar[str] = "adam"


@RULES.register("fedadam")
class FedAdam(Stepped):
    knobs = FedAdamConfig
