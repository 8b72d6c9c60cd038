"""Memory requirement (MemReq) of training a run of atoms: one estimator for every consumer.

Default estimator: parameters + gradients + optimizer state + activations saved for backward at the
batch size + workspace (the clean batch and its adversarial copy, and the largest atom's input and
output in flight). The `paper` estimator is the FedProphet release's: s x 4 B x parameters + 4 B x
the summed inputs of every conv/BN/linear layer at the batch size (s = 2 SGD, 3 SGD+momentum,
5 Adam).
"""

from __future__ import annotations

from collections.abc import Sequence

from edgefl.profiling.atoms import BYTES, AtomProfile


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
    state = sum((2 + slots) * a.param_bytes for a in atoms)
    saved = batch * sum(a.saved_bytes for a in atoms)
    return state + saved + workspace_bytes(atoms, batch, adversarial)


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

