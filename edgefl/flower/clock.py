"""The simulated clock of a Flower run: edgefl's own rounds, played on the prices the nodes sent.

`Clock` is what `DeviceClock` (edgefl.flower.strategy) keeps across a Flower run; it does not
import flwr. A round is edgefl's, the same functions `edgefl run` calls (edgefl.experiment):

* `begin(t)`: the method's `start_round`, then the round's clients picked as edgefl picks them: the
  selection policy's pick on a plain fleet (`Selection.pick`), or on a living fleet the clients
  online at the clock's time (`select_online`: availability, batteries, over-selection; the clock
  moves on to when one comes online if none is), with each client's plan (the Workload's numbers
  the node is sent);
* `end(t, ...)`: the round played by edgefl's player of the scenario's mode (`bulk_round` on a plain
  fleet, `live_round` on a living one: deadline, over-selection, interrupts, batteries, the
  server's shared links), priced by the prices the nodes' replies carry (`Replied`) instead of
  the server's own pricing (which they equal: the same one-row Pricer). A node whose ClientApp
  failed is left out of the round (it never uploads) and recorded `dropped`, with its reason.

The clients that `completed` are those whose updates the wrapped strategy aggregates; the others'
work is lost, as in edgefl. The method's dry-run bookkeeping follows (`skip`), so the next round's
plans are the ones `edgefl run --dry-run` makes.
"""

from __future__ import annotations

from dataclasses import fields, replace
from typing import Any, cast

import numpy as np

from edgefl.devices.pool import States
from edgefl.experiment.living import Live, completed, live_round, select_online
from edgefl.experiment.players import server_seconds
from edgefl.experiment.rounds import RoundTable, bulk_round
from edgefl.flower.shadow import Shadow, costs_of, plan_numbers
from edgefl.methods.base import ClientPlan
from edgefl.selection import Picked
from edgefl.selection.server import Selection, workload_need
from edgefl.sim.bulk import Pricer
from edgefl.sim.clients import DROPPED
from edgefl.sim.cost import Costs, RoundPlan
from edgefl.sim.engine import Federation


class Replied:
    """A Pricer whose prices are the nodes' (by client); a client without one is priced here."""

    def __init__(self, prices: dict[int, dict[str, float]], own: Pricer) -> None:
        self.prices, self.own = prices, own

    def price(self, plan: RoundPlan[ClientPlan], states: States) -> Costs:
        clients = states.clients.tolist()
        if all(k in self.prices for k in clients):
            return costs_of([self.prices[k] for k in clients])
        mine = self.own.price(plan, states)
        return costs_of([self.prices[k] if k in self.prices else _row(mine, i)
                         for i, k in enumerate(clients)])


def _row(c: Costs, i: int) -> dict[str, float]:
    return {f.name: getattr(c, f.name)[i].item() for f in fields(c)}


