"""`edgefl price`: what one step of a model costs on a device, with no scenario (issue 36).

The model, a zoo name, `torchvision:NAME` (any torchvision classification model, profiled as it is,
one atom) or `timm:NAME` (any timm model, where timm is installed), is profiled on the CPU
(edgefl.profiling); one iteration is priced by the compute model every run uses (edgefl.sim.compute:
per layer kind and pass, max(FLOPs / sustained FLOP/s, bytes / bandwidth) + operators x overhead,
Williams et al., "Roofline", CACM 2009) on the device's rooflines in the asked precision
(edgefl.sim.classes), and its memory by the MemReq estimator (edgefl.sim.records). A `train` step is
one iteration of PGD-K adversarial training (K = 0: plain training) with the optimizer's step; a
`forward` pass is one forward over the batch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from edgefl.config import MAX_BATCH
from edgefl.devices.profile import PRECISION_BYTES, DeviceProfile
from edgefl.errors import EdgeflError
from edgefl.sim.classes import device_rooflines
from edgefl.sim.compute import Iteration, fixed_seconds, iteration_work, layers_of
from edgefl.sim.records import BYTES, AtomProfile, mem_parts

WHERE = "edgefl price"
SLOTS = {"sgd": 0, "momentum": 1, "adam": 2}  # optimizer state tensors per parameter
PASSES = ("train", "forward")


@dataclass(frozen=True)
class Step:
    """What is priced."""

    model: str
    batch: int
    input_shape: tuple[int, ...]
    classes: int
    pass_: str = "train"
    attack_steps: int = 0
    optimizer: str = "sgd"
    precision: str = "fp32"


@dataclass(frozen=True)
class KindCost:
    """One layer kind's (or the batch's, the loss's, the attack's, the optimizer's) share of a step:
    its seconds split into compute-, memory- and overhead-bound seconds."""

    kind: str
    seconds: float
    flops: float
    compute_s: float
    memory_s: float
    overhead_s: float

    @property
    def bound(self) -> str:
        parts = {"compute": self.compute_s, "memory": self.memory_s, "overhead": self.overhead_s}
        return max(parts, key=lambda k: parts[k])


@dataclass(frozen=True)
class Price:
    step: Step
    device: str
    seconds: float
    flops: float
    mem_req_bytes: float
    memory_bytes: float
    kinds: tuple[KindCost, ...]

    def as_json(self) -> dict[str, Any]:
        step = asdict(self.step)
        step["pass"] = step.pop("pass_")
        return {**step, "device": self.device, "seconds": self.seconds, "flops": self.flops,
                "mem_req_bytes": self.mem_req_bytes, "memory_bytes": self.memory_bytes,
                "fits": self.mem_req_bytes <= self.memory_bytes,
                "kinds": [{**asdict(k), "bound": k.bound} for k in self.kinds]}


def step_for(model: str, batch: int, input_: str | None, classes: int | None, **given: Any) -> Step:
    """The step of `model` at `batch`: one sample `input_` ("C,H,W"; the default 3,32,32 for the
    zoo, 3,224,224 for torchvision and timm) and `classes` outputs (10 or 1000 when 0 or None)."""
    from edgefl.models.vision import is_vision

    vision = is_vision(model)
    shape = _shape(input_) if input_ else ((3, 224, 224) if vision else (3, 32, 32))
    return Step(model, batch, shape, classes or (1000 if vision else 10), **given)


def _shape(text: str) -> tuple[int, ...]:
    parts = text.replace("x", ",").split(",")
    if not all(p.strip().isdigit() for p in parts):
        raise EdgeflError(WHERE, "--input", f"{text!r} is not C,H,W (e.g. 3,32,32)")
    return tuple(int(p) for p in parts)


def atoms_of(step: Step) -> tuple[AtomProfile, ...]:
    """The atoms of the step's model (edgefl.profiling, on the CPU) at its input; one line for an
    unknown model or an input it cannot take."""
    from edgefl.models import MODELS, build_model
    from edgefl.models.vision import is_vision, whole_model
    from edgefl.profiling import profile_model

    name, c = step.model, step.input_shape[0]
    if not is_vision(name) and name not in MODELS.names():
        raise EdgeflError(WHERE, name, f"no such model; the zoo has {', '.join(MODELS.names())}, any "
                          "torchvision classification model is torchvision:NAME, any timm model timm:NAME")
    try:
        if is_vision(name):
            model = whole_model(name, step.classes, step.input_shape, WHERE)
        else:
            model = build_model(name, step.classes, step.input_shape, [0.5] * c, [0.25] * c)
        return profile_model(model, name).atoms
    except (RuntimeError, ValueError) as exc:
        why = (str(exc).strip().splitlines() or [""])[0][:200]
        raise EdgeflError(WHERE, "--input", f"{name} cannot take one sample of "
                          f"{'x'.join(map(str, step.input_shape))} ({why})") from None


def check(step: Step, device: DeviceProfile) -> None:
    """One line for a step no device could run, or one this device's profile cannot price."""
    bad = [("--pass", step.pass_ in PASSES, f"must be one of {', '.join(PASSES)}"),
           ("--optimizer", step.optimizer in SLOTS, f"must be one of {', '.join(SLOTS)}"),
           ("--precision", step.precision in PRECISION_BYTES, f"must be one of {', '.join(PRECISION_BYTES)}"),
           ("--batch", 1 <= step.batch <= MAX_BATCH, f"must be 1 to {MAX_BATCH}"),
           ("--attack-steps", 0 <= step.attack_steps <= 1000, "must be 0 to 1000"),
           ("--attack-steps", not (step.attack_steps and step.pass_ == "forward"),
            "a forward pass crafts no perturbation; use --pass train"),
           ("--classes", 1 <= step.classes <= 1_000_000, "must be 1 to 1000000"),
           ("--input", len(step.input_shape) == 3 and all(1 <= n <= 16384 for n in step.input_shape),
            "must be C,H,W, each 1 to 16384")]
    for key, ok, fix in bad:
        if not ok:
            raise EdgeflError(WHERE, key, fix)
    if step.precision != "fp32" and not device.peak(step.precision):
        key = "int8_gops" if step.precision == "int8" else f"{step.precision}_gflops"
        raise EdgeflError(WHERE, f"{device.name}: {key}", f"the profile gives no {step.precision} peak; "
                          "add it with its source (precision_source), or price --precision fp32")


