"""A run's pricing: the scenario's cost model bound to the fleet and the clients' sample counts.

Every round's clients are priced in one call, as columns (`CostModel.price`, edgefl.sim.cost: the
walk accounting in bulk with NumPy, the paper accounting client by client); a `Pricer` is what the
rounds hold, so that they ask for a round's prices with its plans and states alone.
"""

from __future__ import annotations

from collections.abc import Callable

from edgefl.devices.pool import DevicePool, States
from edgefl.sim.cost import CostModel, Costs, P, RoundPlan


class Pricer:
    """Prices a run's rounds by `model` on `pool`'s devices; `samples(client)` is a client's
    training-set size (asked only by an accounting that charges it: the paper's)."""

    def __init__(self, model: CostModel, pool: DevicePool, samples: Callable[[int], int]) -> None:
        self.model, self.pool, self.samples = model, pool, samples

    def price(self, plan: RoundPlan[P], states: States) -> Costs:
        return self.model.price(plan, states, self.pool, self.samples)
