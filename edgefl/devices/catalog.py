"""The catalog: every device, app and network profile under device_profiles/."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from edgefl.devices.profile import AppProfile, DeviceProfile, NetworkProfile, load_profile

PROFILES_DIR = Path(__file__).resolve().parents[2] / "device_profiles"


@dataclass(frozen=True)
class Catalog:
    devices: dict[str, DeviceProfile]
    apps: dict[str, AppProfile]
    networks: dict[str, NetworkProfile]

    def pool(self, name: str) -> list[DeviceProfile]:
        return [d for d in self.devices.values() if name in d.pools]

    def pools(self) -> list[str]:
        return sorted({p for d in self.devices.values() for p in d.pools})


@functools.cache
def load_catalog(root: Path = PROFILES_DIR) -> Catalog:
    """Load device_profiles/*.toml, apps/*.toml and networks/*.toml (sorted by name)."""
    return Catalog(
        devices={p.stem: load_profile(p, DeviceProfile) for p in sorted(root.glob("*.toml"))},
        apps={p.stem: load_profile(p, AppProfile) for p in sorted((root / "apps").glob("*.toml"))},
        networks={
            p.stem: load_profile(p, NetworkProfile)
            for p in sorted((root / "networks").glob("*.toml"))
        },
    )
