"""FedYogi's server (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Alg. 2;
edgefl.server.fedopt): v = v - (1 - beta2) Delta^2 sign(v - Delta^2)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from edgefl.config import knob_section
from edgefl.server.base import RULES
from edgefl.server.fedopt import DecayedConfig, Stepped


@knob_section("fedyogi")
@dataclass
class FedYogiConfig(DecayedConfig):
    """FedYogi: v = v - (1 - beta2) Delta^2 sign(v - Delta^2). beta1, beta2, tau: Reddi et al. §5;
    server_lr 0.01 as FedAdam's."""

    kind: ClassVar[str] = "yogi"


@RULES.register("fedyogi")
class FedYogi(Stepped):
    knobs = FedYogiConfig
