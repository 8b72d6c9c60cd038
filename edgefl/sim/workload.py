"""Workload: what one client runs in one round, as the cost model sees it.

Each local iteration of adversarial training with PGD-T runs T (forward, input-gradient backward)
pairs to craft the perturbation, then one (forward, training backward) pair to update the model.
"""

from __future__ import annotations

from dataclasses import dataclass

from edgefl.profiling.atoms import BYTES, AtomProfile


@dataclass(frozen=True)
class Workload:
    atoms: tuple[AtomProfile, ...]  # the atoms trained, in forward order
    batch: int
    iterations: int
    attack_steps: int  # PGD steps per iteration; 0 = clean training
    slots: int  # optimizer state tensors per parameter
    download_bytes: float
    upload_bytes: float

    @property
    def batch_bytes(self) -> float:
        """One batch of the first atom's input, as read from storage."""
        return BYTES * self.batch * self.atoms[0].in_elems

    def flops_per_iteration(self) -> float:
        """FLOPs of every pass one iteration runs.

        Forward: 2 x MACs per atom. An input-gradient backward costs one forward per atom; a
        weight-gradient backward one more for atoms with parameters. PGD backward needs input
        gradients through every atom (down to the image) and no weight gradients; the training
        backward needs weight gradients, and input gradients for every atom but the first.
        """
        fwd = sum(a.flops for a in self.atoms)
        weights = sum(a.flops for a in self.atoms if a.params)
        train_bwd = fwd - self.atoms[0].flops + weights
        return self.batch * (self.attack_steps * 2 * fwd + fwd + train_bwd)
