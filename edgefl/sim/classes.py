"""A device's rooflines for the compute model (edgefl.sim.compute): its own figures, else its
class's (edgefl.devices.classes says what each class's figures are and where they come from)."""

from __future__ import annotations

from edgefl.devices.classes import CLASS_DEFAULTS
from edgefl.devices.families import fitted_of
from edgefl.devices.profile import FAMILIES, PARENT_KIND, PRECISION_BYTES, DeviceProfile
from edgefl.sim.compute import KINDS, PASSES, Roofline, Rooflines
from edgefl.sim.records import BYTES


def device_rooflines(p: DeviceProfile, precision: str = "fp32") -> Rooflines:
    """The device's roofline per (kind, pass): its `[fitted]` figures (shares of the peak each kind
    runs at, of the datasheet bandwidth, and its per-operator overhead: edgefl.calibration.fit) where
    it has them, else its family's (edgefl.devices.families), else its own, else its class's, then
    any calibrated `[kernels]` rows on top. In another `precision` than fp32 every rate scales by
    that peak over the FP32 one, and bandwidths by the bytes an element saves (the profile must give
    the peak); fp32 dense convolutions run at the TF32 peak where the profile gives one (kind_peak)."""
    d, fitted = CLASS_DEFAULTS[p.device_class], fitted_of(p.family, p.fitted)
    speed, wider = p.peak(precision) / p.flops, BYTES / PRECISION_BYTES[precision]
    bandwidth = (p.memory_bandwidth_gbps or d.bandwidth_gbps) * (fitted.bandwidth_share or 1.0) * 1e9 * wider
    overhead = (fitted.op_overhead_us if fitted.efficiency else p.op_overhead_us or d.overhead_us) / 1e6
    efficiency = d.efficiency if fitted.efficiency else p.efficiency or d.efficiency
    share = {k: fitted.efficiency.get(fitted_key(p, k, precision), 0.0)
             or getattr(p.efficiency_by_kind, k, 0.0) or efficiency for k in KINDS}
    table = {(k, ps): Roofline(kind_peak(p, k, precision) * share[k], bandwidth * fitted.memory.get(k, 1.0),
                               overhead)
             for k in KINDS for ps in PASSES}
    for kind in KINDS:  # a kind the calibration did not time (a profile older than it): its parent's
        rows = getattr(p.kernels, kind) or getattr(p.kernels, PARENT_KIND.get(kind, kind))
        for ps, (gflops, gbps, us) in zip(PASSES, rows, strict=False):
            table[(kind, ps)] = Roofline(gflops * 1e9 * speed, gbps * 1e9 * wider, us / 1e6)
    return Rooflines(tuple(table.items()), p.iteration_overhead_us / 1e6, p.attack_step_overhead_us / 1e6,
                     p.round_overhead_ms / 1e3)


def fitted_key(p: DeviceProfile, kind: str, precision: str) -> str:
    """The `[fitted]` efficiency key of `kind` in `precision`: KIND, KIND@fp16, KIND@tf32 (an fp32
    dense convolution on a TF32 peak)."""
    shown = "tf32" if p.runs_tf32(kind, precision) else precision
    return kind if shown == "fp32" else f"{kind}@{shown}"


# Winograd F(2x2, 3x3) computes a 3x3 convolution's 2x2 output tile with 16 multiplies where the
# direct form takes 36 (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks", CVPR
# 2016), and cuDNN runs fp32 3x3 convolutions with it (CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD and
# _NONFUSED, cuDNN 5+): the direct FLOPs counted go 2.25x faster than the FP32 peak.
WINOGRAD = 36 / 16
WINOGRAD_FAMILIES = tuple(f for f in FAMILIES if f.startswith("nvidia-"))


def kind_peak(p: DeviceProfile, kind: str, precision: str) -> float:
    """The peak FLOP/s layers of `kind` run at in `precision`, in the direct FLOPs counted: the TF32
    tensor peak for fp32 dense convolutions where the profile gives one (PyTorch's
    torch.backends.cudnn.allow_tf32 is on by default since 1.7), the matrix unit's peak for fp32
    GEMM-based layers where the profile gives one (matrix_gflops), fp32 3x3 convolutions on cuDNN's
    Winograd (WINOGRAD), else the precision's peak."""
    if p.runs_tf32(kind, precision):
        return p.tf32_gflops * 1e9
    if p.runs_matrix(kind, precision):
        return p.matrix_gflops * 1e9
    winograd = kind == "conv3x3" and precision == "fp32" and p.family in WINOGRAD_FAMILIES
    return p.peak(precision) * (WINOGRAD if winograd else 1.0)
