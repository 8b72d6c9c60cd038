"""`edgefl report`: one self-contained HTML page from run folders or a comparison folder.

The page holds a summary per run (scenario, method, rounds, simulated time, final clean and robust
accuracy), accuracy against simulated time, where the time goes, memory, each run's per-client
timeline, energy (where runs priced it), FedProphet's perturbation (where logged) and, for several
runs, the comparison table and the speed-up over jFAT. Figures are edgefl.report.figures' and
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
    PART_LABELS,
    accuracy_figure,
    breakdown_figure,
    energy_panel,
    epsilon_figure,
    memory_figure,
    render,
    run_labels,
    speedup_figure,
)
from edgefl.report.seeds import SEED_COLUMNS, attack_label, seed_rows
from edgefl.report.timeline import timeline_figure
from edgefl.rundir import marker_kind, probe, read_marker, write_file

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
    """A comparison folder's runs: `<method>/` (one seed) or `<method>/seed-<s>/` (several)."""
    found = []
    for child in _folders(folder):
        found.extend([child] if marker_kind(child) == "run" else
                     [g for g in _folders(child) if marker_kind(g) == "run"])
    if not found:
        raise NotARunError(str(folder), "folder", "is a comparison holding no run folder yet",
                           "run edgefl compare to the end first")
    return found


def _folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.is_symlink())


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
    sections = [("summary", "Summary", summary_section(runs, labels)),
                ("accuracy", "Accuracy against simulated time", accuracy_section(runs, labels, target)),
                ("time", "Where the time goes", time_section(runs, labels)),
                ("memory", "Memory", memory_section(runs, labels)),
                ("timeline", "Timeline", timeline_section(runs)),
                ("energy", "Energy", energy_section(runs, labels, target)),
                ("perturbation", "Perturbation", _figure(epsilon_figure(runs, labels), "epsilon")),
                ("comparison", "Comparison", comparison_section(runs, labels, target))]
    shown = [(key, name, body) for key, name, body in sections if body]
    nav = "".join(f'<a href="#{key}">{name}</a>' for key, name, _ in shown)
    body = "".join(f'<section id="{key}"><h2>{name}</h2>{part}</section>' for key, name, part in shown)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">{GENERATOR}'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>edgefl report: {_e(title)}</title><style>{CSS}</style></head><body>"
            f"<header><h1>edgefl report</h1><p>{_e(title)}</p></header>"
            f"<nav>{nav}</nav><main>{body}</main></body></html>\n")


def _e(text: Any) -> str:
    return html.escape(str(text))


def _table(header: list[str], rows: Iterable[list[Any]]) -> str:
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(_td(c) for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _td(cell: Any) -> str:
    """A cell, right-aligned when it is a number (or the dash of a missing one)."""
    numeric = re.fullmatch(r"–|[-+]?\d[\d.e+-]*", str(cell)) is not None
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


def accuracy_section(runs: list[Run], labels: list[str], target: float | None) -> str:
    drawn = _figure(accuracy_figure(runs, labels, target), "accuracy against simulated time")
    return drawn or '<p class="note">No evaluated round (dry runs measure no accuracy).</p>'


def time_section(runs: list[Run], labels: list[str]) -> str:
    parts = [breakdown(r) for r in runs]
    names = [*PARTS, "server"]
    rows = [[label, *(f"{p[n] / 3600:.4f}" for n in names), f"{sum(p.values()) / 3600:.4f}"]
            for label, p in zip(labels, parts, strict=True)]
    return (_figure(breakdown_figure(parts, [None] * len(runs), labels), "time breakdown")
            + _table(["run", *(f"{PART_LABELS[n]} (h)" for n in names), "sum (h)"], rows)
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


def comparison_section(runs: list[Run], labels: list[str], target: float | None) -> str:
    """The comparison table (per seed, speed-ups against the same seed's jFAT, when every run is a
    `seed-<s>` folder), the speed-up figure and any set-up the runs differ in; "" for one run."""
    if len(runs) < 2:
        return ""
    seeds = [SEED_FOLDER.fullmatch(r.name) for r in runs]
    if all(seeds):
        by_seed: dict[int, list[Run]] = {}
        for run, match in zip(runs, seeds, strict=True):
            by_seed.setdefault(int(match.group(1)) if match else 0, []).append(run)
        rows, columns = seed_rows(by_seed, target), SEED_COLUMNS
        names = [f"{r['method']} seed {r['seed']}" for r in rows]
        line = f"Speed-ups against {BASELINE} on the same seed."
    else:
        rows, columns, names = table(runs, target), COLUMNS, labels
        line = target_line(rows, target).replace("`", "")
    cells = [[_cell(r[c], c) for c in columns] for r in rows]
    differ = differing_setup([r.path for r in runs])
    warn = (f'<p class="warn">The runs differ in {_e(", ".join(differ))} (their scenario.toml): '
            "set side by side, they compare different set-ups.</p>") if differ else ""
    speedup = _figure(speedup_figure(rows, names, target), "speed-up over jFAT")
    return _table(columns, cells) + f'<p class="note">{_e(line)}</p>' + warn + speedup


def _cell(value: Any, column: str) -> str:
    return "–" if value is None else format(value, FORMATS.get(column, ""))
