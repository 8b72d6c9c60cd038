"""Output safety and resume integrity: no user file is ever deleted or overwritten, every write goes
through one safe writer, a run folder knows what it belongs to, and a run that ran out of space
resumes to the files of an uninterrupted run."""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support import QUICKSTART, SMALL, full_disk, nth, one_error_line, sets, simulated_rows, snapshot

from edgefl import rundir
from edgefl.cli import main
from edgefl.report.compare import load_run

ROOT = Path(__file__).resolve().parents[1]
LOGS = ("metrics.csv", "clients.csv", "events.csv")
Capsys = pytest.CaptureFixture[str]


def run_args(out: Path, *extra: str) -> list[str]:
    return ["run", str(QUICKSTART), *sets(SMALL), "--out", str(out), "--quiet", *extra]


def refused(capsys: Capsys, argv: list[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    return one_error_line(capsys.readouterr().err)


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished real run of SMALL."""
    out = tmp_path_factory.mktemp("whole") / "run"
    assert main(run_args(out)) == 0
    return out


def same_files(a: Path, b: Path) -> None:
    """Identical run files, but for clients.csv's measured wall time (and so its digest)."""
    for name in (*LOGS, "trace.json", "scenario.toml", rundir.MARKER):
        if name != "clients.csv":
            assert (a / name).read_bytes() == (b / name).read_bytes(), name
    assert simulated_rows(a / "clients.csv") == simulated_rows(b / "clients.csv")
    ours, theirs = (torch.load(d / rundir.CHECKPOINT, weights_only=True) for d in (a, b))
    assert {k: v for k, v in ours["logs"].items() if k != "clients.csv"} == {
        k: v for k, v in theirs["logs"].items() if k != "clients.csv"}
    for key, tensor in ours["method"]["model"].items():
        assert torch.equal(tensor, theirs["method"]["model"][key]), key


@pytest.fixture
def unfinished(whole: Path, tmp_path: Path) -> Path:
    """A copy of the finished run without its summary: resuming it trains nothing, only finishes."""
    out = tmp_path / "copy"
    shutil.copytree(whole, out)
    (out / "summary.json").unlink()
    return out


# the safe writer ----------------------------------------------------------------------------------


def test_write_file_replaces_a_symlink_never_its_target(tmp_path: Path) -> None:
    target = tmp_path / "thesis.tex"
    target.write_text("my thesis\n")
    link = tmp_path / "trace.json"
    link.symlink_to(target)
    rundir.write_file(link, "{}\n")
    assert target.read_text() == "my thesis\n"
    assert not link.is_symlink() and link.read_text() == "{}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["thesis.tex", "trace.json"]  # no temp left


def test_appends_refuse_a_symlink(tmp_path: Path) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("keep\n")
    (tmp_path / "events.csv").symlink_to(target)
    with pytest.raises(rundir.EdgeflError, match="symbolic link"):
        rundir.Appender(tmp_path / "events.csv")
    assert target.read_text() == "keep\n"


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"old")
    monkeypatch.setattr(rundir, "_write_all", full_disk(lambda _: True))
    with pytest.raises(rundir.WriteFailed, match="No space left"):
        rundir.write_file(path, b"new and longer")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


# --out: only ever an edgefl run is replaced ----------------------------------------------------------


def test_overwrite_never_deletes_a_folder_edgefl_did_not_make(tmp_path: Path, capsys: Capsys) -> None:
    out = tmp_path / "thesis"
    out.mkdir()
    (out / "thesis.tex").write_text("chapter 1\n")
    before = snapshot(out)
    line = refused(capsys, run_args(out, "--overwrite", "--dry-run"))
    assert "cannot tell they are its own" in line and "--out" in line
    assert snapshot(out) == before


@pytest.mark.parametrize("extra", [("--overwrite", "--dry-run"), ("--dry-run",)])
def test_a_damaged_marker_is_named_and_nothing_is_deleted(tmp_path: Path, capsys: Capsys, extra) -> None:
    out = tmp_path / "run"
    assert main(run_args(out, "--dry-run")) == 0
    (out / rundir.MARKER).write_text("garbage")
    before = snapshot(out)
    line = refused(capsys, run_args(out, *extra))
    assert "marker is damaged" in line and "did not write" not in line and "--out" in line
    assert snapshot(out) == before


def test_overwrite_keeps_a_user_file_put_into_a_run(tmp_path: Path, capsys: Capsys) -> None:
    out = tmp_path / "run"
    assert main(run_args(out, "--dry-run")) == 0
    (out / "notes.txt").write_text("mine\n")
    (out / "figures").mkdir()
    before = snapshot(out)
    assert "notes.txt" in refused(capsys, run_args(out, "--overwrite", "--dry-run"))
    assert snapshot(out) == before
    (out / "notes.txt").unlink()
    assert main(run_args(out, "--overwrite", "--dry-run")) == 0  # edgefl's files alone: replaced


@pytest.mark.slow
def test_overwrite_replaces_a_run_with_the_figures_edgefl_plot_drew(tmp_path: Path) -> None:
    """`make run` twice: run, plot (the timeline included), then run --overwrite."""
    out = tmp_path / "run"
    assert main(run_args(out, "--dry-run")) == 0
    assert main(["plot", str(out)]) == 0
    assert (out / "figures" / "timeline.png").is_file()
    assert main(run_args(out, "--overwrite", "--dry-run")) == 0
    assert not (out / "figures").exists()


def test_overwrite_replaces_a_run_whose_figures_hold_several_runs_timelines(tmp_path: Path) -> None:
    """`edgefl plot RUN OTHER` draws timeline-RUN and timeline-OTHER into RUN/figures: edgefl's own."""
    out, other = tmp_path / "run", tmp_path / "other"
    assert main(run_args(out, "--dry-run")) == 0 and main(run_args(other, "--dry-run")) == 0
    assert main(["plot", str(out), str(other)]) == 0
    assert (out / "figures" / "timeline-other.png").is_file()
    assert main(run_args(out, "--overwrite", "--dry-run")) == 0
    assert not (out / "figures").exists()


def test_overwrite_removes_a_symlink_in_a_run_not_its_target(tmp_path: Path) -> None:
    out, target = tmp_path / "run", tmp_path / "thesis.tex"
    target.write_text("chapter 1\n")
    assert main(run_args(out, "--dry-run")) == 0
    (out / "trace.json").unlink()
    (out / "trace.json").symlink_to(target)
    assert main(run_args(out, "--overwrite", "--dry-run")) == 0
    assert target.read_text() == "chapter 1\n"
    assert not (out / "trace.json").is_symlink()


def test_an_unwritable_out_is_one_line(tmp_path: Path, capsys: Capsys, monkeypatch) -> None:
    """A read-only folder (root ignores chmod, so the failure is injected where every write goes)."""
    out = tmp_path / "ro"
    monkeypatch.setattr(rundir, "_write_all", full_disk(lambda _: True, errno.EACCES))
    line = refused(capsys, run_args(out, "--dry-run"))
    assert rundir.MARKER in line and "Permission denied" in line
    assert list(out.iterdir()) == []


def test_empty_out_is_refused_and_the_current_folder_untouched(tmp_path: Path, capsys: Capsys,
                                                               monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "thesis.tex").write_text("chapter 1\n")
    before = snapshot(tmp_path)
    assert "--out" in refused(capsys, ["run", str(QUICKSTART), "--out", "", "--overwrite", "--dry-run"])
    assert "--out" in refused(capsys, ["compare", str(QUICKSTART), "--methods", "jfat", "--out", " "])
    assert snapshot(tmp_path) == before


def test_compare_never_deletes_a_user_file(tmp_path: Path, capsys: Capsys) -> None:
    def compare(out: Path) -> list[str]:
        return ["compare", str(QUICKSTART), "--methods", "jfat", *sets(SMALL), "--dry-run", "--quiet",
                "--out", str(out)]
    mine = tmp_path / "mine"
    (mine / "jfat").mkdir(parents=True)
    (mine / "jfat" / "notes.txt").write_text("mine\n")
    assert "cannot tell they are its own" in refused(capsys, compare(mine))
    assert (mine / "jfat" / "notes.txt").read_text() == "mine\n"
    out = tmp_path / "cmp"
    assert main(compare(out)) == 0
    (out / "jfat" / "summary.json").unlink()  # a dry run is redone: replaced if edgefl's alone
    (out / "jfat" / "notes.txt").write_text("mine\n")
    assert "notes.txt" in refused(capsys, compare(out))
    assert (out / "jfat" / "notes.txt").read_text() == "mine\n"


# resume: every file checked before anything is written ---------------------------------------------


def logs_of(out: Path) -> dict[str, bytes]:
    return {name: (out / name).read_bytes() for name in (*LOGS, rundir.CHECKPOINT)}


def edit_checkpoint(out: Path, change: Callable[[dict], None]) -> None:
    state = torch.load(out / rundir.CHECKPOINT, weights_only=True)
    change(state)
    torch.save(state, out / rundir.CHECKPOINT)


@pytest.mark.parametrize(("change", "says"), [
    (lambda s: s.update(next_round=99), "next_round"),
    (lambda s: s.update(next_round="2"), "next_round"),
    (lambda s: s.pop("logs"), "logs"),
    (lambda s: s.update(fingerprint={"scenario": "other"}), "another run"),
    (lambda s: s["method"].update(model={"w": torch.zeros(1)}), "does not fit"),
])
def test_a_bad_checkpoint_is_refused_before_any_file_changes(unfinished: Path, capsys: Capsys, change,
                                                             says: str) -> None:
    edit_checkpoint(unfinished, change)
    before = snapshot(unfinished)
    assert says in refused(capsys, ["run", "--resume", str(unfinished)])
    assert snapshot(unfinished) == before


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_foreign_checkpoint_is_refused(unfinished: Path, tmp_path: Path, capsys: Capsys) -> None:
    torch.save({"a": 1, "next_round": [1]}, unfinished / rundir.CHECKPOINT)
    assert "not an edgefl checkpoint" in refused(capsys, ["run", "--resume", str(unfinished)])
    (unfinished / rundir.CHECKPOINT).write_bytes(b"\x80\x04garbage")
    line = refused(capsys, ["run", "--resume", str(unfinished)])
    assert "checkpoint" in line and "weights_only" not in line


def test_a_checkpoint_of_another_run_is_refused(unfinished: Path, tmp_path: Path, capsys: Capsys) -> None:
    other = tmp_path / "other"
    assert main(run_args(other, "--set", "seed=1", "--set", "rounds=1")) == 0
    shutil.copy(other / rundir.CHECKPOINT, unfinished / rundir.CHECKPOINT)
    before = snapshot(unfinished)
    assert "another run" in refused(capsys, ["run", "--resume", str(unfinished)])
    assert snapshot(unfinished) == before


def test_an_edited_scenario_is_refused(unfinished: Path, capsys: Capsys) -> None:
    path = unfinished / "scenario.toml"
    path.write_text(path.read_text().replace("seed = 0", "seed = 7"))
    before = snapshot(unfinished)
    assert "edited" in refused(capsys, ["run", "--resume", str(unfinished)])
    assert snapshot(unfinished) == before


@pytest.mark.parametrize("name", LOGS)
def test_a_lost_or_edited_log_is_refused(unfinished: Path, capsys: Capsys, name: str) -> None:
    path = unfinished / name
    text = path.read_bytes()
    path.write_bytes(text.replace(b"1", b"2", 1))
    before = snapshot(unfinished)
    assert name in refused(capsys, ["run", "--resume", str(unfinished)])
    assert snapshot(unfinished) == before
    path.unlink()
    assert name in refused(capsys, ["run", "--resume", str(unfinished)])
    assert not path.exists()  # never a header-only file beside a checkpoint of 3 rounds


def test_a_torn_last_row_is_dropped(whole: Path, unfinished: Path) -> None:
    with open(unfinished / "events.csv", "ab") as f:
        f.write(b"1,3,comp")  # cut mid-row, as a full disk leaves it: no round 1 row to mistake
    assert main(["run", "--resume", str(unfinished), "--quiet"]) == 0
    same_files(unfinished, whole)


# storage failures mid-run ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "n", "code"), [
    ("events.csv", 3, errno.ENOSPC),  # header, round 0, round 1: torn in round 1
    ("checkpoint.pt", 2, errno.EROFS),  # round 1's checkpoint: round 0's stays
    ("trace.json", 1, errno.ENOSPC),  # after the last checkpoint
])
def test_a_full_disk_mid_run_resumes_to_identical_files(whole: Path, tmp_path: Path, capsys: Capsys,
                                                        monkeypatch, name: str, n: int, code: int) -> None:
    out = tmp_path / "full"
    monkeypatch.setattr(rundir, "_write_all", full_disk(nth(name, n), code))
    line = refused(capsys, run_args(out))
    assert name in line and os.strerror(code) in line and f"--resume {out}" in line
    assert not (out / "summary.json").exists()
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    monkeypatch.undo()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    same_files(out, whole)


