"""The comparison table and the figures from tiny hand-written run directories; `edgefl plot`."""

from __future__ import annotations

import csv
import math
import re
from collections.abc import Callable
from pathlib import Path

import matplotlib.pyplot as plt
import pytest
from matplotlib.figure import Figure
from support import JFAT_CLIENTS, PROPHET_CLIENTS, one_error_line, write_run

from edgefl.cli import main
from edgefl.errors import EdgeflError
from edgefl.experiment import CLIENTS
from edgefl.report.compare import COLUMNS, PARTS, breakdown, compare_table, load_run, write_comparison
from edgefl.report.figures import make_figures
from edgefl.report.palette import PHASE_COLOURS, PHASE_LABELS
from edgefl.report.seeds import seed_rows
from edgefl.rundir import MARKER

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    """jFAT (2 rounds, 250 s), FedProphet (3 rounds, 125 s, eps and modules) and a dry SFAT run (50 s)."""
    jfat = write_run(tmp_path / "jfat-run", "jfat", [
        {"round": 0, "sim_time_s": 100, "server_s": 0, "clean_acc": 0.5, "adv_acc": 0.2},
        {"round": 1, "sim_time_s": 250, "server_s": 10, "clean_acc": 0.7, "adv_acc": 0.45}], JFAT_CLIENTS)
    prophet = write_run(tmp_path / "fp-run", "fedprophet", [
        {"round": 0, "sim_time_s": 40, "server_s": 0, "module": 1, "eps": 0.03},
        {"round": 1, "sim_time_s": 80, "server_s": 0, "clean_acc": 0.6, "adv_acc": 0.41, "module": 1,
         "eps": 0.03},
        {"round": 2, "sim_time_s": 125, "server_s": 5, "clean_acc": 0.65, "adv_acc": 0.5, "module": 2,
         "eps": 1.2}], PROPHET_CLIENTS)
    dry = write_run(tmp_path / "dry-run", "sfat", [{"round": 0, "sim_time_s": 50, "server_s": 0}],
                    [(0, 2e6, 1e6, 0, 0, 50, 0, 0)])
    return [jfat, prophet, dry]


def test_breakdown_by_hand_adds_up_to_the_simulated_time(runs: list[Path]) -> None:
    parts = breakdown(load_run(runs[0]))
    # means over each round's two clients, summed over the two rounds:
    # compute (80+38)/2 + (100+56)/2 = 137; data access (9+1)/2 + (18+2)/2 = 15;
    # comm (1+10+1+0)/2 + (2+20+2+0)/2 = 18; wait (0+60)/2 + (0+80)/2 = 70; server 0 + 10 = 10
    assert parts == pytest.approx({"compute": 137, "data_access": 15, "comm": 18, "wait": 70, "server": 10})
    for run in runs:
        last = float(load_run(run).metrics[-1]["sim_time_s"])
        assert math.isclose(sum(breakdown(load_run(run)).values()), last)


