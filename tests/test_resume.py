"""Checkpoint and resume: a run killed at any point continues to the metrics of an uninterrupted run."""

from __future__ import annotations

import json
import os
import pickle
import shutil
import sys
from pathlib import Path

import pytest
import torch
from support import QUICKSTART, ROOT, dies_before_checkpoint, kill_at, simulated_rows, sleeper

from edgefl import rundir
from edgefl.cli import main

SMALL = ["rounds=4", "fleet.clients=6", "training.local_iters=6", "attack.steps=3", "evaluation.steps=2",
         "data.test_samples=32", "threads=1"]


def sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("whole") / "run"
    assert main(["run", str(QUICKSTART), *sets(SMALL), "--out", str(out), "--quiet"]) == 0
    return out


def same_logs(a: Path, b: Path) -> None:
    for name in ("metrics.csv", "events.csv", "trace.json"):
        assert (a / name).read_text() == (b / name).read_text(), name
    assert simulated_rows(a / "clients.csv") == simulated_rows(b / "clients.csv")
    ours, theirs = (torch.load(d / rundir.CHECKPOINT, weights_only=True)["method"] for d in (a, b))
    for key, tensor in ours["model"].items():
        assert torch.equal(tensor, theirs["model"][key]), key


# The killed run's process: once round 0's checkpoint is written, the next group to train says so
# (a file) and sleeps mid-round until it is killed.
KILLED_RUN = sleeper("edgefl.methods.fedavg", "train_group", "checkpoint.exists()")


@pytest.mark.slow
def test_a_real_run_killed_mid_round_resumes_to_the_same_metrics(uninterrupted, tmp_path):
    out, mark = tmp_path / "killed", tmp_path / "mid-round"
    cmd = [sys.executable, "-c", KILLED_RUN, "run", str(QUICKSTART), *sets(SMALL), "--out", str(out),
           "--quiet", str(out / rundir.CHECKPOINT)]
    kill_at(cmd, mark, ROOT, "round 1's training")
    assert not (out / "summary.json").exists()
    saved = torch.load(out / rundir.CHECKPOINT, weights_only=True)["next_round"]
    assert saved == 1
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    same_logs(out, uninterrupted)


def test_a_run_interrupted_before_its_first_checkpoint_says_to_start_again(tmp_path, capsys):
    """Die where round 0's checkpoint would be saved: nothing to resume, so the line says to run it
    again with --overwrite, which then runs it from the start."""
    out = tmp_path / "early"
    args = ["run", str(QUICKSTART), *sets(SMALL), "--out", str(out), "--quiet"]
    with dies_before_checkpoint(1):
        assert main(args) == 130
    assert capsys.readouterr().err == ("edgefl: interrupted; no round was checkpointed: run it again with "
                                       "--overwrite\n")
    assert main([*args, "--overwrite"]) == 0


@pytest.mark.slow
def test_rows_written_after_the_last_checkpoint_are_not_repeated(uninterrupted, tmp_path, capsys):
    """Die after round 2's rows are written but before its checkpoint: resume drops and redoes them.
    The interrupted command says how to go on."""
    out = tmp_path / "late"
    with dies_before_checkpoint(3):
        assert main(["run", str(QUICKSTART), *sets(SMALL), "--out", str(out), "--quiet"]) == 130
    assert capsys.readouterr().err == (f"edgefl: interrupted; continue from its last checkpoint with "
                                       f"edgefl run --resume {out}\n")
    assert (out / "metrics.csv").read_text().count("\n") == 1 + 3  # header, rounds 0-2
    state = torch.load(out / rundir.CHECKPOINT, weights_only=True)
    assert state["wall_s"] > 0
    torch.save({**state, "wall_s": 1000.0}, out / rundir.CHECKPOINT)  # as if the first session took 1000 s
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    same_logs(out, uninterrupted)
    assert json.loads((out / "summary.json").read_text())["wall_time_s"] >= 1000.0  # both sessions'


class Boom:
    def __reduce__(self):
        return (os.system, ("touch BOOM",))


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_a_checkpoint_holding_code_is_refused_not_run(tmp_path, capsys, monkeypatch):
    out = tmp_path / "evil"
    out.mkdir()
    (out / "scenario.toml").write_text(QUICKSTART.read_text())
    (out / rundir.CHECKPOINT).write_bytes(pickle.dumps({"next_round": 1, "method": Boom()}))
    monkeypatch.chdir(tmp_path)
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint" in err
    assert not (tmp_path / "BOOM").exists()