def test_a_full_disk_in_a_dry_run_says_to_start_again(tmp_path: Path, capsys: Capsys, monkeypatch) -> None:
    out = tmp_path / "dry"
    monkeypatch.setattr(rundir, "_write_all", full_disk(nth("clients.csv", 2)))
    line = refused(capsys, run_args(out, "--dry-run"))
    assert "clients.csv" in line and "--overwrite" in line
    monkeypatch.undo()
    assert main(run_args(out, "--dry-run", "--overwrite")) == 0


# the writer under any sequence of writes, appends and links ----------------------------------------


names = st.sampled_from(["metrics.csv", "events.csv", "trace.json", "checkpoint.pt"])
steps = st.lists(st.tuples(st.sampled_from(["write", "append", "link"]), names, st.binary(max_size=20)),
                 max_size=8)


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(steps)
def test_no_write_ever_reaches_a_file_outside_the_folder(plan: list[tuple[str, str, bytes]]) -> None:
    with tempfile.TemporaryDirectory() as root:
        outside, folder = Path(root) / "thesis.tex", Path(root) / "run"
        outside.write_bytes(b"chapter 1\n")
        folder.mkdir()
        for action, name, payload in plan:
            path = folder / name
            if action == "link":
                path.unlink(missing_ok=True)
                path.symlink_to(outside)
            elif action == "write":
                rundir.write_file(path, payload)
                assert path.read_bytes() == payload and not path.is_symlink()
            elif path.exists() and not path.is_symlink():
                appender = rundir.Appender(path)
                appender.append(payload)
                appender.close()
            else:
                with pytest.raises(rundir.EdgeflError):
                    rundir.Appender(path)
        assert outside.read_bytes() == b"chapter 1\n"
        assert not [p for p in folder.iterdir() if p.name.endswith(".tmp")]


def test_plot_reads_whole_rows_of_an_interrupted_run(tmp_path: Path, capsys: Capsys) -> None:
    """A run stopped by a full disk ends mid-row: plot drops the torn row, never misreads it."""
    out = tmp_path / "run"
    assert main(run_args(out, "--dry-run")) == 0
    whole_rows = (out / "clients.csv").read_text().count("\n") - 1
    with open(out / "clients.csv", "ab") as f:
        f.write(b"3,1,raspberry_pi_4,no")
    assert main(["plot", str(out)]) == 0
    assert len(load_run(out).clients) == whole_rows


def test_overwrite_keeps_the_run_when_its_ray_cluster_does_not_answer(tmp_path: Path, capsys) -> None:
    """The Ray address is asked before the run folder is replaced: nothing written is lost."""
    import socket

    out = tmp_path / "run"
    assert main(run_args(out, "--set", "rounds=1")) == 0
    before = snapshot(out)
    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(run_args(out, "--set", "rounds=1", "--overwrite", "--executor", "ray", "--set",
                         f'ray.address="127.0.0.1:{port}"')) == 2
    assert "ray.address: no Ray cluster answers" in capsys.readouterr().err
    assert snapshot(out) == before
