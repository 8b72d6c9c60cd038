"""Local adversarial training objectives, selectable for any method (`training.objective`).

* `pgd_at`: Madry et al., ICLR 2018: CE on the PGD example.
* `trades`: Zhang et al., ICML 2019: CE(f(x), y) + beta KL(f(x) || f(x')), x' crafted by the
  training attack (its ball, step and steps) to maximise that KL.
* `mart`: Wang et al., ICLR 2020: boosted CE on x' (CE + -log(1 - max_{k != y} p_k(x'))) +
  beta KL(f(x) || f(x')) (1 - p_y(x)), x' crafted with CE.

Without an attack (clean warm-up rounds) every objective is plain cross-entropy.

`per_client(G)` is the same objective on G clients' batches stacked client-major (edgefl.training.
grouped): every mean is taken per client, and the loss is the vector of the G clients' losses.
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod

import torch
import torch.nn.functional as F
from torch import nn

from edgefl.attacks import Attack
from edgefl.registry import Registry


class Objective(ABC):
    train_pairs = 1  # (forward, training backward) pairs per step, for the cost model
    extra_forwards = 0  # forward-only passes per step
    groups = 1  # clients stacked in one batch: the loss is then one value per client

    def __init__(self, beta: float = 6.0) -> None:
        self.beta = beta

    def fixed(self) -> tuple[nn.Module, ...]:
        """Modules the loss runs that training leaves alone (run in eval mode; none here)."""
        return ()
    def per_client(self, groups: int) -> Objective:
        """This objective on `groups` clients' batches stacked client-major."""
        out = copy.copy(self)
        out.groups = groups
        return out

    def mean(self, rows: torch.Tensor) -> torch.Tensor:
        """The mean over the batch, per client when clients are stacked."""
        return rows.mean() if self.groups == 1 else rows.view(self.groups, -1).mean(1)

    def ce(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Cross-entropy, averaged per client when clients are stacked."""
        if self.groups == 1:
            return F.cross_entropy(logits, y)
        return self.mean(F.cross_entropy(logits, y, reduction="none"))

    def loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, attack: Attack | None) -> torch.Tensor:
        if attack is None:
            return self.ce(model(x), y)
        return self.adversarial_loss(model, x, y, attack)

    @abstractmethod
    def adversarial_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         attack: Attack) -> torch.Tensor: ...


OBJECTIVES: Registry[type[Objective]] = Registry("objective")


def kl_logits(clean_logits: torch.Tensor, adv_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(clean) || softmax(adv)) per sample, from logits: differentiable in both (the
    distillation methods' `kl_rows` takes a fixed probability target instead)."""
    log_p = F.log_softmax(clean_logits, dim=1)
    return (log_p.exp() * (log_p - F.log_softmax(adv_logits, dim=1))).sum(1)


@OBJECTIVES.register("pgd_at")
class PGDAT(Objective):
    def adversarial_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         attack: Attack) -> torch.Tensor:
        return self.ce(model(attack(model, x, y)), y)


@OBJECTIVES.register("trades")
class TRADES(Objective):
    train_pairs, extra_forwards = 2, 1  # clean and adversarial branches; the clean target
    def adversarial_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         attack: Attack) -> torch.Tensor:
        with torch.no_grad():
            was = model.training
            target = model.eval()(x)
            model.train(was)
        kl_attack = copy.copy(attack)
        kl_attack.loss = lambda out, t: self.mean(kl_logits(t, out)).sum()
        x_adv = kl_attack(model, x, target)
        clean = model(x)
        return self.ce(clean, y) + self.beta * self.mean(kl_logits(clean, model(x_adv)))


@OBJECTIVES.register("mart")
class MART(Objective):
    train_pairs = 2  # clean and adversarial branches
    def adversarial_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                         attack: Attack) -> torch.Tensor:
        x_adv = attack(model, x, y)
        clean, adv = model(x), model(x_adv)
        p_adv = F.softmax(adv, dim=1)
        others = p_adv.scatter(1, y[:, None], 0.0).max(1).values
        bce = self.ce(adv, y) - self.mean(torch.log(1.0001 - others))
        p_true = F.softmax(clean, dim=1).gather(1, y[:, None]).squeeze(1)
        return bce + self.beta * self.mean(kl_logits(clean, adv) * (1 - p_true))
