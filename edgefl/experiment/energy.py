"""A round's shared server links, batteries and joules.

Synchronous rounds (edgefl.experiment.rounds): every selected client's transfers share the server's
links, worked out in advance (edgefl.sim.links.shared_round), and each client's joules are priced
after the round; the bulk path prices them as columns (FleetPower.energy), the per-client path
client by client (client_energy), both equal to the bit (tests/test_energy.py).

Batteries make a fleet living (edgefl.experiment.living, edgefl.sim.battery): a round's client whose
charge cannot pay for its own work (its joules without waiting) is dropped at the round's start: it
does nothing (its phases and traffic are zero, it sends no update). Each client's joules are priced
for the work it did before it stopped (`worked`) and drained from its battery; an async client's
battery may run out mid-work (`runs_out`).
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from edgefl.config import Scenario
from edgefl.devices.pool import DevicePool, DeviceState, States
from edgefl.sim.battery import Battery
from edgefl.sim.bulk import Costs, RoundPlan
from edgefl.sim.energy import FleetPower, client_energy
from edgefl.sim.links import Links, shared_round
from edgefl.sim.living import Transfer

WORK = ("compute_s", "data_access_s", "download_s", "upload_s", "read_bytes", "write_bytes")


class RoundEnergy:
    """The scenario's server links, the fleet's power figures and (optionally) its batteries."""

    def __init__(self, s: Scenario, pool: DevicePool) -> None:
        self.pool, self.communication = pool, s.cost.counts_communication
        self.links = Links.of_mbps(s.server.down_mbps, s.server.up_mbps)
        self.power = FleetPower(pool) if s.energy.enabled else None
        self.battery = Battery.of_pool(pool, s.energy, s.seed) if s.energy.batteries else None

    def sent(self, plan: RoundPlan) -> tuple[np.ndarray, np.ndarray]:
        """Bytes each client downloads and uploads (zeros where communication is not counted)."""
        w = plan.workloads
        on = 1.0 if self.communication else 0.0
        down = np.array([x.download_bytes * on for x in w])[plan.which]
        up = np.array([x.upload_bytes * on for x in w])[plan.which]
        return down, up

    def unpaid(self, s: States, plan: RoundPlan, costs: Costs, now: float) -> tuple[Costs, np.ndarray]:
        """A living round's clients whose battery cannot pay for their work from `now` (bool; none
        without batteries), their costs zeroed: they do nothing."""
        dropped = np.zeros(len(s.clients), dtype=bool)
        if self.battery is None or self.power is None:
            return costs, dropped
        need = self.power.energy(s, costs, *self.sent(plan), np.zeros(len(s.clients)))
        dropped = ~self.battery.covers(s.clients, need, now)
        zeroed = {k: np.where(dropped, 0.0, getattr(costs, k)) for k in WORK}
        return replace(costs, swapped=costs.swapped & ~dropped, **zeroed), dropped

    @property
    def sharing(self) -> Links | None:
        """The server's links where transfers share them (None: unlimited, or not counted)."""
        return None if self.links.unlimited or not self.communication else self.links

    def shared(self, s: States, plan: RoundPlan, c: Costs) -> Costs:
        """A synchronous round's costs with every client's transfers on the shared links, worked out
        in advance."""
        if self.sharing is None:
            return c
        down, up = self.sent(plan)
        d, u = shared_round(self.links, (c.download_s, c.data_access_s, c.compute_s, c.upload_s), (down, up),
                            (s.down_bps, s.up_bps), s.latency_s)
        return replace(c, download_s=d, upload_s=u)

    def transfers(self, s: States, plan: RoundPlan, rows: list[int]) -> list[Transfer] | None:
        """The transfers of the clients `rows` on the server's links (`sharing`), for a living fleet's
        SimPy processes (edgefl.sim.living); None where the links are not shared."""
        if self.sharing is None:
            return None
        down, up = self.sent(plan)
        return [Transfer(float(down[i]), float(up[i]), float(s.down_bps[i]), float(s.up_bps[i]),
                         float(s.latency_s[i])) for i in rows]

    def bulk(self, s: States, plan: RoundPlan, costs: Costs, wait_s: np.ndarray) -> np.ndarray | None:
        """The round's joules per client (columns); None without energy."""
        if self.power is None:
            return None
        return self.power.energy(s, costs, *self.sent(plan), wait_s)

    def each(self, s: States, states: list[DeviceState], plan: RoundPlan, costs: Costs,
             wait_s: np.ndarray) -> np.ndarray | None:
        """The same, client by client (the reference)."""
        if self.power is None:
            return None
        down, up = self.sent(plan)
        return np.array([client_energy(self.pool, st, costs.cost(i), (down[i], up[i]), float(wait_s[i]))
                         for i, st in enumerate(states)])

    def work_j(self, s: States, plan: RoundPlan, costs: Costs, elapsed: np.ndarray,
               wait_s: np.ndarray) -> np.ndarray:
        """Joules per client for the work each did in its first `elapsed` seconds (worked) and its
        waiting (energy priced)."""
        assert self.power is not None
        done, down_share, up_share = worked(costs, elapsed)
        down, up = self.sent(plan)
        return self.power.energy(s, done, down * down_share, up * up_share, wait_s)

    def living(self, s: States, plan: RoundPlan, costs: Costs, elapsed: np.ndarray, wait_s: np.ndarray,
               dropped: np.ndarray, end_s: np.ndarray | float) -> np.ndarray | None:
        """A living fleet's joules per client for the work each did in its `elapsed` seconds (its
        stop less its start; edgefl.sim.living) and its waiting, ended by `end_s`, batteries
        drained: no more than a battery held (one that empties while its client waits for the
        round, or on a slower shared transfer than its check priced, gives what it had); None
        without energy."""
        if self.power is None:
            return None
        joules = np.where(dropped, 0.0, self.work_j(s, plan, costs, elapsed, wait_s))
        if self.battery is not None:
            return self.battery.drain(s.clients, joules, end_s)
        return joules

    def runs_out(self, s: States, plan: RoundPlan, costs: Costs, now: float) -> np.ndarray:
        """Seconds into its work (starting `now`) at which each client's battery is empty (inf:
        never). The joules of the work done by a time grow linearly within each phase (edgefl.sim.energy
        prices seconds and bytes), so the moment they reach what the battery holds is interpolated
        between the phases' ends. Unplugged at `now`, the battery holds its charge then, and a client
        plugged in before that moment does not run out; plugged in at `now`, it runs on its charger
        until it is unplugged, and from then on its battery, with the charge it has at the
        unplugging (what the work took meanwhile is settled when it drains), so it runs out no
        sooner than the unplugging. The phases are each client's own: on shared server links its
        transfers take longer, and cost more, than this assumes."""
        n = len(s.clients)
        out = np.full(n, np.inf)
        battery = self.battery
        if battery is None or self.power is None:
            return out
        spans = [costs.download_s, costs.data_access_s, costs.compute_s, costs.upload_s]
        points = np.cumsum([np.zeros(n), *spans], axis=0)  # 5 x n: 0 and each phase's end
        joules = np.array([self.work_j(s, plan, costs, p, np.zeros(n)) for p in points])
        for i, k in enumerate(s.clients.tolist()):
            if battery.plugged(k, now):  # on its charger until unplugged
                unplug = battery.unplugged_at(k, now)
                held = float(battery.level(np.array([k]), unplug)[0])
                out[i] = max(reach(points[:, i], joules[:, i], held), unplug - now)
            else:
                plug = battery.plugged_at(k, now)
                held = float(battery.level(np.array([k]), now)[0])
                empty = reach(points[:, i], joules[:, i], held)
                out[i] = empty if empty < plug - now else math.inf
        return out

    def charge(self, s: States) -> np.ndarray | None:
        """The selected clients' charge left, J (inf: mains powered; None: batteries not tracked)."""
        return None if self.battery is None else self.battery.charge_j[s.clients].copy()


