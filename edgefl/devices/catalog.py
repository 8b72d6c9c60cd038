"""The catalog: the device, co-running app and network profiles a scenario can use.

Profiles are found along a search path, first file of a name wins (so a user's profile may shadow a
bundled one of the same name):

1. `device_profiles/` beside the scenario file,
2. the folders of `EDGEFL_PROFILE_PATH` (colon-separated),
3. the folders installed plugins give (entry points `edgefl.devices`, edgefl.registry),
4. the profiles bundled with edgefl (package data `edgefl.device_profiles`, read through
   `importlib.resources`; in the repository they are the top-level `device_profiles/`).

Each folder holds devices as `*.toml`, apps as `apps/*.toml` and networks as `networks/*.toml`.
A device's `networks` must name networks found along the same path. `load_profile` reads one file;
a file written for an earlier edgefl still reads (`current_keys`), with a warning line per old key.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar, cast, get_type_hints

from edgefl.devices.profile import AppProfile, DeviceProfile, NetworkProfile, check_profile
from edgefl.errors import EdgeflError
from edgefl.registry import plugin_device_folders
from edgefl.tomlschema import build, read_toml, renamed

ENV = "EDGEFL_PROFILE_PATH"
KINDS = {"devices": "", "apps": "apps", "networks": "networks"}  # kind -> sub-folder


def bundled(folder: str) -> Path:
    """A folder of package data (`device_profiles` or `scenarios`) on disk.

    An installed edgefl (a wheel, or `pip install -e .`) has it as the package `edgefl.<folder>`;
    a source tree put on PYTHONPATH without installing has only the repository's folder of that name
    beside the package, which is used then."""
    try:
        root = resources.files(f"edgefl.{folder}")
    except ModuleNotFoundError:
        return Path(__file__).resolve().parents[2] / folder  # the repository: edgefl/devices/catalog.py
    return Path(str(root))  # an installed package is a folder on disk


def search_path(scenario: Path | str | None = None) -> tuple[Path, ...]:
    """The profile folders, in search order, for a scenario file (or none: a command without one)."""
    dirs = []
    if scenario is not None and (beside := Path(scenario).parent / "device_profiles").is_dir():
        dirs.append(beside)
    for text in (p for p in os.environ.get(ENV, "").split(os.pathsep) if p.strip()):
        if not Path(text).is_dir():
            raise EdgeflError(ENV, text, "is not a folder; give folders of profiles, colon-separated")
        dirs.append(Path(text))
    dirs += plugin_device_folders()
    home = bundled("device_profiles").resolve()  # last, even beside a bundled scenario
    unique = dict.fromkeys(d.resolve() for d in dirs if d.resolve() != home)  # each folder once
    return (*unique, home)


@dataclass(frozen=True)
class Catalog:
    devices: dict[str, DeviceProfile]
    apps: dict[str, AppProfile]
    networks: dict[str, NetworkProfile]
    files: dict[tuple[str, str], Path] = field(default_factory=dict)  # (kind, name) -> file read

    def pool(self, name: str) -> list[DeviceProfile]:
        return [d for d in self.devices.values() if name in d.pools]

    def pools(self) -> list[str]:
        return sorted({p for d in self.devices.values() for p in d.pools})

    def file(self, kind: str, name: str) -> Path:
        return self.files[(kind, name)]


def load_catalog(roots: Path | tuple[Path, ...] | None = None) -> Catalog:
    """The catalog along `roots` (a folder, or folders in search order; default: search_path()),
    cached per search path."""
    if roots is None:
        roots = search_path()
    return _load(roots if isinstance(roots, tuple) else (roots,))


def catalog_for(scenario: Path | str | None) -> Catalog:
    """The catalog a scenario file sees."""
    return load_catalog(search_path(scenario))


@functools.cache
def _load(roots: tuple[Path, ...]) -> Catalog:
    found = {kind: dict(_files(roots, sub)) for kind, sub in KINDS.items()}
    networks = {n: load_profile(p, NetworkProfile) for n, p in found["networks"].items()}
    devices = {n: load_profile(p, DeviceProfile, sorted(networks)) for n, p in found["devices"].items()}
    return Catalog(
        devices=devices,
        apps={n: load_profile(p, AppProfile) for n, p in found["apps"].items()},
        networks=networks,
        files={(kind, n): p for kind, names in found.items() for n, p in names.items()},
    )


def _files(roots: tuple[Path, ...], sub: str) -> Iterator[tuple[str, Path]]:
    """(name, file) of every profile of one kind, the first folder's file of a name winning, sorted."""
    chosen: dict[str, Path] = {}
    for root in roots:
        folder = root / sub if sub else root
        for path in sorted(folder.glob("*.toml")):
            chosen.setdefault(path.stem, path)
    yield from sorted(chosen.items())


