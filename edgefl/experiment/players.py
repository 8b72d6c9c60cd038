"""How a run's rounds are played: one `RoundPlayer` per round mode, which the round loop
(edgefl.experiment.loop) asks for round t's table and, at the run's end, for its last spans.

* `SyncRounds`: a plain fleet (every device always online, `round.mode = "sync"`): the selection
  policy's clients, drawn, planned, priced and played in bulk (edgefl.experiment.rounds).
* `LivingRounds`: `sync` or `deadline` rounds on a living fleet (availability, batteries): the
  clients online at the round's start, played with their interrupts (edgefl.experiment.living,
  edgefl.sim.living_round; FedScale's over-commitment and deadline in `deadline` mode, Lai et al., OSDI
  2021).
* `AsyncRounds` (edgefl.experiment.async_rounds): FedBuff's buffered asynchronous aggregation (Nguyen et
  al., AISTATS 2022), one aggregation a row.

The sync and living players train the clients whose updates arrive and aggregate them (`trained`).
A checkpoint keeps a player's `state`, and a resumed run's player is given it back (`resume`):
a sync or living player's round ends with its round, so theirs is the clock and the batteries'
charges; the async player's clients are mid-flight at every aggregation.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

import numpy as np

from edgefl.errors import EdgeflError
from edgefl.executors.executor import Executor
from edgefl.experiment.async_rounds import AsyncRounds
from edgefl.experiment.living import Live, completed, live_round
from edgefl.experiment.prepare import Experiment
from edgefl.experiment.round_energy import RoundEnergy
from edgefl.experiment.rounds import RoundTable, bulk_round
from edgefl.runlog import Columns
from edgefl.selection.server import Selection
from edgefl.sim.bulk import Pricer
from edgefl.sim.engine import Federation
from edgefl.training.local import SERVER, seed_everything

Played = tuple[RoundTable, float | str, np.ndarray]  # a round's table, mean loss, measured seconds


class RoundPlayer(Protocol):
    def play(self, t: int) -> Played:
        """Round t (in async mode, aggregation t) played, its clients trained and aggregated."""
        ...

    def ending(self) -> Columns | None:
        """events.csv's spans that only the run's end closes (None: there are none)."""
        ...

    def state(self) -> dict[str, Any]:
        """What a checkpoint taken after the last round played keeps of the player (plain data)."""
        ...

    def resume(self, first: int, saved: dict[str, Any], where: str) -> None:
        """Go on from a checkpoint (the file `where`) taken after round `first` - 1, whose `state`
        was `saved`."""
        ...


def server_seconds(exp: Experiment, t: int, arrived: Collection[int] | None = None) -> float:
    """The server's seconds in round t: its fixed time plus the method's server FLOPs on the updates
    that `arrived` (all, when None) at `cost.server_gflops`."""
    s = exp.scenario
    return s.cost.server_s + exp.method.server_flops(t, arrived) / (s.cost.server_gflops * 1e9)


class SyncRounds:
    """A plain fleet's synchronous rounds of the clients the selection policy picks."""

    def __init__(self, exp: Experiment, executor: Executor, fed: Federation, pricer: Pricer,
                 energy: RoundEnergy, selection: Selection) -> None:
        self.exp, self.executor, self.fed, self.pricer = exp, executor, fed, pricer
        self.energy, self.selection = energy, selection

    def play(self, t: int) -> Played:
        exp, picked = self.exp, self.selection.pick(t)
        table = bulk_round(exp.pool, exp.method, self.pricer, self.fed, t, lambda: server_seconds(exp, t),
                           picked, self.energy)
        return trained(exp, self.executor, table, table.states.clients.tolist(), self.selection)

    def ending(self) -> Columns | None:
        return None

    def state(self) -> dict[str, Any]:
        battery = self.energy.battery
        return {"clock": self.fed.now, "battery": battery.state(self.fed.now) if battery else []}

    def resume(self, first: int, saved: dict[str, Any], where: str) -> None:
        clock = saved.get("clock")
        if not isinstance(clock, float | int) or isinstance(clock, bool):
            raise EdgeflError(where, "player", "the checkpoint's clock is missing or damaged; start the run "
                              "again")
        self.fed.reach(float(clock))
        if self.energy.battery is not None:
            self.energy.battery.restore(saved.get("battery"), where, self.fed.now)


class LivingRounds(SyncRounds):
    """Sync or deadline rounds on a living fleet: the selection policy (if it logs its picks) chooses
    among the clients online at the round's start; those that complete are trained."""

    def __init__(self, exp: Experiment, executor: Executor, fed: Federation, pricer: Pricer,
                 energy: RoundEnergy, selection: Selection) -> None:
        super().__init__(exp, executor, fed, pricer, energy, selection)
        self.live = Live.of(exp, energy)

    def play(self, t: int) -> Played:
        exp, live, selection = self.exp, self.live, self.selection
        choose = None if not selection.logged else (lambda online: selection.pick(t, online, live.selected))
        table = live_round(exp, live, self.pricer, self.fed, t,
                           lambda arrived: server_seconds(exp, t, arrived), self.energy, choose)
        return trained(exp, self.executor, table, completed(table), selection)


def make_player(exp: Experiment, executor: Executor, fed: Federation, pricer: Pricer, energy: RoundEnergy,
                selection: Selection) -> RoundPlayer:
    """The player of the scenario's round mode on its fleet."""
    s = exp.scenario
    if s.round.mode == "async":
        return AsyncRounds(exp, executor, fed, pricer, lambda t: server_seconds(exp, t), energy, selection)
    return (LivingRounds if s.living else SyncRounds)(exp, executor, fed, pricer, energy, selection)


def trained(exp: Experiment, executor: Executor, table: RoundTable, clients: list[int],
            selection: Selection) -> Played:
    """Train `clients` of the round (those whose updates arrive: not offline, late, or dropped) and
    aggregate: the round's table, its mean training loss and each client's
    measured training seconds (NaN where none was); `selection` records what the round showed."""
    s, m, t = exp.scenario, exp.method, table.round
    n = len(table.states.clients)
    ran = ~table.dropped  # a battery too low: not run
    shown = table.states.clients[ran], table.seen_s()[ran]
    if exp.dry_run or not clients:
        m.skip(t, clients)
        selection.record(t, *shown, {})
        return table, "", np.full(n, np.nan)
    arriving = set(clients)
    updates = executor.train(t, {k: p for k, p in table.plan.by_client(table.states.clients).items()
                                 if k in arriving})
    selection.record(t, *shown, {u.client: u.loss for u in updates})
    seed_everything(s.seed, t, SERVER)  # the server's stream: the same wherever the clients trained
    m.aggregate(t, updates)
    measured = {u.client: u.real_compute_s for u in updates}
    return (table, round(sum(u.loss for u in updates) / len(updates), 5),
            np.array([measured.get(k, np.nan) for k in table.states.clients.tolist()]))
