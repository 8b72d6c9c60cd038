"""A run's per-client timeline: a Gantt chart of the first clients of the fleet, one row per client,
one bar per span of events.csv (download, data access, compute, upload, wait) coloured by phase, and,
when clients.csv has a `status` column (completed, dropped, late, offline), a marker at the end of
each client-round coloured by its status."""

from __future__ import annotations

import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from edgefl.report.compare import read_log
from edgefl.report.palette import PHASE_COLOURS, PHASE_LABELS
from edgefl.runlog import read_rows
from edgefl.sim.engine import PHASES

STATUS_MARKS = {"completed": ("C2", "o"), "dropped": ("C3", "x"), "late": ("C1", "v"),
                "offline": ("0.3", "s")}
Span = tuple[float, float]  # start, end (simulated seconds)
MAX_CLIENTS = 500  # rows of one chart: drawing time grows with the rows, and 100,000 never ended


def timeline_spans(run: Path, clients: int) -> dict[int, dict[str, list[Span]]]:
    """The spans of the `clients` lowest-numbered clients in the run's events log, by client and phase
    (none for a run without one: written by hand, or by an edgefl before events were logged)."""
    if not has_events(run):
        return {}
    rows = read_log(run, "events.csv")
    shown = sorted({int(r["client"]) for r in rows})[:clients]
    spans: dict[int, dict[str, list[Span]]] = {k: {} for k in shown}
    for r in rows:
        k = int(r["client"])
        if k in spans:
            spans[k].setdefault(r["phase"], []).append((float(r["start_s"]), float(r["end_s"])))
    return spans


def has_events(run: Path) -> bool:
    """Whether the run folder holds an events log (events.csv or events.parquet)."""
    return any((run / f"events.{ext}").is_file() for ext in ("csv", "parquet"))


def statuses(run: Path, spans: dict[int, dict[str, list[Span]]]) -> dict[str, list[tuple[float, int]]]:
    """(end of the client-round's last span, row) of the shown clients' rounds, by status; empty when
    clients.csv has no `status` column."""
    header, rows = read_rows(run, "clients")
    if "status" not in header:
        return {}
    row_of = {k: i for i, k in enumerate(spans)}
    marks: dict[str, list[tuple[float, int]]] = {}
    for r in rows:
        k = int(r["client"])
        if k in row_of and r.get("finish_s"):
            marks.setdefault(r["status"], []).append((float(r["finish_s"]), row_of[k]))
    return marks


def timeline_figure(run: Path, clients: int) -> Figure | None:
    """The Gantt chart of the run's first `clients` clients (None if the run logged no events)."""
    spans = timeline_spans(run, clients)
    if not spans:
        return None
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.35 * len(spans)))
    for row, (client, phases) in enumerate(spans.items()):
        for phase, bars in phases.items():
            drawn = ax.broken_barh([(a, b - a) for a, b in bars], (row - 0.4, 0.8),
                                   facecolors=PHASE_COLOURS.get(phase, "k"))
            drawn.set_gid(f"{client}:{phase}")
    handles: list[Patch | Line2D] = [Patch(color=PHASE_COLOURS[p], label=PHASE_LABELS[p])
                                     for p in [*PHASES, "wait"]]
    for status, points in statuses(run, spans).items():
        colour, marker = STATUS_MARKS.get(status, ("k", "d"))
        ax.scatter([p[0] for p in points], [p[1] for p in points], color=colour, marker=marker, s=18,
                   zorder=3)
        handles.append(Line2D([], [], color=colour, marker=marker, ls="", label=status))
    ax.set_yticks(range(len(spans)), [f"client {k}" for k in spans])
    ax.invert_yaxis()
    ax.set(xlabel="simulated time (s)", title=f"Per-client timeline ({run.name}, first {len(spans)} clients)")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(handles=handles, fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    return fig


def timeline_names(runs: list[Path]) -> list[str]:
    """`timeline` for one run; for several, `timeline-<run folder>` (safe characters only), and
    `-<position>` (from 1) after the name of a folder that two runs share."""
    if len(runs) == 1:
        return ["timeline"]
    names = [re.sub(r"[^A-Za-z0-9_.-]", "_", run.name) for run in runs]
    return [f"timeline-{n}" + (f"-{i}" if names.count(n) > 1 else "") for i, n in enumerate(names, start=1)]
