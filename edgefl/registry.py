"""One way to register: a decorator in the file, the package's folder imported, and plugins.

Methods, selection policies, models, attacks, datasets and the rest are `Registry` tables filled by
`@REGISTRY.register("name")` in the file that defines them; each package imports every module of its
folder (`import_folder`), so a new file is the whole change. An installed package adds its own through
Python entry points in the groups of `GROUPS` (e.g. `[project.entry-points."edgefl.methods"]
my_method = "my_package.my_method"`): the first lookup in a registry loads every entry point of
its group once (`load_group`), and loading a module runs its decorators. An entry point that names
an object rather than a module registers that object under the entry point's name.

An entry point that fails to load (its import raises, or it registers nothing of its name) is one
warning line on stderr and is left out: runs that name nothing it provides go on, and an unknown
name's error says which plugins failed and may have provided it (`unloaded`).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import sys
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path
from typing import Any, Generic, TypeVar

from edgefl.errors import EdgeflError

T = TypeVar("T")

# entry-point group -> what it adds; a device folder is a package whose folder holds profile TOMLs
GROUPS = {
    "edgefl.methods": "method", "edgefl.policies": "selection policy", "edgefl.models": "model",
    "edgefl.attacks": "attack", "edgefl.datasets": "dataset", "edgefl.devices": "device folder",
}


class PluginError(EdgeflError):
    """An installed plugin that does not load: its package, its entry point, and why."""

    def __init__(self, point: metadata.EntryPoint, why: str) -> None:
        dist = point.dist.name if point.dist is not None else "an installed package"
        super().__init__(f"plugin {dist}", f"entry point {point.group}: {point.name} = {point.value}",
                         f"{why}; fix or uninstall {dist}")
        self.name, self.why = point.name, why

    @property
    def plugin(self) -> str:
        """The plugin and its entry point, as a message names them."""
        return f"{self.where} ({self.key})"


class Registry(Generic[T]):
    """A name -> object table filled by the `register` decorator (and by plugins' entry points)."""

    def __init__(self, kind: str, group: str = "") -> None:
        self.kind = kind
        self.group = group  # its entry-point group in GROUPS ("" for internal tables)
        self._items: dict[str, T] = {}
        if group:
            _REGISTRIES[group] = self

    def register(self, name: str) -> Callable[[T], T]:
        def add(obj: T) -> T:
            if name in self._items and self._items[name] is not obj:
                raise ValueError(f"{self.kind} {name!r} registered twice")
            self._items[name] = obj
            return obj

        return add

    def get(self, name: str) -> T:
        load_group(self.group)
        if name not in self._items:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {', '.join(self.names())}{unloaded(name)}")
        return self._items[name]

    def names(self) -> list[str]:
        load_group(self.group)
        return sorted(self._items)


_REGISTRIES: dict[str, Registry[Any]] = {}
_LOADED: set[str] = set()  # the groups whose entry points are loaded
_FAILED: list[PluginError] = []  # the entry points that failed to load, in load order
_FOLDERS: list[Path] = []  # device folders that plugins gave, in load order


def import_folder(package: str, path: Iterable[str]) -> None:
    """Import every module of a package's folder (from its `__init__`), so each file registers itself."""
    for module in pkgutil.iter_modules(path):
        importlib.import_module(f"{package}.{module.name}")


def load_group(group: str) -> None:
    """Load the installed entry points of `group` (one of GROUPS; "" loads nothing), once."""
    if not group or group in _LOADED:
        return
    _LOADED.add(group)  # first: a plugin's own lookups while it loads must not recurse
    for point in metadata.entry_points(group=group):
        try:
            _load(point)
        except PluginError as failed:  # left out: only the runs that name what it provides stop
            _FAILED.append(failed)
            print(f"edgefl: warning: {failed.plugin} failed to load: {failed.why}; runs that use it will "
                  "stop", file=sys.stderr)


def unloaded(name: str) -> str:
    """What the error on an unknown `name` adds where plugins failed to load: the one whose entry
    point has that name, else every one, as a plugin that may have provided it ("" where none
    failed)."""
    failed = [f for f in _FAILED if f.name == name] or _FAILED
    return "".join(f"; {f.plugin} failed to load ({f.why}) and may have provided it" for f in failed)


def plugin_device_folders() -> list[Path]:
    """The profile folders that installed plugins add (after the user's, before the bundled ones)."""
    load_group("edgefl.devices")
    return list(_FOLDERS)


def _load(point: metadata.EntryPoint) -> None:
    try:
        obj = point.load()
    except Exception as exc:  # a plugin's import may raise anything: report it as one line
        raise PluginError(point, f"{type(exc).__name__}: {exc}") from exc
    if point.group == "edgefl.devices":
        _FOLDERS.append(_folder_of(point, obj))
        return
    registry = _REGISTRIES.get(point.group)  # made by the plugin's import of edgefl, or a lookup
    if registry is None:
        raise PluginError(point, f"it imports nothing that holds edgefl's {GROUPS[point.group]} registry")
    if not inspect.ismodule(obj) and point.name not in registry._items:
        registry.register(point.name)(obj)
    if point.name not in registry._items:
        raise PluginError(point, f"loading it registered no {registry.kind} named {point.name!r}")


def _folder_of(point: metadata.EntryPoint, obj: Any) -> Path:
    files = getattr(obj, "__path__", None)
    if not inspect.ismodule(obj) or not files:
        raise PluginError(point, "an edgefl.devices entry point must name a package whose folder holds "
                          "device profiles (*.toml)")
    return Path(next(iter(files)))


