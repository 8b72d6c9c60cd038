"""Adversarial cascade learning on the client (FedProphet §5.1, Eq. 7 and Eq. 11).

A client assigned modules m..M_k trains them jointly on the features z_{m-1} of the fixed modules
before them, through the auxiliary head of M_k, with the loss CE(head(z_{M_k}), y) + mu/2 ||z_{M_k}||^2
on adversarial inputs: PGD within the input L-inf ball eps_0 for the first module, within an L2 ball
eps_{m-1} on the features for later ones. The fixed prefix is run under no_grad in eval mode, which
gives the same features the release caches once per stage switch.
"""

from __future__ import annotations

import copy
from typing import cast

import torch
from torch import nn

from edgefl.attacks import Attack
from edgefl.attacks.pgd_l2 import PGDL2
from edgefl.training.objectives import Objective


class Exit(nn.Module):
    """Modules m..M_k followed by the head of M_k (the identity after the last module)."""

    def __init__(self, stack: nn.Sequential, head: nn.Module) -> None:
        super().__init__()
        self.stack = stack
        self.head = head

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.head(self.stack(z))


def cascade_loss(exit_: Exit, z: torch.Tensor, y: torch.Tensor, mu: float) -> torch.Tensor:
    """Eq. 7 / 11: CE through the head plus mu/2 ||z_out||^2 (mean over the batch); at the last
    module, whose output is the logits (no auxiliary head), the loss is the model's own CE (Prop. 1's
    l_M = l; the release adds no term there)."""
    out = exit_.stack(z)
    headed = not isinstance(exit_.head, nn.Identity)
    reg = 0.5 * mu * out.flatten(1).pow(2).sum(1).mean() if mu and headed else 0.0
    return nn.functional.cross_entropy(exit_.head(out), y) + reg


FEATURE_STEP = 2.5  # the release's feature PGD step: 2.5 eps / T (module_scheduler.stat_update)


def feature_attack(eps: float, steps: int, lower: float | None) -> PGDL2:
    """L2 PGD on features with the release's step 2.5 eps / T, no upper bound."""
    attack = PGDL2(eps=eps, step_size=FEATURE_STEP * eps / steps, steps=steps)
    attack.lower, attack.upper = lower, None
    return attack


class Cascade(Objective):
    """Eq. 7 / 11 as a local objective for `train_local` on an Exit (modules m..M_k and the head
    of M_k): the fixed prefix's features (no gradient, eval mode), attacked on the features when
    the round has an attack, then `cascade_loss`."""

    def __init__(self, prefix: nn.Sequential, mu: float) -> None:
        super().__init__()
        self.prefix, self.mu = prefix, mu

    def fixed(self) -> tuple[nn.Module, ...]:
        return (self.prefix,)

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, attack: Attack | None) -> torch.Tensor:
        with torch.no_grad():
            z = self.prefix(x)
        if attack is not None:
            z = attack(model, z, y)
        return cascade_loss(cast(Exit, model), z, y, self.mu)

    def adversarial_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         attack: Attack) -> torch.Tensor:
        return self.loss(model, x, y, attack)


def output_perturbation(prefix: nn.Sequential, module: nn.Sequential, x: torch.Tensor,
                        attack: Attack) -> float:
    """E[d*] of Eq. 9: the mean L2 size of the change in the module's output that a PGD attack on
    its input (within the eps it was trained with) can cause."""
    prefix.eval()
    module.eval()
    with torch.no_grad():
        z = prefix(x)
        clean = module(z)
    attack = copy.copy(attack)  # the caller's attack keeps its own loss
    attack.loss = lambda out, target: (out - target).flatten(1).pow(2).sum(1).mean()
    z_adv = attack(module, z, clean)
    with torch.no_grad():
        return float((module(z_adv) - clean).flatten(1).norm(dim=1).mean())
