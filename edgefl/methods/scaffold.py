"""SCAFFOLD-AT (Karimireddy et al., ICML 2020, Alg. 1 option II; a base optimiser in SFAT §5.2).

Each local step is plain SGD on g - c_k + c (the update rule the control variates are derived for;
with momentum, c_k would be about 1 / (1 - momentum) too large and training diverges); after K
steps the client's control variate becomes
c_k+ = c_k - c + (x - y_k) / (K lr) and it uploads y_k and c_k+ - c_k; the server averages the
models (global step size 1) and sets c <- c + |S|/N mean(c_k+ - c_k). The control variates travel
with the model: c down, the change of c_k up.
"""

from __future__ import annotations

import torch
from torch import nn

from edgefl.methods.base import METHODS, ClientPlan, ClientUpdate, Context
from edgefl.methods.fedavg import FedAvgAT
from edgefl.server.base import State
from edgefl.training.local import Hooks


@METHODS.register("scaffold_at")
class ScaffoldAT(FedAvgAT):
    state_attrs = ("c", "c_local")
    ignores = ("training.optimizer",)  # its local steps are plain SGD (the module docstring)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.slots = 2  # priced as it runs: plain SGD (no momentum buffer) with c and c_k per weight
        self.c = {n: torch.zeros_like(p) for n, p in self.model.named_parameters()}
        self.c_local: dict[int, dict[str, torch.Tensor]] = {}

    def optimizer(self, model: nn.Module, plan: ClientPlan) -> torch.optim.Optimizer:
        return torch.optim.SGD(model.parameters(), lr=plan.lr,
                               weight_decay=self.ctx.scenario.training.weight_decay)

    def extra_bytes(self, client: int) -> tuple[float, float]:
        size = float(sum(t.numel() * t.element_size() for t in self.c.values()))
        return size, size

    def hooks(self, round_: int, client: int, start: State) -> Hooks:
        ck = self.c_local.get(client, {n: torch.zeros_like(t) for n, t in self.c.items()})
        shift = {n: self.c[n] - ck[n] for n in self.c}

        def correct(model: nn.Module) -> None:
            for n, p in model.named_parameters():
                if p.grad is not None:
                    p.grad.add_(shift[n])

        return Hooks(correct=correct)

    def after_local(self, round_: int, client: int, model: nn.Module, update: ClientUpdate,
                    plan: ClientPlan) -> None:
        steps, lr = plan.workload.iterations, plan.lr
        x = dict(self.model.named_parameters())
        ck = self.c_local.get(client, {n: torch.zeros_like(t) for n, t in self.c.items()})
        new = {n: ck[n] - self.c[n] + (x[n].detach() - p.detach()) / (steps * lr)
               for n, p in model.named_parameters()}
        update.extra["delta_c"] = {n: new[n] - ck[n] for n in new}
        update.extra["c_local"] = new

    def combine(self, round_: int, updates: list[ClientUpdate]) -> State:
        share = len(updates) / self.ctx.scenario.fleet.clients
        self.c_local.update({u.client: u.extra["c_local"] for u in updates})
        for n in self.c:
            self.c[n] = self.c[n] + share * torch.stack([u.extra["delta_c"][n] for u in updates]).mean(0)
        return super().combine(round_, updates)
