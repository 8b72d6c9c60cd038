"""The distillation baselines' shared machinery: FedDF-AT and FedET-AT (FedProphet §7.2).

FedProphet §7.2: "each client selects the largest model that can be trained with the available
memory from a group of models ({CNN3, VGG11, VGG13, VGG16} in CIFAR-10, {CNN4, ResNet10, ResNet18,
ResNet34} in Caltech-256)", and the memory-efficient baselines are "supplemented with adversarial
training". Here:

* The family is `distill.family`, largest first; its first member is `model.name`, the large model
  the server keeps and the one evaluated (an empty family is `model.name` alone).
* Each round a client trains the first member whose MemReq, in the scenario's estimator (the one
  the cost model charges, `cost.accounting`), fits its available memory R_k(t); when none fits, the
  member that needs least (it swaps, and the cost model charges the swapping).
* Local training is the scenario's adversarial training on that member, as in FedAvgAT.
* The server averages each member over the clients that trained it (FedAvg, BatchNorm included
  whatever `training.fedbn` says: a client's member changes with its free memory from round to
  round, so it has no BatchNorm of its own to keep), then distils the ensemble of every received
  client model into the members the method names (FedDF: every member, each starting from its
  average, or its previous state when no client trained it; FedET: a server model of its own, see
  edgefl.methods.fedet), on the public split `ctx.public` (labels unused):
  `distill.server_iters` Adam steps at `distill.server_lr` on batches of `distill.server_batch`,
  KL at `distill.temperature` (Lin et al., "Ensemble Distillation for Robust Model Fusion in
  Federated Learning", NeurIPS 2020, Alg. 3). The method picks the target and the loss.
* The distillation uses clean public inputs. FedProphet adds adversarial training to the
  baselines' local training only; FedDF's and FedET's server step stays as published, and an
  adversarial one (PGD on the student at every server step) would multiply the server's work by
  the PGD steps with no source saying how the baselines did it.
* Server time: per distillation step and distilled member, a batch through every teacher's forward
  and the student's forward and training backward, counted as edgefl.sim.workload counts a
  client's passes.
"""

from __future__ import annotations

import copy
import itertools
from abc import abstractmethod
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from edgefl.config import Check, Knobs, Named, Scenario, knob_section
from edgefl.devices.pool import DeviceState
from edgefl.errors import EdgeflError
from edgefl.methods.aggregate import state_bytes
from edgefl.methods.base import ClientModel, ClientPlan, ClientUpdate, Context
from edgefl.methods.fedavg import FedAvgAT
from edgefl.models import MODELS, SCALABLE, AtomModel, build_model
from edgefl.profiling import profile_model
from edgefl.server.base import State
from edgefl.server.mean import fedavg
from edgefl.sim.cost import RoundPlan
from edgefl.sim.records import ModelProfile
from edgefl.sim.workload import Workload, train_pass_flops
from edgefl.training.local import SERVER, device_batches, seed_everything

PUBLIC_SHARE = 5  # a default public split is at most 1/5 of the training set
TargetLoss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (student [B,C], teachers [K,B,C])


@knob_section("distill")
@dataclass
class DistillConfig(Knobs):
    """FedDF / FedET (FedProphet §7.2): clients train family members, the server distils."""

    family: list[str] = field(default_factory=list)  # models, largest first (empty = model.name only);
    #   model.width scales the VGG and ResNet members, the others keep their size
    public_samples: int = 5000  # taken from the training set before the clients' split
    server_iters: int = 128  # the server's distillation steps per round
    server_batch: int = 64  # public samples per distillation step
    server_lr: float = 1e-3  # Adam, as FedDF
    temperature: float = 1.0  # the softmax temperature of teachers and student
    diversity: float = 0.05  # FedET's lambda on the ensemble-diversity term

    def checks(self) -> list[Check]:
        return [
            ("public_samples", self.public_samples >= 1, "must be at least 1"),
            ("server_iters", self.server_iters >= 0, "must be non-negative"),
            ("server_batch", self.server_batch >= 1, "must be at least 1"),
            ("server_lr", self.server_lr > 0, "must be positive"),
            ("temperature", self.temperature > 0, "must be positive"),
            ("diversity", self.diversity >= 0, "must be non-negative"),
        ]

    def named(self) -> list[Named]:
        return [("family", m, MODELS.names()) for m in self.family]


def family_names(s: Scenario, where: str) -> list[str]:
    """`distill.family` (or `model.name` alone), checked to start with `model.name`."""
    names = s.knobs(DistillConfig).family or [s.model.name]
    if names[0] != s.model.name:
        raise EdgeflError(where, "distill.family",
                          f"the first (largest) member is the evaluated model and must be model.name "
                          f"({s.model.name!r}), got {names[0]!r}; list {s.model.name!r} first")
    if len(set(names)) < len(names):
        raise EdgeflError(where, "distill.family", "names a model twice; list each member once")
    return names


