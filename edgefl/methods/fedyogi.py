"""FedYogi-AT: FedAvgAT's local adversarial training under the FedYogi server (Reddi et al.,
"Adaptive Federated Optimization", ICLR 2021, Alg. 2; edgefl.methods.fedopt)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from edgefl.config import knob_section
from edgefl.methods.base import METHODS
from edgefl.methods.fedopt import DecayedConfig, FedOptAT


@knob_section("fedyogi")
@dataclass
class FedYogiConfig(DecayedConfig):
    """FedYogi: v = v - (1 - beta2) Delta^2 sign(v - Delta^2). beta1, beta2, tau: Reddi et al. §5;
    server_lr 0.01 as FedAdam's."""

    kind: ClassVar[str] = "yogi"


@METHODS.register("fedyogi_at")
class FedYogiAT(FedOptAT):
    knobs = FedYogiConfig
