"""The FedAvg family of federated adversarial training: every client trains the whole model.

* `fedavg_at` (FedAvgAT / FAT; Shah et al. §2, Zizzo et al.): local adversarial training, then
  FedAvg of the whole model, BatchNorm included (McMahan et al., Alg. 1).
* `jfat` (FedProphet §7.2): the same with FedBN (Li et al., ICLR 2021) when `training.fedbn`:
  a client keeps its own BN parameters and statistics across rounds and downloads everything
  else (BN only on its first round); the server averages the uploaded BN only for the model it
  evaluates.

A client whose available memory cannot hold the model swaps, and the cost model charges it.
Family members change one thing each by overriding a hook: `hooks` (a loss penalty, a gradient
correction), `after_local` (what a client computes after training), `extra_bytes` (what else is
sent), `iterations` (local work per round) or `combine` (what the server does around the server
rule). The client's round is the Method template (edgefl.methods.base): FedAvgAT gives its model (the
global one with the client's own BN under FedBN) and objective (`training.objective`). The server
rule (edgefl.server: `[server] rule`, else the method's own, FedAvg's mean here) folds the updates.

What a member can do follows from the steps it overrides (`__init_subclass__`): its clients train
together (`groups`) unless it changes the client's round (CLIENT_STEPS), are planned in bulk
(`bulk_plans`) unless it changes planning (PLAN_STEPS), and its updates are whole models, which a
server rule folds and an asynchronous round rebases (`takes_rule`, async in `modes`), unless it
changes the model a client trains or the aggregation (MODEL_STEPS); async also needs nothing computed
after local training (AFTER_STEPS: a stale control variate or Fisher cannot be rebased).

jFAT and FedAvg-AT agree on IID data, as they should; checked on digits (`bench/claims.py iid`):
docs/claims.md.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Hashable, Mapping
from typing import Any

import numpy as np
import torch

from edgefl.devices.pool import DeviceState
from edgefl.methods.aggregate import keep_local, state_bytes
from edgefl.methods.base import METHODS, ClientModel, ClientPlan, ClientUpdate, Context, Method
from edgefl.profiling.layers import why_not_grouped
from edgefl.server import RULES, ServerRule, Updates
from edgefl.server.base import State, bn_keys
from edgefl.sim.cost import RoundPlan
from edgefl.sim.records import mem_req, optimizer_slots
from edgefl.sim.workload import Workload
from edgefl.training.grouped import ClientJob, train_group
from edgefl.training.local import TrainSettings, client_seed
from edgefl.training.objectives import OBJECTIVES, Objective

NOTHING_HELD: State = {}  # a dry run's client's own BN: none (never written to)
GROUP_BYTES = 4 * 2**30  # the most training memory (mem_req) one group of clients may take at once
CLIENT_STEPS = ("train", "client_model", "local_objective", "hooks", "after_local", "optimizer")
PLAN_STEPS = ("plan", "iterations", "extra_bytes", "extra_flops", "kept_bytes")
MODEL_STEPS = ("client_model", "aggregate")
AFTER_STEPS = ("after_local",)
ALL_MODES = ("sync", "deadline", "async")


def overrides(cls: type, steps: tuple[str, ...]) -> bool:
    """Whether `cls` defines any of `steps` otherwise than FedAvgAT."""
    return any(getattr(cls, step) is not getattr(FedAvgAT, step) for step in steps)


@METHODS.register("fedavg_at")
class FedAvgAT(Method):
    fedbn = False
    state_attrs: tuple[str, ...] = ("model", "local_states")
    modes: tuple[str, ...] = ALL_MODES
    groups = bulk_plans = takes_rule = True  # derived for a subclass (`__init_subclass__`)
    server: ServerRule  # made in __init__

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """The subclass's capabilities, from the steps it overrides (the module docstring)."""
        super().__init_subclass__(**kwargs)
        cls.groups = not overrides(cls, CLIENT_STEPS)
        cls.bulk_plans = not overrides(cls, PLAN_STEPS)
        cls.takes_rule = not overrides(cls, MODEL_STEPS)
        cls.modes = ALL_MODES if cls.takes_rule and not overrides(cls, AFTER_STEPS) else ALL_MODES[:2]

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        t = ctx.scenario.training
        self.model = ctx.new_model().to(ctx.device)
        self.server = RULES.get(ctx.server_rule())(ctx.scenario, self.model)
        self.local_keys = bn_keys(self.model) if self.fedbn else set()
        self.local_states: dict[int, State] = {}
        self.model_bytes = state_bytes(self.model.state_dict())  # shapes never change
        self.local_bytes = state_bytes(self.model.state_dict(), self.local_keys)
        self.slots = optimizer_slots(t.optimizer, t.momentum)
        self.objective = OBJECTIVES.get(t.objective)(t.beta)
        self.not_grouped = why_not_grouped(self.model)  # None when the model groups

    # --- hooks ------------------------------------------------------------------------------
    def iterations(self, round_: int, client: int) -> int:
        """Local optimizer steps: `training.local_iters`, or `training.local_epochs` over its data."""
        t = self.ctx.scenario.training
        if not t.local_epochs:
            return t.local_iters
        return epochs_to_iters(t.local_epochs, len(self.ctx.splits[client].train), t.batch_size)

    def extra_bytes(self, client: int) -> tuple[float, float]:
        """(download, upload) bytes sent beside the model."""
        return 0.0, 0.0

    def extra_flops(self, client: int) -> float:
        """One-off FLOPs a client spends per round beside local training."""
        return 0.0

    def combine(self, round_: int, updates: list[ClientUpdate]) -> State:
        """The new global state: the server rule's fold of the round's updates."""
        return self.server.combine(round_, self.model.state_dict(), Updates(
            [u.state for u in updates], [u.num_samples for u in updates], [u.loss for u in updates]))

    def scored_iterations(self, plan: ClientPlan, samples: int) -> int:
        """As the server rule needs a client's loss (SFAT's slack: over its last local epoch)."""
        return self.server.scored_iterations(plan.workload.batch, samples)

    # --- method -----------------------------------------------------------------------------
    def plan(self, round_: int, client: int, state: DeviceState) -> ClientPlan:
        t = self.ctx.scenario.training
        attack = self.ctx.attack_for(round_)
        down, up = self.extra_bytes(client)
        pairs, forwards = (self.objective.train_pairs, self.objective.extra_forwards) if attack else (1, 0)
        return ClientPlan(Workload(
            atoms=self.ctx.profile.atoms, batch=t.batch_size, iterations=self.iterations(round_, client),
            attack_steps=attack.gradient_steps if attack else 0, slots=self.slots,
            download_bytes=self.model_bytes - self.kept_bytes(client) + down,
            upload_bytes=self.model_bytes + up, train_pairs=pairs, extra_forwards=forwards,
            extra_flops=self.extra_flops(client)), attack, self.ctx.lr(round_))

    def plan_round(self, round_: int, clients: np.ndarray,
                   states: Mapping[int, DeviceState]) -> RoundPlan[ClientPlan]:
        """In bulk, unless a subclass plans per client otherwise (`bulk_plans`): clients differ only
        in their local iterations and whether they hold their own BatchNorm (FedBN), so one `plan`
        per distinct pair serves every client that has it."""
        if not self.bulk_plans:
            return super().plan_round(round_, clients, states)
        ks, n, t = clients.tolist(), len(clients), self.ctx.scenario.training
        iters = (np.fromiter((self.iterations(round_, k) for k in ks), np.int64, n) if t.local_epochs
                 else np.zeros(n, dtype=np.int64))
        held = np.fromiter((k in self.local_states for k in ks), np.int64, n) if self.fedbn else 0
        _, first, which = np.unique(2 * iters + held, return_index=True, return_inverse=True)
        plans = [self.plan(round_, ks[i], states[ks[i]]) for i in first]
        return RoundPlan(plans, which.reshape(-1).astype(np.int64))

    def kept_bytes(self, client: int) -> float:
        """What the client already holds locally (FedBN), so it does not download it."""
        return self.local_bytes if client in self.local_states else 0.0

    def start_state(self, client: int) -> State:
        """The model the client starts its round from (with its own BN under FedBN)."""
        state = self.model.state_dict()
        if client in self.local_states:
            return keep_local(state, self.local_states[client], self.local_keys)
        return state

    def client_model(self, round_: int, client: int, plan: ClientPlan) -> ClientModel:
        """The global model, with the client's own BatchNorm under FedBN."""
        model = copy.deepcopy(self.model)
        if client in self.local_states:
            model.load_state_dict(self.start_state(client))
        return model, {}

    def local_objective(self, model: torch.nn.Module, plan: ClientPlan) -> tuple[torch.nn.Module, Objective]:
        """The whole model, on `training.objective`."""
        return model, self.objective

    def group_key(self, round_: int, client: int, plan: ClientPlan) -> Hashable | None:
        """Plain local training (`groups`: no hooks, nothing after it, the scenario's optimizer) of
        a model that groups (edgefl.profiling.layers.why_not_grouped), under an attack that can be
        grouped (`Attack.groupable`), groups clients by their iterations and batch size."""
        if not self.groups or self.not_grouped:
            return None
        if plan.attack is not None and not plan.attack.groupable:
            return None
        w = plan.workload
        return w.iterations, min(w.batch, len(self.ctx.splits[client].train))

    def train_group(self, round_: int, plans: dict[int, ClientPlan]) -> list[ClientUpdate]:
        """The clients together, as many at once as fit GROUP_BYTES of training memory."""
        plan = next(iter(plans.values()))
        work = plan.workload
        size = max(1, int(GROUP_BYTES // mem_req(work.atoms, work.batch, work.slots)))
        clients = list(plans)
        return [u for i in range(0, len(clients), size)
                for u in self.train_together(round_, clients[i:i + size], plan)]

    def train_together(self, round_: int, clients: list[int], plan: ClientPlan) -> list[ClientUpdate]:
        seed, t, work = self.ctx.scenario.seed, self.ctx.scenario.training, plan.workload
        jobs = [ClientJob(self.start_state(k), x, y, client_seed(seed, round_, k),
                          self.scored_iterations(plan, len(x)))
                for k in clients for x, y in [self.ctx.client_data(k)]]
        states, losses = train_group(self.model, jobs, t, plan.lr, work.iterations, work.batch,
                                     plan.attack, self.objective, TrainSettings.of(t))
        return [ClientUpdate(k, state, len(job.x), loss)
                for k, job, state, loss in zip(clients, jobs, states, losses, strict=True)]

    def aggregate(self, round_: int, updates: list[ClientUpdate]) -> None:
        if self.fedbn:
            self.local_states.update({u.client: {k: u.state[k] for k in self.local_keys} for u in updates})
        self.model.load_state_dict(self.combine(round_, updates))

    def skip(self, round_: int, clients: list[int]) -> None:
        """Dry run: the clients now hold their own BN (FedBN), as after a trained round."""
        if self.fedbn:  # one empty state for all (a dry run never reads them; 550,000 dicts were 32 MB)
            self.local_states.update(dict.fromkeys(clients, NOTHING_HELD))

    def global_model(self) -> torch.nn.Module:
        return self.model


@METHODS.register("jfat")
class JFAT(FedAvgAT):
    """FedAvgAT with FedBN when `training.fedbn` (the FedProphet release's default)."""

    def __init__(self, ctx: Context) -> None:
        self.fedbn = ctx.scenario.training.fedbn
        super().__init__(ctx)


def epochs_to_iters(epochs: float, samples: int, batch: int) -> int:
    """Optimizer steps that make `epochs` passes over `samples` (at least one)."""
    return max(1, math.ceil(epochs * samples / batch))
