"""The attack interface and registry. Inputs live in [0, 1]; models normalise inside.

Attacks draw their random starts with `uniform_like` and `normal_like`: from torch's global
generator (seeded per client by one-by-one training), or under `client_streams` (grouped
training, edgefl.training.grouped) client g's rows of a client-major batch from client g's own
generator, which is what that client's global generator would have drawn one by one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch import nn

from edgefl.registry import Registry

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (model output, target) -> scalar


class Attack(ABC):
    """Crafts adversarial inputs that raise `loss` (cross-entropy unless given) within an eps ball."""

    # Whether it attacks a client-major stack of clients' batches as each client's own (grouped
    # training, edgefl.training.grouped): every row on its own, the loss's gradient used up to a
    # positive per-client scale (its sign, or normalised per row), random draws through
    # uniform_like / normal_like.
    groupable = True
    trains = True  # usable as the training attack (AutoAttack is an evaluation attack only)

    def __init__(self, eps: float = 8 / 255, step_size: float = 2 / 255, steps: int = 10,
                 loss: Loss = nn.functional.cross_entropy) -> None:
        self.eps = eps
        self.step_size = step_size
        self.steps = steps
        self.loss = loss

    def __call__(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Adversarial x for `model`, crafted with the model in eval mode (BN statistics fixed) and
        its parameters frozen: an attack takes gradients with respect to inputs only, so autograd
        records no parameter edges (and grouped training folds BatchNorm into constant weights).
        Not for a model another thread trains meanwhile (its backward would find them frozen)."""
        was_training = model.training
        trained = [p for p in model.parameters() if p.requires_grad]
        model.eval()
        for p in trained:
            p.requires_grad_(False)
        try:
            return self.perturb(model, x, y).detach()
        finally:
            for p in trained:
                p.requires_grad_(True)
            model.train(was_training)

    @property
    def gradient_steps(self) -> int:
        """Forward and input-gradient pass pairs per batch: what the cost model charges as the
        attack's steps."""
        return self.steps

    @abstractmethod
    def perturb(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...


ATTACKS: Registry[type[Attack]] = Registry("attack", "edgefl.attacks")


def make_attack(name: str, eps: float, step_size: float, steps: int) -> Attack:
    return ATTACKS.get(name)(eps=eps, step_size=step_size, steps=steps)


def input_gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
                   loss: Loss = nn.functional.cross_entropy) -> torch.Tensor:
    """d loss(model(x), y) / d x."""
    x = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(loss(model(x), y), x)
    return grad


_STREAMS: ContextVar[tuple[torch.Generator, ...]] = ContextVar("client_streams", default=())


@contextmanager
def client_streams(gens: Sequence[torch.Generator]) -> Iterator[None]:
    """Within: `uniform_like` and `normal_like` fill the g-th of len(gens) equal row blocks of a
    client-major tensor from gens[g]."""
    token = _STREAMS.set(tuple(gens))
    try:
        yield
    finally:
        _STREAMS.reset(token)


def uniform_like(x: torch.Tensor, low: float = 0.0, high: float = 1.0) -> torch.Tensor:
    """`torch.empty_like(x).uniform_(low, high)`, per client under `client_streams`."""
    return _fill(_like(x), lambda rows, gen: rows.uniform_(low, high, generator=gen))


def normal_like(x: torch.Tensor) -> torch.Tensor:
    """`torch.randn_like(x)`, per client under `client_streams`."""
    return _fill(_like(x), lambda rows, gen: rows.normal_(generator=gen))


def _like(x: torch.Tensor) -> torch.Tensor:
    """An empty tensor of x's shape, dtype and device, contiguous whatever x's memory format: the
    draws fill it in index order, so a channels_last batch gets the same values as its NCHW copy."""
    return torch.empty(x.shape, dtype=x.dtype, device=x.device)


def _fill(out: torch.Tensor, fill: Callable[[torch.Tensor, torch.Generator | None], object]) -> torch.Tensor:
    gens = _STREAMS.get()
    if not gens:
        fill(out, None)
        return out
    for rows, gen in zip(out.chunk(len(gens)), gens, strict=True):
        fill(rows, gen)
    return out
