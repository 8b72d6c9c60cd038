"""`edgefl plot`'s per-client timeline (edgefl.report.timeline): one bar per events.csv span, coloured
by phase, status markers when clients.csv has a `status` column, PNG and SVG."""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import numpy as np
import pytest
from matplotlib.collections import Collection
from matplotlib.colors import to_rgba

from edgefl.cli import main
from edgefl.experiment import CLIENTS
from edgefl.report.palette import PHASE_COLOURS
from edgefl.report.timeline import timeline_figure, timeline_names

ROOT = Path(__file__).resolve().parents[1]
# round, client, phase, start, end: client 3's round 0 (it waits for client 5), client 5's round 0,
# client 3's round 1, and client 9 (not among the first two clients)
EVENTS = [(0, 3, "download", 0.0, 1.0), (0, 3, "compute", 1.0, 4.0), (0, 3, "upload", 4.0, 4.5),
          (0, 3, "wait", 4.5, 7.0), (0, 5, "download", 0.0, 2.0), (0, 5, "data_access", 2.0, 2.5),
          (0, 5, "compute", 2.5, 6.0), (0, 5, "upload", 6.0, 7.0), (1, 3, "download", 8.0, 8.5),
          (1, 3, "compute", 8.5, 12.0), (0, 9, "compute", 0.0, 5.0)]


def write(run: Path, status: bool) -> Path:
    run.mkdir()
    with open(run / "events.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["round", "client", "phase", "start_s", "end_s"])
        writer.writerows(EVENTS)
    with open(run / "clients.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, CLIENTS + (["status"] if status else []), restval="")
        writer.writeheader()
        for t, k, end, state in [(0, 3, 4.5, "completed"), (0, 5, 7.0, "late"), (1, 3, 12.0, "dropped")]:
            row = {"round": t, "client": k, "finish_s": end}
            writer.writerow({**row, "status": state} if status else row)
    return run


def extents(c: Collection) -> list[tuple[float, float]]:
    """Each bar's (start, end) on the x axis."""
    return sorted((float(p.vertices[:, 0].min()), float(p.vertices[:, 0].max())) for p in c.get_paths())


def test_bars_span_the_events_of_the_first_clients(tmp_path: Path) -> None:
    fig = timeline_figure(write(tmp_path / "run", status=False), clients=2)
    assert fig is not None
    ax = fig.axes[0]
    bars = {c.get_gid(): c for c in ax.collections if c.get_gid()}
    expected: dict[str, list[tuple[float, float]]] = {}
    for _, k, phase, a, b in EVENTS:
        if k in (3, 5):
            expected.setdefault(f"{k}:{phase}", []).append((a, b))
    assert sorted(bars) == sorted(expected)  # client 9 is not among the first two
    for gid, spans in expected.items():
        assert extents(bars[gid]) == sorted(spans), gid
        colour = bars[gid].get_facecolor()[0]
        assert np.allclose(colour, to_rgba(PHASE_COLOURS[gid.split(":")[1]]))
    assert [t.get_text() for t in ax.get_yticklabels()] == ["client 3", "client 5"]
    assert not [c for c in ax.collections if not c.get_gid()]  # no status column: no markers


def test_status_markers_sit_at_each_client_rounds_finish(tmp_path: Path) -> None:
    fig = timeline_figure(write(tmp_path / "run", status=True), clients=2)
    assert fig is not None
    marks = [c for c in fig.axes[0].collections if not c.get_gid()]
    points = sorted(tuple(map(float, xy)) for c in marks for xy in c.get_offsets())
    assert points == [(4.5, 0.0), (7.0, 1.0), (12.0, 0.0)]
    assert {t.get_text() for t in fig.axes[0].get_legend().get_texts()} >= {"completed", "late", "dropped"}


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A dry run of the quickstart, 2 rounds (a test copies it before changing it)."""
    run = tmp_path_factory.mktemp("dry") / "run"
    quickstart = str(ROOT / "scenarios" / "quickstart.toml")
    assert main(["run", quickstart, "--dry-run", "--quiet", "--out", str(run), "--set", "rounds=2"]) == 0
    return run


def test_plot_writes_the_timeline_of_a_run(dry_run: Path, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    shutil.copytree(dry_run, run)
    assert main(["plot", str(run), "--timeline-clients", "4"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    written = out.split()
    for ext in ("png", "svg"):
        path = run / "figures" / f"timeline.{ext}"
        assert str(path) in written and path.stat().st_size > 1000
    assert main(["plot", str(run), "--timeline-clients", "-1"]) == 2
    capsys.readouterr()
    # a row per client: 100,000 rows once ran for minutes with no answer (issue 39)
    assert main(["plot", str(run), "--timeline-clients", "100000"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--timeline-clients: 100000: must be 0 (no timeline) or a client count " \
        "up to 500" in err
    assert main(["plot", str(run), "--timeline-clients", "500"]) == 0


def test_timelines_of_runs_whose_folders_share_a_name_do_not_overwrite_each_other() -> None:
    assert timeline_names([Path("a/jfat")]) == ["timeline"]
    assert timeline_names([Path("a/jfat"), Path("b/jfat"), Path("c/fed prophet")]) == [
        "timeline-jfat-1", "timeline-jfat-2", "timeline-fed_prophet"]


def test_plot_of_a_run_without_its_events_log_warns_and_draws_the_other_figures(
        dry_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """events.parquet and events.csv deleted: one warning line naming them, exit 0, every other
    figure drawn, no timeline; with --timeline-clients 0 no timeline is asked for, so no warning."""
    run = tmp_path / "run"
    shutil.copytree(dry_run, run)
    for name in ("events.parquet", "events.csv"):
        (run / name).unlink(missing_ok=True)
    assert main(["plot", str(run)]) == 0
    out, err = capsys.readouterr()
    assert err == (f"edgefl: warning: {run}: no events log (events.parquet or events.csv): its timeline is "
                   "skipped, the other figures are drawn\n")
    assert sorted(Path(p).name for p in out.split()) == ["breakdown.png", "breakdown.svg", "memory.png",
                                                        "memory.svg"]
    assert not (run / "figures" / "timeline.png").exists()
    assert main(["plot", str(run), "--timeline-clients", "0"]) == 0
    assert capsys.readouterr().err == ""
