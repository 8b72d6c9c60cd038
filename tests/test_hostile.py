"""Hostile input: random, truncated and mutated scenario and profile files, and random `--set` strings.

Every one ends with exit code 2 and one line `edgefl: error: ...` on stderr, never a traceback, and
`edgefl run` leaves no run directory behind. The same holds for hostile output folders (a file, a
symlink, a folder edgefl did not make: nothing in it changes), for run folders whose files were
edited, cut or replaced (plot and resume check what they read; resume writes nothing first), and
for values the types accept but no device, report or file could take. A generated scenario that
might be valid is run with `--set rounds=0` (which validation refuses) or only loaded, so no example
ever starts training.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, assume, example, given, settings
from hypothesis import strategies as st
from support import one_error_line

from edgefl.cli import main
from edgefl.devices.profile import DeviceProfile
from edgefl.errors import EdgeflError
from edgefl.report.compare import NEEDED
from edgefl.scenario import load_scenario, schema, to_toml

ROOT = Path(__file__).resolve().parents[1]
SCENARIO_TEXT = (ROOT / "scenarios" / "quickstart.toml").read_text()
PROFILE_TEXT = (ROOT / "device_profiles" / "raspberry_pi_4.toml").read_text()
REFUSED = "--set=rounds=0"  # `rounds` must be at least 1: a file that happens to be valid never trains
HOSTILE = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.function_scoped_fixture])
Capsys = pytest.CaptureFixture[str]


def schema_leaves(keys: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, type hint) of every scalar or list field, sections descended."""
    leaves: list[tuple[str, Any]] = []
    for name, hint in keys.items():
        if dataclasses.is_dataclass(hint):
            leaves += schema_leaves(field_hints(hint), f"{prefix}{name}.")  # type: ignore[arg-type]
        else:
            leaves.append((prefix + name, hint))
    return leaves


def field_hints(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


SCENARIO_LEAVES = schema_leaves(schema())  # every section, the methods' knob sections too
PROFILE_LEAVES = schema_leaves(field_hints(DeviceProfile))
SECTIONS = ["", *sorted({key.rpartition(".")[0] for key, _ in SCENARIO_LEAVES} - {""})]


# a small TOML writer: tomllib reads only ------------------------------------------------------------


def toml_string(s: str) -> str:
    """A TOML basic string: printable characters as they are, everything else as an escape."""
    def char(c: str) -> str:
        if c.isprintable() and c not in '"\\':
            return c
        return f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}"
    return '"' + "".join(map(char, s)) + '"'


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return {"nan": "nan", "inf": "inf", "-inf": "-inf"}.get(repr(v), repr(v))
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return toml_string(v)
    if isinstance(v, list):
        return "[" + ", ".join(map(toml_value, v)) + "]"
    return "{" + ", ".join(f"{toml_string(k)} = {toml_value(x)}" for k, x in v.items()) + "}"


def toml_document(doc: dict[str, Any]) -> str:
    """Top-level keys first, then one [table] per top-level table (deeper tables inline)."""
    top = [f"{toml_string(k)} = {toml_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    tables = [f"[{toml_string(k)}]\n" + "".join(f"{toml_string(kk)} = {toml_value(vv)}\n"
                                                 for kk, vv in v.items())
              for k, v in doc.items() if isinstance(v, dict)]
    return "\n".join([*top, *tables]) + "\n"


