"""Memory-fit selection, edgefl's own: prefer the devices whose available memory this round (the
fleet's draws R_k(t), FedProphet §7.1) holds the method's workload without swapping.

The workload's need is the memory the cost model asks (`CostModel.memory_need`) for the method's
plan this round of a client with the fleet's largest memory: the workload as the method wants it,
before any method that adapts to memory shrinks it (edgefl.selection.server.workload_need). Every
client whose draw holds it is equally welcome: the m picks are the first fitting clients in a seeded
random order (so the fitting clients are a uniform draw, and no fast device is favoured beyond
fitting). When fewer than m fit, all of them are taken and the rest are the clients short of memory
that come closest (the highest available / needed ratio; equal ratios keep the seeded order): they
swap, and the cost model charges it. The logged utility is that ratio.
"""

from __future__ import annotations

import numpy as np

from edgefl.selection.base import SELECTORS, Ask, Known, Picked, Selector


@SELECTORS.register("memory_fit")
class MemoryFit(Selector):
    """Fitting clients first, uniformly; then the nearest misses."""

    def select(self, ask: Ask, known: Known) -> Picked:
        order = ask.candidates(ask.rng().permutation(ask.clients))
        ratio = ask.memory_bytes(order) / ask.need_bytes()
        fits = ratio >= 1
        ranked = np.concatenate([np.flatnonzero(fits),
                                 np.flatnonzero(~fits)[np.argsort(-ratio[~fits], kind="stable")]])
        chosen = ranked[:ask.count]
        return Picked.of(order[chosen], ratio[chosen],
                         ["fits" if f else "short of memory" for f in fits[chosen].tolist()])
