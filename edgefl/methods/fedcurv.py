"""FedCurvAT (Shah et al., "Adversarial training in communication constrained federated learning",
§2.2; FedCurv of Shoham et al.): each client adds lambda sum_{j != k} (w - w_j)^T diag(F_j) (w - w_j)
over the other clients' models and Fisher diagonals from the previous round, and uploads its own
Fisher diagonal (the mean over its samples of each sample's squared loss gradient) beside its
model. The penalty needs only sum_j F_j and sum_j F_j w_j, which the server sends down (twice the
model's parameters).

Fixed after a line-by-line reading: the Fisher was the square of each batch's mean gradient, and
a digits client's ~230 samples fit one batch of 256, so F_j was the squared full-data gradient,
near zero once the client had trained, and FedCurvAT was FedAvgAT in all but name.

Its paper's headline claim, checked on digits (`bench/claims.py feddyn`), and what edgefl measured:
docs/claims.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from edgefl.config import Check, Knobs, knob_section
from edgefl.data.datasets import to_float
from edgefl.methods.base import METHODS, ClientPlan, ClientUpdate, Context
from edgefl.methods.fedavg import FedAvgAT
from edgefl.server.base import State
from edgefl.sim.workload import train_pass_flops
from edgefl.training.local import Hooks

Tensors = dict[str, torch.Tensor]
GRAD_BYTES = 1e9  # per-sample gradients held at once by the Fisher pass (VGG16: 16 samples)


@knob_section("curv")
@dataclass
class CurvConfig(Knobs):
    """FedCurv (Shah et al. §2.2): lambda sum_j (w - w_j)^T diag(F_j) (w - w_j)."""

    lam: float = 5.0  # Shah et al. use 5 for NIN and VGG

    def checks(self) -> list[Check]:
        return [
            ("lam", self.lam >= 0, "must be non-negative"),
        ]


def curvature_penalty(lam: float, fisher_sum: Tensors, weighted_sum: Tensors, const: torch.Tensor) -> Hooks:
    """lambda sum_j (w - w_j)^2 F_j = lambda (w^2 sum F_j - 2 w sum F_j w_j + sum F_j w_j^2)."""

    def penalty(model: nn.Module) -> torch.Tensor:
        quad = torch.stack([(p * p * fisher_sum[n] - 2 * p * weighted_sum[n]).sum()
                            for n, p in model.named_parameters()]).sum()
        return lam * (quad + const)

    return Hooks(penalty=penalty)


def fisher_diagonal(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int = 256) -> Tensors:
    """Empirical Fisher diagonal (FedCurv, Shoham et al. §3; EWC, Kirkpatrick et al.): the mean over
    the samples of each sample's squared loss gradient, (1/N) sum_i (d CE(f(x_i), y_i) / d w)^2.

    Per sample, not per batch: the square of a batch's mean gradient is not the Fisher (it shrinks
    with the batch and vanishes near a minimum of the local loss). The model is evaluated as the
    server would (eval mode: BatchNorm on its running statistics). `batch` only bounds memory: at
    most `batch` samples at a time, and no more than keep their per-sample gradients (4 B x the
    parameters each) within `GRAD_BYTES`.
    """
    params = {n: p.detach() for n, p in model.named_parameters()}
    batch = max(1, min(batch, int(GRAD_BYTES // (4 * sum(p.numel() for p in params.values())))))
    buffers = dict(model.named_buffers())

    def sample_loss(p: Tensors, xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        logits = torch.func.functional_call(model, (p, buffers), (xi.unsqueeze(0),))
        return nn.functional.cross_entropy(logits, yi.unsqueeze(0))

    per_sample = torch.func.vmap(torch.func.grad(sample_loss), in_dims=(None, 0, 0))
    sums = {n: torch.zeros_like(p) for n, p in params.items()}
    was_training = model.training
    model.eval()
    for i in range(0, len(x), batch):
        for n, g in per_sample(params, to_float(x[i:i + batch]), y[i:i + batch]).items():
            sums[n] += (g * g).sum(0)
    model.train(was_training)
    return {n: s / len(x) for n, s in sums.items()}


@METHODS.register("fedcurv_at")
class FedCurvAT(FedAvgAT):
    state_attrs = ("previous",)

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.previous: dict[int, tuple[Tensors, Tensors]] = {}  # client -> (weights, Fisher), last round

    def param_bytes(self) -> float:
        return float(sum(p.numel() * p.element_size() for p in self.model.parameters()))

    def extra_bytes(self, client: int) -> tuple[float, float]:
        return 2 * self.param_bytes(), self.param_bytes()

    def extra_flops(self, client: int) -> float:
        """The Fisher pass: a forward and a training backward over the client's data."""
        return len(self.ctx.splits[client].train) * train_pass_flops(self.ctx.profile.atoms)

    def hooks(self, round_: int, client: int, start: State) -> Hooks:
        others = [v for k, v in self.previous.items() if k != client]
        if not others:
            return Hooks()
        names = [n for n, _ in self.model.named_parameters()]
        f_sum = {n: torch.stack([f[n] for _, f in others]).sum(0) for n in names}
        fw_sum = {n: torch.stack([f[n] * w[n] for w, f in others]).sum(0) for n in names}
        const = torch.stack([(f[n] * w[n] ** 2).sum() for w, f in others for n in names]).sum()
        return curvature_penalty(self.ctx.scenario.knobs(CurvConfig).lam, f_sum, fw_sum, const)

    def after_local(self, round_: int, client: int, model: nn.Module, update: ClientUpdate,
                    plan: ClientPlan) -> None:
        x, y = self.ctx.client_data(client)
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        update.extra["curvature"] = (weights, fisher_diagonal(model, x, y))

    def combine(self, round_: int, updates: list[ClientUpdate]) -> State:
        self.previous = {u.client: u.extra["curvature"] for u in updates}
        return super().combine(round_, updates)
