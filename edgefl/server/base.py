"""The server rule interface: fold a round's updates into the next global model.

A rule is a small class registered in `RULES`: `combine(round_, current, updates)` returns the new
global state from the current one and the round's `Updates` (each client's state, sample count and
loss), a pure function of them and of what the rule keeps across rounds (an optimizer's moments),
which it names in `state_attrs` so that a checkpoint keeps it with the method's own state. Its knobs
are a section of its own (edgefl.config.knob_section), read once when the rule is made.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import nn

from edgefl.config import Scenario
from edgefl.registry import Registry

State = dict[str, torch.Tensor]


@dataclass(frozen=True)
class Updates:
    """A round's client updates as the server sees them, in arrival order."""

    states: list[State]  # each client's model state
    samples: list[int]  # each client's training samples
    losses: list[float]  # each client's reported local loss


class ServerRule(ABC):
    """How the server turns a round's updates into the next global state."""

    state_attrs: ClassVar[tuple[str, ...]] = ()  # attributes that change during a run (checkpointed)

    def __init__(self, s: Scenario, model: nn.Module) -> None:  # noqa: B027
        """Read the rule's knobs from `s`, and what it needs of the global `model`'s layout."""

    def scored_iterations(self, batch: int, samples: int) -> int:
        """How many of its last local iterations (batch `batch`, `samples` samples) a client's
        reported loss averages (0: all), for a rule that weighs clients by their losses."""
        return 0

    @abstractmethod
    def combine(self, round_: int, current: State, updates: Updates) -> State:
        """The new global state from the `current` one and round `round_`'s `updates`."""


RULES: Registry[type[ServerRule]] = Registry("server rule")


def bn_keys(model: nn.Module) -> set[str]:
    """State-dict keys that belong to BatchNorm layers (weights, biases, running statistics)."""
    return {f"{name}.{key}" if name else key
            for name, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
            for key in m.state_dict()}


def param_keys(model: nn.Module) -> list[str]:
    """State-dict keys of the model's trainable parameters (not its buffers), in model order."""
    return [name for name, _ in model.named_parameters()]
