"""The compute model's figures fitted on measured step times (issues 36, 51), for the bundled
profiles (bench/published.py writes their `[fitted]` tables) and a user's own timings (`edgefl
devices fit`).

A measurement is one training step (or forward and backward) of a known model on a device, priced
by the compute model every run uses (edgefl.sim.compute, through edgefl.price) with each operator's
three terms kept apart: seconds at the full peak its kind runs at, seconds at the datasheet memory
bandwidth, and its count of operator launches. The fit sets, per layer kind and precision (conv,
conv3x3, dwconv, linear; fp16 and TF32 apart), the sustained share of that peak, the share of the
datasheet bandwidth sustained, per memory-bound kind (MEMORY_KINDS) the share of that its kernels
stream at, and the per-operator overhead in microseconds, so that

    predicted = sum over operators of times x (max(compute / share[kind],
                                                   memory / (bandwidth_share x memory_share[kind]))
                                               + launches x overhead_us)

matches the measurements in log seconds (least squares). Every figure means what it says: a share
is a logistic of its parameter, so it lies in (0, 1); the bandwidth share lies in
[BANDWIDTH_FLOOR, 1]; an overhead is an exponential, so it is positive. A 3x3, depthwise or linear
layer's share is its precision's dense convolution's plus its own deviation (KIND_PARENT).
Figures are shared by what the hardware is, not by which row it is: a parameter is the sum of
an architecture's (every CPU, every GPU: pulled toward its class default), its core or GPU
family's (a Cortex-A76, Apple's Firestorm cores, NVIDIA's Pascal: `family` in the profile), the
row's framework's (MNN beside PyTorch), and the device's own deviation, each deviation pulled
toward 0 by a ridge. A family differs in what its silicon does: its compute shares (FMA width,
tensor paths) and the share of its datasheet bandwidth its memory system sustains. The
per-operator overhead (the framework's dispatch on the host CPU) and the share a memory-bound
kernel streams at (the framework's kernel) are software's: they have no family part
(by_software), only the architecture's, the framework's and the device's. A device the fit has
never seen is predicted by its family and architecture from its datasheet peak and bandwidth
alone. The ridge is chosen by cross-validation over devices on the rows fitted (chosen_ridge), so
a prediction judged out of sample never steered it.
"""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from edgefl.devices.classes import CLASS_DEFAULTS, arch_of
from edgefl.devices.families import fitted_of
from edgefl.devices.profile import (
    BANDWIDTH_FLOOR,
    EFFICIENCY_KINDS,
    MEMORY_KINDS,
    DeviceProfile,
    Efficiencies,
    Fitted,
)
from edgefl.errors import EdgeflError
from edgefl.price import Step, iteration_for
from edgefl.sim.classes import device_rooflines, fitted_key
from edgefl.sim.compute import iteration_work
from edgefl.sim.records import AtomProfile

FIT_KINDS = EFFICIENCY_KINDS  # the layer kinds whose share of peak is fitted
OVERHEAD = "overhead"  # the key of the (log) per-operator overhead, microseconds
BANDWIDTH = "bandwidth"  # the key of the (logit) sustained share of the datasheet bandwidth
FACTORS = (OVERHEAD, BANDWIDTH)  # keys every row has
LEVELS = ("arch", "family", "framework", "device")  # a parameter's parts, broadest first
SOFTWARE_LEVELS = ("arch", "framework", "device")  # the parts of a key that is software's (by_software)
BANDWIDTH_PRIOR = 0.5  # the sustained share of a datasheet bandwidth before evidence (STREAM: 0.4-0.8)
MEMORY_PRIOR = 0.7  # the share of that a memory-bound kernel streams at, before evidence
MEMORY = "mem:"  # the prefix of a memory-bound kind's share key (mem:norm, mem:dwconv, ...)
RIDGE_ARCH = 0.1  # residual weight of an architecture's distance from its class defaults
RIDGES = (10.0, 3.0, 1.0, 0.3, 0.1)  # the deviations' ridges chosen_ridge tries
RIDGE = 1.0  # the deviations' ridge where there are too few devices to choose one (a user's own)
FOLDS = 5  # chosen_ridge's cross-validation folds (of devices)
KIND_PARENT = {"conv3x3": "conv", "dwconv": "conv", "linear": "conv"}  # (parent): GEMMs all
US = 1e-6
# Figures of 1: every fitted kind at its full peak in any precision, the datasheet bandwidth, 1 us
# per operator (the kinds not fitted at their class's share, as runs charge them): what a
# measurement is priced at before the fit scales each term
UNIT = Fitted({f"{k}{at}": 1.0 for k in EFFICIENCY_KINDS for at in ("", "@fp16", "@bf16", "@int8", "@tf32")},
              bandwidth_share=1.0, op_overhead_us=1.0)


