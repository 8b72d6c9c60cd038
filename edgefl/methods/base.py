"""The method interface: plan a client's round, train it for real, aggregate."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from edgefl.attacks import Attack
from edgefl.config import Scenario
from edgefl.data import ClientSplit, Dataset
from edgefl.devices.pool import DeviceState
from edgefl.models import AtomModel
from edgefl.profiling import ModelProfile
from edgefl.registry import Registry
from edgefl.sim.workload import Workload
from edgefl.snapshot import plain, restore


@dataclass
class Context:
    """What every method gets: the scenario, the data on the training device, the model factory."""

    scenario: Scenario
    where: str  # the scenario file, for error messages
    data: Dataset
    splits: list[ClientSplit]
    profile: ModelProfile
    new_model: Callable[[], AtomModel]
    device: torch.device
    train_attack: Attack | None
    public: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))  # server-only samples

    def client_data(self, client: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(self.splits[client].train).to(self.device)
        return self.data.train_x[idx], self.data.train_y[idx]

    def attack_for(self, round_: int) -> Attack | None:
        """No attack during the clean warm-up rounds."""
        return None if round_ < self.scenario.training.warmup_rounds else self.train_attack

    def lr(self, round_: int, start: int = 0) -> float:
        """lr0 x decay^(round - start): the decay restarts at `start` (FedProphet's release
        restarts it for every module)."""
        t = self.scenario.training
        return t.lr * t.lr_decay ** (round_ - start)


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

    `train` reads the method's state and never writes it: what a client keeps between rounds
    travels in its ClientUpdate and `aggregate` stores it. So clients can train anywhere (a Ray
    worker) from a snapshot of the state, and a checkpoint of `state_attrs` is the whole method.
    """

    state_attrs: tuple[str, ...] = ()  # attributes that change during a run (each class adds its own)
    uses_public = False  # the server needs a public split of the training data (ctx.public)
    ignores: tuple[str, ...] = ()  # scenario keys it does not use: a value other than the default is refused

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def state_names(self) -> list[str]:
        """`state_attrs` of every class in the method's MRO, each once."""
        names = (n for cls in type(self).__mro__ for n in vars(cls).get("state_attrs", ()))
        return list(dict.fromkeys(names))

    def state(self) -> dict[str, Any]:
        """The method's changing state as plain data (see edgefl.snapshot)."""
        return {name: plain(getattr(self, name)) for name in self.state_names()}

    def load_state(self, state: dict[str, Any]) -> None:
        for name in self.state_names():
            setattr(self, name, restore(getattr(self, name), state[name], self.ctx.device))

    def begin_round(self, round_: int, states: dict[int, DeviceState]) -> None:  # noqa: B027
        """Called with every selected client's state before any `plan` of the round."""

    @abstractmethod
    def plan(self, round_: int, client: int, state: DeviceState) -> Workload:
        """What the client runs this round, for the cost model."""

    @abstractmethod
    def train(self, round_: int, client: int, workload: Workload) -> ClientUpdate:
        """Real local training."""

    def group_key(self, round_: int, client: int, workload: Workload) -> Hashable | None:
        """Clients of a round with the same key may be trained together by `train_group`
        (edgefl.execution.grouped); None (the default): this client trains alone, by `train`."""
        return None

    def train_group(self, round_: int, plans: dict[int, Workload]) -> list[ClientUpdate]:
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

    def server_flops(self, round_: int) -> float:
        """FLOPs the server spends this round beside averaging (charged at cost.server_gflops)."""
        return 0.0

    def round_info(self) -> dict[str, Any]:
        """Per-method state recorded in metrics.csv (e.g. a module index)."""
        return {}


METHODS: Registry[Callable[[Context], Method]] = Registry("method")  # a class or a factory
