"""Client selection: which clients the server picks each round, from what it knows.

A policy is a small class registered by name (`SELECTORS`) whose `select` is a pure function of the
round's `Ask` (the round, how many to pick, the scenario seed, every client's sample count, this
round's device draws where a policy asks for them) and of `Known`, the server's record of past rounds:
each client's last reported training loss (from its update), its last duration (download to upload,
from the cost model's prices) and the last round it was picked. `Known` is checkpointed with the run.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from edgefl.config import Scenario
from edgefl.devices.pool import DevicePool
from edgefl.registry import Registry

SELECT = 4  # the selection's random stream (DevicePool's streams are 0 to 3)


@dataclass
class Known:
    """What the server has seen of each client (row k is client k)."""

    loss: np.ndarray  # float64: the last training loss it reported (NaN: none yet, or a dry run)
    duration_s: np.ndarray  # float64: its last round's duration, download to upload (NaN: never picked)
    last_round: np.ndarray  # int64: the last round it was picked in (-1: never)

    @classmethod
    def empty(cls, clients: int) -> Known:
        return cls(np.full(clients, np.nan), np.full(clients, np.nan), np.full(clients, -1, dtype=np.int64))

    def record(self, round_: int, clients: np.ndarray, duration_s: np.ndarray,
               loss: dict[int, float]) -> None:
        """A played round: its clients' durations and the losses their updates reported."""
        self.last_round[clients] = round_
        self.duration_s[clients] = duration_s
        for k, value in loss.items():
            self.loss[k] = value

    def state(self) -> dict[str, torch.Tensor]:
        """As plain data for the checkpoint."""
        return {name: torch.from_numpy(getattr(self, name).copy())
                for name in ("loss", "duration_s", "last_round")}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor], clients: int) -> Known:
        """Back from `state`; ValueError if it is not a record of `clients` clients."""
        arrays = {name: state[name].numpy() for name in ("loss", "duration_s", "last_round")}
        if any(a.shape != (clients,) for a in arrays.values()):
            raise ValueError(f"selection state is not of {clients} clients")
        return cls(arrays["loss"].astype(np.float64), arrays["duration_s"].astype(np.float64),
                   arrays["last_round"].astype(np.int64))


@dataclass(frozen=True)
class Ask:
    """A round's question to the policy: pick `count` of the pool's clients in round `round`."""

    round: int
    count: int
    pool: DevicePool
    dry_run: bool  # no losses exist: policies say what they use instead
    sizes: Callable[[], np.ndarray]  # every client's training samples |B_i|
    need_bytes: Callable[[], float]  # the memory the method's workload asks this round
    online: np.ndarray | None = None  # bool per client: who can be picked (a living fleet); None: all
    draw: int | None = None  # which of the round's picks this is, where it picks more than once (async)

    @property
    def clients(self) -> int:
        return self.pool.fleet.clients

    def candidates(self, clients: np.ndarray) -> np.ndarray:
        """Those of `clients` that can be picked (all where the whole fleet can)."""
        return clients if self.online is None else clients[self.online[clients]]

    def rng(self) -> np.random.Generator:
        """The round's selection stream (the pick's, with `draw`), from the scenario seed."""
        key = [self.pool.seed, SELECT, self.round] + ([] if self.draw is None else [self.draw])
        return np.random.default_rng(key)

    def memory_bytes(self, clients: np.ndarray) -> np.ndarray:
        """The memory `clients` have this round (drawn as the picked clients then train with it)."""
        return self.pool.memory_bytes(clients, self.round)


@dataclass(frozen=True)
class Picked:
    """The round's clients (ascending), the figure that ranked each and why it was picked."""

    clients: np.ndarray  # int64
    utility: np.ndarray  # float64 (NaN where no figure ranked it)
    reason: list[str]

    @classmethod
    def uniform(cls, clients: np.ndarray) -> Picked:
        """`clients` (ascending) drawn uniformly: no figure ranked them."""
        return cls(clients.astype(np.int64), np.full(len(clients), np.nan), ["uniform"] * len(clients))

    @classmethod
    def of(cls, clients: np.ndarray, utility: np.ndarray, reason: list[str]) -> Picked:
        """Sorted by client."""
        order = np.argsort(clients, kind="stable")
        return cls(clients[order].astype(np.int64), utility[order].astype(np.float64),
                   [reason[i] for i in order.tolist()])


class Selector(ABC):
    """A selection policy. A policy with knobs declares their section in its own file
    (`edgefl.config.knob_section`, as methods do) and reads it in `__init__` with `s.knobs(cls)`."""

    def __init__(self, s: Scenario) -> None:  # noqa: B027  (a policy without knobs keeps nothing)
        """Read the policy's knobs from the scenario."""

    @abstractmethod
    def select(self, ask: Ask, known: Known) -> Picked:
        """The round's clients, `ask.count` of them."""


SELECTORS: Registry[type[Selector]] = Registry("selection policy", "edgefl.policies")


def weighted_draw(rng: np.random.Generator, candidates: np.ndarray, weights: np.ndarray,
                  size: int) -> np.ndarray:
    """`size` of `candidates` without replacement, with probability proportional to `weights` (those
    of weight 0 only once every positive one is drawn, then uniformly; an infinite weight, e.g. a
    diverged client's loss, before every finite one, uniformly among such)."""
    infinite = np.isposinf(weights)
    if infinite.any():
        first = rng.permutation(candidates[infinite])[:size]
        rest = weighted_draw(rng, candidates[~infinite], weights[~infinite], size - len(first))
        return np.concatenate([first, rest])
    positive = weights > 0
    first = candidates[positive]
    take = min(size, len(first))
    drawn = rng.choice(first, size=take, replace=False, p=weights[positive] / weights[positive].sum()) \
        if take else first[:0]
    rest = candidates[~positive]
    return np.concatenate([drawn, rng.choice(rest, size=size - take, replace=False)])
