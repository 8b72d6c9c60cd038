"""Many clients' local adversarial training at once (issue 16): G copies of one architecture
trained as one network, client g's weights, BatchNorm statistics and batch counters its own.

A model groups when torch.fx traces its forward to layers with a grouped form joined by operators
that act element by element (`traced`): Conv2d, BatchNorm2d (with a momentum), Linear
and edgefl's Normalize, which are grouped; ReLU, pooling, Identity and flattening to (N, features),
which work channel by channel as they are; and between them `+` (residual blocks), relu and
torch.flatten. Sequential CNNs (`digits_cnn`, `cnn3`, `cnn4`, `smallcnn`, `vgg*`) and ResNets
(`resnet*`, torchvision's) group; any other model, and one with a layer that draws random numbers
in training (edgefl.profiling.layers.why_not_grouped), trains one by one (`why_one_by_one`; the
executor says why once a run). Issue 50: torch.func's vmap over the clients' stacked parameters,
which grouped every other model before, ran a ResNet10 round at 0.65-0.99x one by one's speed
and the quickstart's at 1.30-1.35x (docs/benchmarks.md), so it went.

The grouped network (`GroupedNet`) is that traced forward with each layer grouped: client g's
channels are the g-th block of G, a convolution becomes one grouped convolution (`groups` x G), on
maps of at most SMALL_MAP outputs (ResNets' last stages) one batched matmul over the kernel taps
that read the map (`tap_matmul`), or, with the weights frozen (an attack's passes) where every
output reads every input, by each client's dense matrix (`dense_matmul`); BatchNorm becomes one
BatchNorm over G x C channels and a linear layer one batched matmul. One forward is G clients'
forwards; the clients' losses are summed, so one backward gives each client exactly its own
gradients, and SGD (momentum, weight decay) and Adam act element by element, so one optimizer over
the grouped parameters is G clients' optimizers. Inputs and outputs are stacked client-major:
client g's batch is rows g*B .. (g+1)*B of a (G*B, C, H, W) tensor, so attacks and objectives run
on the grouped network unchanged. The objective reduces per client (`Objective.per_client`), and
random draws (attack random starts, edgefl.attacks.base.client_streams) come from each client's own
generator, seeded as one-by-one training seeds it, so grouped training repeats one-by-one training
(Madry et al.'s PGD-AT loop in edgefl.training.local) up to floating-point summation order.

A group trains in this process on torch's threads (a pool of worker processes, one part each,
gained under 10 %: docs/benchmarks.md). The grouped network keeps its tensors channels_last. A
first convolution with one input channel per client (grey images) takes its input gradient, which
attacks need, as a depthwise convolution (`OneChannelConv`); flattening hands its gradient back
channels_last (`GroupedFlatten`); in eval mode (an attack's passes) a convolution and the
BatchNorm that alone reads it run as one folded convolution (`ConvBN`); and ReLU then max-pooling
run as max-pooling then ReLU (`pool_before_relu`).
"""

from __future__ import annotations

import copy
import functools
import operator
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
from torch import fx, nn

from edgefl.attacks import Attack
from edgefl.attacks.base import client_streams
from edgefl.config import TrainingConfig
from edgefl.data.datasets import to_float
from edgefl.models.base import Normalize
from edgefl.profiling.layers import why_not_grouped
from edgefl.sim.workload import Workload
from edgefl.training.local import FP32, TrainSettings, batch_indices, make_optimizer, tail_mean
from edgefl.training.objectives import Objective

State = dict[str, torch.Tensor]
AS_IS = (nn.ReLU, nn.MaxPool2d, nn.AvgPool2d, nn.AdaptiveAvgPool2d, nn.Identity)  # per channel


