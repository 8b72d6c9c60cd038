"""Device, co-running app and network profiles: what the hardware is, and the checks of every figure
(edgefl.devices.catalog reads them from TOML files).

Units are in the key names: storage in MB/s (`*_mb_s`), links in Mbit/s (`*_mbit_s`), bandwidth in
GB/s (`*_gbps`); a key an earlier edgefl named otherwise (edgefl.tomlschema.RENAMED) is still read,
with a warning line naming today's. The numbers of FedProphet's pools and apps come from its release
(Tang et al., FedProphet, §7.1); each file says where its numbers come from in `source`.

The compute model (edgefl.sim.compute) also reads a device's class, memory bandwidth, sustained
efficiency and per-operator overhead (`compute_source` says where they come from); a figure a profile
omits (the key absent) is its class's default (edgefl.devices.classes). A calibrated host carries fitted
rooflines per layer kind and pass in its `[kernels]` table instead.

The energy model (edgefl.sim.energy) reads a device's active and idle watts and storage energy per
byte (`power_source`; absent = the class default), its battery (0 Wh = mains powered), and its network's
radio energy per byte sent and received, base power and tail (`energy_source`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import get_type_hints

from edgefl.errors import EdgeflError

KERNEL_KINDS = ("conv", "conv3x3", "dwconv", "linear", "norm", "activation", "clamp", "pool", "elementwise")
CONV_KINDS = ("conv", "conv3x3", "dwconv")
TF32_KINDS = ("conv", "conv3x3")  # the dense convolutions cuDNN runs in TF32 when asked for fp32
MATRIX_KINDS = ("conv", "conv3x3", "linear")  # the kinds a CPU's BLAS runs as GEMMs
# the kinds whose kernels stream memory (a share of the sustained bandwidth fitted for each)
MEMORY_KINDS = ("dwconv", "norm", "activation", "clamp", "pool", "elementwise")
# The least sustained share of a datasheet bandwidth: STREAM triad reaches about a third of it on a
# Raspberry Pi 4 (4-5 GB/s of 12.8, community STREAM results) and 0.6-0.9 on desktops and GPUs
# (McCalpin's STREAM tables): a fitted bandwidth below a quarter would say the memory is slower
# than any measured one, where it is the kernels that stream slower (Fitted.memory).
BANDWIDTH_FLOOR = 0.25
# a kind a calibrated profile has no figures for (one older than the kind) is charged as its parent
PARENT_KIND = {"conv3x3": "conv", "dwconv": "conv", "clamp": "activation"}


@dataclass(frozen=True)
class Kernels:
    """Per layer kind, per pass (forward, input gradient, weight gradient): [sustained GFLOP/s,
    effective GB/s, overhead us per operator], as `edgefl devices calibrate` fits them."""

    conv: list[list[float]] = field(default_factory=list)
    conv3x3: list[list[float]] = field(default_factory=list)
    dwconv: list[list[float]] = field(default_factory=list)
    linear: list[list[float]] = field(default_factory=list)
    norm: list[list[float]] = field(default_factory=list)
    activation: list[list[float]] = field(default_factory=list)
    clamp: list[list[float]] = field(default_factory=list)
    pool: list[list[float]] = field(default_factory=list)
    elementwise: list[list[float]] = field(default_factory=list)


@dataclass(frozen=True)
class Efficiencies:
    """Sustained share of peak FLOP/s per layer kind where a device's kernels differ (0 = the
    profile's `efficiency`, else its class's): fitted on measurements (`edgefl devices fit`)."""

    conv: float = 0.0
    conv3x3: float = 0.0
    dwconv: float = 0.0
    linear: float = 0.0
    source: str = ""  # the measurements they were fitted on


@dataclass(frozen=True)
class Fitted:
    """The compute model's figures fitted on published step times (edgefl.calibration.fit, written
    by bench/published.py --write or `edgefl devices fit`): per layer kind and precision (`conv`,
    `conv@fp16`, `conv@tf32`, ...) the sustained share of the peak that kind runs at, the share of
    the datasheet `memory_bandwidth_gbps` sustained, the per-operator overhead, and where they come
    from. Empty (no shares) = not fitted."""

    efficiency: dict[str, float] = field(default_factory=dict)
    memory: dict[str, float] = field(default_factory=dict)  # per memory-bound kind: its share of that
    bandwidth_share: float = 0.0
    op_overhead_us: float = 0.0
    basis: str = ""  # "device" (its own rows), "family" (its family's and architecture's), "arch"
    rows: list[str] = field(default_factory=list)  # the measurements of this device in the fit
    residual_log2: float = 0.0  # median |log2(predicted / measured)| of its own rows, fitted
    unseen_log2: float = 0.0  # the same, predicted with the device left out of the fit
    source: str = ""  # what fitted them, on which table, when


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    description: str
    source: str
    memory_mb: float
    compute_gflops: float  # peak FP32 FLOP/s (a datasheet's); the compute model derates it
    storage_read_mb_s: float  # MB/s
    storage_write_mb_s: float  # MB/s
    storage_latency_ms: float
    pools: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)  # networks it may draw; omitted = every one found
    device_class: str = "generic"  # one of DEVICE_CLASSES (edgefl.devices.classes says what each means)
    family: str = ""  # the core or GPU generation that trains (FAMILIES); "" = its class's architecture
    memory_bandwidth_gbps: float | None = None  # GB/s, the datasheet's; absent = the class default
    efficiency: float | None = None  # sustained share of peak FLOP/s, conv and linear; absent = class default
    op_overhead_us: float | None = None  # fixed cost per operator launch; absent = the class default
    # fixed costs outside the operators (`edgefl devices calibrate` measures them; 0 = none charged):
    iteration_overhead_us: float = 0.0  # per local iteration: Python, the batch gather, the optimizer loop
    attack_step_overhead_us: float = 0.0  # per PGD step of an iteration: the attack loop's Python
    round_overhead_ms: float = 0.0  # per client-round: a fresh model, its state loaded, the optimizer made
    compute_source: str = ""  # where the three figures above come from
    kernels: Kernels = field(default_factory=Kernels)  # fitted per-kind rooflines (calibrated hosts)
    efficiency_by_kind: Efficiencies = field(default_factory=Efficiencies)  # per-kind shares
    fitted: Fitted = field(default_factory=Fitted)  # figures fitted on published step times
    # The FedProphet release's figure for a device of its pools (0 = none): what the `paper` accounting
    # charges, the pools draw by (fleet.balance_s) and FedProphet compares (edgefl.devices.classes.perf_flops)
    release_gflops: float = 0.0
    fp16_gflops: float = 0.0  # FP16 peak (tensor or matrix units where the hardware has them); 0 = unknown
    bf16_gflops: float = 0.0  # BF16 peak; 0 = unknown or none
    int8_gops: float = 0.0  # INT8 peak, GOP/s; 0 = unknown or none
    # TF32 tensor peak (0 = none): PyTorch runs fp32 dense convolutions on it (cudnn.allow_tf32, on since 1.7)
    tf32_gflops: float = 0.0
    # FP32 peak of a matrix unit the CPU's BLAS runs GEMM-based layers on (Apple's AMX under
    # Accelerate); 0 = none: dense convolutions and linear layers run at it instead of the NEON peak
    matrix_gflops: float = 0.0
    precision_source: str = ""  # where the peaks above come from
    calibrated_host: str = ""  # the machine `edgefl devices calibrate` measured (its network name)
    calibrated_threads: int = 0  # torch threads it measured with
    active_w: float | None = None  # W drawn training at full load (the whole device); absent = class default
    idle_w: float | None = None  # W drawn awake and idle (waiting, reading, sending); absent = class default
    read_nj_per_byte: float | None = None  # storage energy per byte read, nJ; absent = the class default
    write_nj_per_byte: float | None = None  # storage energy per byte written, nJ; absent = the class default
    battery_wh: float = 0.0  # battery capacity, Wh; 0 = mains powered
    power_source: str = ""  # where the five power figures above come from

    @property
    def memory_bytes(self) -> float:
        return self.memory_mb * 1e6

    @property
    def flops(self) -> float:
        """Peak FP32 FLOP/s."""
        return self.compute_gflops * 1e9

    def peak(self, precision: str) -> float:
        """Peak FLOP/s (OP/s for int8) in `precision`; 0 where the profile gives none."""
        return {"fp32": self.compute_gflops, "fp16": self.fp16_gflops, "bf16": self.bf16_gflops,
                "int8": self.int8_gops}[precision] * 1e9

    def runs_matrix(self, kind: str, precision: str) -> bool:
        """Whether layers of `kind` asked for in `precision` run on the matrix unit's peak."""
        return precision == "fp32" and self.matrix_gflops > 0 and kind in MATRIX_KINDS

    def runs_tf32(self, kind: str, precision: str) -> bool:
        """Whether layers of `kind` asked for in `precision` run on the TF32 tensor peak."""
        return precision == "fp32" and self.tf32_gflops > 0 and kind in TF32_KINDS


