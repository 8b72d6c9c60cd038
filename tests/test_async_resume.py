"""An async (FedBuff) run killed and resumed writes the files of one never killed: the resumed run is
played again from its start to its checkpoint (edgefl.experiment.async_rounds `Replay`), so clients
mid-flight at the kill, the buffer, the model versions, the batteries and a selection policy's
record all go on as they were."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from support import dies_before_checkpoint, kill_at, one_error_line, sets, simulated_rows, sleeper

from edgefl import rundir
from edgefl.cli import main

pytestmark = pytest.mark.slow  # whole runs, each in a fresh process

ROOT = Path(__file__).resolve().parents[1]
SMALL = ['round.mode="async"', "rounds=6", "training.local_iters=2", "attack.steps=1", "evaluation.steps=1",
         "data.test_samples=32"]
# living-digits: diurnal devices, batteries with a charger, shared server links, memory_fit picks;
# async-digits with oort: a policy whose picks read the training losses it recorded
CASES = {"living": ("living-digits", []), "oort": ("async-digits", ['selection.policy="oort"'])}


def args(case: str, out: Path) -> list[str]:
    name, extra = CASES[case]
    scenario = str(ROOT / "scenarios" / f"{name}.toml")
    return ["run", scenario, *sets(SMALL + extra), "--out", str(out), "--quiet"]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> dict[str, Path]:
    runs = {}
    for case in CASES:
        runs[case] = tmp_path_factory.mktemp(case) / "whole"
        assert main(args(case, runs[case])) == 0
    return runs


def same_files(a: Path, b: Path) -> None:
    for name in ("metrics.csv", "events.csv", "trace.json"):
        assert (a / name).read_text() == (b / name).read_text(), name
    assert simulated_rows(a / "clients.csv") == simulated_rows(b / "clients.csv")
    ours, theirs = (torch.load(d / rundir.CHECKPOINT, weights_only=True)["method"]["model"] for d in (a, b))
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)


@pytest.mark.parametrize("case", list(CASES))
def test_an_async_run_stopped_after_two_aggregations_resumes_to_the_same_files(whole, tmp_path, case, capsys):
    """Stopped where the third checkpoint would be saved (three rows written, the checkpoint of two):
    clients are at work and uploads wait in the buffer then."""
    out = tmp_path / "cut"
    with dies_before_checkpoint(3):
        assert main(args(case, out)) == 130
    saved = torch.load(out / rundir.CHECKPOINT, weights_only=True)
    assert saved["next_round"] == 2 and saved["player"]["kept"]  # clients no aggregation had logged
    assert saved["player"]["starts"] > 2 * 4  # more clients started than two buffers took
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    same_files(out, whole[case])


# The killed run's process: once aggregation 2's checkpoint is written, the next client to train
# says so (a file) and sleeps until it is killed: it dies with clients mid-flight.
KILLED = sleeper("edgefl.executors.executor", "train_timed",  # an async client trains alone, as it starts
                 'checkpoint.exists() and torch.load(checkpoint, weights_only=True)["next_round"] >= 2')


def test_an_async_run_killed_mid_flight_resumes_to_the_same_files(whole, tmp_path):
    out, mark = tmp_path / "killed", tmp_path / "mid-flight"
    cmd = [sys.executable, "-c", KILLED, *args("living", out), str(out / rundir.CHECKPOINT)]
    kill_at(cmd, mark, ROOT, "a client's training after its second checkpoint")
    assert not (out / "summary.json").exists()
    assert main(["run", "--resume", str(out), "--quiet"]) == 0
    same_files(out, whole["living"])


def test_a_checkpoint_the_replay_does_not_reach_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "cut"
    with dies_before_checkpoint(3):
        assert main(args("living", out)) == 130
    state = torch.load(out / rundir.CHECKPOINT, weights_only=True)
    state["player"]["starts"] += 1
    torch.save(state, out / rundir.CHECKPOINT)
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--resume" in line and "checkpoint is another run's" in line


def test_a_checkpoint_without_its_async_state_is_refused_in_one_line(tmp_path, capsys):
    out = tmp_path / "cut"
    with dies_before_checkpoint(3):
        assert main(args("living", out)) == 130
    state = torch.load(out / rundir.CHECKPOINT, weights_only=True)
    del state["player"]["kept"]
    torch.save(state, out / rundir.CHECKPOINT)
    capsys.readouterr()
    assert main(["run", "--resume", str(out), "--quiet"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "player: the checkpoint's async state is missing or damaged (KeyError)" in line
