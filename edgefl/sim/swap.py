"""The swap walk: what training costs in storage traffic when MemReq exceeds available memory.

The pieces of a plan (edgefl.sim.paging: whole atoms, or the layers of an atom too big to hold)
are walked pass by pass (PGD-T: T forward/input-backward pairs, then the training
forward/backward) keeping a least-recently-used resident set within the memory budget. A step on
piece i needs its parameters (and, backward, its saved activations; in the training backward also
its optimizer state and a fresh gradient) resident, plus the pinned batch and the piece's input
and output in flight. What a step needs and is not resident is fetched; what is evicted dirty is
written back. Each step that reads is one read operation, each that writes one write operation.
A micro-batched plan runs each iteration's passes once per micro-batch at the micro-batch's sizes,
accumulating the gradient (kept, or paged, between micro-batches) and updating on the last one:
the FLOPs are the same, the parameters are walked once per micro-batch and each micro-batch is one
batch read. Iterations repeat until the resident state stops changing; the rest cost the same as
the last.

While whole atoms fit their steps at the full batch that is the one plan walked; below that, every
finer plan that fits is walked (edgefl.sim.paging.candidates), and the device takes the one it runs
fastest (`cheapest`, priced by edgefl.sim.cost.plan_seconds). Every decision a walk takes on its
budget (which plans fit, how much each step evicts) is a comparison that a larger budget can only
pass more easily, so the budgets whose walks take the same path (`traced_walks`' trail: the plans
tried and each step's evictions) form an interval, and the walks are the same throughout it
(edgefl.sim.cost.WalkCost.price looks a round's budgets up that way).
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from edgefl.errors import EdgeflError
from edgefl.sim.paging import Part, Plan, candidates, pinned_bytes, smallest_step, whole_atoms
from edgefl.sim.records import BYTES
from edgefl.sim.workload import Workload

Key = tuple[str, int]  # (param | opt | grad | act, piece index)


@dataclass(frozen=True)
class Traffic:
    read_bytes: float = 0.0
    write_bytes: float = 0.0
    read_ops: int = 0
    write_ops: int = 0

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.read_bytes + other.read_bytes, self.write_bytes + other.write_bytes,
                       self.read_ops + other.read_ops, self.write_ops + other.write_ops)

    def times(self, n: int) -> Traffic:
        return Traffic(n * self.read_bytes, n * self.write_bytes, n * self.read_ops,
                       n * self.write_ops)


@dataclass(frozen=True)
class Step:
    part: int
    needs: tuple[Key, ...]
    frees: tuple[Key, ...] = ()
    dirties: tuple[Key, ...] = ()


class ImpossibleBudget(EdgeflError):
    def __init__(self, part: str, need: float, budget: float) -> None:
        super().__init__(
            "memory budget", part,
            f"one step on this piece needs {need / 1e6:.3f} MB but only {budget / 1e6:.3f} MB is "
            "available; raise fleet.reserved_memory_mb or drop the device from the fleet")


def micro_batch_steps(w: Workload, plan: Plan) -> tuple[list[Step], list[Step]]:
    """The steps of an iteration's micro-batches: T attack pairs, forward-only passes, then the
    training pairs; the training backward accumulates the gradient on every micro-batch but the
    last (the first list), and updates on the last (the second)."""
    n = len(plan.parts)
    fwd = [Step(i, (("param", i), ("act", i))) for i in range(n)]
    fwd_only = [Step(i, (("param", i),)) for i in range(n)]
    attack_bwd = [Step(i, (("param", i), ("act", i)), frees=(("act", i),))
                  for i in reversed(range(n))]
    update = [
        Step(i, (("param", i), ("act", i), ("opt", i), ("grad", i)),
             frees=(("act", i), ("grad", i)), dirties=(("param", i), ("opt", i)))
        for i in reversed(range(n))
    ]
    accumulate = [Step(i, (("param", i), ("act", i), ("grad", i)), frees=(("act", i),),
                       dirties=(("grad", i),)) for i in reversed(range(n))]
    head = (fwd + attack_bwd) * w.attack_steps + fwd_only * w.extra_forwards
    return head + (fwd + accumulate) * w.train_pairs, head + (fwd + update) * w.train_pairs


@functools.lru_cache(maxsize=4096)
def footprint(w: Workload) -> float:
    """Everything a round ever holds at once, at most: with this much, the walk evicts nothing,
    and its traffic no longer depends on the budget."""
    walk = SwapWalk(w, math.inf)
    return walk.pinned + max(walk.workspace(i) for i in range(len(w.atoms))) + sum(walk.sizes.values())


def _size(w: Workload, p: Part, kind: str, batch: int) -> float:
    if kind == "act":
        return batch * p.saved_bytes
    return BYTES * p.params * (w.slots if kind == "opt" else 1)


class SwapWalk:
    """Walk one client's round within `budget` bytes and count the storage traffic; the plan
    defaults to whole atoms at the full batch."""

    def __init__(self, w: Workload, budget: float, plan: Plan | None = None) -> None:
        self.w = w
        self.budget = budget
        self.plan = plan or whole_atoms(w)
        self.batch = self.plan.micro_batch(w)
        self.pinned = pinned_bytes(w, self.batch)
        self.resident: OrderedDict[Key, bool] = OrderedDict()  # key -> dirty, LRU first
        self.used = 0.0  # bytes resident
        parts = self.plan.parts
        self.on_storage: set[Key] = {("param", i) for i in range(len(parts))}
        self.evictions = 0
        self.trail: list[int] = []  # evictions of each step, in order
        self.sizes = {(kind, i): _size(w, p, kind, self.batch)
                      for kind in ("param", "opt", "grad", "act") for i, p in enumerate(parts)}
        self.workspaces = [BYTES * self.batch * (p.in_elems + p.out_elems) for p in parts]

    def size(self, key: Key) -> float:
        return self.sizes[key]

    def workspace(self, i: int) -> float:
        return self.workspaces[i]

    def run(self) -> Traffic:
        """Total traffic over all iterations (the batch reads, one per micro-batch, included)."""
        accumulating, last = micro_batch_steps(self.w, self.plan)
        batch = Traffic(self.w.batch_bytes, 0.0, self.plan.micro, 0)

        def iteration() -> Traffic:
            micro = self._repeat(lambda: self._walk(accumulating), self.plan.micro - 1)
            return batch + micro + self._walk(last)
        return self._repeat(iteration, self.w.iterations)

    def _walk(self, steps: list[Step]) -> Traffic:
        return sum((self.step(s) for s in steps), Traffic())

    def _repeat(self, walk: Callable[[], Traffic], times: int) -> Traffic:
        """`times` walks in a row: once a walk leaves the memory as it found it (the same residents,
        dirty flags, LRU order and storage), every later one moves what it moved, and they are
        counted without walking them (byte counts are whole numbers: the product is the sum)."""
        total, state = Traffic(), self._signature()
        for done in range(1, times + 1):
            one = walk()
            total = total + one
            previous, state = state, self._signature()
            if state == previous:
                return total + one.times(times - done)
        return total

    def step(self, s: Step) -> Traffic:
        needs = [k for k in s.needs if self.size(k) > 0]
        room = self.budget - self.pinned - self.workspace(s.part)
        need = sum(self.size(k) for k in needs)
        if need > room:
            raise ImpossibleBudget(self.plan.parts[s.part].name,
                                   need + self.pinned + self.workspace(s.part), self.budget)
        fetch = [k for k in needs if k not in self.resident]
        written = self._make_room(room - need, set(needs))
        read = sum(self.size(k) for k in fetch if k in self.on_storage)
        for k in needs:
            if k not in self.resident:
                self.used += self.size(k)
            self.resident[k] = self.resident.get(k, k not in self.on_storage)
            self.resident.move_to_end(k)
        for k in s.dirties:
            if k in self.resident:
                self.resident[k] = True
        for k in s.frees:
            if self.resident.pop(k, None) is not None:
                self.used -= self.size(k)
            self.on_storage.discard(k)
        return Traffic(read, written, int(read > 0), int(written > 0))

    def _make_room(self, limit: float, keep: set[Key]) -> float:
        """Evict least-recently-used items outside `keep` until residents fit `limit`."""
        written, before = 0.0, self.evictions
        used = self.used - sum(self.size(k) for k in keep if k in self.resident)
        if used <= limit:
            self.trail.append(0)
            return written
        for key in [k for k in self.resident if k not in keep]:
            if used <= limit:
                break
            dirty = self.resident.pop(key)
            used -= self.size(key)
            self.used -= self.size(key)
            self.evictions += 1
            if dirty:
                written += self.size(key)
                self.on_storage.add(key)
        self.trail.append(self.evictions - before)
        return written

    def _signature(self) -> tuple[tuple[tuple[Key, bool], ...], frozenset[Key]]:
        return tuple(self.resident.items()), frozenset(self.on_storage)


Trail = tuple[tuple[Plan, tuple[int, ...]], ...]  # per plan tried: the evictions of each step
Walk = tuple[int, Traffic, int]  # a plan's walk: its micro-batches per batch, traffic and evictions
PlanSeconds = Callable[[int, Traffic], float]  # what a walk costs a device: (micro-batches, traffic) -> s


def cheapest(walks: Sequence[Walk], seconds: PlanSeconds) -> int:
    """The index of the walk of fewest `seconds`; on a tie fewer bytes moved, then fewer
    operations, then the first (candidates' order: fewer micro-batches, paging before whole atoms)."""
    def key(i: int) -> tuple[float, float, int]:
        micro, t, _ = walks[i]
        return seconds(micro, t), t.read_bytes + t.write_bytes, t.read_ops + t.write_ops
    return min(range(len(walks)), key=key)


def traced_walks(w: Workload, budget: float) -> tuple[tuple[Walk, ...], Trail]:
    """The walk of every plan edgefl.sim.paging.candidates gives for `budget`, and their trail (the
    plans, in the same order, with each step's evictions): two budgets with the same trail walk
    alike, and so does every budget between them."""
    walks: list[Walk] = []
    trail: list[tuple[Plan, tuple[int, ...]]] = []
    for plan in candidates(w, budget):
        walker = SwapWalk(w, budget, plan)
        walks.append((plan.micro, walker.run(), walker.evictions))
        trail.append((plan, tuple(walker.trail)))
    if not walks:
        need, part = smallest_step(w)
        raise ImpossibleBudget(part, need, budget)
    return tuple(walks), tuple(trail)


def min_budget(w: Workload) -> tuple[float, str]:
    """The smallest memory any schedule needs: the largest step of the finest plan (every atom
    whole or by layers, whichever needs less, one sample at a time), and the piece that sets it."""
    return smallest_step(w)
