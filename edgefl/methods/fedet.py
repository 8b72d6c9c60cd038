"""FedET-AT (FedProphet §7.2): heterogeneous ensemble knowledge transfer (Cho, Manoel, Joshi, Sim,
Dimitriadis, "Heterogeneous Ensemble Knowledge Transfer for Training Large Models in Federated
Learning", IJCAI 2022, §3.2 and Alg. 1) with local adversarial training.

Clients train the largest family member that fits their memory (edgefl.methods.distill). As in
Fed-ET, the server averages each small-model architecture over its clients and the ensemble is
those averages (one teacher per member trained this round). On each public sample x, with teacher
k's softened prediction p_k = softmax(z_k / T):

* confidence: sigma_k(x) = the variance of p_k over the classes (a peaked prediction is confident);
* consensus: the label most teachers predict (ties go to the label whose voters have the larger
  summed confidence); N_x = the teachers predicting it;
* weighted consensus target: s(x) = sum_{k in N_x} sigma_k p_k / sum_{k in N_x} sigma_k;
* diversity target, from the teachers outside the consensus: d(x) = the same confidence-weighted
  mean over k not in N_x;
* loss = mean_x KL(s(x) || q(x)) + lambda * (1/B) sum_{x with dissent} KL(d(x) || q(x)), with
  q = softmax(student / T) and lambda = `distill.diversity` (0.05 in FedProphet's release).

The Fed-ET paper is not among edgefl's sources (FedProphet names it only as a baseline) and its
text could not be consulted here: the above is §3.2 as recalled, not checked against the paper.
Two simplifications: the diversity term pulls the same output as the consensus term (Fed-ET may
give it a head of its own), and the server does not distil the large model back into the small
ones; the small members keep their FedAvg.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from edgefl.methods.base import METHODS
from edgefl.methods.distill import DistillAT, kl_rows

TINY = 1e-12  # keeps zero-confidence (uniform) teachers at equal, not undefined, weights


def weighted_mean(p: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_k w_k p_k / sum_k w_k per sample: p [K, B, C], w [K, B] -> [B, C] (0 where no weight)."""
    return (w.unsqueeze(-1) * p).sum(0) / w.sum(0).clamp_min(TINY).unsqueeze(-1)


Targets = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def fedet_targets(teachers: torch.Tensor, temperature: float) -> Targets:
    """(consensus target [B, C], diversity target [B, C], has-dissent mask [B]) from logits [K, B, C]."""
    p = F.softmax(teachers / temperature, dim=-1)
    confidence = p.var(-1, unbiased=False) + TINY  # [K, B]
    votes = F.one_hot(p.argmax(-1), p.shape[-1]).to(p.dtype)  # [K, B, C]
    backing = (votes * confidence.unsqueeze(-1)).sum(0)  # summed confidence behind each label
    score = votes.sum(0) + backing / (1 + confidence.sum(0)).unsqueeze(-1)  # counts, then confidence
    agree = p.argmax(-1) == score.argmax(-1)  # [K, B]
    return (weighted_mean(p, confidence * agree), weighted_mean(p, confidence * ~agree),
            (~agree).any(0))


def fedet_loss(student: torch.Tensor, teachers: torch.Tensor, temperature: float,
               diversity: float) -> torch.Tensor:
    """Weighted-consensus KL plus `diversity` x the dissenting teachers' KL (see the module)."""
    consensus, dissent, mask = fedet_targets(teachers, temperature)
    log_q = F.log_softmax(student / temperature, dim=-1)
    spread = (kl_rows(dissent, log_q) * mask).sum() / len(student)
    return kl_rows(consensus, log_q).mean() + diversity * spread


@METHODS.register("fedet_at")
class FedETAT(DistillAT):
    per_client_teachers = False  # Alg. 1: the ensemble of the per-architecture averages

    def target_loss(self, student: torch.Tensor, teachers: torch.Tensor) -> torch.Tensor:
        d = self.ctx.scenario.distill
        return fedet_loss(student, teachers, d.temperature, d.diversity)