def worked(c: Costs, elapsed: np.ndarray) -> tuple[Costs, np.ndarray, np.ndarray]:
    """The part of each client's phases (download, data access, compute, upload, back to back) done
    in its first `elapsed` seconds, and the shares of its download and upload done: a client stopped
    early (offline, late, dropped) is charged for the phases up to there, its storage bytes in
    proportion to its data access and compute done, its radio bytes to its transfers done."""
    spans = [c.download_s, c.data_access_s, c.compute_s, c.upload_s]
    begin = np.cumsum([np.zeros_like(elapsed), *spans[:-1]], axis=0)
    done = [np.clip(elapsed - b, 0.0, s) for b, s in zip(begin, spans, strict=True)]
    share = [np.divide(d, s, out=(elapsed >= b).astype(np.float64), where=s > 0)
             for d, b, s in zip(done, begin, spans, strict=True)]
    busy = spans[1] + spans[2]
    walk = np.divide(done[1] + done[2], busy, out=share[2].copy(), where=busy > 0)
    return (replace(c, download_s=done[0], data_access_s=done[1], compute_s=done[2], upload_s=done[3],
                    read_bytes=c.read_bytes * walk, write_bytes=c.write_bytes * walk), share[0], share[3])


def reach(points: np.ndarray, joules: np.ndarray, target: float) -> float:
    """The elapsed seconds at which piecewise-linear `joules` (at the ascending `points`, from 0 at
    0) first reach `target`; inf if they never do."""
    j = int(np.searchsorted(joules, target))
    if j >= len(points):
        return math.inf
    if j == 0:
        return float(points[0])
    rise = joules[j] - joules[j - 1]
    frac = (target - joules[j - 1]) / rise if rise > 0 else 1.0
    return float(points[j - 1] + frac * (points[j] - points[j - 1]))
