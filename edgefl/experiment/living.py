"""A living fleet's sync and deadline rounds: devices that come and go, deadlines, batteries.

With `fleet.availability = "always"` and `round.mode = "sync"` (the defaults) none of this runs and
rounds are edgefl.experiment.rounds's. Otherwise a round's clients are drawn from the devices online
at its start (a seeded permutation of the fleet, keyed by (seed, SAMPLE, round), the first online
ones, or a selection policy's pick among them), drawn, planned and priced in bulk, and played by
edgefl.sim.living_round's event loop; only the clients that completed train for real and are
aggregated (the others' work is lost). Async rounds (FedBuff) are edgefl.experiment.async_rounds's.

Batteries (edgefl.sim.battery) make a fleet living: an empty one leaves its device offline until it
is plugged in (`Powered`). A sync or deadline round drops, at its start, a client whose battery
cannot pay for its work; a client at work goes offline where its battery runs out (`drains`).
Selection policies, shared server links and batteries act in every mode; in async mode a policy
picks one client each time a slot frees, and the links are shared by the transfers in flight.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from edgefl.config import MAX_SECONDS
from edgefl.devices.pool import SAMPLE, DevicePool, rng, selected_per_round
from edgefl.errors import EdgeflError
from edgefl.experiment.prepare import Experiment
from edgefl.experiment.round_energy import RoundEnergy
from edgefl.experiment.rounds import RoundTable, priced
from edgefl.selection import Picked
from edgefl.sim.availability import Availability, make_availability
from edgefl.sim.battery import Powered
from edgefl.sim.bulk import Pricer
from edgefl.sim.clients import COMPLETED, DROPPED
from edgefl.sim.cost import ClientCost, Costs
from edgefl.sim.engine import Federation
from edgefl.sim.living_round import play_round


def phases(c: ClientCost) -> tuple[float, float, float, float]:
    return c.download_s, c.data_access_s, c.compute_s, c.upload_s


@dataclass
class Live:
    """What a living round needs besides the experiment: availability and how many to select."""

    avail: Availability
    target: int  # uploads the round needs (sync: everyone selected)
    selected: int  # clients selected (deadline: ceil(over_selection x target))
    deadline_s: float  # inf: none

    @classmethod
    def of(cls, exp: Experiment, energy: RoundEnergy) -> Live:
        s = exp.scenario
        n = selected_per_round(s.fleet)
        deadline = s.round.mode == "deadline"
        return cls(fleet_availability(exp, energy), n,
                   min(s.fleet.clients, math.ceil(round(s.round.over_selection * n, 9))) if deadline else n,
                   s.round.deadline_s if deadline else math.inf)


def fleet_availability(exp: Experiment, energy: RoundEnergy) -> Availability:
    """When each device is online: `fleet.availability`, and with batteries only while it has
    charge or is plugged in (edgefl.sim.battery.Powered)."""
    avail = make_availability(exp.scenario.fleet, exp.scenario.seed, exp.where)
    return avail if energy.battery is None else Powered(avail, energy.battery)


FIRST_LOOK = 64  # online_pick asks this many clients first, then four times as many each time


def online_pick(avail: Availability, order: np.ndarray, now: float, count: int) -> list[int]:
    """The first `count` clients of `order` online at `now`. The clients are asked in growing slices
    of `order`, so that a round picking thousands of a large fleet asks a few slices."""
    picked: list[int] = []
    begin, size = 0, max(FIRST_LOOK, count)
    while begin < len(order) and len(picked) < count:
        part = order[begin:begin + size]
        picked += part[avail.online_many(part, now)][:count - len(picked)].tolist()
        begin, size = begin + size, 4 * size
    return picked


NEVER_ONLINE = ("no device of the fleet comes online again (a trace without online intervals for them, "
                "or every battery empty with energy.charge_w = 0); give them online intervals or a charger")


Choose = Callable[[np.ndarray], Picked]  # a policy's pick among the online clients (bool mask)


def select_online(live: Live, pool: DevicePool, fed: Federation, t: int, where: str,
                  choose: Choose | None = None) -> Picked:
    """Round t's clients, ascending: the first online ones of a seeded permutation; or, with
    `choose` (a selection policy), its pick among the clients online (the whole fleet asked once).
    If none is online, the clock moves on to when the first comes online."""
    n = pool.fleet.clients
    while True:
        if choose is None:
            picked = online_pick(live.avail, rng(pool.seed, SAMPLE, t).permutation(n), fed.now, live.selected)
            if picked:
                return Picked.uniform(np.array(sorted(picked), dtype=np.int64))
        else:
            online = live.avail.online_many(np.arange(n), fed.now)
            if online.any():
                return choose(online)
        when = min((live.avail.online_at(k, fed.now) for k in range(n)), default=math.inf)
        if not math.isfinite(when):
            raise EdgeflError(where, "fleet.availability", NEVER_ONLINE)
        fed.reach(max(when, math.nextafter(fed.now, math.inf)))


def live_round(exp: Experiment, live: Live, pricer: Pricer, fed: Federation, t: int,
               server_s: Callable[[list[int]], float], energy: RoundEnergy,
               choose: Choose | None = None) -> RoundTable:
    """Round t of a sync or deadline round on a living fleet; `energy` drops the clients whose
    battery cannot cover their whole work (status `dropped`, nothing done), shares the server's
    links and prices the work each other client did; `choose` picks the round's clients among those
    online (select_online); `server_s(clients whose updates count)` is the server's time."""
    picked = select_online(live, exp.pool, fed, t, exp.where, choose)
    clients = picked.clients
    gathered, plan, priced_costs = priced(exp.pool, exp.method, pricer, t, clients)
    costs, dropped = energy.unpaid(gathered, plan, priced_costs, fed.now)
    if len(clients) and dropped.all():  # no one can pay: the round waits until one's battery can
        wake = energy.payable_at(gathered, plan, priced_costs, fed.now)
        if not math.isfinite(wake):
            raise EdgeflError(exp.where, "energy.charge_w", f"round {t}: the battery of every one of its "
                              f"{len(clients)} clients is too low to pay for its work, and no charger fills "
                              f"one within {MAX_SECONDS:.0e} s (none, or too weak); raise energy.charge_w or "
                              "energy.battery_start")
        fed.reach(max(wake, math.nextafter(fed.now, math.inf)))
        costs, dropped = energy.unpaid(gathered, plan, priced_costs, fed.now)
    played = np.flatnonzero(~dropped)
    transfers, drains = energy.transfers(gathered, plan), energy.drains(gathered, plan, costs, fed.now)
    spans = np.column_stack([costs.download_s, costs.data_access_s, costs.compute_s, costs.upload_s])
    r = play_round(fed, clients[played], spans[played], live.avail, live.target, live.deadline_s,
                   lambda counted: server_s(counted.tolist()),
                   None if transfers is None else (energy.links, transfers.take(played)),
                   None if drains is None else drains.take(played))
    status, stop = np.full(len(clients), DROPPED, dtype=np.int64), np.full(len(clients), r.start_s)
    status[played], stop[played] = r.status, r.stop_s
    costs = on_links(costs, played, r.transfer_s)
    wait, n = np.where(status == COMPLETED, r.close_s - stop, 0.0), len(clients)
    joules = energy.living(gathered, plan, costs, stop - r.start_s, wait, dropped, stop + wait)
    return RoundTable(t, r.start_s, r.close_s, r.end_s, r.end_s - r.close_s, gathered, plan, costs,
                      np.full(n, r.start_s), stop, wait, status, np.zeros(n, dtype=np.int64), dropped, joules,
                      energy.charge(gathered), picked)


def on_links(costs: Costs, rows: np.ndarray, transfer_s: np.ndarray) -> Costs:
    """The costs with the seconds each transfer of the clients `rows` took on the shared links
    (`transfer_s`, (n, 2): down, up; one cut midway: the seconds it would have taken at its pace,
    edgefl.sim.living_round); one that never started (NaN) keeps its time alone."""
    down, up = costs.download_s.copy(), costs.upload_s.copy()
    for spans, link in ((down, 0), (up, 1)):
        spans[rows] = np.where(np.isnan(transfer_s[:, link]), spans[rows], transfer_s[:, link])
    return replace(costs, download_s=down, upload_s=up)


def completed(table: RoundTable) -> list[int]:
    assert table.status is not None
    return table.states.clients[table.status == COMPLETED].tolist()
