"""MkDocs hooks: the scenario and CLI reference pages, generated from the code at build time.

`reference/scenario.md` is read off the schema (edgefl.config's dataclasses and the methods' knob
sections): each key's type and default from the dataclass, its meaning from the comment that follows it
in the source, its range from the checks edgefl.scenario runs, and the names it accepts from the
registries a scenario is checked against. `reference/cli.md` is read off `edgefl.cli.parser()`. Neither
page is a file in docs/: both are added to the build as generated files (mkdocs.yml `hooks:`).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import io
import textwrap
import tokenize
import typing
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from edgefl.cli import parser
from edgefl.config import KNOBS, Scenario
from edgefl.errors import EdgeflError
from edgefl.scenario import range_checks, schema, validate
from edgefl.tomlschema import toml_value

SCENARIO_PAGE, CLI_PAGE = "reference/scenario.md", "reference/cli.md"
PROBE = "\x00docs"  # a name no registry holds: what a key accepts is in the error it raises


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, SCENARIO_PAGE, content=scenario_reference()))
    files.append(File.generated(config, CLI_PAGE, content=cli_reference()))
    return files


@dataclasses.dataclass
class Key:
    """One scenario key as the reference shows it."""

    name: str  # dotted, as `--set` takes it
    type: str
    default: str
    meaning: str
    allowed: str


def field_comments(cls: type) -> dict[str, str]:
    """Each field of dataclass `cls` -> its trailing comment, with the comment-only lines that continue
    it below, as one line of text; an inherited field's from the nearest class that declares it with
    one (the FedOpt methods' knobs are their base's)."""
    found: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            found |= own_comments(klass)
    return found


def own_comments(cls: type) -> dict[str, str]:
    """`field_comments` of the fields `cls` itself declares."""
    source = textwrap.dedent(inspect.getsource(cls))
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    lines = {node.end_lineno: node.target.id for node in body.body
             if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}
    comments: dict[str, list[str]] = {}
    owner = None  # the field whose comment a comment token continues
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and owner is not None:
            comments.setdefault(owner, []).append(tok.string.lstrip("#").strip())
        elif tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                              tokenize.DEDENT, tokenize.ENDMARKER):
            owner = lines.get(tok.start[0])  # code: a field's line starts its comment, any other ends it
    return {name: " ".join(parts) for name, parts in comments.items()}


def class_docstring(cls: type) -> str:
    """The docstring written in the class's source ("" for none: a dataclass without one gets its
    signature as `__doc__`)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(body, ast.ClassDef)
    return ast.get_docstring(body) or ""


def type_name(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) and not typing.get_args(hint) else str(hint)


def default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    assert f.default_factory is not dataclasses.MISSING
    return f.default_factory()


def ranges() -> dict[str, list[str]]:
    """Key -> what its range checks ask (edgefl.scenario.range_checks on the defaults; a key checked
    twice is listed once)."""
    found: dict[str, list[str]] = {}
    for key, _, fix in range_checks(Scenario()):
        if fix not in found.setdefault(key, []):
            found[key].append(fix)
    return found


def names_accepted(key: str, section: str | None, field: str, hint: Any) -> str:
    """The names a string key (or each item of a list of strings) accepts, as the error a scenario
    naming an unknown one raises lists them; "" for a key that takes any string."""
    if hint not in (str, list[str]):
        return ""
    s = Scenario()
    value: Any = PROBE if hint is str else [PROBE]
    target = s if section is None else (s.sections[section] if section in s.sections else getattr(s, section))
    setattr(target, field, value)
    try:
        validate(s, "docs")
    except EdgeflError as exc:
        if exc.key == key and "choose one of: " in exc.fix:
            return exc.fix.split("choose one of: ", 1)[1].split(" (profiles are found")[0]
    return ""


