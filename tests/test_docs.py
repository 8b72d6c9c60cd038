"""The documentation site builds offline with `mkdocs build --strict` (a broken link, a page left out of
the nav or a warning fails it), and its generated references hold every scenario key and every flag of
every command, both taken from the code here, not from the generator."""

from __future__ import annotations

import argparse
import dataclasses
import html
import re
import subprocess
import sys
from pathlib import Path

import pytest

from edgefl.cli import parser
from edgefl.scenario import schema

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def scenario_keys() -> list[str]:
    """Every key a scenario file may set, dotted as `--set` takes it."""
    keys = []
    for name, hint in schema().items():
        if dataclasses.is_dataclass(hint):
            keys += [f"{name}.{f.name}" for f in dataclasses.fields(hint)]
        else:
            keys.append(name)
    return keys


def cli_flags(p: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[str, list[str]]:
    """`edgefl VERB ...` -> the long flags of that command (not --help), for every command."""
    found = {" ".join(("edgefl", *path)): [o for a in p._actions for o in a.option_strings
                                          if o.startswith("--") and o != "--help"]}
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found |= cli_flags(sub, (*path, name))
    return found


def headed(page: str) -> dict[str, str]:
    """An HTML page's `<h2>` sections: heading text -> the section's HTML."""
    parts = re.split(r"<h2[^>]*>(.*?)</h2>", page, flags=re.S)
    return {html.unescape(re.sub(r"<[^>]+>", "", re.sub(r"<a [^>]*headerlink.*?</a>", "", parts[i]))).strip():
            parts[i + 1]
            for i in range(1, len(parts) - 1, 2)}


@pytest.mark.slow
def test_the_scenario_reference_holds_every_key(site: Path) -> None:
    page = (site / "reference" / "scenario" / "index.html").read_text()
    keys = scenario_keys()
    assert "fleet.clients" in keys and "training.lr" in keys and len(keys) > 100
    missing = [k for k in keys if f"<code>{k}</code>" not in page]
    assert not missing, f"keys missing from the scenario reference: {missing}"


def test_every_key_of_the_scenario_reference_has_a_meaning(site: Path) -> None:
    """Each key's row ends in its meaning (the comment beside its field, or beside the field it
    inherits: the FedOpt methods' server_lr, beta1, beta2 and tau)."""
    page = (site / "reference" / "scenario" / "index.html").read_text()
    rows = re.findall(r"<tr>\s*<td><code>([^<]+)</code></td>(.*?)</tr>", page, flags=re.S)
    cells = {key: re.findall(r"<td>(.*?)</td>", rest, flags=re.S) for key, rest in rows}
    assert set(scenario_keys()) <= set(cells)
    empty = [key for key, row in cells.items() if len(row) != 4 or not re.sub(r"<[^>]+>", "", row[3]).strip()]
    assert not empty, f"keys without a meaning in the scenario reference: {empty}"


def test_the_cli_reference_holds_every_command_and_flag(site: Path) -> None:
    sections = headed((site / "reference" / "cli" / "index.html").read_text())
    commands = cli_flags(parser())
    assert "edgefl run" in commands and "--resume" in commands["edgefl run"]
    for command, flags in commands.items():
        assert command in sections, f"{command} is missing from the command-line reference"
        missing = [f for f in flags if f"<code>{f}</code>" not in sections[command]]
        assert not missing, f"{command}: {missing} missing from the command-line reference"


def test_the_build_fetches_nothing(site: Path) -> None:
    """Material's fonts are off (no Google Fonts request when the site is read or built)."""
    index = (site / "index.html").read_text()
    assert "fonts.googleapis.com" not in index and "fonts.gstatic.com" not in index
