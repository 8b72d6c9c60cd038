"""Oort's guided participant selection (Lai, Zhu, Madhyastha, Chowdhury: "Oort: Efficient Federated
Learning via Guided Participant Selection", OSDI 2021, Algorithm 1).

An explored client i (one picked before) has the utility

    Util(i) = U(i) + sqrt(0.1 ln R / L(i)),    U(i) = |B_i| sqrt(1/|B_i| sum_{k in B_i} Loss(k)^2)

times (T / t_i)^alpha when it is slower than the preferred round duration T (t_i its last duration),
with R the current round and L(i) the round it was last picked (both counted from 1 here). A fraction
epsilon (decaying each round, never below a floor) of the K picks explores clients never picked;
the rest exploit: sampled, with probability proportional to utility, among the explored clients
whose utility is at least `oort.cutoff` times the ((1 - epsilon) K)-th highest.

What edgefl simplifies: a client's update reports its mean training loss over its local iterations,
not per-sample losses, so sqrt(mean Loss^2) is taken as that mean (equal when the samples' losses
are equal, lower otherwise); T is fixed (`oort.round_s`) or a percentile of the explored durations
each round, without the paper's pacer that raises T when the utility stalls; utilities are not
clipped for outliers; exploration draws unexplored clients in proportion to their data size, since
the server has no speed for a client it never saw. In a dry run no loss exists: U(i) is |B_i| (a
loss of 1) and the picks say so; a client picked before that never reported a loss (late, offline
or dropped every time) is also taken at a loss of 1 (FedScale's Oort gives such a straggler the
mean utility of the round's successful clients). The staleness bonus sqrt(0.1 ln R / L(i)) is added
to the raw |B_i| x loss, where Oort's code first rescales the statistical utility to [0, 1], so
here it weighs little. In async mode each pick is of one client, so round(epsilon x 1) makes a pick
all exploration while epsilon > 0.5 and none once it is below.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from edgefl.config import Check, Knobs, Scenario, knob_section
from edgefl.selection.base import SELECTORS, Ask, Known, Picked, Selector, weighted_draw


@knob_section("oort")
@dataclass
class OortConfig(Knobs):
    """Oort's knobs (Lai et al., OSDI 2021, Alg. 1 and Sec. 4-5)."""

    alpha: float = 2.0  # the straggler penalty's exponent, (T / t_i)^alpha
    round_s: float = 0.0  # the preferred round duration T in seconds (0 = the percentile below)
    percentile: float = 50.0  # T as this percentile of the explored clients' durations
    epsilon: float = 0.9  # the exploration fraction in the first round
    epsilon_decay: float = 0.98  # epsilon x this per round
    epsilon_min: float = 0.2  # epsilon never decays below this
    cutoff: float = 0.95  # exploit among utilities >= this x the ((1 - eps) K)-th highest

    def checks(self) -> list[Check]:
        return [
            ("alpha", self.alpha >= 0, "must be non-negative"),
            ("round_s", self.round_s >= 0, "must be 0 (a percentile of the durations) or positive (seconds)"),
            ("percentile", 0 <= self.percentile <= 100, "must be a percentile in [0, 100]"),
            ("epsilon", 0 <= self.epsilon <= 1, "must be a fraction in [0, 1]"),
            ("epsilon_decay", 0 < self.epsilon_decay <= 1, "must be in (0, 1]"),
            ("epsilon_min", 0 <= self.epsilon_min <= self.epsilon, "must be a fraction in [0, oort.epsilon]"),
            ("cutoff", 0 <= self.cutoff <= 1, "must be a fraction in [0, 1]"),
        ]


def oort_utility(sizes: np.ndarray, loss: np.ndarray, duration_s: np.ndarray, last_round: np.ndarray,
                 round_: int, preferred_s: float, alpha: float) -> np.ndarray:
    """Util(i) of explored clients (rounds counted from 0 here, from 1 in the formula)."""
    statistical = sizes * loss
    util = statistical + np.sqrt(0.1 * np.log(round_ + 1) / (last_round + 1))
    slow = duration_s > preferred_s
    return np.where(slow, util * (preferred_s / np.where(slow, duration_s, 1.0)) ** alpha, util)


def exploration(cfg_epsilon: float, decay: float, floor: float, round_: int) -> float:
    """epsilon in round `round_`: epsilon_0 x decay^round, at least the floor."""
    return max(floor, cfg_epsilon * decay ** round_)


@SELECTORS.register("oort")
class Oort(Selector):
    """Statistical utility times system utility, with decaying exploration."""

    def __init__(self, s: Scenario) -> None:
        self.cfg = s.knobs(OortConfig)

    def select(self, ask: Ask, known: Known) -> Picked:
        c, rng, sizes = self.cfg, ask.rng(), ask.sizes().astype(np.float64)
        explored = ask.candidates(np.flatnonzero(known.last_round >= 0))
        fresh = ask.candidates(np.flatnonzero(known.last_round < 0))
        eps = exploration(c.epsilon, c.epsilon_decay, c.epsilon_min, ask.round)
        n_exploit = min(ask.count - min(round(eps * ask.count), len(fresh)), len(explored))
        n_explore = ask.count - n_exploit
        util = np.zeros(0)
        if len(explored):
            durations = known.duration_s[explored]
            preferred = c.round_s or float(np.percentile(durations, c.percentile))
            loss = known.loss[explored]
            util = oort_utility(sizes[explored], np.where(np.isnan(loss), 1.0, loss), durations,
                                known.last_round[explored], ask.round, preferred, c.alpha)
        exploit = self._exploit(rng, explored, util, n_exploit)
        explore = weighted_draw(rng, fresh, sizes[fresh], n_explore)
        by_client = dict(zip(explored.tolist(), util.tolist(), strict=True))
        why = "exploit (dry run: no losses, U = data size)" if ask.dry_run else "exploit"
        return Picked.of(np.concatenate([exploit, explore]),
                         np.array([by_client[k] for k in exploit.tolist()] + [np.nan] * len(explore)),
                         [why] * len(exploit) + ["explore"] * len(explore))

    def _exploit(self, rng: np.random.Generator, explored: np.ndarray, util: np.ndarray,
                 count: int) -> np.ndarray:
        """`count` explored clients, drawn by utility among those above the cut-off."""
        if count == 0:
            return explored[:0]
        cutoff = self.cfg.cutoff * np.sort(util)[::-1][count - 1]
        above = util >= cutoff
        return weighted_draw(rng, explored[above], util[above], count)
