"""`edgefl report`: one self-contained HTML page from run folders or a comparison folder.

The page holds a summary per run (scenario, method, rounds, simulated time, final clean and robust
accuracy), accuracy against simulated time, where the time goes, memory, each run's per-client
timeline, energy (where runs priced it), FedProphet's perturbation (where logged) and, for several
runs, the comparison table and the speed-up over jFAT. A comparison over seeds (every run a
`seed-<s>` folder, two seeds or more) gets, under the summary, each method's mean and spread over
its seeds and the paired differences `edgefl compare --seeds` computes (edgefl.report.seeds), and its
accuracy figure draws each method's spread over its seeds. Figures are edgefl.report.figures' and
edgefl.report.timeline's, inlined as SVG data URIs; the CSS is inline; nothing is fetched to view it.
"""

from __future__ import annotations

import base64
import html
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from edgefl.errors import EdgeflError, NotARunError
from edgefl.report.compare import (
    BASELINE,
    COLUMNS,
    FORMATS,
    PARTS,
    SETUP,
    Row,
    Run,
    breakdown,
    check_target,
    differing_setup,
    energy_per_device,
    evaluated,
    load_run,
    memory,
    sim_time,
    table,
    target_line,
)
from edgefl.report.figures import (
    accuracy_figure,
    band_accuracy_figure,
    breakdown_figure,
    energy_panel,
    epsilon_figure,
    memory_figure,
    render,
    run_labels,
    seed_speedup_figure,
    speedup_figure,
)
from edgefl.report.palette import PHASE_COLOURS, PHASE_LABELS
from edgefl.report.seeds import (
    SEED_COLUMNS,
    attack_label,
    compared_pairing,
    differences,
    differences_note,
    figure_text,
    interval_text,
    printed,
    seed_rows,
    spread_note,
    spread_text,
    summary_rows,
)
from edgefl.report.timeline import timeline_figure
from edgefl.rundir import marker_kind, probe, read_marker, refuse_links, write_file