def test_a_client_stopped_early_counts_its_phases_up_to_where_it_stopped(tmp_path: Path) -> None:
    """One deadline round of 100 s. The completed client: 1 + 9 + 50 + 10 s, then waits 30. The late one
    planned 2 + 8 + 200 + 5 s and was stopped at the deadline: download 2, data access 8, compute 90,
    no upload, no wait. Means: compute (50 + 90) / 2 = 70, data access (9 + 8) / 2 = 8.5, comm
    (11 + 2) / 2 = 6.5, wait (30 + 0) / 2 = 15."""
    run = write_run(tmp_path / "late", "jfat", [{"round": 0, "sim_time_s": 100, "round_time_s": 100,
                                                 "server_s": 0}], [(0, 1e6, 1e6, 1, 9, 50, 10, 30)])
    rows = list(csv.DictReader((run / "clients.csv").open()))
    rows[0].update(finish_s="70", status="completed")
    rows.append({**rows[0], "client": "1", "download_s": "2", "data_access_s": "8", "compute_s": "200",
                 "upload_s": "5", "wait_s": "0", "finish_s": "100", "status": "late"})
    with open(run / "clients.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, [*CLIENTS, "status"])
        writer.writeheader()
        writer.writerows(rows)
    assert breakdown(load_run(run)) == pytest.approx(
        {"compute": 70, "data_access": 8.5, "comm": 6.5, "wait": 15, "server": 0})


@pytest.mark.parametrize("server", [0, 5])
def test_an_async_breakdown_is_the_mean_slots_from_the_events(tmp_path: Path, server: int) -> None:
    """Two slots over 12 s. Client 0: download 0-1, data access 1-2, compute 2-10, upload 10-11; client
    1: download 0-1, compute 1-5, upload 5-6. Per slot: compute (8 + 4) / 2 = 6, data access 1 / 2,
    comm (2 + 2) / 2 = 2, wait 12 - 8.5 = 3.5. A server aggregating for 5 s works beside the slots:
    their wait stays 3.5 s (not 3.5 - 5)."""
    run = write_run(tmp_path / "async", "jfat", [{"round": 0, "sim_time_s": 12, "server_s": server}],
                    [(0, 1e6, 1e6, 1, 1, 8, 1, 0), (0, 1e6, 1e6, 1, 0, 4, 1, 0)])
    with open(run / "scenario.toml", "a") as f:
        f.write('\n[round]\nmode = "async"\nconcurrency = 2\n')
    spans = [(0, "download", 0, 1), (0, "data_access", 1, 2), (0, "compute", 2, 10), (0, "upload", 10, 11),
             (1, "download", 0, 1), (1, "data_access", 1, 1), (1, "compute", 1, 5), (1, "upload", 5, 6)]
    (run / "events.csv").write_text("round,client,phase,start_s,end_s\n"
                                    + "".join(f"0,{k},{p},{a},{b}\n" for k, p, a, b in spans))
    assert breakdown(load_run(run)) == pytest.approx(
        {"compute": 6, "data_access": 0.5, "comm": 2, "wait": 3.5, "server": server})


def test_table_by_hand(runs: list[Path]) -> None:
    jfat, prophet, dry = compare_table(runs, target=0.4)
    assert list(jfat) == COLUMNS
    # jFAT: last evaluation 0.7 / 0.45; first adv >= 0.4 at round 1 (250 s); MemReq 2, 2, 2, 1.5 MB:
    # least 1.5, peak 2; available 1, 4, 3, 1.5 MB -> median (1.5 + 3) / 2 = 2.25 MB; fits on the
    # clients with 4, 3 and 1.5 MB: 3 / 4;
    # shares of 250 s: compute 137 -> 0.548, data 15 -> 0.06, comm 18 -> 0.072, wait 70 -> 0.28
    assert jfat == pytest.approx({
        "method": "jfat", "run": "jfat-run", "clean_acc": 0.7, "adv_acc": 0.45, "sim_time_s": 250,
        "time_to_target_s": 250, "speedup_vs_jfat": 1.0, "speedup_to_target_vs_jfat": 1.0,
        "mem_need_mb": 1.5, "mem_peak_mb": 2.0, "fleet_mem_median_mb": 2.25, "fits_share": 0.75,
        "data_access_share": 0.06,
        "compute_share": 0.548, "comm_share": 0.072, "wait_share": 0.28,
        "energy_per_device_j": None, "energy_to_target_per_device_j": None})  # no energy_j logged
    # FedProphet: round 0 not evaluated, adv 0.41 >= 0.4 at round 1 (80 s); 250 / 125 = 2.0 to finish,
    # 250 / 80 = 3.125 to the target; compute 3 x 36 = 108 of 125 s = 0.864, data 3 / 125 = 0.024,
    # comm 3 x 3 = 9 -> 0.072, no waiting
    assert prophet == pytest.approx({
        "method": "fedprophet", "run": "fp-run", "clean_acc": 0.65, "adv_acc": 0.5, "sim_time_s": 125,
        "time_to_target_s": 80, "speedup_vs_jfat": 2.0, "speedup_to_target_vs_jfat": 3.125,
        "mem_need_mb": 1.0, "mem_peak_mb": 1.0, "fleet_mem_median_mb": 2.0, "fits_share": 1.0,
        "data_access_share": 0.024,
        "compute_share": 0.864, "comm_share": 0.072, "wait_share": 0.0,
        "energy_per_device_j": None, "energy_to_target_per_device_j": None})
    # the dry run: no accuracy, so no time to target; 250 / 50 = 5.0 to finish
    assert (dry["clean_acc"], dry["adv_acc"], dry["time_to_target_s"]) == (None, None, None)
    assert (dry["speedup_vs_jfat"], dry["speedup_to_target_vs_jfat"]) == (5.0, None)


def test_joules_per_device_by_hand(runs: list[Path]) -> None:
    """jFAT's four client-rounds (clients 0, 1, 0, 1) spent 10, 20, 30 and 40 J: 100 J over 2 devices
    is 50 J each; adv 0.2 is first reached at round 0: (10 + 20) / 2 = 15 J each."""
    path = runs[0] / "clients.csv"
    rows = list(csv.DictReader(path.open()))
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, [*CLIENTS, "energy_j"])
        writer.writeheader()
        writer.writerows({**r, "energy_j": 10.0 * (i + 1)} for i, r in enumerate(rows))
    jfat, prophet, _ = compare_table(runs, target=0.2)
    assert (jfat["energy_per_device_j"], jfat["energy_to_target_per_device_j"]) == (50.0, 15.0)
    assert prophet["energy_per_device_j"] is None
    assert make_figures(runs, path.parent.parent / "figs", target=0.2)  # the breakdown's energy panel
    # client 1 sat both its rounds out for its battery (0 J): 10 + 30 J over client 0 alone
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, [*CLIENTS, "energy_j", "battery_dropped"])
        writer.writeheader()
        writer.writerows({**r, "energy_j": 0.0 if i % 2 else 10.0 * (i + 1), "battery_dropped": i % 2}
                         for i, r in enumerate(rows))
    jfat, _, _ = compare_table(runs, target=0.2)
    assert (jfat["energy_per_device_j"], jfat["energy_to_target_per_device_j"]) == (40.0, 10.0)


