"""The swap walk: what training costs in storage traffic when MemReq exceeds available memory.

The atoms are walked pass by pass (PGD-T: T forward/input-backward pairs, then the training
forward/backward) keeping a least-recently-used resident set within the memory budget. A step on
atom i needs its parameters (and, backward, its saved activations; in the training backward also
its optimizer state and a fresh gradient) resident, plus the pinned batch and the atom's input and
output in flight. What a step needs and is not resident is fetched; what is evicted dirty is written
back. Each step that reads is one read operation, each that writes one write operation.
Iterations repeat until the resident state stops changing; the rest cost the same as the last.
"""

from __future__ import annotations

import functools
import math
from collections import OrderedDict
from dataclasses import dataclass

from edgefl.errors import EdgeflError
from edgefl.profiling.atoms import BYTES
from edgefl.sim.workload import Workload

Key = tuple[str, int]  # (param | opt | grad | act, atom index)


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
    atom: int
    needs: tuple[Key, ...]
    frees: tuple[Key, ...] = ()
    dirties: tuple[Key, ...] = ()


class ImpossibleBudget(EdgeflError):
    def __init__(self, atom: str, need: float, budget: float) -> None:
        super().__init__(
            "memory budget", atom,
            f"one step on this atom needs {need / 1e6:.3f} MB but only {budget / 1e6:.3f} MB is "
            "available; raise fleet.reserved_memory_mb, lower training.batch_size, "
            "or drop the device from the fleet")


def iteration_steps(w: Workload) -> list[Step]:
    """The steps of one iteration: T attack pairs, forward-only passes, then the training pairs."""
    n = len(w.atoms)
    fwd = [Step(i, (("param", i), ("act", i))) for i in range(n)]
    fwd_only = [Step(i, (("param", i),)) for i in range(n)]
    attack_bwd = [Step(i, (("param", i), ("act", i)), frees=(("act", i),))
                  for i in reversed(range(n))]
    train_bwd = [
        Step(i, (("param", i), ("act", i), ("opt", i), ("grad", i)),
             frees=(("act", i), ("grad", i)), dirties=(("param", i), ("opt", i)))
        for i in reversed(range(n))
    ]
    attack, train = (fwd + attack_bwd) * w.attack_steps, (fwd + train_bwd) * w.train_pairs
    return attack + fwd_only * w.extra_forwards + train


@functools.lru_cache(maxsize=4096)
def footprint(w: Workload) -> float:
    """Everything a round ever holds at once, at most: with this much, the walk evicts nothing,
    and its traffic no longer depends on the budget."""
    walk = SwapWalk(w, math.inf)
    return walk.pinned + max(walk.workspace(i) for i in range(len(w.atoms))) + sum(walk.sizes.values())


def _size(w: Workload, kind: str, i: int) -> float:
    atom = w.atoms[i]
    if kind == "act":
        return w.batch * atom.saved_bytes
    return atom.param_bytes * (w.slots if kind == "opt" else 1)


class SwapWalk:
    """Walk one client's round within `budget` bytes and count the storage traffic."""

    def __init__(self, w: Workload, budget: float) -> None:
        self.w = w
        self.budget = budget
        self.pinned = w.batch_bytes * (2 if w.attack_steps else 1)
        self.resident: OrderedDict[Key, bool] = OrderedDict()  # key -> dirty, LRU first
        self.used = 0.0  # bytes resident
        self.on_storage: set[Key] = {("param", i) for i in range(len(w.atoms))}
        self.evictions = 0
        self.sizes = {(kind, i): _size(w, kind, i) for kind in ("param", "opt", "grad", "act")
                      for i in range(len(w.atoms))}

    def size(self, key: Key) -> float:
        return self.sizes[key]

    def workspace(self, i: int) -> float:
        atom = self.w.atoms[i]
        return BYTES * self.w.batch * (atom.in_elems + atom.out_elems)

    def run(self) -> Traffic:
        """Total traffic over all iterations (the batch reads included)."""
        steps = iteration_steps(self.w)
        batch = Traffic(self.w.batch_bytes, 0.0, 1, 0)
        total, state = Traffic(), self._signature()
        for done in range(1, self.w.iterations + 1):
            last = sum((self.step(s) for s in steps), batch)
            total = total + last
            previous, state = state, self._signature()
            if state == previous:
                return total + last.times(self.w.iterations - done)
        return total

    def step(self, s: Step) -> Traffic:
        needs = [k for k in s.needs if self.size(k) > 0]
        room = self.budget - self.pinned - self.workspace(s.atom)
        need = sum(self.size(k) for k in needs)
        if need > room:
            raise ImpossibleBudget(self.w.atoms[s.atom].name,
                                   need + self.pinned + self.workspace(s.atom), self.budget)
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
        written = 0.0
        used = self.used - sum(self.size(k) for k in keep if k in self.resident)
        if used <= limit:
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
        return written

    def _signature(self) -> tuple[tuple[tuple[Key, bool], ...], frozenset[Key]]:
        return tuple(self.resident.items()), frozenset(self.on_storage)


def min_budget(w: Workload) -> tuple[float, str]:
    """The smallest memory any swapping schedule needs: the largest single step, and its atom."""
    walk = SwapWalk(w, float("inf"))
    needs = [(walk.pinned + walk.workspace(s.atom) + sum(walk.size(k) for k in s.needs), s.atom)
             for s in iteration_steps(w)]
    need, atom = max(needs)
    return need, w.atoms[atom].name
