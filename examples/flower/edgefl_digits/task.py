"""The model, the data and the training: plain PyTorch, as in any Flower app.

The CNN is edgefl's `digits_cnn` (the scenario's `model.name`), so the layers the nodes train are
the layers edgefl prices. The data is scikit-learn's 8x8 digits, split IID over the nodes by
partition-id; training is PGD adversarial training (Madry et al., ICLR 2018): each step trains on
the PGD-`steps` L-inf perturbation of its batch.
"""

from __future__ import annotations

from functools import cache

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn

from edgefl.models import build_model

TEST_SAMPLES = 297  # the last 297 of the 1,797 digits


@cache
def _digits() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = load_digits(return_X_y=True)
    order = np.random.default_rng(0).permutation(len(y))
    return (torch.tensor(x[order] / 16.0, dtype=torch.float32).reshape(-1, 1, 8, 8),
            torch.tensor(y[order], dtype=torch.int64))


def load_data(partition_id: int, num_partitions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Node `partition_id`'s share of the training digits (IID)."""
    x, y = _digits()
    train = np.arange(len(y) - TEST_SAMPLES)
    mine = np.array_split(train, num_partitions)[partition_id]
    return x[mine], y[mine]


def test_data() -> tuple[torch.Tensor, torch.Tensor]:
    x, y = _digits()
    return x[-TEST_SAMPLES:], y[-TEST_SAMPLES:]


def Net() -> nn.Module:  # Flower's templates call the model Net
    x, _ = _digits()
    mean, std = [float(x.mean())], [float(x.std())]
    return build_model("digits_cnn", 10, (1, 8, 8), mean, std)


def pgd(model: nn.Module, x: torch.Tensor, y: torch.Tensor, eps: float, step: float, steps: int,
        gen: torch.Generator) -> torch.Tensor:
    """The PGD-`steps` L-inf adversarial examples of (x, y) within `eps`, pixels in [0, 1], from a
    random start drawn from `gen`."""
    was = model.training
    model.eval()
    start = torch.rand(x.shape, generator=gen) * (2 * eps) - eps
    adv = (x + start).clamp(0, 1)
    for _ in range(steps):
        adv.requires_grad_(True)
        loss = nn.functional.cross_entropy(model(adv), y)
        (grad,) = torch.autograd.grad(loss, adv)
        adv = torch.min(torch.max(adv.detach() + step * grad.sign(), x - eps), x + eps).clamp(0, 1)
    model.train(was)
    return adv.detach()


def train(model: nn.Module, x: torch.Tensor, y: torch.Tensor, iterations: int, batch: int, lr: float,
          eps: float, step: float, steps: int, seed: int) -> float:
    """`iterations` SGD steps on PGD examples of random batches; the mean training loss."""
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model.train()
    total = 0.0
    for _ in range(iterations):
        rows = torch.randint(len(y), (min(batch, len(y)),), generator=gen)
        xb, yb = x[rows], y[rows]
        adv = pgd(model, xb, yb, eps, step, steps, gen) if steps else xb
        loss = nn.functional.cross_entropy(model(adv), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total += loss.item()
    return total / max(iterations, 1)


@torch.no_grad()
def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    return float((model(x).argmax(1) == y).float().mean())


def test(model: nn.Module, eps: float, step: float, steps: int) -> tuple[float, float]:
    """Clean and PGD-`steps` accuracy on the held-out digits."""
    x, y = test_data()
    model.eval()
    adv = pgd(model, x, y, eps, step, steps, torch.Generator().manual_seed(0))
    return _accuracy(model, x, y), _accuracy(model, adv, y)