def test_time_to_target_never_reached_and_no_jfat(runs: list[Path]) -> None:
    # 0.46 is above jFAT's 0.45, but FedProphet's 0.5 at 125 s reaches it
    jfat, prophet, _ = compare_table(runs, target=0.46)
    assert jfat["time_to_target_s"] is None and prophet["time_to_target_s"] == 125
    assert prophet["speedup_to_target_vs_jfat"] is None
    (alone,) = compare_table(runs[1:2], target=0.4)
    assert alone["speedup_vs_jfat"] is None and alone["speedup_to_target_vs_jfat"] is None


def test_a_target_in_percent_is_refused(runs: list[Path]) -> None:
    with pytest.raises(EdgeflError, match="fraction"):
        compare_table(runs, target=40)


def test_write_comparison(runs: list[Path], tmp_path: Path) -> None:
    rows = compare_table(runs, target=0.4)
    md, table = write_comparison(rows, tmp_path / "out", 0.4)
    lines = md.read_text().splitlines()
    assert lines[0] == f"| {' | '.join(COLUMNS)} |"
    assert lines[2].startswith("| jfat | jfat-run | 0.7000 | 0.4500 | 250.0 | 250.0 | 1.00 | 1.00 |")
    assert lines[4].startswith("| sfat | dry-run |  |  | 50.0 |  | 5.00 |  |")
    assert lines[-1] == "Target: adversarial accuracy >= 0.4; speed-ups against jFAT run `jfat-run`."
    with open(table, newline="") as f:
        back = list(csv.DictReader(f))
    assert [r["method"] for r in back] == ["jfat", "fedprophet", "sfat"]
    assert float(back[1]["speedup_to_target_vs_jfat"]) == 3.125
    assert back[2]["adv_acc"] == "" and back[2]["time_to_target_s"] == ""