def price(step: Step, atoms: tuple[AtomProfile, ...], device: DeviceProfile) -> Price:
    """The step's seconds, FLOPs and MemReq on `device` (its profiled `atoms`): what a run charges
    for one iteration, its fixed cost outside the operators (a calibrated host's) included."""
    check(step, device)
    roof, it = device_rooflines(device, step.precision), iteration_for(step, atoms)
    kinds: dict[str, list[float]] = {}
    for w in iteration_work(it):
        compute, memory, overhead = roof.get(w.kind, w.pass_).terms(w.flops, w.nbytes, w.ops)
        bound = (compute, 0.0) if compute >= memory else (0.0, memory)
        totals = kinds.setdefault(w.label, [0.0] * 4)
        for i, x in enumerate((w.flops, *bound, overhead)):
            totals[i] += w.times * x
    fixed = fixed_seconds(it, roof) if it.train_pairs else 0.0  # the training loop's own
    if fixed:
        kinds["fixed"] = [0.0, 0.0, 0.0, fixed]
    costs = tuple(KindCost(k, c + m + o, f, c, m, o) for k, (f, c, m, o) in kinds.items())
    return Price(step, device.name, sum(k.seconds for k in costs), sum(k.flops for k in costs),
                 mem_need(step, atoms), device.memory_bytes, costs)


def iteration_for(step: Step, atoms: tuple[AtomProfile, ...]) -> Iteration:
    """The iteration the compute model prices for `step`."""
    layers, train = layers_of(atoms), step.pass_ == "train"
    return Iteration(layers, step.batch, step.attack_steps if train else 0, 1 if train else 0,
                     0 if train else 1, SLOTS[step.optimizer], layers[-1].out_elems)


def mem_need(step: Step, atoms: tuple[AtomProfile, ...]) -> float:
    """MemReq (edgefl.sim.records) at the step's precision: activations and workspace in it; the
    weights, gradients and optimizer state of training in fp32 (as mixed precision keeps them),
    a forward pass's weights in its precision and nothing saved for a backward."""
    train, scale = step.pass_ == "train", PRECISION_BYTES[step.precision] / BYTES
    state, saved, work = mem_parts(atoms, step.batch, SLOTS[step.optimizer], step.attack_steps > 0)
    if train:
        return state + scale * (saved + work)
    return scale * (sum(a.param_bytes for a in atoms) + work)


def lines(p: Price) -> list[str]:
    """The price as printed: a heading, the totals, one row per kind."""
    s = p.step
    shape = "x".join(map(str, s.input_shape))
    what = (f"train step (PGD-{s.attack_steps} adversarial)" if s.attack_steps else "train step") \
        if s.pass_ == "train" else "forward pass"
    out = [f"{s.model} on {p.device}: {what}, batch {s.batch} of {shape}, {s.classes} classes, "
           f"{s.precision}" + (f", {s.optimizer}" if s.pass_ == "train" else ""),
           f"  {p.seconds:.4g} s per iteration, {p.flops:.3g} FLOPs "
           f"({p.flops / p.seconds / 1e9:.3g} GFLOP/s), "
           f"MemReq {p.mem_req_bytes / 1e6:.1f} MB of {p.memory_bytes / 1e6:.0f} MB"
           + ("" if p.mem_req_bytes <= p.memory_bytes else " (does not fit: a run would swap)"),
           f"  {'kind':<12}{'seconds':>10}{'share':>7}{'compute':>10}{'memory':>10}{'overhead':>10}  bound"]
    for k in sorted(p.kinds, key=lambda k: -k.seconds):
        out.append(f"  {k.kind:<12}{k.seconds:>10.4g}{k.seconds / p.seconds:>7.1%}{k.compute_s:>10.3g}"
                   f"{k.memory_s:>10.3g}{k.overhead_s:>10.3g}  {k.bound}")
    return out