def build_member(ctx: Context, name: str) -> tuple[AtomModel, ModelProfile]:
    """A family member for the scenario's data, and its profile."""
    d = ctx.data
    try:
        width = ctx.scenario.model.width if name in SCALABLE else 1.0  # a fixed model keeps its size
        model = build_model(name, d.num_classes, d.input_shape, d.mean, d.std, width)
        return model, profile_model(copy.deepcopy(model), name)
    except (RuntimeError, ValueError) as exc:
        raise EdgeflError(ctx.where, "distill.family", f"{name} does not fit "
                          f"{ctx.scenario.data.dataset}'s {d.input_shape} inputs ({exc}); drop it") from None


def choose_member(needs: Sequence[tuple[str, float]], memory: float) -> str:
    """The first (largest) member whose need fits `memory`; if none fits, the one needing least."""
    for name, need in needs:
        if need <= memory:
            return name
    return min(needs, key=lambda item: item[1])[0]


def kl_rows(p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) per row: sum_c p_c (log p_c - log q_c), with 0 log 0 = 0."""
    return (torch.xlogy(p, p) - p * log_q).sum(-1)


def distil(student: nn.Module, teachers: Sequence[nn.Module], x: torch.Tensor, loss: TargetLoss,
           iters: int, batch: int, lr: float, gen: torch.Generator) -> float:
    """`iters` Adam steps of `loss(student(x_b), teachers(x_b))` on batches of `x`; mean loss."""
    if not iters:
        return 0.0
    for t in teachers:
        t.eval()
    student.train()
    optimizer = torch.optim.Adam(student.parameters(), lr=lr)
    total = torch.zeros((), device=x.device)  # read once, at the end, as in train_local
    for xb, _ in device_batches(x, x, batch, iters, gen):
        with torch.no_grad():
            targets = torch.stack([t(xb) for t in teachers])
        value = loss(student(xb), targets)
        optimizer.zero_grad(set_to_none=True)
        value.backward()
        optimizer.step()
        total += value.detach()
    return float(total) / iters


def distill_flops(teachers: Sequence[ModelProfile], student: ModelProfile, iters: int,
                  batch: int) -> float:
    """Server FLOPs of `iters` distillation steps on `batch` samples: every teacher's forward plus
    the student's forward and training backward (edgefl.sim.workload.train_pass_flops)."""
    forwards = sum(a.flops for t in teachers for a in t.atoms)
    return iters * batch * (forwards + train_pass_flops(student.atoms))


def head_keys(model: nn.Module) -> tuple[str, str] | None:
    """The state-dict keys (weight, bias) of the model's last Linear layer, its classifier head
    (Fed-ET's "representation layer"); None when it has no biased Linear layer."""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear) and m.bias is not None]
    return (f"{linears[-1]}.weight", f"{linears[-1]}.bias") if linears else None


