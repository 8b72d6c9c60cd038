"""GMA: Gradient Masked Averaging (Tenison et al., TMLR 2023, Alg. 1 and App.): the server takes
each client's update Delta_n = w_n - w, averages them (weights s_n), and scales every coordinate by
the soft mask m = 1 where A = |mean_n sign(Delta_n)| >= tau, else A. A drop-in aggregator: clients
run FedAvg or FedProx (`gma.base`); the server applies the masked update with plain SGD (FedAvg),
FedAdam or FedYogi (Reddi et al., ICLR 2021) (`gma.server`). Buffers (BN statistics) are averaged.
"""

from __future__ import annotations

import torch

from edgefl.methods.aggregate import State, adam_moments, fedavg, gma_mask
from edgefl.methods.base import METHODS, ClientUpdate, Context, Method
from edgefl.methods.fedavg import FedAvgAT
from edgefl.methods.fedprox import FedProxAT

BASES: dict[str, type[FedAvgAT]] = {"fedavg": FedAvgAT, "fedprox": FedProxAT}


class Masked(FedAvgAT):
    state_attrs = ("moments",)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.moments: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}

    def combine(self, round_: int, updates: list[ClientUpdate]) -> State:
        cfg = self.ctx.scenario.gma
        new = super().combine(round_, updates)  # buffers: plain average
        current = self.model.state_dict()
        weights = [u.num_samples for u in updates]
        for name, _ in self.model.named_parameters():
            deltas = [u.state[name] - current[name] for u in updates]
            delta = fedavg([{name: d} for d in deltas], weights)[name]
            step = delta
            if cfg.server != "sgd":
                start = (torch.zeros_like(delta), torch.full_like(delta, cfg.adapt_eps**2))
                z, v = self.moments.get(name, start)
                z, v = adam_moments(z, v, delta, cfg.beta1, cfg.beta2, yogi=cfg.server == "yogi")
                self.moments[name] = (z, v)
                step = z / (v.sqrt() + cfg.adapt_eps)
            new[name] = current[name] + cfg.server_lr * gma_mask(deltas, cfg.tau) * step
        return new


@METHODS.register("gma")
def gma(ctx: Context) -> Method:
    base = BASES[ctx.scenario.gma.base]
    return type(f"GMA[{base.__name__}]", (Masked, base), {})(ctx)
