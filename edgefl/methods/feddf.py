"""FedDF-AT (FedProphet §7.2): ensemble distillation (Lin et al., "Ensemble Distillation for Robust
Model Fusion in Federated Learning", NeurIPS 2020, Alg. 3) with local adversarial training.

Clients train the largest family member that fits their memory (edgefl.methods.distill). The
server averages each member over its clients and distils into the large model the ensemble of
every received client model, as FedDF's Alg. 3 does ("AvgLogits"): the target is the softmax of the
teachers' mean logits, softmax(mean_k z_k / T), and the loss KL(target || softmax(s / T)) averaged
over the batch. FedDF also distils into every other prototype; here only the large, evaluated
model is distilled and the smaller members keep their FedAvg (FedProphet evaluates the large one).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgefl.methods.base import METHODS
from edgefl.methods.distill import DistillAT, kl_rows


def feddf_loss(student: torch.Tensor, teachers: torch.Tensor, temperature: float) -> torch.Tensor:
    """KL(softmax(mean_k z_k / T) || softmax(s / T)), averaged over the batch.

    student: logits [B, C]; teachers: logits [K, B, C].
    """
    target = F.softmax(teachers.mean(0) / temperature, dim=-1)
    return kl_rows(target, F.log_softmax(student / temperature, dim=-1)).mean()


@METHODS.register("feddf_at")
class FedDFAT(DistillAT):
    per_client_teachers = True  # Alg. 3: the ensemble of all received client models

    def target_loss(self, student: torch.Tensor, teachers: torch.Tensor) -> torch.Tensor:
        return feddf_loss(student, teachers, self.ctx.scenario.distill.temperature)
