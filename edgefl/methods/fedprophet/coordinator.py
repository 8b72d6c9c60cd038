"""FedProphet's server-side rules as pure functions (Tang et al., FedProphet §6.2-6.3).

* Differentiated Module Assignment (Eq. 12-13): a client trains modules m..M_k, M_k the largest
  whose memory fits its available memory R_k(t) and whose FLOPs stay within P_k(t) / P_min(t)
  times the FLOPs of module m alone.
* Adaptive Perturbation Adjustment (Eq. 9-10): eps_m = alpha x E[d*_m]; alpha moves by a step when
  the clean/adversarial validation accuracy ratio leaves (1 +- Delta) times the previous module's
  final ratio, and never drops below where it started. As the release: every 10 % of a stage once
  validation is scored, on the mean of the last five scored ratios.
* Stage control (the release's module_scheduler): a per-module clean warm-up, the score
  C + (C*_{m-1} / A*_{m-1}) A from the end of a grace period on, and patience.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


def assign_modules(
    m: int, modules: int, fits: Callable[[int], bool], flops: Callable[[int], float],
    perf: float, perf_min: float,
) -> int:
    """The largest M_k >= m with fits(M_k) and flops(M_k) <= perf / perf_min x flops(m).

    `fits(n)` and `flops(n)` describe training modules m..n jointly with module n's head.
    Module m alone is always assigned: the partition made it fit R_min.
    """
    allowed = perf / perf_min * flops(m)
    last = m
    for n in range(m + 1, modules):
        if not (fits(n) and flops(n) <= allowed):
            break
        last = n
    return last


def adjust_alpha(alpha: float, ratio: float, previous: float, delta: float, step: float,
                 floor: float) -> float:
    """Eq. 10: raise alpha when clean/adv grew past (1 + delta) x the previous module's final
    ratio (too little robustness), lower it when below (1 - delta) x, never under `floor`."""
    if ratio > (1 + delta) * previous:
        return alpha + step
    if ratio < (1 - delta) * previous:
        return max(floor, alpha - step)
    return alpha


def accuracy_ratio(clean: float, adv: float) -> float:
    """C / A, infinite when nothing survives the attack."""
    return clean / adv if adv > 0 else float("inf")


def stage_score(clean: float, adv: float, previous_ratio: float) -> float:
    """The release's validation score C + (C*_{m-1} / A*_{m-1}) A (1 x A for the first module)."""
    return clean + previous_ratio * adv


APA_EVERY = 0.1  # the release moves alpha every 10 % of a stage
APA_WINDOW = 5  # on the mean of the last five scored ratios


@dataclass
class StageControl:
    """The release's module schedule (module_scheduler.stat_update). A module runs at most `budget`
    rounds (ceil(rounds / M)); its first `warmup` rounds train without attack; validation is scored
    from its round `warmup + grace` on (no best state before); it ends early once `patience`
    scored rounds in a row brought no gain. Rounds are counted from the module's first round."""

    budget: int
    warmup: int = 0
    grace: int = 0
    patience: int = 1
    started: int = 0
    best: float = -1.0
    stale: int = 0  # scored rounds since the best one
    ratios: list[float] = field(default_factory=list)  # C / A of the scored rounds

    def age(self, round_: int) -> int:
        """`round_` counted from the module's first round (0 there)."""
        return round_ - self.started

    def warming(self, round_: int) -> bool:
        """Is `round_` one of the module's clean warm-up rounds?"""
        return self.age(round_) < self.warmup

    def scored(self, round_: int) -> bool:
        """Does `round_`'s validation count (past the warm-up and the grace)?"""
        return self.age(round_) >= self.warmup + self.grace

    def record(self, round_: int, score: float, ratio: float) -> bool:
        """Score a round (and keep its C / A); True when it is scored and the best of the stage."""
        if not self.scored(round_):
            return False
        self.ratios.append(ratio)
        if score > self.best:
            self.best, self.stale = score, 0
            return True
        self.stale += 1
        return False

    def done(self, round_: int, budget: int | None = None) -> bool:
        """After `round_`, is the stage over? (`budget` replaces the module's round budget.)"""
        return self.age(round_) + 1 >= (budget or self.budget) or self.stale >= self.patience

    def apa_due(self, round_: int) -> bool:
        """Does APA move alpha after `round_`? Past the first scored round, every 10 % of the budget."""
        age = self.age(round_)
        return age > self.warmup + self.grace and age % max(1, int(APA_EVERY * self.budget)) == 0

    def recent_ratio(self) -> float:
        """The mean C / A of the last five scored rounds."""
        recent = self.ratios[-APA_WINDOW:]
        return sum(recent) / len(recent)

    def restart(self, first_round: int) -> None:
        """A new stage begins at `first_round`."""
        self.started, self.best, self.stale, self.ratios = first_round, -1.0, 0, []
