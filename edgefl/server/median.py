"""FedMedian: the coordinate-wise median (Yin, Chen, Ramchandran & Bartlett, "Byzantine-Robust
Distributed Learning: Towards Optimal Statistical Rates", ICML 2018, Def. 1): each coordinate of the
new global model is the median of the clients' values (the mean of the two middle ones for an even
count), every client counted once. It is the trimmed mean that keeps one value, or two."""

from __future__ import annotations

from edgefl.server.base import RULES, ServerRule, State, Updates
from edgefl.server.trimmed_mean import trimmed


@RULES.register("fedmedian")
class FedMedian(ServerRule):
    def combine(self, round_: int, current: State, updates: Updates) -> State:
        return trimmed(updates.states, (len(updates.states) - 1) // 2)
