"""The paper's figures from run directories, each saved as PNG and SVG.

After FedProphet (Tang, Wang et al.): accuracy against simulated time and the speed-up over jFAT
(§7.3), the time breakdown per method (Fig. 3, Fig. 8; beside it joules per device, where runs
priced energy), the fleet's available memory against its performance with each method's memory
need (Fig. 7), and APA's perturbation per round with the module boundaries (Fig. 11); with
`edgefl plot`, each run's per-client timeline (edgefl.report.timeline).
"""

from __future__ import annotations

import io
import math
import statistics
import textwrap
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from edgefl.report.compare import (
    BASELINE,
    PARTS,
    Row,
    Run,
    breakdown,
    check_target,
    energy_per_device,
    evaluated,
    evaluated_rounds,
    load_run,
    memory,
    table,
)
from edgefl.report.palette import PHASE_COLOURS, PHASE_LABELS
from edgefl.report.seeds import summary_rows
from edgefl.report.stats import Band, EndPoint, spread
from edgefl.report.timeline import timeline_figure, timeline_names
from edgefl.rundir import claim, run_timeline, write_file

LINE_STYLES = ["--", ":", "-."]
MARKERS = ["o", "s", "^", "D"]


def run_style(i: int) -> dict[str, str]:
    """Run i's colour, line style and marker: the ten default colours, then the same colours with
    the next line style and marker, so that every method of a large comparison reads apart."""
    turn = i // 10
    return {"color": f"C{i % 10}", "ls": ["-", *LINE_STYLES][turn % 4], "marker": MARKERS[turn % 4]}


def make_figures(runs: list[Path], out_dir: Path, target: float | None = None,
                 timeline_clients: int = 0) -> list[Path]:
    """Every figure that applies to `runs`, as PNG and SVG in `out_dir`, with each run's per-client
    timeline of its first `timeline_clients` clients (edgefl.report.timeline; 0: none); returns the
    files written."""
    check_target(target)
    loaded = [load_run(p) for p in runs]
    labels = run_labels(loaded)
    rows = table(loaded, target)
    figures = {"accuracy": accuracy_figure(loaded, labels, target),
               "speedup": speedup_figure(rows, labels, target),
               "breakdown": breakdown_figure([breakdown(r) for r in loaded],
                                             [energy_per_device(r, None)[0] for r in loaded], labels),
               "memory": memory_figure(loaded),
               "epsilon": epsilon_figure(loaded, labels)}
    if timeline_clients:
        figures.update({name: timeline_figure(p, timeline_clients)
                        for name, p in zip(timeline_names(runs), runs, strict=True)})
    return save_figures(figures, out_dir)


def make_seed_figures(runs: dict[str, list[Run]], rows: list[Row], out_dir: Path,
                      target: float | None) -> list[Path]:
    """The figures of a comparison over seeds (`runs`: each method's runs, one per seed; `rows`:
    edgefl.report.seeds `seed_rows`): accuracy as each method's spread over its seeds
    (`band_accuracy_figure`), speed-ups as the seeds' mean with +-1 sd error bars, the breakdown and
    energy as the seeds' mean, and the memory and perturbation figures of every run."""
    check_target(target)
    every = [run for group in runs.values() for run in group]
    parts = [_mean_parts([breakdown(r) for r in group]) for group in runs.values()]  # an async run's
    # breakdown reads its events log: once per run
    joules = [_mean_or_none([energy_per_device(r, None)[0] for r in group]) for group in runs.values()]
    over = f" over {len(every) // len(runs)} seeds"
    figures = {"accuracy": band_accuracy_figure(runs, target),
               "speedup": seed_speedup_figure(summary_rows(rows), target),
               "breakdown": breakdown_figure(parts, joules, list(runs), over),
               "memory": memory_figure(every),
               "epsilon": epsilon_figure(every, [f"{r.method} ({r.name})" for r in every])}
    return save_figures(figures, out_dir)


def seed_speedup_figure(summary: list[Row], target: float | None) -> Figure | None:
    """`speedup_figure` of a comparison over seeds (`summary`: edgefl.report.seeds `summary_rows`):
    each method's mean speed-up over its seeds, with +-1 sd error bars."""
    columns = ("speedup_vs_jfat", "speedup_to_target_vs_jfat")
    means = [{"method": r["method"], "time_to_target_s": r["time_to_target_s_mean"],
              **{c: r[f"{c}_mean"] for c in columns}} for r in summary]
    errors = [{c: r[f"{c}_std"] for c in columns} for r in summary]
    return speedup_figure(means, [r["method"] for r in summary], target, errors)


def _mean_parts(parts: list[dict[str, float]]) -> dict[str, float]:
    return {p: statistics.fmean(b[p] for b in parts) for p in parts[0]}


def _mean_or_none(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) if known else None


