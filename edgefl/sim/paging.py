"""What the swap walk keeps resident as one piece, and how many micro-batches a batch is split into.

A runtime that cannot hold one atom's step pages at a finer grain, as a real one would: the
atom's layers become the pieces (a layer's weights, gradient, optimizer state and saved
activations are fetched and evicted on their own), or the batch is run as micro-batches of equal
size with gradients accumulated (a step's activations, in-flight tensors and pinned batch shrink
with the micro-batch; the parameters are walked once per micro-batch). Atoms whose step fits stay
whole, and while every atom's step fits at the full batch that is the one plan, however much it
evicts (jFAT swaps the model as it is, FedProphet §3). Below that, every plan that fits is tried,
at each number of micro-batches that divides the batch: the atoms that do not fit whole by layers,
and all atoms whole; the device runs the one it runs fastest (edgefl.sim.cost.plan_seconds: its
storage time plus its compute, which more micro-batches make longer). A device can so take
longer with a little more memory: micro-batched just below the budget where the full batch's steps
fit, swapping at the full batch from there up (docs/time.md, "data access", gives the quickstart's
round on a Raspberry Pi 4 as the example).
(Below that point, too, a larger budget can cost a little more: the same plan moving the same
bytes in more, smaller operations, each with its latency.)
The smallest budget any schedule runs in is the largest step of the finest one: every atom whole or
by layers, whichever needs less, one sample at a time (FedProphet, Tang et al., §4 sets the problem:
MemReq above the device's memory forces swapping). Not modelled: a layer whose backward reads a
tensor saved by the layer before it (the first saver is charged, edgefl.profiling.atoms), a residual
block's input held for its addition, and the per-micro-batch statistics of batch normalisation.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from edgefl.sim.records import BYTES
from edgefl.sim.workload import Workload


@dataclass(frozen=True)
class Part:
    """One piece the walk keeps resident whole (per sample sizes)."""

    atom: int  # index of the atom it belongs to
    name: str
    params: int
    in_elems: int
    out_elems: int
    saved_bytes: float


@dataclass(frozen=True)
class Plan:
    """The pieces in forward order and the micro-batches per batch (a divisor of the batch)."""

    parts: tuple[Part, ...]
    micro: int = 1

    def micro_batch(self, w: Workload) -> int:
        return w.batch // self.micro


def whole(w: Workload, i: int) -> Part:
    a = w.atoms[i]
    return Part(i, a.name, a.params, a.in_elems, a.out_elems, a.saved_bytes)


def layers(w: Workload, i: int) -> tuple[Part, ...]:
    """Atom i by layers (the whole atom when its profile has no layers)."""
    a = w.atoms[i]
    return tuple(Part(i, x.name, x.params, x.in_elems, x.out_elems, x.saved_bytes)
                 for x in a.layers) or (whole(w, i),)


def whole_atoms(w: Workload) -> Plan:
    return Plan(tuple(whole(w, i) for i in range(len(w.atoms))))


def pinned_bytes(w: Workload, batch: int) -> float:
    """The clean batch (and its adversarial copy) held throughout."""
    return BYTES * batch * w.atoms[0].in_elems * (2 if w.attack_steps else 1)


def peak(w: Workload, p: Part, batch: int) -> float:
    """The largest step on `p` at this micro-batch: pinned batch, input and output in flight, and
    what the step keeps resident (training backward: weights, gradient, optimizer state, saved
    activations; attack passes: weights and saved activations; forward-only: weights)."""
    state: float = BYTES * p.params
    if w.train_pairs:
        state = state * (2 + w.slots) + batch * p.saved_bytes
    elif w.attack_steps:
        state += batch * p.saved_bytes
    return pinned_bytes(w, batch) + BYTES * batch * (p.in_elems + p.out_elems) + state


def _largest(w: Workload, parts: tuple[Part, ...], batch: int) -> tuple[float, str]:
    return max((peak(w, p, batch), p.name) for p in parts)


def _finest(w: Workload, i: int, batch: int) -> tuple[float, str]:
    """The largest step of atom i, whole or by layers, whichever is smaller, and its piece."""
    return min(_largest(w, (whole(w, i),), batch), _largest(w, layers(w, i), batch))


def divisors(n: int) -> list[int]:
    return [m for m in range(1, n + 1) if n % m == 0]


@functools.lru_cache(maxsize=4096)
def smallest_step(w: Workload) -> tuple[float, str]:
    """The smallest budget any plan runs in, and the piece whose step sets it."""
    return max(_finest(w, i, 1) for i in range(len(w.atoms)))


def candidates(w: Workload, budget: float) -> list[Plan]:
    """Whole atoms at the full batch if they fit; else, for each number of micro-batches that
    divides the batch (fewest first), the plan paging only the atoms that do not fit whole and the
    plan micro-batching whole atoms, those that fit, each once. Empty when none fits."""
    plain = whole_atoms(w)
    if _largest(w, plain.parts, w.batch)[0] <= budget:
        return [plain]
    plans: list[Plan | None] = []
    for m in divisors(w.batch):
        fits = _largest(w, plain.parts, w.batch // m)[0] <= budget
        plans += [_paged(w, budget, m), Plan(plain.parts, m) if fits else None]
    return [p for p in dict.fromkeys(plans) if p is not None]


def _paged(w: Workload, budget: float, micro: int) -> Plan | None:
    """Atoms that fit whole stay whole, the others go by layers; None if a piece still does not fit."""
    batch = w.batch // micro
    parts: list[Part] = []
    for i in range(len(w.atoms)):
        one = (whole(w, i),)
        pieces = one if _largest(w, one, batch)[0] <= budget else layers(w, i)
        if _largest(w, pieces, batch)[0] > budget:
            return None
        parts.extend(pieces)
    return Plan(tuple(parts), micro)

