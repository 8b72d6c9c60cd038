"""Uniform selection: a seeded draw of a fraction of the population, the same clients every edgefl
before selection policies picked (DevicePool.sampled)."""

from __future__ import annotations

from edgefl.selection.base import SELECTORS, Ask, Known, Picked, Selector


@SELECTORS.register("uniform")
class Uniform(Selector):
    """Every client equally likely, whatever the server knows: the pool's seeded sample of the
    whole fleet, whose size is the fleet's clients per round (`ask.count` when the fleet is not
    living). A living fleet (who is online, async draws) picks its uniform clients itself, in
    edgefl.experiment.living, and never asks this policy."""

    def select(self, ask: Ask, known: Known) -> Picked:
        assert ask.online is None and ask.draw is None, "a living fleet picks its uniform clients itself"
        return Picked.uniform(ask.pool.sampled(ask.round))
