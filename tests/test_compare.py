"""`edgefl compare`: one run per method on the same fleet, finished runs kept, interrupted ones resumed."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from edgefl.cli import main
from edgefl.errors import NotARunError
from edgefl.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "compare-digits.toml"
SMALL = ["--set", "rounds=3", "--set", "fleet.clients=6"]


@pytest.mark.slow
def test_compare_writes_the_table_and_figures_and_keeps_finished_runs(tmp_path, capsys):
    out = tmp_path / "cmp"
    args = ["compare", str(SCENARIO), "--methods", "jfat,fedprophet,heterofl_at", *SMALL, "--out", str(out),
            "--dry-run", "--quiet"]
    assert main(args) == 0
    with open(out / "comparison.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["method"] for r in rows] == ["jfat", "fedprophet", "heterofl_at"]
    for row in rows:  # each run's simulated time as its metrics.csv ends, against jFAT's
        with open(out / row["method"] / "metrics.csv", newline="") as f:
            row["ends"] = float(list(csv.DictReader(f))[-1]["sim_time_s"])
    assert rows[0]["speedup_vs_jfat"] == "1.0"
    for row in rows[1:]:
        assert float(row["speedup_vs_jfat"]) == pytest.approx(rows[0]["ends"] / row["ends"], rel=1e-9)
        assert float(row["speedup_vs_jfat"]) != 1.0
    for stem in ("speedup", "breakdown", "memory", "epsilon"):
        assert (out / "figures" / f"{stem}.png").stat().st_size > 0
        assert (out / "figures" / f"{stem}.svg").stat().st_size > 0
    first = (out / "fedprophet" / "metrics.csv").read_text()
    (out / "heterofl_at" / "summary.json").unlink()  # as if it had been killed
    capsys.readouterr()
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("jfat: finished, kept") and lines[1].startswith("fedprophet: finished, kept")
    assert lines[2].startswith("heterofl_at: 3 rounds")
    assert (out / "fedprophet" / "metrics.csv").read_text() == first


def test_compare_refuses_a_run_directory_of_another_scenario_even_finished(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", str(SCENARIO), "--methods", "jfat", *SMALL, "--out", str(out), "--dry-run",
                 "--quiet"]) == 0
    capsys.readouterr()
    assert main(["compare", str(SCENARIO), "--methods", "jfat", *SMALL, "--set", "seed=1", "--out", str(out),
                 "--dry-run", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "another scenario" in err


def test_a_kept_run_damaged_since_is_redone_not_replaced(tmp_path, capsys):
    """A finished method's metrics.csv deleted: the fix named is to delete that method's folder."""
    out = tmp_path / "cmp"
    args = ["compare", str(SCENARIO), "--methods", "jfat", *SMALL, "--out", str(out), "--dry-run", "--quiet"]
    assert main(args) == 0
    (out / "jfat" / "metrics.csv").unlink()
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "metrics.csv: missing; delete that run's folder in" in err
    assert "made by edgefl run" not in err


@pytest.mark.parametrize("cut", ["round,client,", "round,sim_time_s"])
def test_a_kept_runs_cut_metrics_name_the_fix_that_works(tmp_path, capsys, cut):
    """A kept metrics.csv cut inside its header, or after it (no row): redo that method."""
    out = tmp_path / "cmp"
    args = ["compare", str(SCENARIO), "--methods", "jfat", *SMALL, "--out", str(out), "--dry-run", "--quiet"]
    assert main(args) == 0
    metrics = out / "jfat" / "metrics.csv"
    header = metrics.read_text().splitlines()[0]
    metrics.write_text(header + "\n" if cut == "round,sim_time_s" else cut)
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "delete that run's folder in" in err, err


def test_compare_refuses_set_method(tmp_path, capsys):
    out = str(tmp_path / "c")
    assert main(["compare", str(SCENARIO), "--methods", "jfat", "--set", "method=nosuch", "--out", out,
                 "--dry-run"]) == 2
    assert "--set: method: edgefl compare takes its methods from --methods" in capsys.readouterr().err


def test_not_a_run_error_names_its_problem_and_takes_another_fix():
    err = NotARunError("runs/a", "metrics.csv", "missing")
    assert str(err) == "runs/a: metrics.csv: missing; give a run directory made by edgefl run"
    redo = err.with_fix("redo it")
    assert (redo.where, redo.key, redo.fix) == ("runs/a", "metrics.csv", "missing; redo it")


@pytest.mark.parametrize("methods", ["", ",", "jfat,jfat", "jfat,,fedprophet", "jfat,"])
def test_compare_wants_each_method_once(tmp_path, capsys, methods):
    out = str(tmp_path / "c")
    assert main(["compare", str(SCENARIO), "--methods", methods, "--out", out, "--dry-run"]) == 2
    assert "--methods" in capsys.readouterr().err


def test_compare_validates_every_method_before_running_any(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", str(SCENARIO), "--methods", "jfat,nosuch", "--out", str(out), "--dry-run"]) == 2
    assert "edgefl compare: --methods: unknown method 'nosuch'" in capsys.readouterr().err  # not --set's
    assert not out.exists()


def test_compare_gives_each_method_its_rounds_from_the_table(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", str(SCENARIO), "--methods", "jfat,fedprophet,heterofl_at", *SMALL,
                 "--set", "compare.rounds={ jfat = 2, fedprophet = 4 }", "--out", str(out),
                 "--dry-run", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("jfat: 2 rounds")
    assert lines[1].startswith("fedprophet: 4 rounds")
    assert lines[2].startswith("heterofl_at: 3 rounds")  # not listed: the scenario's rounds
    for method, rounds in (("jfat", 2), ("fedprophet", 4), ("heterofl_at", 3)):
        with open(out / method / "metrics.csv", newline="") as f:
            assert len(list(csv.DictReader(f))) == rounds


@pytest.mark.parametrize(("table", "key"), [("{ nosuch = 5 }", "compare.rounds"),
                                            ("{ jfat = 0 }", "compare.rounds.jfat"),
                                            ("{ jfat = 1.5 }", "compare.rounds.jfat"),
                                            ("5", "compare.rounds")])
def test_compare_rounds_table_is_checked(tmp_path, capsys, table, key):
    out = tmp_path / "cmp"
    assert main(["compare", str(SCENARIO), "--methods", "jfat", "--set", f"compare.rounds={table}",
                 "--out", str(out), "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f": {key}: " in err, err
    assert not out.exists()


def test_compare_digits_gives_fedprophet_m_times_jfats_rounds(capsys):
    """The paper's budgets (FedProphet §7.1): FedProphet M x jFAT's rounds, M from the partition of
    the scenario's own model at its own R_min, so the table cannot drift from the fleet."""
    assert main(["partition", str(SCENARIO), "--json"]) == 0
    modules = json.loads(capsys.readouterr().out)
    rounds = load_scenario(SCENARIO).compare.rounds
    assert len(modules) == 2  # conv1-conv2 and conv3: every module fits R_min = 1.6 MB
    assert rounds["fedprophet"] == len(modules) * rounds["jfat"]


