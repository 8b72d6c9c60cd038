"""The method interface: plan a client's round, train it for real, aggregate.

`plan` decides everything about a client's round (what it trains, which attack, at which learning
rate) and returns it as a `ClientPlan`; `train` carries the plan out through one template, the same
for every method: the client's model, its seeded data, the optimizer, `train_local` with the
method's objective and hooks, then what the client uploads. Methods override only the steps that
differ (`client_model`, `local_objective`, `optimizer`, `hooks`, `after_local`).

A method whose clients train copies of the global model (edgefl.methods.fedavg) is a client rule: how
its updates become the next global model is a server rule (edgefl.server), the scenario's
`[server] rule` or the method's own. A named pair (`Pair`) registers a client rule with a server
rule under one method name (`fedyogi_at`: FedAvg-AT's clients, FedYogi's server).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from edgefl.attacks import Attack
from edgefl.config import KNOBS, Scenario
from edgefl.data import ClientSplit, Dataset
from edgefl.devices.pool import DeviceState
from edgefl.errors import EdgeflError
from edgefl.models import AtomModel
from edgefl.registry import Registry
from edgefl.server import RULES, ServerRule
from edgefl.sim.cost import CostModel, RoundPlan, make_cost_model
from edgefl.sim.records import ModelProfile
from edgefl.sim.workload import Workload
from edgefl.snapshot import plain, restore
from edgefl.tomlschema import toml_value
from edgefl.training.local import Hooks, TrainSettings, make_optimizer, seed_everything, train_local
from edgefl.training.objectives import Objective


@dataclass
class Context:
    """What every method gets: the scenario, the data on the training device, the model factory,
    and the scenario's cost model (the one place the accounting is chosen)."""

    scenario: Scenario
    where: str  # the scenario file, for error messages
    data: Dataset
    splits: list[ClientSplit]
    profile: ModelProfile
    new_model: Callable[[], AtomModel]
    device: torch.device
    train_attack: Attack | None
    public: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # server-only samples
    rule: str = "mean"  # the method's own server rule (a named pair's; edgefl.server)
    cost: CostModel = field(init=False)  # from scenario.cost

    def __post_init__(self) -> None:
        self.cost = make_cost_model(self.scenario.cost)

    def client_data(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.splits[client].train).to(self.device)
        return self.data.train_x[idx], self.data.train_y[idx]

    def server_rule(self) -> str:
        """The server rule that folds the updates: the scenario's `[server] rule`, else the method's."""
        return self.scenario.server.rule or self.rule

    def attack_for(self, round_: int) -> Attack | None:
        """No attack during the clean warm-up rounds."""
        return None if round_ < self.scenario.training.warmup_rounds else self.train_attack

    def lr(self, round_: int, start: int = 0) -> float:
        """lr0 x decay^(round - start): the decay restarts at `start` (FedProphet's release
        restarts it for every module)."""
        t = self.scenario.training
        return t.lr * t.lr_decay ** (round_ - start)


ClientModel = tuple[torch.nn.Module, dict[str, Any]]  # a client's model copy, and its update's extras


@dataclass(frozen=True)
class ClientPlan:
    """A client's round as `plan` decided it: what the cost model charges and what `train` runs."""

    workload: Workload  # the cost model's view; `train` runs its iterations at its batch size
    attack: Attack | None  # the local training attack (None: a clean round)
    lr: float  # the local learning rate
    fraction: float = 1.0  # width methods: the sub-model's width r
    member: str = ""  # distillation methods: the family member the client trains
    last: int = 0  # FedProphet: the last module M_k the client trains (from the module in training)


@dataclass
class ClientUpdate:
    client: int
    state: dict[str, torch.Tensor]
    num_samples: int
    loss: float
    extra: dict[str, Any] = field(default_factory=dict)  # method-specific uploads (e.g. a Fisher)
    real_compute_s: float = 0.0  # measured wall time of the local training (the executor sets it)


