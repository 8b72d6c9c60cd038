"""FedET-AT (FedProphet §7.2): heterogeneous ensemble knowledge transfer (Cho, Manoel, Joshi, Sim,
Dimitriadis, "Heterogeneous Ensemble Knowledge Transfer for Training Large Models in Federated
Learning", IJCAI 2022, §3.2) with local adversarial training.

Clients train the largest family member that fits their memory (edgefl.methods.distill). Fed-ET's
round has three server steps, here as in the FedProphet authors' release (`FedET_Server` in
src/server/kdserver.py), which implements it as this baseline:

1. Representation transfer up. The large server model is a model of its own (clients train a
   separate copy of the largest member, as the release's edge model 0), and it starts the round
   from its previous state with its representation layer (the classifier head, the last Linear
   layer) set to the plain mean of the received models' heads of the same shape.
2. Weighted consensus distillation with diversity regularisation, the ensemble being every received
   client model. On a public sample x, teacher k's logits z_k have the confidence
   sigma_k(x) = Var_c z_k,c (the variance of its logits over the classes; a peaked prediction is
   confident); with w_k = sigma_k / sum_j sigma_j the consensus label is
   y(x) = argmax_c sum_k w_k z_k,c. The teachers whose own argmax differs from y(x) dissent; the
   diversity target is the logits d(x) = sum_{k dissents} sigma_k z_k / sum_{k dissents} sigma_k.
   loss = CE(s, y) + lambda (1/B) sum_{x with dissent} KL(softmax(d / T) || softmax(s / T)),
   lambda = `distill.diversity` (0.05 in the release), T = `distill.temperature` (1 in the release).
3. Representation transfer down ("distillation back" into the small models): every member whose
   head has the server model's shape takes the server model's head. Members whose head has another
   shape keep their average; in edgefl's bundled families the heads differ in width (digits:
   smallcnn 200, cnn3 128, digits_cnn 256 inputs), so this step reaches only the large member's
   copy there, while a family like ResNet10/18/34 (512 each) shares it across every member.

Where edgefl differs from the release: a sample on which no teacher dissents has no diversity
term (the release's 1e-6 guard makes its target softmax(0), uniform: a pull toward uniform that
Fed-ET's description, the diversity of the clients that do not follow the consensus, does not
call for); the server steps are Adam at `distill.server_lr` (the release: SGD 5e-3, momentum
0.9); members are averaged weighted by sample counts (the release: plain mean).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from edgefl.methods.base import METHODS, ClientUpdate
from edgefl.methods.distill import DistillAT, DistillConfig, head_keys, kl_rows

TINY = 1e-12  # keeps an all-zero weight sum (no dissent, or all-uniform teachers) from dividing by 0


def confidence_mean(z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_k w_k z_k / sum_k w_k per sample: z [K, B, C], w [K, B] -> [B, C] (0 where no weight)."""
    return (w.unsqueeze(-1) * z).sum(0) / (w.sum(0) + TINY).unsqueeze(-1)


Targets = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def fedet_targets(teachers: torch.Tensor) -> Targets:
    """(consensus labels [B], diversity logits [B, C], has-dissent mask [B]) from logits [K, B, C]."""
    confidence = teachers.var(-1)  # [K, B]: the variance of each teacher's logits over the classes
    labels = confidence_mean(teachers, confidence).argmax(-1)
    dissent = teachers.argmax(-1) != labels  # [K, B]
    return labels, confidence_mean(teachers, confidence * dissent), dissent.any(0)


def fedet_loss(student: torch.Tensor, teachers: torch.Tensor, temperature: float,
               diversity: float) -> torch.Tensor:
    """CE to the weighted consensus label plus `diversity` x the dissenters' KL (see the module)."""
    labels, dissent, mask = fedet_targets(teachers)
    target = F.softmax(dissent / temperature, dim=-1)
    spread = (kl_rows(target, F.log_softmax(student / temperature, dim=-1)) * mask).sum() / len(student)
    return F.cross_entropy(student, labels) + diversity * spread


@METHODS.register("fedet_at")
class FedETAT(DistillAT):
    server_apart = True  # the server model learns by distillation and the shared head only

    def distilled(self) -> list[str]:
        return self.names[:1]  # only the large server model

    def target_loss(self, student: torch.Tensor, teachers: torch.Tensor) -> torch.Tensor:
        d = self.ctx.scenario.knobs(DistillConfig)
        return fedet_loss(student, teachers, d.temperature, d.diversity)

    def head(self, name: str) -> tuple[str, str] | None:
        """Member `name`'s head keys when its head has the server model's shapes, else None."""
        mine, theirs = head_keys(self.model), head_keys(self.net(name))
        if mine is None or theirs is None:
            return None
        ours, other = self.model.state_dict(), self.net(name).state_dict()
        same = all(ours[a].shape == other[b].shape for a, b in zip(mine, theirs, strict=True))
        return theirs if same else None

    def before_distil(self, updates: list[ClientUpdate]) -> None:
        """Step 1: the server head is the plain mean of the received heads of its shape."""
        mine = head_keys(self.model)
        heads = [(u.state, keys) for u in updates if (keys := self.head(u.extra["member"])) is not None]
        if mine is None or not heads:
            return
        mean = {a: torch.stack([state[keys[i]] for state, keys in heads]).mean(0) for i, a in enumerate(mine)}
        copy_head(self.model, mean)

    def after_distil(self) -> None:
        """Step 3: every member with a head of the server's shape takes the server's head."""
        mine = head_keys(self.model)
        ours = self.model.state_dict()
        for name in self.names:
            keys = self.head(name)
            if mine is not None and keys is not None:
                copy_head(self.net(name), {b: ours[a] for a, b in zip(mine, keys, strict=True)})


def copy_head(model: nn.Module, values: dict[str, torch.Tensor]) -> None:
    """Load `values` (state-dict key -> tensor) into `model`, leaving its other entries."""
    model.load_state_dict({**model.state_dict(), **{k: v.clone() for k, v in values.items()}})
