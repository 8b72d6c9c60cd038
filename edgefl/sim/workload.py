"""Workload: what one client runs in one round, as the cost model sees it.

Each local iteration of adversarial training with PGD-T runs T (forward, input-gradient backward)
pairs to craft the perturbation, then (forward, training backward) pairs to update the model: one
for PGD-AT, two for TRADES and MART (the clean and the adversarial branch), plus any forward-only
passes (TRADES's clean target). `extra_flops` is one-off work in the round (FedCurv's Fisher pass).
`samples` is the client's training-set size where the round's batches walk through it epoch by
epoch, so an epoch's last batch may be short (what the FedProphet release charges).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgefl.sim.records import BYTES, AtomProfile


@dataclass(frozen=True)
class Workload:
    atoms: tuple[AtomProfile, ...]  # the atoms trained, in forward order
    batch: int
    iterations: int
    attack_steps: int  # PGD steps per iteration; 0 = clean training
    slots: int  # optimizer state tensors per parameter
    download_bytes: float
    upload_bytes: float
    train_pairs: int = 1  # (forward, training backward) pairs per iteration
    extra_forwards: int = 0  # forward-only passes per iteration
    extra_flops: float = 0.0  # one-off FLOPs per round
    samples: int = 0  # the client's training samples (0 = unknown: every batch is full)

    @property
    def batch_bytes(self) -> float:
        """One batch of the first atom's input, as read from storage."""
        return BYTES * self.batch * self.atoms[0].in_elems

    def batch_sizes(self) -> list[int]:
        """The size of each of the round's `iterations` batches as the FedProphet release draws
        them (client/atclient.py:76-100): a DataLoader over the client's samples, restarted every
        epoch, so every epoch ends with a short batch of samples mod batch (when that is not 0)."""
        if self.samples <= 0:
            return [self.batch] * self.iterations
        full, rest = divmod(self.samples, self.batch)
        epoch = [self.batch] * full + ([rest] if rest else [])
        return [epoch[i % len(epoch)] for i in range(self.iterations)]

    def flops_per_iteration(self) -> float:
        """FLOPs of every pass one iteration runs.

        Forward: 2 x MACs per atom. An input-gradient backward costs one forward per atom; a
        weight-gradient backward one more for atoms with parameters. PGD backward needs input
        gradients through every atom (down to the image) and no weight gradients; the training
        backward needs weight gradients, and input gradients for every atom but the first.
        """
        fwd = sum(a.flops for a in self.atoms)
        return self.batch * (self.attack_steps * 2 * fwd + self.train_pairs * train_pass_flops(self.atoms)
                             + self.extra_forwards * fwd)

    def flops(self) -> float:
        """FLOPs of the whole round."""
        return self.iterations * self.flops_per_iteration() + self.extra_flops


def train_pass_flops(atoms: tuple[AtomProfile, ...]) -> float:
    """Per sample: a forward plus a training backward (weight gradients where there are weights,
    input gradients for every atom but the first)."""
    fwd = sum(a.flops for a in atoms)
    return 2 * fwd - atoms[0].flops + sum(a.flops for a in atoms if a.params)
