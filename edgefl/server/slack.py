"""SFAT's server: alpha-slack aggregation (Zhu et al., "Combating Exacerbated Heterogeneity for
Robust Models in Federated Learning", ICLR 2023, App. D Alg. 1).

From round 1 on, the k_hat clients with the smallest N_k/N L_k (L_k: their mean adversarial
training loss over the round's last local epoch, as the release) are weighted (1 + alpha) /
(1 - alpha) against 1 for the others, times N_k, normalised; BatchNorm is averaged plainly, as in
the release. Round 0 averages plainly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from edgefl.config import Check, Knobs, Scenario, knob_section
from edgefl.server.base import RULES, ServerRule, State, Updates, bn_keys
from edgefl.server.mean import fedavg

SFAT_BASES = ("fedavg", "fedprox", "scaffold")  # method sfat's client rules (`sfat.base`): *_at


@knob_section("sfat")
@dataclass
class SFATConfig(Knobs):
    """SFAT (Zhu et al., ICLR 2023): the k_hat lowest-loss clients weighted (1 + a) / (1 - a)."""

    alpha: float = 1 / 6  # (1 + a) / (1 - a) = 1.4 on CIFAR-10; 1/11 on CIFAR-100 and SVHN
    k_hat: int = 1  # how many lowest-loss clients are boosted
    base: str = "fedavg"  # method sfat's client side: fedavg | fedprox | scaffold (any method:
    #   [server] rule = "slack")

    def checks(self) -> list[Check]:
        return [
            ("alpha", 0 <= self.alpha < 1, "must be in [0, 1)"),
            ("k_hat", self.k_hat >= 1, "must be at least 1"),
            ("base", self.base in SFAT_BASES, f"must be one of: {', '.join(SFAT_BASES)}"),
        ]


def slack_weights(losses: Sequence[float], samples: Sequence[int], alpha: float, k_hat: int) -> list[float]:
    """SFAT's alpha-slack aggregation weights (Zhu et al., App. D Alg. 1, and its release): the
    k_hat clients with the smallest N_k/N L_k get (1 + alpha) / (1 - alpha), the others 1, each
    times N_k, normalised to sum to one."""
    total = sum(samples)
    scores = [n / total * loss for n, loss in zip(samples, losses, strict=True)]
    threshold = sorted(scores)[k_hat - 1]  # Alg. 1: score <= the k_hat-th smallest (ties included)
    boost = (1 + alpha) / (1 - alpha)
    raw = [n * (boost if score <= threshold else 1.0) for n, score in zip(samples, scores, strict=True)]
    return [w / sum(raw) for w in raw]


@RULES.register("slack")
class Slack(ServerRule):
    """The alpha-slack weights on every key but BatchNorm's, which is averaged plainly."""

    def __init__(self, s: Scenario, model: nn.Module) -> None:
        super().__init__(s, model)
        self.cfg = s.knobs(SFATConfig)
        self.bn = bn_keys(model)

    def scored_iterations(self, batch: int, samples: int) -> int:
        """L_k is the last local epoch's mean loss (the release's update_weights_at resets its sum
        every epoch): about its last epoch, its last ceil(N_k / B) full batches (batches walk on
        across fresh permutations, where the release ends an epoch with a short one)."""
        return math.ceil(samples / min(batch, samples))

    def combine(self, round_: int, current: State, updates: Updates) -> State:
        if round_ == 0:
            return fedavg(updates.states, updates.samples)
        plain = fedavg([{k: s[k] for k in self.bn} for s in updates.states], updates.samples)  # BatchNorm
        weights = slack_weights(updates.losses, updates.samples, self.cfg.alpha,
                                min(self.cfg.k_hat, len(updates.states)))
        slack = fedavg([{k: v for k, v in s.items() if k not in self.bn} for s in updates.states], weights)
        merged = {**plain, **slack}
        return {k: merged[k] for k in updates.states[0]}  # in the model's order