class Clock:
    """edgefl's clock, fleet and selection over a Flower run's rounds."""

    def __init__(self, shadow: Shadow) -> None:
        self.shadow = shadow
        exp = shadow.exp
        self.selection = Selection(exp.scenario, exp.pool, True, exp.ctx.splits,
                                   workload_need(exp.method, exp.pool))
        self.fed = Federation()
        self.live = Live.of(exp, shadow.energy) if exp.scenario.living else None
        self.picked: Picked | None = None

    @property
    def now(self) -> float:
        return self.fed.now

    def begin(self, t: int) -> dict[int, dict[str, Any]]:
        """Round t's clients (ascending) and the numbers of each one's plan."""
        exp, live, selection = self.shadow.exp, self.live, self.selection
        exp.method.start_round(t)
        if live is None:
            picked = selection.pick(t)
        else:
            choose = (None if not selection.logged
                      else (lambda online: selection.pick(t, online, live.selected)))
            picked = select_online(live, exp.pool, self.fed, t, exp.where, choose)
        self.picked = picked
        _, plan = self.shadow.planned(t, picked.clients)
        return {k: plan_numbers(plan.workload(i)) for i, k in enumerate(picked.clients.tolist())}

    def end(self, t: int, prices: dict[int, dict[str, float]], failed: dict[int, str],
            losses: dict[int, float]) -> RoundTable:
        """Round t played with the nodes' `prices`; the `failed` clients (reason by client) dropped."""
        assert self.picked is not None, "begin(t) first"
        exp, energy, picked = self.shadow.exp, self.shadow.energy, self.picked
        keep = np.array([k not in failed for k in picked.clients.tolist()], dtype=bool)
        ok = Picked(picked.clients[keep], picked.utility[keep],
                    [r for r, y in zip(picked.reason, keep, strict=True) if y])
        pricer = cast(Pricer, Replied(prices, self.shadow.pricer))  # only its price() is asked
        table: RoundTable | None = None
        if len(ok.clients):
            if self.live is None:
                table = bulk_round(exp.pool, exp.method, pricer, self.fed, t, lambda: server_seconds(exp, t),
                                   ok, energy)
            else:
                table = live_round(exp, self.live, pricer, self.fed, t,
                                   lambda arrived: server_seconds(exp, t, arrived), energy, lambda _: ok)
        if failed:
            table = with_failed(table, self._failed_rows(t, picked, ~keep))
        assert table is not None
        ran, done = ~table.dropped, completed(table)
        kept = set(done)
        self.selection.record(t, table.states.clients[ran], table.seen_s()[ran],
                              {k: v for k, v in losses.items() if k in kept})
        exp.method.skip(t, done)
        return table

    def _failed_rows(self, t: int, picked: Picked, rows: np.ndarray) -> RoundTable:
        """A round table of the clients whose node failed: nothing done, stopped at the clock's time."""
        energy, clients = self.shadow.energy, picked.clients[rows]
        states, plan = self.shadow.planned(t, clients)
        n, now = len(clients), self.fed.now
        zero = np.zeros(n)
        costs = Costs(zero, zero, zero, zero, zero, np.zeros(n, dtype=bool), zero, zero)
        joules = np.full(n, np.nan) if energy.power is None else zero
        return RoundTable(t, now, now, now, 0.0, states, plan, costs, np.full(n, now), np.full(n, now), zero,
                          np.full(n, DROPPED), np.zeros(n, dtype=np.int64), np.zeros(n, dtype=bool), joules,
                          energy.charge(states),
                          Picked(clients, picked.utility[rows],
                                 [r for r, y in zip(picked.reason, rows, strict=True) if y]))


def with_failed(table: RoundTable | None, failed: RoundTable) -> RoundTable:
    """The round's table with the failed nodes' rows, clients ascending (the round's times are
    the played round's; all failed: the failed rows' own, at the clock's time)."""
    if table is None:
        return failed
    order = np.argsort(np.concatenate([table.states.clients, failed.states.clients]), kind="stable")

    def rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.concatenate([a, b])[order]

    states = States(**{f.name: rows(getattr(table.states, f.name), getattr(failed.states, f.name))
                       for f in fields(States)})
    plans = table.plan.plans + failed.plan.plans
    plan = RoundPlan(plans, rows(table.plan.which, failed.plan.which + len(table.plan.plans)))
    costs = Costs(**{f.name: rows(getattr(table.costs, f.name), getattr(failed.costs, f.name))
                     for f in fields(Costs)})
    start = table.start_s
    n = len(failed.states.clients)
    reason = table.picked.reason + failed.picked.reason
    picked = Picked(rows(table.picked.clients, failed.picked.clients),
                    rows(table.picked.utility, failed.picked.utility), [reason[i] for i in order.tolist()])
    return replace(table, states=states, plan=plan, costs=costs,
                   begin_s=rows(table.begin_s, np.full(n, start)),
                   finish_s=rows(table.finish_s, np.full(n, start)), wait_s=rows(table.wait_s, np.zeros(n)),
                   status=rows(table.status, failed.status),
                   staleness=rows(table.staleness, failed.staleness),
                   dropped=rows(table.dropped, failed.dropped),
                   energy_j=rows(table.energy_j, failed.energy_j),
                   charge_j=rows(table.charge_j, failed.charge_j), picked=picked)

