"""FedBuff on a living fleet: an async run's player (edgefl.sim.fedbuff `Buffered`), one
aggregation a row (Nguyen et al., "Federated Learning with Buffered Asynchronous Aggregation",
AISTATS 2022).

In async mode one metrics row is one aggregation. A client is picked when a slot frees (a uniform
draw among the online devices not already working, keyed by (seed, ASYNC, start count): idle_pick),
drawn and planned with the current model version as its round (a client picked twice on one version
draws the same state and data order: both are keyed by (seed, version, client); the likely
uniform picks of the next AHEAD starts are drawn and priced together, `Ahead`), and trains for
real at once, on the version it downloads: its update depends on nothing that happens later, so
training it at its download is training it from that version's copy; a copy of the model it
downloaded is kept until its upload is aggregated. When
the buffer is aggregated, an update of staleness tau > 0 is rebased on the current model before the
method aggregates: x_now + s(tau) (x_client - x_downloaded) (FedBuff's Delta scaled by s(tau), its
server learning rate 1); the method's weighted average of the buffer then gives x_now + sum_i w_i
s(tau_i) Delta_i. A fresh update (tau = 0) is aggregated as it is. Running statistics (BatchNorm's
mean and variance: the model's floating-point buffers) are estimates, not weights that a Delta
moves: they are rebased as x_now + s(tau) (x_client - x_now), a mix of the two estimates. Added to a
Delta, a stale client's variance could go negative (x_now + s (v - x_downloaded) < 0 where its
download held a larger one), and the model's evaluation then gives NaN.

A resumed async run is played again from its start to its checkpoint (`Replay`): the schedule is
seeded, so the same clients start and end at the same moments, with the same batteries, links and
picks, while no client trains and nothing is aggregated; the checkpoint gives what the replay cannot
(the updates and downloads of the clients no aggregation had logged, every earlier client's training
loss, which a selection policy records), then the method's model and the clock go on from there.
Clients mid-flight at the kill thus resume mid-flight, at the pace the shared links give them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from edgefl.devices import draws
from edgefl.devices.pool import DeviceState, States
from edgefl.errors import EdgeflError
from edgefl.executors.executor import Executor
from edgefl.experiment.living import FIRST_LOOK, NEVER_ONLINE, fleet_availability, on_links, phases
from edgefl.experiment.prepare import Experiment
from edgefl.experiment.round_energy import RoundEnergy
from edgefl.experiment.rounds import RoundTable, event_columns, priced, seen_duration
from edgefl.methods.base import ClientPlan, ClientUpdate, Method, grouped
from edgefl.runlog import Columns
from edgefl.scenario import Scenario, check_mode
from edgefl.selection import Picked
from edgefl.selection.server import Selection
from edgefl.server.base import State
from edgefl.sim.availability import Availability
from edgefl.sim.bulk import Pricer
from edgefl.sim.clients import COMPLETED, DROPPED
from edgefl.sim.cost import ClientCost, Costs, RoundPlan
from edgefl.sim.engine import Federation
from edgefl.sim.fedbuff import Buffered, Stalled, Started, staleness_weight, stall_runs
from edgefl.snapshot import plain
from edgefl.training.local import SERVER, seed_everything

ASYNC = 5  # the random stream of async picks (edgefl.devices.pool's streams, then availability's)
AHEAD = 1024  # the starts whose uniform picks an async player prices at once (`Ahead`)


def idle(clients: int, busy: set[int]) -> np.ndarray:
    """Which of the fleet's `clients` devices are not in `busy` (bool)."""
    free = np.ones(clients, dtype=bool)
    free[np.fromiter(busy, np.int64, len(busy))] = False
    return free


IDLE_DRAWS = 1024  # idle_pick's draws with replacement before it looks at every device