def save_figures(figures: dict[str, Figure | None], out_dir: Path) -> list[Path]:
    """Each drawn figure as PNG and SVG in the figures folder `out_dir` (claimed), the stale ones of
    an earlier plot there removed; every figure closed."""
    drawn = {name: fig for name, fig in figures.items() if fig is not None}
    try:
        claim(out_dir, "figures")
        written = [path for name, fig in drawn.items() for path in save(fig, out_dir / name)]
    finally:  # a refused folder or a failed write leaves no figure open
        for fig in drawn.values():
            plt.close(fig)
    drop_stale(out_dir, written, {*figures, "timeline"})
    return written


def drop_stale(out_dir: Path, written: list[Path], names: set[str]) -> None:
    """Remove the figures (`names`, or a run's `timeline-*`, as PNG or SVG) an earlier plot into
    `out_dir` drew that this one did not (another set of runs: a speed-up without jFAT, another
    run's timeline), so the folder shows one plot's figures."""
    for path in out_dir.iterdir():
        ours = (path.suffix in (".png", ".svg") and path.stem in names) or run_timeline(path.name)
        if ours and path not in written and path.is_file():
            path.unlink()


def save(fig: Figure, stem: Path) -> list[Path]:
    """`stem`.png and `stem`.svg, through rundir's safe writer (make_figures closes the figure); laid
    out by matplotlib's constrained layout, which makes room for legends beside the axes."""
    paths = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    for path in paths:
        write_file(path, render(fig, path.suffix[1:]))
    return paths


def render(fig: Figure, fmt: str) -> bytes:
    """`fig` as `fmt` (png, svg) bytes, laid out by matplotlib's constrained layout; an SVG carries no
    date, so the same figure gives the same bytes."""
    fig.set_layout_engine("constrained")
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=120, format=fmt, bbox_inches="tight",
                metadata={"Date": None} if fmt == "svg" else None)
    return buffer.getvalue()


def run_labels(runs: list[Run]) -> list[str]:
    """The method's name, or "method (run)" when a method appears more than once."""
    methods = [r.method for r in runs]
    return [r.method if methods.count(r.method) == 1 else f"{r.method} ({r.name})" for r in runs]


ACCURACY_PANELS = ((2, "adversarial (PGD)"), (1, "clean"))  # (column of `evaluated`, kind) per panel


def accuracy_figure(runs: list[Run], labels: list[str], target: float | None) -> Figure | None:
    """Adversarial and clean test accuracy against simulated hours (two panels); None in dry runs."""
    curves = [(label, evaluated(run)) for run, label in zip(runs, labels, strict=True)]
    if not any(points for _, points in curves):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharex=True)
    for i, (label, points) in enumerate(curves):
        hours = [t / 3600 for t, _, _ in points]
        for ax, (column, _) in zip(axes, ACCURACY_PANELS, strict=True):
            ax.plot(hours, [100 * p[column] for p in points], ms=3, label=label, **run_style(i))
    _accuracy_axes(axes, target)
    return fig


def band_accuracy_figure(runs: dict[str, list[Run]], target: float | None) -> Figure | None:
    """Each method's accuracy over its seeds (`runs`: each method's runs) against the x axis they
    share (`seed_axis`): every seed's curve thin and, where the method's seeds share a span of x
    (edgefl.report.stats `spread`), their mean bold with the least to greatest value shaded, else
    their mean end point with min-max error bars; None in dry runs."""
    if not any(evaluated(r) for group in runs.values() for r in group):
        return None
    axis = seed_axis(runs)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharex=True)
    for ax, (column, _) in zip(axes, ACCURACY_PANELS, strict=True):
        for i, (method, curves) in enumerate(seed_curves(runs, column, axis).items()):
            if curves:
                _draw_spread(ax, method, curves, run_style(i))
    _accuracy_axes(axes, target, axis)
    return fig


Curve = list[tuple[float, float]]  # (x, accuracy %) of a run's evaluated rounds


def seed_axis(runs: dict[str, list[Run]]) -> str:
    """The x axis of a comparison over seeds' accuracy: "time" (simulated hours), or "round" (from 1)
    where more methods' seeds share a span of rounds than of simulated time (edgefl.report.stats
    `spread`). A seed changes the fleet draw, so each seed's clock runs at its own pace, and the
    seeds of short runs can share no span of it."""
    def banded(axis: str) -> int:
        curves = seed_curves(runs, ACCURACY_PANELS[0][0], axis).values()
        return sum(isinstance(spread(c), Band) for c in curves if c)

    return "round" if banded("round") > banded("time") else "time"


