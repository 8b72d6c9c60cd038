"""The compute model: seconds of a Workload's local training on a device, layer by layer.

Every operator of one training iteration is charged by a roofline with a launch cost (Williams et
al., "Roofline", CACM 2009): time = max(FLOPs / sustained FLOP/s, bytes moved / memory bandwidth)
+ a fixed per-operator overhead, with figures per layer kind (conv, linear, norm, activation, pool,
elementwise) and pass (forward, input-gradient backward, weight-gradient backward). What runs, per
iteration of PGD-T adversarial training (Madry et al.; edgefl/attacks/pgd.py and
edgefl/training/local.py):

* the batch gather and the loss accumulation: BATCH_OPS elementwise operators on the input;
* the PGD start (PGD_START_OPS on the input), then T times: a forward of every layer, the loss, an
  input-gradient backward of every layer down to the image, and PGD_STEP_OPS elementwise
  operators on the input (sign, scale, add, the eps-ball projection, the [0, 1] clamp);
* per training pair: a forward, the loss, and a backward that takes input gradients where a layer
  below has weights and weight gradients where the layer has them;
* forward-only passes (TRADES's clean target), and one optimizer step: per parameter tensor,
  2 + 2 x slots elementwise operators over 3 + 2 x slots tensors of its size.

All figures are per batch; the result is divided by the co-running app's share of the device.
Pure functions over plain records: no torch here.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from edgefl.devices.profile import CONV_KINDS
from edgefl.devices.profile import KERNEL_KINDS as KINDS
from edgefl.sim.records import BYTES, AtomProfile, LayerProfile
from edgefl.sim.workload import Workload

FORWARD, INPUT_GRAD, WEIGHT_GRAD = "forward", "input_grad", "weight_grad"
PASSES = (FORWARD, INPUT_GRAD, WEIGHT_GRAD)
MATMUL_KINDS = (*CONV_KINDS, "linear")  # kinds whose backward has the forward's FLOPs
VIEW = "reshape"  # a view: no bytes move, only its overhead is paid
BATCH_OPS = 3  # gather x, gather y, add the loss to the running total
PGD_START_OPS = 3  # uniform noise, add, clamp
PGD_STEP_OPS = 8  # clone, sign, scale, add, x - eps, x + eps, max, min + clamp
LOSS_OPS = 2  # cross-entropy: log-softmax and NLL, each way


@dataclass(frozen=True)
class Roofline:
    """One (kind, pass): sustained FLOP/s, effective memory bandwidth (B/s), per-operator seconds."""

    flops: float
    bandwidth: float
    overhead_s: float

    def seconds(self, flops: float, nbytes: float, ops: int = 1) -> float:
        compute, memory, launches = self.terms(flops, nbytes, ops)
        return max(compute, memory) + launches

    def terms(self, flops: float, nbytes: float, ops: int = 1) -> tuple[float, float, float]:
        """The three terms of `seconds`: compute, memory (the larger of the two counts) and the
        operators' launches."""
        return flops / self.flops, nbytes / self.bandwidth, ops * self.overhead_s


@dataclass(frozen=True)
class Rooflines:
    """A device's rooflines: `table` holds ((kind, pass), Roofline) pairs; a (kind, pass) it lacks
    falls back to (kind, forward), then to (elementwise, pass). The fixed costs outside the operators
    come with them: seconds per local iteration, per PGD step and per client-round."""

    table: tuple[tuple[tuple[str, str], Roofline], ...]
    iteration_s: float = 0.0
    attack_step_s: float = 0.0
    round_s: float = 0.0

    @functools.cached_property
    def lookup(self) -> dict[tuple[str, str], Roofline]:
        return dict(self.table)

    def get(self, kind: str, pass_: str) -> Roofline:
        table = self.lookup
        found = table.get((kind, pass_)) or table.get((kind, FORWARD)) or table.get(("elementwise", pass_))
        return found or table[("elementwise", FORWARD)]

    @classmethod
    def uniform(cls, flops: float, bandwidth: float, overhead_s: float) -> Rooflines:
        """The same roofline for every kind and pass (a datasheet device)."""
        return cls(tuple(((k, p), Roofline(flops, bandwidth, overhead_s)) for k in KINDS for p in PASSES))


def pass_work(layer: LayerProfile, pass_: str, batch: int) -> tuple[float, float, int]:
    """(FLOPs, bytes moved, operators) of one pass of one layer over a batch.

    Forward reads its input and weights and writes its output. An input-gradient backward reads the
    output gradient and what the forward saved (counted as the output again) and the weights, and
    writes the input gradient. A weight-gradient backward reads the input and the output gradient and
    writes the weight gradient. Matmul kinds cost their forward FLOPs each way; other kinds their
    forward FLOPs in forward and input gradient, none for weights (their weights are per channel).
    """
    if layer.kind == VIEW:
        return 0.0, 0.0, max(1, layer.ops)
    fwd = 2.0 * layer.macs * batch
    weights = BYTES * layer.params
    if pass_ == FORWARD:
        return fwd, BYTES * batch * (layer.in_elems + layer.out_elems) + weights, max(1, layer.ops)
    if pass_ == INPUT_GRAD:
        return fwd, BYTES * batch * (layer.in_elems + 2 * layer.out_elems) + weights, max(1, layer.ops)
    flops = fwd if layer.kind in MATMUL_KINDS else 0.0
    return flops, BYTES * batch * (layer.in_elems + layer.out_elems) + weights, 1