class GroupedConv2d(nn.Conv2d):
    """G convolutions as one, `groups` x G."""

    clients = 1  # G: each client's convolution has groups / G groups
    kept: dict[object, Any]  # what one frozen stretch reuses (`keep`)

    @classmethod
    def of(cls, c: nn.Conv2d, states: Sequence[State]) -> GroupedConv2d:
        g = len(states)
        shape: dict[str, Any] = {"kernel_size": c.kernel_size, "stride": c.stride, "padding": c.padding,
                                 "dilation": c.dilation, "padding_mode": c.padding_mode}
        out = nn.utils.skip_init(cls, c.in_channels * g, c.out_channels * g, groups=c.groups * g,
                                 bias=c.bias is not None, device=c.weight.device, dtype=c.weight.dtype,
                                 **shape)  # no random init: torch's global generator stays untouched
        out.clients, out.kept = g, {}
        out.weight.data = torch.empty_like(out.weight, memory_format=torch.channels_last)  # grouped layout
        copy_into(out, states)
        return out

    def part(self, g: int, groups: int) -> State:
        return {k: v.chunk(groups)[g] for k, v in self.state_dict().items()}

    def _conv_forward(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """With one input channel per client (grey images), an input that needs its gradient (an
        attack's passes) goes through `OneChannelConv`."""
        if x.requires_grad and OneChannelConv.fits(self):
            assert isinstance(self.padding, tuple)
            return OneChannelConv.apply(x, weight, bias, self.padding, self.groups)
        taps = self.small_map(x)
        if taps is None:
            return super()._conv_forward(x, weight, bias)
        if weight is not self.weight or weight.requires_grad:
            return tap_matmul(x, tap_weights(weight, taps, self.groups), bias, taps, self)
        starts = self.spanned(x)
        if starts is None:
            kept = self.keep(taps, functools.partial(tap_weights, weight, taps, self.groups))
            return tap_matmul(x, kept, bias, taps, self)
        make = functools.partial(dense_weights, weight, x.shape[2:], taps, starts, self)
        dense = self.keep(("dense", *x.shape[2:]), make)
        return dense_matmul(x, dense, bias, taps, self.groups)

    def spanned(self, x: torch.Tensor) -> tuple[int, int] | None:
        """`dense_start` of rows and columns: where every output of each client's convolution of x
        reads every input, which `dense_matmul` then runs (None elsewhere)."""
        assert isinstance(self.padding, tuple)  # a small map's (`small_map`)
        dims = zip(x.shape[2:], self.kernel_size, self.padding, self.stride, self.dilation, strict=True)
        rows, cols = (dense_start(n, k, p, s, d) for n, k, p, s, d in dims)
        return None if rows is None or cols is None else (rows, cols)

    def keep(self, key: object, make: Callable[[], Any]) -> Any:
        """make(), worked out once and kept until the network next switches mode (`GroupedNet.train`
        empties `kept`): asked for only while what make reads is frozen, in an attack's eval-mode
        passes, where nothing can change it (BN statistics move only in train mode, weights by an
        optimizer step)."""
        if key not in self.kept:
            self.kept[key] = make()
        return self.kept[key]

    def small_map(self, x: torch.Tensor) -> tuple[Taps, Taps] | None:
        """The live taps (`live_taps`) of rows and columns when each client's convolution is a dense,
        zero-padded one with an output map of at most SMALL_MAP positions, which `tap_matmul` runs."""
        if self.groups != self.clients or self.padding_mode != "zeros" or not isinstance(self.padding, tuple):
            return None
        dims = zip(x.shape[2:], self.kernel_size, self.padding, self.stride, self.dilation, strict=True)
        rows, cols = (live_taps(n, k, p, s, d) for n, k, p, s, d in dims)
        if rows is None or cols is None or rows.out * cols.out > SMALL_MAP:
            return None
        return rows, cols

    def scaled(self, y: torch.Tensor, bn: GroupedBatchNorm2d) -> torch.Tensor:
        """bn(y) with bn in eval mode as the affine map it is (`bn_affine`), worked out once while
        bn's parameters are frozen (`keep`): on the small maps where the convolution is not folded,
        BatchNorm's own eval-mode backward took 2 ms a pass for ResNet10's last stage of 10 clients,
        one thread (5120 channels of 1x1 maps), against about 0.1 ms for the product and sum."""
        if frozen(bn.weight, bn.bias):
            scale, shift = self.keep("affine", lambda: bn_affine(bn))
        else:
            scale, shift = bn_affine(bn)
        return y * scale.view(1, -1, 1, 1) + shift.view(1, -1, 1, 1)

    def folded(self, x: torch.Tensor, bn: GroupedBatchNorm2d) -> torch.Tensor:
        """bn(conv(x)) with bn in eval mode, as one convolution: weights scaled by
        gamma / sqrt(var + eps), bias beta - mean x that scale (the same affine map, one pass).
        With every parameter of the pair frozen (an attack's passes) the folded pair is worked out
        once (`keep`)."""
        if not frozen(self.weight, self.bias, bn.weight, bn.bias):
            return self._conv_forward(x, *fold(self, bn))
        return self._conv_forward(x, *self.keep("fold", lambda: fold(self, bn)))


def frozen(*params: torch.Tensor | None) -> bool:
    """Whether none of `params` (None for an absent bias) takes a gradient: an attack's passes."""
    return not any(p is not None and p.requires_grad for p in params)


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


SMALL_MAP = 4  # output positions up to which a grouped convolution runs as batched matmuls (`tap_matmul`)


class Taps(NamedTuple):
    """Along one dimension of a convolution: the kernel taps first .. stop - 1 read the input, the
    others only its zero padding; `before` and `after` pad the input for those taps alone
    (negative: crop), and the convolution has `out` outputs."""

    first: int
    stop: int
    before: int
    after: int
    out: int


@functools.cache
def live_taps(size: int, kernel: int, pad: int, stride: int, dilation: int) -> Taps | None:
    """The `Taps` of a zero-padded convolution along a dimension of `size` inputs (None when every tap
    reads padding only)."""
    out = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    live = [i for i in range(kernel) if any(0 <= o * stride - pad + i * dilation < size for o in range(out))]
    if not live:
        return None
    first, stop = live[0], live[-1] + 1
    before = pad - first * dilation
    after = (out - 1) * stride + (stop - first - 1) * dilation + 1 - size - before
    return Taps(first, stop, before, after, out)


def tap_weights(weight: torch.Tensor, taps: tuple[Taps, Taps], groups: int) -> torch.Tensor:
    """A grouped convolution's weights over `taps` as `tap_matmul` multiplies them: (G, out channels,
    rows x columns x channels), tap-major as channels_last weights hold each output channel's
    kernel, so a view of them where every tap, or one, reads the map."""
    rows, cols = taps
    kept = weight.permute(0, 2, 3, 1)[:, rows.first:rows.stop, cols.first:cols.stop]
    return kept.reshape(groups, len(weight) // groups, -1)


def tap_matmul(x: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor | None, taps: tuple[Taps, Taps],
               conv: nn.Conv2d) -> torch.Tensor:
    """`conv`'s grouped convolution of x as one batched matmul, a client per batch entry, over the
    taps that read x (`live_taps`; `weights` from `tap_weights`): the products and sums of the
    convolution less those with the padding's zeros. Patches are views of x's channels_last windows,
    laid out tap-major as the weights are; out channels_last (the grouped network's layout). On small
    maps, ResNets' last stages, oneDNN's convolutions run at a few GFLOP/s, against tens for the
    matmul (docs/benchmarks.md)."""
    rows, cols = taps
    (dh, dw), (sh, sw) = conv.dilation, conv.stride
    kh, kw, g, b = rows.stop - rows.first, cols.stop - cols.first, conv.groups, len(x)
    padded = nn.functional.pad(x, (cols.before, cols.after, rows.before, rows.after)).permute(0, 2, 3, 1)
    windows = padded.unfold(1, (kh - 1) * dh + 1, sh).unfold(2, (kw - 1) * dw + 1, sw)[..., ::dh, ::dw]
    # (B, out rows, out columns, G x C, kh, kw) -> (G, B x L, kh x kw x C)
    lhs = windows.unflatten(3, (g, -1)).permute(3, 0, 1, 2, 5, 6, 4).reshape(g, -1, weights.shape[2])
    rhs = weights.transpose(1, 2)
    y = torch.bmm(lhs, rhs) if bias is None else torch.baddbmm(bias.view(g, 1, -1), lhs, rhs)
    return client_maps(y, b, taps)


def client_maps(y: torch.Tensor, batch: int, taps: tuple[Taps, Taps]) -> torch.Tensor:
    """Per client's outputs y (G, B x out rows x out columns x C, or G, B, out rows x ... x C) as the
    grouped network's (B, G x C, out rows, out columns) channels_last map."""
    rows, cols = taps
    nhwc = y.view(len(y), batch, rows.out, cols.out, -1).permute(1, 2, 3, 0, 4)
    return nhwc.reshape(batch, rows.out, cols.out, -1).permute(0, 3, 1, 2)


@functools.cache
def dense_start(size: int, kernel: int, pad: int, stride: int, dilation: int) -> int | None:
    """Along one dimension of an undilated zero-padded convolution of `size` inputs where every output
    reads every input (input i through tap i + pad - o x stride for output o), the tap by which the
    last output reads the first input; None where some output misses some input."""
    out = (size + 2 * pad - dilation * (kernel - 1) - 1) // stride + 1
    first = pad - (out - 1) * stride
    return first if dilation == 1 and first >= 0 and size - 1 + pad < kernel else None


def dense_weights(weight: torch.Tensor, size: Sequence[int], taps: tuple[Taps, Taps], starts: tuple[int, int],
                  conv: nn.Conv2d) -> torch.Tensor:
    """A grouped convolution of maps of `size` whose every output reads every input (`dense_start`)
    as each client's dense matrix, (G, output rows x columns x out channels, input rows x columns x
    in channels): block (output, input) the tap that joins them. The tap moves by one with the input
    and back by the stride with the output, so the blocks are a strided view of the weights, outputs
    last first, put in order by the one copy that makes the matrix; its rows run along the in
    channels, as channels_last weights hold them, so that copy reads the weights in order and
    `dense_matmul` multiplies by the transpose (a transposed matrix costs a matmul nothing)."""
    (h, w), (rows, cols), (sh, sw) = size, taps, conv.stride
    g, (co, c, _, _) = conv.groups, weight.shape
    s_out, s_in, s_h, s_w = weight.stride()
    view = weight.as_strided((g, rows.out, cols.out, co // g, h, w, c),
                             (co // g * s_out, sh * s_h, sw * s_w, s_out, s_h, s_w, s_in),
                             weight.storage_offset() + starts[0] * s_h + starts[1] * s_w)
    return view.flip(1, 2).reshape(g, -1, h * w * c)


def dense_matmul(x: torch.Tensor, dense: torch.Tensor, bias: torch.Tensor | None, taps: tuple[Taps, Taps],
                 groups: int) -> torch.Tensor:
    """A grouped convolution of x as one batched matmul by each client's dense matrix (`dense_weights`):
    on a 2x2 map a 3x3 convolution's outputs read 4 inputs each, where `tap_matmul` multiplies 9 taps
    (docs/benchmarks.md). Out channels_last."""
    b, _, h, w = x.shape
    lhs = x.permute(0, 2, 3, 1).reshape(b, h * w, groups, -1).permute(2, 0, 1, 3).reshape(groups, b, -1)
    rhs = dense.transpose(1, 2)
    if bias is None:
        return client_maps(torch.bmm(lhs, rhs), b, taps)
    positions = taps[0].out * taps[1].out
    tiled = bias.view(groups, 1, 1, -1).expand(-1, -1, positions, -1).reshape(groups, 1, -1)
    return client_maps(torch.baddbmm(tiled, lhs, rhs), b, taps)


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


def bn_affine(bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, shift) per channel of bn in eval mode: bn(x) = x x scale + shift."""
    assert bn.running_mean is not None and bn.running_var is not None
    scale = torch.rsqrt(bn.running_var + bn.eps)
    shift = -bn.running_mean * scale
    if bn.affine:
        scale, shift = scale * bn.weight, shift * bn.weight + bn.bias
    return scale, shift


def fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """(weight, bias) of the one convolution that is bn(conv(x)) with bn in eval mode."""
    scale, shift = bn_affine(bn)
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
        copy_into(out, states)
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


def copy_into(out: nn.Module, states: Sequence[State]) -> None:
    """Each of out's parameters and buffers: the states' tensors of that name one after another
    along its first dimension, each copied into its block (in the block's memory format); a scalar
    (a batch counter) is zeroed."""
    with torch.no_grad():
        for name, t in out.state_dict().items():
            if not t.dim():
                t.zero_()
                continue
            for block, state in zip(t.chunk(len(states)), states, strict=True):
                block.copy_(state[name])


GROUPED: dict[type[nn.Module], Any] = {nn.Conv2d: GroupedConv2d, nn.BatchNorm2d: GroupedBatchNorm2d,
                                       nn.Linear: GroupedLinear, Normalize: GroupedNormalize}


CHANNELWISE: set[Any] = {operator.add, operator.iadd, torch.add, torch.relu, nn.functional.relu,
                         "add", "add_", "relu", "relu_"}  # operators and methods acting element by element


def is_layer(m: nn.Module) -> bool:
    """A module without submodules: one call in a traced forward (`LayerTracer`)."""
    return next(m.children(), None) is None


class LayerTracer(fx.Tracer):
    """Traces through containers down to layers (`is_layer`)."""

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return is_layer(m)


class Traced(NamedTuple):
    """A model's forward traced down to layers (`LayerTracer`; None for a model that is one layer,
    or whose forward does not trace) and what in it has no grouped form (None when all has one)."""

    graph: fx.Graph | None
    problem: str | None


def traced(model: nn.Module) -> Traced:
    """`model` traced and checked: a model that is one layer must be of a GROUPED or AS_IS type; any
    other's forward must trace (torch.fx) to such layers and flattening to (N, features), joined by
    CHANNELWISE operators and flattening, and call every layer that holds state."""
    if is_layer(model):
        return Traced(None, layer_problem("model", model))
    try:
        graph = LayerTracer().trace(model)
    except Exception as e:  # fx raises many kinds on code it cannot trace
        return Traced(None, f"forward cannot be traced by torch.fx ({type(e).__name__}: {e})")
    problems = (node_problem(node, model) for node in graph.nodes)
    return Traced(graph, next((p for p in problems if p), None) or uncalled_state(graph, model))


def node_problem(node: fx.Node, model: nn.Module) -> str | None:
    """Why one node of a traced forward has no grouped form (None when it has one)."""
    if node.op in ("placeholder", "output"):
        return None
    if node.op == "call_module":
        return layer_problem(str(node.target), model.get_submodule(str(node.target)))
    values = [*node.args, *node.kwargs.values()]
    if node.op != "get_attr" and (node.target in CHANNELWISE or flattens(node)) and all(
            isinstance(v, fx.Node | int | float | bool) for v in values):
        return None
    return f"{node.op} {getattr(node.target, '__name__', node.target)} has no grouped form"


def layer_problem(name: str, layer: nn.Module) -> str | None:
    """Why the layer `name` has no grouped form (None when it has one)."""
    if type(layer) is nn.BatchNorm2d and layer.momentum is None:
        return f"layer {name} (BatchNorm2d, momentum None) averages by its own batch counter"
    if type(layer) in GROUPED or type(layer) in AS_IS or (
            type(layer) is nn.Flatten and (layer.start_dim, layer.end_dim) == (1, -1)):
        return None
    return f"layer {name} ({type(layer).__name__}) has no grouped form"


def flattens(node: fx.Node) -> bool:
    """Whether `node` is torch.flatten(x, 1) or x.flatten(1): (N, features), client-major."""
    if node.target not in (torch.flatten, "flatten"):
        return False
    start = node.args[1] if len(node.args) > 1 else node.kwargs.get("start_dim", 0)
    end = node.args[2] if len(node.args) > 2 else node.kwargs.get("end_dim", -1)
    return (start, end) == (1, -1)


def uncalled_state(graph: fx.Graph, model: nn.Module) -> str | None:
    """The first state entry of `model` that no layer of `graph` holds (a layer never called)."""
    held = {f"{node.target}.{key}" for node in graph.nodes if node.op == "call_module"
            for key in model.get_submodule(str(node.target)).state_dict()}
    missing = [key for key in model.state_dict() if key not in held]
    return f"state {missing[0]} is held by no layer its forward calls" if missing else None


def groupable(model: nn.Module) -> bool:
    """True when every layer and operator of `model` has a grouped form (`traced`)."""
    return traced(model).problem is None


def group_layer(layer: nn.Module, states: Sequence[State]) -> nn.Module:
    """The layer `layer` grouped, client g's weights from states[g] (keyed as `layer.state_dict()`)."""
    if type(layer) in GROUPED:
        return GROUPED[type(layer)].of(layer, states)
    if type(layer) is nn.Flatten:  # flatten(1) only (`layer_problem`)
        return GroupedFlatten()
    return copy.deepcopy(layer)


def substate(state: State, name: str) -> State:
    """The entries of `state` under the submodule `name`, keyed as that submodule's own."""
    prefix = name + "."
    return {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}


class ConvBN(nn.Module):
    """A grouped convolution and the BatchNorm (with running statistics) that alone reads its output,
    in eval mode (attack passes) as one folded convolution (`GroupedConv2d.folded`), but on small
    maps (`GroupedConv2d.small_map`), where the weights are many and the outputs few, as the
    convolution then the BatchNorm's affine map (`GroupedConv2d.scaled`)."""

    conv: GroupedConv2d  # the network's own layers, not submodules of this one
    bn: GroupedBatchNorm2d

    def __init__(self, conv: GroupedConv2d, bn: GroupedBatchNorm2d) -> None:
        super().__init__()
        self.__dict__.update(conv=conv, bn=bn)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.bn.training:
            return self.bn(self.conv(x))
        if self.conv.small_map(x):
            return self.conv.scaled(self.conv(x), self.bn)
        return self.conv.folded(x, self.bn)


def grouped_body(template: nn.Module, graph: fx.Graph | None, states: Sequence[State]) -> nn.Module:
    """`template` grouped: a model that is one layer, that layer grouped; any other, its traced
    forward `graph` with each layer grouped (`group_layer`) and two pairs of layers run faster with
    the same values and gradients (`fold_batchnorm`, `pool_before_relu`)."""
    if graph is None:
        return group_layer(template, states)
    names = [str(n.target) for n in graph.nodes if n.op == "call_module"]
    layers = {name: group_layer(template.get_submodule(name), [substate(s, name) for s in states])
              for name in names}
    body = fx.GraphModule(layers, graph)
    fold_batchnorm(body)
    pool_before_relu(body)
    body.recompile()
    return body


def called(body: fx.GraphModule, node: object) -> nn.Module | None:
    """The layer of `body` that `node` calls (None for a node that calls none)."""
    if isinstance(node, fx.Node) and node.op == "call_module":
        return body.get_submodule(str(node.target))
    return None


def fold_batchnorm(body: fx.GraphModule) -> None:
    """Each grouped convolution whose output only a BatchNorm with running statistics reads becomes
    one call of the pair (`ConvBN`)."""
    folds = [(bn, *found) for bn in body.graph.nodes if (found := conv_bn(body, bn))]
    for i, (bn, conv, pair) in enumerate(folds):
        conv.target = f"folded{i}"
        body.add_submodule(conv.target, pair)
        bn.replace_all_uses_with(conv)
        body.graph.erase_node(bn)


def conv_bn(body: fx.GraphModule, bn: fx.Node) -> tuple[fx.Node, ConvBN] | None:
    """The node of the grouped convolution whose output `bn`, a BatchNorm with running statistics,
    alone reads, and the two layers as one `ConvBN` (None where `bn` is no such BatchNorm)."""
    conv, norm = bn.args[0] if bn.args else None, called(body, bn)
    layer = called(body, conv)
    if (isinstance(norm, GroupedBatchNorm2d) and norm.running_mean is not None and isinstance(conv, fx.Node)
            and isinstance(layer, GroupedConv2d) and len(conv.users) == 1):
        return conv, ConvBN(layer, norm)
    return None


def pool_before_relu(body: fx.GraphModule) -> None:
    """ReLU then max-pooling (the ReLU's input read by it alone) as max-pooling then ReLU: ReLU is
    monotone, so the maxima and the element each window's gradient goes to are the same, on 4x fewer
    values."""
    for relu in list(body.graph.nodes):
        x, users = relu.args[0] if relu.args else None, list(relu.users)
        if not (type(called(body, relu)) is nn.ReLU and len(users) == 1 and type(called(body, users[0])) is
                nn.MaxPool2d and isinstance(x, fx.Node) and len(x.users) == 1):
            continue
        pool = users[0]
        pool.replace_all_uses_with(relu)
        pool.args = (x, *pool.args[1:])
        relu.args = (pool,)
        pool.append(relu)


class GroupedNet(nn.Module):
    """len(states) models of `template`'s architecture as one, client g's weights, BN statistics
    and batch counters from states[g]; inputs and outputs stacked client-major (G*B rows)."""

    def __init__(self, template: nn.Module, states: Sequence[State]) -> None:
        super().__init__()
        graph, problem = traced(template)
        if problem:
            raise ValueError(f"the model cannot train grouped: its {problem}")
        self.groups = len(states)
        self.body = grouped_body(template, graph, states)
        self.keys = list(template.state_dict())

    def train(self, mode: bool = True) -> GroupedNet:
        """Set the mode (eval: `train(False)`); either switch drops what the convolutions keep for a
        frozen stretch in eval mode (`GroupedConv2d.keep`: folded BatchNorms, weights over taps)."""
        for m in self.modules():
            if isinstance(m, GroupedConv2d):
                m.kept.clear()
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
                    part.update({f"{name}.{k}" if name else k: v.detach().clone()
                                 for k, v in m.part(g, self.groups).items()})
        return [{k: p[k] for k in self.keys} for p in parts]


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
    are one grouped network (`grouped_network`), trained in this process on torch's threads."""
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


OPERATOR_MACS = 5e7  # multiply-accumulates per operator per client batch from which grouping gains nothing


def why_not_worth_it(workload: Workload, device: torch.device) -> str | None:
    """Why grouping would not speed up clients with this `workload` on `device` (None when it would),
    whatever the model: on a CPU, a forward whose operators average OPERATOR_MACS multiply-accumulates
    per client batch or more runs them near the core's peak one by one already, and grouping removes
    per-operator overhead (and oneDNN's slow small maps) that such work hides. Measured on one core
    (docs/benchmarks.md): 2.0-2.9x at 1 M MACs an operator (the quickstart), 2.0-2.2x at 9 M (resnet10
    on 8x8 digits), 1.2-1.4x at 18-20 M (smallcnn, cnn4), 1.05x at 110 M (vgg11 on 32x32) and 0.96x
    at 150 M (resnet10 on 32x32). On a GPU, where an operator that size is bound by its launch, grouping
    stays on (unmeasured)."""
    macs = workload.batch * sum(atom.macs for atom in workload.atoms)
    ops = sum(layer.ops for atom in workload.atoms for layer in atom.layers) or len(workload.atoms)
    if device.type != "cpu" or macs / ops < OPERATOR_MACS:
        return None
    return (f"operators average {macs / ops / 1e6:.0f} M multiply-accumulates per client batch, which one "
            f"by one already run near a CPU core's peak (grouping pays below {OPERATOR_MACS / 1e6:.0f} M)")


def why_one_by_one(model: nn.Module) -> str | None:
    """Why clients of `model`'s architecture train one by one, as a phrase (None when they group): a
    layer that draws random numbers in training or averages by its own batch counter
    (edgefl.profiling.layers.why_not_grouped), or one with no grouped form (`traced`)."""
    return why_not_grouped(model) or traced(model).problem


def grouped_network(template: nn.Module, states: Sequence[State]) -> GroupedNet:
    """The clients of `states` as one network, if their architecture groups (`why_one_by_one`)."""
    reason = why_not_grouped(template)
    if reason:
        raise ValueError(f"the model cannot train grouped: its {reason}")
    return GroupedNet(template, states)