def scenario_keys() -> list[tuple[str, str, list[Key]]]:
    """(section, its description, its keys) in file order; the top-level keys first as section ""."""
    checks = ranges()
    top: list[Key] = []
    sections: list[tuple[str, str, list[Key]]] = []
    hints = typing.get_type_hints(Scenario)
    top_comments = field_comments(Scenario)
    fields = {f.name: f for f in dataclasses.fields(Scenario)}
    for name, hint in schema().items():
        cls = hint if dataclasses.is_dataclass(hint) else None
        if cls is None:
            top.append(make_key(name, None, name, hints[name], default_of(fields[name]),
                                top_comments.get(name, ""), checks))
            continue
        assert isinstance(cls, type)
        comments, cls_hints = field_comments(cls), typing.get_type_hints(cls)
        doc = class_docstring(cls)
        if name in KNOBS.classes():
            doc = f"Knobs of a method (`{inspect.getmodule(cls).__name__}`). {doc}"  # type: ignore[union-attr]
        keys = [make_key(f"{name}.{f.name}", name, f.name, cls_hints[f.name], default_of(f),
                         comments.get(f.name, ""), checks) for f in dataclasses.fields(cls)]
        sections.append((name, " ".join(doc.split()), keys))
    return [("", "The scenario's own keys, outside any section.", top), *sections]


def make_key(key: str, section: str | None, field: str, hint: Any, default: Any, meaning: str,
             checks: dict[str, list[str]]) -> Key:
    allowed = [*checks.get(key, [])]
    names = names_accepted(key, section, field, hint)
    if names:
        allowed.append("one of: " + names)
    return Key(key, type_name(hint), toml_value(default), meaning, "; ".join(allowed))


def cell(text: str) -> str:
    """Text safe inside a Markdown table cell: one line, pipes escaped, and outside `code spans` the
    angle brackets (`<scenario name>` is text, not an HTML tag)."""
    parts = " ".join(text.split()).replace("|", "\\|").split("`")
    return "`".join(p if i % 2 else p.replace("<", "&lt;").replace(">", "&gt;") for i, p in enumerate(parts))


def code(text: str) -> str:
    """`text` as inline code in a table cell (HTML, so that a backtick or a pipe in it stays text)."""
    escaped = " ".join(text.split()).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return f"<code>{escaped.replace('|', '&#124;')}</code>" if text else ""


def scenario_reference() -> str:
    out = ["# Scenario reference", "",
           "Every key a scenario file may set (generated from `edgefl/config.py`, the methods' knob "
           "sections and the checks in `edgefl/scenario.py` when this site was built). A scenario file "
           "is a short diff over these defaults; `--set SECTION.KEY=VALUE` reaches any of them. "
           "Ranges that name other keys are shown for the defaults.", ""]
    for section, doc, keys in scenario_keys():
        out += [f"## `[{section}]`" if section else "## Top level", "", doc, "",
                "| key | type | default | range / allowed | meaning |", "| --- | --- | --- | --- | --- |"]
        out += [f"| `{k.name}` | {code(k.type)} | {code(k.default)} | {cell(k.allowed)} | {cell(k.meaning)} |"
                for k in keys]
        out.append("")
    return "\n".join(out)


def commands(p: argparse.ArgumentParser, path: tuple[str, ...] = (),
             helps: str = "") -> list[tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """Every command a user types, (its words after `edgefl`, its one-line help, its parser), the
    commands with subcommands before those."""
    subs = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    found = [(path, helps or p.description or "", p)]
    for action in subs:
        help_of = {choice.dest: choice.help or "" for choice in action._choices_actions}
        for name, sub in action.choices.items():
            found += commands(sub, (*path, name), help_of.get(name, ""))
    return found


def cli_reference() -> str:
    out = ["# Command-line reference", "",
           "Every `edgefl` command with its arguments and help (generated from `edgefl.cli.parser()` "
           "when this site was built). `edgefl COMMAND --help` prints the same.", ""]
    for path, help_text, p in commands(parser()):
        arguments = [a for a in p._actions
                     if not isinstance(a, argparse._SubParsersAction | argparse._HelpAction)]
        out += [f"## edgefl {' '.join(path)}".rstrip(), "", cell(help_text), "",
                "```text", p.format_usage().strip(), "```", ""]
        if not arguments:
            continue
        out += ["| argument | value | default | help |", "| --- | --- | --- | --- |"]
        for a in arguments:
            names = ", ".join(f"`{o}`" for o in a.option_strings) or f"`{a.dest}`"
            value = ("{" + ",".join(map(str, a.choices)) + "}" if a.choices is not None
                     else a.metavar or (a.dest.upper() if a.option_strings and a.nargs != 0 else ""))
            default = "" if a.default in (None, False, [], argparse.SUPPRESS) else str(a.default)
            required = " (required)" if a.required and a.option_strings else ""
            expanded = p._get_formatter()._expand_help(a) if a.help else ""
            out.append(f"| {names} | {code(str(value))} | {code(default)} | {cell(expanded)}{required} |")
        out.append("")
    return "\n".join(out)
