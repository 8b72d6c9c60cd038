"""The server's client selection over a run: the scenario's policy, the record it reads (`Known`,
updated after every round and checkpointed), and each round's `Ask`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from functools import cache
from typing import Any

import numpy as np

from edgefl.config import Scenario
from edgefl.data.partition import ClientSplit
from edgefl.devices.pool import DevicePool, selected_per_round
from edgefl.methods.base import Method
from edgefl.selection.base import SELECTORS, Ask, Known, Picked


def workload_need(method: Method, pool: DevicePool) -> Callable[[int], float]:
    """The memory (bytes) the cost model charges for the method's plan of a client in round t that
    has the fleet's largest memory (the workload as the method wants it, unshrunk), planned after
    the method's `start_round(t)` and before its `plan_round`: a plan that reads the round's picked
    clients (FedProphet's slowest, for DMA) sees the latest round's."""

    def need(round_: int) -> float:
        state = replace(pool.state(0, round_), memory_bytes=float(pool.kind_memory.max()))
        return method.ctx.cost.memory_need(method.plan(round_, 0, state).workload)

    return need


class Selection:
    """Picks each round's clients and remembers what the rounds showed."""

    def __init__(self, s: Scenario, pool: DevicePool, dry_run: bool,
                 splits: Sequence[ClientSplit], need: Callable[[int], float]) -> None:
        self.cfg, self.pool, self.dry_run, self.need = s.selection, pool, dry_run, need
        self.policy = SELECTORS.get(s.selection.policy)(s)
        self.known = Known.empty(pool.fleet.clients)
        self.sizes = cache(lambda: np.array([len(s.train) for s in splits], dtype=np.int64))

    @property
    def logged(self) -> bool:
        """Whether clients.csv gains the `utility` and `picked_by` columns (every policy but uniform,
        whose logs stay as they were)."""
        return self.cfg.policy != "uniform"

    def pick(self, round_: int, online: np.ndarray | None = None, count: int = 0,
             draw: int | None = None) -> Picked:
        """Round t's clients: `count` (0: the fleet's clients per round) of those `online` (bool per
        client; None: every client), fewer where fewer are online; `draw` keys the policy's random
        stream where one round picks several times (async mode: its start count)."""
        count = count or selected_per_round(self.pool.fleet)
        if online is not None:
            count = min(count, int(online.sum()))
        ask = Ask(round_, count, self.pool, self.dry_run, self.sizes, lambda: self.need(round_), online, draw)
        return self.policy.select(ask, self.known)

    def record(self, round_: int, clients: np.ndarray, duration_s: np.ndarray,
               loss: dict[int, float]) -> None:
        self.known.record(round_, clients, duration_s, loss)

    def state(self) -> dict[str, Any]:
        return {"policy": self.cfg.policy, **self.known.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Back from a checkpoint's `selection`; ValueError if it is another policy's or fleet's."""
        if state.get("policy") != self.cfg.policy:
            raise ValueError("selection policy differs")
        self.known = Known.from_state(state, self.pool.fleet.clients)
