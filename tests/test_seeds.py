"""A comparison over seeds: the statistics by hand-worked numbers, and `edgefl compare --seeds`'s
folders, files, resume and errors."""

from __future__ import annotations

import csv
import math
import os
import re
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.container import ErrorbarContainer
from support import JFAT_CLIENTS, write_run

from edgefl import checkpoint
from edgefl.cli import main
from edgefl.experiment import loop
from edgefl.report.compare import Run, load_run
from edgefl.report.figures import band_accuracy_figure, seed_axis, seed_curves
from edgefl.report.seeds import difference_lines, differences, summary_rows
from edgefl.report.stats import Band, EndPoint, band, bootstrap_interval, paired, spread, t_interval

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "compare-digits.toml"
SMALL = ["--set", "rounds=3", "--set", "fleet.clients=6"]
T_975_2 = 4.302653  # Student t, 97.5 % quantile, 2 degrees of freedom (any t table: 4.303)


def test_t_interval_of_three_known_pairs():
    """Differences -0.03, -0.02, -0.05: mean -1/30, s = sqrt(((1/300)^2 + (4/300)^2 + (5/300)^2) / 2)
    = 0.0152753, half width t(0.975, 2) s / sqrt(3)."""
    found = paired([0.50, 0.48, 0.52], [0.47, 0.46, 0.47], "difference")
    s = math.sqrt(((1 / 300) ** 2 + (4 / 300) ** 2 + (5 / 300) ** 2) / 2)
    half = T_975_2 * s / math.sqrt(3)
    assert s == pytest.approx(0.0152753, abs=1e-7)
    assert found.estimate == pytest.approx(-1 / 30)
    assert (found.low, found.high) == pytest.approx((-1 / 30 - half, -1 / 30 + half), abs=1e-6)
    assert (found.low, found.high) == pytest.approx((-0.071279, 0.004612), abs=1e-6)
    assert found.n == 3


def test_a_ratio_is_the_geometric_mean_with_the_interval_of_the_log_ratios():
    """Times 90/100, 170/200, 360/400: ratios 0.9, 0.85, 0.9, geometric mean 0.6885^(1/3)."""
    found = paired([100.0, 200.0, 400.0], [90.0, 170.0, 360.0], "ratio")
    logs = [math.log(0.9), math.log(0.85), math.log(0.9)]
    mean = sum(logs) / 3
    s = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = T_975_2 * s / math.sqrt(3)
    assert found.estimate == pytest.approx(0.6885 ** (1 / 3))
    assert (found.low, found.high) == pytest.approx((math.exp(mean - half), math.exp(mean + half)), abs=1e-6)
    assert found.low < found.estimate < found.high


def test_one_pair_has_no_interval_and_equal_pairs_a_zero_width_one():
    assert t_interval([0.25]).low is None and t_interval([0.25]).high is None
    same = t_interval([0.1, 0.1, 0.1])
    assert (same.low, same.high) == pytest.approx((0.1, 0.1))
    assert bootstrap_interval([0.1, 0.1]).low == pytest.approx(0.1)


def test_the_bootstrap_is_seeded_and_a_percentile_interval_of_the_mean():
    diffs = [-0.03, -0.02, -0.05, -0.01, -0.04]
    first, again = bootstrap_interval(diffs), bootstrap_interval(diffs)
    assert (first.low, first.high) == (again.low, again.high)
    assert first.estimate == pytest.approx(-0.03)
    # a resampled mean lies between the least and greatest value, and the interval holds the mean
    assert min(diffs) <= first.low < -0.03 < first.high <= max(diffs)
    assert paired([0.0] * 5, diffs, "difference", "bootstrap") == first


def test_band_of_two_known_curves():
    """y = x and y = 10 + 2x on [0, 10], three grid points: at 0, 5, 10 the curves are 0/10, 5/20,
    10/30."""
    found = band([[(0, 0), (10, 10)], [(0, 10), (10, 30)]], points=3)
    assert found is not None
    assert found.grid == [0, 5, 10]
    assert found.mean == [5, 12.5, 20] and found.low == [0, 5, 10] and found.high == [10, 20, 30]


