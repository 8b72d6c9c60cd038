"""The README, followed in order by a newcomer, stays true (issue 13, item 3): the synopsis lists
every flag, every example command parses, the model list is the registry, the default folders are
the ones the code writes, and "Adding a device" runs (its dry runs) after the quickstart."""

from __future__ import annotations

import argparse
import re
import shlex
from pathlib import Path

import pytest

from edgefl.cli import default_out, main, parser
from edgefl.devices import catalog
from edgefl.models import MODELS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def section(title: str) -> str:
    start = README.index(f"## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def blocks(text: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", text, re.S)


def commands(block: str) -> list[list[str]]:
    """The `edgefl` commands of a shell block: continuations joined, `&&` split, an environment
    assignment in front dropped; comments and other programs left out."""
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        for part in line.split("&&"):
            words = shlex.split(part, comments=True)
            while words and re.fullmatch(r"[A-Z_]+=\S*", words[0]):
                words = words[1:]
            if words[:1] == ["edgefl"]:
                out.append(words[1:])
    return out


def subparsers(p: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], list[str]]:
    """Every leaf command and its flags."""
    actions = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    if not actions:
        return {path: [o for a in p._actions for o in a.option_strings
                       if o.startswith("--") and o != "--help"]}
    found: dict[tuple[str, ...], list[str]] = {}
    for name, sub in actions[0].choices.items():
        found |= subparsers(sub, (*path, name))
    return found


def test_the_synopsis_lists_every_command_and_flag() -> None:
    synopsis = blocks(section("The commands"), "sh")[0]
    lines: dict[str, str] = {}
    for line in synopsis.splitlines():  # a continuation line belongs to the command above
        if line.startswith("edgefl "):
            key = line
            lines[key] = line
        else:
            lines[key] += " " + line
    for path, flags in subparsers(parser()).items():
        text = " ".join(v for k, v in lines.items() if k.startswith("edgefl " + " ".join(path) + " ")
                        or k == "edgefl " + " ".join(path))
        assert text, f"edgefl {' '.join(path)} is missing from the synopsis"
        missing = [f for f in flags if not re.search(rf"{f}\b", text)]
        assert not missing, f"edgefl {' '.join(path)}: {missing} missing from the synopsis"


def test_every_example_command_parses(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(ROOT)  # the examples name files of the repository
    synopsis = blocks(section("The commands"), "sh")[0]
    examples = [c for b in blocks(README, "sh") if b != synopsis for c in commands(b)]
    assert len(examples) >= 8
    for words in examples:
        parser().parse_args(words)  # argparse exits on an unknown flag or a wrong choice


def test_the_model_list_is_the_registry() -> None:
    line = re.search(r'name = "digits_cnn"\s+# the zoo: (.*?)\n\n', README, re.S)
    assert line is not None
    names = set()
    for word in re.findall(r"[a-z_]+\d*(?:/\d+)*", line.group(1).replace("#", " ")):
        stem, *more = word.split("/")
        prefix = re.sub(r"\d+$", "", stem)
        names |= {stem, *(prefix + m for m in more)}
    assert set(MODELS.names()) <= names


def test_the_default_folders_are_the_ones_the_code_writes() -> None:
    compare = default_out(Path("scenarios/compare-digits.toml"), False, "compare-")
    assert f"`{compare}/<method>/`" in section("Comparing methods")
    assert "edgefl compare scenarios/compare-digits.toml" in section("Comparing methods")
    assert default_out(Path("scenarios/quickstart.toml"), True) == Path("runs/quickstart-dry")
    outputs = section("Outputs")
    assert "(`runs/<scenario>` unless `--out`; a dry run's is `runs/<scenario>-dry`)" in outputs
    assert "`--overwrite`" in outputs  # what running it again needs
    assert "`runs/quickstart/`" in section("Two commands")


def test_adding_a_device_after_the_quickstart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The section's profile saved where it says, then its commands in order (the real run left out:
    it trains), in a folder where the quickstart already ran; the quickstart's fleet is unchanged."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(catalog.ENV, raising=False)
    assert main(["run", "quickstart", "--dry-run", "--quiet", "--set", "rounds=1"]) == 0
    edge_before = [d.name for d in catalog.load_catalog().pool("edge")]
    text = section("Adding a device")
    target = re.search(r"Save this as `([^`]+)`", text)
    assert target is not None
    (tmp_path / target.group(1)).parent.mkdir(parents=True)
    (tmp_path / target.group(1)).write_text(blocks(text, "toml")[0])
    ran = 0
    for line in blocks(text, "sh")[0].splitlines():
        if line.startswith("export "):
            name, _, value = line.removeprefix("export ").partition("=")
            monkeypatch.setenv(name, value.replace("$PWD", str(tmp_path)))
        for words in commands(line):
            if words[0] in ("run", "compare") and "--dry-run" not in words:
                continue
            assert main(words) == 0, capsys.readouterr().err
            ran += 1
    assert ran == 3  # validate, list, the dry run
    out = capsys.readouterr().out
    assert "raspberry_pi_5" in out and "[dry run]" in out
    assert [d.name for d in catalog.load_catalog().pool("edge")] == edge_before
