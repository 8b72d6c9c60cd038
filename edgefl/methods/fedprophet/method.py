"""FedProphet, the server loop (Tang, Wang et al., FedProphet, Alg. 2).

The backbone is partitioned into modules that fit R_min (Alg. 1). Module by module, each round:
the server scales the feature perturbation (APA, Eq. 10), assigns every selected client modules
m..M_k (DMA, Eq. 12-13), the clients run adversarial cascade learning (Eq. 7, 11) and upload only
what they trained, and the server partially averages each module and head over the clients that
trained it (Eq. 14-15; normalised over those clients, as the heads' Eq. 15 is). A module is fixed
when its round budget runs out or validation stalls; its best state is restored, and the clients
measure d* (Eq. 9) for the next module's perturbation. With FedBN (training.fedbn) BatchNorm stays
local to each client, as in jFAT.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from edgefl.attacks import Attack, make_attack
from edgefl.data.datasets import to_float
from edgefl.devices.pool import DeviceState
from edgefl.errors import EdgeflError
from edgefl.methods.aggregate import keep_local, partial_average, state_bytes
from edgefl.methods.base import METHODS, ClientModel, ClientPlan, ClientUpdate, Context, Method
from edgefl.methods.fedprophet.cascade import Cascade, Exit, feature_attack, output_perturbation
from edgefl.methods.fedprophet.coordinator import (
    StageControl,
    accuracy_ratio,
    adjust_alpha,
    assign_modules,
    stage_score,
)
from edgefl.methods.fedprophet.knobs import FedProphetConfig
from edgefl.methods.fedprophet.partition import aux_head, partition_model
from edgefl.server.base import State, bn_keys
from edgefl.sim.cost import RoundPlan
from edgefl.sim.records import optimizer_slots
from edgefl.sim.workload import Workload
from edgefl.training.local import evaluate
from edgefl.training.objectives import Objective

SAMPLES = 43  # the random stream of the server's samples for d* and validation (unlike any other)


def spread_sample(parts: list[np.ndarray], n: int, seed: int) -> np.ndarray:
    """Up to n of the indices in `parts` (the clients' index sets), drawn uniformly without
    replacement from all of them and sorted; the same for the same seed and sets."""
    every = np.concatenate(parts)
    rng = np.random.default_rng([seed, SAMPLES, len(every)])
    return every[np.sort(rng.choice(len(every), size=min(n, len(every)), replace=False))]


class Backbone(nn.Module):
    """The global model and one auxiliary head per module but the last."""

    def __init__(self, model: nn.Sequential, heads: nn.ModuleDict) -> None:
        super().__init__()
        self.model = model
        self.heads = heads


@METHODS.register("fedprophet")
class FedProphet(Method):
    state_attrs = ("net", "local_states", "m", "stage", "alpha", "eps", "d_star", "lower", "prev_ratio",
                   "best", "val", "perf_min", "final", "switch")
    # cascade learning trains each module for `local_iters` PGD-AT steps, as the release does
    ignores = ("training.local_epochs", "training.objective")

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        s = ctx.scenario
        self.cfg = s.knobs(FedProphetConfig)
        self.slots = optimizer_slots(s.training.optimizer, s.training.momentum)
        model = ctx.new_model().to(ctx.device)
        self.need, self.modules = partition_model(ctx.profile, ctx.data.num_classes, s, ctx.where, ctx.cost)
        self.net = Backbone(model, nn.ModuleDict({
            str(mod.index): aux_head(mod.out_shape, ctx.data.num_classes, self.cfg.head_side)
            for mod in self.modules if mod.head is not None}).to(ctx.device))
        self.local_keys = bn_keys(self.net) if s.training.fedbn else set()
        self.sent: dict[tuple[int, int, bool], tuple[int, int]] = {}  # sent_bytes, once per case
        self.local_states: dict[int, State] = {}
        self.m = 0  # the module being trained
        self.stage = stage_control(s.rounds, len(self.modules), self.cfg)
        check_module_rounds(self.cfg.module_rounds, len(self.modules), ctx.where)
        if s.data.val_fraction == 0:
            raise EdgeflError(ctx.where, "data.val_fraction", "is 0, but FedProphet scores each module "
                              "on the clients' validation slices (Eq. 10); give it a fraction above 0")
        self.alpha = self.cfg.alpha
        self.eps = 0.0  # L2 radius on the current module's input features (module > 0)
        self.d_star = 0.0
        self.lower: float | None = None
        self.prev_ratio = 1.0  # C*/A* of the previous module
        self.best: tuple[State, dict[int, State], float, float, float] | None = None
        self.val = (0.0, 0.0)
        self.perf_min = 0.0
        self.assignment: dict[int, int] = {}  # client -> M_k this round (`plan_round`, for round_info)
        self.final = False
        self.switch = False  # module m is fixed; the next round starts module m + 1
        self.dry = False  # a dry run: no data to measure d* on

    # --- planning ---------------------------------------------------------------------------
    def start_round(self, round_: int) -> None:
        """Module m + 1 starts once module m's stage is done (before the round's clients are picked:
        memory_fit prices the new module's workload)."""
        if self.switch:
            self.next_module(round_)

    def plan_round(self, round_: int, clients: np.ndarray,
                   states: Mapping[int, DeviceState]) -> RoundPlan[ClientPlan]:
        """DMA reads the round's slowest client (perf_min); the round's M_k per client is kept for
        `round_info` (max_assigned)."""
        self.perf_min = min(states[k].flops for k in clients.tolist())
        plans = super().plan_round(round_, clients, states)
        self.assignment = {k: p.last for k, p in plans.by_client(clients).items()}
        return plans

    def last_module(self, state: DeviceState) -> int:
        """DMA (Eq. 12-13) for one client."""
        mods, m = self.modules, self.m
        atoms = self.ctx.profile.atoms

        def span(n: int) -> tuple[Any, Any]:
            return atoms[mods[m].start:mods[n].stop], mods[n].head

        def flops(n: int) -> float:
            run, head = span(n)
            return sum(a.flops for a in run) + (head.flops if head else 0.0)

        return assign_modules(m, len(mods), lambda n: self.need(*span(n)) <= state.memory_bytes,
                              flops, state.flops, self.perf_min or state.flops)

    def plan(self, round_: int, client: int, state: DeviceState) -> ClientPlan:
        """Modules m..M_k (DMA) with the head of M_k, against the module's attack, at its lr."""
        last = self.last_module(state)
        first, end = self.modules[self.m], self.modules[last]
        head = [end.head] if end.head else []
        down, up = self.sent_bytes(last, client in self.local_states)
        attack = self.round_attack(round_)
        t = self.ctx.scenario.training
        workload = Workload(
            atoms=(*self.ctx.profile.atoms[first.start:end.stop], *head), batch=t.batch_size,
            iterations=t.local_iters, attack_steps=attack.gradient_steps if attack else 0, slots=self.slots,
            download_bytes=down, upload_bytes=up)
        return ClientPlan(workload, self.client_attack(round_), self.lr(round_), last=last)

    def sent_bytes(self, last: int, holds: bool) -> tuple[int, int]:
        """(download, upload) bytes of a client training modules m..last (one holding its own BatchNorm
        does not download it); tensor shapes never change, so each case is counted once."""
        key = (self.m, last, holds)
        if key not in self.sent:
            s, keys = self.net.state_dict(), self.trained_keys(last)
            held = self.local_keys if holds else set()
            self.sent[key] = (state_bytes(s, keys - held), state_bytes(s, keys))
        return self.sent[key]

    def trained_keys(self, last: int) -> set[str]:
        """State keys of modules m..last and the head of `last`."""
        names = {n for mod in self.modules[self.m:last + 1] for n in mod.names}
        return {k for k in self.net.state_dict()
                if (k.startswith("model.") and k.split(".")[1] in names)
                or k.startswith(f"heads.{last}.")}

    # --- client training --------------------------------------------------------------------
    def client_model(self, round_: int, client: int, plan: ClientPlan) -> ClientModel:
        """The backbone and heads, with the client's own BatchNorm under FedBN."""
        net = copy.deepcopy(self.net)
        if client in self.local_states:
            net.load_state_dict(keep_local(net.state_dict(), self.local_states[client], self.local_keys))
        return net, {}

    def local_objective(self, model: nn.Module, plan: ClientPlan) -> tuple[nn.Module, Objective]:
        """Modules m..M_k with the head of M_k, by cascade learning on the fixed prefix's features."""
        prefix, exit_ = self.split(cast(Backbone, model), self.m, plan.last)
        return exit_, Cascade(prefix, self.cfg.mu)

    def after_local(self, round_: int, client: int, model: nn.Module, update: ClientUpdate,
                    plan: ClientPlan) -> None:
        """Upload only what was trained; the client keeps its BatchNorm (FedBN)."""
        state = update.state
        update.state = {k: state[k] for k in self.trained_keys(plan.last)}
        update.extra["local"] = {k: state[k] for k in self.local_keys}

    def lr(self, round_: int) -> float:
        """The release's schedule: lr0 x decay^(round - module start) x stage_lr_decay^m."""
        return self.ctx.lr(round_, self.stage.started) * self.cfg.stage_lr_decay**self.m

    def split(self, net: Backbone, m: int, last: int) -> tuple[nn.Sequential, Exit]:
        """(fixed prefix before module m, modules m..last with the head of `last`)."""
        atoms = list(net.model.children())
        first, end = self.modules[m], self.modules[last]
        head = net.heads[str(last)] if end.head is not None else nn.Identity()
        return nn.Sequential(*atoms[:first.start]), Exit(nn.Sequential(*atoms[first.start:end.stop]), head)

    def round_attack(self, round_: int) -> Attack | None:
        """The scenario's attack, none in the module's clean warm-up (the release's per-stage
        adv_warmup) or the scenario's global one."""
        return None if self.stage.warming(round_) else self.ctx.attack_for(round_)

    def client_attack(self, round_: int) -> Attack | None:
        attack = self.round_attack(round_)
        if attack is None or self.m == 0:
            return attack
        return feature_attack(self.eps, attack.steps, self.lower)

    # --- server -----------------------------------------------------------------------------
    def aggregate(self, round_: int, updates: list[ClientUpdate]) -> None:
        for u in updates:
            if u.extra["local"]:
                self.local_states.setdefault(u.client, {}).update(u.extra["local"])
        new = partial_average(self.net.state_dict(), [u.state for u in updates],
                              [u.num_samples for u in updates])
        self.net.load_state_dict(new)
        self.val = self.validate()
        if self.stage.record(round_, stage_score(*self.val, self.prev_ratio), accuracy_ratio(*self.val)):
            self.best = (copy.deepcopy(self.net.state_dict()), copy.deepcopy(self.local_states), *self.val,
                         self.alpha)
        if self.m > 0 and self.stage.apa_due(round_):
            self.alpha = adjust_alpha(self.alpha, self.stage.recent_ratio(), self.prev_ratio, self.cfg.delta,
                                      self.cfg.alpha_step, self.cfg.alpha)
            self.eps = self.alpha * self.d_star
        self.end_stage(round_, self.stage.done(round_))
        if self.final or self.switch:
            self.restore_best()

    def skip(self, round_: int, clients: list[int]) -> None:
        """Dry run: a fixed schedule, module m + 1 after fedprophet.module_rounds[m] rounds, or
        after the budget ceil(rounds / M) when that is empty (d* is not measured: it needs data)."""
        if self.local_keys:
            self.local_states.update({k: {} for k in clients})
        self.dry = True
        budget = self.cfg.module_rounds[self.m] if self.cfg.module_rounds else None
        self.end_stage(round_, self.stage.done(round_, budget))

    def end_stage(self, round_: int, done: bool) -> None:
        """After `round_`: the run is over when its rounds are, or when the last module's stage is
        done (the release stops there: federated_main.py:410-413); otherwise a done stage moves on
        to the next module."""
        self.final = round_ + 1 == self.ctx.scenario.rounds or (done and self.m + 1 == len(self.modules))
        self.switch = done and not self.final

    def finished(self) -> bool:
        return self.final

    def restore_best(self) -> None:
        """Back to the module's best scored state and its alpha (the last ones when no round was
        scored): d* of the next module is measured at that alpha, as the release."""
        if self.best is not None:
            state, local, clean, adv, alpha = self.best
            self.net.load_state_dict(state)
            self.local_states, self.val, self.alpha = local, (clean, adv), alpha
            if self.m > 0:
                self.eps = self.alpha * self.d_star
        self.prev_ratio = accuracy_ratio(*self.val)

    def next_module(self, round_: int) -> None:
        """Fix module m, measure d* on the clients' data (Eq. 9), start module m + 1 at `round_`."""
        if not self.dry:
            prefix, exit_ = self.split(self.net, self.m, self.m)
            x, _ = self.samples([s.train for s in self.ctx.splits], self.cfg.apa_samples)
            self.d_star = output_perturbation(prefix, exit_.stack, x, self.apa_attack())
            with torch.no_grad():
                self.lower = 0.0 if float(exit_.stack(prefix(x)).min()) >= 0 else None
        self.m += 1
        self.alpha = self.cfg.alpha
        self.eps = self.alpha * self.d_star
        self.stage.restart(round_)
        self.best = None
        self.switch = False

    def apa_attack(self) -> Attack:
        """The attack module m was trained against, on its input, at its best alpha. The first
        module's is PGD in the norm it trained in: L2 after `pgd_l2`, else L-inf (the release's). Not
        FGSM, nor CW's loss: d* replaces the loss by ||module(z') - module(z)||^2, whose gradient is
        0 at z' = z but for rounding, so only a random start moves it (FGSM, with none, would step by
        the sign of rounding noise)."""
        a = self.ctx.scenario.attack
        if self.m == 0:
            return make_attack("pgd_l2" if a.name == "pgd_l2" else "pgd", a.eps, a.step_size, a.steps)
        return feature_attack(self.eps, a.steps, self.lower)

    def samples(self, parts: list[np.ndarray], n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Up to n training-set samples drawn uniformly from all the clients' index sets (Eq. 9's
        average over the clients' data; the release measures every client), seeded by the scenario:
        the same draw every time the same sets are sampled."""
        idx = torch.from_numpy(spread_sample(parts, n, self.ctx.scenario.seed)).to(self.ctx.device)
        return to_float(self.ctx.data.train_x[idx]), self.ctx.data.train_y[idx]

    def validate(self) -> tuple[float, float]:
        """Clean and adversarial accuracy of modules 1..m with head m on the clients' validation
        slices (C_m, A_m of Eq. 10), against the evaluation attack (PGD-20, as the release)."""
        x, y = self.samples([s.val for s in self.ctx.splits], self.cfg.val_samples)
        if len(y) == 0:
            return 0.0, 0.0
        a, e = self.ctx.scenario.attack, self.ctx.scenario.evaluation
        attack = make_attack(e.attack, e.eps or a.eps, e.step_size or a.step_size, e.steps)
        return evaluate(self.cascade(self.m), x, y, attack)

    def cascade(self, m: int) -> nn.Module:
        prefix, exit_ = self.split(self.net, 0, m)
        return nn.Sequential(prefix, exit_)

    def global_model(self) -> nn.Module:
        """Modules 1..m with head m while training; the whole backbone once its last module is
        trained. A run whose rounds end before its last module is evaluated on the modules it
        trained, with head m (the release evaluates 1..stage with the stage's head,
        module_scheduler.py:156-166): the later ones never trained."""
        return self.net.model if self.final and self.m + 1 == len(self.modules) else self.cascade(self.m)

    def round_info(self) -> dict[str, Any]:
        """The module trained in the round just aggregated, its perturbation and validation (empty in
        a dry run, which measures neither d* nor accuracy)."""
        measured = not self.dry or self.m == 0
        return {"module": self.m + 1, "modules": len(self.modules),
                "max_assigned": max(self.assignment.values(), default=self.m) + 1,
                "eps": round(self.eps if self.m else self.ctx.scenario.attack.eps, 5) if measured else "",
                "alpha": round(self.alpha, 3),
                "val_clean": "" if self.dry else round(self.val[0], 4),
                "val_adv": "" if self.dry else round(self.val[1], 4)}


def stage_control(rounds: int, modules: int, cfg: FedProphetConfig) -> StageControl:
    """The release's schedule for `modules` modules in `rounds` rounds: a budget of
    ceil(rounds / M) per module, int(grace x budget) unscored rounds after the warm-up and
    int(patience x budget) scored rounds of patience (at least one)."""
    budget = math.ceil(rounds / modules)
    return StageControl(budget, cfg.warmup_rounds, int(cfg.grace * budget),
                        max(1, int(cfg.patience * budget)))


def check_module_rounds(module_rounds: list[int], modules: int, where: str) -> None:
    """fedprophet.module_rounds is empty or gives one count per module."""
    if module_rounds and len(module_rounds) != modules:
        raise EdgeflError(where, "fedprophet.module_rounds",
                          f"gives {len(module_rounds)} round counts but the model has {modules} modules "
                          "at this R_min; give one per module or leave it empty")
