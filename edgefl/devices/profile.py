"""Device, co-running app and network profiles: what the hardware is, read from TOML files.

Units are in the key names. The numbers of FedProphet's pools and apps come from its release
(Tang et al., FedProphet, §7.1); each file says where its numbers come from in `source`.
"""

from __future__ import annotations

import tomllib
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar, get_type_hints

from edgefl.config import build
from edgefl.errors import EdgeflError

NETWORK_NAMES = ["dsl", "cable", "4g", "5g", "wifi", "fiber", "satellite"]


@dataclass(frozen=True)
class DeviceProfile:
    name: str
    description: str
    source: str
    memory_mb: float
    compute_gflops: float
    storage_read_mbps: float
    storage_write_mbps: float
    storage_latency_ms: float
    pools: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=lambda: list(NETWORK_NAMES))

    @property
    def memory_bytes(self) -> float:
        return self.memory_mb * 1e6

    @property
    def flops(self) -> float:
        return self.compute_gflops * 1e9


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
    up_mbps: list[float]  # Mbit/s [low, high]
    down_mbps: list[float]
    latency_ms: list[float]


P = TypeVar("P", DeviceProfile, AppProfile, NetworkProfile)


def load_profile(path: Path, cls: type[P]) -> P:
    """Load and validate one profile file; errors name the file and key."""
    where = str(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgeflError(where, "file", f"cannot be read ({exc})") from None
    try:
        raw: dict[str, Any] = tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError, an int over 4300 digits, deep nesting
        raise EdgeflError(where, "syntax", f"not valid TOML ({exc})") from None
    missing = [k for k in _required(cls) if k not in raw]
    if missing:
        raise EdgeflError(where, missing[0], "missing; every profile of this kind needs it")
    profile: P = build(cls, raw, where, "")
    _check(profile, where, path.stem)
    return profile


def _required(cls: type) -> list[str]:
    return [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]


# Sane ranges, far beyond any real device: a figure past them is a typo, and would overflow the cost
# model's arithmetic into inf or nan simulated hours. Every number of a device profile is checked,
# a new field too: non-negative (positive where listed) and at most its bound, MAX_FIGURE by default.
UPPER = {"storage_read_mbps": 1e8, "storage_write_mbps": 1e8, "storage_latency_ms": 1e6}  # MB/s, ms
MAX_FIGURE = 1e9  # MB of memory, GFLOP/s: a petabyte, an exaFLOP/s
POSITIVE = ("memory_mb", "compute_gflops", "storage_read_mbps", "storage_write_mbps")
MAX_LATENCY_MS = UPPER["storage_latency_ms"]  # 1000 s per access or message
MAX_LINK_MBPS = 1e8  # 100 Tbit/s


def _number_checks(p: DeviceProfile) -> list[tuple[str, bool, str]]:
    hints = get_type_hints(DeviceProfile)
    checks = []
    for k in (f.name for f in fields(DeviceProfile) if hints[f.name] in (int, float)):
        v, high, positive = getattr(p, k), UPPER.get(k, MAX_FIGURE), k in POSITIVE
        checks.append((k, (v > 0 if positive else v >= 0) and v <= high,
                       f"must be {'positive' if positive else 'non-negative'} and at most {high:g}"))
    return checks


def _check(p: DeviceProfile | AppProfile | NetworkProfile, where: str, stem: str) -> None:
    checks: list[tuple[str, bool, str]] = [("name", p.name == stem, f"must equal the file name {stem!r}")]
    if isinstance(p, DeviceProfile):
        checks += [
            *_number_checks(p),
            ("networks", bool(p.networks) and set(p.networks) <= set(NETWORK_NAMES),
             f"must be a non-empty list drawn from {', '.join(NETWORK_NAMES)}"),
        ]
    elif isinstance(p, AppProfile):
        checks += [(k, 0 < getattr(p, k) <= 1, "must be a fraction in (0, 1]")
                   for k in ("perf_left", "memory_left")]
    else:
        checks += [(k, len(v) == 2 and 0 < v[0] <= v[1] <= high,
                    f"must be [low, high] with 0 < low <= high <= {high:g}")
                   for k, v, high in (("up_mbps", p.up_mbps, MAX_LINK_MBPS),
                                      ("down_mbps", p.down_mbps, MAX_LINK_MBPS),
                                      ("latency_ms", p.latency_ms, MAX_LATENCY_MS))]
    for key, ok, fix in checks:
        if not ok:
            raise EdgeflError(where, key, fix)
