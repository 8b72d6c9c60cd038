"""The README and the guides in docs/, followed in order by a newcomer, stay true (issue 13, item 3):
every example command parses, the two commands are the Makefile's, the model list is the registry,
and the default folders are the ones the code writes (the extension guides are followed by
tests/test_guides.py). Every flag is in the generated command-line reference (tests/test_docs.py)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from edgefl.cli import default_out, parser
from edgefl.models import MODELS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
DOCS = ROOT / "docs"
GUIDES = {str(path.relative_to(DOCS)): path.read_text() for path in sorted(DOCS.rglob("*.md"))}


def section(text: str, title: str) -> str:
    """The `## title` section of a Markdown page, up to the next `## ` heading."""
    start = text.index(f"## {title}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def blocks(text: str, *langs: str) -> list[str]:
    return [b for lang in langs for b in re.findall(rf"```{lang}\n(.*?)```", text, re.S)]


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


@pytest.mark.parametrize("page", ["README.md", *GUIDES])
def test_every_example_command_parses(page: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # the examples name files of the repository
    text = README if page == "README.md" else GUIDES[page]
    for words in (c for b in blocks(text, "sh", "bash") for c in commands(b)):
        parser().parse_args(words)  # argparse exits on an unknown flag or a wrong choice


def test_the_pages_hold_examples() -> None:
    """The parse check above has something to check: the tour, and the guides' commands."""
    assert len([c for b in blocks(README, "sh") for c in commands(b)]) >= 5
    assert len([c for text in GUIDES.values() for b in blocks(text, "sh", "bash") for c in commands(b)]) >= 15


def test_the_two_commands_are_the_makefiles() -> None:
    two = blocks(section(README, "Two commands"), "sh")[0]
    assert [line.split("#")[0].strip() for line in two.splitlines()] == ["make run", "make test"]
    targets = re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.M)
    assert {"run", "test"} <= set(targets)


def zoo_names(comment: str) -> set[str]:
    """The model names of a comment like `digits_cnn, cnn3, vgg11/13/16 (BN), mobilenet_v2`: a
    name may hold digits and underscores anywhere, and `stem11/13` stands for stem11 and stem13."""
    names = set()
    for word in re.findall(r"[a-z][a-z0-9_]*(?:/\d+)*", comment.replace("#", " ")):
        stem, *more = word.split("/")
        prefix = re.sub(r"\d+$", "", stem)
        names |= {stem, *(prefix + m for m in more)}
    return names


def test_zoo_names_reads_digits_inside_a_name() -> None:
    assert zoo_names("# the zoo: mobilenet_v2, resnet10/18, efficientnet_b0_small") == {
        "the", "zoo", "mobilenet_v2", "resnet10", "resnet18", "efficientnet_b0_small"}


def test_the_model_list_is_the_registry() -> None:
    line = re.search(r'name = "digits_cnn"\s+# the zoo: (.*?)\n\n', GUIDES["scenarios.md"], re.S)
    assert line is not None
    assert set(MODELS.names()) <= zoo_names(line.group(1))


def test_the_default_folders_are_the_ones_the_code_writes() -> None:
    compare = default_out(Path("scenarios/compare-digits.toml"), False, "compare-")
    assert f"`{compare}/<method>/`" in GUIDES["compare.md"]
    assert "edgefl compare scenarios/compare-digits.toml" in GUIDES["compare.md"]
    assert f"`{compare}/comparison.md`" in README
    dry = default_out(Path("scenarios/quickstart.toml"), True)
    assert dry == Path("runs/quickstart-dry") and f"`{dry}/`" in README
    outputs = GUIDES["outputs.md"]
    assert "(`runs/<scenario>` unless `--out`; a dry run's is `runs/<scenario>-dry`)" in outputs
    assert "`--overwrite`" in outputs  # what running it again needs
    assert "`runs/quickstart/`" in section(README, "Two commands")


def test_the_readmes_pictures_are_in_the_repository_and_small() -> None:
    """The picture at the top is a file of the repository (a relative path), small enough to commit."""
    images = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", README)
    assert images and README.index("![") < README.index("## Two commands")
    for image in images:
        assert (ROOT / image).is_file() and (ROOT / image).stat().st_size < 150_000, image
