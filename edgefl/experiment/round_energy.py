"""A round's shared server links, batteries and joules.

Synchronous rounds (edgefl.experiment.rounds): every selected client's transfers share the server's
links, worked out in advance (edgefl.sim.links.shared_round), and each client's joules are priced
after the round, as columns (FleetPower.energy), equal to the bit to the per-client reference of
the tests (tests/reference.py, tests/test_energy.py).

Batteries make a fleet living (edgefl.experiment.living, edgefl.sim.battery): a round's client whose
charge cannot pay for its own work (its joules without waiting) is dropped at the round's start: it
does nothing (its phases and traffic are zero, it sends no update). Each client's joules are priced
for the work it did before it stopped (`worked`) and drained from its battery; a client's battery
may run out mid-work (`drains`), where a transfer slowed on the shared links, or an unplugging,
costs more than its check priced.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from edgefl.config import MAX_SECONDS, Scenario
from edgefl.devices.pool import DevicePool, States
from edgefl.sim.battery import Battery
from edgefl.sim.clients import Drains, Transfers
from edgefl.sim.cost import Costs, RoundPlan
from edgefl.sim.energy import FleetPower, phase_power, radio_tail
from edgefl.sim.links import Links, shared_round

WORK = ("compute_s", "data_access_s", "download_s", "upload_s", "read_bytes", "write_bytes")


class RoundEnergy:
    """The scenario's server links, the fleet's power figures and (optionally) its batteries."""

    def __init__(self, s: Scenario, pool: DevicePool) -> None:
        self.pool, self.communication = pool, s.cost.counts_communication
        self.links = Links.of_server(s.server, s.fleet.clients)
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
        dropped = ~self.battery.covers(s.clients, self._need(s, plan, costs), costs.busy_s, now)
        zeroed = {k: np.where(dropped, 0.0, getattr(costs, k)) for k in WORK}
        return replace(costs, swapped=costs.swapped & ~dropped, **zeroed), dropped

    def payable_at(self, s: States, plan: RoundPlan, costs: Costs, now: float) -> float:
        """When the first of a round's clients, all dropped at `now` for their batteries, has charged
        enough to pay for its work from its battery alone (inf: none within MAX_SECONDS)."""
        assert self.battery is not None
        return min(self.battery.filled_at(int(k), float(j), now, MAX_SECONDS)
                   for k, j in zip(s.clients, self._need(s, plan, costs), strict=True))

    def _need(self, s: States, plan: RoundPlan, costs: Costs) -> np.ndarray:
        """Each client's joules for its work with its transfers alone, no waiting: what a battery
        must pay for the client to take part."""
        assert self.power is not None
        return self.power.energy(s, costs, *self.sent(plan), np.zeros(len(s.clients)))

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

    def transfers(self, s: States, plan: RoundPlan) -> Transfers | None:
        """The clients' transfers on the server's links (`sharing`), for a living fleet's rounds
        (edgefl.sim.living_round, edgefl.sim.fedbuff); None where the links are not shared."""
        if self.sharing is None:
            return None
        return Transfers(np.column_stack(self.sent(plan)), np.column_stack([s.down_bps, s.up_bps]),
                         np.asarray(s.latency_s, dtype=np.float64))

    def bulk(self, s: States, plan: RoundPlan, costs: Costs, wait_s: np.ndarray) -> np.ndarray:
        """The round's joules per client (columns); NaN without energy."""
        if self.power is None:
            return np.full(len(s.clients), np.nan)
        return self.power.energy(s, costs, *self.sent(plan), wait_s)

    def work_j(self, s: States, plan: RoundPlan, costs: Costs, elapsed: np.ndarray,
               wait_s: np.ndarray) -> np.ndarray:
        """Joules per client for the work each did in its first `elapsed` seconds (worked) and its
        waiting (energy priced); its radio's tails as edgefl.sim.energy `radio_tail` prorates them."""
        assert self.power is not None
        done, down_share, up_share = worked(costs, elapsed)
        down, up = self.sent(plan)
        tails = radio_tail(self.power.of(s), costs, down, up, done, up_share)
        return self.power.energy(s, done, down * down_share, up * up_share, wait_s, tails)

    def living(self, s: States, plan: RoundPlan, costs: Costs, elapsed: np.ndarray, wait_s: np.ndarray,
               dropped: np.ndarray, end_s: np.ndarray | float) -> np.ndarray:
        """A living fleet's joules per client for the work each did in its `elapsed` seconds (its
        stop less its start; edgefl.sim.clients) and its waiting, ended by `end_s`, batteries
        drained: no more than a battery held (one that empties while its client waits for the
        round gives what it had, as does one whose client stopped where its work spent the
        charge, `drains`, up to rounding); NaN without energy."""
        if self.power is None:
            return np.full(len(s.clients), np.nan)
        joules = np.where(dropped, 0.0, self.work_j(s, plan, costs, elapsed, wait_s))
        if self.battery is not None:
            return self.battery.drain(s.clients, joules, end_s)
        return joules

    def drains(self, s: States, plan: RoundPlan, costs: Costs, now: float) -> Drains | None:
        """Each client's battery over its work starting `now` (edgefl.sim.clients `Drain`, which
        stops the client where its work has spent the charge; None: mains powered, or batteries not
        tracked). Unplugged at `now`, a battery holds its charge then and can run out until the
        device is next plugged in; plugged in at `now`, the device runs on its charger until it is
        unplugged, and from then on on its battery, with the charge it has at the unplugging (what
        the work took meanwhile is settled when it drains), so it runs out no sooner than that."""
        battery, power = self.battery, self.power
        if battery is None or power is None:
            return None
        watts, spread, per_byte = phase_power(power.of(s), costs, s.flops / self.pool.kind_flops[s.kind],
                                              *self.sent(plan))
        levels = battery.level(s.clients, now)
        plugged = battery.plugged_many(s.clients, now)
        held, begin, end = levels.copy(), np.zeros(len(levels)), np.full(len(levels), math.inf)
        if plugged.any():
            unplug = battery.unplugged_many(s.clients[plugged], now)
            held[plugged], begin[plugged] = battery.level(s.clients[plugged], unplug), unplug - now
        end[~plugged] = battery.plugged_at_many(s.clients[~plugged], now) - now
        return Drains(~np.isinf(levels), held, np.column_stack(watts), np.column_stack(spread),
                      np.column_stack(per_byte), begin, end)

    def charge(self, s: States) -> np.ndarray:
        """The selected clients' charge left, J (inf: mains powered, or batteries not tracked)."""
        if self.battery is None:
            return np.full(len(s.clients), np.inf)
        return self.battery.charge_j[s.clients].copy()


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