@dataclass(frozen=True)
class Priced:
    """One measurement with its step's operators priced apart, one array entry per operator."""

    id: str
    device: str
    family: str  # the profile's `family`, "" = its architecture's only
    arch: str  # "cpu" or "gpu" (edgefl.devices.classes.arch_of)
    framework: str  # "pytorch", "mnn", ...
    group: str  # the kind of hardware a report groups it by (sbc_cpu, discrete_gpu, ...)
    model: str  # the model priced (its architecture family groups near-twins: model_family)
    seconds: float  # measured, per step
    keys: tuple[str, ...]  # each operator's share key (KIND or KIND@fp16), "" for a fixed one
    mkeys: tuple[str, ...]  # each operator's memory share key (mem:KIND), "" for none (a matmul's)
    compute: np.ndarray  # seconds at the full peak of its kind and precision, x times
    memory: np.ndarray  # seconds at the datasheet bandwidth
    launches: np.ndarray  # operator launches
    class_share: float  # its class's efficiency: the prior of every share
    class_overhead_us: float
    bandwidth_gbps: float  # the datasheet bandwidth the profile gives (or its class's)

    def part(self, level: str) -> str:
        return str(getattr(self, level))


def priced(id_: str, group: str, seconds: float, step: Step, atoms: tuple[AtomProfile, ...],
           device: DeviceProfile, framework: str = "pytorch", optimizer_step: bool = True) -> Priced:
    """A measurement of `step` on `device` taking `seconds`, priced operator by operator (without
    the optimizer's step where the measurement ran none)."""
    d = CLASS_DEFAULTS[device.device_class]
    roof = device_rooflines(replace(device, efficiency_by_kind=Efficiencies(), fitted=UNIT), step.precision)
    keys, mkeys, rows = [], [], []
    for w in iteration_work(iteration_for(step, atoms)):
        if w.label == "optimizer" and not optimizer_step:
            continue
        c, m, o = roof.get(w.kind, w.pass_).terms(w.flops, w.nbytes, w.ops)
        fitted = w.kind in FIT_KINDS
        keys.append(fitted_key(device, w.kind, step.precision) if fitted else "")
        mkeys.append(MEMORY + w.kind if w.kind in MEMORY_KINDS else "")
        rows.append((w.times * c, w.times * m, w.times * o / US))
    compute, memory, launches = (np.array(col) for col in zip(*rows, strict=True))
    return Priced(id_, device.name, device.family, arch_of(device), framework, group, step.model, seconds,
                  tuple(keys), tuple(mkeys), compute, memory, launches, d.efficiency, d.overhead_us,
                  device.memory_bandwidth_gbps or d.bandwidth_gbps)


def logit(x: float) -> float:
    """The parameter of a share `x` (clipped inside (0, 1))."""
    x = min(max(x, 1e-9), 1 - 1e-9)
    return math.log(x / (1 - x))


def parent(k: str) -> str:
    """The share key whose parameter `k`'s deviates from ("" for none): a 3x3, depthwise or
    linear layer's share is a dense convolution's in the same precision plus its own deviation,
    so a kind few rows exercise (a transformer's linear layers) keeps what convolutions show."""
    kind, at, precision = k.partition("@")
    up = KIND_PARENT.get(kind, "")
    return f"{up}{at}{precision}" if up else ""


def by_software(k: str) -> bool:
    """Whether key `k` is the framework's rather than the silicon's (module docstring): the
    per-operator overhead and the memory-bound kinds' streaming shares."""
    return k == OVERHEAD or k.startswith(MEMORY)


