"""Uniform selection: a seeded draw of a fraction of the population, the same clients every edgefl
before selection policies picked (DevicePool.sampled)."""

from __future__ import annotations

import numpy as np

from edgefl.selection.base import SELECTORS, Ask, Known, Picked, Selector


@SELECTORS.register("uniform")
class Uniform(Selector):
    """Every client equally likely, whatever the server knows."""

    def select(self, ask: Ask, known: Known) -> Picked:
        clients = ask.pool.sampled(ask.round)
        return Picked.of(clients, np.full(len(clients), np.nan), ["uniform"] * len(clients))
