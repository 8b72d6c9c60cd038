"""The roofline compute model (edgefl.sim.compute) and device classes, against hand-worked numbers."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from edgefl.devices.classes import CLASS_DEFAULTS
from edgefl.devices.profile import DeviceProfile, Kernels
from edgefl.sim.classes import device_rooflines
from edgefl.sim.compute import (
    FORWARD,
    INPUT_GRAD,
    WEIGHT_GRAD,
    Iteration,
    Roofline,
    Rooflines,
    iteration_seconds,
    pass_work,
    round_seconds,
)
from edgefl.sim.records import LayerProfile

# 100 GFLOP/s sustained, 10 GB/s, 10 us per operator
ROOF = Rooflines.uniform(100e9, 10e9, 10e-6)


def layer_seconds(x: LayerProfile, pass_: str, batch: int, roof: Rooflines) -> float:
    return roof.get(x.kind, pass_).seconds(*pass_work(x, pass_, batch))


def layer(kind: str, macs: float, elems: int, params: int = 0, ops: int = 1, tensors: int = 0,
          out: int | None = None) -> LayerProfile:
    return LayerProfile(kind, kind, macs, params, elems, elems if out is None else out, 0.0, ops, tensors)


def test_compute_bound_conv():
    conv = layer("conv", macs=1e6, elems=1000, params=1000, tensors=1)
    # forward, batch 10: 2 x 1e6 x 10 = 2e7 FLOPs -> 2e-4 s; bytes 4 x (10 x 2000 + 1000) = 84 kB
    # -> 8.4e-6 s; compute-bound: 2e-4 + 10 us
    assert layer_seconds(conv, FORWARD, 10, ROOF) == pytest.approx(2e-4 + 1e-5)
    # input gradient: same FLOPs (bytes 4 x (10 x 3000 + 1000) = 124 kB, still below)
    assert layer_seconds(conv, INPUT_GRAD, 10, ROOF) == pytest.approx(2e-4 + 1e-5)
    assert layer_seconds(conv, WEIGHT_GRAD, 10, ROOF) == pytest.approx(2e-4 + 1e-5)


def test_small_op_is_overhead_bound():
    relu = layer("activation", macs=0.0, elems=10)
    # 4 x (10 + 10) = 80 B -> 8 ns, against 10 us of launch
    assert layer_seconds(relu, FORWARD, 1, ROOF) == pytest.approx(8e-9 + 1e-5)


def test_norm_is_bandwidth_bound():
    norm = layer("norm", macs=2e6, elems=1_000_000, ops=2)
    # forward, batch 1: 4e6 FLOPs -> 4e-5 s; bytes 4 x 2e6 = 8 MB -> 8e-4 s; two operators
    assert layer_seconds(norm, FORWARD, 1, ROOF) == pytest.approx(8e-4 + 2e-5)
    # input gradient reads the output gradient and the saved output, writes the input: 12 MB
    assert layer_seconds(norm, INPUT_GRAD, 1, ROOF) == pytest.approx(1.2e-3 + 2e-5)


def test_reshape_costs_only_its_launch():
    flat = layer("reshape", macs=0.0, elems=1_000_000)
    assert layer_seconds(flat, FORWARD, 64, ROOF) == pytest.approx(1e-5)


# conv (1 tensor), ReLU, linear (weight + bias): each operator costs 1 s, nothing else counts
OPS_ONLY = Rooflines.uniform(math.inf, math.inf, 1.0)
NET = (layer("conv", 1.0, 4, params=9, tensors=1), layer("activation", 0.0, 4),
       layer("linear", 1.0, 4, params=10, tensors=2, out=2))


def test_iteration_counts_every_operator():
    it = Iteration(NET, batch=8, attack_steps=2, train_pairs=1, extra_forwards=0, slots=1, classes=2)
    # batch gather x, y and loss sum: 3
    # PGD: start 3; per step forward 3 + loss 2 + loss backward 2 + input grads 3 + 8 update ops = 18
    # training: forward 3 + loss 4 + backward (conv weight grad; relu input grad; linear input and
    # weight grads: 4) = 11
    # SGD with momentum (1 slot): 3 tensors x (2 + 2) operators = 12
    assert iteration_seconds(it, OPS_ONLY) == 3 + 3 + 2 * 18 + 11 + 12
    clean = replace(it, attack_steps=0)
    assert iteration_seconds(clean, OPS_ONLY) == 3 + 11 + 12
    trades = replace(it, attack_steps=0, train_pairs=2, extra_forwards=1)
    assert iteration_seconds(trades, OPS_ONLY) == 3 + 2 * 11 + 3 + 12


def test_micro_batches_repeat_the_passes_and_step_once():
    """The swap walk's micro-batches: every pass's operators once per micro-batch, the optimizer
    step once per batch. From the count above: 2 x (3 + 3 + 2 x 18 + 11) + 12."""
    it = Iteration(NET, batch=8, attack_steps=2, train_pairs=1, extra_forwards=0, slots=1, classes=2,
                   micro=2)
    assert iteration_seconds(it, OPS_ONLY) == 2 * (3 + 3 + 2 * 18 + 11) + 12


def test_round_divides_by_the_app_share():
    it = Iteration(NET, batch=8, attack_steps=0, train_pairs=1, extra_forwards=0, slots=1, classes=2)
    # 26 s per iteration, 5 iterations, half the device left by the app
    assert round_seconds(it, 5, 0.0, OPS_ONLY, share=0.5) == 5 * 26 / 0.5
    # one-off FLOPs go at the conv forward rate: 2e9 FLOPs at 100 GFLOP/s
    assert round_seconds(it, 0, 2e9, ROOF, share=1.0) == pytest.approx(0.02)


def profile(**kw: object) -> DeviceProfile:
    base = {"name": "x", "description": "", "source": "hand", "memory_mb": 1000.0, "compute_gflops": 1000.0,
            "storage_read_mb_s": 1.0, "storage_write_mb_s": 1.0, "storage_latency_ms": 0.0}
    return DeviceProfile(**{**base, **kw})  # type: ignore[arg-type]


def test_class_defaults_fill_what_a_profile_omits():
    d = CLASS_DEFAULTS["gpu"]
    roof = device_rooflines(profile(device_class="gpu"))
    expected = Roofline(1000e9 * d.efficiency, d.bandwidth_gbps * 1e9, d.overhead_us / 1e6)
    assert roof.get("conv", FORWARD) == expected
    assert roof.get("elementwise", INPUT_GRAD) == expected
    own = device_rooflines(profile(device_class="gpu", memory_bandwidth_gbps=936.0, efficiency=0.5))
    assert own.get("conv", WEIGHT_GRAD) == Roofline(500e9, 936e9, d.overhead_us / 1e6)


def test_a_profile_without_class_is_charged_at_peak():
    roof = device_rooflines(profile())
    assert roof.get("conv", FORWARD) == Roofline(1000e9, math.inf, 0.0)


def test_fitted_kernels_replace_the_figures_kind_by_kind():
    kernels = Kernels(conv=[[200.0, 8.0, 30.0], [150.0, 5.0, 50.0]])
    roof = device_rooflines(profile(device_class="cpu", kernels=kernels))
    assert roof.get("conv", FORWARD) == Roofline(200e9, 8e9, 30e-6)
    assert roof.get("conv", INPUT_GRAD) == Roofline(150e9, 5e9, 50e-6)
    d = CLASS_DEFAULTS["cpu"]
    assert roof.get("conv", WEIGHT_GRAD) == Roofline(1000e9 * d.efficiency, d.bandwidth_gbps * 1e9,
                                                     d.overhead_us / 1e6)


def test_kinds_efficiencies_precisions_and_fallbacks(tmp_path):
    """Issue 36: a convolution kind without figures of its own is charged as conv (a calibrated
    host's conv kernels too); per-kind efficiencies derate the peak kind by kind; another precision
    scales the rates by its peak and the bandwidth by the bytes it saves."""
    from edgefl.devices.profile import Efficiencies

    calibrated = device_rooflines(profile(device_class="cpu", kernels=Kernels(conv=[[200.0, 8.0, 30.0]])))
    conv = Roofline(200e9, 8e9, 30e-6)
    assert calibrated.get("conv3x3", FORWARD) == calibrated.get("dwconv", FORWARD) == conv
    assert calibrated.get("dwconv", INPUT_GRAD) == calibrated.get("conv", INPUT_GRAD) != conv
    older = device_rooflines(profile(device_class="cpu", kernels=Kernels(activation=[[100.0, 8.0, 3.0]])))
    assert older.get("clamp", FORWARD) == older.get("activation", FORWARD) == Roofline(100e9, 8e9, 3e-6)
    d = CLASS_DEFAULTS["gpu"]
    shares = Efficiencies(dwconv=0.05, conv3x3=1.2)
    kinds = device_rooflines(profile(device_class="gpu", efficiency_by_kind=shares))
    assert kinds.get("dwconv", FORWARD).flops == pytest.approx(50e9)
    assert kinds.get("conv3x3", WEIGHT_GRAD).flops == pytest.approx(1200e9)
    assert kinds.get("conv", FORWARD).flops == pytest.approx(1000e9 * d.efficiency)
    half = device_rooflines(profile(device_class="gpu", fp16_gflops=8000.0), "fp16")
    assert half.get("conv", FORWARD) == Roofline(8000e9 * d.efficiency, 2 * d.bandwidth_gbps * 1e9,
                                                 d.overhead_us / 1e6)


def test_fp32_dense_convolutions_run_at_the_tf32_peak_where_the_profile_gives_one():
    """PyTorch's fp32 convolutions run on TF32 tensor cores (cudnn.allow_tf32, on by default since
    1.7): conv and conv3x3 at the TF32 peak x efficiency; depthwise, linear and other precisions not."""
    d = CLASS_DEFAULTS["gpu"]
    ampere = profile(device_class="gpu", tf32_gflops=8000.0, fp16_gflops=16000.0)
    fp32 = device_rooflines(ampere)
    for kind in ("conv", "conv3x3"):
        assert fp32.get(kind, WEIGHT_GRAD).flops == pytest.approx(8000e9 * d.efficiency)
    for kind in ("dwconv", "linear"):
        assert fp32.get(kind, FORWARD).flops == pytest.approx(1000e9 * d.efficiency)
    half = device_rooflines(ampere, "fp16")
    assert half.get("conv", FORWARD).flops == pytest.approx(16000e9 * d.efficiency)
    assert device_rooflines(profile(device_class="gpu")).get("conv", FORWARD).flops == pytest.approx(
        1000e9 * d.efficiency)


def test_a_device_is_compared_by_the_release_figure_else_its_sustained_rate():
    """What pools draw by, FedProphet compares and `paper` charges (issue 36: the corrected datasheet
    peaks move none of them)."""
    from edgefl.devices.classes import perf_flops

    assert perf_flops(profile(device_class="gpu", release_gflops=1300.0)) == 1300e9
    assert perf_flops(profile(device_class="sbc", efficiency=0.25)) == 250e9
    assert perf_flops(profile(device_class="sbc")) == pytest.approx(1000e9 * CLASS_DEFAULTS["sbc"].efficiency)


@pytest.mark.parametrize(("line", "key"), [
    ('device_class = "toaster"', "device_class"),
    ("efficiency = 1.5", "efficiency"),
    ("memory_bandwidth_gbps = -1.0", "memory_bandwidth_gbps"),
    ("[kernels]\nconv = [[100.0, 0.0, 5.0]]", "kernels.conv"),
    # below MIN_FIGURE, a figure that is a typo would turn simulated hours into inf
    ("[kernels]\nconv = [[1e-300, 1e-300, 0.0]]", "kernels.conv"),
    ("efficiency = 1e-300", "efficiency"),
    ("memory_bandwidth_gbps = 1e-300", "memory_bandwidth_gbps"),
])
def test_bad_compute_figures_are_one_clear_error(tmp_path, line, key):
    from edgefl.devices.catalog import load_profile
    from edgefl.errors import EdgeflError

    path = tmp_path / "x.toml"
    path.write_text('name = "x"\ndescription = ""\nsource = "hand"\nmemory_mb = 1.0\n'
                    "compute_gflops = 1.0\nstorage_read_mb_s = 1.0\nstorage_write_mb_s = 1.0\n"
                    f"storage_latency_ms = 0.0\n{line}\n")
    with pytest.raises(EdgeflError, match=key):
        load_profile(path, DeviceProfile)


def test_the_fixed_costs_outside_the_operators_are_charged():
    """Per iteration, per PGD step and per client-round (issue 36), on top of the operators."""
    it = Iteration(NET, batch=8, attack_steps=2, train_pairs=1, extra_forwards=0, slots=1, classes=2)
    fixed = replace(OPS_ONLY, iteration_s=1.0, attack_step_s=0.5, round_s=3.0)
    # 5 iterations of (3 + 3 + 2 x 18 + 11 + 12 = 65 operators + 1 + 2 x 0.5), the round's 3, on half
    assert round_seconds(it, 5, 0.0, fixed, share=0.5) == (5 * (65 + 1 + 1) + 3) / 0.5