REPORT_NAME = "report.html"
GENERATOR = '<meta name="generator" content="edgefl report">'  # marks a page edgefl may replace
TIMELINE_CLIENTS = 10  # rows of each run's timeline, as `edgefl plot` draws by default
SEED_FOLDER = re.compile(r"seed-(\d+)")
CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1d2330;margin:0;
background:#f5f6f8}
header{background:#1d2330;color:#fff;padding:1.2em 2em}header h1{margin:0;font-size:1.5em}
header p{margin:.3em 0 0;color:#b8c0d0;font-size:.9em}
nav{position:sticky;top:0;background:#fff;border-bottom:1px solid #dde1e8;padding:.5em 2em;z-index:1}
nav a{margin-right:1.2em;color:#2457b5;text-decoration:none}
main{max-width:1200px;margin:0 auto;padding:1em 2em 3em}
section{background:#fff;border:1px solid #dde1e8;border-radius:6px;padding:1em 1.5em;margin:1.2em 0}
h2{margin:.2em 0 .6em;font-size:1.25em}h3{font-size:1em;margin:1em 0 .4em}
table{border-collapse:collapse;font-size:.9em;margin:.5em 0;display:block;overflow-x:auto}
th,td{border-bottom:1px solid #e6e9ee;padding:.3em .7em;text-align:left;white-space:nowrap}
th{background:#f0f2f6}td.n{text-align:right;font-variant-numeric:tabular-nums}
figure{margin:.8em 0}figure img{max-width:100%;height:auto}
figcaption,.note{color:#5b6475;font-size:.88em}.warn{color:#9a4b00}
.swatch{display:inline-block;width:.8em;height:.8em;border-radius:2px;margin-right:.35em;vertical-align:-.05em}
"""


def write_report(paths: list[Path], out: Path | None, target: float | None) -> Path:
    """The report of the run folders and comparison folders `paths` written to `out` (default:
    report.html in the first of them); returns the page's path."""
    check_target(target)
    runs = [load_run(p) for p in report_runs(paths)]
    out = out or paths[0] / REPORT_NAME
    check_out(out)
    write_file(out, report_page(runs, target, title=", ".join(str(p) for p in paths)))
    return out


def report_runs(paths: list[Path]) -> list[Path]:
    """The run folders to report: a run folder as given, a comparison folder's runs in its order."""
    runs: list[Path] = []
    for path in paths:
        runs.extend(compared_runs(path) if marker_kind(path) == "compare" else [path])
    return runs


def compared_runs(folder: Path) -> list[Path]:
    """A comparison folder's runs: `<method>/` (one seed) or `<method>/seed-<s>/` (several); a
    symbolic link in it is refused as `edgefl compare` refuses it (edgefl.rundir `refuse_links`)."""
    refuse_links(folder)
    found = []
    for child in _folders(folder):
        found.extend([child] if marker_kind(child) == "run" else
                     [g for g in _folders(child) if marker_kind(g) == "run"])
    if not found:
        raise NotARunError(str(folder), "folder", "is a comparison holding no run folder yet",
                           "run edgefl compare to the end first")
    return found


def _folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir())


def check_out(out: Path) -> None:
    """The page's path: a new .html file in an existing folder, or a page edgefl report wrote."""
    found = probe(out, "--out")
    if out.suffix.lower() != ".html" or found == "dir":
        raise EdgeflError(str(out), "--out", "give a file name ending in .html, e.g. report.html")
    if found == "link":
        raise EdgeflError(str(out), "--out", "is a symbolic link; give the file it points to, or another "
                          "name")
    if found == "file" and not _ours(out):
        raise EdgeflError(str(out), "--out", "is a file edgefl report did not write; choose another name")
    if found == "missing" and not out.parent.is_dir():
        raise EdgeflError(str(out), "--out", f"folder {out.parent} does not exist; create it or choose "
                          "another")


def _ours(page: Path) -> bool:
    with page.open("rb") as f:
        return GENERATOR.encode() in f.read(1024)


def report_page(runs: list[Run], target: float | None, title: str) -> str:
    """The HTML page of loaded runs (edgefl.report.compare `load_run`), titled `title`."""
    labels = run_labels(runs)
    seeds = seed_groups(runs)
    rows = seed_rows(seeds, target) if len(seeds) > 1 else []
    sections = [("summary", "Summary", summary_section(runs, labels)),
                ("seeds", "Over seeds", seeds_section(seeds, rows, target)),
                ("accuracy", "Accuracy against simulated time", accuracy_section(runs, labels, target, rows)),
                ("time", "Where the time goes", time_section(runs, labels)),
                ("memory", "Memory", memory_section(runs, labels)),
                ("timeline", "Timeline", timeline_section(runs)),
                ("energy", "Energy", energy_section(runs, labels, target)),
                ("perturbation", "Perturbation", _figure(epsilon_figure(runs, labels), "epsilon")),
                ("comparison", "Comparison", comparison_section(runs, labels, target, rows))]
    shown = [(key, name, body) for key, name, body in sections if body]
    nav = "".join(f'<a href="#{key}">{name}</a>' for key, name, _ in shown)
    body = "".join(f'<section id="{key}"><h2>{name}</h2>{part}</section>' for key, name, part in shown)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{GENERATOR}'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>edgefl report: {_e(title)}</title><style>{CSS}</style></head><body>"
            f"<header><h1>edgefl report</h1><p>{_e(title)}</p></header>"
            f"<nav>{nav}</nav><main>{body}</main></body></html>\n")


def seed_groups(runs: list[Run]) -> dict[int, list[Run]]:
    """The runs by seed, seeds in order, when every run is a `seed-<s>` folder (a comparison over
    seeds, `<method>/seed-<s>/`); else none."""
    found = [(int(m.group(1)), run) for run in runs if (m := SEED_FOLDER.fullmatch(run.name))]
    if len(found) < len(runs):
        return {}
    groups: dict[int, list[Run]] = {}
    for seed, run in sorted(found, key=lambda x: x[0]):
        groups.setdefault(seed, []).append(run)
    return groups


def _e(text: Any) -> str:
    return html.escape(str(text))


def _table(header: list[str], rows: Iterable[list[Any]], colours: list[str | None] | None = None) -> str:
    """A table; `colours`, one per column or None, puts a swatch of that colour in its header."""
    marks = [f'<span class="swatch" style="background:{c}"></span>' if c else ""
             for c in colours or [None] * len(header)]
    head = "".join(f"<th>{mark}{_e(h)}</th>" for h, mark in zip(header, marks, strict=True))
    body = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _td(cell: Any) -> str:
    """A cell, right-aligned when it is a number (or the dash of a missing one), or a mean ± sd."""
    numeric = re.fullmatch(r"–|[-+]?\d[\d.e+-]*( ± [\d.e+-]+)?( \(\d+/\d+\))?", str(cell)) is not None
    return f'<td class="n">{_e(cell)}</td>' if numeric else f"<td>{_e(cell)}</td>"


def _figure(fig: Figure | None, alt: str, caption: str = "") -> str:
    """`fig` as an inline SVG image (closed once drawn); "" for no figure."""
    if fig is None:
        return ""
    try:
        data = base64.b64encode(render(fig, "svg")).decode("ascii")
    finally:
        plt.close(fig)
    text = f"<figcaption>{_e(caption)}</figcaption>" if caption else ""
    return f'<figure><img alt="{_e(alt)}" src="data:image/svg+xml;base64,{data}">{text}</figure>'


def summary_section(runs: list[Run], labels: list[str]) -> str:
    rows = []
    for run, label in zip(runs, labels, strict=True):
        acc = evaluated(run)
        planned = run.scenario.get("rounds", "?")
        origin = (read_marker(run.path) or {}).get("origin")
        rows.append([label, str(run.path), Path(str(origin)).stem if origin else "–", run.method,
                     f"{len(run.metrics)} of {planned}", f"{sim_time(run) / 3600:.3f}",
                     _percent(acc[-1][1] if acc else None), _percent(acc[-1][2] if acc else None)])
    attack = attack_label(runs[0].scenario)
    note = "" if any(evaluated(r) for r in runs) else '<p class="note">Dry runs: no accuracies measured.</p>'
    return _table(["run", "folder", "scenario", "method", "rounds", "simulated time (h)", "clean acc (%)",
                   f"robust acc, {attack} (%)"], rows) + note


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def accuracy_section(runs: list[Run], labels: list[str], target: float | None, rows: list[Row]) -> str:
    """Accuracy against simulated time, one line per run; over seeds (`rows`, edgefl.report.seeds
    `seed_rows`, none otherwise), each method's spread over its seeds on an x axis they share."""
    if rows:
        caption = ("Each method over its seeds: thin lines the seeds, bold the mean with the min-max band "
                   "where the seeds share a span of the x axis, else the mean end point with min-max bars. "
                   "The x axis is simulated time, or the round where more methods' seeds share a span of "
                   "rounds than of simulated time (each seed's fleet runs its own clock).")
        drawn = _figure(band_accuracy_figure(_by_method(runs), target), "accuracy over seeds", caption)
    else:
        drawn = _figure(accuracy_figure(runs, labels, target), "accuracy against simulated time")
    return drawn or '<p class="note">No evaluated round (dry runs measure no accuracy).</p>'


def _by_method(runs: list[Run]) -> dict[str, list[Run]]:
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(run.method, []).append(run)
    return groups


def time_section(runs: list[Run], labels: list[str]) -> str:
    parts = [breakdown(r) for r in runs]
    names = [*PARTS, "server"]
    rows = [[label, *(f"{p[n] / 3600:.4f}" for n in names), f"{sum(p.values()) / 3600:.4f}"]
            for label, p in zip(labels, parts, strict=True)]
    return (_figure(breakdown_figure(parts, [None] * len(runs), labels), "time breakdown")
            + _table(["run", *(f"{PHASE_LABELS[n]} (h)" for n in names), "sum (h)"], rows,
                     [None, *(PHASE_COLOURS[n] for n in names), None])
            + '<p class="note">Mean client per round, simulated hours (edgefl.report.compare breakdown).</p>')


def memory_section(runs: list[Run], labels: list[str]) -> str:
    rows = []
    for run, label in zip(runs, labels, strict=True):
        need, peak, median, fits = memory(run)
        rows.append([label, f"{need:.4g}", f"{peak:.4g}", f"{median:.4g}", f"{100 * fits:.1f}"])
    return (_figure(memory_figure(runs), "fleet memory and performance")
            + _table(["run", "memory need (MB)", "peak need (MB)", "fleet median available (MB)",
                      "client-rounds that fit (%)"], rows))


def timeline_section(runs: list[Run]) -> str:
    drawn = [_figure(timeline_figure(r.path, TIMELINE_CLIENTS), f"timeline of {r.name}") for r in runs]
    missing = [r.name for r, d in zip(runs, drawn, strict=True) if not d]
    note = f'<p class="note">No events log: {_e(", ".join(missing))}.</p>' if missing else ""
    return "".join(drawn) + note


def energy_section(runs: list[Run], labels: list[str], target: float | None) -> str:
    """Joules per device, over the run and to the target; "" where no run priced energy."""
    joules = [energy_per_device(r, target) for r in runs]
    if all(j is None for j, _ in joules):
        return ""
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(runs) + 2), 4.5))
    energy_panel(ax, [j for j, _ in joules], labels)
    rows = [[label, _cell(j, "energy_per_device_j"), _cell(t, "energy_to_target_per_device_j")]
            for label, (j, t) in zip(labels, joules, strict=True)]
    return _figure(fig, "energy per device") + _table(["run", "energy per device (J)",
                                                       "to the target (J)"], rows)


def comparison_section(runs: list[Run], labels: list[str], target: float | None, rows: list[Row]) -> str:
    """Over seeds (`rows`, edgefl.report.seeds `seed_rows`): each method and seed's row, speed-ups
    against the same seed's jFAT (the spread, the speed-ups over seeds and any set-up difference are
    in `seeds_section`). Else the comparison table, the speed-up figure and any set-up the runs differ
    in; "" for one run."""
    if rows:
        return _rows_table(rows, SEED_COLUMNS) + _note(f"Speed-ups against {BASELINE} on the same seed.")
    if len(runs) < 2:
        return ""
    compared = table(runs, target)
    differ = differing_setup([r.path for r in runs])
    warn = (f'<p class="warn">The runs differ in {_e(", ".join(differ))} (their scenario.toml): '
            "set side by side, they compare different set-ups.</p>") if differ else ""
    return (_rows_table(compared, COLUMNS) + _note(target_line(compared, target).replace("`", "")) + warn
            + _figure(speedup_figure(compared, labels, target), "speed-up over jFAT"))


def seeds_section(seeds: dict[int, list[Run]], rows: list[Row], target: float | None) -> str:
    """A comparison over seeds: each method's mean +- sd over its seeds, the paired differences
    against the reference that `edgefl compare` paired with (its differences.csv; computed here by the
    same edgefl.report.seeds `differences`, over this report's target), any set-up the runs differ in
    beyond their seeds, and the mean speed-ups with +-1 sd error bars; "" below two seeds."""
    if not rows:
        return ""
    first = seeds[min(seeds)][0]
    summary, attack = summary_rows(rows), attack_label(first.scenario)
    reference, interval = compared_pairing(first.path.parent.parent, [r["method"] for r in summary])
    diffs = differences(rows, reference, interval) if reference else []
    n_seeds = max(r["n_seeds"] for r in summary)
    return (_spread_table(summary, attack) + _note(spread_note(summary[0]["seeds"], target).replace("`", ""))
            + _seed_warning(seeds) + "<h3>Paired differences</h3>"
            + _note(differences_note(reference, interval, bool(diffs)) + (":" if diffs else ""))
            + (_differences_table(diffs, attack, n_seeds) if diffs else "")
            + _figure(seed_speedup_figure(summary, target), "speed-up over jFAT, mean over seeds"))


SPREAD = [("simulated time (h)", "sim_time_s", 1 / 3600, ".4f"),
          ("to target (h)", "time_to_target_s", 1 / 3600, ".4f"),
          ("speed-up over jFAT", "speedup_vs_jfat", 1.0, ".2f"),
          ("to target", "speedup_to_target_vs_jfat", 1.0, ".2f"),
          ("clean (%)", "clean_acc", 100.0, ".1f")]  # the over-seeds table's columns; then adv_acc


def _spread_table(summary: list[Row], attack: str) -> str:
    columns = [*SPREAD, (f"{attack} (%)", "adv_acc", 100.0, ".1f")]
    cells = [[r["method"], r["n_seeds"], *(spread_text(r, figure, scale, fmt) or "–"
                                           for _, figure, scale, fmt in columns)] for r in summary]
    return _table(["method", "seeds", *(name for name, *_ in columns)], cells)


def _differences_table(diffs: list[Row], attack: str, n_seeds: int) -> str:
    cells = [[d["method"], d["reference"], label, figure_text(d, d["estimate"], True), interval_text(d),
              f"{d['n_pairs']} of {n_seeds}"] for label, d in printed(diffs, attack)]
    return _table(["method", "against", "figure", "estimate", "95 % interval", "seeds paired"], cells)


def _seed_warning(seeds: dict[int, list[Run]]) -> str:
    """One line naming what the runs of a comparison over seeds differ in beyond their seeds (a SETUP
    key of their scenario.toml, or a seed that is not its `seed-<s>` folder's); "" where nothing."""
    astray = any(run.scenario["seed"] != seed for seed, group in seeds.items() for run in group)
    paths = [run.path for group in seeds.values() for run in group]
    differ = [*(["seed (a run's is not its seed-<s> folder's)"] if astray else []),
              *differing_setup(paths, [key for key in SETUP if key != "seed"])]
    if not differ:
        return ""
    return (f'<p class="warn">The runs differ beyond their seeds, in {_e(", ".join(differ))} (their '
            "scenario.toml): the spread and the paired differences mix different set-ups.</p>")


def _rows_table(rows: list[Row], columns: list[str]) -> str:
    return _table(columns, [[_cell(r[c], c) for c in columns] for r in rows])


def _note(text: str) -> str:
    return f'<p class="note">{_e(text)}</p>'


def _cell(value: Any, column: str) -> str:
    return "–" if value is None else format(value, FORMATS.get(column, ""))
