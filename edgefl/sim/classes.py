"""A device's rooflines for the compute model (edgefl.sim.compute): its own figures, else its
class's (edgefl.devices.classes says what each class's figures are and where they come from)."""

from __future__ import annotations

from edgefl.devices.classes import CLASS_DEFAULTS
from edgefl.devices.profile import PARENT_KIND, PRECISION_BYTES, DeviceProfile
from edgefl.sim.compute import KINDS, PASSES, Roofline, Rooflines
from edgefl.sim.records import BYTES


def device_rooflines(p: DeviceProfile, precision: str = "fp32") -> Rooflines:
    """The device's roofline per (kind, pass): its own figures, else its class's, then any fitted
    `[kernels]` rows on top. In another `precision` than fp32 every rate scales by that peak over
    the FP32 one, and bandwidths by the bytes an element saves (the profile must give the peak);
    fp32 dense convolutions run at the TF32 peak where the profile gives one (kind_peak)."""
    d = CLASS_DEFAULTS[p.device_class]
    speed, wider = p.peak(precision) / p.flops, BYTES / PRECISION_BYTES[precision]
    bandwidth = (p.memory_bandwidth_gbps or d.bandwidth_gbps) * 1e9 * wider
    overhead = (p.op_overhead_us or d.overhead_us) / 1e6
    efficiency = p.efficiency or d.efficiency
    share = {k: getattr(p.efficiency_by_kind, k, 0.0) or efficiency for k in KINDS}
    table = {(k, ps): Roofline(kind_peak(p, k, precision) * share[k], bandwidth, overhead)
             for k in KINDS for ps in PASSES}
    for kind in KINDS:  # a kind the calibration did not time (a profile older than it): its parent's
        rows = getattr(p.kernels, kind) or getattr(p.kernels, PARENT_KIND.get(kind, kind))
        for ps, (gflops, gbps, us) in zip(PASSES, rows, strict=False):
            table[(kind, ps)] = Roofline(gflops * 1e9 * speed, gbps * 1e9 * wider, us / 1e6)
    return Rooflines(tuple(table.items()), p.iteration_overhead_us / 1e6, p.attack_step_overhead_us / 1e6,
                     p.round_overhead_ms / 1e3)


def kind_peak(p: DeviceProfile, kind: str, precision: str) -> float:
    """The peak FLOP/s layers of `kind` run at in `precision`: the TF32 tensor peak for fp32 dense
    convolutions where the profile gives one (PyTorch's torch.backends.cudnn.allow_tf32 is on by
    default since 1.7), else the precision's peak."""
    return p.tf32_gflops * 1e9 if p.runs_tf32(kind, precision) else p.peak(precision)