def test_plot_makes_every_figure_as_png_and_svg(runs: list[Path],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", *map(str, runs), "--target", "0.4"]) == 0
    out = runs[0] / "figures"
    names = ["accuracy", "speedup", "breakdown", "memory", "epsilon"]
    expected = [out / f"{n}.{ext}" for n in names for ext in ("png", "svg")]
    assert capsys.readouterr().out.split() == [str(p) for p in expected]
    for path in expected:
        data = path.read_bytes()
        assert len(data) > 1000
        assert data.startswith(PNG_MAGIC) if path.suffix == ".png" else b"<svg" in data[:2000]


def test_only_the_figures_that_apply(runs: list[Path], tmp_path: Path) -> None:
    """A dry run alone has no accuracy, no jFAT to compare with and no epsilon."""
    written = make_figures(runs[2:], tmp_path / "figs")
    assert [p.name for p in written] == ["breakdown.png", "breakdown.svg", "memory.png", "memory.svg"]


def test_a_new_plot_into_a_folder_drops_the_figures_it_did_not_draw(runs: list[Path], tmp_path: Path) -> None:
    """All three runs, then the dry run alone into the same folder: the earlier accuracy, speed-up
    and epsilon figures (and an earlier plot's per-run timeline) go; a file of the user's stays."""
    out = tmp_path / "figs"
    make_figures(runs, out)
    assert (out / "speedup.png").is_file()
    (out / "timeline-jfat-run.svg").write_text("<svg/>")  # as a plot with --timeline-clients drew it
    (out / "notes.txt").write_text("mine\n")
    written = make_figures(runs[2:], out)
    assert sorted(p.name for p in out.iterdir()) == sorted([MARKER, "notes.txt", *(p.name for p in written)])
    assert [p.name for p in written] == ["breakdown.png", "breakdown.svg", "memory.png", "memory.svg"]


def test_fifteen_methods_plot_apart_without_layout_warnings(runs: list[Path], tmp_path: Path) -> None:
    """A comparison of every method: each accuracy curve has its own colour and line style, and
    the figures are laid out without matplotlib's warnings (constrained layout, legends included)."""
    import shutil
    import warnings

    from matplotlib.colors import to_hex
    from matplotlib.lines import Line2D

    from edgefl.report.figures import accuracy_figure, run_labels

    many = [runs[0]]
    for i in range(14):
        many.append(tmp_path / f"m{i}")
        shutil.copytree(runs[i % 2], many[-1])
    loaded = [load_run(p) for p in many]
    fig = accuracy_figure(loaded, run_labels(loaded), None)
    assert fig is not None
    curves = [line for line in fig.axes[0].get_lines() if isinstance(line, Line2D)]
    assert len({(to_hex(line.get_color()), line.get_linestyle()) for line in curves}) == len(curves) == 15
    plt.close(fig)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        make_figures(many, tmp_path / "figs")


def test_plot_refuses_a_percent_target(runs: list[Path], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plot", str(runs[0]), "--target", "40"]) == 2
    assert "--target" in capsys.readouterr().err
    assert not (runs[0] / "figures").exists()


def edit_log(file: Path, edit: Callable[[list[dict[str, str]]], list[dict[str, str]]],
             header: list[str] | None = None) -> None:
    """Rewrite a CSV log with `edit` applied to its rows (and `header` for its columns, if given)."""
    with open(file, newline="") as f:
        reader = csv.DictReader(f)
        rows, columns = list(reader), header or list(reader.fieldnames or [])
    with open(file, "w", newline="") as f:
        writer = csv.DictWriter(f, columns, extrasaction="ignore", restval="")
        writer.writeheader()
        writer.writerows(edit(rows))


def test_a_log_missing_a_column_the_report_reads_is_one_line(runs: list[Path], capsys) -> None:
    """events.csv without `phase`; clients.csv with `status` but no `finish_s`; a metrics row with an
    adversarial accuracy and no clean one; an async run of 0 slots: each one line, never a KeyError,
    ValueError or ZeroDivisionError."""
    def said(run: Path) -> str:
        assert main(["plot", str(run), "--out", str(run / "figs")]) == 2
        return one_error_line(capsys.readouterr().err)

    jfat, prophet, dry = runs
    (jfat / "events.csv").write_text("round,client,start_s,end_s\n0,0,0.0,1.0\n")
    assert said(jfat).endswith("events.csv: phase: missing from the header: not a log edgefl wrote, or an "
                               "older edgefl's; run it again")
    edit_log(prophet / "clients.csv", lambda rows: rows, [*(c for c in CLIENTS if c != "finish_s"), "status"])
    assert ": finish_s: missing from the header" in said(prophet)
    edit_log(dry / "metrics.csv", lambda rows: [{**r, "adv_acc": "0.3"} for r in rows])
    assert said(dry).endswith("metrics.csv: line 2: gives one of clean_acc and adv_acc without the other; "
                              "give a run directory made by edgefl run")
    (dry / "metrics.csv").write_text((dry / "metrics.csv").read_text().replace(",0.3", ","))
    with open(dry / "scenario.toml", "a") as f:
        f.write('\n[round]\nmode = "async"\nconcurrency = 0\n')
    (dry / "events.csv").write_text("round,client,phase,start_s,end_s\n0,0,compute,0.0,1.0\n")
    assert said(dry).endswith("scenario.toml: round.concurrency: not a positive count; give a run directory "
                              "made by edgefl run")


def test_plot_of_no_folder_says_so(tmp_path: Path, capsys) -> None:
    assert main(["plot", str(tmp_path / "nosuch")]) == 2
    assert capsys.readouterr().err == (f"edgefl: error: {tmp_path / 'nosuch'}: folder: no such folder; "
                                       "give a run directory made by edgefl run\n")


def test_plot_of_a_comparison_folder_names_its_runs(runs: list[Path], tmp_path: Path, capsys) -> None:
    from edgefl.rundir import write_marker

    folder = tmp_path / "cmp"
    folder.mkdir()
    write_marker(folder, "compare")
    for run in runs[:2]:
        run.rename(folder / run.name)
        write_marker(folder / run.name, "run")
    assert main(["plot", str(folder)]) == 2
    assert capsys.readouterr().err == (
        f"edgefl: error: {folder}: folder: is a comparison, not a run; plot its runs ({folder / 'fp-run'} "
        f"{folder / 'jfat-run'}); edgefl compare drew their figures into its figures/ already\n")


def test_a_run_whose_metrics_lack_a_round_of_its_clients_is_one_line(runs: list[Path], capsys) -> None:
    """A log cut by hand or by a full disk: clients.csv holds round 1, metrics.csv only round 0."""
    metrics = runs[0] / "metrics.csv"
    metrics.write_text("\n".join(metrics.read_text().splitlines()[:2]) + "\n")
    assert main(["plot", str(runs[0]), "--out", str(runs[0] / "figs")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "clients.csv has rows of round 1, which metrics.csv lacks" in err
    assert not (runs[0] / "figs").exists()
    finished = (runs[0] / "summary.json").exists()  # then --resume would refuse it: run it again
    assert ("edgefl run --overwrite" if finished else "edgefl run --resume") in err


def test_a_run_from_before_the_flops_column_is_one_line(runs: list[Path], capsys) -> None:
    clients = runs[0] / "clients.csv"
    lines = clients.read_text().splitlines()
    header = lines[0].split(",")
    i = header.index("flops")
    clients.write_text("\n".join(",".join(c for j, c in enumerate(r.split(",")) if j != i) for r in lines))
    assert main(["plot", str(runs[0]), "--out", str(runs[0] / "figs")]) == 2
    assert "flops" in capsys.readouterr().err


def test_a_refused_figures_folder_leaves_no_figure_open(runs: list[Path], tmp_path: Path) -> None:
    out = tmp_path / "figures"
    out.mkdir()
    (out / "thesis.tex").write_text("chapter 1\n")  # not edgefl's: refused before anything is written
    before = set(plt.get_fignums())
    with pytest.raises(EdgeflError):
        make_figures(runs, out, timeline_clients=2)
    assert set(plt.get_fignums()) == before
    assert [p.name for p in out.iterdir()] == ["thesis.tex"]


def test_runs_of_different_set_ups_are_plotted_with_a_warning(runs: list[Path], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The fixture's runs share their set-up, as a comparison's do: no warning. A run on another
    fleet beside them is drawn too, with one line naming what differs."""
    from edgefl.cli import main

    assert main(["plot", *map(str, runs), "--out", str(tmp_path / "a"), "--timeline-clients", "0"]) == 0
    assert capsys.readouterr().err == ""  # (the runs log no events: a timeline would be warned about)
    other = write_run(tmp_path / "other", "jfat", [{"round": 0, "sim_time_s": 10, "round_time_s": 10,
                                                   "server_s": 0}], [(0, 1e6, 1e6, 1, 1, 1, 1, 0)])
    text = (other / "scenario.toml").read_text()
    (other / "scenario.toml").write_text(text.replace('pool = "edge"', 'pool = "tiny"'))
    assert main(["plot", str(runs[0]), str(other), "--out", str(tmp_path / "b"),
                 "--timeline-clients", "0"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("edgefl: warning: the runs differ in fleet ") and err.count("\n") == 1


def _phase_colours(fig: Figure) -> list[tuple[str, str]]:
    """(phase, colour) of every bar and legend entry a phase names: the breakdown's bar containers
    (labelled PHASE_LABELS[phase]), the timeline's bars (gid `client:phase`) and every legend entry
    whose text is a phase's label."""
    from matplotlib.colors import to_hex

    by_label = {label: phase for phase, label in PHASE_LABELS.items()}
    found = []
    for ax in fig.axes:
        found += [(by_label[c.get_label()], to_hex(bar.get_facecolor())) for c in ax.containers
                  if c.get_label() in by_label for bar in c]
        found += [(str(c.get_gid()).split(":")[1], to_hex(c.get_facecolor()[0])) for c in ax.collections
                  if c.get_gid()]
        legend = ax.get_legend()
        if legend is not None:
            found += [(by_label[t.get_text()], to_hex(h.get_facecolor())) for h, t in
                      zip(legend.legend_handles, legend.get_texts(), strict=True) if t.get_text() in by_label]
    return found


def test_every_figure_takes_its_phase_colours_from_the_one_mapping(runs: list[Path], tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Every phase given a colour no default palette has: every figure `edgefl plot` draws (the
    timeline of a run with an events log among them), those of a comparison over seeds and the HTML
    page's breakdown table then show exactly those colours, compute in the same one everywhere."""
    from edgefl.report import figures
    from edgefl.report.html import report_page

    odd = {phase: f"#{i + 1:02x}{2 * i + 3:02x}{3 * i + 5:02x}" for i, phase in enumerate(PHASE_COLOURS)}
    for phase, colour in odd.items():
        monkeypatch.setitem(PHASE_COLOURS, phase, colour)
    with open(runs[0] / "events.csv", "w") as f:
        f.write("round,client,phase,start_s,end_s\n0,0,download,0,1\n0,0,data_access,1,2\n"
                "0,0,compute,2,90\n0,0,upload,90,100\n0,1,compute,0,40\n0,1,wait,40,100\n")
    drawn: list[Figure] = []
    monkeypatch.setattr(figures, "save_figures",
                        lambda figs, out: drawn.extend(f for f in figs.values() if f is not None) or [])
    figures.make_figures(runs, tmp_path / "a", timeline_clients=2)
    loaded = [load_run(p) for p in runs[:2]]
    figures.make_seed_figures({r.method: [r] for r in loaded}, seed_rows({0: loaded}, None), tmp_path / "b",
                              None)
    seen = [pair for fig in drawn for pair in _phase_colours(fig)]
    for fig in drawn:
        plt.close(fig)
    assert {phase for phase, _ in seen} == set(PHASE_COLOURS)  # each phase is drawn somewhere
    assert all(colour == odd[phase] for phase, colour in seen), seen
    page = report_page(loaded, None, "t")
    swatch = r'<span class="swatch" style="background:(#[0-9a-f]{6})"></span>([^<]*) \(h\)'
    swatches = re.findall(swatch, page)
    labels = {label: phase for phase, label in PHASE_LABELS.items()}
    assert sorted(labels[label] for _, label in swatches) == sorted([*PARTS, "server"])
    assert all(colour == odd[labels[label]] for colour, label in swatches)