def levels(k: str) -> tuple[str, ...]:
    """The levels whose parts key `k`'s parameter sums (a software key has no family part)."""
    return SOFTWARE_LEVELS if by_software(k) else LEVELS


def above_floor(share: float) -> float:
    """Where a bandwidth share lies between BANDWIDTH_FLOOR and 1 (the logistic its parameter gives)."""
    return (share - BANDWIDTH_FLOOR) / (1 - BANDWIDTH_FLOOR)


def prior(p: Priced, k: str) -> float:
    """The architecture-level parameter before evidence: the class's figures (0, no deviation,
    for a key with a parent)."""
    if parent(k):
        return 0.0
    if k == OVERHEAD:
        return math.log(p.class_overhead_us)
    if k == BANDWIDTH:
        return logit(above_floor(BANDWIDTH_PRIOR))
    return logit(MEMORY_PRIOR if k.startswith(MEMORY) else p.class_share)


def shares(z: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-z))


@dataclass(frozen=True)
class Fit:
    """Parameters by (level, name, key): the architecture's in logit (log for the overhead) units,
    the other levels' deviations added to it."""

    params: dict[tuple[str, str, str], float]

    def z(self, p: Priced, k: str) -> float:
        top = self.params.get(("arch", p.arch, k), prior(p, k))
        own = top + sum(self.params.get((lv, p.part(lv), k), 0.0) for lv in LEVELS[1:])
        return own + (self.z(p, parent(k)) if parent(k) else 0.0)

    def share(self, p: Priced, k: str) -> float:
        """The fitted share of peak of key `k` (of the datasheet bandwidth for BANDWIDTH, at least
        BANDWIDTH_FLOOR; of that sustained bandwidth for a memory key)."""
        s = float(shares(np.array(self.z(p, k))))
        return BANDWIDTH_FLOOR + (1 - BANDWIDTH_FLOOR) * s if k == BANDWIDTH else s

    def overhead_us(self, p: Priced) -> float:
        return math.exp(self.z(p, OVERHEAD))

    def predict(self, p: Priced) -> float:
        eff = np.array([self.share(p, k) if k else 1.0 for k in p.keys])
        streams = np.array([self.share(p, k) if k else 1.0 for k in p.mkeys]) * self.share(p, BANDWIDTH)
        bound, moved, launch = operator_seconds(p.compute, p.memory, p.launches, eff, streams,
                                                self.overhead_us(p))
        return float(np.sum(bound) + np.sum(moved) + np.sum(launch))


