"""Per-kind efficiencies fitted on measured step times (issue 36), for the published evidence
(bench/published.py) and a user's own timings (`edgefl devices fit`).

A measurement is one training step (or forward pass) of a known model on a device, priced by the
compute model every run uses (edgefl.sim.compute, through edgefl.price) with each operator's three
terms kept apart: compute seconds at the device's full peak, memory seconds, launch overhead. The
fit sets the sustained share of peak per layer kind and precision (conv, conv3x3, dwconv, linear;
fp32 apart from fp16), a factor on the memory bandwidth (the class figures are estimates) and one
on the per-operator overhead, so that

    predicted = sum over operators of times x (max(compute / efficiency[kind],
                                                   memory / bandwidth_factor)
                                               + overhead x overhead_factor)

matches the measurements in log seconds (least squares). Efficiencies are hierarchical: one per
group (a kind of hardware: every SBC, every discrete GPU) and a device's own deviation from its
group's, each pulled toward its prior by a ridge (a group's toward its class default, RIDGE_DEVICE
toward what the device's profile says against its class: its own `efficiency`, or none), so that a
device with few rows keeps its group's figures and a kind no row exercises keeps its prior. How
hard a group is pulled is chosen on its rows by cross-validation (chosen_ridge): the evidence on a
Raspberry Pi moves the sbc class further from its estimate than a few rows of a kind would. An
fp32 dense convolution on a device with a TF32 peak is its own key (KIND@tf32), as fp16 is.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from edgefl.devices.classes import CLASS_DEFAULTS
from edgefl.devices.profile import EFFICIENCY_KINDS, DeviceProfile, Efficiencies
from edgefl.errors import EdgeflError
from edgefl.price import Step, iteration_for
from edgefl.sim.classes import device_rooflines
from edgefl.sim.compute import iteration_work
from edgefl.sim.records import AtomProfile

FIT_KINDS = EFFICIENCY_KINDS  # the kinds a profile's [efficiency_by_kind] may set
OVERHEAD = "overhead"  # the key of the (log) factor on the per-operator overhead
BANDWIDTH = "bandwidth"  # the key of the (log) factor on the memory bandwidth
FACTORS = (OVERHEAD, BANDWIDTH)  # keys every row has, of factors whose prior is 1
RIDGE_GROUP = 0.3  # residual weight of one group log-efficiency's distance from the class default
RIDGES = (0.3, 0.1, 0.05, 0.03)  # the group ridges chosen_ridge tries
FOLDS = 5  # chosen_ridge's cross-validation folds
RIDGE_DEVICE = 1.0  # residual weight of one device log-efficiency's distance from its group's


@dataclass(frozen=True)
class Priced:
    """One measurement with its step's operators priced at full peak, one array entry per operator."""

    id: str
    device: str
    group: str
    seconds: float  # measured, per step
    keys: tuple[str, ...]  # each operator's efficiency key (KIND or KIND@fp16), "" for a fixed one
    compute: np.ndarray  # seconds at the device's full peak in the step's precision, x times
    memory: np.ndarray
    overhead: np.ndarray
    prior: float  # the efficiency the profile gives (or its class's)
    class_prior: float  # its class's efficiency
    overhead_us: float  # the per-operator overhead the profile gives (or its class)
    bandwidth_gbps: float  # the memory bandwidth the profile gives (or its class)


def priced(id_: str, group: str, seconds: float, step: Step, atoms: tuple[AtomProfile, ...],
           device: DeviceProfile) -> Priced:
    """A measurement of `step` on `device` taking `seconds`, priced operator by operator."""
    full = replace(device, efficiency=1.0, efficiency_by_kind=Efficiencies())  # every kind at its peak
    roof, d = device_rooflines(full, step.precision), CLASS_DEFAULTS[device.device_class]
    prior = device.efficiency or d.efficiency
    keys, rows = [], []
    for w in iteration_work(iteration_for(step, atoms)):
        c, m, o = roof.get(w.kind, w.pass_).terms(w.flops, w.nbytes, w.ops)
        fitted = w.kind in FIT_KINDS
        keys.append(key(w.kind, "tf32" if device.runs_tf32(w.kind, step.precision) else step.precision)
                    if fitted else "")
        rows.append((w.times * (c if fitted else c / prior), w.times * m, w.times * o))
    compute, memory, overhead = (np.array(col) for col in zip(*rows, strict=True))
    return Priced(id_, device.name, group, seconds, tuple(keys), compute, memory, overhead, prior,
                  d.efficiency, device.op_overhead_us or d.overhead_us,
                  device.memory_bandwidth_gbps or d.bandwidth_gbps)


def key(kind: str, precision: str) -> str:
    return kind if precision == "fp32" else f"{kind}@{precision}"


