"""Host calibration: measure the machine in front of you and write its device profile.

`edgefl devices calibrate` fills the DeviceProfile fields (edgefl/devices/profile.py) the cost model
reads (FedProphet's T = FLOPs / P_k + storage traffic / bandwidth, Tang et al. §4 and §7.1) from
measurements instead of datasheets: total memory through psutil, FLOP/s by timed fp32 matmul and
conv2d in PyTorch, the compute model's rooflines per layer kind and pass fitted on a grid of layer
shapes (edgefl.calibration.kernels), storage bandwidth and per-access latency by timed file I/O. Every
timing is repeated and the median kept, so one slow repeat (another process, a frequency step) does
not move the figure.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import platform
import random
import statistics
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import date
from pathlib import Path

import psutil
import torch
import torch.nn.functional as F

from edgefl.calibration import kernels
from edgefl.calibration.fixed import FixedCosts, measure_fixed
from edgefl.devices.catalog import load_profile
from edgefl.devices.profile import KERNEL_KINDS, DeviceProfile
from edgefl.errors import EdgeflError
from edgefl.rundir import write_file
from edgefl.sim.compute import FORWARD, PASSES, Roofline, Rooflines

MIB = 1 << 20
Clock = Callable[[], float]


@dataclass(frozen=True)
class Sizes:
    """How much work each measurement does."""

    matmul_n: int  # n x n @ n x n
    conv: tuple[int, int, int]  # batch, channels in = out, image side (3x3 kernel, padding 1)
    file_mib: int  # sequential bandwidth file
    small_ops: int  # random 4 KiB reads, and as many 4 KiB writes, for the latency
    quick_grid: bool  # time only a few small layers for the rooflines


FULL = Sizes(matmul_n=1024, conv=(16, 64, 56), file_mib=128, small_ops=64, quick_grid=False)
QUICK = Sizes(matmul_n=64, conv=(2, 8, 16), file_mib=1, small_ops=4, quick_grid=True)
BLOCK = 4096  # one small access: a page, the unit of a swap-in


@dataclass(frozen=True)
class Compute:
    matmul_gflops: float
    conv_gflops: float

    @property
    def peak_gflops(self) -> float:
        """The larger: profiles hold peak FLOP/s, as the datasheet figures in device_profiles/ do."""
        return max(self.matmul_gflops, self.conv_gflops)


@dataclass(frozen=True)
class Storage:
    read_mbps: float
    write_mbps: float
    read_latency_ms: float
    write_latency_ms: float
    direct: bool  # latencies through O_DIRECT; False: buffered, each write followed by fsync

    @property
    def latency_ms(self) -> float:
        """The cost model charges one latency to every read and every write access: their mean."""
        return (self.read_latency_ms + self.write_latency_ms) / 2


Fitted = tuple[tuple[tuple[str, str], Roofline], ...]  # ((kind, pass), roofline) pairs


@dataclass(frozen=True)
class Calibration:
    memory_mb: float
    compute: Compute
    storage: Storage
    rooflines: Fitted = ()  # fitted per (kind, pass)
    fixed: FixedCosts | None = None  # the fixed costs outside the operators
    threads: int = 0  # torch threads the compute figures were measured with
    cpu_time: bool = False  # compute timed on the process's CPU clock instead of the wall clock


def median_time(fn: Callable[[], object], repeats: int, clock: Clock = time.perf_counter) -> float:
    """Seconds one call of `fn` takes: the median over `repeats` timed calls."""
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


MIN_BATCH_S = 0.02  # a timed batch of calls lasts about this long at least
PROBES = 3  # single calls timed to size the batch (their fastest counts)


def per_call(fn: Callable[[], object], repeats: int, clock: Clock = time.perf_counter) -> float:
    """Seconds one call of `fn` takes: calls timed in batches sized from the fastest of PROBES
    single calls to last MIN_BATCH_S, the median over `repeats` batches, per call. Timing a small
    kernel one call at a time let one late thread wake-up on a busy machine stand for the kernel (a
    --quick 64x64 matmul read 0.03 GFLOP/s on a 70 GFLOP/s host in 6 of 8 runs)."""
    fastest = min(median_time(fn, 1, clock) for _ in range(PROBES))
    calls = max(1, math.ceil(MIN_BATCH_S / max(fastest, 1e-6)))  # a coarse clock's 0 s: 20,000 calls
    return median_time(lambda: _calls(fn, calls), repeats, clock) / calls


def _calls(fn: Callable[[], object], n: int) -> None:
    for _ in range(n):
        fn()


def measure_memory() -> float:
    """Total physical memory in MB (1e6 bytes), as psutil reports it (not a container's cgroup limit)."""
    return psutil.virtual_memory().total / 1e6


def measure_flops(sizes: Sizes, repeats: int, clock: Clock = time.perf_counter) -> Compute:
    """fp32 GFLOP/s of a matmul and of a 3x3 conv2d on the CPU, with PyTorch's current thread count.

    One multiply-accumulate is 2 FLOPs (as edgefl/profiling/atoms.py counts them): an n x n matmul is
    2 n^3 FLOPs, a conv with B images, C channels in and out and an S x S output is 2 B C^2 9 S^2.
    Each is run once untimed first (allocation, kernel selection).
    """
    n = sizes.matmul_n
    a, b = torch.randn(n, n), torch.randn(n, n)
    batch, ch, side = sizes.conv
    x, w = torch.randn(batch, ch, side, side), torch.randn(ch, ch, 3, 3)
    with torch.inference_mode():
        matmul = _gflops(lambda: torch.mm(a, b), 2 * n**3, repeats, clock)
        conv = _gflops(lambda: F.conv2d(x, w, padding=1), 2 * batch * ch * ch * 9 * side * side, repeats,
                       clock)
    return Compute(matmul_gflops=matmul, conv_gflops=conv)


def _gflops(fn: Callable[[], object], flops: int, repeats: int, clock: Clock) -> float:
    fn()
    return flops / per_call(fn, repeats, clock) / 1e9


def measure_storage(folder: Path, sizes: Sizes, repeats: int) -> Storage:
    """Bandwidth (MB/s, 1e6 B) and per-access latency (ms) of the file system holding `folder`.

    Write: `file_mib` MiB of random bytes in 1 MiB blocks, timed to the end of an fsync. Read: the same
    file sequentially, after posix_fadvise(DONTNEED) has dropped its (clean, synced) pages from the
    page cache, so the bytes come from the device, not from memory. Latency: 4 KiB reads and writes
    at distinct random page offsets, the median per access, through O_DIRECT (no page cache either
    way) where the system and file system allow it; else reads after dropping the cache with
    readahead off (FADV_RANDOM), and writes each followed by fsync, which adds a device cache flush
    that swapping does not pay (`Storage.direct` says which). Where posix_fadvise is missing (macOS,
    Windows) reads may be served from the cache and come out too fast. The temporary file is removed.
    """
    block = os.urandom(MIB)
    with _temp_file(folder) as path:
        write = median_time(lambda: _write_file(path, block, sizes.file_mib), repeats)
        read = median_time(lambda: _read_file(path), repeats)
        pages = random.Random(0).sample(range(sizes.file_mib * MIB // BLOCK), 2 * sizes.small_ops)
        fd, direct = _open_uncached(path)
        page = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
        try:
            page.write(block[:BLOCK])
            read_op = _median_op(lambda p: os.preadv(fd, [page], p * BLOCK), pages[:sizes.small_ops])
            write_op = _median_op(lambda p: _write_page(fd, page, p * BLOCK, sync=not direct),
                                  pages[sizes.small_ops:])
        finally:
            page.close()
            os.close(fd)
    mb = sizes.file_mib * MIB / 1e6
    return Storage(read_mbps=mb / read, write_mbps=mb / write, read_latency_ms=read_op * 1e3,
                   write_latency_ms=write_op * 1e3, direct=direct)


@contextmanager
def _temp_file(folder: Path) -> Iterator[Path]:
    fd, name = tempfile.mkstemp(prefix=".edgefl-calibrate-", dir=folder)
    os.close(fd)
    try:
        yield Path(name)
    finally:
        Path(name).unlink(missing_ok=True)


def _write_file(path: Path, block: bytes, mib: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_TRUNC)
    try:
        for _ in range(mib):
            os.write(fd, block)
        os.fsync(fd)
        _drop_cache(fd)
    finally:
        os.close(fd)


def _read_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        _drop_cache(fd)
        while os.read(fd, MIB):
            pass
    finally:
        os.close(fd)


def _open_uncached(path: Path) -> tuple[int, bool]:
    """(fd, whether it is O_DIRECT) for single-page accesses that bypass the page cache."""
    direct = getattr(os, "O_DIRECT", 0)
    if direct:
        try:
            return os.open(path, os.O_RDWR | direct), True
        except OSError:  # the file system refuses O_DIRECT (e.g. tmpfs before Linux 6.6)
            pass
    fd = os.open(path, os.O_RDWR)
    _drop_cache(fd, random_access=True)
    return fd, False


def _write_page(fd: int, page: mmap.mmap, offset: int, sync: bool) -> None:
    os.pwritev(fd, [page], offset)
    if sync:
        os.fsync(fd)


def _median_op(op: Callable[[int], object], pages: list[int]) -> float:
    """Median seconds of one `op(page)`, each page accessed once."""
    it = iter(pages)
    return median_time(lambda: op(next(it)), len(pages))


def _drop_cache(fd: int, random_access: bool = False) -> None:
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        if random_access:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)


def measure_rooflines(sizes: Sizes, repeats: int, peak_gflops: float,
                      clock: Clock = time.perf_counter) -> Fitted:
    """The compute model's rooflines, fitted on the layer grid (edgefl.calibration.kernels)."""
    def timer(fn: Callable[[], object], n: int) -> float:
        return per_call(fn, n, clock)

    samples = [s for batch, module, shape in kernels.grid(sizes.quick_grid)
               for s in kernels.measure(batch, module, shape, repeats, timer)]
    return tuple(kernels.fit(samples, peak_gflops * 1e9).items())


def calibrate(folder: Path, sizes: Sizes, repeats: int, cpu_time: bool = False) -> Calibration:
    """All measurements; storage is measured in `folder`. With `cpu_time` the compute figures are
    timed on the process's CPU clock: on a shared machine other processes' time is left out, and
    with one thread it equals wall time on an idle machine."""
    clock = time.process_time if cpu_time else time.perf_counter
    compute = measure_flops(sizes, repeats, clock)
    rooflines = measure_rooflines(sizes, repeats, compute.peak_gflops, clock)
    fixed = measure_fixed(Rooflines(rooflines), lambda fn: median_time(fn, repeats, clock))
    return Calibration(measure_memory(), compute, measure_storage(folder, sizes, repeats), rooflines,
                       fixed, torch.get_num_threads(), cpu_time)


def render_profile(name: str, pool: str, c: Calibration) -> str:
    """The profile as commented TOML, in the style of the files in device_profiles/."""
    cpu, s = platform.processor() or platform.machine(), c.storage
    source = (f"edgefl devices calibrate on {date.today().isoformat()}: psutil total memory; "
              f"median fp32 GFLOP/s of torch {torch.__version__} on {torch.get_num_threads()} threads; "
              f"timed file I/O past the page cache")
    return "\n".join([
        f"# This host ({platform.system()} {cpu}, {os.cpu_count()} CPUs), measured by edgefl calibrate",
        f"name = {_quote(name)}",
        f"description = {_quote(f'{platform.node()} ({platform.system()} {cpu})')}",
        f"pools = [{_quote(pool)}]",
        f"source = {_quote(source)}",
        f"memory_mb = {c.memory_mb:.1f}",
        f"compute_gflops = {_sig(c.compute.peak_gflops)}   # the larger of matmul "
        f"{_sig(c.compute.matmul_gflops)} and conv2d {_sig(c.compute.conv_gflops)}",
        f"storage_read_mb_s = {_sig(s.read_mbps)}",
        f"storage_write_mb_s = {_sig(s.write_mbps)}",
        f"storage_latency_ms = {_sig(s.latency_ms)}   # mean of 4 KiB read {_sig(s.read_latency_ms)} "
        f"and write{'' if s.direct else ' + fsync'} {_sig(s.write_latency_ms)}"
        f"{' (O_DIRECT)' if s.direct else ''}",
        "# networks = [\"wifi\", \"fiber\"]   # omitted: every network found (networks/*.toml)",
        *_compute_lines(c),
        "",
    ])


def _compute_lines(c: Calibration) -> list[str]:
    """The compute model's figures: class, host, threads and the fitted [kernels] table (last)."""
    if not c.rooflines:
        return []
    fitted = dict(c.rooflines)
    conv = fitted.get(("conv3x3", FORWARD)) or fitted.get(("conv", FORWARD))  # the common convolution
    elementwise = fitted.get(("elementwise", FORWARD))
    source = (f"edgefl devices calibrate on {date.today().isoformat()}: rooflines fitted on a grid of "
              f"layer shapes, torch {torch.__version__} on {c.threads} threads, "
              f"{'process CPU time' if c.cpu_time else 'wall time'}")
    lines = ['device_class = "cpu"', f"calibrated_host = {_quote(platform.node())}",
             f"calibrated_threads = {c.threads}", f"compute_source = {_quote(source)}"]
    if conv and elementwise:
        efficiency = min(1.0, conv.flops / (c.compute.peak_gflops * 1e9))
        lines += [f"efficiency = {_sig(efficiency)}   # conv forward",
                  f"memory_bandwidth_gbps = {_sig(elementwise.bandwidth / 1e9)}   # elementwise forward",
                  f"op_overhead_us = {_sig(max(elementwise.overhead_s * 1e6, 1e-3))}   # elementwise forward"]
    if c.fixed:
        lines += [f"iteration_overhead_us = {_sig(c.fixed.iteration_us)}   # outside the operators",
                  f"attack_step_overhead_us = {_sig(c.fixed.attack_step_us)}   # per PGD step",
                  f"round_overhead_ms = {_sig(c.fixed.round_ms)}   # per client-round"]
    lines.append("\n[kernels]  # per pass (forward, input gradient, weight gradient): "
                 "[GFLOP/s, GB/s, overhead us]")
    for kind in KERNEL_KINDS:
        rows = [fitted[(kind, ps)] for ps in PASSES if (kind, ps) in fitted]
        if rows:
            cells = ", ".join(f"[{_sig(r.flops / 1e9)}, {_sig(r.bandwidth / 1e9)}, "
                              f"{_sig(r.overhead_s * 1e6)}]" for r in rows)
            lines.append(f"{kind} = [{cells}]")
    return lines


def _quote(text: str) -> str:
    """A TOML basic string (JSON's, with non-ASCII kept: TOML has no surrogate-pair escapes)."""
    return json.dumps(text, ensure_ascii=False)


def _sig(x: float) -> str:
    """Four significant digits as a TOML float: a tiny figure (a --quick run) never rounds to 0."""
    return repr(float(f"{x:.4g}"))


def write_profile(path: Path, text: str) -> DeviceProfile:
    """Load the text as a profile under its final file name in a temporary folder beside `path`, then
    rename it into place: a profile that would not load is never written, and no half file is left."""
    with tempfile.TemporaryDirectory(prefix=".edgefl-calibrate-", dir=path.parent) as tmp:
        staged = Path(tmp) / path.name
        write_file(staged, text)  # the safe writer: fsynced before it is renamed into place
        profile = load_profile(staged, DeviceProfile)
        os.replace(staged, path)
    return profile


def looks_like_a_profile(path: Path) -> bool:
    """Whether `path` is a TOML table with a device profile's memory and compute keys."""
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return False
    return {"memory_mb", "compute_gflops"} <= table.keys()


def prepare_target(out: Path, repeats: int, overwrite: bool) -> None:
    """Refuse a target that could not be written or loaded as a profile, before any measuring, and
    create its folder."""
    where = str(out)
    checks = [
        ("--out", out.suffix == ".toml", "must be a .toml file, e.g. device_profiles/my_host.toml"),
        ("--out", not out.is_dir(), "is a folder; give a .toml file in it"),
        ("--out", overwrite or not out.exists(), "already exists; choose another --out or pass --overwrite"),
        ("--overwrite", not out.is_file() or looks_like_a_profile(out), "replaces only a device profile, and "
         "this file is not one (no memory_mb and compute_gflops); choose another --out"),
        ("--repeats", repeats >= 1, "must be at least 1"),
    ]
    for key, ok, fix in checks:
        if not ok:
            raise EdgeflError(where, key, fix)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgeflError(where, "--out", f"cannot create its folder ({exc})") from None
