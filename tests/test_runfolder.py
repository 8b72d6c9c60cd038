"""A run folder that changes under the run (issue 39): one process writes a run folder at a time, a
folder moved or replaced mid-run (by a link to a user's folder) gets nothing more, a log replaced by
a link stops the run, and a resume clears the temporary files a killed run left."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support import dies_before_checkpoint

from edgefl import checkpoint
from edgefl.cli import main

ROOT = Path(__file__).resolve().parents[1]
SETS = ("rounds=3", "fleet.clients=4", "training.local_iters=2", "attack.steps=1", "evaluation.steps=1",
        "data.test_samples=32", "threads=1")
TINY = [arg for item in SETS for arg in ("--set", item)]


def run(out: Path, *extra: str) -> list[str]:
    return ["run", str(ROOT / "scenarios" / "quickstart.toml"), *TINY, "--out", str(out), "--quiet", *extra]


@contextmanager
def after_first_checkpoint(then: Any) -> Iterator[None]:
    """Within: once a run saved its round-0 checkpoint, `then(run_dir)` runs (what a user did meanwhile)."""
    real = checkpoint.save

    def save(out: Path, state: dict[str, Any]) -> None:
        real(out, state)
        if state["next_round"] == 1:
            then(out)

    checkpoint.save = save  # type: ignore[assignment]
    try:
        yield
    finally:
        checkpoint.save = real


def test_a_run_folder_another_process_writes_is_refused_naming_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(run(out)) == 0
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY)  # what a run in another process holds
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        capsys.readouterr()
        assert main(run(out, "--overwrite")) == 2
        err = capsys.readouterr().err
        assert err == (f"edgefl: error: {out}: --out: another edgefl (pid {os.getpid()}) is writing this run "
                       "folder; wait until it ends, or choose another --out\n")
    finally:
        os.close(fd)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before  # nothing cleared
    assert main(run(out, "--overwrite")) == 0  # once the other is gone


def test_a_run_folder_replaced_by_a_link_to_a_users_folder_gets_nothing(tmp_path, capsys):
    out, moved, users = tmp_path / "run", tmp_path / "moved", tmp_path / "mine"
    users.mkdir()
    theirs = {name: f"the user's own {name}" for name in ("summary.json", "trace.json", "checkpoint.pt",
                                                          "metrics.csv")}
    for name, text in theirs.items():
        (users / name).write_text(text)

    def swap(run_dir: Path) -> None:
        run_dir.rename(moved)
        run_dir.symlink_to(users, target_is_directory=True)

    with after_first_checkpoint(swap):
        assert main(run(out)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was moved, deleted or replaced while the run wrote it" in err
    assert {p.name: p.read_text() for p in users.iterdir()} == theirs
    assert not (moved / "summary.json").exists() and (moved / "checkpoint.pt").exists()


def test_a_log_replaced_by_a_link_mid_run_stops_the_run(tmp_path, capsys):
    out, elsewhere = tmp_path / "run", tmp_path / "elsewhere.csv"
    elsewhere.write_text("a user's file\n")

    def link(run_dir: Path) -> None:
        (run_dir / "metrics.csv").unlink()
        (run_dir / "metrics.csv").symlink_to(elsewhere)

    with after_first_checkpoint(link):
        assert main(run(out)) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metrics.csv: file: was removed or replaced" in err
    assert elsewhere.read_text() == "a user's file\n"
    assert not (out / "summary.json").exists()


def test_a_resume_removes_the_temporary_files_a_killed_run_left(tmp_path, capsys):
    out = tmp_path / "run"
    with dies_before_checkpoint(2), pytest.raises(SystemExit, match="130"):
        raise SystemExit(main(run(out)))
    left = [out / ".clients.parquet.abc123.tmp", out / ".metrics.csv.xyz.tmp"]
    for path in left:
        path.write_bytes(b"half a file")
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    assert not any(p.exists() for p in left)
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


AVAILABLE = "client,start_s,end_s\n" + "".join(f"{k},0,900000\n" for k in range(4))


def test_a_resume_finds_its_trace_where_the_run_read_it_never_in_the_run_folder(tmp_path, capsys):
    """The scenario's folder, with its relative trace, deleted after a kill: the resume names where
    the trace was (it once suggested the run folder, whose trace.json the run then overwrote)."""
    source, out = tmp_path / "mine", tmp_path / "run"
    source.mkdir()
    (source / "s.toml").write_text((ROOT / "scenarios" / "quickstart.toml").read_text())
    (source / "trace.csv").write_text(AVAILABLE)
    args = ["run", str(source / "s.toml"), *TINY, "--set", 'fleet.availability="trace.csv"',
            "--out", str(out), "--quiet"]
    with dies_before_checkpoint(2):
        assert main(args) == 130
    kept = (source / "trace.csv").read_text()
    for path in source.iterdir():
        path.unlink()
    source.rmdir()
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    assert capsys.readouterr().err == (f"edgefl: error: {out}: --resume: the run read its trace from "
                                       f"{source / 'trace.csv'}, whose folder is gone; put the trace back "
                                       "there, then resume\n")
    source.mkdir()
    (source / "trace.csv").write_text(kept)
    assert main(["run", "--resume", str(out), "--quiet"]) == 0


def test_an_input_inside_the_run_folder_named_as_a_run_file_is_refused(tmp_path):
    from edgefl import rundir
    from edgefl.errors import EdgeflError
    from edgefl.experiment import prepare, run
    from edgefl.scenario import load_scenario

    out = tmp_path / "run"
    out.mkdir()
    rundir.write_marker(out, "run")
    (out / "trace.json").write_text('{"0": [[0, 900000]], "1": [[0, 900000]], "2": [[0, 900000]], '
                                    '"3": [[0, 900000]]}')
    sets = [*SETS, f'fleet.availability="{out / "trace.json"}"']
    scenario = load_scenario(ROOT / "scenarios" / "quickstart.toml", sets)
    exp = prepare(scenario, "quickstart.toml", dry_run=True)
    with pytest.raises(EdgeflError, match=r"where the run writes its own trace\.json"):
        run(exp, out, progress=False)
    assert (out / "trace.json").read_text().startswith('{"0": [[0, 900000]]')


def test_a_folder_is_held_once_however_this_process_spells_it(tmp_path, monkeypatch):
    from edgefl import rundir

    monkeypatch.chdir(tmp_path)
    (tmp_path / "r").mkdir()
    rundir.hold(Path("r"))
    try:
        rundir.hold(tmp_path / "r")  # the same folder: not "another edgefl (this pid)"
        rundir.in_place(Path("r"))
    finally:
        rundir.let_go(tmp_path / "r")
    assert not rundir._HELD