def test_set_rounds_overrides_the_scenario_files_rounds_table(tmp_path, capsys):
    """compare-digits.toml's table gives jfat 24 rounds and fedprophet 48; --set rounds=2 asks 2 of each."""
    assert load_scenario(SCENARIO).compare.rounds == {"jfat": 24, "fedprophet": 48}
    assert main(["compare", str(SCENARIO), "--methods", "jfat,fedprophet", "--set", "rounds=2",
                 "--set", "fleet.clients=6", "--out", str(tmp_path / "cmp"), "--dry-run", "--quiet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("jfat: 2 rounds") and lines[1].startswith("fedprophet: 2 rounds")


def test_compare_refuses_to_keep_a_dry_run_in_a_comparison_that_trains(tmp_path, capsys):
    out = tmp_path / "cmp"
    args = ["compare", str(SCENARIO), "--methods", "jfat", *SMALL, "--out", str(out), "--quiet"]
    assert main([*args, "--dry-run"]) == 0
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--dry-run: holds a dry run" in err
    assert json.loads((out / "jfat" / "summary.json").read_text())["dry_run"] is True  # kept as it was


@pytest.mark.slow
def test_an_interrupted_async_comparison_resumes_its_run(tmp_path, capsys, monkeypatch):
    """Ctrl-C at the third aggregation: the rows of two are written and checkpointed; the same
    comparison again resumes the run (edgefl.experiment.async_rounds plays it again to there) and
    writes the files of a run never stopped."""
    from edgefl.experiment.async_rounds import AsyncRounds

    sets = ["--set", "rounds=4", "--set", "training.local_iters=2", "--set", "attack.steps=1", "--set",
            "evaluation.steps=1", "--set", "data.test_samples=32"]
    args = ["compare", str(ROOT / "scenarios" / "async-digits.toml"), "--methods", "jfat", "--quiet", *sets]
    assert main([*args, "--out", str(tmp_path / "whole")]) == 0
    real = AsyncRounds.play

    def interrupted(self: AsyncRounds, t: int) -> Any:
        if t == 2 and self.replay is None:
            raise KeyboardInterrupt
        return real(self, t)

    cut = [*args, "--out", str(tmp_path / "cmp")]
    with monkeypatch.context() as patch:
        patch.setattr(AsyncRounds, "play", interrupted)
        assert main(cut) == 130
    run = tmp_path / "cmp" / "jfat"
    assert torch.load(run / "checkpoint.pt", weights_only=True)["next_round"] == 2
    capsys.readouterr()
    assert main(cut) == 0
    assert capsys.readouterr().out.startswith("jfat: 4 rounds")
    for name in ("metrics.csv", "events.csv"):
        assert (run / name).read_text() == (tmp_path / "whole" / "jfat" / name).read_text()


def test_a_comparison_refused_for_missing_data_leaves_no_folder(tmp_path, capsys):
    out = tmp_path / "cmp"
    args = ["compare", "jfat-cifar10", "--methods", "jfat,fedprophet", "--set", f'data.root="{tmp_path}"',
            "--out", str(out), "--quiet"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "data.root" in err and "holds no copy" in err
    assert not out.exists()


def test_a_dry_comparison_refuses_a_target_it_cannot_reach(tmp_path, capsys):
    out = tmp_path / "cmp"
    args = ["compare", str(SCENARIO), "--methods", "jfat", *SMALL, "--out", str(out), "--quiet", "--dry-run"]
    assert main([*args, "--target", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--target: 0.5: a dry run has no accuracies to reach" in err
    assert not out.exists()
