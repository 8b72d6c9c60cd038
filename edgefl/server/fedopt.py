"""The server optimizer of Reddi et al., "Adaptive Federated Optimization" (ICLR 2021, Alg. 2):
the server treats the clients' weighted mean update Delta = sum_n s_n (w_n - x) / sum_n s_n as a
pseudo-gradient and steps x with it; buffers (BatchNorm statistics) are averaged as FedAvg does.

* sgd (FedAvg at server lr eta): x += eta Delta
* momentum (FedAvgM, Hsu et al. 2019): m = beta1 m + Delta; x += eta m
* adagrad | adam | yogi (Alg. 2): m = beta1 m + (1 - beta1) Delta and
    adagrad  v = v + Delta^2
    adam     v = beta2 v + (1 - beta2) Delta^2
    yogi     v = v - (1 - beta2) Delta^2 sign(v - Delta^2)
  then x += eta m / (sqrt(v) + tau), from m = 0 and v = tau^2 (Alg. 2: v_{-1} >= tau^2), with no
  bias correction (Alg. 2 has none).

`Stepped` is the rule these make; the registered ones (fedavgm, fedadam, fedyogi, fedadagrad, one
small file each) own their knobs, and GMA (edgefl.server.gma) masks the same step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch
from torch import nn

from edgefl.config import Check, Knobs, Scenario
from edgefl.server.base import ServerRule, State, Updates, param_keys
from edgefl.server.mean import fedavg

Moments = dict[str, torch.Tensor]  # "m" (momentum, adaptive) and "v" (adaptive) of one parameter
ADAPTIVE = ("adagrad", "adam", "yogi")
SERVER_OPTS = ("sgd", "momentum", *ADAPTIVE)


@dataclass(frozen=True)
class ServerOpt:
    """One server optimizer: its kind (SERVER_OPTS), lr eta, beta1, beta2 and tau."""

    kind: str
    lr: float
    beta1: float = 0.9
    beta2: float = 0.99
    tau: float = 1e-3


def second_moment(kind: str, v: torch.Tensor, g: torch.Tensor, beta2: float) -> torch.Tensor:
    """v_t of FedAdagrad, FedAdam or FedYogi from v_{t-1} and the pseudo-gradient g (Alg. 2)."""
    g2 = g * g
    if kind == "adagrad":
        return v + g2
    if kind == "yogi":
        return v - (1 - beta2) * g2 * torch.sign(v - g2)
    return beta2 * v + (1 - beta2) * g2


def server_direction(delta: torch.Tensor, moments: Moments, opt: ServerOpt) -> tuple[torch.Tensor, Moments]:
    """The direction d (x_t = x_{t-1} + eta d) for the pseudo-gradient `delta`, and the new moments
    (`moments` empty: the first round's m = 0, v = tau^2)."""
    if opt.kind == "sgd":
        return delta, {}
    m = moments.get("m", torch.zeros_like(delta))
    if opt.kind == "momentum":
        m = opt.beta1 * m + delta
        return m, {"m": m}
    if opt.kind not in ADAPTIVE:
        raise ValueError(f"unknown server optimizer {opt.kind!r}; one of {SERVER_OPTS}")
    m = opt.beta1 * m + (1 - opt.beta1) * delta
    v = second_moment(opt.kind, moments.get("v", torch.full_like(delta, opt.tau**2)), delta, opt.beta2)
    return m / (v.sqrt() + opt.tau), {"m": m, "v": v}


def server_step(x: torch.Tensor, delta: torch.Tensor, moments: Moments, opt: ServerOpt,
                scale: torch.Tensor | float = 1.0) -> tuple[torch.Tensor, Moments]:
    """x_t = x_{t-1} + eta scale d and the new moments (see `server_direction`); `scale` is a
    factor per coordinate (GMA's mask), 1 for Reddi et al.'s optimizers."""
    direction, moments = server_direction(delta, moments, opt)
    return x + opt.lr * scale * direction, moments


class OptKnobs(Knobs):
    """A knob section that gives a server optimizer."""

    def server_opt(self) -> ServerOpt:
        raise NotImplementedError


@dataclass
class FedOptConfig(OptKnobs):
    """The knobs every FedOpt rule has; a rule's section sets `kind` and its defaults."""

    kind: ClassVar[str]
    server_lr: float = 0.01  # the server learning rate eta: x += eta m / (sqrt(v) + tau)
    beta1: float = 0.9  # the first moment's decay: m = beta1 m + (1 - beta1) Delta (Reddi et al. §5: 0.9)
    tau: float = 1e-3  # the degree of adaptivity: x += eta m / (sqrt(v) + tau), v from tau^2; the
    # smaller, the more adaptive (Reddi et al. §5: 1e-3)

    def checks(self) -> list[Check]:
        return [
            ("server_lr", self.server_lr > 0, "must be positive"),
            ("beta1", 0 <= self.beta1 < 1, "must be in [0, 1)"),
            ("tau", self.tau > 0, "must be positive"),
        ]

    def server_opt(self) -> ServerOpt:
        return ServerOpt(self.kind, self.server_lr, self.beta1, tau=self.tau)


@dataclass
class DecayedConfig(FedOptConfig):
    """FedAdam's and FedYogi's knobs: FedOptConfig and beta2, the second moment's decay."""

    beta2: float = 0.99  # the second moment's decay: FedAdam's v = beta2 v + (1 - beta2) Delta^2, FedYogi's
    # v -= (1 - beta2) Delta^2 sign(v - Delta^2) (Reddi et al. §5: 0.99)

    def checks(self) -> list[Check]:
        return [*super().checks(), ("beta2", 0 <= self.beta2 < 1, "must be in [0, 1)")]

    def server_opt(self) -> ServerOpt:
        return replace(super().server_opt(), beta2=self.beta2)


class Stepped(ServerRule):
    """The server optimizer of the section `knobs` on each parameter's weighted mean update;
    buffers (BatchNorm statistics) are the plain average. `moments` (per parameter) is checkpointed."""

    state_attrs = ("moments",)
    knobs: ClassVar[type[OptKnobs]]

    def __init__(self, s: Scenario, model: nn.Module) -> None:
        super().__init__(s, model)
        self.opt = s.knobs(self.knobs).server_opt()
        self.params = param_keys(model)
        self.moments: dict[str, Moments] = {}

    def scale(self, deltas: list[torch.Tensor]) -> torch.Tensor | float:
        """A factor on each coordinate's step, from the clients' updates (1: none; GMA's mask)."""
        return 1.0

    def combine(self, round_: int, current: State, updates: Updates) -> State:
        params = set(self.params)  # stepped below; the buffers take the plain average
        new = fedavg([{k: v for k, v in s.items() if k not in params} for s in updates.states],
                     updates.samples)
        for name in self.params:
            deltas = [state[name] - current[name] for state in updates.states]
            delta = fedavg([{name: d} for d in deltas], updates.samples)[name]
            new[name], self.moments[name] = server_step(current[name], delta, self.moments.get(name, {}),
                                                        self.opt, self.scale(deltas))
        return {k: new[k] for k in current}  # in the model's order