PRECISION_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2, "int8": 1}  # bytes per element a device moves


@dataclass(frozen=True)
class AppProfile:
    name: str
    description: str
    source: str
    perf_left: float  # share of peak compute left for training
    memory_left: float  # share of memory the app leaves to other work


@dataclass(frozen=True)
class NetworkProfile:
    name: str
    description: str
    source: str
    up_mbit_s: list[float]  # Mbit/s [low, high]
    down_mbit_s: list[float]  # Mbit/s [low, high]
    latency_ms: list[float]
    up_nj_per_byte: float = 0.0  # radio energy per byte sent, nJ (the device's side of the link)
    down_nj_per_byte: float = 0.0  # radio energy per byte received, nJ
    radio_w: float = 0.0  # the radio's base power while a transfer runs, W
    tail_s: float = 0.0  # seconds the radio stays in its high-power state after the last byte (0: no tail)
    tail_w: float = 0.0  # the radio's power in that tail, W
    energy_source: str = ""  # where the figures above come from


# Sane ranges, far beyond any real device: a figure past them is a typo, and would overflow the cost
# model's arithmetic into inf or nan simulated hours. Every number of a device profile is checked,
# a new field too: at most its bound (MAX_FIGURE by default) and at least MIN_FIGURE, or 0 where a
# field is not listed in POSITIVE (a figure that small is a typo and would divide into inf hours).
UPPER = {"storage_read_mb_s": 1e8, "storage_write_mb_s": 1e8, "storage_latency_ms": 1e6,  # MB/s, ms
         "efficiency": 1.0}  # a fraction of peak