def layers_of(atoms: tuple[AtomProfile, ...]) -> tuple[LayerProfile, ...]:
    """Every layer of the atoms in forward order; an atom profiled without layers counts as one
    layer (a conv if it has weights)."""
    return tuple(layer for a in atoms for layer in (a.layers or (_as_layer(a),)))


def _as_layer(a: AtomProfile) -> LayerProfile:
    return LayerProfile(a.name, "conv" if a.params else "elementwise", a.macs, a.params, a.in_elems,
                        a.out_elems, a.saved_bytes, ops=1, tensors=1 if a.params else 0)


@dataclass(frozen=True)
class Iteration:
    """What one local iteration runs (the Workload's fields that shape it)."""

    layers: tuple[LayerProfile, ...]
    batch: int
    attack_steps: int
    train_pairs: int
    extra_forwards: int
    slots: int
    classes: int  # the last layer's outputs, what the loss reads
    micro: int = 1  # micro-batches per batch (the swap walk's plan); one optimizer step per batch


def iteration_of(w: Workload, micro: int = 1) -> Iteration:
    layers = layers_of(w.atoms)
    return Iteration(layers, w.batch, w.attack_steps, w.train_pairs, w.extra_forwards, w.slots,
                     layers[-1].out_elems, micro)


@dataclass(frozen=True)
class Work:
    """Operators one iteration runs `times` times: a layer's pass, or elementwise work (`label`
    says which: the batch gather, the loss, an attack step, the optimizer)."""

    label: str
    kind: str
    pass_: str
    flops: float
    nbytes: float
    ops: int
    times: int


def iteration_work(it: Iteration) -> tuple[Work, ...]:
    """Everything one local iteration runs: every pass once per micro-batch (the same FLOPs, more
    operators), the optimizer step once per batch, and only where the iteration trains (a forward
    pass alone updates nothing)."""
    b, layers, m, t = it.batch // it.micro, it.layers, it.micro, it.attack_steps
    image = b * layers[0].in_elems
    work = [_elementwise("batch", image, BATCH_OPS, 2, m),
            _elementwise("loss", b * it.classes, LOSS_OPS, 2, 2 * m * (t + it.train_pairs))]
    if t:
        work += [_elementwise("attack", image, PGD_START_OPS, 2, m),
                 _elementwise("attack", image, PGD_STEP_OPS, 2, m * t)]
    below = False
    for x in layers:
        work.append(Work(x.kind, x.kind, FORWARD, *pass_work(x, FORWARD, b),
                         m * (t + it.train_pairs + it.extra_forwards)))
        work.append(Work(x.kind, x.kind, INPUT_GRAD, *pass_work(x, INPUT_GRAD, b),
                         m * (t + (it.train_pairs if below else 0))))
        if x.params:
            work.append(Work(x.kind, x.kind, WEIGHT_GRAD, *pass_work(x, WEIGHT_GRAD, b), m * it.train_pairs))
            below = True
    tensors, params = sum(x.tensors for x in layers), sum(x.params for x in layers)
    if it.train_pairs:  # one step: per tensor 2 + 2 x slots operators over 3 + 2 x slots of its size
        work.append(_elementwise("optimizer", params, tensors * (2 + 2 * it.slots), 3 + 2 * it.slots, 1))
    return tuple(w for w in work if w.times and (w.ops or w.flops or w.nbytes))


def _elementwise(label: str, elems: float, ops: int, tensors: int, times: int) -> Work:
    """`ops` elementwise operators over `elems` elements, moving `tensors` tensors of that size."""
    return Work(label, "elementwise", FORWARD, 0.0, BYTES * elems * tensors, ops, times)


@functools.lru_cache(maxsize=4096)
def iteration_seconds(it: Iteration, roof: Rooflines) -> float:
    """Seconds of one local iteration at the device's full speed."""
    return sum(w.times * roof.get(w.kind, w.pass_).seconds(w.flops, w.nbytes, w.ops)
               for w in iteration_work(it))


def round_seconds(it: Iteration, iterations: int, extra_flops: float, roof: Rooflines,
                  share: float) -> float:
    """A round's compute seconds: its iterations with their fixed costs, plus one-off FLOPs (a Fisher
    pass) at the conv forward rate and the client-round's fixed cost, divided by the device `share`
    the co-running app leaves."""
    extra = extra_flops / roof.get("conv", FORWARD).flops
    per_iteration = iteration_seconds(it, roof) + fixed_seconds(it, roof)
    return (iterations * per_iteration + extra + roof.round_s) / share


def fixed_seconds(it: Iteration, roof: Rooflines) -> float:
    """One iteration's fixed cost outside its operators: the loop's, and each PGD step's."""
    return roof.iteration_s + it.attack_steps * roof.attack_step_s