def idle_pick(avail: Availability, key: int, clients: int, now: float, busy: set[int]) -> int | float:
    """A device drawn uniformly among those online at `now` and not in `busy`, or, if none is, when
    the first of them comes online. Draw j is index(key(`key`, j), clients) (edgefl.devices.draws):
    the first draw online and idle, of IDLE_DRAWS drawn FIRST_LOOK at a time, is uniform over them,
    and costs a few draws while many are; when IDLE_DRAWS find none, every device is asked and
    draw IDLE_DRAWS picks among those found."""
    for first in range(0, IDLE_DRAWS, FIRST_LOOK):
        drawn = draws.index(draws.keys(key, np.arange(first, first + FIRST_LOOK)), clients)
        free = np.array([k for k in drawn.tolist() if k not in busy], dtype=np.int64)
        found = free[avail.online_many(free, now)]
        if len(found):
            return int(found[0])
    free = np.flatnonzero(idle(clients, busy))
    found = free[avail.online_many(free, now)]
    if len(found):
        return int(found[draws.index(draws.keys(key, np.array([IDLE_DRAWS])), len(found))[0]])
    return min((avail.online_at(k, now) for k in free.tolist()), default=math.inf)


@dataclass
class Pending:
    """An async client's round: its draw, plan, cost, when it started, why it was picked, (training
    for real) its update and the model it downloaded, and, once it ended, its joules and charge."""

    state: DeviceState
    plan: ClientPlan
    cost: ClientCost
    start_s: float
    update: ClientUpdate | None
    downloaded: dict[str, torch.Tensor] | None
    utility: float = math.nan
    reason: str = "uniform"
    serial: int = 0  # its start's number in the run
    loss: float | None = None  # its training loss (None: it did not train, a dry run)
    energy_j: float = math.nan
    charge_j: float = math.nan


@dataclass(frozen=True)
class Ahead:
    """The devices the next AHEAD uniform picks will most likely be (each start's first two draws of
    `idle_pick`), drawn, planned and priced in one round on model `version`: a pick among them is
    its row, to the bit its own one-row round (each row is priced alone), for about a thirtieth of
    its cost (3,000 rows in 42 ms, against 0.39 ms a one-row round)."""

    version: int
    until: int  # the start count the rows foresee up to
    clients: np.ndarray  # ascending
    states: States
    plan: RoundPlan[ClientPlan]
    costs: Costs


@dataclass
class Replay:
    """A resumed run played again up to its checkpoint: the clients started and the aggregations
    folded in by then, each started client's training loss (by its start's number) and, by the same
    number, the update and download of each client that no aggregation had logged."""

    starts: int
    folds: int
    losses: list[float]
    kept: dict[int, tuple[ClientUpdate, State]]

    @classmethod
    def of(cls, saved: dict[str, Any]) -> Replay:
        kept = {int(n): (ClientUpdate(**k["update"]), k["downloaded"]) for n, k in saved["kept"].items()}
        return cls(saved["starts"], saved["folds"], saved["losses"].tolist(), kept)


