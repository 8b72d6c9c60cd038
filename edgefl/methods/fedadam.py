"""FedAdam-AT: FedAvgAT's local adversarial training under the FedAdam server (Reddi et al.,
"Adaptive Federated Optimization", ICLR 2021, Alg. 2; edgefl.methods.fedopt)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from edgefl.config import knob_section
from edgefl.methods.base import METHODS
from edgefl.methods.fedopt import DecayedConfig, FedOptAT


@knob_section("fedadam")
@dataclass
class FedAdamConfig(DecayedConfig):
    """FedAdam: v = beta2 v + (1 - beta2) Delta^2. beta1, beta2, tau: Reddi et al. §5; server_lr
    0.01: the FedAdam server lr of GMA's digits bench (edgefl.methods.gma)."""

    kind: ClassVar[str] = "adam"


@METHODS.register("fedadam_at")
class FedAdamAT(FedOptAT):
    knobs = FedAdamConfig