def test_band_spans_what_every_curve_covers_and_none_without_overlap():
    """The second curve covers x in [2, 8] only: the band too, where the first is at 2, 5, 8."""
    found = band([[(0, 0), (10, 10)], [(2, 4), (8, 4)]], points=3)
    assert found is not None and found.grid == [2, 5, 8]
    assert found.mean == [3, 4.5, 6] and found.low == [2, 4, 4] and found.high == [4, 5, 8]
    assert band([[(0, 0), (1, 1)], [(2, 0), (3, 1)]]) is None


def test_spread_is_the_band_or_where_curves_without_a_common_span_end():
    """Curves ending at (2, 4) and (6, 10): (4, 7) their mean end, x 2-6, y 4-10. Curves that share
    one point only (x = 2) have no band to draw either."""
    assert isinstance(spread([[(0, 0), (10, 10)], [(2, 4), (8, 4)]], points=3), Band)
    assert spread([[(0, 0), (1, 2), (2, 4)], [(3, 1), (6, 10)]]) == EndPoint(4, 2, 6, 7, 4, 10)
    assert spread([[(0, 0), (2, 4)], [(2, 6), (3, 1)]]) == EndPoint(2.5, 2, 3, 2.5, 1, 4)
    assert spread([[(5, 50)]]) == EndPoint(5, 5, 5, 50, 50, 50)


def _seed_run(path: Path, seed: int, evals: list[tuple[float, float | None, float | None]]) -> Run:
    """A jFAT run of 2 rounds: (simulated s, clean, adversarial) of each, None where not evaluated."""
    path.mkdir(parents=True)
    metrics = [{"round": t, "sim_time_s": s, "server_s": 0, **({"clean_acc": c, "adv_acc": a} if c else {})}
               for t, (s, c, a) in enumerate(evals)]
    return load_run(write_run(path / f"seed-{seed}", "jfat", metrics, JFAT_CLIENTS))


def test_seeds_whose_clocks_share_no_span_are_banded_over_rounds(tmp_path):
    """Seed 0 evaluates at 100 s and 200 s, seed 1 at 300 s and 600 s: no common span of simulated
    time, so the figure's x axis is the round, where the PGD band runs from rounds 1 to 2 between
    20-30 % and 40-50 %, its mean 25 % to 45 % (35 % at round 1.5: linear in between)."""
    runs = {"jfat": [_seed_run(tmp_path / "a", 0, [(100, 0.5, 0.2), (200, 0.6, 0.4)]),
                     _seed_run(tmp_path / "b", 1, [(300, 0.7, 0.3), (600, 0.9, 0.5)])]}
    assert seed_curves(runs, 2, "time") == {"jfat": [[(100 / 3600, 20), (200 / 3600, 40)],
                                                     [(300 / 3600, 30), (600 / 3600, 50)]]}
    assert isinstance(spread(seed_curves(runs, 2, "time")["jfat"]), EndPoint)
    assert seed_axis(runs) == "round"
    found = spread(seed_curves(runs, 2, "round")["jfat"], points=3)
    assert found == Band([1, 1.5, 2], [25, 35, 45], [20, 30, 40], [30, 40, 50])
    fig = band_accuracy_figure(runs, None)
    assert fig is not None
    adv = fig.axes[0]
    assert adv.get_xlabel().startswith("communication round")
    mean = next(line for line in adv.get_lines() if line.get_linewidth() == 1.8)
    xs, ys = mean.get_xdata(), mean.get_ydata()
    assert (xs[0], xs[-1], ys[0], ys[-1]) == pytest.approx((1, 2, 25, 45))
    assert float(np.interp(1.5, xs, ys)) == pytest.approx(35)
    shaded = adv.collections[0].get_paths()[0].vertices
    assert {float(y) for x, y in shaded if x == 1} == {20, 30}
    assert {float(y) for x, y in shaded if x == 2} == {40, 50}
    plt.close(fig)


