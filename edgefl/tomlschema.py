"""Typed TOML tables: a dataclass built from a table, and values written back as TOML.

Unknown keys and wrong types stop with one line naming the file, the key and the fix. Scenario files
(edgefl.scenario) and device profiles (edgefl.devices.profile) are read through `build`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import tomllib
import types
import typing
from pathlib import Path
from typing import Any

from edgefl.errors import EdgeflError

MAX_TOML_BYTES = 1 << 20  # a scenario or a profile is a few kB


def read_toml(path: Path, where: str, what: str, not_found: str) -> dict[str, Any]:
    """The table of the TOML file `path` (UTF-8, a byte-order mark allowed), a `what` ("scenario",
    "profile"). Refused in one line before reading: a device or a pipe (/dev/zero never ends, a FIFO
    blocks, a link to either too) and a file too large for one; `not_found` is the fix when there is
    no such file."""
    try:
        if path.exists() and not path.is_dir() and not path.is_file():
            raise EdgeflError(where, "file", f"is not a regular file (a device or a pipe); give a {what} "
                              ".toml file")
        size = path.stat().st_size
        if size > MAX_TOML_BYTES:
            raise EdgeflError(where, "file", f"is {size:,} bytes, too large for a {what} (at most "
                              f"{MAX_TOML_BYTES:,}); give a {what} .toml file")
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise EdgeflError(where, "file", not_found) from None
    except IsADirectoryError:
        raise EdgeflError(where, "file", "is a folder; " + not_found.removeprefix("not found; ")) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise EdgeflError(where, "file", f"cannot be read ({exc})") from None
    try:
        return tomllib.loads(text)
    except (ValueError, RecursionError) as exc:  # TOMLDecodeError, an int over 4300 digits, deep nesting
        raise EdgeflError(where, "syntax", f"not valid TOML ({exc})") from None


def build(cls: type, raw: Any, where: str, prefix: str) -> Any:
    """Build dataclass `cls` from a TOML table, rejecting unknown keys and wrong types."""
    if not isinstance(raw, dict):
        raise EdgeflError(where, prefix.rstrip(".") or "file", "must be a table")
    known = [f.name for f in dataclasses.fields(cls)]
    raw = renamed(raw, known, where, prefix)
    reject_unknown(raw, known, where, prefix)
    hints = typing.get_type_hints(cls)
    return cls(**{name: build_value(hints[name], value, where, prefix + name) for name, value in raw.items()})


# Keys that moved, as a scenario written for an earlier edgefl names them -> where they are now (the
# error on such a key says where to write it): a selection policy's knobs moved to its own section
# (d982ed2), distillation's server speed to [cost], which prices every method's server work (09be640).
MOVED = {**{f"selection.oort_{key}": f"oort.{key}" for key in ("alpha", "round_s", "percentile", "epsilon",
                                                                "epsilon_decay", "epsilon_min", "cutoff")},
         "selection.power_d": "power_of_choice.d", "distill.server_gflops": "cost.server_gflops"}


# Keys an earlier edgefl wrote -> today's name in the same table (units in the names: storage in
# MB/s, links in Mbit/s): read as today's, with a warning line naming it.
RENAMED = {"storage_read_mbps": "storage_read_mb_s", "storage_write_mbps": "storage_write_mb_s",  # devices
           "up_mbps": "up_mbit_s", "down_mbps": "down_mbit_s",  # networks
           **{f"server.{way}_mbps{each}": f"{way}_mbit_s{each}" for way in ("down", "up")
              for each in ("", "_per_device")}}


def renamed(raw: dict[str, Any], known: list[str], where: str, prefix: str) -> dict[str, Any]:
    """`raw` with the keys an earlier edgefl named otherwise (RENAMED) under today's names, a warning
    line for each; both names at once is an error."""
    out = dict(raw)
    for key in [k for k in raw if RENAMED.get(prefix + k) in known]:
        new = RENAMED[prefix + key]
        if new in out:
            raise EdgeflError(where, prefix + key, f"renamed {prefix}{new}, which is also set: keep only "
                              f"{new}")
        out[new] = out.pop(key)
        print(f"edgefl: warning: {where}: {prefix}{key} is now {prefix}{new} (read as it; rename the key)",
              file=sys.stderr)
    return out


def reject_unknown(raw: dict[str, Any], known: list[str], where: str, prefix: str) -> None:
    """One line naming the first key of `raw` (alphabetically) that is not in `known`, and where it
    is now if it moved (MOVED)."""
    unknown = sorted(set(raw) - set(known))
    if unknown:
        key = prefix + printable(unknown[0])
        if key in MOVED:
            new = MOVED[key]
            part, _, leaf = new.partition(".")
            raise EdgeflError(where, key, f"unknown key: it moved to {new} (write {leaf} under [{part}])")
        raise EdgeflError(where, key, f"unknown key; known keys here: {', '.join(known)}")


def build_value(hint: Any, value: Any, where: str, key: str) -> Any:
    """One value of a table: a sub-table built as its dataclass, anything else type-checked."""
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where, key + ".")  # type: ignore[arg-type]
    return check_type(value, hint, where, key)


def printable(text: str) -> str:
    """A key or `--set` item as typed, or quoted when it holds a newline or other control character."""
    return text if text.isprintable() else repr(text)


def check_type(value: Any, hint: Any, where: str, key: str) -> Any:
    """Check one scalar or list value against its annotation; ints are accepted for floats.

    Integers must fit TOML's 64 bits (a seed beyond them overflows torch.manual_seed) and floats must
    be finite: NaN passes no range check, and inf would pass "must be positive".
    """
    origin = typing.get_origin(hint)
    if origin is types.UnionType:  # `X | None`: TOML has no null, so a value given is an X; of
        #   `int | float | bool | str` (model.kwargs' values), the type the value has
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        return check_type(value, next((m for m in members if type(value) is m), members[0]), where, key)
    if origin is dict:
        _, inner = typing.get_args(hint)
        if not isinstance(value, dict):
            raise EdgeflError(where, key, f"must be a table of name = {inner.__name__}, got {value!r}")
        return {k: check_type(v, inner, where, f"{key}.{printable(k)}") for k, v in value.items()}
    if origin is list:
        (inner,) = typing.get_args(hint)
        if not isinstance(value, list):
            quote = ""
            if inner is str and isinstance(value, str):
                quote = (" (TOML quotes text inside a list: [\"a\", \"b\"])" if value.startswith("[")
                         else f" (a list: [{json.dumps(value)}])")
            raise EdgeflError(where, key, f"must be a list of {inner.__name__}, got {value!r}{quote}")
        return [check_type(v, inner, where, key) for v in value]
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if hint in (int, float) and is_int and not -(2**63) <= value < 2**63:
        raise EdgeflError(where, key, f"must be a 64-bit integer (TOML's range), got {value}")
    if hint is float and is_int:
        return float(value)
    if not isinstance(value, hint) or (hint is int and isinstance(value, bool)):
        raise EdgeflError(where, key, f"must be {hint.__name__}, got {value!r}")
    if hint is float and not math.isfinite(value):
        raise EdgeflError(where, key, f"must be a finite number, got {value!r}")
    if hint is str and not _is_utf8(value):
        raise EdgeflError(where, key, f"must be valid UTF-8 text, got {value!r} (a file name in another "
                          "encoding cannot be saved in scenario.toml: rename it or link to it)")
    return value


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: bytes a UTF-8 system could not decode
        return False
    return True


def toml_value(v: Any) -> str:
    """One value as TOML text."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):  # an inline table; keys quoted, as any string may name a method
        pairs = ", ".join(f"{json.dumps(k)} = {toml_value(x)}" for k, x in v.items())
        return f"{{ {pairs} }}" if v else "{}"
    return repr(v)
