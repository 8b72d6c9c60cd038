"""SFAT: Slack Federated Adversarial Training (Zhu et al., ICLR 2023, App. D Alg. 1).

At aggregation the k_hat clients with the smallest N_k/N L_k (L_k: their mean adversarial training
loss over the round's last local epoch, as the release) are weighted (1 + alpha) / (1 - alpha)
against 1 for the others, times N_k, normalised; BatchNorm is averaged plainly, as in the release.
Round 0 averages plainly. The client side is the base optimiser's (`sfat.base`: FedAvg, FedProx or
SCAFFOLD).

Its paper's headline claim, checked on digits (`bench/claims.py sfat`), and what edgefl measured:
docs/claims.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgefl.config import Check, Knobs, knob_section
from edgefl.methods.aggregate import State, bn_keys, fedavg, slack_weights
from edgefl.methods.base import METHODS, ClientPlan, ClientUpdate, Context, Method, refuse_ignored
from edgefl.methods.fedavg import FedAvgAT
from edgefl.methods.fedprox import FedProxAT
from edgefl.methods.scaffold import ScaffoldAT

BASES: dict[str, type[FedAvgAT]] = {"fedavg": FedAvgAT, "fedprox": FedProxAT, "scaffold": ScaffoldAT}


@knob_section("sfat")
@dataclass
class SFATConfig(Knobs):
    """SFAT (Zhu et al., ICLR 2023): the k_hat lowest-loss clients weighted (1 + a) / (1 - a)."""

    alpha: float = 1 / 6  # (1 + a) / (1 - a) = 1.4 on CIFAR-10; 1/11 on CIFAR-100 and SVHN
    k_hat: int = 1  # how many lowest-loss clients are boosted
    base: str = "fedavg"  # fedavg | fedprox | scaffold

    def checks(self) -> list[Check]:
        return [
            ("alpha", 0 <= self.alpha < 1, "must be in [0, 1)"),
            ("k_hat", self.k_hat >= 1, "must be at least 1"),
            ("base", self.base in BASES, f"must be one of: {', '.join(BASES)}"),
        ]


class Slack(FedAvgAT):
    """Overrides FedAvg's combine with the alpha-slack weights; the base's hooks stay."""

    def scored_iterations(self, plan: ClientPlan, samples: int) -> int:
        """L_k is the last local epoch's mean loss (the release's update_weights_at resets its sum
        every epoch): about its last epoch, its last ceil(N_k / B) full batches (batches walk on
        across fresh permutations, where the release ends an epoch with a short one)."""
        return math.ceil(samples / min(plan.workload.batch, samples))

    def combine(self, round_: int, updates: list[ClientUpdate]) -> State:
        plain = super().combine(round_, updates)
        if round_ == 0:
            return plain
        cfg = self.ctx.scenario.knobs(SFATConfig)
        weights = slack_weights([u.loss for u in updates], [u.num_samples for u in updates], cfg.alpha,
                                min(cfg.k_hat, len(updates)))
        bn = bn_keys(self.model)
        slack = fedavg([{k: v for k, v in u.state.items() if k not in bn} for u in updates], weights)
        return {**plain, **slack}


@METHODS.register("sfat")
def sfat(ctx: Context) -> Method:
    base = BASES[ctx.scenario.knobs(SFATConfig).base]
    refuse_ignored(ctx.scenario, base, f"sfat on {base.__name__}", ctx.where)
    return type(f"SFAT[{base.__name__}]", (Slack, base), {})(ctx)