def test_seeds_with_one_evaluation_each_get_their_mean_end_with_min_max_bars(tmp_path):
    """Seed 0 evaluates once, at 200 s (40 % PGD), seed 1 at 600 s (50 %): no span on either axis,
    so the figure stays on simulated time with a bar from 200 s to 600 s around 400 s, and from
    40 % to 50 % around 45 %."""
    runs = {"jfat": [_seed_run(tmp_path / "a", 0, [(100, None, None), (200, 0.6, 0.4)]),
                     _seed_run(tmp_path / "b", 1, [(300, None, None), (600, 0.9, 0.5)])]}
    assert seed_axis(runs) == "time"
    fig = band_accuracy_figure(runs, None)
    assert fig is not None
    adv = fig.axes[0]
    assert adv.get_xlabel() == "simulated wall-clock time (hours)"
    bars = next(c for c in adv.containers if isinstance(c, ErrorbarContainer))
    point, _, (xbar, ybar) = bars.lines
    assert (point.get_xdata()[0], point.get_ydata()[0]) == pytest.approx((400 / 3600, 45))
    assert xbar.get_segments()[0].ravel() == pytest.approx([200 / 3600, 45, 600 / 3600, 45])
    assert ybar.get_segments()[0].ravel() == pytest.approx([400 / 3600, 40, 400 / 3600, 50])
    plt.close(fig)


def _row(method: str, seed: int, adv: float, sim: float, reached: float | None) -> dict[str, Any]:
    row: dict[str, Any] = dict.fromkeys(["clean_acc", "speedup_vs_jfat", "speedup_to_target_vs_jfat",
                                         "mem_need_mb", "mem_peak_mb", "fleet_mem_median_mb", "fits_share",
                                         "data_access_share", "compute_share", "comm_share", "wait_share",
                                         "energy_per_device_j", "energy_to_target_per_device_j"])
    return {**row, "method": method, "seed": seed, "run": f"{method}/seed-{seed}", "adv_acc": adv,
            "sim_time_s": sim, "time_to_target_s": reached}


def test_summary_and_differences_over_the_seeds_that_have_each_figure():
    rows = [_row("jfat", 0, 0.50, 100.0, 40.0), _row("jfat", 1, 0.48, 200.0, 60.0),
            _row("jfat", 2, 0.52, 400.0, 80.0),
            _row("fedprophet", 0, 0.47, 90.0, 30.0), _row("fedprophet", 1, 0.46, 170.0, None),
            _row("fedprophet", 2, 0.47, 360.0, 40.0)]
    summary = {r["method"]: r for r in summary_rows(rows)}
    assert summary["fedprophet"]["n_seeds"] == 3 and summary["fedprophet"]["seeds"] == "0 1 2"
    assert summary["fedprophet"]["time_to_target_s_n"] == 2
    assert summary["fedprophet"]["time_to_target_s_mean"] == pytest.approx(35.0)
    assert summary["fedprophet"]["time_to_target_s_std"] == pytest.approx(math.sqrt(50))
    assert summary["jfat"]["sim_time_s_mean"] == pytest.approx(700 / 3)
    assert summary["jfat"]["clean_acc_mean"] is None  # no seed has it
    found = {d["figure"]: d for d in differences(rows, "jfat", "t")}
    assert set(found) == {"adv_acc", "sim_time_s", "time_to_target_s"}
    assert found["adv_acc"]["estimate"] == pytest.approx(-1 / 30)
    assert found["sim_time_s"]["estimate"] == pytest.approx(0.6885 ** (1 / 3))
    reached = found["time_to_target_s"]  # seeds 0 and 2: 30/40 and 40/80
    assert reached["n_pairs"] == 2 and reached["estimate"] == pytest.approx(math.sqrt(0.75 * 0.5))
    line = difference_lines(list(found.values()), "PGD-20", 3)[0]
    assert line.startswith("fedprophet - jfat: PGD-20 -3.3 pts [-7.1, 0.5], "
                           "simulated time 0.88x [0.81, 0.96]")
    assert line.endswith("(2 of 3 seeds)")


