"""Memory-constrained model partition (FedProphet §6.1, Alg. 1) and the auxiliary heads.

Greedy over the atoms: an atom joins the current module while training the module together with
the auxiliary head at its end still fits R_min; otherwise the module is closed and a new one
starts. The last module needs no head (its last atom holds the classifier). An atom that does not
fit R_min on its own stops the partition with an error naming it under `paper` accounting; under
`walk` it becomes a module of its own, which the swap walk pages (edgefl.sim.paging), and the fleet's
budget check refuses only a device that cannot hold its smallest paged step.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from edgefl.config import Scenario
from edgefl.errors import EdgeflError
from edgefl.methods.fedprophet.knobs import FedProphetConfig
from edgefl.models import AtomModel
from edgefl.profiling import profile_model
from edgefl.sim.cost import HEAD, CostModel
from edgefl.sim.records import AtomProfile, ModelProfile, optimizer_slots


def head_side(channels: int, classes: int, min_side: int = 0) -> int:
    """The side an auxiliary head pools a C-channel map to: the release's ceil(sqrt(classes / C))
    (the fewest features that are at least the classes), or `min_side` when that is larger."""
    return max(math.ceil(math.sqrt(classes / channels)), min_side)


def aux_head(out_shape: tuple[int, ...], classes: int, min_side: int = 0) -> nn.Sequential:
    """The release's auxiliary model (module_scheduler.model_partition): adaptive average pooling to
    side x side when the map is wider (`head_side`), then one linear layer to the classes."""
    if len(out_shape) == 3:
        c, h, _ = out_shape
        side = head_side(c, classes, min_side)
        if h > side:
            return nn.Sequential(nn.AdaptiveAvgPool2d(side), nn.Flatten(), nn.Linear(c * side**2, classes))
    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(out_shape), classes))


def head_profile(out_shape: tuple[int, ...], classes: int, min_side: int = 0) -> AtomProfile:
    return profile_model(AtomModel([(HEAD, aux_head(out_shape, classes, min_side))], out_shape)).atoms[0]


@dataclass(frozen=True)
class Estimator:
    """MemReq of training a run of atoms with an optional head, as the scenario's cost model counts
    it (the `paper` accounting adds the head's input, weights and logits, as the release)."""

    batch: int
    slots: int
    classes: int
    cost: CostModel

    def __call__(self, atoms: Sequence[AtomProfile], head: AtomProfile | None) -> float:
        return self.cost.module_need(atoms, head, self.batch, self.slots, self.classes)


@dataclass(frozen=True)
class Module:
    index: int
    start: int  # first atom
    stop: int  # one past the last atom
    names: tuple[str, ...]
    mem_bytes: float  # MemReq with its head
    flops: float  # forward FLOPs per sample with its head
    out_shape: tuple[int, ...]
    head: AtomProfile | None  # None for the last module


def partition(
    atoms: Sequence[AtomProfile], heads: Sequence[AtomProfile], need: Estimator, r_min: float,
    where: str = "partition", paged: bool = False,
) -> list[Module]:
    """Alg. 1: `heads[i]` is the head that would follow atom i; errors name `where`. With `paged`
    (the swap walk's accounting) an atom that does not fit alone is a module of its own."""
    bounds: list[tuple[int, int]] = []
    start = 0
    for i in range(len(atoms)):
        head = heads[i] if i + 1 < len(atoms) else None  # the classifier atom needs no head
        if need(atoms[i:i + 1], head) > r_min and not paged:
            raise EdgeflError(where, "fleet.reserved_memory_mb",
                              f"atom {atoms[i].name} needs {need(atoms[i:i + 1], head) / 1e6:.3f} MB "
                              f"with its head, more than R_min = {r_min / 1e6:.3f} MB; raise R_min "
                              "or lower training.batch_size")
        if i > start and need(atoms[start:i + 1], head) > r_min:
            bounds.append((start, i))
            start = i
    bounds.append((start, len(atoms)))
    return [_module(n, a, b, atoms, heads if b < len(atoms) else None, need)
            for n, (a, b) in enumerate(bounds)]


def _module(n: int, a: int, b: int, atoms: Sequence[AtomProfile], heads: Sequence[AtomProfile] | None,
            need: Estimator) -> Module:
    head = heads[b - 1] if heads is not None else None
    flops = sum(x.flops for x in atoms[a:b]) + (head.flops if head else 0.0)
    return Module(n, a, b, tuple(x.name for x in atoms[a:b]), need(atoms[a:b], head), flops,
                  atoms[b - 1].out_shape, head)


def partition_model(profile: ModelProfile, classes: int, s: Scenario, where: str,
                    cost: CostModel) -> tuple[Estimator, list[Module]]:
    """Partition a profiled model with the scenario's batch, optimizer, R_min and heads, in the
    cost model's MemReq (its swap walk pages an atom that does not fit alone)."""
    need = Estimator(s.training.batch_size, optimizer_slots(s.training.optimizer, s.training.momentum),
                     classes, cost)
    heads = [head_profile(a.out_shape, classes, s.knobs(FedProphetConfig).head_side) for a in profile.atoms]
    return need, partition(profile.atoms, heads, need, s.fleet.reserved_memory_mb * 1e6, where,
                           paged=cost.walks)
