"""Krum and multi-Krum (Blanchard, El Mhamdi, Guerraoui & Stainer, "Machine Learning with
Adversaries: Byzantine Tolerant Gradient Descent", NeurIPS 2017, §4): with n updates of which f may
be Byzantine, each client's score is the sum of the squared distances from its parameters to its
n - f - 2 nearest others' (at least one: a round of at most f + 2 clients scores by the nearest);
the new global model is the client with the smallest score, or with multi-Krum the plain mean of
the m smallest-scored clients (buffers included)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from edgefl.config import Check, Knobs, Scenario, knob_section
from edgefl.server.base import RULES, ServerRule, State, Updates, param_keys
from edgefl.server.mean import fedavg


@knob_section("krum")
@dataclass
class KrumConfig(Knobs):
    """Krum's f and multi-Krum's m (Blanchard et al. §4)."""

    f: int = 1  # the Byzantine clients tolerated per round
    m: int = 1  # how many lowest-scored clients are averaged (1: Krum)

    def checks(self) -> list[Check]:
        return [
            ("f", self.f >= 0, "must be non-negative"),
            ("m", self.m >= 1, "must be at least 1"),
        ]


def krum_scores(points: torch.Tensor, f: int) -> torch.Tensor:
    """Each row's score: the sum of its squared distances to its max(1, n - f - 2) nearest other
    rows of `points` [n, d]."""
    n = len(points)
    squared = torch.stack([((points - p) ** 2).sum(1) for p in points])
    squared.fill_diagonal_(float("inf"))  # a client is not its own neighbour
    nearest = max(1, n - f - 2)
    return squared.sort(dim=1).values[:, :nearest].sum(1)


@RULES.register("krum")
class Krum(ServerRule):
    def __init__(self, s: Scenario, model: nn.Module) -> None:
        super().__init__(s, model)
        self.cfg = s.knobs(KrumConfig)
        self.params = param_keys(model)

    def combine(self, round_: int, current: State, updates: Updates) -> State:
        points = torch.stack([torch.cat([s[k].double().flatten() for k in self.params])
                              for s in updates.states])
        chosen = krum_scores(points, self.cfg.f).argsort(stable=True)[:self.cfg.m].tolist()
        return fedavg([updates.states[i] for i in chosen], [1.0] * len(chosen))