MAX_KIND_EFFICIENCY = 4.0  # Winograd 3x3 convolutions do 2.25x fewer multiplies than counted
EFFICIENCY_KINDS = ("conv", "conv3x3", "dwconv", "linear")
MAX_FIGURE = 1e9  # MB of memory, GFLOP/s: a petabyte, an exaFLOP/s
MIN_FIGURE = 1e-6  # the least non-zero figure: a byte, a kFLOP/s, a byte/s, a millionth of peak
POSITIVE = ("memory_mb", "compute_gflops", "storage_read_mb_s", "storage_write_mb_s")
MAX_LATENCY_MS = UPPER["storage_latency_ms"]  # 1000 s per access or message
MAX_LINK_MBPS = 1e8  # 100 Tbit/s


def _number_checks(p: DeviceProfile) -> list[tuple[str, bool, str]]:
    hints = get_type_hints(DeviceProfile)
    checks = []
    for k in (f.name for f in fields(DeviceProfile) if hints[f.name] in (int, float, float | None)):
        v, high, optional = getattr(p, k), UPPER.get(k, MAX_FIGURE), hints[k] == float | None
        if v is None:
            continue
        positive = k in POSITIVE or optional  # absent, not 0, is an optional figure's class default
        checks.append((k, ((v == 0 and not positive) or v >= MIN_FIGURE) and v <= high,
                       f"must be {'' if positive else '0 or '}{MIN_FIGURE:g} to {high:g}"
                       + (" (omit it for the class default)" if optional else "")))
    return checks


