"""The records the cost model reads, and the memory arithmetic on them (no torch here).

A model is profiled (edgefl.profiling measures a real PyTorch model and fills these records) into
atoms, each listing its layers (`LayerProfile`): every call of a leaf module in one forward pass,
and every tensor operator an atom runs outside its leaf modules, with the operators each launches,
so the compute model can charge per layer kind (edgefl.sim.compute). Figures are per sample;
a forward pass costs 2 x MACs FLOPs.

Memory requirement (MemReq) of training a run of atoms, one estimator for every consumer. Default
estimator: parameters + gradients + optimizer state + activations saved for backward at the
batch size + workspace (the clean batch and its adversarial copy, and the largest atom's input and
output in flight). The `paper` estimator is the FedProphet release's: s x 4 B x parameters + 4 B x
the summed inputs of every conv/BN/linear layer at the batch size (s = 2 SGD, 3 SGD+momentum,
5 Adam).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

BYTES = 4  # fp32


@dataclass(frozen=True)
class LayerProfile:
    """One layer call in one forward pass, per sample: a leaf module (a module called twice gives
    two layers, its parameters on the first) or a tensor operator outside any leaf."""

    name: str
    kind: str  # conv, linear, norm, activation, pool, reshape or elementwise
    macs: float
    params: int
    in_elems: int
    out_elems: int
    saved_bytes: float  # bytes autograd saves for backward, first saver of a storage pays
    ops: int = 1  # tensor operators one forward call launches
    tensors: int = 0  # parameter tensors (the optimizer steps each one)


@dataclass(frozen=True)
class AtomProfile:
    """One atom, per sample: MACs, parameters, input/output elements, bytes saved for backward."""

    name: str
    macs: float
    params: int
    in_elems: int
    out_elems: int
    saved_bytes: float
    weighted_in_elems: int  # summed input sizes of its conv/BN/linear layers (release MemReq)
    out_shape: tuple[int, ...] = ()  # one sample's output
    # its layers in forward order; == and hash see them through `layers_key`, their hash taken once,
    # so the cost model's caches keyed by workload stay cheap and still tell layer breakdowns apart
    layers: tuple[LayerProfile, ...] = field(default=(), compare=False)
    layers_key: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers_key", hash(self.layers))

    @property
    def flops(self) -> float:
        """Forward FLOPs per sample."""
        return 2.0 * self.macs

    @property
    def param_bytes(self) -> int:
        return BYTES * self.params


@dataclass(frozen=True)
class ModelProfile:
    name: str
    atoms: tuple[AtomProfile, ...]

    @property
    def params(self) -> int:
        return sum(a.params for a in self.atoms)


def optimizer_slots(optimizer: str, momentum: float) -> int:
    """Optimizer state tensors per parameter: SGD 0, SGD+momentum 1, Adam 2."""
    if optimizer == "adam":
        return 2
    return 1 if momentum > 0 else 0


def workspace_bytes(atoms: Sequence[AtomProfile], batch: int, adversarial: bool) -> float:
    """Transient tensors: the batch (and its perturbed copy) plus the largest atom in/out pair."""
    inputs = (2 if adversarial else 1) * atoms[0].in_elems
    largest = max(a.in_elems + a.out_elems for a in atoms)
    return BYTES * batch * (inputs + largest)


def mem_req(atoms: Sequence[AtomProfile], batch: int, slots: int, adversarial: bool = True) -> float:
    """Bytes to train `atoms` without swapping (default estimator)."""
    return sum(mem_parts(atoms, batch, slots, adversarial))


def mem_parts(atoms: Sequence[AtomProfile], batch: int, slots: int,
              adversarial: bool) -> tuple[float, float, float]:
    """MemReq's parts: (parameters, gradients and optimizer state; activations saved for backward;
    workspace)."""
    state = sum((2 + slots) * a.param_bytes for a in atoms)
    saved = batch * sum(a.saved_bytes for a in atoms)
    return state, saved, workspace_bytes(atoms, batch, adversarial)


def paper_scale(slots: int) -> int:
    """The release's s: parameter copies kept in memory (2 SGD, 3 SGD+momentum, 5 Adam;
    src/hardware/sys_utils.py:190-196)."""
    return {0: 2, 1: 3, 2: 5}[slots]


def paper_mem_req(atoms: Sequence[AtomProfile], batch: int, slots: int) -> float:
    """The FedProphet release's MemReq: 4 B x (s x P + batch x F), F the summed inputs of the
    conv/BN/linear layers a sample passes (src/hardware/sys_utils.py:260-262 for the whole model,
    357-358 per batch; s from 190-196)."""
    params = sum(a.params for a in atoms)
    features = sum(a.weighted_in_elems for a in atoms)
    return BYTES * (paper_scale(slots) * params + batch * features)

