"""Width-reduced sub-models, the machinery of HeteroFL-AT, FedDrop-AT and FedRolex-AT (FedProphet
§7.2 baselines; HeteroFL: Diao et al., ICLR 2021; FedDrop: Caldas et al., 2018, federated dropout;
FedRolex: Alam et al., NeurIPS 2022).

Each round a selected client k gets the width fraction r = min(R_k(t) / MemReq(whole model), 1)
(REFERENCE.md, "Baseline details from the releases"), never below `width.min_fraction` and,
when `width.levels` is given, rounded down to the largest level <= r. Every hidden layer of C
channels keeps ceil(r C) of them, the same ones in every layer of that count so that a residual
addition lines up; the input image channels and the output layer (the classes) stay whole. Which
channels (HeteroFL: the first ones; FedDrop: a seeded random subset; FedRolex: a window rolling
with the round) is each method's one line.

The client trains a real narrower network (sliced Conv2d / BatchNorm2d / Linear, the Linear after a
Flatten sliced over channel x position) with the scenario's local adversarial training, and the
cost model charges that network: its own atom profile and its own state bytes down and up. The
server averages every element over the clients that held it, weighted by their sample counts;
elements nobody held keep the global value (HeteroFL's partial average). The evaluated model is
the whole-width global model.

BatchNorm is averaged element-wise like every other tensor: FedBN's client-local BN cannot follow
a width that changes from round to round, so `training.fedbn` does not apply to these methods.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from edgefl.config import Check, Knobs, knob_section
from edgefl.devices.pool import DeviceState
from edgefl.errors import EdgeflError
from edgefl.methods.aggregate import state_bytes
from edgefl.methods.base import ClientModel, ClientPlan, ClientUpdate, Context
from edgefl.methods.fedavg import FedAvgAT
from edgefl.models.base import AtomModel
from edgefl.models.resnet import BasicBlock
from edgefl.profiling import profile_model
from edgefl.profiling.layers import narrowable_names, narrows
from edgefl.server.base import State
from edgefl.sim.records import ModelProfile

Index = tuple[torch.Tensor, ...]  # kept positions along a global tensor's leading dimensions
IndexMap = dict[str, Index]  # state key -> its Index; a key not listed is held whole
Kept = dict[int, torch.Tensor]  # a hidden layer's channel count C -> the channels kept
ROUNDING = 1e-9  # r C a hair above an integer (0.3 x 10 = 3.0000000000000004) keeps that integer


# --- how wide, which channels ----------------------------------------------------------------------
@knob_section("width")
@dataclass
class WidthConfig(Knobs):
    """HeteroFL / FedDrop / FedRolex (FedProphet §7.2): width-reduced sub-models that fit memory."""

    levels: list[float] = field(default_factory=list)  # allowed fractions (empty = any, as the release)
    min_fraction: float = 0.0625  # never narrower than this (at least one channel per layer)

    def checks(self) -> list[Check]:
        return [
            ("levels", all(0 < v <= 1 for v in self.levels), "every level must be in (0, 1]"),
            ("min_fraction", 0 < self.min_fraction <= 1, "must be in (0, 1]"),
        ]


def width_fraction(available: float, full: float, cfg: WidthConfig) -> float:
    """r = min(R_k(t) / MemReq, 1), at least `min_fraction`, rounded down to `levels` when given
    (the smallest level when none is <= r)."""
    r = max(min(available / full, 1.0), cfg.min_fraction)
    if not cfg.levels:
        return r
    return max((v for v in cfg.levels if v <= r), default=min(cfg.levels))


def kept_count(fraction: float, count: int) -> int:
    """ceil(r C) channels, at least one."""
    return max(1, min(count, math.ceil(fraction * count - ROUNDING)))


# --- the narrower network --------------------------------------------------------------------------
class Unnarrowable(ValueError):
    """A layer the width machinery cannot slice."""


@dataclass(frozen=True)
class SubModel:
    model: AtomModel  # a real narrower network, a fresh copy
    index: IndexMap  # where each of its tensors sits in the global one


def output_layer(model: nn.Module) -> nn.Module:
    """The last Conv2d or Linear: the one that gives the classes and stays whole."""
    return [m for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear)][-1]


def hidden_counts(model: nn.Module) -> list[int]:
    """The distinct channel counts of the layers that get narrower (all Conv2d / Linear outputs
    but the output layer's)."""
    last = output_layer(model)
    return sorted({m.out_channels if isinstance(m, nn.Conv2d) else m.out_features
                   for m in model.modules() if isinstance(m, nn.Conv2d | nn.Linear) and m is not last})


def grid(index: Index, shape: Sequence[int], device: torch.device) -> tuple[torch.Tensor, ...]:
    """Broadcastable index tensors selecting index[0] x index[1] x ... x every trailing position."""
    dims = [*index, *(torch.arange(n) for n in shape[len(index):])]
    return tuple(d.to(device).reshape([-1 if i == j else 1 for j in range(len(dims))])
                 for i, d in enumerate(dims))


def extract(model: AtomModel, kept: Kept) -> SubModel:
    """The narrower copy of `model` that keeps `kept[C]` of every hidden layer of C channels."""
    sub = copy.deepcopy(model)
    training = sub.training
    sub.eval()  # only shapes flow through the walk; eval mode keeps BN happy on 1x1 maps
    walk = _Narrow(kept, output_layer(sub))
    first = next(sub.parameters())
    x = torch.zeros(1, *model.input_shape, device=first.device, dtype=first.dtype)
    with torch.no_grad():
        walk.sequence(sub, "", torch.arange(model.input_shape[0]), x)
    sub.train(training)
    return SubModel(sub, walk.index)


class _Narrow:
    """One walk over a model copy in forward order, slicing each layer in place.

    `chan` follows the global positions of the channels (after a Flatten, of the features) that
    flow between layers; `x` is the whole-width activation, for the shapes a Flatten needs.
    """

    def __init__(self, kept: Kept, output: nn.Module) -> None:
        self.kept = kept
        self.output = output
        self.index: IndexMap = {}

    def sequence(self, parent: nn.Module, prefix: str, chan: torch.Tensor,
                 x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        for name, child in parent.named_children():
            key = prefix + name
            if isinstance(child, nn.Sequential):
                chan, x = self.sequence(child, key + ".", chan, x)
                continue
            out = child(x)  # the whole-width layer, before it is sliced
            chan = self.block(child, key + ".", chan, x) if isinstance(child, BasicBlock) else \
                self.layer(child, key, chan, x)
            x = out
        return chan, x

    def block(self, b: BasicBlock, prefix: str, chan: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """A residual block: both paths must end on the same channels."""
        identity = chan
        if b.downsample is not None:
            identity, _ = self.sequence(b.downsample, prefix + "downsample.", chan, x)
        for name in ("conv1", "bn1", "conv2", "bn2"):
            chan = self.layer(getattr(b, name), prefix + name, chan, x)
        if not torch.equal(chan, identity):
            raise Unnarrowable(f"residual block {prefix.rstrip('.')} adds mismatched channel sets")
        return chan

    def layer(self, m: nn.Module, key: str, chan: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """Slice layer `m` that reads channels `chan`; the channels it outputs."""
        if isinstance(m, nn.Conv2d) and m.groups == 1:
            out = self.outputs(m, m.out_channels)
            self.take(m, key, {"weight": (out, chan), "bias": (out,)})
            m.in_channels, m.out_channels = len(chan), len(out)
            return out
        if isinstance(m, nn.BatchNorm2d):
            self.take(m, key, dict.fromkeys(("weight", "bias", "running_mean", "running_var"), (chan,)))
            m.num_features = len(chan)
            return chan
        if isinstance(m, nn.Linear):
            out = self.outputs(m, m.out_features)
            self.take(m, key, {"weight": (out, chan), "bias": (out,)})
            m.in_features, m.out_features = len(chan), len(out)
            return out
        if isinstance(m, nn.Flatten) and m.start_dim == 1:
            positions = math.prod(x.shape[2:])  # channel c's features sit at c x positions + p
            return (chan[:, None] * positions + torch.arange(positions)).reshape(-1)
        if narrows(m) == "pass":
            return chan
        raise Unnarrowable(f"layer {key} ({type(m).__name__})")

    def outputs(self, m: nn.Module, count: int) -> torch.Tensor:
        return torch.arange(count) if m is self.output else self.kept[count]

    def take(self, m: nn.Module, key: str, slices: dict[str, Index]) -> None:
        """Replace `m`'s tensors named in `slices` (parameters or buffers) by their slices, and
        record where each sits in the global tensor."""
        for name, index in slices.items():
            value = getattr(m, name)
            if value is None:  # no bias, no affine BN, no running statistics
                continue
            part = value.detach()[grid(index, value.shape, value.device)].clone()
            setattr(m, name, nn.Parameter(part) if isinstance(value, nn.Parameter) else part)
            self.index[f"{key}.{name}"] = index


def check_narrowable(model: AtomModel, where: str, name: str, method: str) -> None:
    """Fail early, naming the model, when some layer cannot be sliced."""
    try:
        extract(model, {c: torch.arange(c) for c in hidden_counts(model)})
    except Unnarrowable as exc:
        raise EdgeflError(where, "model.name", f"{method} cannot narrow {name}'s {exc}; width-reduced "
                          f"sub-models support {narrowable_names()} (Conv2d of groups 1) and residual "
                          f"basic blocks: choose another model or method") from None


# --- the server's partial average ------------------------------------------------------------------
def width_average(global_state: State, states: Sequence[State], maps: Sequence[IndexMap],
                  weights: Sequence[float]) -> State:
    """Every element averaged over the clients that held it, weighted by w_k; elements nobody held
    keep the global value; integer buffers (BN's counters) are rounded (HeteroFL's partial average)."""
    out: State = {}
    for key, g in global_state.items():
        total = torch.zeros(g.shape, dtype=torch.float64, device=g.device)
        weight = torch.zeros_like(total)
        for state, index, w in zip(states, maps, weights, strict=True):
            if key in state:
                value = state[key].double()
                _add_at(total, index.get(key, ()), w * value)
                _add_at(weight, index.get(key, ()), torch.full_like(value, float(w)))
        avg = torch.where(weight > 0, total / weight.clamp_min(1e-300), g.double())
        out[key] = (avg if g.is_floating_point() else avg.round()).to(g.dtype)
    return out


def _add_at(target: torch.Tensor, index: Index, values: torch.Tensor) -> None:
    if target.dim() == 0:
        target += values
    else:
        target.index_put_(grid(index, target.shape, target.device), values.to(target.device),
                          accumulate=True)


# --- the method ------------------------------------------------------------------------------------
class WidthMethod(FedAvgAT):
    """FedAvgAT's local adversarial training on a sub-model sized to the client's memory; each
    subclass picks the channels (`channels`)."""

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx)
        s = ctx.scenario
        check_narrowable(self.model, ctx.where, s.model.name, s.method)
        self.counts = hidden_counts(self.model)
        # kept channel counts -> (the sub-model's profile, its state bytes); the whole model's is known
        self.profiles: dict[tuple[int, ...], tuple[ModelProfile, int]] = {
            tuple(self.counts): (ctx.profile, self.model_bytes)}

    @abstractmethod
    def channels(self, count: int, n: int, round_: int, client: int) -> list[int]:
        """The n of `count` channels a client keeps this round."""

    def kept(self, round_: int, client: int, r: float) -> Kept:
        return {c: torch.tensor(self.channels(c, kept_count(r, c), round_, client), dtype=torch.long)
                for c in self.counts}

    def plan(self, round_: int, client: int, state: DeviceState) -> ClientPlan:
        """The whole model's plan, narrowed to the width r the client's memory allows."""
        whole = super().plan(round_, client, state)
        need = self.ctx.cost.memory_need(whole.workload)
        r = width_fraction(state.memory_bytes, need, self.ctx.scenario.knobs(WidthConfig))
        profile, nbytes = self.sub_profile(r)
        workload = dataclasses.replace(whole.workload, atoms=profile.atoms, download_bytes=nbytes,
                                       upload_bytes=nbytes)
        return dataclasses.replace(whole, workload=workload, fraction=r)

    def sub_profile(self, r: float) -> tuple[ModelProfile, int]:
        """The sub-model's profile and state bytes, cached by its kept channel counts (which channels
        are kept changes neither)."""
        counts = tuple(kept_count(r, c) for c in self.counts)
        if counts not in self.profiles:
            sub = extract(self.model, {c: torch.arange(n) for c, n in zip(self.counts, counts, strict=True)})
            nbytes = state_bytes(sub.model.state_dict())
            name = f"{self.ctx.scenario.model.name}@{counts}"
            self.profiles[counts] = (profile_model(sub.model, name), nbytes)
        return self.profiles[counts]

    def client_model(self, round_: int, client: int, plan: ClientPlan) -> ClientModel:
        """The sub-model of the planned width, and where its tensors sit in the global ones."""
        sub = extract(self.model, self.kept(round_, client, plan.fraction))
        return sub.model, {"index": sub.index}

    def combine(self, round_: int, updates: list[ClientUpdate]) -> State:
        return width_average(self.model.state_dict(), [u.state for u in updates],
                             [u.extra["index"] for u in updates], [u.num_samples for u in updates])
