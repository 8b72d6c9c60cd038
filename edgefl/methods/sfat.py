"""SFAT: Slack Federated Adversarial Training (Zhu et al., ICLR 2023, App. D Alg. 1).

At aggregation the k_hat clients with the smallest N_k/N L_k (L_k: their mean adversarial training
loss over the round's last local epoch, as the release) are weighted (1 + alpha) / (1 - alpha)
against 1 for the others, times N_k, normalised; BatchNorm is averaged plainly, as in the release.
Round 0 averages plainly. The client side is the base optimiser's (`sfat.base`: FedAvg, FedProx or
SCAFFOLD).

Headline claim (Zhu et al. Table 3): SFAT beats FAT (FedAvg-AT) on a non-IID split, natural and
robust. On digits (`bench/claims.py sfat`: scenarios/skew-digits.toml, skew s = 2, K = 5, all
clients every round, 2 local epochs, PGD-10 at eps 0.2, 30 rounds, alpha = 1/6, k_hat = 1;
seeds 0, 1, 2; mean +- std of the final round) edgefl reproduces the robust half, within the
seed spread, and not the natural half:

    FedAvg-AT  clean 92.9 +- 3.0  PGD-20 52.1 +- 5.0  (per seed 55.6, 46.4, 54.4)
    SFAT       clean 91.5 +- 6.2  PGD-20 54.1 +- 3.2  (per seed 56.7, 50.6, 55.0)

PGD-20 is 2.0 points higher on average, near the paper's margin on CIFAR-10, and higher on every
seed (by 0.6 to 4.2), but FedAvg-AT's seeds spread by 5 points; clean accuracy is 1.4 points lower.
(Ranked by the whole round's mean loss instead of the last epoch's, before the release was followed
there, SFAT gave 91.7 +- 5.4 / 55.1 +- 1.5.) Clients of one round are trained together by default
(`training.group_clients`, edgefl.execution.grouped), which sums in another order than one-by-one
training; over 30 rounds that moves each run by seed-noise sizes. One by one the same bench gave,
before grouped training existed, FedAvg-AT 94.4 +- 1.5 / 53.4 +- 5.9 (58.3, 46.9, 55.0) and SFAT
90.6 +- 6.5 / 55.7 +- 1.7 (53.9, 56.1, 57.2): +2.3 PGD-20 on average with SFAT lower on seed 0, and
3.8 clean points lower (`--seeds 0 --set training.group_clients=false` still gives 58.3 and 53.9).

Read line by line against App. D Alg. 1 (the loss ranking N_k/N L_k, the k_hat-th smallest as the
threshold, ties included, the (1 + alpha) / (1 - alpha) boost times N_k, normalised, BN averaged
as FedAvg) the aggregation matches; the one addition is the plain average of round 0. So the
setting is the suspect, not the method: 30 rounds of 8x8 digits with 5 clients against the
paper's 100 rounds of CIFAR-10 at E = 10, where seed noise (5-6 points for FedAvg-AT here) is
larger than the effect.
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