def seed_curves(runs: dict[str, list[Run]], column: int, axis: str) -> dict[str, list[Curve]]:
    """Each method's curves of accuracy `column` (of `evaluated`) in percent, one per seed with an
    evaluated round, against simulated hours (`axis` "time") or the round from 1 ("round")."""
    out: dict[str, list[Curve]] = {}
    for method, group in runs.items():
        out[method] = []
        for run in group:
            points = evaluated(run)
            xs = [t / 3600 for t, _, _ in points] if axis == "time" else evaluated_rounds(run)
            if points:
                out[method].append([(x, 100 * p[column]) for x, p in zip(xs, points, strict=True)])
    return out


def _draw_spread(ax: Axes, method: str, curves: list[Curve], style: dict[str, str]) -> None:
    """A method's seeds on one panel: each curve thin, then its band or its end point."""
    for curve in curves:
        ax.plot([x for x, _ in curve], [y for _, y in curve], lw=0.6, alpha=0.35, color=style["color"],
                ls=style["ls"])
    found = spread(curves)
    if isinstance(found, EndPoint):
        ax.errorbar([found.x], [found.y], xerr=[[found.x - found.x_low], [found.x_high - found.x]],
                    yerr=[[found.y - found.y_low], [found.y_high - found.y]], color=style["color"],
                    marker=style["marker"], ms=5, capsize=3,
                    label=f"{method}: mean end of {len(curves)} seeds, bars min-max")
        return
    ax.fill_between(found.grid, found.low, found.high, color=style["color"], alpha=0.2, lw=0)
    ax.plot(found.grid, found.mean, color=style["color"], ls=style["ls"], lw=1.8,
            label=f"{method}: mean of {len(curves)} seeds, band min-max")


# an accuracy figure's x axis: (what the titles say it is against, its label)
X_AXES = {"time": ("simulated time", "simulated wall-clock time (hours)"),
          "round": ("rounds", "communication round (the seeds' simulated clocks share no span)")}


def _accuracy_axes(axes: Any, target: float | None, axis: str = "time") -> None:
    """The target line, titles, labels and legends of the two accuracy panels against `axis`."""
    if target is not None:
        axes[0].axhline(100 * target, color="grey", ls=":", label=f"target {100 * target:g} %")
    against, label = X_AXES[axis]
    for ax, (_, kind) in zip(axes, ACCURACY_PANELS, strict=True):
        ax.set(xlabel=label, ylabel=f"{kind} test accuracy (%)",
               title=f"{kind.capitalize()} accuracy against {against}", ylim=(0, 100))
        if axis == "round":
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


def speedup_figure(rows: list[Row], labels: list[str], target: float | None,
                   errors: list[dict[str, float | None]] | None = None) -> Figure | None:
    """Speed-up over jFAT to finish and, where reached, to the target, with `errors` (per row and
    column, a standard deviation over seeds) as +-1 sd error bars; None without a jFAT run or with
    nothing but jFAT runs."""
    if not any(r["method"] == BASELINE for r in rows) or all(r["method"] == BASELINE for r in rows):
        return None
    bars = {"to finish": "speedup_vs_jfat"}
    if target is not None:
        bars[f"to PGD accuracy {100 * target:g} %"] = "speedup_to_target_vs_jfat"
    width = 0.8 / len(bars)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.3 * len(rows) + 2), 4.5))
    for j, (name, column) in enumerate(bars.items()):
        xs = [i + (j - (len(bars) - 1) / 2) * width for i in range(len(rows))]
        values = [r[column] for r in rows]
        spread = None if errors is None else [e[column] or 0.0 for e in errors]
        drawn = ax.bar(xs, [v or 0.0 for v in values], width, yerr=spread, capsize=3 if spread else 0,
                       label=name + ("" if errors is None else " (mean, error bars +-1 sd over seeds)"),
                       color=f"C{j}")
        ax.bar_label(drawn, labels=[_bar_text(r, v) for r, v in zip(rows, values, strict=True)],
                     fontsize=8)
    ax.axhline(1.0, color="grey", ls=":", label="jFAT (1x)")
    ax.set_xticks(range(len(rows)), labels, rotation=20, ha="right")
    ax.set(ylabel="speed-up over jFAT (x, simulated time)", title="Speed-up over jFAT")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    return fig


def _bar_text(row: Row, speedup: float | None) -> str:
    if speedup is not None:
        return f"{speedup:.2f}x"
    return "not reached" if row["time_to_target_s"] is None else "jFAT did not reach it"


