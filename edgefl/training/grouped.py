"""Many clients' local adversarial training at once (issue 16): G copies of one architecture
trained as one network, client g's weights, BatchNorm statistics and batch counters its own.

Any model whose layers draw no random numbers in training (edgefl.profiling.layers.why_not_grouped)
groups through torch.func (`StackedModel`): the clients' parameters and buffers stacked along a
leading dimension of G, one `vmap` of `functional_call` over them, residual blocks included;
vmap updates the stacked BatchNorm statistics in place, each client's its own. Models built from
Sequential containers of Conv2d, BatchNorm2d (with a momentum), Linear, ReLU, pooling, Flatten,
Identity and edgefl's Normalize (`groupable`) take a hand-made grouped network instead
(`GroupedNet`), 2.5x faster on the quickstart's round (bench/throughput.py --part stacked):
client g's channels are the g-th block of G, a convolution becomes one grouped convolution
(`groups` x G), BatchNorm one BatchNorm over G x C channels, a linear layer one batched matmul, and
ReLU, pooling and flattening work channel by channel as they are.

Either way one forward is G clients' forwards; the clients' losses are summed, so one backward
gives each client exactly its own gradients, and SGD (momentum, weight decay) and Adam act element
by element, so one optimizer over the grouped parameters is G clients' optimizers. Inputs and
outputs are stacked client-major: client g's batch is rows g*B .. (g+1)*B of a (G*B, C, H, W)
tensor, so attacks and objectives run on the grouped network unchanged. The objective reduces per
client (`Objective.per_client`), and random draws (attack random starts,
edgefl.attacks.base.client_streams) come from each client's own generator, seeded as one-by-one
training seeds it, so grouped training repeats one-by-one training (Madry et al.'s PGD-AT loop in
edgefl.training.local) up to floating-point summation order.

A group trains in this process on torch's threads (a pool of worker processes, one part each,
gained under 10 %: docs/benchmarks.md). In the hand-made network a first convolution with one input
channel per client (grey images) takes its input gradient, which attacks need, as a depthwise
convolution (`OneChannelConv`); and flattening hands its gradient back channels_last
(`GroupedFlatten`), as the grouped network keeps its tensors.
"""

from __future__ import annotations

import copy
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, vmap

from edgefl.attacks import Attack
from edgefl.attacks.base import client_streams
from edgefl.config import TrainingConfig
from edgefl.data.datasets import to_float
from edgefl.models.base import Normalize
from edgefl.profiling.layers import why_not_grouped
from edgefl.training.local import FP32, TrainSettings, batch_indices, make_optimizer, tail_mean
from edgefl.training.objectives import Objective

State = dict[str, torch.Tensor]
AS_IS = (nn.ReLU, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.Identity)  # per channel


class GroupedConv2d(nn.Conv2d):
    """G convolutions as one, `groups` x G."""

    _folded: tuple[torch.Tensor, torch.Tensor] | None = None  # (weight, bias) while frozen in eval mode

    @classmethod
    def of(cls, c: nn.Conv2d, states: Sequence[State]) -> GroupedConv2d:
        g = len(states)
        shape: dict[str, Any] = {"kernel_size": c.kernel_size, "stride": c.stride, "padding": c.padding,
                                 "dilation": c.dilation, "padding_mode": c.padding_mode}
        out = nn.utils.skip_init(cls, c.in_channels * g, c.out_channels * g, groups=c.groups * g,
                                 bias=c.bias is not None, device=c.weight.device, dtype=c.weight.dtype,
                                 **shape)  # no random init: torch's global generator stays untouched
        copy_into(out, states, lambda t: torch.cat(t))
        return out

    def part(self, g: int, groups: int) -> State:
        return {k: v.chunk(groups)[g] for k, v in self.state_dict().items()}

    def _conv_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """With one input channel per client (grey images), an input that needs its gradient (an
        attack's passes) goes through `OneChannelConv`."""
        if x.requires_grad and OneChannelConv.fits(self):
            assert isinstance(self.padding, tuple)
            return OneChannelConv.apply(x, weight, bias, self.padding, self.groups)
        return super()._conv_forward(x, weight, bias)

    def folded(self, x: torch.Tensor, bn: GroupedBatchNorm2d) -> torch.Tensor:
        """bn(conv(x)) with bn in eval mode, as one convolution: weights scaled by
        gamma / sqrt(var + eps), bias beta - mean x that scale (the same affine map, one pass).
        With every parameter of the pair frozen (an attack's passes) the folded pair is computed
        once and kept until the network next switches mode (`GroupedNet.train`): in eval mode with
        frozen weights nothing the fold reads can change (BN statistics move only in train mode)."""
        if any(p is not None and p.requires_grad for p in (self.weight, self.bias, bn.weight, bn.bias)):
            return self._conv_forward(x, *fold(self, bn))
        if self._folded is None:
            self._folded = fold(self, bn)
        return self._conv_forward(x, *self._folded)