def check_profile(p: DeviceProfile | AppProfile | NetworkProfile, where: str, stem: str) -> None:
    """Range checks and the name, which must be the file's (`stem`); one line on the first that fails."""
    checks: list[tuple[str, bool, str]] = [("name", p.name == stem, f"must equal the file name {stem!r}")]
    if isinstance(p, DeviceProfile):
        checks += [
            *_number_checks(p),
            ("device_class", p.device_class in DEVICE_CLASSES, f"must be one of {', '.join(DEVICE_CLASSES)}"),
            ("family", not p.family or p.family in FAMILIES,
             f"must be one of {', '.join(FAMILIES)} (or omitted)"),
            *_fitted_checks(p.fitted),
            ("active_w", not (p.active_w and p.idle_w) or p.active_w >= p.idle_w,
             "must be at least idle_w (the watts at full load include the idle draw)"),
        ]
        checks += [(f"efficiency_by_kind.{k}", getattr(p.efficiency_by_kind, k) == 0
                    or MIN_FIGURE <= getattr(p.efficiency_by_kind, k) <= MAX_KIND_EFFICIENCY,
                    f"must be 0 or {MIN_FIGURE:g} to {MAX_KIND_EFFICIENCY:g} (a share of peak; above 1 "
                    "where fast algorithms, Winograd, beat the direct FLOP count)")
                   for k in EFFICIENCY_KINDS]
        checks += [(f"kernels.{k}", _kernel_ok(getattr(p.kernels, k)),
                    "must list up to 3 passes, each [GFLOP/s, GB/s, overhead us] with rates of "
                    f"{MIN_FIGURE:g} to {MAX_FIGURE:g} and an overhead of 0 to {MAX_FIGURE:g}")
                   for k in KERNEL_KINDS]
    elif isinstance(p, AppProfile):
        checks += [(k, MIN_FIGURE <= getattr(p, k) <= 1, f"must be a fraction in [{MIN_FIGURE:g}, 1]")
                   for k in ("perf_left", "memory_left")]
    else:
        checks += [(k, len(v) == 2 and MIN_FIGURE <= v[0] <= v[1] <= high,
                    f"must be [low, high] with {MIN_FIGURE:g} <= low <= high <= {high:g}")
                   for k, v, high in (("up_mbit_s", p.up_mbit_s, MAX_LINK_MBPS),
                                      ("down_mbit_s", p.down_mbit_s, MAX_LINK_MBPS),
                                      ("latency_ms", p.latency_ms, MAX_LATENCY_MS))]
        checks += [(k, 0 <= getattr(p, k) <= MAX_FIGURE, f"must be non-negative and at most {MAX_FIGURE:g}")
                   for k in ("up_nj_per_byte", "down_nj_per_byte", "radio_w", "tail_s", "tail_w")]
    for key, ok, fix in checks:
        if not ok:
            raise EdgeflError(where, key, fix)


def _fitted_checks(f: Fitted) -> list[tuple[str, bool, str]]:
    """Fitted figures that mean what they say: shares in (0, 1], an overhead non-negative."""
    share = f"must be a share of peak, above 0 and at most 1 ({MIN_FIGURE:g} to 1)"
    keys = [f"{k}{at}" for k in EFFICIENCY_KINDS for at in ("", "@fp16", "@bf16", "@int8", "@tf32")]
    return [*((f"fitted.efficiency.{k}", k in keys and MIN_FIGURE <= v <= 1,
               share + f", for a kind of {', '.join(EFFICIENCY_KINDS)} (KIND@fp16, @bf16, @int8 or @tf32 "
               "for another precision)") for k, v in f.efficiency.items()),
            *((f"fitted.memory.{k}", k in MEMORY_KINDS and MIN_FIGURE <= v <= 1,
               share + f", for a kind of {', '.join(MEMORY_KINDS)}") for k, v in f.memory.items()),
            ("fitted.bandwidth_share", not f.efficiency or BANDWIDTH_FLOOR <= f.bandwidth_share <= 1,
             f"must be a share of the datasheet bandwidth, {BANDWIDTH_FLOOR:g} to 1 (no memory streams "
             "slower: BANDWIDTH_FLOOR)"),
            *((f"fitted.{k}", 0 <= getattr(f, k) <= MAX_FIGURE, f"must be 0 to {MAX_FIGURE:g}")
              for k in ("op_overhead_us", "residual_log2", "unseen_log2"))]


def _kernel_ok(rows: list[list[float]]) -> bool:
    return len(rows) <= 3 and all(len(r) == 3 and min(r[:2]) >= MIN_FIGURE and max(r) <= MAX_FIGURE
                                  and r[2] >= 0 for r in rows)


# The core or GPU generations whose figures a fit shares (edgefl.calibration.fit), and the
# architecture each belongs to.
FAMILIES = {**{f: "cpu" for f in ("cortex-a53", "cortex-a55", "cortex-a72", "cortex-a76", "cortex-a78",
                                  "cortex-x1", "apple-firestorm", "x86-avx2", "x86-avx512")},
            **{f: "gpu" for f in ("nvidia-maxwell", "nvidia-pascal", "nvidia-volta", "nvidia-turing",
                                  "nvidia-ampere", "nvidia-ada", "apple-gpu", "adreno", "mali")}}
DEVICE_CLASSES = ("microcontroller", "phone_cpu", "phone_gpu", "sbc", "gpu", "fpga", "cpu", "generic")
