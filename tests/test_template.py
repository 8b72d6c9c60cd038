"""One client-training template (edgefl.methods.base `Method.train`) serves every family, so a
method's hooks reach every family's local training: a penalty whose gradient is a known constant
moves every trained parameter by exactly -lr x that constant after one SGD step, in FedAvg, in the
width-reduced sub-models, in the distillation members and in FedProphet's modules alike."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from support import QUICKSTART, ROOT
from torch import nn

from edgefl.experiment import prepare
from edgefl.methods import ClientUpdate
from edgefl.scenario import load_scenario
from edgefl.training.local import Hooks

ONE_STEP = ["rounds=2", "training.local_iters=1", "attack.steps=1", "device=cpu"]
GRAD = 2.0  # d penalty / d w for every parameter element
FAMILIES = [  # (scenario, overrides, what the client trains at 0.5 MB: narrowed?, member)
    (QUICKSTART, ["method=fedavg_at"], False, ""),
    (QUICKSTART, ["method=heterofl_at"], True, ""),
    (QUICKSTART, ["method=feddf_at", 'model.name="smallcnn"', 'distill.family=["smallcnn", "digits_cnn"]',
                  "distill.public_samples=100"], False, "digits_cnn"),
    (ROOT / "scenarios" / "fedprophet-quickstart.toml", [], False, ""),
]


def constant_gradient(seen: list[int]) -> Hooks:
    """GRAD x the sum of every parameter: its gradient is GRAD everywhere."""

    def penalty(model: nn.Module) -> torch.Tensor:
        params = list(model.parameters())
        seen.append(len(params))
        return GRAD * torch.stack([p.sum() for p in params]).sum()

    return Hooks(penalty=penalty)


@pytest.mark.parametrize(("path", "overrides", "narrow", "member"), FAMILIES,
                         ids=["fedavg_at", "heterofl_at", "feddf_at", "fedprophet"])
def test_a_penalty_hook_moves_every_familys_training_alike(path: Path, overrides: list[str], narrow: bool,
                                                          member: str) -> None:
    exp = prepare(load_scenario(path, [*ONE_STEP, *overrides]), str(path))
    state = replace(exp.pool.state(0, 0), memory_bytes=0.5e6)  # a narrow sub-model, a small member
    exp.method.plan_round(0, np.array([0]), {0: state})
    plan = exp.method.plan(0, 0, state)
    assert (plan.fraction < 1, plan.member) == (narrow, member)
    plain = exp.method.train(0, 0, plan)
    seen: list[int] = []
    exp.method.hooks = lambda round_, client, start: constant_gradient(seen)  # type: ignore[method-assign]
    penalised = exp.method.train(0, 0, plan)
    assert seen == [count_params(exp.method.local_objective(exp.method.client_model(0, 0, plan)[0], plan)[0])]
    shifted = moved(plain, penalised)
    # SGD with momentum 0.9 and weight decay: the first step is w - lr (g + wd w), the same g and w
    # in both runs but for the penalty's GRAD, so each trained parameter ends -lr x GRAD apart
    assert shifted.count(pytest.approx(-plan.lr * GRAD, abs=1e-6)) == seen[0] > 0
    assert all(s == pytest.approx(0.0, abs=1e-6) or s == pytest.approx(-plan.lr * GRAD, abs=1e-6)
               for s in shifted)  # buffers (BatchNorm statistics) do not move


def count_params(model: nn.Module) -> int:
    return len(list(model.parameters()))


def moved(a: ClientUpdate, b: ClientUpdate) -> list[float]:
    """Per uploaded float tensor, how far b is from a: one value when every element moved alike."""
    out = []
    for key, x in a.state.items():
        if x.is_floating_point():
            diff = b.state[key] - x
            assert torch.allclose(diff, diff.flatten()[0].expand_as(diff), atol=1e-6), key
            out.append(float(diff.flatten()[0]))
    return out