def test_resume_refuses_a_run_without_a_checkpoint(tmp_path, capsys):
    """A dry run keeps no checkpoint: resuming it must not quietly start real training."""
    out = tmp_path / "dry"
    assert main(["run", str(QUICKSTART), *sets(SMALL), "--out", str(out), "--quiet", "--dry-run"]) == 0
    (out / "summary.json").unlink()
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no checkpoint" in err


def test_resume_refuses_a_finished_run_and_extra_arguments(uninterrupted, capsys):
    assert main(["run", "--resume", str(uninterrupted)]) == 2
    assert main(["run", str(QUICKSTART), "--resume", str(uninterrupted)]) == 2
    flags = ["--executor", "local", "--set", "ray.workers=2", "--set", "rounds=4", "--download",
             "--overwrite"]
    assert main(["run", "--resume", str(uninterrupted), *flags]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3 and "already finished" in lines[0] and lines[1].endswith("drop the scenario")
    assert lines[2].endswith("drop --set, --download, --overwrite")  # where clients train may change


def test_resume_names_a_changed_profile(uninterrupted, tmp_path, capsys, monkeypatch):
    """A profile the run used, edited since (here shadowed on EDGEFL_PROFILE_PATH by an edited copy),
    is named as such, not as another edgefl version."""
    out = tmp_path / "run"
    shutil.copytree(uninterrupted, out)
    (out / "summary.json").unlink()
    used = sorted(json.loads((uninterrupted / "summary.json").read_text())["fleet"])[0]
    mine = tmp_path / "mine"
    mine.mkdir()
    source = ROOT / "device_profiles" / f"{used}.toml"
    (mine / source.name).write_text(source.read_text() + "# edited\n")
    monkeypatch.setenv("EDGEFL_PROFILE_PATH", str(mine))
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"the run's file {used}.toml changed" in err and "version" not in err


def test_a_run_resumes_with_the_profiles_and_trace_beside_its_scenario_and_refuses_an_edited_trace(
        tmp_path, capsys):
    """The run folder is elsewhere than the scenario; its device profile and its trace (a relative path)
    are beside the scenario, found there on resume too; an edited trace is refused."""
    folder = tmp_path / "scenario"
    (folder / "device_profiles").mkdir(parents=True)
    phone = (ROOT / "device_profiles" / "pixel_4a.toml").read_text().replace('name = "pixel_4a"',
                                                                             'name = "my_phone"')
    (folder / "device_profiles" / "my_phone.toml").write_text(phone)
    trace = folder / "online.csv"
    trace.write_text("client,start_s,end_s\n" + "".join(f"{k},0,1e7\n" for k in range(6)))
    (folder / "mine.toml").write_text(QUICKSTART.read_text())
    args = ["run", str(folder / "mine.toml"), *sets([*SMALL, 'fleet.devices=["my_phone"]',
                                                     'fleet.availability="online.csv"'])]
    runs = [tmp_path / "runs" / name for name in ("kept", "edited")]
    with dies_before_checkpoint(2):
        for out in runs:
            assert main([*args, "--out", str(out), "--quiet"]) == 130
    assert main(["run", "--resume", str(runs[0]), "--quiet"]) == 0
    assert (runs[0] / "summary.json").exists()
    trace.write_text(trace.read_text().replace("5,0,1e7", "5,0,1e3"))
    capsys.readouterr()
    assert main(["run", "--resume", str(runs[1]), "--quiet"]) == 2
    assert "the run's file online.csv changed" in capsys.readouterr().err


def test_resume_says_a_damaged_marker_is_damaged_not_missing(uninterrupted, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(uninterrupted, out)
    (out / "summary.json").unlink()
    (out / rundir.MARKER).write_text("{")
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "marker is damaged" in err and "missing" not in err


def test_a_checkpoint_with_a_damaged_clock_is_refused_in_one_line(tmp_path, capsys):
    """The sync player's clock (its checkpoint state) damaged: one line naming it, nothing run."""
    out = tmp_path / "run"
    with dies_before_checkpoint(2):
        assert main(["run", str(QUICKSTART), *sets(SMALL), "--out", str(out), "--quiet"]) == 130
    state = torch.load(out / rundir.CHECKPOINT, weights_only=True)
    state["player"]["clock"] = "noon"
    torch.save(state, out / rundir.CHECKPOINT)
    before = (out / "metrics.csv").read_text()
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "player: the checkpoint's clock is missing or damaged" in err
    assert (out / "metrics.csv").read_text() == before  # nothing written
