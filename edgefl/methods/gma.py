"""GMA: Gradient Masked Averaging (Tenison et al., TMLR 2023, Alg. 1 and App.): the server takes
each client's update Delta_n = w_n - w, averages them (weights s_n), and scales every coordinate by
the soft mask m = 1 where A = |mean_n sign(Delta_n)| >= tau, else A. A drop-in aggregator: clients
run FedAvg or FedProx (`gma.base`); the server applies the masked update with plain SGD (FedAvg),
server momentum (FedAvgM), FedAdagrad, FedAdam or FedYogi (Reddi et al., ICLR 2021; the server
optimizer of edgefl.methods.fedopt) (`gma.server`). Buffers (BN statistics) are averaged.
`gma.tau = 0` masks nothing (every agreement is >= 0): the base optimiser unmasked.

Its paper's headline claim, checked on digits (`bench/claims.py gma`), and what edgefl measured:
docs/claims.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from edgefl.config import Check, Knobs, knob_section
from edgefl.methods.aggregate import gma_mask
from edgefl.methods.base import METHODS, Context, Method
from edgefl.methods.fedavg import FedAvgAT
from edgefl.methods.fedopt import SERVER_OPTS, FedOptAT, ServerOpt
from edgefl.methods.fedprox import FedProxAT

BASES: dict[str, type[FedAvgAT]] = {"fedavg": FedAvgAT, "fedprox": FedProxAT}


@knob_section("gma")
@dataclass
class GMAConfig(Knobs):
    """GMA (Tenison et al., TMLR): sign-agreement soft mask on the averaged update."""

    tau: float = 0.4  # the agreement threshold: coordinates below it are scaled by their agreement
    base: str = "fedavg"  # client side: fedavg | fedprox
    server: str = "sgd"  # server optimizer: sgd (FedAvg) | momentum (FedAvgM) | adagrad | adam | yogi
    server_lr: float = 1.0  # the server learning rate eta
    beta1: float = 0.9  # the first moment's decay (momentum, adagrad, adam, yogi)
    beta2: float = 0.99  # the second moment's decay (adam, yogi)
    adapt_eps: float = 1e-3  # tau of Reddi et al.'s adaptive optimizers

    def checks(self) -> list[Check]:
        return [
            ("tau", 0 <= self.tau <= 1, "must be in [0, 1]"),
            ("base", self.base in BASES, f"must be one of: {', '.join(BASES)}"),
            ("server", self.server in SERVER_OPTS, f"must be one of: {', '.join(SERVER_OPTS)}"),
            ("server_lr", self.server_lr > 0, "must be positive"),
            ("beta1", 0 <= self.beta1 < 1, "must be in [0, 1)"),
            ("beta2", 0 <= self.beta2 < 1, "must be in [0, 1)"),
            ("adapt_eps", self.adapt_eps > 0, "must be positive"),
        ]


class Masked(FedOptAT):
    """The server optimizer of `gma.server` with every coordinate's step scaled by GMA's mask."""

    def server_opt(self) -> ServerOpt:
        cfg = self.ctx.scenario.knobs(GMAConfig)
        return ServerOpt(cfg.server, cfg.server_lr, cfg.beta1, cfg.beta2, cfg.adapt_eps)

    def scale(self, deltas: list[torch.Tensor]) -> torch.Tensor | float:
        return gma_mask(deltas, self.ctx.scenario.knobs(GMAConfig).tau)


@METHODS.register("gma")
def gma(ctx: Context) -> Method:
    base = BASES[ctx.scenario.knobs(GMAConfig).base]
    return type(f"GMA[{base.__name__}]", (Masked, base), {})(ctx)