def breakdown_figure(parts: list[dict[str, float]], joules: list[float | None], labels: list[str],
                     over: str = "") -> Figure:
    """Stacked simulated hours per run (edgefl.report.compare `breakdown`): compute, data access,
    communication, waiting, server; and beside it, where runs priced energy, their joules per
    device; `over` says what the bars average (" over 3 seeds")."""
    priced = any(j is not None for j in joules)
    fig, axes = plt.subplots(1, 2 if priced else 1, squeeze=False,
                             figsize=(max(6.0, 1.3 * len(parts) + 3) * (2 if priced else 1), 4.5))
    ax = axes[0][0]
    bottom = [0.0] * len(parts)
    for part in [*PARTS, "server"]:
        hours = [p[part] / 3600 for p in parts]
        ax.bar(range(len(parts)), hours, 0.6, bottom=bottom, label=PHASE_LABELS[part],
               color=PHASE_COLOURS[part])
        bottom = [b + h for b, h in zip(bottom, hours, strict=True)]
    ax.set_xticks(range(len(parts)), labels, rotation=20, ha="right")
    ax.set(ylabel="simulated time (hours)", title=f"Where the time goes (mean client per round{over})")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    if priced:
        energy_panel(axes[0][1], joules, labels)
    return fig


def energy_panel(ax: Axes, joules: list[float | None], labels: list[str]) -> None:
    """Joules per device over each run (no bar where a run priced no energy)."""
    drawn = ax.bar(range(len(joules)), [j or 0.0 for j in joules], 0.6, color="C5")
    ax.bar_label(drawn, labels=["not priced" if j is None else f"{j:.3g} J" for j in joules], fontsize=8)
    ax.set_xticks(range(len(joules)), labels, rotation=20, ha="right")
    ax.set(ylabel="energy per device (J)", title="Energy per device over the run")
    ax.grid(axis="y", alpha=0.3)


def memory_figure(runs: list[Run]) -> Figure:
    """Client-rounds' available memory (MB) against effective GFLOP/s, log-log, one colour per fleet
    (pool, sampling skew s, seed), with each method's memory need (the least MemReq it asked of a
    client) and R_min as vertical lines (Fig. 7)."""
    fleets: dict[str, set[tuple[str, ...]]] = {}
    for run in runs:
        f = run.scenario["fleet"]
        label = f"client-rounds, {f['pool']} pool, s = {f['balance_s']:g}, seed {run.scenario['seed']}"
        fleets.setdefault(label, set()).update(
            (c["round"], c["client"], c["mem_avail_bytes"], c["flops"]) for c in run.clients)
    fig, ax = plt.subplots(figsize=(11, 5))
    for i, (label, points) in enumerate(fleets.items()):
        ax.scatter([int(p[2]) / 1e6 for p in points], [float(p[3]) / 1e9 for p in points], s=12,
                   alpha=0.5, color=f"C{i}", label=f"{label} ({len(points)})")
    lines: dict[float, list[str]] = {}  # MB -> what needs or keeps that much, one line for all
    for run in runs:
        for name, mb in ((f"{run.method} needs", memory(run)[0]),
                         ("R_min", float(run.scenario["fleet"]["reserved_memory_mb"]))):
            if name not in lines.setdefault(round(mb, 6), []):
                lines[round(mb, 6)].append(name)
    for j, (mb, names) in enumerate(sorted(lines.items())):
        ax.axvline(mb, color=f"C{len(fleets) + j}", ls=LINE_STYLES[j % len(LINE_STYLES)], lw=1.5,
                   label=textwrap.fill(f"{', '.join(names)} {mb:.3g} MB", 48))
    ax.set(xscale="log", yscale="log", xlabel="available memory for training (MB, log scale)",
           ylabel="effective performance (GFLOP/s, log scale)",
           title="Fleet memory and performance against each method's memory need")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    return fig


def epsilon_figure(runs: list[Run], labels: list[str]) -> Figure | None:
    """FedProphet's perturbation per round with module boundaries as dashed lines (Fig. 11); None
    when no run logs `eps`."""
    with_eps = [(run, label) for run, label in zip(runs, labels, strict=True) if run.metrics[0].get("eps")]
    if not with_eps:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    logged = [[float(r["eps"]) if r["eps"] else math.nan for r in run.metrics] for run, _ in with_eps]
    for i, (run, label) in enumerate(with_eps):
        rounds = [int(r["round"]) + 1 for r in run.metrics]
        style = run_style(i)
        ax.plot(rounds, logged[i], color=style["color"], ls=style["ls"], label=label)
        starts = [rounds[k] for k in range(1, len(rounds))
                  if run.metrics[k].get("module") != run.metrics[k - 1].get("module")]
        for k, x in enumerate(starts):
            ax.axvline(x - 0.5, color=style["color"], ls="--", alpha=0.6,
                       label=f"{label}: next module starts" if k == 0 else None)
    log = all(e > 0 for eps in logged for e in eps if e == e)  # a dry run measures no feature eps: NaN
    ax.set(yscale="log" if log else "linear", xlabel="communication round",
           ylabel=f"perturbation magnitude ε{' (log scale)' if log else ''}\n"
                  "input L∞ on module 1, feature L2 after",
           title="FedProphet's adaptive perturbation per round")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return fig