def set_key(doc: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A copy of `doc` with dotted `key` set (sections created as needed)."""
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in doc.items()}
    *parents, leaf = key.split(".")
    node = out
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value
    return out


# strategies ---------------------------------------------------------------------------------------


scalars = st.one_of(st.integers(-(2**70), 2**70), st.floats(), st.booleans(), st.text(max_size=12))
values = st.recursive(scalars, lambda kids: st.lists(kids, max_size=3)
                      | st.dictionaries(st.text(max_size=6), kids, max_size=3), max_leaves=6)
NOT_A_VALUE = [float("nan"), float("inf"), float("-inf"), {"a": {"b": 1}}, 2**63, -(2**63) - 1]
WRONG_TYPE: dict[Any, list[Any]] = {
    int: ["5", 1.5, True], float: ["0.5", True], float | None: ["0.5", True, -1.0], bool: [1, "true"],
    str: [1, 1.5, False],
    list[float]: ["0.5", [True], ["x"]], dict[str, int]: [1, "x", {"jfat": "5"}, {"jfat": 1.5}],
    # a profile's [fitted] shares per kind (issue 51): not a table, or one entry of the wrong type
    dict[str, float]: [1, "x", {"conv": "0.5"}, {"conv": True}, {"conv": [0.5]}, {"conv": {"a": 1}}]}


def invalid_values(hint: Any) -> st.SearchStrategy[Any]:
    """Values no field with this annotation accepts: wrong types, non-finite, tables, beyond 64 bits."""
    if typing.get_origin(hint) is list:
        (inner,) = typing.get_args(hint)
        if typing.get_origin(inner) is list:  # rows of numbers (a profile's [kernels])
            return st.sampled_from([*NOT_A_VALUE, "x", 1, [1.0], [["x"]], [[float("nan")]], [[True]]])
        return st.sampled_from([*NOT_A_VALUE, "x", 1, [[1]], [{"a": 1}], [float("nan")],
                                *([w] for w in WRONG_TYPE[inner])])
    return st.sampled_from([*NOT_A_VALUE, [], [1], *WRONG_TYPE[hint]])


def names_the_key(line: str, key: str) -> bool:
    """Whether an error line names `key`, or for a table (a dict-typed field) the entry inside it."""
    return f": {key}: " in line or f": {key}." in line


def mutated(doc: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """`doc` with dotted `key` set to `value`; a table given for a table merges into it, so the one
    entry it names changes and the file's other entries stay as they were."""
    node: Any = doc
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    merged = {**node, **value} if isinstance(node, dict) and isinstance(value, dict) else value
    return set_key(doc, key, merged)


def leaf_and_invalid_value(leaves: list[tuple[str, Any]]) -> st.SearchStrategy[tuple[str, Any]]:
    return st.sampled_from(leaves).flatmap(lambda kh: st.tuples(st.just(kh[0]), invalid_values(kh[1])))


edge_values = st.sampled_from([0, -1, -1.0, -1e9, 1e308, 2**63 - 1, -(2**63), "", [], [0.0], [-1.0, 2.0]])
random_keys = st.one_of(st.sampled_from([k.rpartition(".")[2] for k, _ in SCENARIO_LEAVES]),
                        st.text(min_size=1, max_size=10))
placed_entries = st.lists(st.tuples(st.sampled_from(SECTIONS), random_keys, values), min_size=1, max_size=6)


def document(entries: list[tuple[str, str, Any]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for section, key, value in entries:
        doc = set_key(doc, f"{section}.{key}" if section else key, value)
    return doc


# the CLI, in process ------------------------------------------------------------------------------


@contextmanager
def scratch() -> Iterator[Path]:
    """A fresh folder per generated example (pytest's tmp_path is one per test, not per example)."""
    with tempfile.TemporaryDirectory() as folder:
        yield Path(folder)


def write(path: Path, content: str | bytes) -> Path:
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def expect_error(capsys: Capsys, argv: list[str]) -> str:
    capsys.readouterr()  # drop what an earlier example printed
    assert main(argv) == 2
    return one_error_line(capsys.readouterr().err)


def run_refused(capsys: Capsys, content: str | bytes, *overrides: str) -> str:
    """`edgefl run` on the content as a scenario file: an error, and no run directory."""
    with scratch() as folder:
        path, out = write(folder / "scenario.toml", content), folder / "run"
        line = expect_error(capsys, ["run", str(path), "--out", str(out), *overrides])
        assert not out.exists()
    return line


def validate_refused(capsys: Capsys, content: str | bytes, stem: str = "random") -> str:
    with scratch() as folder:
        path = write(folder / f"{stem}.toml", content)
        return expect_error(capsys, ["devices", "validate", str(path)])


def loads_or_one_line_error(content: str) -> None:
    """A file that may be valid: it loads, or fails with one EdgeflError line, never anything else."""
    with scratch() as folder:
        try:
            load_scenario(write(folder / "scenario.toml", content))
        except EdgeflError as exc:
            assert "\n" not in str(exc)


# (a) random bytes, random text, truncated valid TOML ----------------------------------------------


@HOSTILE
@given(st.binary(max_size=1000))
def test_random_bytes_scenario(capsys: Capsys, content: bytes) -> None:
    run_refused(capsys, content, REFUSED)


@HOSTILE
@given(st.text(max_size=1000))
@example("a = " + "1" * 5000)  # past Python's 4300-digit int limit: tomllib raised a bare ValueError
@example("a = " + "[" * 5000 + "]" * 5000)  # deep nesting: tomllib raised RecursionError
@example('"new\\nline" = 1')  # an unknown key holding a newline made a two-line error
def test_random_text_scenario(capsys: Capsys, content: str) -> None:
    run_refused(capsys, content, REFUSED)


@HOSTILE
@given(st.integers(0, len(SCENARIO_TEXT)))
def test_truncated_scenario(capsys: Capsys, cut: int) -> None:
    run_refused(capsys, SCENARIO_TEXT[:cut], REFUSED)


# (b) valid TOML, random keys and values of random types at random places of the schema -------------


@HOSTILE
@given(placed_entries)
@example([("cost", "server_s", 10**400)])  # float(10**400) raised OverflowError
def test_random_keys_and_values_in_schema(capsys: Capsys, entries: list[tuple[str, str, Any]]) -> None:
    text = toml_document(document(entries))
    run_refused(capsys, text, REFUSED)
    loads_or_one_line_error(text)


# (c) the quickstart scenario with one key set to a wrong type or an out-of-range value -------------


@HOSTILE
@given(leaf_and_invalid_value(SCENARIO_LEAVES))
@example(("training.lr", float("inf")))  # passed "must be positive"
@example(("fleet.balance_s", float("nan")))  # has no range check: NaN got through
@example(("seed", 2**64))  # overflowed torch.manual_seed at the start of a run
def test_mutated_scenario(capsys: Capsys, mutation: tuple[str, Any]) -> None:
    key, value = mutation
    text = toml_document(set_key(tomllib.loads(SCENARIO_TEXT), key, value))
    assert names_the_key(run_refused(capsys, text), key)


@HOSTILE
@given(st.sampled_from(SCENARIO_LEAVES), edge_values)
def test_edge_values_in_scenario(leaf: tuple[str, Any], value: Any) -> None:
    """Negative, zero, huge and empty values may be valid for some keys: load them, never run them."""
    loads_or_one_line_error(toml_document(set_key(tomllib.loads(SCENARIO_TEXT), leaf[0], value)))


# (d) device profile files through `edgefl devices validate` ----------------------------------------


@HOSTILE
@given(st.one_of(st.binary(max_size=500), st.text(max_size=500)))
def test_random_profile(capsys: Capsys, content: str | bytes) -> None:
    validate_refused(capsys, content)


@HOSTILE
@given(st.integers(0, len(PROFILE_TEXT)))
def test_truncated_profile(capsys: Capsys, cut: int) -> None:
    # saved under another name, so even the whole text is refused (name must equal the file name)
    validate_refused(capsys, PROFILE_TEXT[:cut], "truncated")


@HOSTILE
@given(st.one_of(leaf_and_invalid_value(PROFILE_LEAVES), st.sampled_from([
    ("memory_mb", -1.0), ("compute_gflops", 0), ("storage_read_mb_s", -1e9), ("storage_write_mb_s", 0.0),
    ("storage_latency_ms", -0.5), ("networks", []), ("networks", ["dialup"]), ("name", "other"),
    ("fitted.efficiency", {"conv": 1.5}), ("fitted.efficiency", {"norm": 0.5}),
    ("fitted.memory", {"conv": 0.5}), ("fitted.memory", {"norm": 0.0}), ("fitted.bandwidth_share", 0.1),
    ("fitted.op_overhead_us", -1.0),
])))
@example(("memory_mb", float("inf")))  # passed "must be positive"
@example(("fitted.efficiency", {"conv": "0.5"}))  # a dict-typed field: the fuzzer knew none (issue 51)
@example(("fitted.memory", float("nan")))
def test_mutated_profile(capsys: Capsys, mutation: tuple[str, Any]) -> None:
    key, value = mutation
    text = toml_document(mutated(tomllib.loads(PROFILE_TEXT), key, value))
    assert names_the_key(validate_refused(capsys, text, "raspberry_pi_4"), key)


@HOSTILE
@given(st.text(min_size=1, max_size=10), values)
def test_profile_with_an_unknown_key(capsys: Capsys, key: str, value: Any) -> None:
    doc = tomllib.loads(PROFILE_TEXT)
    text = toml_document({**doc, key: value})
    if key in doc:  # a known key with a random value: still refused, by its type or range, or the name
        validate_refused(capsys, text, "other")
    else:
        assert "unknown key" in validate_refused(capsys, text, "raspberry_pi_4")


# (e) `--set` override strings ---------------------------------------------------------------------


@HOSTILE
@given(st.text(max_size=60))
@example("a\nb")  # a --set without `=` holding a newline made a two-line error
@example("seed=" + "9" * 5000)
def test_random_override(capsys: Capsys, override: str) -> None:
    run_refused(capsys, SCENARIO_TEXT, f"--set={override}", REFUSED)


@HOSTILE
@given(st.sampled_from([k for k, _ in SCENARIO_LEAVES]) | st.text(max_size=15),
       values.map(toml_value) | st.text(max_size=20))
def test_schema_override(capsys: Capsys, key: str, value: str) -> None:
    run_refused(capsys, SCENARIO_TEXT, f"--set={key}={value}", REFUSED)


# (f) values the schema's types accept but the machine, the report or a file could not take ----------


def leaves_of(hint: Any) -> list[str]:
    return [k for k, h in SCENARIO_LEAVES if h == hint]


VALID_DEVICES = {"auto", "cpu", *(f"cuda:{k}" for k in range(torch.cuda.device_count())),
                 *(["cuda"] if torch.cuda.is_available() else [])}


@HOSTILE
@given(st.sampled_from(["banana", "", "mps", "meta", "cuda:99", "cuda:", "CPU", " cpu", "cuda:-1", "xla"])
       | st.text(max_size=8))
@example("cuda")  # a GPU this machine lacks (when it lacks one)
def test_unknown_or_absent_devices(capsys: Capsys, device: str) -> None:
    if device in VALID_DEVICES:
        return
    for dry in ([], ["--dry-run"]):  # a dry run checks what the real run would
        assert ": device: " in run_refused(capsys, SCENARIO_TEXT, f"--set=device={toml_string(device)}", *dry)


@HOSTILE
@given(st.integers(1025, 2**63 - 1))
def test_absurd_thread_counts(capsys: Capsys, threads: int) -> None:
    assert ": threads: " in run_refused(capsys, SCENARIO_TEXT, f"--set=threads={threads}")


@HOSTILE
@given(st.lists(st.sampled_from(["pgd", "fgsm", "cw", "pgd_l2", "autoattack"]), min_size=1, max_size=4))
def test_extra_attacks_repeat_nothing(capsys: Capsys, extra: list[str]) -> None:
    if "pgd" not in extra and len(set(extra)) == len(extra):
        return  # a valid list: distinct attacks other than the main one
    assert ": evaluation.extra: " in run_refused(capsys, SCENARIO_TEXT,
                                                 f"--set=evaluation.extra={toml_value(extra)}")


@HOSTILE
@given(st.sampled_from(leaves_of(str)), st.text(max_size=5), st.sampled_from(["\udcff", "\udc80x"]))
def test_strings_that_are_not_utf8(capsys: Capsys, key: str, text: str, surrogate: str) -> None:
    """What a non-UTF-8 file name gives in argv: refused, since scenario.toml could not hold it."""
    line = run_refused(capsys, SCENARIO_TEXT, f"--set={key}={text}{surrogate}")
    assert "UTF-8" in line and f"--set: {key}: " in line


@HOSTILE
@given(leaf_and_invalid_value(SCENARIO_LEAVES))
def test_set_errors_name_the_flag(capsys: Capsys, mutation: tuple[str, Any]) -> None:
    key, value = mutation
    line = run_refused(capsys, SCENARIO_TEXT, f"--set={key}={toml_value(value)}")
    assert line.startswith("edgefl: error: --set") and key.split(".")[0] in line


@HOSTILE
@given(st.sampled_from([k for k, h in PROFILE_LEAVES if h is float]), st.floats(1e10, 1e308))
@example("storage_latency_ms", 1e308)  # gave nan hours after round 0 was written
@example("memory_mb", 1e308)  # an OverflowError after round 0
def test_profile_values_beyond_any_device(capsys: Capsys, key: str, value: float) -> None:
    text = toml_document(set_key(tomllib.loads(PROFILE_TEXT), key, value))
    assert f": {key}: " in validate_refused(capsys, text, "raspberry_pi_4")


def test_ray_joins_only_a_cluster_the_scenario_trusts(capsys: Capsys) -> None:
    for address in ("auto", "ray://10.0.0.7:10001", "evil.example.com:6379"):
        assert ": ray.address: " in run_refused(capsys, SCENARIO_TEXT,
                                                f"--set=ray.address={toml_string(address)}")
    for address in ("", "ray://localhost:10001", "127.0.0.1:6379"):
        load_scenario(ROOT / "scenarios" / "quickstart.toml", [f"ray.address={toml_string(address)}"])
    load_scenario(ROOT / "scenarios" / "quickstart.toml", ['ray.address="auto"', "ray.trust_address=true"])


def test_dry_runs_refuse_what_the_real_run_would(capsys: Capsys) -> None:
    line = run_refused(capsys, SCENARIO_TEXT, "--set=method=feddf_at", "--set=distill.public_samples=5000",
                       "--dry-run")
    assert "distill.public_samples" in line
    with scratch() as folder:
        path = write(folder / "s.toml", SCENARIO_TEXT)
        line = expect_error(capsys, ["partition", str(path), "--set=model.name=vgg16",
                                     "--set=fleet.reserved_memory_mb=10000"])
        assert "does not fit" in line and "--set: model.name" in line


# (g) where runs go: --out targets that are not a folder edgefl may write ------------------------------


def bad_out(kind: str, folder: Path) -> Path:
    """A hostile --out of `kind` in `folder` (which also holds a user's file)."""
    user = write(folder / "thesis.tex", "chapter 1\n")
    if kind == "file":
        return user
    if kind == "under a file":
        return user / "run"
    if kind in ("dangling symlink", "symlink to a folder"):
        (folder / "link").symlink_to(folder / ("nowhere" if kind == "dangling symlink" else "."))
        return folder / "link"
    if kind == "too long":
        return folder / ("x" * 300)
    if kind == "not a run":
        return folder
    raise AssertionError(kind)


OUT_KINDS = ["file", "under a file", "dangling symlink", "symlink to a folder", "too long", "not a run"]


def tree(folder: Path) -> dict[str, bytes | str]:
    return {str(p.relative_to(folder)): os.readlink(p) if p.is_symlink() else
            (p.read_bytes() if p.is_file() else "dir") for p in sorted(folder.rglob("*"))}


@pytest.mark.parametrize("kind", OUT_KINDS)
@pytest.mark.parametrize("command", ["run", "compare", "plot"])
def test_hostile_out(capsys: Capsys, dry_run: Path, command: str, kind: str) -> None:
    with scratch() as folder:
        out = bad_out(kind, folder)
        before = tree(folder)
        argv = {"run": ["run", str(ROOT / "scenarios" / "quickstart.toml"), "--dry-run", "--overwrite"],
                "compare": ["compare", str(ROOT / "scenarios" / "quickstart.toml"), "--methods", "jfat",
                            "--dry-run"],
                "plot": ["plot", str(dry_run)]}[command]
        assert "--out" in expect_error(capsys, [*argv, "--out", str(out), "--set=rounds=1"]
                                       if command != "plot" else [*argv, "--out", str(out)])
        assert tree(folder) == before


COMPARE = ["compare", str(ROOT / "scenarios" / "quickstart.toml"), "--methods", "jfat", "--dry-run",
           "--quiet", "--set=rounds=1", "--set=fleet.clients=4"]


@pytest.fixture(scope="module")
def compared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished (dry) comparison of jfat alone."""
    out = tmp_path_factory.mktemp("compared") / "comparison"
    assert main([*COMPARE, "--out", str(out)]) == 0
    return out


def linked_comparison(kind: str, finished: Path, folder: Path) -> tuple[Path, Path]:
    """A comparison folder (`finished`'s marker, or a copy of it) holding a symbolic link of `kind`
    made in `folder`; returns (the comparison, the link)."""
    out = folder / "comparison"
    if kind == "linked figures":
        shutil.copytree(finished, out)
        (out / "figures").rename(folder / "figures")
        (out / "figures").symlink_to(folder / "figures")
        return out, out / "figures"
    out.mkdir()
    shutil.copy(finished / ".edgefl-run", out)
    (out / "jfat").symlink_to(finished / "jfat" if kind == "link to a finished run" else folder / "gone")
    return out, out / "jfat"


@pytest.mark.parametrize("kind", ["link to a finished run", "dangling link", "linked figures"])
def test_a_symbolic_link_in_a_comparison_is_refused_never_followed(capsys: Capsys, compared: Path,
                                                                   kind: str) -> None:
    """One rule (docs/outputs.md): a link anywhere in a comparison's folder is one line naming it, and
    nothing is run or written, whether it dangles or points at a finished run of the same scenario;
    `edgefl report` on the folder says the same."""
    with scratch() as folder:
        out, link = linked_comparison(kind, compared, folder)
        before = tree(folder), tree(compared)
        for command in ([*COMPARE, "--out", str(out)], ["report", str(out), "--out", str(folder / "r.html")]):
            line = expect_error(capsys, command)
            assert line.startswith(f"edgefl: error: {link}: symbolic link: edgefl follows no link inside "
                                   f"its output folder {out}")
        assert (tree(folder), tree(compared)) == before


# (h) run folders that are not what edgefl wrote: plot and resume read nothing unchecked -------------


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dry") / "run"
    assert main(["run", str(ROOT / "scenarios" / "quickstart.toml"), "--dry-run", "--quiet", "--out",
                 str(out), "--set=rounds=2", "--set=fleet.clients=4"]) == 0
    return out


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real 1-round run without its summary: resuming it only finishes it."""
    out = tmp_path_factory.mktemp("real") / "run"
    assert main(["run", str(ROOT / "scenarios" / "quickstart.toml"), "--quiet", "--out", str(out),
                 "--set=rounds=1", "--set=fleet.clients=4", "--set=training.local_iters=2",
                 "--set=attack.steps=1", "--set=evaluation.steps=1", "--set=data.test_samples=16",
                 "--set=threads=1"]) == 0
    (out / "summary.json").unlink()
    return out


@contextmanager
def copy_of(run: Path) -> Iterator[Path]:
    with scratch() as folder:
        shutil.copytree(run, folder / "run")
        yield folder / "run"


def plot_refused(capsys: Capsys, run: Path, name: str, content: bytes) -> str:
    with copy_of(run) as copy:
        write(copy / name, content)
        return expect_error(capsys, ["plot", str(copy), "--out", str(copy / "figures")])


IO = settings(HOSTILE, max_examples=15)


@IO
@given(st.sampled_from(["metrics.csv", "clients.csv", "scenario.toml"]), st.binary(max_size=300))
@example("metrics.csv", b"0,1.0,2.0\n1,2.0,3.0\n")  # no header
@example("scenario.toml", b"method = 1\n")
def test_plot_on_garbage(capsys: Capsys, dry_run: Path, name: str, content: bytes) -> None:
    plot_refused(capsys, dry_run, name, content)


@IO
@given(st.sampled_from([(n, c) for n, cols in NEEDED.items() for c in cols]), st.integers(0, 1),
       st.sampled_from(["", "abc", "nan", "inf", "1e999", "\x00", "1,2"]))
def test_plot_on_a_bad_value(capsys: Capsys, dry_run: Path, column: tuple[str, str], row: int,
                             value: str) -> None:
    name, key = column
    if value == "" and key in ("clean_acc", "adv_acc"):
        return  # a round that was not evaluated
    with open(dry_run / name, newline="") as f:
        rows = list(csv.DictReader(f))
    rows[row][key] = value
    text = io.StringIO()
    writer = csv.DictWriter(text, list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
    assert "line" in plot_refused(capsys, dry_run, name, text.getvalue().encode())


@IO
@given(st.sampled_from(["metrics.csv", "clients.csv", "events.csv", "scenario.toml", ".edgefl-run"]),
       st.data())
def test_resume_of_an_edited_run(capsys: Capsys, finished: Path, name: str, data: st.DataObject) -> None:
    """Any byte changed, or the file cut short: refused before anything is written."""
    with copy_of(finished) as copy:
        original = (copy / name).read_bytes()
        at = data.draw(st.integers(0, len(original) - 1))
        flip = data.draw(st.booleans())
        edited = (original[:at] + bytes([original[at] ^ 0x20]) + original[at + 1:]) if flip else original[:at]
        write(copy / name, edited)
        assume(name != "scenario.toml" or not same_scenario(copy / name, original))
        before = tree(copy)
        expect_error(capsys, ["run", "--resume", str(copy)])
        assert tree(copy) == before


def same_scenario(path: Path, original: bytes) -> bool:
    """Whether an edit left the resolved scenario as it was (1e-05 for 1E-05): resume may go on."""
    try:
        return to_toml(load_scenario(path)) == original.decode()
    except EdgeflError:
        return False


plain_data = st.recursive(st.none() | st.integers(-5, 5) | st.text(max_size=4) | st.floats(allow_nan=False),
                          lambda kids: st.lists(kids, max_size=3)
                          | st.dictionaries(st.sampled_from(["next_round", "rows", "method", "rng", "logs",
                                                             "clock", "fingerprint", "x"]), kids, max_size=7),
                          max_leaves=10)


@IO
@given(plain_data)
def test_resume_with_a_foreign_plain_data_checkpoint(capsys: Capsys, finished: Path, state: Any) -> None:
    with copy_of(finished) as copy:
        torch.save(state, copy / "checkpoint.pt")
        before = tree(copy)
        line = expect_error(capsys, ["run", "--resume", str(copy)])
        assert "checkpoint" in line and "weights_only" not in line
        assert tree(copy) == before


def test_an_unreachable_ray_cluster_is_one_line_before_ray_starts() -> None:
    """ray.init retries an address that does not answer for minutes: edgefl asks the port first."""
    import socket

    from edgefl.executors.ray import check_reachable

    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(EdgeflError, match=f"s.toml: ray.address: no Ray cluster answers at 127.0.0.1:{port}"):
        check_reachable(f"127.0.0.1:{port}", "s.toml")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        check_reachable(f"ray://127.0.0.1:{s.getsockname()[1]}", "s.toml")  # answers: Ray's to join
    for address in ("", "auto"):
        check_reachable(address, "s.toml")  # Ray's own to find


def test_a_path_with_a_line_break_is_still_one_error_line(tmp_path, capsys) -> None:
    assert main(["run", str(tmp_path / "no\nsuch.toml"), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no\\nsuch.toml" in err


def test_a_warm_up_covering_every_round_is_said(tmp_path, capsys) -> None:
    args = ["run", "quickstart", "--dry-run", "--quiet", "--set", "rounds=2"]
    assert main([*args, "--set", "training.warmup_rounds=2", "--out", str(tmp_path / "a")]) == 0
    assert "warning: training.warmup_rounds (2) covers all 2 rounds" in capsys.readouterr().err
    assert main([*args, "--set", "training.warmup_rounds=1", "--out", str(tmp_path / "b")]) == 0
    assert "warmup" not in capsys.readouterr().err


def test_async_concurrency_above_the_fleet_is_said(tmp_path, capsys) -> None:
    args = ["run", "async-digits", "--dry-run", "--quiet", "--set", "fleet.clients=5"]
    assert main([*args, "--set", "round.concurrency=6", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "warning: round.concurrency (6) is above fleet.clients (5): at most 5 clients" in err
    assert main([*args, "--set", "round.concurrency=5", "--out", str(tmp_path / "b")]) == 0
    assert "concurrency" not in capsys.readouterr().err


@pytest.mark.parametrize("item", [".rounds=3", "rounds.=3", "fleet..clients=3"])
def test_a_dotted_set_key_with_an_empty_part_is_named(item: str, capsys) -> None:
    assert main(["run", "quickstart", "--dry-run", "--set", item]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"--set: {item}: a dotted key has an empty part" in err


@pytest.mark.parametrize("error", ["ImportError", "OSError"])
def test_torch_that_cannot_load_is_one_line(tmp_path: Path, error: str) -> None:
    """Under `ulimit -v 3000000` torch's libraries fail to map as it is imported (here a torch on
    PYTHONPATH that fails as that one does): one line naming torch, the reason and the fix, no run
    folder."""
    fake = tmp_path / "fake" / "torch"
    fake.mkdir(parents=True)
    reason = "libtorch_cuda.so: failed to map segment from shared object"
    write(fake / "__init__.py", f"raise {error}({reason!r})\n")
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", "import sys; from edgefl.cli import main; sys.exit(main())",
                           "run", "quickstart", "--dry-run", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(fake.parent)},
                          timeout=120)
    assert done.returncode == 2
    line = one_error_line(done.stderr)
    assert line.startswith(f"edgefl: error: torch failed to load ({reason}): ")
    assert "ulimit -v" in line and "reinstall torch" in line
    assert not out.exists()
