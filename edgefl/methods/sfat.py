"""SFAT: Slack Federated Adversarial Training (Zhu et al., ICLR 2023, App. D Alg. 1).

At aggregation the k_hat clients with the smallest N_k/N L_k (L_k: their mean adversarial training
loss this round) are weighted (1 + alpha) / (1 - alpha) against 1 for the others, times N_k,
normalised; BatchNorm is averaged plainly, as in the release. Round 0 averages plainly. The client
side is the base optimiser's (`sfat.base`: FedAvg, FedProx or SCAFFOLD).
"""

from __future__ import annotations

from edgefl.methods.aggregate import State, bn_keys, fedavg, slack_weights
from edgefl.methods.base import METHODS, ClientUpdate, Context, Method
from edgefl.methods.fedavg import FedAvgAT
from edgefl.methods.fedprox import FedProxAT
from edgefl.methods.scaffold import ScaffoldAT

BASES: dict[str, type[FedAvgAT]] = {"fedavg": FedAvgAT, "fedprox": FedProxAT, "scaffold": ScaffoldAT}


class Slack(FedAvgAT):
    """Overrides FedAvg's combine with the alpha-slack weights; the base's hooks stay."""

    def combine(self, round_: int, updates: list[ClientUpdate]) -> State:
        plain = super().combine(round_, updates)
        if round_ == 0:
            return plain
        cfg = self.ctx.scenario.sfat
        weights = slack_weights([u.loss for u in updates], [u.num_samples for u in updates], cfg.alpha,
                                min(cfg.k_hat, len(updates)))
        bn = bn_keys(self.model)
        slack = fedavg([{k: v for k, v in u.state.items() if k not in bn} for u in updates], weights)
        return {**plain, **slack}


@METHODS.register("sfat")
def sfat(ctx: Context) -> Method:
    base = BASES[ctx.scenario.sfat.base]
    return type(f"SFAT[{base.__name__}]", (Slack, base), {})(ctx)