class AsyncRounds:
    """FedBuff on the experiment: `play(t)` plays on to aggregation t and gives its table,
    its mean loss and each ended client's measured training seconds. A selection policy other than
    uniform picks each client among the devices online and not working (`Selection.pick` of one);
    the server's links are shared by the transfers in flight; a battery that runs out mid-work
    stops its client there (status `offline`)."""

    def __init__(self, exp: Experiment, executor: Executor, fed: Federation, pricer: Pricer,
                 server_s: Callable[[int], float], energy: RoundEnergy, selection: Selection) -> None:
        s = exp.scenario
        check_mode(s, exp.method.modes, exp.where)  # a method made by a factory (sfat's base) is known now
        self.exp, self.executor, self.fed, self.pricer, self.server_s = exp, executor, fed, pricer, server_s
        self.energy, self.selection = energy, selection
        self.statistics = running_statistics(exp.method.ctx.new_model())
        self.avail = fleet_availability(exp, energy)
        self.starts, self.last_end = 0, fed.now
        self.done: list[tuple[RoundTable, float | str, np.ndarray]] = []
        slots = min(s.round.concurrency, s.fleet.clients)  # no more train at once: a slot per client at most
        self.server = Buffered(fed, self.avail, slots, s.round.buffer, s.round.max_staleness,
                               self.pick, self.fold, lambda: server_s(self.server.version), self.heard,
                               energy.sharing, s.rounds)
        self.written = 0  # the aggregation of the last table `play` gave
        self.losses: list[float] = []  # each started client's training loss (a checkpoint's `Replay`)
        self.replay: Replay | None = None
        self.ahead: Ahead | None = None

    def play(self, t: int) -> tuple[RoundTable, float | str, np.ndarray]:
        """Aggregation t (the t-th row: rows and aggregations are counted alike)."""
        while not self.done:
            try:
                self.server.next_aggregation()
            except Stalled as stalled:
                raise stall_error(self.exp.scenario, self.exp.where, stalled) from None
        table, loss, real = self.done.pop(0)
        self.written = table.round
        return table, loss, real

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps for `resume` (`Replay`; the tables of aggregations folded in at
        the same instant as the last one written, by their loss and measured seconds)."""
        kept = {str(job_of(j).serial): kept_update(job_of(j)) for j in self.server.unlogged.values()}
        return {"starts": self.starts, "folds": self.server.version,
                "losses": torch.tensor(self.losses, dtype=torch.float64), "kept": kept,
                "queued": [[loss, torch.from_numpy(real)] for _, loss, real in self.done]}

    def resume(self, first: int, saved: dict[str, Any], where: str) -> None:
        """Play the run again from its start to its checkpoint (`state`), taken after aggregation
        `first` - 1, the file `where`; one that does not arrive where the checkpoint was is another
        run's."""
        try:
            self.replay = replay = Replay.of(saved)
            queued = list(saved["queued"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:  # any damage of its plain data
            raise EdgeflError(where, "player", f"the checkpoint's async state is missing or damaged "
                              f"({type(exc).__name__}); start the run again") from None
        for t in range(first):
            self.play(t)
        if (self.starts, self.server.version, len(self.done)) != (replay.starts, replay.folds, len(queued)):
            raise EdgeflError(where, "--resume", f"played again, the run is at {self.starts:,} "
                              f"clients and {self.server.version} aggregations where its checkpoint was "
                              f"at {replay.starts:,} and {replay.folds}: the checkpoint is another run's; "
                              "start the run again")
        self.done = [(table, loss, real.numpy())
                     for (table, _, _), (loss, real) in zip(self.done, queued, strict=True)]
        self.replay = None

    def choose(self, version: int, busy: set[int]) -> tuple[int, float, str] | float:
        """The client to start on model `version` (with its utility and why), or when one comes
        online: a uniform draw among the online devices not already working (`idle_pick`), or the
        selection policy's pick among them."""
        s, now = self.exp.scenario, self.fed.now
        picked = idle_pick(self.avail, draws.key(s.seed, ASYNC, self.starts), s.fleet.clients, now, busy)
        if isinstance(picked, float):
            return picked
        if not self.selection.logged:
            return picked, math.nan, "uniform"
        free = idle(s.fleet.clients, busy) & self.avail.online_many(np.arange(s.fleet.clients), now)
        p = self.selection.pick(version, free, 1, draw=self.starts)
        return int(p.clients[0]), float(p.utility[0]), p.reason[0]

    def pick(self, version: int, busy: set[int]) -> Started | float:
        """Start a client on model `version`, or say when one comes online."""
        exp, m = self.exp, self.exp.method
        chosen = self.choose(version, busy)
        if not isinstance(chosen, tuple):
            return chosen
        k, utility, reason = chosen
        gathered, plan, costs = self.priced(version, k)
        serial, self.starts = self.starts, self.starts + 1
        cost = costs.cost(0)
        update, downloaded, loss = None, None, None
        if self.replay is not None:  # played again: trained before the kill
            update, downloaded = self.replay.kept.get(serial, (None, None))
            loss = self.replay.losses[serial]
        elif not exp.dry_run:
            downloaded = {n: v.detach().clone() for n, v in start_state(m, k).items()}
            update = self.executor.train(version, {k: plan.plan(0)})[0]
            loss = update.loss
        self.losses.append(math.nan if loss is None else loss)
        state = exp.pool.state_at(gathered, 0)
        pending = Pending(state, plan.plan(0), cost, self.fed.now, update, downloaded, utility, reason,
                          serial, loss)
        transfers = self.energy.transfers(gathered, plan)
        drains = self.energy.drains(gathered, plan, costs, self.fed.now)
        return Started(k, phases(cost), pending, None if transfers is None else transfers.row(0),
                       None if drains is None else drains.row(0))

    def priced(self, version: int, k: int) -> tuple[States, RoundPlan[ClientPlan], Costs]:
        """Client k's one-row round on model `version`: its row of `Ahead` where a uniform pick
        foresaw it."""
        exp, a = self.exp, self.ahead
        if not self.selection.logged and (a is None or a.version != version or self.starts >= a.until):
            a = self.ahead = self.foresee(version)
        row = 0 if a is None else int(np.searchsorted(a.clients, k))
        if a is None or row == len(a.clients) or a.clients[row] != k:
            return priced(exp.pool, exp.method, self.pricer, version, np.array([k], dtype=np.int64))
        state, plan = exp.pool.state_at(a.states, row), a.plan.plan(row)
        return exp.pool.gathered(np.array([k]), [state]), grouped([plan]), Costs.of([a.costs.cost(row)])

    def foresee(self, version: int) -> Ahead:
        """The next AHEAD starts' likely picks, priced on `version`."""
        s, until = self.exp.scenario, self.starts + AHEAD
        drawn = draws.words(draws.key(s.seed, ASYNC), np.arange(self.starts, until), 2)
        clients = np.unique(draws.index(drawn, s.fleet.clients))
        return Ahead(version, until, clients,
                     *priced(self.exp.pool, self.exp.method, self.pricer, version, clients))

    def heard(self, job: Started) -> None:
        """A client ended: its joules drained from its battery, what it showed the selection."""
        p, out = job_of(job), job.outcome
        clients = np.array([job.client], dtype=np.int64)
        states, costs = self.exp.pool.gathered(clients, [p.state]), self.costs([job])
        joules = self.energy.living(states, grouped([p.plan]), costs, np.array([out.stop_s - p.start_s]),
                                    np.zeros(1), np.zeros(1, dtype=bool), out.stop_s)
        p.energy_j, p.charge_j = float(joules[0]), float(self.energy.charge(states)[0])
        uploaded = out.status in (COMPLETED, DROPPED)  # async drops only stale uploads: the loss came
        loss = {} if p.loss is None or not uploaded else {job.client: p.loss}
        seen = seen_duration(np.array([out.stop_s - p.start_s]), np.array([out.status]), costs)
        self.selection.record(job.version, clients, seen, loss)

    def ending(self) -> Columns | None:
        """events.csv's spans, under the last aggregation, of the clients no aggregation logged when
        the run ends: at work (cut at its end, as a round's close cuts its clients: a transfer under
        way on the shared links drawn to the end, Buffered.stop), waiting for the server, or stopped
        since; None if there are none (a client started at the very end has none). Their slots were
        busy: without these spans an async run's time breakdown (edgefl.report.compare) would count
        that time as waiting."""
        jobs = [j for j in self.server.stop() if job_of(j).start_s < self.fed.now]  # none started at the end
        return event_columns(self.table(self.written, jobs)) if jobs else None

    def costs(self, jobs: list[Started]) -> Costs:
        """The jobs' costs with the seconds their transfers took on the shared links."""
        spans = np.array([[j.outcome.download_s, j.outcome.upload_s] for j in jobs]).reshape(-1, 2)
        return on_links(Costs.of([job_of(j).cost for j in jobs]), np.arange(len(jobs)), spans)

    def fold(self, version: int, batch: list[Started], ended: list[Started]) -> None:
        """Aggregate the buffer as model version `version` + 1 and record the window's clients."""
        exp, m = self.exp, self.exp.method
        loss: float | str = ""
        if exp.dry_run or (self.replay is not None and version < self.replay.folds):  # folded before the kill
            m.skip(version, [j.client for j in batch])
        else:
            updates = [rebased(m, j, self.statistics) for j in batch]
            seed_everything(exp.scenario.seed, version, SERVER)
            m.aggregate(version, updates)
            loss = round(sum(u.loss for u in updates) / len(updates), 5)
        self.done.append((self.table(version, ended), loss, measured(ended)))
        self.last_end = self.fed.now

    def table(self, version: int, ended: list[Started]) -> RoundTable:
        pending = [job_of(j) for j in ended]
        clients = np.array([j.client for j in ended], dtype=np.int64)
        states = self.exp.pool.gathered(clients, [p.state for p in pending])
        plan = grouped([p.plan for p in pending])
        n, now, outcomes = len(ended), self.fed.now, [j.outcome for j in ended]
        # the window closes at its aggregation: an async client never waits for it, nor is it dropped
        # for its battery (it runs until empty)
        return RoundTable(version, self.last_end, now, now, self.server_s(version), states, plan,
                          self.costs(ended), np.array([p.start_s for p in pending]),
                          np.array([o.stop_s for o in outcomes]), np.zeros(n),
                          np.array([o.status for o in outcomes], dtype=np.int64),
                          np.array([o.staleness for o in outcomes], dtype=np.int64), np.zeros(n, dtype=bool),
                          np.array([p.energy_j for p in pending]), np.array([p.charge_j for p in pending]),
                          Picked(clients, np.array([p.utility for p in pending]),
                                 [p.reason for p in pending]))


def stall_error(s: Scenario, where: str, stalled: Stalled) -> EdgeflError:
    """Why an async run can make no next aggregation (Stalled), as one line naming the key to change."""
    arrived = stalled.arrived
    if arrived is None:
        return EdgeflError(where, "fleet.availability", NEVER_ONLINE)
    runs = f"{stall_runs(s.round.buffer):,} client runs since the last aggregation"
    if stalled.serving:
        return EdgeflError(where, "cost.server_s", f"{runs} ended while the server still worked on it "
                           f"({arrived:,} uploads waiting): the server cannot keep up with the clients; "
                           "lower cost.server_s or round.concurrency")
    if arrived:
        return EdgeflError(where, "round.buffer", f"only {arrived} of its {s.round.buffer} updates came in "
                           f"{runs} (the rest went offline first); lower round.buffer, or give the devices "
                           "longer online windows (fleet.online_hours) or a charger")
    return EdgeflError(where, "round.mode", f"none of the {runs} brought an update (each went offline first: "
                       "online windows or batteries shorter than the work); give the devices longer online "
                       "windows (fleet.online_hours) or a charger, or use round.mode = \"sync\"")


def kept_update(p: Pending) -> dict[str, Any]:
    """A client's update and download as plain data (a checkpoint's `Replay.kept`)."""
    return {"update": plain(p.update), "downloaded": p.downloaded}


def job_of(job: Started) -> Pending:
    assert isinstance(job.payload, Pending)
    return job.payload


def measured(ended: list[Started]) -> np.ndarray:
    """Each ended client's measured training seconds (NaN in a dry run)."""
    updates = [job_of(j).update for j in ended]
    return np.array([np.nan if u is None else u.real_compute_s for u in updates])


def start_state(m: Method, client: int) -> dict[str, torch.Tensor]:
    """The model a client downloads (the FedAvg family's `start_state`)."""
    get = getattr(m, "start_state", None)
    if get is None:
        raise TypeError(f"{type(m).__name__} has no start_state; it cannot run in async mode")
    state: dict[str, torch.Tensor] = get(client)
    return state


def rebased(m: Method, job: Started, statistics: frozenset[str] = frozenset()) -> ClientUpdate:
    """The job's update as FedBuff applies it now: unchanged if fresh, else `rebase`d on the current
    model (`statistics`: the names of the model's running statistics)."""
    p, tau = job_of(job), job.outcome.staleness
    assert p.update is not None and p.downloaded is not None
    if tau == 0:
        return p.update
    u = p.update
    state = rebase(start_state(m, job.client), p.downloaded, u.state, staleness_weight(tau), statistics)
    return ClientUpdate(u.client, state, u.num_samples, u.loss, u.extra, u.real_compute_s)


def rebase(now: State, downloaded: State, trained: State, s: float, statistics: frozenset[str]) -> State:
    """A stale update on the current model (module docstring): weights now + s (trained -
    downloaded), running statistics now + s (trained - now), integers (batch counters) as trained."""
    def one(name: str, v: torch.Tensor) -> torch.Tensor:
        if not v.is_floating_point():
            return v
        return now[name] + s * (v - (now if name in statistics else downloaded)[name])
    return {name: one(name, v) for name, v in trained.items()}


def running_statistics(model: torch.nn.Module) -> frozenset[str]:
    """The state-dict names of a model's floating-point buffers (BatchNorm's running statistics)."""
    return frozenset(name for name, b in model.named_buffers() if b.is_floating_point())
