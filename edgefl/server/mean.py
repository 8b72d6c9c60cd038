"""FedAvg's server (McMahan et al., AISTATS 2017, Alg. 1): the clients' models averaged, each
weighted by its training samples."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from edgefl.server.base import RULES, ServerRule, State, Updates


def fedavg(states: Sequence[State], weights: Sequence[float]) -> State:
    """sum_k w_k x_k / sum_k w_k for every key; integer buffers (BN's counters) are rounded."""
    total = float(sum(weights))
    out: State = {}
    for key, first in states[0].items():
        acc = torch.stack([s[key].double() * (w / total)
                           for s, w in zip(states, weights, strict=True)]).sum(0)
        out[key] = (acc if first.is_floating_point() else acc.round()).to(first.dtype)
    return out


@RULES.register("mean")
class Mean(ServerRule):
    def combine(self, round_: int, current: State, updates: Updates) -> State:
        return fedavg(updates.states, updates.samples)