class DistillAT(FedAvgAT):
    """Clients train the largest family member that fits; the server distils the ensemble of every
    received client model into `distilled()` members (each starting from its own average).

    Subclasses set the distillation loss `target_loss`, and may keep the evaluated server model
    apart from the copy of the largest member that clients train (`server_apart`) and act before
    and after the distillation (`before_distil`, `after_distil`).
    """

    server_apart = False  # the evaluated model is the largest member's average, not a model of its own
    state_attrs = ("small",)

    @classmethod
    def public_samples(cls, s: Scenario) -> int:
        return s.knobs(DistillConfig).public_samples

    @classmethod
    def fit_defaults(cls, s: Scenario, raw: dict[str, Any], train_samples: int) -> None:
        """`distill.public_samples` (5000, sized for CIFAR-10) becomes at most a fifth of the training
        set (287 of the 1437 digits) unless the user set it (then it is refused later if too large)."""
        if "public_samples" not in raw.get("distill", {}):
            d = s.knobs(DistillConfig)
            d.public_samples = min(d.public_samples, max(1, train_samples // PUBLIC_SHARE))

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        self.names = family_names(ctx.scenario, ctx.where)
        built = {name: build_member(ctx, name) for name in self.names[1:]}
        nets = {name: model for name, (model, _) in built.items()}
        if self.server_apart:
            nets = {self.names[0]: copy.deepcopy(self.model), **nets}
        self.small = nn.ModuleDict(nets).to(ctx.device)
        self.profiles = {self.names[0]: ctx.profile, **{name: p for name, (_, p) in built.items()}}
        self.bytes = {name: state_bytes(self.net(name).state_dict()) for name in self.names}
        self.members: dict[int, str] = {}  # client -> the member it trains this round (`planned`)
        self.check_largest_first()

    def check_largest_first(self) -> None:
        """Each member must need less memory than the one before it (a client trains the first
        that fits: a member after a smaller one would never be trained)."""
        s = self.ctx.scenario
        needs = [(name, self.ctx.cost.memory_need(Workload(
            self.profiles[name].atoms, s.training.batch_size, s.training.local_iters, s.attack.steps,
            self.slots, 0.0, 0.0))) for name in self.names]
        for (big, more), (small, less) in itertools.pairwise(needs):
            if less >= more:
                raise EdgeflError(self.ctx.where, "distill.family", f"must be largest first: {small} needs "
                                  f"{less / 1e6:.2f} MB, not less than {big}'s {more / 1e6:.2f} MB before "
                                  "it; reorder the family or drop one")

    def net(self, name: str) -> nn.Module:
        """The server's copy of the member clients train (the first is the large model, which is
        the evaluated model itself unless `server_apart`)."""
        return self.model if name == self.names[0] and not self.server_apart else self.small[name]

    def distilled(self) -> list[str]:
        """The members the server distils into (FedDF: every one)."""
        return self.names

    def student(self, name: str) -> nn.Module:
        """The server model distilled for member `name` (the evaluated model for the first)."""
        return self.model if name == self.names[0] else self.net(name)

    @abstractmethod
    def target_loss(self, student: torch.Tensor, teachers: torch.Tensor) -> torch.Tensor:
        """The distillation loss of the student's logits [B, C] given the teachers' [K, B, C]."""

    def before_distil(self, updates: list[ClientUpdate]) -> None:
        """What the server does between averaging the members and distilling (nothing here)."""

    def after_distil(self) -> None:
        """What the server does after distilling (nothing here)."""

    # --- planning ---------------------------------------------------------------------------
    def plan(self, round_: int, client: int, state: DeviceState) -> ClientPlan:
        """The plan of the member the client trains."""
        base = super().plan(round_, client, state)
        options = {name: replace(base.workload, atoms=self.profiles[name].atoms,
                                 download_bytes=self.bytes[name], upload_bytes=self.bytes[name])
                   for name in self.names}
        name = choose_member([(n, self.ctx.cost.memory_need(w)) for n, w in options.items()],
                             state.memory_bytes)
        return replace(base, workload=options[name], member=name)

    def plan_round(self, round_: int, clients: np.ndarray,
                   states: Mapping[int, DeviceState]) -> RoundPlan[ClientPlan]:
        """Each client's plan; the round's members are kept for `server_flops`."""
        plans = super().plan_round(round_, clients, states)
        self.members = {k: p.member for k, p in plans.by_client(clients).items()}
        return plans

    def server_flops(self, round_: int, clients: Collection[int] | None = None) -> float:
        """Every distilled member's distillation, with each arriving client's model as a teacher."""
        d = self.ctx.scenario.knobs(DistillConfig)
        teachers = [self.profiles[n] for k, n in self.members.items() if clients is None or k in clients]
        if not teachers:  # no update arrived: nothing is distilled
            return 0.0
        batch = min(d.server_batch, d.public_samples)
        return sum(distill_flops(teachers, self.profiles[n], d.server_iters, batch) for n in self.distilled())

    # --- training ---------------------------------------------------------------------------
    def client_model(self, round_: int, client: int, plan: ClientPlan) -> ClientModel:
        """The planned member (FedAvg of the clients that trained it, BatchNorm included)."""
        return copy.deepcopy(self.net(plan.member)), {"member": plan.member}

    def aggregate(self, round_: int, updates: list[ClientUpdate]) -> None:
        groups: dict[str, list[ClientUpdate]] = {}
        for u in updates:
            groups.setdefault(u.extra["member"], []).append(u)
        for name, group in groups.items():
            self.net(name).load_state_dict(fedavg([u.state for u in group], [u.num_samples for u in group]))
        self.before_distil(updates)
        d, ctx = self.ctx.scenario.knobs(DistillConfig), self.ctx
        x = ctx.data.train_x[torch.from_numpy(ctx.public).to(ctx.device)]
        teachers = [self.loaded(u.extra["member"], u.state) for u in updates]
        for name in self.distilled():
            distil(self.student(name), teachers, x, self.target_loss, d.server_iters, d.server_batch,
                   d.server_lr, seed_everything(ctx.scenario.seed, round_, SERVER))
        self.after_distil()

    def loaded(self, name: str, state: State) -> nn.Module:
        """A frozen copy of member `name` holding a client's `state`."""
        model = copy.deepcopy(self.net(name))
        model.load_state_dict(state)
        return model