def _read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.slow
def test_compare_over_seeds_writes_a_run_per_method_and_seed_and_their_spread(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", str(SCENARIO), "--methods", "jfat,fedprophet", *SMALL, "--seeds", "0,1,2",
                 "--out", str(out), "--dry-run", "--quiet"]) == 0
    printed = capsys.readouterr().out
    ends = {}
    for method in ("jfat", "fedprophet"):
        for seed in (0, 1, 2):
            run = out / method / f"seed-{seed}"
            assert (run / "summary.json").is_file()
            assert f"seed = {seed}\n" in (run / "scenario.toml").read_text()
            ends[method, seed] = float(_read(run / "metrics.csv")[-1]["sim_time_s"])
    seeds = _read(out / "seeds.csv")
    assert [(r["method"], r["seed"]) for r in seeds] == [(m, s) for s in "012"
                                                          for m in ("jfat", "fedprophet")]
    for r in seeds:  # each seed's speed-up against jFAT on that seed
        s = int(r["seed"])
        assert float(r["speedup_vs_jfat"]) == pytest.approx(ends["jfat", s] / ends[r["method"], s])
    summary = {r["method"]: r for r in _read(out / "comparison.csv")}
    times = [ends["fedprophet", s] for s in range(3)]
    assert summary["fedprophet"]["n_seeds"] == "3"
    assert float(summary["fedprophet"]["sim_time_s_mean"]) == pytest.approx(sum(times) / 3)
    mean = sum(times) / 3
    assert float(summary["fedprophet"]["sim_time_s_std"]) == pytest.approx(
        math.sqrt(sum((t - mean) ** 2 for t in times) / 2))
    diffs = {(d["method"], d["figure"]): d for d in _read(out / "differences.csv")}
    ratio = math.prod(ends["fedprophet", s] / ends["jfat", s] for s in range(3)) ** (1 / 3)
    assert float(diffs["fedprophet", "sim_time_s"]["estimate"]) == pytest.approx(ratio)
    assert f"fedprophet - jfat: simulated time {ratio:.2f}x [" in printed
    for stem in ("speedup", "breakdown", "memory", "epsilon"):
        assert (out / "figures" / f"{stem}.png").stat().st_size > 0


@pytest.mark.slow
def test_one_seed_gives_the_files_of_a_comparison_without_seeds(tmp_path, capsys):
    args = ["compare", str(SCENARIO), "--methods", "jfat,heterofl_at", *SMALL, "--dry-run", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "plain")]) == 0
    assert main([*args, "--seeds", "1", "--out", str(tmp_path / "one")]) == 0
    printed = capsys.readouterr().out
    assert printed.count("no spread and no intervals") == 2
    for name in ("comparison.csv", "comparison.md", "jfat/metrics.csv", "heterofl_at/scenario.toml"):
        assert (tmp_path / "one" / name).read_text() == (tmp_path / "plain" / name).read_text()
    assert not any((tmp_path / "one" / name).exists() for name in ("seeds.csv", "differences.csv"))


@pytest.mark.slow
def test_the_scenarios_compare_seeds_runs_every_seed(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert main(["compare", str(SCENARIO), "--methods", "jfat,heterofl_at", *SMALL, "--set",
                 "compare.seeds=[3, 5]", "--out", str(out), "--dry-run", "--quiet"]) == 0
    assert sorted(p.name for p in (out / "heterofl_at").iterdir() if p.is_dir()) == ["seed-3", "seed-5"]
    # each run is one seed: its scenario.toml lists no seeds, so a seed added later keeps it
    assert "\nseeds = []\n" in (out / "jfat" / "seed-3" / "scenario.toml").read_text()
    assert {r["seed"] for r in _read(out / "seeds.csv")} == {"3", "5"}


@pytest.mark.slow
def test_a_killed_compare_over_seeds_keeps_finished_seeds_and_resumes_the_killed_one(tmp_path, capsys,
                                                                                      monkeypatch):
    out = tmp_path / "cmp"
    args = ["compare", str(SCENARIO), "--methods", "jfat", "--set", "rounds=3", "--set", "fleet.clients=4",
            "--set", "training.warmup_rounds=1", "--set", "training.local_iters=2", "--set", "attack.steps=1",
            "--set", "evaluation.steps=1", "--set", "data.test_samples=32", "--seeds", "0,1",
            "--out", str(out), "--quiet"]
    real = checkpoint.save

    def dies_in_seed_1(run_dir: Path, state: dict[str, Any]) -> None:
        if run_dir.name == "seed-1" and state["next_round"] == 2:
            raise KeyboardInterrupt
        real(run_dir, state)

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "save", dies_in_seed_1)
        assert main(args) == 130
    first, killed = out / "jfat" / "seed-0", out / "jfat" / "seed-1"
    kept = {p.name: (os.stat(p).st_ino, p.read_bytes()) for p in first.iterdir() if p.is_file()}
    assert (first / "summary.json").exists() and not (killed / "summary.json").exists()
    capsys.readouterr()
    calls = []
    real_run = loop.run

    def run(exp: Any, out: Path, progress: bool, resume: bool) -> dict[str, Any]:
        calls.append((out.name, resume))
        return real_run(exp, out, progress=progress, resume=resume)

    monkeypatch.setattr(loop, "run", run)
    assert main(args) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("jfat seed 0: finished, kept")
    assert calls == [("seed-1", True)]  # seed 0 not run again, seed 1 resumed from its checkpoint
    assert {p.name: (os.stat(p).st_ino, p.read_bytes()) for p in first.iterdir() if p.is_file()} == kept
    assert [r["round"] for r in _read(killed / "metrics.csv")] == ["0", "1", "2"]


