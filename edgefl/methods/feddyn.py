"""FedDynAT (Shah et al., Alg. 2): local epochs decay as E_t = floor(E0 gamma^floor(t / F)) (at least
one), which cuts the client drift of long local adversarial training late in training while
keeping its early speed. `feddynat` fuses with FedCurv, `fedavg_dynat` with FedAvg."""

from __future__ import annotations

import math

from edgefl.config import DynConfig
from edgefl.methods.base import METHODS
from edgefl.methods.fedavg import FedAvgAT, epochs_to_iters
from edgefl.methods.fedcurv import FedCurvAT


def epoch_schedule(round_: int, cfg: DynConfig) -> int:
    """E_t = floor(E0 gamma^floor(t / F)), never below one epoch."""
    return max(1, math.floor(cfg.e0 * cfg.gamma ** (round_ // cfg.f)))


class DynamicEpochs(FedAvgAT):
    def iterations(self, round_: int, client: int) -> int:
        s = self.ctx.scenario
        return epochs_to_iters(epoch_schedule(round_, s.dyn), len(self.ctx.splits[client].train),
                               s.training.batch_size)


@METHODS.register("feddynat")
class FedDynAT(DynamicEpochs, FedCurvAT):
    """The E schedule with FedCurv fusion."""


@METHODS.register("fedavg_dynat")
class FedAvgDynAT(DynamicEpochs):
    """The E schedule with FedAvg fusion."""
