"""Coordinate-wise trimmed mean (Yin, Chen, Ramchandran & Bartlett, "Byzantine-Robust Distributed
Learning: Towards Optimal Statistical Rates", ICML 2018, Def. 2): each coordinate of the new global
model is the mean of the clients' values left after dropping the floor(beta n) largest and the
floor(beta n) smallest, every client counted once (not by its samples)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from edgefl.config import Check, Knobs, Scenario, knob_section
from edgefl.server.base import RULES, ServerRule, State, Updates


@knob_section("trimmed_mean")
@dataclass
class TrimmedMeanConfig(Knobs):
    """The trimmed mean's beta (Yin et al., Def. 2)."""

    beta: float = 0.1  # the fraction of the round's clients dropped at each end of every coordinate

    def checks(self) -> list[Check]:
        return [("beta", 0 <= self.beta < 0.5, "must be in [0, 0.5)")]


def trimmed(states: Sequence[State], cut: int) -> State:
    """Each coordinate's mean over the clients after dropping its `cut` largest and `cut` smallest
    values (2 cut < the clients); integer buffers are rounded."""
    out: State = {}
    for key, first in states[0].items():
        ranked = torch.stack([s[key].double() for s in states]).sort(dim=0).values
        kept = ranked[cut:len(states) - cut].mean(0)
        out[key] = (kept if first.is_floating_point() else kept.round()).to(first.dtype)
    return out


@RULES.register("trimmed_mean")
class TrimmedMean(ServerRule):
    def __init__(self, s: Scenario, model: nn.Module) -> None:
        super().__init__(s, model)
        self.beta = s.knobs(TrimmedMeanConfig).beta

    def combine(self, round_: int, current: State, updates: Updates) -> State:
        return trimmed(updates.states, math.floor(self.beta * len(updates.states)))