@pytest.mark.parametrize(("extra", "key"), [
    (["--seeds", "a,b"], "--seeds"),
    (["--seeds", "0,0"], "--seeds"),
    (["--seeds=-1,2"], "--seeds"),
    (["--seeds", "0"], "--seeds"),
    (["--seeds", "100000000000"], "--seeds"),  # refused before it is counted out
    (["--seeds", "2", "--reference", "fedavg_at"], "--reference"),
    (["--seeds", "2", "--set", "seed=4"], "seed"),
    (["--set", "compare.seeds=[-1]"], "compare.seeds"),
    (["--set", "compare.seeds=[1, 1]"], "compare.seeds"),
])
def test_bad_seeds_or_reference_stop_before_any_run_with_one_line(tmp_path, capsys, extra, key):
    out = tmp_path / "cmp"
    assert main(["compare", str(SCENARIO), "--methods", "jfat", *SMALL, *extra, "--out", str(out),
                 "--dry-run", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{key}:" in err
    assert not out.exists()


@pytest.mark.slow
def test_a_run_an_earlier_edgefl_wrote_without_the_seeds_key_is_kept(tmp_path, capsys):
    """Its scenario.toml lacks `seeds = []` under [compare] (the key came later): the same values,
    so the run is kept, not refused as another scenario's."""
    out = tmp_path / "cmp"
    args = ["compare", str(SCENARIO), "--methods", "jfat", *SMALL, "--out", str(out), "--dry-run", "--quiet"]
    assert main(args) == 0
    saved = out / "jfat" / "scenario.toml"
    saved.write_text(saved.read_text().replace("seeds = []\n", ""))
    capsys.readouterr()
    assert main(args) == 0
    assert capsys.readouterr().out.startswith("jfat: finished, kept")


def test_the_report_pairs_the_seeds_as_the_comparison_did(tmp_path, capsys):
    """A comparison paired against FedProphet with bootstrap intervals: the report's paired
    differences are differences.csv's, not jFAT's with t intervals (its default)."""
    out = tmp_path / "cmp"
    assert main(["compare", str(SCENARIO), "--methods", "jfat,fedprophet", *SMALL, "--seeds", "0,1",
                 "--reference", "fedprophet", "--interval", "bootstrap", "--out", str(out), "--dry-run",
                 "--quiet"]) == 0
    assert main(["report", str(out)]) == 0
    written = {d["figure"]: d for d in _read(out / "differences.csv")}["sim_time_s"]
    estimate, low, high = (float(written[k]) for k in ("estimate", "low", "high"))
    page = (out / "report.html").read_text()
    assert "Paired differences against fedprophet over the seeds both ran, 95 % percentile bootstrap" in page
    cells = [f"<td>{c}</td>" for c in ("jfat", "fedprophet", "simulated time", f"{estimate:.2f}x",
                                        f"[{low:.2f}, {high:.2f}]", "2 of 2")]
    assert re.search(r"<tr>" + "".join(cells).replace("[", r"\[").replace("]", r"\]") + "</tr>", page)
