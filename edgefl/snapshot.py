"""A method's state as plain data: what a checkpoint holds and what a Ray worker receives.

Plain data is tensors (on the CPU), numbers, strings, None, and lists, tuples and dicts of them,
so `torch.load(..., weights_only=True)` reads it back without unpickling any object.
Modules become their state dict, dataclasses a dict of their fields, sets a sorted list.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import nn


def plain(value: Any) -> Any:
    """`value` as plain data."""
    if isinstance(value, nn.Module):
        return plain(value.state_dict())
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, set | frozenset):
        return sorted(value)
    return value


def restore(current: Any, saved: Any, device: torch.device) -> Any:
    """The live value for `saved`, shaped like `current` (modules are loaded in place)."""
    if isinstance(current, nn.Module):
        current.load_state_dict(saved)
        return current
    if dataclasses.is_dataclass(current) and not isinstance(current, type):
        return type(current)(**{k: restore(getattr(current, k), v, device) for k, v in saved.items()})
    if isinstance(current, set | frozenset):
        return type(current)(saved)
    if isinstance(saved, torch.Tensor):
        return saved.to(device)
    if isinstance(saved, dict):
        return {k: restore(None, v, device) for k, v in saved.items()}
    if isinstance(saved, list | tuple):
        return type(saved)(restore(None, v, device) for v in saved)
    return saved