def operator_seconds(compute: np.ndarray, memory: np.ndarray, launches: np.ndarray, efficiency: np.ndarray,
                     bandwidth_share: np.ndarray | float, overhead_us: np.ndarray | float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each operator's compute-bound and memory-bound seconds (0 where the other binds) and its
    launches' seconds at these shares and overhead (module docstring)."""
    busy, moving = compute / efficiency, memory / bandwidth_share
    computes = busy > moving
    return np.where(computes, busy, 0.0), np.where(computes, 0.0, moving), launches * overhead_us * US


def fit(rows: Sequence[Priced], ridge: float = RIDGE, base: Fit | None = None) -> Fit:
    """The hierarchical least-squares fit (module docstring) of `rows`, each level's deviations
    pulled toward 0 with weight `ridge`, each architecture toward its class's figures (or those
    `base` gives its devices: a profile's `[fitted]` table, for a user's own timings)."""
    used = {p.id: {*p.keys, *map(parent, p.keys), *p.mkeys, *FACTORS} - {""} for p in rows}
    names = sorted({(lv, p.part(lv), k) for p in rows for k in used[p.id] for lv in levels(k)
                    if lv == "arch" or p.part(lv)})
    index = {n: i for i, n in enumerate(names)}
    first = {(p.arch, k): p for p in reversed(rows) for k in used[p.id]}
    base = base or Fit({})

    def begin(arch: str, k: str) -> float:  # base's own part of the key (its parent's apart)
        p = first[(arch, k)]
        return base.z(p, k) - (base.z(p, parent(k)) if parent(k) else 0.0)
    start = np.array([begin(n[1], n[2]) if n[0] == "arch" else 0.0 for n in names])
    weights = np.array([RIDGE_ARCH if n[0] == "arch" and not parent(n[2]) else ridge for n in names])
    none = len(names)  # a fixed slot holding 0

    def at(k: str, p: Priced) -> list[int]:
        return [index.get((lv, p.part(lv), key), none) if key else none
                for key in (k, parent(k) if k else "") for lv in LEVELS]

    op = np.array([at(k, p) for p in rows for k in p.keys]).T  # (key, parent) x LEVELS x operators
    fixed = np.concatenate([[not k for k in p.keys] for p in rows])
    mop = np.array([at(k, p)[:len(LEVELS)] for p in rows for k in p.mkeys]).T  # LEVELS x operators
    unstreamed = np.concatenate([[not k for k in p.mkeys] for p in rows])
    oh, bw = (np.array([at(k, p) for p in rows]).T for k in FACTORS)
    row = np.concatenate([np.full(len(p.keys), i) for i, p in enumerate(rows)])
    compute, memory, launches = (np.concatenate([getattr(p, c) for p in rows])
                                 for c in ("compute", "memory", "launches"))
    measured = np.log([p.seconds for p in rows])

    def terms(theta: np.ndarray) -> tuple[np.ndarray, ...]:
        """Each row's seconds, and the derivatives' parts: per operator its compute-bound seconds x
        (1 - share) and memory-bound seconds x (1 - memory share), per row its memory-bound seconds
        x d log bandwidth / d z and its launches' seconds."""
        full = np.append(theta, 0.0)
        eff = np.where(fixed, 1.0, shares(full[op].sum(0)))
        stream = np.where(unstreamed, 1.0, shares(full[mop].sum(0)))
        s = shares(full[bw].sum(0))
        band, over = BANDWIDTH_FLOOR + (1 - BANDWIDTH_FLOOR) * s, np.exp(full[oh].sum(0))
        bound, moved, launch = operator_seconds(compute, memory, launches, eff, band[row] * stream, over[row])
        total = np.bincount(row, weights=bound + moved + launch, minlength=len(rows))
        slope = (1 - BANDWIDTH_FLOOR) * s * (1 - s) / band
        return total, bound * (1 - eff), moved * (1 - stream), \
            np.bincount(row, weights=moved, minlength=len(rows)) * slope, \
            np.bincount(row, weights=launch, minlength=len(rows))

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.concatenate([np.log(terms(theta)[0]) - measured, weights * (theta - start)])

    def jacobian(theta: np.ndarray) -> np.ndarray:
        total, bound, streamed, moved, launch = terms(theta)
        jac, each = np.zeros((len(rows), none + 1)), np.arange(len(rows))
        for level in op:  # d seconds / d z = -(compute-bound seconds) x (1 - share)
            np.add.at(jac, (row, level), -bound)
        for level in mop:
            np.add.at(jac, (row, level), -streamed)
        for level in bw:
            np.add.at(jac, (each, level), -moved)
        for level in oh:
            np.add.at(jac, (each, level), launch)
        return np.vstack([jac[:, :none] / total[:, None], np.diag(weights)])

    theta = least_squares(residuals, start, jac=jacobian, method="trf", tr_solver="lsmr").x
    return Fit(dict(zip(names, theta, strict=True)))


def chosen_ridge(rows: Sequence[Priced]) -> float:
    """The ridge among RIDGES whose predictions of `rows` err least (mean squared log ratio), each
    row predicted by the fit of the other folds of devices (every FOLDS-th device): how far a
    family, a framework or a device may move from the figures it shares."""
    devices = sorted({p.device for p in rows})
    folds = [set(devices[k::FOLDS]) for k in range(min(FOLDS, len(devices)))]
    if len(folds) < 2:
        return RIDGE

    def error(ridge: float) -> float:
        out = []
        for held in folds:
            f = fit([o for o in rows if o.device not in held], ridge)
            out += [math.log(f.predict(p) / p.seconds) ** 2 for p in rows if p.device in held]
        return float(np.mean(out))
    return min(RIDGES, key=error)


def left_out(rows: Sequence[Priced], by: str = "id", ridge: float | None = None,
             base: Fit | None = None) -> dict[str, float]:
    """Each row's predicted seconds from the fit of every row that shares neither its `by` (its own
    id; "device": its device; "group": its device and architecture family, `model_family`) nor its
    architecture's absence: the fit never saw it, and without a `ridge` that fit's ridge is chosen
    on the rows it fits (nested), so the row predicted steers neither; `base` as for `fit`."""
    out, fits = {}, {}
    for p in rows:
        held = held_key(p, by)
        if held not in fits:
            mine = [o for o in rows if o.arch == p.arch and held_key(o, by) != held]
            chosen = chosen_ridge(mine) if ridge is None else ridge
            fits[held] = fit(mine, chosen, base) if mine else base or Fit({})
        out[p.id] = fits[held].predict(p)
    return out


def held_key(p: Priced, by: str) -> str:
    return {"id": p.id, "device": p.device, "group": f"{p.device}/{model_family(p.model)}"}[by]


def model_family(model: str) -> str:
    """A model's architecture family: resnet18 and timm:resnet50 are resnet, mobilenet_v2 and
    timm:mobilenetv2_100 mobilenetv, vgg16_bn vgg."""
    name = model.rpartition(":")[2].lower().replace("_v", "v")
    found = re.match(r"[a-z]+", name)
    return found.group(0) if found else name


def profile_fit(device: DeviceProfile) -> Fit:
    """What a run charges `device` as a Fit of its architecture: its `[fitted]` table, else its
    family's (edgefl.devices.families), else its own or its class's efficiency, overhead and (nearly:
    a share of 0.99 that a fit can still move) its whole datasheet bandwidth."""
    f, arch, d = fitted_of(device.family, device.fitted), arch_of(device), CLASS_DEFAULTS[device.device_class]
    if not f.efficiency:
        share = device.efficiency or d.efficiency
        f = Fitted({k: getattr(device.efficiency_by_kind, k) or share for k in FIT_KINDS},
                   bandwidth_share=0.99, op_overhead_us=device.op_overhead_us or d.overhead_us)
    below = logit(CLASS_DEFAULTS[device.device_class].efficiency)  # a parent the table lacks: its prior
    own = {k: logit(v) - (logit(f.efficiency.get(parent(k), 0.0)) if parent(k) in f.efficiency else below)
           if parent(k) else logit(v) for k, v in f.efficiency.items()}
    return Fit({**{("arch", arch, k): v for k, v in own.items()},
                **{("arch", arch, MEMORY + k): logit(f.memory.get(k, 1.0)) for k in MEMORY_KINDS},
                ("arch", arch, BANDWIDTH): logit(above_floor(f.bandwidth_share)),
                ("arch", arch, OVERHEAD): math.log(max(f.op_overhead_us, 1e-6))})


def read_measurements(path: Path, device: str) -> list[dict[str, str]]:
    """The rows of a measurements CSV (the evidence table's columns: `model` or `price_model`,
    `batch`, `seconds_per_step`, and optionally `input`, `classes`, `price_precision` or `precision`,
    `optimizer`, `id`) for `device`: those whose `profile` is it, or every row of a file without
    that column."""
    where = str(path)
    try:
        with path.open(encoding="utf-8-sig", newline="") as f:
            rows = list(csv.DictReader(f))
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise EdgeflError(where, "file", f"cannot read it as CSV ({exc})") from None
    mine = [r for r in rows if r.get("profile", device) == device and (r.get("use") or "fit") == "fit"]
    for need in ("batch", "seconds_per_step"):
        if rows and need not in rows[0]:
            raise EdgeflError(where, need, "missing column; the file needs model (or price_model), batch "
                              "and seconds_per_step")
    if not mine:
        raise EdgeflError(where, device, "no row measures this device (its `profile` column) to fit on")
    for i, r in enumerate(mine, 2):
        if not (r.get("batch", "").isdigit() and (r.get("classes") or "0").isdigit()
                and _positive(r.get("seconds_per_step", ""))):
            raise EdgeflError(where, f"row {r.get('id') or i}", "needs a whole batch (and classes, where "
                              "given) and positive seconds_per_step")
    return mine


def _positive(text: str) -> bool:
    try:
        return 0 < float(text) < math.inf
    except ValueError:
        return False
