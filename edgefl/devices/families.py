"""The fitted figures of each core or GPU family (issue 51): what a profile that names a `family`
and carries no `[fitted]` table of its own gets (a user's new device), as leave-one-device-out
judges a device the evidence has never seen. bench/published.py --write writes them beside this
module, families.toml (edgefl.calibration.profiles), from the published measurements."""

from __future__ import annotations

import functools
from pathlib import Path

from edgefl.devices.profile import Fitted
from edgefl.tomlschema import build, read_toml

FILE = Path(__file__).with_name("families.toml")


@functools.cache
def family_figures() -> dict[str, Fitted]:
    """Each family's figures, as the bundled families.toml gives them (none where it is absent)."""
    if not FILE.is_file():
        return {}
    raw = read_toml(FILE, str(FILE), "families file", "not found")
    return {name: build(Fitted, table, str(FILE), f"{name}.") for name, table in raw.items()}


def fitted_of(family: str, own: Fitted) -> Fitted:
    """A profile's fitted figures: its own `[fitted]` table, else its family's, else none."""
    return own if own.efficiency or not family else family_figures().get(family, own)