def network_names(roots: tuple[Path, ...]) -> list[str]:
    """The networks along `roots`, by file name, without loading them."""
    return [name for name, _ in _files(roots, "networks")]


P = TypeVar("P", DeviceProfile, AppProfile, NetworkProfile)


def load_profile(path: Path, cls: type[P], networks: Sequence[str] | None = None) -> P:
    """Load and validate one profile file; errors name the file and key. A device's `networks` must
    be drawn from `networks` (default: those found without a scenario, in EDGEFL_PROFILE_PATH and
    the bundled profiles), and are all of them when omitted."""
    where = str(path)
    read = read_toml(path, where, "profile", "not found; it was removed while edgefl read the folder")
    raw = current_keys(read, cls, where)
    missing = [k for k in _required(cls) if k not in raw]
    if missing:
        kind = {DeviceProfile: "device", AppProfile: "app", NetworkProfile: "network"}.get(cls, "")
        also = f" (so are {', '.join(missing[1:])})" if len(missing) > 1 else ""
        raise EdgeflError(where, missing[0], f"missing{also}; every {kind} profile needs it")
    profile: P = build(cls, raw, where, "")
    if isinstance(profile, DeviceProfile):
        known = list(networks) if networks is not None else network_names(search_path())
        profile = cast(P, _with_networks(profile, "networks" in raw, known, where))
    check_profile(profile, where, path.stem)
    return profile


def current_keys(raw: dict[str, Any], cls: type, where: str) -> dict[str, Any]:
    """`raw` as today's edgefl names it (edgefl.tomlschema.RENAMED), without the 0s an earlier one read
    as the class default (today: the key absent); a warning line for each."""
    hints = get_type_hints(cls)
    out = renamed(raw, list(hints), where, "")
    for key in [k for k, v in out.items() if hints.get(k) == float | None and v == 0]:
        del out[key]
        print(f"edgefl: warning: {where}: {key} = 0 no longer means the class default (read as absent; "
              "delete the line)", file=sys.stderr)
    return out


def _with_networks(p: DeviceProfile, given: bool, known: list[str], where: str) -> DeviceProfile:
    """The device with its networks checked against those found, or all of them when omitted."""
    if given and not p.networks:
        raise EdgeflError(where, "networks", "must not be empty; omit it to allow every network")
    bad = [n for n in p.networks if n not in known]
    if bad:
        raise EdgeflError(where, "networks", f"unknown {bad[0]!r}; networks found: {', '.join(known)} "
                          "(a network is a file networks/NAME.toml in a profile folder)")
    return p if given else replace(p, networks=known)


def _required(cls: type) -> list[str]:
    return [f.name for f in fields(cls) if f.default is MISSING and f.default_factory is MISSING]


def used_files(catalog: Catalog, devices: list[DeviceProfile], apps: list[AppProfile]) -> list[Path]:
    """The files of the given devices and apps and of every network those devices may draw."""
    nets = sorted({n for d in devices for n in d.networks})
    keys = [*(("devices", d.name) for d in devices), *(("apps", a.name) for a in apps),
            *(("networks", n) for n in nets)]
    return [catalog.file(*k) for k in dict.fromkeys(keys)]

