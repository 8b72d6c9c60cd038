"""Power-of-choice selection (Cho, Wang, Joshi: "Client Selection in Federated Learning: Convergence
Analysis and Power-of-Choice Selection Strategies", 2020).

The server samples d candidates without replacement with probability proportional to their data
fraction p_k, then picks the m of them with the highest local loss F_k(w). Asking every candidate
for its loss on the current model costs a round trip edgefl's server does not play, so the loss is
the one the client last reported with its update (the paper's communication-free variant, rpow-d);
a candidate never picked ranks first, so that every client is tried, and one picked before that
never reported a loss (late, offline or dropped every time) ranks last, so that a chronic
straggler is not picked every time it is drawn (ties keep the seeded candidates' order). In a dry
run no loss exists, so the picks are the first m candidates of the data-size draw, and say so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgefl.config import Check, Knobs, Scenario, knob_section
from edgefl.devices.pool import selected_per_round
from edgefl.selection.base import SELECTORS, Ask, Known, Picked, Selector, weighted_draw


@knob_section("power_of_choice")
@dataclass
class PowerOfChoiceConfig(Knobs):
    """Power-of-choice's knob (Cho et al. 2020, Sec. 3)."""

    d: int = 0  # candidates sampled by data size (0 = twice the clients picked)

    def fits(self, s: Scenario) -> list[Check]:
        picked = selected_per_round(s.fleet)
        return [("d", self.d == 0 or picked <= self.d <= s.fleet.clients,
                 f"must be 0 (twice the clients picked) or between the clients picked per round ({picked}) "
                 f"and fleet.clients ({s.fleet.clients})")]


@SELECTORS.register("power_of_choice")
class PowerOfChoice(Selector):
    """d candidates by data size, the m highest losses among them."""

    def __init__(self, s: Scenario) -> None:
        self.d = s.knobs(PowerOfChoiceConfig).d

    def candidates(self, ask: Ask) -> int:
        """d, or twice the clients picked; never more than the population."""
        return min(ask.clients, self.d or 2 * ask.count)

    def select(self, ask: Ask, known: Known) -> Picked:
        sizes = ask.sizes().astype(np.float64)
        pool = ask.candidates(np.arange(ask.clients))
        drawn = weighted_draw(ask.rng(), pool, sizes[pool], min(len(pool), self.candidates(ask)))
        loss, tried = known.loss[drawn], known.last_round[drawn] >= 0
        key = np.where(np.isnan(loss), np.where(tried, -np.inf, np.inf), loss)
        rank = np.argsort(-key if not ask.dry_run else np.zeros(len(drawn)), kind="stable")[:ask.count]
        picked, utility = drawn[rank], loss[rank]
        if ask.dry_run:
            reason = ["dry run: no losses, drawn by data size"] * len(picked)
        else:
            reason = ["highest loss" if not np.isnan(u) else "no loss reported" if t else "no loss yet"
                      for u, t in zip(utility.tolist(), tried[rank].tolist(), strict=True)]
        return Picked.of(picked, utility, reason)
