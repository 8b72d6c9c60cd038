"""Per-kind rooflines of the host, measured on a grid of small and large layer shapes.

Each grid layer is a real PyTorch module profiled as edgefl profiles models (edgefl.profiling), so
its FLOPs, bytes and operators are counted as the compute model counts them (edgefl.sim.compute).
Its forward, input-gradient and weight-gradient passes are timed separately (median of repeats);
then, per (kind, pass), the three figures of time = max(FLOPs / F, bytes / W) + ops x o are fitted
by least squares on log time, so small (overhead-bound) and large layers weigh alike. Kinds whose
FLOPs are negligible (everything but the convolutions and linear) keep F at the fitted conv forward
figure and fit W and o only.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch
from scipy.optimize import least_squares
from torch import nn

from edgefl.devices.profile import MAX_FIGURE
from edgefl.models.base import AtomModel, Normalize
from edgefl.profiling import profile_model
from edgefl.profiling.layers import layer_kind
from edgefl.sim.compute import FORWARD, INPUT_GRAD, KINDS, MATMUL_KINDS, WEIGHT_GRAD, Roofline, pass_work

Shape = tuple[int, ...]
# (batch, module, one sample's input shape): small layers are overhead-bound, large ones compute-
# or bandwidth-bound; the shapes span those of the bundled models at batch 8 to 64.
# convolutions: (batch, in, out, side, kernel, stride, groups); 3x3 stride 1 (conv3x3), other dense
# ones (conv: 1x1, strided), depthwise and grouped (dwconv), as MobileNet and ResNet run them
CONV = [(8, 1, 16, 8, 3, 1, 1), (32, 16, 32, 8, 3, 1, 1), (64, 32, 64, 4, 3, 1, 1), (16, 3, 64, 32, 3, 1, 1),
        (32, 3, 32, 32, 3, 1, 1), (32, 64, 64, 32, 3, 1, 1), (16, 64, 128, 16, 3, 1, 1),
        (32, 128, 128, 16, 3, 1, 1), (32, 256, 256, 8, 3, 1, 1), (64, 512, 512, 4, 3, 1, 1),
        (32, 512, 512, 2, 3, 1, 1),
        (8, 16, 32, 8, 1, 1, 1), (64, 256, 512, 4, 1, 1, 1), (32, 64, 256, 16, 1, 1, 1),
        (32, 128, 128, 16, 3, 2, 1), (16, 64, 128, 32, 3, 2, 1),
        (8, 16, 16, 8, 3, 1, 16), (32, 96, 96, 16, 3, 1, 96), (32, 144, 144, 32, 3, 2, 144),
        (32, 384, 384, 8, 3, 1, 384), (32, 64, 64, 16, 3, 1, 4), (32, 128, 128, 16, 3, 1, 32)]
LINEAR = [(8, 64, 10), (32, 256, 10), (64, 512, 512), (32, 2048, 512), (64, 4096, 256)]
MAPS = [(8, 16, 8), (32, 32, 8), (32, 64, 32), (64, 64, 32), (32, 128, 16), (64, 512, 4), (16, 8, 4)]


@dataclass(frozen=True)
class Sample:
    kind: str
    pass_: str
    flops: float
    nbytes: float
    ops: int
    seconds: float


def grid(quick: bool) -> list[tuple[int, nn.Module, Shape]]:
    """(batch, module, sample shape) of every grid layer; `quick` keeps the smallest of each."""
    conv = [(b, nn.Conv2d(ci, co, k, stride, padding=k // 2, groups=g, bias=False), (ci, s, s))
            for b, ci, co, s, k, stride, g in CONV]
    linear = [(b, nn.Linear(i, o), (i,)) for b, i, o in LINEAR]
    maps: list[tuple[int, nn.Module, Shape]] = []
    for b, c, s in MAPS:
        maps += [(b, nn.BatchNorm2d(c), (c, s, s)), (b, nn.ReLU(), (c, s, s)),
                 (b, nn.ReLU6(inplace=True), (c, s, s)), (b, nn.MaxPool2d(2), (c, s, s)),
                 (b, Normalize([0.5] * c, [0.5] * c), (c, s, s))]
    layers = conv + linear + maps
    kinds = [conv[0], conv[11], conv[16]]  # one conv3x3, conv and dwconv
    return [*kinds, linear[0], *maps[:5]] if quick else layers


def measure(batch: int, module: nn.Module, shape: Shape, repeats: int,
            timer: Callable[[Callable[[], object], int], float]) -> list[Sample]:
    """Samples of every pass of one grid layer (an in-place one profiled as its out-of-place twin,
    which moves what the compute model counts for it, under its own kind)."""
    (layer,) = profile_model(AtomModel([("layer", _out_of_place(module))], shape), "grid").atoms[0].layers
    layer = replace(layer, kind=layer_kind(module))
    module.train()
    params = list(module.parameters())
    x = torch.randn(batch, *shape)
    samples = []
    for pass_ in (FORWARD, INPUT_GRAD, WEIGHT_GRAD):
        if pass_ == WEIGHT_GRAD and not params:
            continue
        run = _pass(module, x, params, pass_)
        run()  # warm-up: allocation, kernel selection
        flops, nbytes, ops = pass_work(layer, pass_, batch)
        samples.append(Sample(layer.kind, pass_, flops, nbytes, ops, timer(run, repeats)))
    return samples


def _pass(module: nn.Module, x: torch.Tensor, params: list[nn.Parameter], pass_: str) -> Callable[[], object]:
    """One pass as a call: the forward builds the graph as training does; each backward differentiates
    a kept graph for the input only (weights frozen) or the weights only (input a constant)."""
    for p in params:
        p.requires_grad_(pass_ != INPUT_GRAD)
    inp = x.clone().requires_grad_(pass_ != WEIGHT_GRAD)
    if pass_ == FORWARD:
        if getattr(module, "inplace", False):  # in place on a layer's output, as a model runs it
            out_of_leaf = inp * 1.0
            return lambda: module(out_of_leaf)
        return lambda: module(inp)
    out = _out_of_place(module)(inp)  # the same backward: an in-place layer's is its twin's
    grad = torch.randn_like(out)
    wrt = [inp] if pass_ == INPUT_GRAD else params
    return lambda: torch.autograd.grad(out, wrt, grad, retain_graph=True)


def _out_of_place(module: nn.Module) -> nn.Module:
    """`module`, or its copy computing out of place where it computes in place (an in-place layer
    cannot take a leaf input that requires grad, as the grid's are)."""
    if not getattr(module, "inplace", False):
        return module
    twin = copy.copy(module)
    setattr(twin, "inplace", False)  # noqa: B010 (nn.Module types its attributes as tensors)
    return twin


def fit(samples: list[Sample], peak_flops: float) -> dict[tuple[str, str], Roofline]:
    """Per (kind, pass) present: the roofline fitted to its samples (conv/linear first, so the
    other kinds can take the conv forward F)."""
    out: dict[tuple[str, str], Roofline] = {}
    keys = sorted({(s.kind, s.pass_) for s in samples},
                  key=lambda k: (k[0] not in MATMUL_KINDS, KINDS.index(k[0])))
    for kind, pass_ in keys:
        mine = [s for s in samples if (s.kind, s.pass_) == (kind, pass_)]
        fixed = None if kind in MATMUL_KINDS else out.get(("conv", FORWARD), Roofline(peak_flops, 1, 0)).flops
        out[(kind, pass_)] = fit_one(mine, fixed)
    return out


def fit_one(samples: list[Sample], flops: float | None) -> Roofline:
    """Least squares on log seconds over log figures; `flops` given keeps F fixed. F and B stay at
    most a profile's largest figure (MAX_FIGURE G/s): where the bytes explain none of the time
    (small shapes, all overhead) the fit would take B to 10^13 GB/s, which a profile refuses."""
    t = np.array([s.seconds for s in samples])
    f = np.array([s.flops for s in samples])
    b = np.array([s.nbytes for s in samples])
    n = np.array([s.ops for s in samples], dtype=float)
    top = math.log(MAX_FIGURE * 1e9) - 1e-9  # strictly inside the bound, as the solver starts
    start = [min(math.log(max(float(np.max(f / t)), 1.0)), top), min(math.log(float(np.max(b / t))), top),
             math.log(float(np.min(t / n)) / 2)]

    def predict(v: np.ndarray) -> np.ndarray:
        big_f = math.exp(v[0]) if flops is None else flops
        return np.maximum(f / big_f, b / np.exp(v[1])) + n * np.exp(v[2])

    def residual(v: np.ndarray) -> np.ndarray:
        return np.log(predict(v) / t)

    best = least_squares(residual, np.array(start), method="trf",
                         bounds=([-np.inf] * 3, [top, top, np.inf])).x
    return Roofline(math.exp(best[0]) if flops is None else flops, math.exp(best[1]), math.exp(best[2]))
