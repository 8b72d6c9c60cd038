"""FedAdagrad's server (Reddi et al., "Adaptive Federated Optimization", ICLR 2021, Alg. 2;
edgefl.server.fedopt): v = v + Delta^2."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from edgefl.config import knob_section
from edgefl.server.base import RULES
from edgefl.server.fedopt import FedOptConfig, Stepped


@knob_section("fedadagrad")
@dataclass
class FedAdagradConfig(FedOptConfig):
    """FedAdagrad: v = v + Delta^2 (no beta2). beta1, tau: Reddi et al. §5; server_lr 0.1: v only
    grows, so a larger step than FedAdam's (chosen among 0.01, 0.03 and 0.1 on quickstart's digits)."""

    kind: ClassVar[str] = "adagrad"
    server_lr: float = 0.1  # the server learning rate eta (Adagrad steps shrink: a larger start)


@RULES.register("fedadagrad")
class FedAdagrad(Stepped):
    knobs = FedAdagradConfig