class Method(ABC):
    """One federated method. `plan` and `train` run per selected client, `aggregate` per round.

    `plan` writes nothing but caches of what it works out from the state (the same answer again):
    what it decides for a client travels in the ClientPlan. `train` reads the method's state and
    the plan and never writes the state: what a client keeps between rounds travels in its
    ClientUpdate and `aggregate` stores it. So clients can train anywhere (a Ray
    worker) from a snapshot of the state and their plan, and a checkpoint of `state_attrs` is the
    whole method (with its server rule's state, `ServerRule.state_attrs`).

    Capabilities are derived from what a class defines, never declared: its clients can train
    together (`groups`) when it defines `train_group`; FedAvgAT's family (edgefl.methods.fedavg)
    derives its own, and whether a server rule folds its updates (`takes_rule`), from the steps a
    class overrides.
    """

    state_attrs: tuple[str, ...] = ()  # attributes that change during a run (each class adds its own)
    ignores: tuple[str, ...] = ()  # scenario keys it does not use: a value other than the default is refused
    modes: tuple[str, ...] = ("sync", "deadline")  # the round modes it runs in (`round.mode`; async
    #   needs updates that are whole models: edgefl.experiment.living rebases stale ones)
    groups = False  # derived: its clients can train together (`group_key`, `train_group`)
    takes_rule = False  # derived: a server rule (`[server] rule`) folds its updates
    server: ServerRule | None = None  # that rule, once made

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.groups = cls.train_group is not Method.train_group

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    @classmethod
    def public_samples(cls, s: Scenario) -> int:
        """Training samples the server keeps apart as its public split (ctx.public); 0: none."""
        return 0

    @classmethod  # noqa: B027
    def fit_defaults(cls, s: Scenario, raw: dict[str, Any], train_samples: int) -> None:
        """Scale the method's knob defaults that a training set of `train_samples` cannot hold; a key
        present in `raw` (the scenario's tables as read) is the user's and stays."""

    def state_slots(self) -> list[tuple[Any, str]]:
        """(holder, attribute) of what changes during a run: `state_attrs` of every class in the
        method's MRO, each once, then its server rule's (checkpoints name each by its attribute)."""
        names = (n for cls in type(self).__mro__ for n in vars(cls).get("state_attrs", ()))
        rule = [(self.server, n) for n in self.server.state_attrs] if self.server else []
        return [(self, n) for n in dict.fromkeys(names)] + rule

    def state(self) -> dict[str, Any]:
        """The method's changing state as plain data (see edgefl.snapshot)."""
        return {name: plain(getattr(holder, name)) for holder, name in self.state_slots()}

    def load_state(self, state: dict[str, Any]) -> None:
        for holder, name in self.state_slots():
            setattr(holder, name, restore(getattr(holder, name), state[name], self.ctx.device))

    def start_round(self, round_: int) -> None:  # noqa: B027
        """Called as round t starts, before its clients are picked (a selection policy may price
        the round's `plan` to pick them): what the server does between rounds."""

    @abstractmethod
    def plan(self, round_: int, client: int, state: DeviceState) -> ClientPlan:
        """What the client runs this round: its workload for the cost model and what `train` needs."""

    # --- the client's round: one template, the steps each method may override ---------------------
    def train(self, round_: int, client: int, plan: ClientPlan) -> ClientUpdate:
        """Real local training of the planned round."""
        gen = seed_everything(self.ctx.scenario.seed, round_, client)
        model, extra = self.client_model(round_, client, plan)
        start = {k: v.detach().clone() for k, v in model.state_dict().items()}
        x, y = self.ctx.client_data(client)
        trained, objective = self.local_objective(model, plan)
        w = plan.workload
        loss = train_local(trained, x, y, self.optimizer(trained, plan), w.iterations, w.batch, plan.attack,
                           gen, objective, self.hooks(round_, client, start),
                           TrainSettings.of(self.ctx.scenario.training), self.scored_iterations(plan, len(x)))
        state = {k: v.detach().clone() for k, v in model.state_dict().items()}
        update = ClientUpdate(client, state, len(x), loss, extra)
        self.after_local(round_, client, model, update, plan)
        return update

    def plan_round(self, round_: int, clients: np.ndarray,
                   states: Mapping[int, DeviceState]) -> RoundPlan[ClientPlan]:
        """The round's plans for its selected `clients` (ascending), whose states are `states`: `plan`
        client by client. The one hook of a round's planning: a method that reads the whole round
        (the slowest client's speed) or keeps what it planned for its own accounting and records
        (`server_flops`, `round_info`; `train` never reads it) overrides it around `super()`, and
        a method may plan in bulk (as FedAvgAT does), equal to this."""
        return grouped([self.plan(round_, k, states[k]) for k in clients.tolist()])
    @abstractmethod
    def client_model(self, round_: int, client: int, plan: ClientPlan) -> ClientModel:
        """A fresh copy of the model the client starts from, and what its update carries beside
        the state (e.g. where a sub-model sits in the global one)."""

    @abstractmethod
    def local_objective(self, model: torch.nn.Module, plan: ClientPlan) -> tuple[torch.nn.Module, Objective]:
        """The part of `model` the optimizer steps, and the loss it is trained on."""

    def optimizer(self, model: torch.nn.Module, plan: ClientPlan) -> torch.optim.Optimizer:
        """The local optimizer on `model`'s parameters (the scenario's, at the plan's lr)."""
        return make_optimizer(list(model.parameters()), self.ctx.scenario.training, plan.lr)

    def scored_iterations(self, plan: ClientPlan, samples: int) -> int:
        """How many of its last local iterations a client's reported loss averages (0: all)."""
        return 0

    def hooks(self, round_: int, client: int, start: dict[str, torch.Tensor]) -> Hooks:
        """Local-training additions for this client (a loss penalty, a gradient correction), given
        the state of the model it starts from."""
        return Hooks()

    def after_local(self, round_: int, client: int, model: torch.nn.Module, update: ClientUpdate,  # noqa: B027
                    plan: ClientPlan) -> None:
        """What the client computes after training and how its upload changes (control variates,
        a Fisher, only the part it trained)."""

    def group_key(self, round_: int, client: int, plan: ClientPlan) -> Hashable | None:
        """Clients of a round with the same key may be trained together by `train_group`
        (edgefl.training.grouped); None (the default): this client trains alone, by `train`."""
        return None

    def train_group(self, round_: int, plans: dict[int, ClientPlan]) -> list[ClientUpdate]:
        """Real local training of clients that share a `group_key`, all at once: the updates
        `train` would give one by one, up to floating-point summation order."""
        raise NotImplementedError(f"{type(self).__name__} trains its clients one by one")

    @abstractmethod
    def aggregate(self, round_: int, updates: list[ClientUpdate]) -> None:
        """Fold the round's updates into the global model."""

    @abstractmethod
    def global_model(self) -> torch.nn.Module:
        """The model evaluated on the test set."""

    def skip(self, round_: int, clients: list[int]) -> None:  # noqa: B027
        """A dry run's round: no training; advance whatever schedule `plan` depends on."""

    def finished(self) -> bool:
        """True once the method has ended before the scenario's last round (FedProphet after its
        last module's stage); the run then stops."""
        return False

    def server_flops(self, round_: int, clients: Collection[int] | None = None) -> float:
        """FLOPs the server spends this round beside averaging (charged at cost.server_gflops), on
        the updates of `clients` (None: every planned client's)."""
        return 0.0

    def round_info(self) -> dict[str, Any]:
        """Per-method state recorded in metrics.csv (e.g. a module index)."""
        return {}


