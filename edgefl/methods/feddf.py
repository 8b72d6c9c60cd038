"""FedDF-AT (FedProphet §7.2): ensemble distillation (Lin et al., "Ensemble Distillation for Robust
Model Fusion in Federated Learning", NeurIPS 2020, §3 and Alg. 3) with local adversarial training.

Clients train the largest family member that fits their memory (edgefl.methods.distill). The
target of every distillation is the ensemble of all received client models, whatever their
architecture, as Alg. 3 ("AvgLogits"): softmax(mean_k z_k / T), with the loss
KL(target || softmax(s / T)) averaged over the batch.

Does FedDF distil into every architecture? Yes. Alg. 3 (heterogeneous FL) keeps one prototype per
architecture; each prototype starts from the average of the received models of its architecture
and is distilled from the ensemble of all received models. The FedProphet release's FedDF baseline
(`FedDF_Server` in src/server/kdserver.py) does the same for every edge model. edgefl does so
too: every family member is distilled each round, starting from its average (or its previous
state when no client trained it this round), so a client that can hold only a small member starts
the next round from a model that has learnt from the whole ensemble, not from its own
architecture's clients alone. (Before this, edgefl distilled only the large, evaluated model and
left the small members at their FedAvg: a simplification neither the paper nor the release makes.)
"""


from __future__ import annotations

import torch
import torch.nn.functional as F

from edgefl.methods.base import METHODS
from edgefl.methods.distill import DistillAT, DistillConfig, kl_rows


def feddf_loss(student: torch.Tensor, teachers: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(mean_k z_k / T) || softmax(s / T)), averaged over the batch.

    student: logits [B, C]; teachers: logits [K, B, C].
    """
    target = F.softmax(teachers.mean(0) / temperature, dim=-1)
    return kl_rows(target, F.log_softmax(student / temperature, dim=-1)).mean()


@METHODS.register("feddf_at")
class FedDFAT(DistillAT):
    def target_loss(self, student: torch.Tensor, teachers: torch.Tensor) -> torch.Tensor:
        return feddf_loss(student, teachers, self.ctx.scenario.knobs(DistillConfig).temperature)
