"""FedDynAT (Shah et al., Alg. 2): local epochs decay as E_t = floor(E0 gamma^floor(t / F)) (at least
one), which cuts the client drift of long local adversarial training late in training while
keeping its early speed. `feddynat` fuses with FedCurv, `fedavg_dynat` with FedAvg.

Its paper's headline claim, checked on digits (`bench/claims.py feddyn`), and what edgefl measured:
docs/claims.md.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgefl.config import MAX_EPOCHS, Check, Knobs, knob_section
from edgefl.methods.base import METHODS
from edgefl.methods.fedavg import FedAvgAT, epochs_to_iters
from edgefl.methods.fedcurv import FedCurvAT


@knob_section("dyn")
@dataclass
class DynConfig(Knobs):
    """FedDynAT's local-epoch schedule (Shah et al. Alg. 2): E_t = floor(E0 gamma^floor(t / F))."""

    e0: float = 50.0  # E0: the local epochs in round 0
    gamma: float = 0.5  # the decay factor
    f: int = 5  # F: rounds between decays

    def checks(self) -> list[Check]:
        return [
            ("e0", 1 <= self.e0 <= MAX_EPOCHS, f"must be 1 to {MAX_EPOCHS:,} epochs"),
            ("gamma", 0 < self.gamma <= 1, "must be in (0, 1]"),
            ("f", self.f >= 1, "must be at least 1 round"),
        ]


def epoch_schedule(round_: int, cfg: DynConfig) -> int:
    """E_t = floor(E0 gamma^floor(t / F)), never below one epoch."""
    return max(1, math.floor(cfg.e0 * cfg.gamma ** (round_ // cfg.f)))


class DynamicEpochs(FedAvgAT):
    def iterations(self, round_: int, client: int) -> int:
        s = self.ctx.scenario
        return epochs_to_iters(epoch_schedule(round_, s.knobs(DynConfig)), len(self.ctx.splits[client].train),
                               s.training.batch_size)


@METHODS.register("feddynat")
class FedDynAT(DynamicEpochs, FedCurvAT):
    """The E schedule with FedCurv fusion."""


@METHODS.register("fedavg_dynat")
class FedAvgDynAT(DynamicEpochs):
    """The E schedule with FedAvg fusion."""
