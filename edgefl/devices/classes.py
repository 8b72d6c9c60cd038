"""Device classes: the compute-model figures a profile with only datasheet numbers gets.

A device's rooflines (edgefl.sim.compute, built by edgefl.sim.classes) need a sustained FLOP/s
(efficiency x peak), a memory bandwidth and a per-operator overhead. A profile may give each
(`efficiency`, `memory_bandwidth_gbps`, `op_overhead_us`, with `compute_source`); what it leaves at
0 comes from its class below. The class efficiencies derate a datasheet peak `compute_gflops`
(every bundled profile gives a peak). Every bundled CPU and GPU profile carries figures fitted on
published step times instead (`[fitted]`, issue 51: edgefl.calibration.fit), and a profile that
names a `family` without a table of its own gets its family's (edgefl.devices.families); the class
figures below are the fit's priors and what the other classes run on. A calibrated host's fitted
`[kernels]` rows replace them kind by kind.

Evidence. `cpu` rests on a measurement: `edgefl devices calibrate` on the edgefl development host
(device_profiles/dev_vm.toml: a 2-core x86 VM, torch on 1 thread) fits 20 GB/s and 3 us per
operator for elementwise forwards, 1.3-80 GB/s and 3-78 us across kinds and passes, and convolutions
at 148-192 GFLOP/s, 0.76-0.99 of its one-thread conv2d peak; the class keeps round figures (20 GB/s,
and 10 us per operator, the middle of the fitted 3-78 us), with a lower efficiency (0.5) because
a datasheet peak counts every core, which training reaches less
(estimate). The others are estimates from public figures, as marked:
* microcontroller: CMSIS-NN kernels on Cortex-M reach well under the DSP peak (Lai et al., "CMSIS-NN",
  arXiv:1801.06601, 2018); on-chip SRAM moves a few hundred MB/s to ~1 GB/s at 64-480 MHz
  (STM32H747 and ESP32-S3 datasheets: 32/64-bit buses at core clock); TFLite Micro's interpreter
  adds microseconds per operator (David et al., MLSys 2021). Estimate.
* phone_cpu: LPDDR4X-4266 x 64 bit peaks at 34 GB/s and one big-core cluster streams about a third
  of it; eager PyTorch Mobile dispatch costs ~10 us per operator on A7x-class cores. Estimate.
* phone_gpu: the GPU shares the phone's LPDDR (as above, more of it reachable); each OpenCL/Metal
  dispatch costs tens of microseconds. Estimate.
* sbc: Raspberry Pi 4 LPDDR4-3200 x 32 bit peaks at 12.8 GB/s and streams ~4 GB/s (community STREAM
  results); Cortex-A53/A72 run PyTorch's dispatcher ~4x slower than a desktop core. Estimate.
* gpu (laptop/desktop): cuDNN convolutions sustain ~50-70 % of fp32 peak on large layers; the class
  bandwidth is a mid-range GDDR6 figure (a profile should give its datasheet's); a CUDA kernel
  launch plus eager PyTorch dispatch costs ~10 us. Estimate.
* fpga: a dataflow accelerator keeps most of its DSP peak busy; VC709 and KCU1500 boards carry
  DDR3/DDR4 at 12.8-19.2 GB/s per channel (Xilinx board user guides); control per layer ~1 us.
  Estimate.
* generic: a profile that names no class is charged at its peak FLOP/s with no bandwidth bound and
  no overhead, as edgefl did before the compute model.

Power (edgefl.sim.energy): watts at full training load and awake-idle, and storage nJ per byte read
and written; a profile's own figures (`active_w`, `idle_w`, `read_nj_per_byte`, `write_nj_per_byte`,
with `power_source`) replace them. Every class figure is an estimate from public numbers:
* microcontroller: STM32H747 and ESP32-S3 datasheets give ~60-100 mA at 3.3 V running flat out
  (0.2-0.33 W) and a few mA idle with clocks gated; SPI/QSPI NOR flash reads ~10 MB/s at ~15 mA and
  programs well under 1 MB/s at a similar current (~5 and ~100 nJ/B).
* phone_cpu: a big-core cluster under sustained load draws ~3-5 W (per-core SPEC power in
  AnandTech's A14 and Snapdragon 888 reviews; phones throttle to ~4 W sustained); awake idle with the
  screen off draws tens to hundreds of mW (Carroll & Heiser, "An Analysis of Power Consumption in a
  Smartphone", USENIX ATC 2010); UFS/NVMe flash moves ~1-2 GB/s at ~1.5-2 W (~1 nJ/B read, ~3 write).
* phone_gpu: mobile GPUs under sustained compute ~4-6 W (AnandTech GFXBench power figures), the rest
  as phone_cpu.
* sbc: a Raspberry Pi 4 idles at ~2.7 W and draws ~6.4 W on all four cores (widely reported
  measurements, e.g. Tom's Hardware's Pi 4 review); a microSD card ~0.5 W at 20-45 MB/s (~12 nJ/B
  read, ~25 written).
* gpu: a mid-range discrete card, board power ~150 W at load, ~15 W idle (a profile should give its
  datasheet's TBP); NVMe SSD ~5 W at 2-3 GB/s (~2 nJ/B read, ~3 written).
* fpga: VC709/KCU1500-class boards ~25 W running, ~10 W configured and idle; NVMe as gpu.
* cpu: a desktop package ~65 W at all-core load (Ryzen 9 3950X's TDP is 105 W), ~10 W idle; NVMe as
  gpu.
* generic: no power figures: 0 W and 0 J/B (energy_j counts only the radio).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgefl.devices.families import FILE, fitted_of
from edgefl.devices.profile import FAMILIES, DeviceProfile


@dataclass(frozen=True)
class ClassDefaults:
    efficiency: float  # sustained share of peak FLOP/s
    bandwidth_gbps: float
    overhead_us: float


CLASS_DEFAULTS: dict[str, ClassDefaults] = {
    "microcontroller": ClassDefaults(0.4, 0.4, 10.0),
    "phone_cpu": ClassDefaults(0.3, 10.0, 10.0),
    "phone_gpu": ClassDefaults(0.3, 15.0, 20.0),
    "sbc": ClassDefaults(0.3, 4.0, 20.0),
    "gpu": ClassDefaults(0.6, 300.0, 10.0),
    "fpga": ClassDefaults(0.8, 12.8, 1.0),
    "cpu": ClassDefaults(0.5, 20.0, 10.0),
    "generic": ClassDefaults(1.0, math.inf, 0.0),
}


ARCH_OF_CLASS = {"phone_cpu": "cpu", "sbc": "cpu", "cpu": "cpu", "phone_gpu": "gpu", "gpu": "gpu"}


def arch_of(p: DeviceProfile) -> str:
    """The architecture whose figures the fit shares: its family's, else its class's ("" for
    classes no published step time measures: microcontrollers, FPGAs, generic)."""
    return FAMILIES.get(p.family) or ARCH_OF_CLASS.get(p.device_class, "")


def provenance(p: DeviceProfile) -> list[str]:
    """Where each figure of the compute model comes from, one line each (`edgefl devices show`)."""
    d, f = CLASS_DEFAULTS[p.device_class], fitted_of(p.family, p.fitted)
    bandwidth = p.memory_bandwidth_gbps or d.bandwidth_gbps
    datasheet = "the profile's, see source" if p.memory_bandwidth_gbps else "the class default (estimate)"
    lines = [f"peak FP32 {p.compute_gflops:g} GFLOP/s: the datasheet's (source)",
             f"memory bandwidth {bandwidth:g} GB/s: {datasheet}"]
    if any(p.kernels.__dict__.values()):
        return [*lines, "per-kind rates, bandwidths and overheads: [kernels], measured by edgefl devices "
                f"calibrate on {p.calibrated_host or 'this host'}"]
    if not f.efficiency:
        why = p.compute_source or "the class defaults (estimates)"
        return [*lines, f"share of peak {p.efficiency or d.efficiency:g}, per-operator overhead "
                f"{p.op_overhead_us or d.overhead_us:g} us: {why}"]
    basis = {"device": f"fitted on its {len(f.rows)} rows ({', '.join(f.rows)}): median |log2(predicted / "
                       f"measured)| {f.residual_log2:g} fitted, {f.unseen_log2:g} with the device left out",
             "family": f"its family's ({p.family}) and architecture's, fitted on other devices' rows",
             "arch": f"its architecture's ({arch_of(p)}), fitted on other devices' rows"}
    shown = basis.get(f.basis, f.basis) + ("" if p.fitted.efficiency else f", from {FILE.name}")
    shares = ", ".join(f"{k} {v:.3g}" for k, v in f.efficiency.items())
    return [*lines, f"shares of peak {shares}; sustained bandwidth {f.bandwidth_share:.3g} x "
            f"{bandwidth:g} GB/s; per-operator overhead {f.op_overhead_us:.3g} us",
            f"  [fitted], {shown}; by {f.source}"]


@dataclass(frozen=True)
class PowerDefaults:
    active_w: float  # watts at full training load
    idle_w: float  # watts awake and idle
    read_nj_per_byte: float
    write_nj_per_byte: float


POWER_DEFAULTS: dict[str, PowerDefaults] = {
    "microcontroller": PowerDefaults(0.3, 0.01, 5.0, 100.0),
    "phone_cpu": PowerDefaults(4.0, 0.2, 1.0, 3.0),
    "phone_gpu": PowerDefaults(5.0, 0.2, 1.0, 3.0),
    "sbc": PowerDefaults(6.4, 2.7, 12.0, 25.0),
    "gpu": PowerDefaults(150.0, 15.0, 2.0, 3.0),
    "fpga": PowerDefaults(25.0, 10.0, 2.0, 3.0),
    "cpu": PowerDefaults(65.0, 10.0, 2.0, 3.0),
    "generic": PowerDefaults(0.0, 0.0, 0.0, 0.0),
}


def device_power(p: DeviceProfile) -> PowerDefaults:
    """The device's power figures: its own, else its class's (figure by figure)."""
    d = POWER_DEFAULTS[p.device_class]
    return PowerDefaults(p.active_w or d.active_w, p.idle_w or d.idle_w,
                         p.read_nj_per_byte or d.read_nj_per_byte, p.write_nj_per_byte or d.write_nj_per_byte)


def perf_flops(p: DeviceProfile) -> float:
    """The FLOP/s a device is known by where devices are compared or drawn (P_k: the pools' draws,
    FedProphet's perf / perf_min, the `paper` accounting): the FedProphet release's figure where the
    profile has one, else its sustained rate on convolutions: its fitted `conv` share (its own or
    its family's, as runs charge it), else its or its class's efficiency, x its peak."""
    if p.release_gflops:
        return p.release_gflops * 1e9
    fitted = fitted_of(p.family, p.fitted).efficiency.get("conv")
    share = fitted or p.efficiency or CLASS_DEFAULTS[p.device_class].efficiency
    return p.flops * share