def grouped(plans: Sequence[ClientPlan]) -> RoundPlan[ClientPlan]:
    """Per-client plans as a RoundPlan of the distinct ones."""
    index: dict[ClientPlan, int] = {}
    which = np.array([index.setdefault(p, len(index)) for p in plans], dtype=np.int64)
    return RoundPlan(list(index), which)


METHODS: Registry[Callable[[Context], Method]] = Registry("method", "edgefl.methods")  # a class, a
#   Pair or a factory


@dataclass(frozen=True)
class Pair:
    """A named pair: a client rule (a Method class, or a function of the scenario that picks one,
    as `gma.base` does) whose updates the server rule `rule` folds unless `[server] rule` says
    otherwise. Registered as a method: `METHODS.register("fedyogi_at")(Pair(FedAvgAT, "fedyogi"))`."""

    client: type[Method] | Callable[[Scenario], type[Method]]
    rule: str

    def client_for(self, s: Scenario) -> type[Method]:
        return self.client if isinstance(self.client, type) else self.client(s)

    def __call__(self, ctx: Context) -> Method:
        ctx.rule = self.rule
        return self.client_for(ctx.scenario)(ctx)


def refuse_ignored(s: Scenario, made: Callable[[Context], Method], name: str, where: str) -> None:
    """Stop on a setting method `name` (registered as `made`) would not use: the first of its
    class's `ignores` set off its default, or a server rule it cannot take (or that is unknown)."""
    cls = made.client_for(s) if isinstance(made, Pair) else made
    who = f"{name} on {cls.__name__}" if cls is not made else name
    for key in getattr(cls, "ignores", ()):
        section, _, leaf = key.partition(".")
        value, default = getattr(_section(s, section), leaf), getattr(_section(Scenario(), section), leaf)
        if value != default:
            raise EdgeflError(where, key, f"method {who} ignores it (it would have no effect); leave "
                              f"it at its default {toml_value(default)} or choose another method")
    refuse_rule(s, cls, who, where)


def refuse_rule(s: Scenario, cls: Any, name: str, where: str) -> None:
    """Stop on a `[server] rule` that is unknown, or that method `name` (class `cls`) cannot take."""
    rule = s.server.rule
    if not rule:
        return
    known = RULES.names()
    if rule not in known:
        raise EdgeflError(where, "server.rule", f"unknown {rule!r}; choose one of: {', '.join(known)}")
    if not getattr(cls, "takes_rule", False):
        takers = [m for m in METHODS.names() if method_class(m, s).takes_rule]
        raise EdgeflError(where, "server.rule", f"method {name} folds its updates its own way (its clients "
                          "do not send whole copies of the global model: sub-models, family members or "
                          "modules), so no server rule applies; leave server.rule unset or choose one of: "
                          f"{', '.join(takers)}")


def _section(s: Scenario, name: str) -> Any:
    """The scenario's `[name]`: one of its own sections or a method's knob section."""
    return s.sections[name] if name in KNOBS.classes() else getattr(s, name)


def method_class(name: str, s: Scenario | None = None) -> type[Method]:
    """The class method `name` runs as in scenario `s` (a named pair's client rule; the defaults'
    where `s` is None), for its class-level hooks (`Method` for a plugin's factory)."""
    made = METHODS.get(name)
    if isinstance(made, Pair):
        return made.client_for(s or Scenario())
    return made if isinstance(made, type) and issubclass(made, Method) else Method