@dataclass(frozen=True)
class Fit:
    """Log-efficiencies by (group, key) and a device's deviations by (device, key)."""

    group: dict[tuple[str, str], float]
    device: dict[tuple[str, str], float]

    def efficiency(self, p: Priced, k: str) -> float:
        """The fitted share of peak of key `k` (the factor on the overhead or the bandwidth for
        OVERHEAD or BANDWIDTH) on `p`'s device."""
        group, own = ((0.0, 0.0) if k in FACTORS else
                      (math.log(p.class_prior), math.log(p.prior / p.class_prior)))
        return math.exp(self.group.get((p.group, k), group) + self.device.get((p.device, k), own))

    def predict(self, p: Priced) -> float:
        eff = np.array([self.efficiency(p, k) if k else 1.0 for k in p.keys])
        return step_seconds(p, eff, self.efficiency(p, OVERHEAD), self.efficiency(p, BANDWIDTH))


def operator_seconds(compute: np.ndarray, memory: np.ndarray, overhead: np.ndarray, efficiency: np.ndarray,
                     bandwidth_factor: np.ndarray | float, overhead_factor: np.ndarray | float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each operator's compute-bound and memory-bound seconds (0 where the other binds) and its
    overhead seconds at these efficiencies and factors (module docstring)."""
    busy, moving = compute / efficiency, memory / bandwidth_factor
    computes = busy > moving
    return np.where(computes, busy, 0.0), np.where(computes, 0.0, moving), overhead * overhead_factor


def step_seconds(p: Priced, efficiency: np.ndarray, overhead_factor: float, bandwidth_factor: float) -> float:
    """The measurement's step at these per-operator efficiencies, overhead and bandwidth factors."""
    return float(sum(np.sum(t) for t in operator_seconds(p.compute, p.memory, p.overhead, efficiency,
                                                         bandwidth_factor, overhead_factor)))


def fit(rows: Sequence[Priced], ridge: float | Mapping[str, float] = RIDGE_GROUP) -> Fit:
    """The hierarchical least-squares fit (module docstring) of `rows`, each group's log-efficiencies
    pulled toward their class defaults with weight `ridge` (one for all, or by group)."""
    groups = sorted({(p.group, k) for p in rows for k in (*p.keys, *FACTORS) if k})
    devices = sorted({(p.device, k) for p in rows for k in (*p.keys, *FACTORS) if k})
    first = {p.group: p for p in reversed(rows)} | {p.device: p for p in reversed(rows)}
    prior = np.array([0.0 if k in FACTORS else math.log(first[g].class_prior) for g, k in groups])
    own = np.array([0.0 if k in FACTORS else math.log(first[d].prior / first[d].class_prior)
                    for d, k in devices])
    index = {**{("g", *g): i for i, g in enumerate(groups)},
             **{("d", *d): len(groups) + i for i, d in enumerate(devices)}}
    none = len(index)  # the index of a fixed operator's log-efficiency, 0
    g = np.concatenate([[index[("g", p.group, k)] if k else none for k in p.keys] for p in rows])
    d = np.concatenate([[index[("d", p.device, k)] if k else none for k in p.keys] for p in rows])
    og, bg = (np.array([index[("g", p.group, k)] for p in rows]) for k in FACTORS)
    od, bd = (np.array([index[("d", p.device, k)] for p in rows]) for k in FACTORS)
    row = np.concatenate([np.full(len(p.keys), i) for i, p in enumerate(rows)])
    compute, memory, overhead = (np.concatenate([getattr(p, c) for p in rows])
                                 for c in ("compute", "memory", "overhead"))
    measured = np.log([p.seconds for p in rows])

    pull = [ridge if isinstance(ridge, float | int) else ridge.get(group, RIDGE_GROUP) for group, _ in groups]
    n, weights = len(index), np.append(pull, np.full(len(devices), RIDGE_DEVICE))

    def terms(theta: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Each row's predicted seconds (step_seconds), each operator's compute-bound and
        memory-bound seconds (0 where the other binds) and each row's overhead seconds."""
        full = np.append(theta, 0.0)
        bandwidth, launched = np.exp(full[bg] + full[bd])[row], np.exp(full[og] + full[od])[row]
        bound, moved, launch = operator_seconds(compute, memory, overhead, np.exp(full[g] + full[d]),
                                                bandwidth, launched)
        return (np.bincount(row, weights=bound + moved + launch, minlength=len(rows)), bound,
                np.bincount(row, weights=moved, minlength=len(rows)),
                np.bincount(row, weights=launch, minlength=len(rows)))

    def residuals(theta: np.ndarray) -> np.ndarray:
        return np.concatenate([np.log(terms(theta)[0]) - measured, weights * (theta - start)])

    def jacobian(theta: np.ndarray) -> np.ndarray:
        predicted, bound, moved, launch = terms(theta)
        jac, each = np.zeros((len(rows), n + 1)), np.arange(len(rows))
        for at in (g, d):  # d seconds / d log-efficiency = -compute-bound seconds
            np.add.at(jac, (row, at), -bound)
        for at in (bg, bd):  # d seconds / d log-bandwidth = -memory-bound seconds
            np.add.at(jac, (each, at), -moved)
        for at in (og, od):
            np.add.at(jac, (each, at), launch)
        return np.vstack([jac[:, :n] / predicted[:, None], np.diag(weights)])

    start = np.append(prior, own)
    theta = least_squares(residuals, start, jac=jacobian, method="trf", tr_solver="lsmr").x
    return Fit(dict(zip(groups, theta[:len(groups)], strict=True)),
               dict(zip(devices, theta[len(groups):], strict=True)))


def chosen_ridge(rows: Sequence[Priced]) -> float:
    """The ridge among RIDGES whose predictions of `rows` (one kind of hardware's) err least (mean
    squared log ratio), each row predicted by the fit of the FOLDS - 1 folds (every FOLDS-th row) it
    is not in: how far the evidence may pull that kind from its class defaults."""
    folds = [rows[k::FOLDS] for k in range(min(FOLDS, len(rows)))]

    def error(ridge: float) -> float:
        fits = [fit([o for o in rows if o.id not in {p.id for p in held}], ridge) for held in folds]
        return float(np.mean([math.log(f.predict(p) / p.seconds) ** 2
                              for f, held in zip(fits, folds, strict=True) for p in held]))
    return min(RIDGES, key=error) if len(rows) > 2 else RIDGE_GROUP


def chosen_ridges(rows: Sequence[Priced]) -> dict[str, float]:
    """Each kind of hardware's ridge (chosen_ridge), chosen on its own rows."""
    return {g: chosen_ridge([p for p in rows if p.group == g]) for g in sorted({p.group for p in rows})}


def leave_one_out(rows: Sequence[Priced], ridge: float | None = None, by: str = "id") -> dict[str, float]:
    """Each row's predicted seconds from the fit of every other row of its kind of hardware (kinds
    share no parameter), or with `by="device"` of every row of another device of its kind. Without
    a `ridge`, that fit's is chosen on those rows (chosen_ridge), so the row predicted steers
    neither the fit nor its ridge."""
    out = {}
    for p in rows:
        mine = [o for o in rows if o.group == p.group and getattr(o, by) != getattr(p, by)]
        f = fit(mine, chosen_ridge(mine) if ridge is None else ridge) if mine else Fit({}, {})
        out[p.id] = f.predict(p)
    return out


def device_efficiencies(f: Fit, p: Priced) -> dict[str, float]:
    """The fitted fp32 efficiency of each kind for `p`'s device (its group's and its own deviation):
    of the TF32 peak for a kind the device runs in TF32 when asked for fp32."""
    return {k: f.efficiency(p, name) for k in FIT_KINDS for name in (k, key(k, "tf32"))
            if (p.group, name) in f.group}


def device_overhead_us(f: Fit, p: Priced) -> float:
    """The fitted per-operator overhead of `p`'s device, microseconds."""
    return p.overhead_us * f.efficiency(p, OVERHEAD)


def device_bandwidth_gbps(f: Fit, p: Priced) -> float:
    """The fitted memory bandwidth of `p`'s device, GB/s."""
    return p.bandwidth_gbps * f.efficiency(p, BANDWIDTH)


def read_measurements(path: Path, device: str) -> list[dict[str, str]]:
    """The rows of a measurements CSV (the evidence table's columns: `model` or `price_model`,
    `batch`, `seconds_per_step`, and optionally `input`, `classes`, `price_precision` or `precision`,
    `id`) for `device`: those whose `profile` is it, or every row of a file without that column."""
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


def profile_text(base: str, name: str, efficiencies: dict[str, float], overhead_us: float,
                 bandwidth_gbps: float, source: str) -> str:
    """A profile file: `base`'s text named `name`, with the fitted per-operator overhead and memory
    bandwidth, and its `[efficiency_by_kind]` table replaced by the fitted one."""
    top: list[str] = []
    rest: list[str] = []
    skipping = False
    for line in base.splitlines():
        if line.strip().startswith("["):
            skipping = line.strip().startswith("[efficiency_by_kind]")
        if skipping or line.startswith(("op_overhead_us", "memory_bandwidth_gbps")):
            continue
        (rest if rest or line.strip().startswith("[") else top).append(
            f"name = {json.dumps(name)}" if line.startswith("name ") else line)
    table = [f"{k} = {v:.4g}" for k, v in efficiencies.items()]
    fitted = [f"op_overhead_us = {overhead_us:.4g}   # fitted: edgefl devices fit",
              f"memory_bandwidth_gbps = {bandwidth_gbps:.4g}   # fitted: edgefl devices fit"]
    return "\n".join([*top, *fitted, *rest, "",
                      "[efficiency_by_kind]  # fitted: edgefl devices fit", *table,
                      f"source = {json.dumps(source)}", ""])