class OneChannelConv(torch.autograd.Function):
    """A convolution with one input channel per group, whose input gradient is worked out as a
    depthwise convolution of the output gradient with the kernels flipped, summed over each group's
    output channels: the transposed convolution written out, about three times faster in oneDNN
    than its own input gradient for this shape (0.14 against 0.41 ms for the quickstart's first
    layer of 10 clients, two threads). The forward and the weight and bias gradients are the usual
    ones, the gradients in the dtypes of the inputs (the forward may have run under autocast)."""

    @staticmethod
    def fits(conv: nn.Conv2d) -> bool:
        """Whether `conv` is a stride-1, undilated, zero-padded convolution with one input channel
        per group and at most kernel - 1 padding (so that the flipped convolution needs none below 0)."""
        pads = conv.padding
        return (conv.in_channels == conv.groups and conv.stride == (1, 1) and conv.dilation == (1, 1)
                and conv.padding_mode == "zeros" and isinstance(pads, tuple)
                and all(p <= k - 1 for p, k in zip(pads, conv.kernel_size, strict=True)))

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                padding: tuple[int, int], groups: int) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.padding, ctx.groups = padding, groups
        return nn.functional.conv2d(x, weight, bias, padding=padding, groups=groups)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[:3]
        grad_x = grad_w = grad_b = None
        if need_x:
            pad = [k - 1 - p for k, p in zip(weight.shape[2:], ctx.padding, strict=True)]
            flipped = weight.flip(2, 3).to(grad.dtype)  # autocast may have run the forward in bf16
            per_channel = nn.functional.conv2d(grad, flipped, padding=pad, groups=len(weight))
            grad_x = group_sums(per_channel, ctx.groups).to(x.dtype)
        if need_w or need_b:
            bias_size = [len(weight)] if need_b else None
            _, grad_w, grad_b = torch.ops.aten.convolution_backward(
                grad.to(weight.dtype), x.to(weight.dtype), weight, bias_size, [1, 1], ctx.padding, [1, 1],
                False, [0, 0], ctx.groups, [False, need_w, need_b])
        return grad_x, grad_w, grad_b, None, None


def group_sums(x: torch.Tensor, groups: int) -> torch.Tensor:
    """x (N, G x C, H, W) summed over each group's C channels: (N, G, H, W). On channels_last x
    (the grouped network's) the C channels of a group lie side by side in memory, so the sum runs
    along them and the result is channels_last too."""
    if not x.is_contiguous(memory_format=torch.channels_last):
        return x.unflatten(1, (groups, -1)).sum(2)
    return x.permute(0, 2, 3, 1).unflatten(3, (groups, -1)).sum(4).permute(0, 3, 1, 2)


class FlattenFormat(torch.autograd.Function):
    """`x.flatten(1)` of a channels_last x whose gradient comes back channels_last, as the layers
    before it keep their tensors (ReLU's backward on mixed formats: 150 against 8 us, 5 clients)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.shape = x.shape
        return x.flatten(1)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad.reshape(ctx.shape).contiguous(memory_format=torch.channels_last)


class GroupedFlatten(nn.Flatten):
    """nn.Flatten() whose gradient keeps a channels_last input's format (`FlattenFormat`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 4 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last):
            return FlattenFormat.apply(x)
        return x.flatten(1)


def fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of the one convolution that is bn(conv(x)) with bn in eval mode."""
    assert bn.running_mean is not None and bn.running_var is not None
    scale = torch.rsqrt(bn.running_var + bn.eps)
    shift = -bn.running_mean * scale
    if bn.affine:
        scale, shift = scale * bn.weight, shift * bn.weight + bn.bias
    if conv.bias is not None:
        shift = shift + conv.bias * scale
    return conv.weight * scale.view(-1, 1, 1, 1), shift


class GroupedBatchNorm2d(nn.BatchNorm2d):
    """G BatchNorms as one over G x C channels; `start` keeps each client's batch counter."""

    start: tuple[torch.Tensor, ...] = ()  # each client's num_batches_tracked before the group trains

    @classmethod
    def of(cls, b: nn.BatchNorm2d, states: Sequence[State]) -> GroupedBatchNorm2d:
        like = next(iter(b.state_dict().values()), None)  # none without affine or running statistics
        out = cls(b.num_features * len(states), b.eps, b.momentum, b.affine, b.track_running_stats,
                  device=None if like is None else like.device,
                  dtype=like.dtype if like is not None and like.is_floating_point() else None)
        copy_into(out, states, lambda t: torch.cat(t) if t[0].dim() else torch.zeros_like(t[0]))
        if b.track_running_stats:
            out.start = tuple(s["num_batches_tracked"].clone() for s in states)
        return out

    def part(self, g: int, groups: int) -> State:
        state = {k: v.chunk(groups)[g] for k, v in self.state_dict().items() if v.dim()}
        counter = self.num_batches_tracked
        if self.start and counter is not None:
            state["num_batches_tracked"] = self.start[g] + counter
        return state


class GroupedLinear(nn.Module):
    """G linear layers as one batched matmul on (B, G x F) inputs (client-major features)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)  # (G, out, in)
        self.bias = nn.Parameter(bias) if bias is not None else None  # (G, out)

    @classmethod
    def of(cls, linear: nn.Linear, states: Sequence[State]) -> GroupedLinear:
        biased = linear.bias is not None
        return cls(torch.stack([s["weight"] for s in states]).to(linear.weight),
                   torch.stack([s["bias"] for s in states]).to(linear.weight) if biased else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, out, feats = self.weight.shape
        xg = x.view(len(x), g, feats).transpose(0, 1)  # (G, B, in)
        y = torch.bmm(xg, self.weight.transpose(1, 2))
        if self.bias is not None:
            y = y + self.bias[:, None]
        return y.transpose(0, 1).reshape(len(x), g * out)

    def part(self, g: int, groups: int) -> State:
        return {k: v[g] for k, v in self.state_dict().items()}


class GroupedNormalize(Normalize):
    """G input normalisations as one over G x C channels."""

    @classmethod
    def of(cls, norm: Normalize, states: Sequence[State]) -> GroupedNormalize:
        out = cls([0.0], [1.0])
        out.mean, out.std = (torch.cat([s[k] for s in states], 1).to(norm.mean) for k in ("mean", "std"))
        return out

    def part(self, g: int, groups: int) -> State:
        return {k: v.chunk(groups, 1)[g] for k, v in self.state_dict().items()}


def copy_into(out: nn.Module, states: Sequence[State], join: Any) -> None:
    """out's parameters and buffers := join([each state's tensor of that name])."""
    with torch.no_grad():
        for name, t in out.state_dict().items():
            t.copy_(join([s[name] for s in states]))


GROUPED: dict[type[nn.Module], Any] = {nn.Conv2d: GroupedConv2d, nn.BatchNorm2d: GroupedBatchNorm2d,
                                       nn.Linear: GroupedLinear, Normalize: GroupedNormalize}


def groupable(model: nn.Module) -> bool:
    """True when every layer of `model` has a grouped form (see the module docstring)."""
    for m in model.modules():
        if type(m) is nn.BatchNorm2d and m.momentum is None:
            return False  # a cumulative average reads each client's own batch counter
        if isinstance(m, nn.Sequential) or type(m) in GROUPED or isinstance(m, AS_IS):
            continue
        if not (type(m) is nn.Flatten and m.start_dim == 1 and m.end_dim == -1):
            return False
    return True


class GroupedSequential(nn.Sequential):
    """A grouped Sequential that runs two pairs of layers faster, with the same values and gradients:
    in eval mode (attack passes) a convolution followed by a BatchNorm with running statistics as
    one folded convolution; and ReLU then max-pooling as max-pooling then ReLU (ReLU is monotone,
    so the maxima and the element each window's gradient goes to are the same, on 4x fewer values)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layers = list(self)
        i = 0
        while i < len(layers):
            layer, after = layers[i], layers[i + 1] if i + 1 < len(layers) else None
            if (not self.training and isinstance(layer, GroupedConv2d)
                    and isinstance(after, GroupedBatchNorm2d) and after.running_mean is not None):
                x, i = layer.folded(x, after), i + 2
            elif type(layer) is nn.ReLU and type(after) is nn.MaxPool2d:
                x, i = layer(after(x)), i + 2
            else:
                x, i = layer(x), i + 1
        return x


def group_layer(layer: nn.Module, states: Sequence[State]) -> nn.Module:
    """`layer` grouped, client g's weights from states[g] (keyed as `layer.state_dict()`)."""
    if isinstance(layer, nn.Sequential):
        return GroupedSequential(OrderedDict((name, group_layer(child, [substate(s, name) for s in states]))
                                             for name, child in layer.named_children()))
    if type(layer) in GROUPED:
        return GROUPED[type(layer)].of(layer, states)
    if type(layer) is nn.Flatten:  # groupable: flatten(1) only
        return GroupedFlatten()
    return copy.deepcopy(layer)


def substate(state: State, name: str) -> State:
    """The entries of `state` under the submodule `name`, keyed as that submodule's own."""
    prefix = name + "."
    return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}


