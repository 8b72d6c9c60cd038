"""AutoAttack (Croce & Hein, ICML 2020), the "AA" of SFAT's evaluation (Zhu et al., ICLR 2023, §5).

Not hand-written: it runs torchattacks' AutoAttack (an optional dependency, imported when used).
The standard version runs APGD-CE, APGD-T, FAB-T and Square (5000 queries), each on the samples the
ones before left correctly classified, so the robust accuracy is the worst case over the four.
torchattacks 3.5.1 builds APGD, APGD-T and FAB with 10 iterations and n_classes - 1 target classes;
Croce & Hein's standard version uses 100 iterations and 9 target classes, which this class restores.
Two lighter versions are attacks of their own: `autoattack_rand` and `apgd_ce`.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from edgefl.attacks.base import ATTACKS, Attack
from edgefl.errors import EdgeflError

# version -> the fewest classes it runs on (APGD-T's targeted DLR loss reads the 4th-largest logit,
# the DLR loss of 'rand' the 3rd)
VERSIONS = {"standard": 4, "rand": 3, "apgd-ce": 2}


@ATTACKS.register("autoattack")
class AutoAttack(Attack):
    """L-inf AutoAttack within eps, the standard version (the paper's); step_size and steps are not
    used (its attacks set their own); torchattacks seeds it with `seed` at every call."""

    groupable = False  # probes the model with one row, re-runs on subsets, draws inside torchattacks
    trains = False  # thousands of gradient steps per batch: an evaluation attack
    version = "standard"
    seed = 0
    iterations = 100  # of APGD, APGD-T and FAB
    target_classes = 9  # of APGD-T and FAB-T (fewer when the model has fewer other classes)

    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if x.dim() != 4:  # APGD's steps and Square's windows assume images
            raise EdgeflError("evaluation", "attack",
                              f"AutoAttack needs image batches (N, C, H, W), got shape {tuple(x.shape)}")
        with torch.no_grad():
            n_classes = model(x[:1]).shape[-1]
        if n_classes < VERSIONS[self.version]:
            raise EdgeflError("evaluation", "attack", f"AutoAttack {self.version!r} needs at least "
                              f"{VERSIONS[self.version]} classes, the model has {n_classes}; "
                              "use the attack 'apgd_ce' instead")
        attack = self._build(model, n_classes)
        # torchattacks reseeds the global generators with `seed`: keep the caller's random stream
        with torch.random.fork_rng(devices=range(torch.cuda.device_count()) if x.is_cuda else []):
            adversarial: torch.Tensor = attack(x, y)
        return adversarial

    def _build(self, model: nn.Module, n_classes: int) -> Any:
        try:
            import torchattacks
        except ImportError as error:
            fix = "AutoAttack needs the torchattacks package: pip install 'edgefl[autoattack]'"
            raise EdgeflError("evaluation", "attack", fix) from error
        if self.version == "apgd-ce":
            return torchattacks.APGD(model, norm="Linf", eps=self.eps, steps=self.iterations, n_restarts=1,
                                     seed=self.seed, loss="ce")
        attack = torchattacks.AutoAttack(model, norm="Linf", eps=self.eps, version=self.version,
                                         n_classes=n_classes, seed=self.seed)
        for sub in attack._autoattack.attacks:
            if hasattr(sub, "steps"):
                sub.steps = self.iterations
            if hasattr(sub, "n_target_classes"):
                sub.n_target_classes = min(self.target_classes, n_classes - 1)
        return attack


@ATTACKS.register("autoattack_rand")
class AutoAttackRand(AutoAttack):
    """AutoAttack's version for randomised defences: APGD-CE and APGD-DLR with 20-sample EOT."""

    version = "rand"


@ATTACKS.register("apgd_ce")
class APGDCE(AutoAttack):
    """AutoAttack's first, cheapest attack alone (APGD-CE, 100 iterations): an upper bound on its
    robust accuracy, and the one that runs on two classes."""

    version = "apgd-ce"
