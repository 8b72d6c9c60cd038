"""The fit's figures written into profiles (issue 51): a profile's `[fitted]` table, which runs and
`edgefl price` read (edgefl.sim.classes.device_rooflines), and the families' figures
(edgefl/devices/families.toml, edgefl.devices.families), which a profile of a `family` without a
`[fitted]` table of its own gets: a user's new device.

A device with rows of its own gets its own figures (basis "device"); one without gets those its
family and architecture share (basis "family", or "arch" where no device of its family was fitted):
what leave-one-device-out judges, a device predicted from its datasheet and its family alone.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from edgefl.calibration.fit import BANDWIDTH, FACTORS, KIND_PARENT, MEMORY, Fit, Priced, parent
from edgefl.devices.catalog import bundled, load_catalog
from edgefl.devices.classes import CLASS_DEFAULTS, arch_of
from edgefl.devices.families import FILE
from edgefl.devices.profile import FAMILIES, TF32_KINDS, DeviceProfile

EMPTY = np.zeros(0)
HEADER = "[fitted]"


def identity(device: DeviceProfile) -> Priced:
    """`device` as the fit knows a device (no operators): what Fit.share needs to give its figures."""
    return who(device.name, device.family, arch_of(device), device.device_class)


def who(device: str, family: str, arch: str, device_class: str) -> Priced:
    """A device, or a family's unseen device (`device` ""), training in PyTorch, with no operators."""
    d = CLASS_DEFAULTS[device_class]
    return Priced("", device, family, arch, "pytorch", "", "", 1.0, (), (), EMPTY, EMPTY, EMPTY, d.efficiency,
                  d.overhead_us, d.bandwidth_gbps)


def children(root: str) -> list[str]:
    """The share keys whose parent is `root` (conv@fp16: conv3x3@fp16, dwconv@fp16, linear@fp16),
    those a TF32 peak runs only where it does (TF32_KINDS), so that every kind a run can ask for is
    written as the fit prices it."""
    _, at, precision = root.partition("@")
    return [f"{k}{at}{precision}" for k, up in KIND_PARENT.items() if f"{up}{at}{precision}" == root
            and (precision != "tf32" or k in TF32_KINDS)]


def figures(f: Fit, me: Priced, device: DeviceProfile | None = None) -> list[str]:
    """The TOML lines of `me`'s fitted figures: bandwidth share, overhead and the shares of every
    key of its architecture (those a `device` can run: its fp16 or TF32 keys where it has the peak)."""
    roots = {k for (lv, name, k) in f.params if lv == "arch" and name == me.arch and not parent(k)
             and not k.startswith(MEMORY)}
    keys = sorted({k for k in roots - set(FACTORS)} | {c for r in roots for c in children(r)})
    shares = {k: f.share(me, k) for k in keys if device is None or wanted(device, k)}
    streams = {k.removeprefix(MEMORY): f.share(me, k) for (lv, name, k) in sorted(f.params)
               if lv == "arch" and name == me.arch and k.startswith(MEMORY)}
    return [f"bandwidth_share = {f.share(me, BANDWIDTH):.4g}   # of memory_bandwidth_gbps, sustained",
            f"op_overhead_us = {f.overhead_us(me):.4g}",
            "efficiency = { " + ", ".join(f"{json.dumps(k)} = {v:.4g}" for k, v in shares.items()) + " }",
            "memory = { " + ", ".join(f"{k} = {v:.4g}" for k, v in streams.items()) + " }"]


def wanted(device: DeviceProfile, k: str) -> bool:
    """Whether a share key applies to the device: fp16 where it has an fp16 peak, TF32 where a TF32."""
    precision = k.partition("@")[2]
    if precision == "tf32":
        return device.tf32_gflops > 0
    return not precision or device.peak(precision) > 0


def fitted_table(f: Fit, device: DeviceProfile, rows: Sequence[Priced], unseen: dict[str, float],
                 stamp: str) -> str:
    """The `[fitted]` table of `device` (module docstring): its shares, bandwidth share, overhead,
    basis, rows, the in-sample and leave-one-device-out residuals of its rows, and `stamp`."""
    me = identity(device)
    mine = [p for p in rows if p.device == device.name]
    known = {p.family for p in rows if p.arch == me.arch}
    basis = "device" if mine else ("family" if device.family in known else "arch")

    def residual(predicted: dict[str, float] | None) -> float:
        if not mine:
            return 0.0
        return statistics.median(abs(math.log2((predicted[p.id] if predicted else f.predict(p)) / p.seconds))
                                 for p in mine)

    figured = figures(f, me, device)
    lines = [f"{HEADER}  # written by {stamp}: do not edit by hand (edgefl.calibration.profiles)",
             *figured[:2],
             f"basis = {json.dumps(basis)}   # device: its own rows; family, arch: none",
             f"rows = {json.dumps([p.id for p in mine])}",
             f"residual_log2 = {residual(None):.3g}   # median |log2(predicted / measured)|, fitted",
             f"unseen_log2 = {residual(unseen):.3g}   # the same with the device left out of the fit",
             f"source = {json.dumps(stamp)}",
             *figured[2:]]
    return "\n".join(lines) + "\n"


def families_text(f: Fit, rows: Sequence[Priced], stamp: str) -> str:
    """device_profiles/families.toml: per family of a fitted architecture, the figures a device of it
    that the fit has never seen gets (no device, the PyTorch framework), with its basis."""
    fitted = {p.family for p in rows if p.family}
    arches = {name for (lv, name, _) in f.params if lv == "arch"}
    out = ["# The figures a device of each family gets when it has no [fitted] table of its own: written",
           f"# by {stamp} (edgefl.calibration.profiles); do not edit. Read by edgefl.devices.families.",
           ""]
    for family, arch in FAMILIES.items():
        if arch not in arches:
            continue
        me = who("", family, arch, arch)  # the cpu and gpu classes' defaults are their priors
        basis = "family" if family in fitted else "arch"
        out += [f"[{json.dumps(family)}]", *figures(f, me), f"basis = {json.dumps(basis)}",
                f"source = {json.dumps(stamp)}", ""]
    return "\n".join(out)


def with_table(text: str, table: str) -> str:
    """`text` with its `[fitted]` table (up to the next table or the end) replaced by `table`, or
    `table` appended."""
    kept = re.sub(r"(?ms)^\[fitted\].*?(?=^\[|\Z)", "", text).rstrip("\n")
    return f"{kept}\n\n{table}"


def write_fitted(f: Fit, rows: Sequence[Priced], unseen: dict[str, float], stamp: str) -> list[Path]:
    """Each bundled device profile the fit covers (a CPU or GPU, not a calibrated host, whose
    `[kernels]` replace these figures) with its `[fitted]` table; the paths written."""
    folder = bundled("device_profiles")
    FILE.write_text(families_text(f, rows, stamp), encoding="utf-8")
    out = [FILE]
    for device in load_catalog().devices.values():
        path = folder / f"{device.name}.toml"
        if not arch_of(device) or device.calibrated_host or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        path.write_text(with_table(text, fitted_table(f, device, rows, unseen, stamp)), encoding="utf-8")
        out.append(path)
    return out
