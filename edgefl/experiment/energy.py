"""A synchronous round's shared server links, batteries and joules, for both round paths.

Before the round is played: every selected client's transfers share the server's links
(edgefl.sim.links.shared_round); with batteries (`energy.batteries`), a client whose charge cannot
pay for its own work this round (its joules without waiting, edgefl.sim.energy) is dropped: it does
nothing (its phases and traffic are zero, it sends no update), and the others share the links
without it. After the round: each client's joules (0 for a dropped one) and the batteries drain.
A battery emptied by the round's waiting leaves its device offline from the next round
(edgefl.sim.battery). The bulk path prices joules as columns (FleetPower.energy), the per-client
path client by client (client_energy); both equal to the bit (tests/test_energy.py).
"""

from __future__ import annotations

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
        self.pool, self.communication = pool, s.cost.communication
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

    def before(self, s: States, plan: RoundPlan, costs: Costs,
               share: bool = True) -> tuple[Costs, np.ndarray]:
        """The round's costs on the shared links (`share`: a synchronous round's, worked out in
        advance), and which clients are dropped (bool)."""
        dropped = np.zeros(len(s.clients), dtype=bool)
        costs = self._shared(s, plan, costs, ~dropped) if share else costs
        if self.battery is not None and self.power is not None:
            need = self.power.energy(s, costs, *self.sent(plan), np.zeros(len(s.clients)))
            dropped = ~self.battery.covers(s.clients, need)
            if dropped.any():
                zeroed = {k: np.where(dropped, 0.0, getattr(costs, k)) for k in WORK}
                kept = replace(costs, swapped=costs.swapped & ~dropped, **zeroed)
                costs = self._shared(s, plan, kept, ~dropped) if share else kept
        return costs, dropped

    def _shared(self, s: States, plan: RoundPlan, c: Costs, live: np.ndarray) -> Costs:
        """Transfers of the `live` clients on the shared links (the others send nothing)."""
        if self.links.unlimited or not self.communication:
            return c
        down, up = self.sent(plan)
        phases = (c.download_s[live], c.data_access_s[live], c.compute_s[live], c.upload_s[live])
        d, u = shared_round(self.links, phases, (down[live], up[live]),
                            (s.down_bps[live], s.up_bps[live]), s.latency_s[live])
        return replace(c, download_s=_put(c.download_s, live, d), upload_s=_put(c.upload_s, live, u))

    def transfers(self, s: States, plan: RoundPlan, rows: list[int]) -> tuple[Links, list[Transfer]] | None:
        """The server's links and the transfers of the round's clients `rows`, for a living round's
        SimPy processes (edgefl.sim.living); None where the links are unlimited or not counted."""
        if self.links.unlimited or not self.communication:
            return None
        down, up = self.sent(plan)
        return self.links, [Transfer(float(down[i]), float(up[i]), float(s.down_bps[i]), float(s.up_bps[i]),
                                     float(s.latency_s[i])) for i in rows]

    def bulk(self, s: States, plan: RoundPlan, costs: Costs, wait_s: np.ndarray,
             dropped: np.ndarray) -> np.ndarray | None:
        """The round's joules per client (columns), batteries drained; None without energy."""
        if self.power is None:
            return None
        return self._drain(s, np.where(dropped, 0.0, self.power.energy(s, costs, *self.sent(plan), wait_s)))

    def each(self, s: States, states: list[DeviceState], plan: RoundPlan, costs: Costs,
             wait_s: np.ndarray, dropped: np.ndarray) -> np.ndarray | None:
        """The same, client by client (the reference)."""
        if self.power is None:
            return None
        down, up = self.sent(plan)
        joules = [0.0 if dropped[i] else client_energy(self.pool, st, costs.cost(i), (down[i], up[i]),
                                                       float(wait_s[i])) for i, st in enumerate(states)]
        return self._drain(s, np.array(joules))

    def _drain(self, s: States, joules: np.ndarray) -> np.ndarray:
        if self.battery is not None:
            self.battery.drain(s.clients, joules)
        return joules

    def living(self, s: States, plan: RoundPlan, costs: Costs, elapsed: np.ndarray, wait_s: np.ndarray,
               dropped: np.ndarray) -> np.ndarray | None:
        """A living fleet's joules per client for the work each did in its `elapsed` seconds (its
        stop less its start; edgefl.sim.living) and its waiting, batteries drained; None without
        energy."""
        if self.power is None:
            return None
        done, down_share, up_share = worked(costs, elapsed)
        down, up = self.sent(plan)
        joules = self.power.energy(s, done, down * down_share, up * up_share, wait_s)
        return self._drain(s, np.where(dropped, 0.0, joules))

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


def _put(column: np.ndarray, rows: np.ndarray, values: np.ndarray) -> np.ndarray:
    out = column.copy()
    out[rows] = values
    return out