class GroupedNet(nn.Module):
    """len(states) models of `template`'s architecture as one, client g's weights, BN statistics
    and batch counters from states[g]; inputs and outputs stacked client-major (G*B rows)."""

    def __init__(self, template: nn.Module, states: Sequence[State]) -> None:
        super().__init__()
        if not groupable(template):
            raise ValueError("the model has a layer with no grouped form")
        self.groups = len(states)
        self.body = group_layer(template, states).to(memory_format=torch.channels_last)
        self.keys = list(template.state_dict())

    def train(self, mode: bool = True) -> GroupedNet:
        """Set the mode (eval: `train(False)`); either switch drops the folded BatchNorm weights
        (GroupedConv2d.folded), which hold for one frozen stretch in eval mode only."""
        for m in self.modules():
            if isinstance(m, GroupedConv2d):
                m._folded = None
        return super().train(mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, b = self.groups, len(x) // self.groups
        if x.dim() == 4:  # (G*B, C, H, W) -> (B, G*C, H, W) in channels_last order, one copy
            _, c, h, w = x.shape
            nhwc = x.view(g, b, c, h, w).permute(1, 3, 4, 0, 2).contiguous()  # (B, H, W, G, C)
            x = nhwc.view(b, h, w, g * c).permute(0, 3, 1, 2)
        else:
            x = x.view(g, b, *x.shape[1:]).transpose(0, 1).reshape(b, -1)
        out = self.body(x)
        return out.view(b, g, -1).transpose(0, 1).reshape(g * b, -1)

    def states(self) -> list[State]:
        """Each client's state dict, keyed as its own model's. Conv weights keep the grouped
        network's channels_last strides: the averaged model then evaluates through the same oneDNN
        path as before; contiguous copies would change the last bits, and with them the trained
        accuracies (the quickstart's moved by 0.3 points when they were tried)."""
        parts: list[State] = [{} for _ in range(self.groups)]
        for name, m in self.body.named_modules():
            if hasattr(m, "part"):
                for g, part in enumerate(parts):
                    part.update({f"{name}.{k}": v.detach().clone()
                                 for k, v in m.part(g, self.groups).items()})
        return [{k: p[k] for k in self.keys} for p in parts]


class StackedModel(nn.Module):
    """len(states) models of `template`'s architecture as one: client g's parameters and buffers
    (BN statistics and batch counters) are the g-th slices of stacked tensors; inputs and outputs
    stacked client-major (G*B rows)."""

    base: nn.Module  # the template's copy that `functional_call` runs, not a submodule

    def __init__(self, template: nn.Module, states: Sequence[State]) -> None:
        super().__init__()
        self.groups = len(states)
        self.keys = list(template.state_dict())
        base = copy.deepcopy(template)
        self.__dict__["base"] = base  # its own tensors are never used
        self.names = [name for name, _ in base.named_parameters()]
        self.stacked = nn.ParameterList(nn.Parameter(stack(states, name, p))
                                        for name, p in base.named_parameters())
        self.buffers_ = {name: stack(states, name, b) for name, b in base.named_buffers()}

    def train(self, mode: bool = True) -> StackedModel:
        self.base.train(mode)
        return super().train(mode)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = dict(zip(self.names, self.stacked, strict=True))
        out = vmap(self.client_forward)(params, self.buffers_, x.unflatten(0, (self.groups, -1)))
        return out.flatten(0, 1)

    def client_forward(self, params: State, buffers: State, x: torch.Tensor) -> torch.Tensor:
        return functional_call(self.base, (params, buffers), (x,))

    def states(self) -> list[State]:
        """Each client's state dict, keyed as its own model's."""
        tensors = {**dict(zip(self.names, self.stacked, strict=True)), **self.buffers_}
        return [{k: tensors[k][g].detach().clone() for k in self.keys} for g in range(self.groups)]


def stack(states: Sequence[State], name: str, like: torch.Tensor) -> torch.Tensor:
    """The clients' tensors `name` stacked (`like`, the template's, for each one not in a state
    dict: a non-persistent buffer)."""
    if name in states[0]:
        return torch.stack([s[name] for s in states]).to(like.device)
    return torch.stack([like.detach()] * len(states))


@contextmanager
def own_streams(gens: Sequence[torch.Generator], device: torch.device) -> Iterator[None]:
    """Attacks' random starts drawn per client (`client_streams`, edgefl.attacks.base); a draw from
    torch's global generator meanwhile would mix the clients' streams, so one is refused (found,
    after the group trained, by the generator's changed state: so no other thread may draw from it
    meanwhile)."""
    before = global_rng_states(device)
    with client_streams(gens):
        yield
    if any(not torch.equal(a, b) for a, b in zip(before, global_rng_states(device), strict=True)):
        raise RuntimeError("grouped training drew from torch's global random generator, which would mix "
                           "the clients' streams: draw with edgefl.attacks.base.uniform_like / normal_like")


def global_rng_states(device: torch.device) -> list[torch.Tensor]:
    cuda = [torch.cuda.get_rng_state(device)] if device.type == "cuda" else []
    return [torch.random.get_rng_state(), *cuda]


@dataclass
class ClientJob:
    """One client's part of a group: its start state, data and seed (as `seed_everything` makes it),
    and how many of its last iterations its reported loss averages (`train_local`'s `tail`)."""

    state: State
    x: torch.Tensor
    y: torch.Tensor
    seed: int
    tail: int = 0


def stacked_batches(jobs: Sequence[ClientJob], batch: int,
                    iters: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Per iteration, every client's batch (as `device_batches` draws it) stacked client-major."""
    xs, ys = [], []
    for job in jobs:
        gen = torch.Generator().manual_seed(job.seed)
        rows = torch.stack(batch_indices(len(job.x), batch, iters, gen)).to(job.x.device)
        xs.append(job.x[rows])  # (iters, B, ...)
        ys.append(job.y[rows])
    x, y = torch.stack(xs, 1), torch.stack(ys, 1)  # (iters, G, B, ...)
    for xb, yb in zip(x, y, strict=True):
        yield to_float(xb.flatten(0, 1)), yb.flatten()


def train_group(
    template: nn.Module, jobs: Sequence[ClientJob], cfg: TrainingConfig, lr: float, iters: int, batch: int,
    attack: Attack | None, objective: Objective, settings: TrainSettings = FP32,
) -> tuple[list[State], list[float]]:
    """Train the clients of `jobs` together, each from its own state on its own data (copies of
    `template`, a model of their architecture on their device); returns each one's final state and
    mean training loss, as `train_local` would have one by one. All clients
    use `min(batch, len(x))` samples per step, which must be the same for every client. The clients
    are one grouped network (`GroupedNet` where the model is `groupable`, a `StackedModel`
    otherwise), trained in this process on torch's threads."""
    if len({min(batch, len(j.x)) for j in jobs}) != 1:
        raise ValueError("clients of one group must share their batch size")
    net = grouped_network(template, [job.state for job in jobs])
    optimizer = make_optimizer(list(net.parameters()), cfg, lr)
    per_client = objective.per_client(len(jobs))
    device = jobs[0].x.device
    gens = [torch.Generator(device).manual_seed(j.seed) for j in jobs]
    net.train()
    history = torch.zeros(iters, len(jobs), device=device)
    with own_streams(gens, device):
        for i, (xb, yb) in enumerate(stacked_batches(jobs, min(batch, len(jobs[0].x)), iters)):
            with settings.autocast(device):
                losses = per_client.loss(net, xb, yb, attack)
            optimizer.zero_grad(set_to_none=True)
            losses.sum().backward()
            optimizer.step()
            history[i] = losses.detach()
    return net.states(), [tail_mean(history[:, g], job.tail) for g, job in enumerate(jobs)]


def grouped_network(template: nn.Module, states: Sequence[State]) -> GroupedNet | StackedModel:
    """The clients of `states` as one network: the hand-made `GroupedNet` where it applies."""
    if groupable(template):
        return GroupedNet(template, states)
    reason = why_not_grouped(template)
    if reason:
        raise ValueError(f"the model cannot train grouped: its {reason}")
    return StackedModel(template, states)
