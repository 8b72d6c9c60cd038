"""The fixed costs outside the operators (issue 36), measured on this host for its profile.

The compute model (edgefl.sim.compute) charges every operator; what a real client-round runs
beside them is charged as three fixed costs: per local iteration (Python, the batch gather, the
optimizer's loop), per PGD step (the attack loop), and per client-round (a fresh copy of the model,
its state kept, the optimizer made). Each is measured on a model so small that its operators cost
almost nothing: edgefl's own local training loop (edgefl.training.local.train_local) timed with 0
and with STEPS PGD steps, less what the fitted rooflines charge for the same iterations, and a
client-round's set-up timed alone. A negative remainder (the rooflines already charge more) is 0.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from edgefl.attacks.pgd import PGD
from edgefl.models.base import AtomModel, Normalize
from edgefl.profiling import profile_model
from edgefl.sim.compute import Iteration, Rooflines, iteration_seconds, layers_of
from edgefl.training.local import seed_everything, train_local

SHAPE = (1, 4, 4)  # one sample of the tiny model
BATCH, STEPS, ITERS, SAMPLES = 4, 5, 100, 64


@dataclass(frozen=True)
class FixedCosts:
    iteration_us: float
    attack_step_us: float
    round_ms: float


def measure_fixed(roof: Rooflines, median: Callable[[Callable[[], object]], float]) -> FixedCosts:
    """The three fixed costs; `median(fn)` is the calibration's timer (seconds of one call)."""
    fc = nn.Sequential(nn.Flatten(), nn.Linear(16, 2))
    model = AtomModel([("norm", Normalize([0.5], [0.5])), ("fc", fc)], SHAPE)
    layers = layers_of(profile_model(model, "tiny").atoms)
    x, y = torch.rand(SAMPLES, *SHAPE), torch.randint(0, 2, (SAMPLES,))

    def beyond(steps: int) -> float:
        """Measured seconds per iteration less the rooflines' price of it."""
        attack = PGD(steps=steps) if steps else None
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        run = lambda: train_local(model, x, y, optimizer, ITERS, BATCH, attack,  # noqa: E731
                                  torch.Generator().manual_seed(0))
        priced = iteration_seconds(Iteration(layers, BATCH, steps, 1, 0, 1, 2), roof)
        return median(run) / ITERS - priced

    def client_round() -> None:
        seed_everything(0, 0, 0)
        fresh = copy.deepcopy(model)
        start = {k: v.detach().clone() for k, v in fresh.state_dict().items()}
        fresh.load_state_dict(start)
        torch.optim.SGD(fresh.parameters(), lr=0.01, momentum=0.9)
        {k: v.detach().clone() for k, v in fresh.state_dict().items()}  # the update's copy (timed)

    plain = max(beyond(0), 0.0)
    step = max((beyond(STEPS) - plain) / STEPS, 0.0)
    return FixedCosts(plain * 1e6, step * 1e6, median(client_round) * 1e3)
