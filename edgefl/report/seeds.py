"""A comparison over several seeds: each method's mean and spread, and its paired differences
against a reference method (jFAT by default, the baseline of FedProphet's speed-ups, §7.3).

Files (`edgefl compare --seeds`): `seeds.csv`, one row per method and seed (the one-seed
comparison's columns with `seed`, speed-ups against jFAT on the same seed); `comparison.csv`, one
row per method with `n_seeds` and the mean and sample standard deviation of every figure (a figure
a seed lacks, such as the time to a target it never reached, is averaged over the seeds that have
it, `time_to_target_s_n` of them); `differences.csv`, one row per method and figure against the
reference (edgefl.report.stats `paired`); and `comparison.md`.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from edgefl.report.compare import BASELINE, COLUMNS, FORMATS, Row, Run, csv_text, table
from edgefl.report.stats import Kind, mean_std, paired
from edgefl.rundir import claim, write_file

FIGURES = COLUMNS[2:]  # every figure of a run's row
SEED_COLUMNS = ["method", "seed", *COLUMNS[1:]]
SUMMARY_COLUMNS = ["method", "n_seeds", "seeds", *(f"{c}_{s}" for c in FIGURES for s in ("mean", "std")),
                   "time_to_target_s_n"]
DIFFERENCE_COLUMNS = ["method", "reference", "figure", "kind", "n_pairs", "estimate", "low", "high",
                      "interval"]
# how each figure is set against the reference's: accuracies and shares as differences, the rest as
# ratios (the speed-ups are ratios against jFAT already; the fleet's median memory is not the method's)
KINDS: dict[str, Kind] = {
    "clean_acc": "difference", "adv_acc": "difference", "sim_time_s": "ratio", "time_to_target_s": "ratio",
    "mem_need_mb": "ratio", "mem_peak_mb": "ratio", "fits_share": "difference",
    "data_access_share": "difference", "compute_share": "difference", "comm_share": "difference",
    "wait_share": "difference", "energy_per_device_j": "ratio", "energy_to_target_per_device_j": "ratio"}


def seed_rows(runs: Mapping[int, list[Run]], target: float | None) -> list[Row]:
    """One comparison row per method and seed: each seed's runs tabled together (speed-ups against
    that seed's jFAT run), `run` the run folder as `<method>/seed-<s>`."""
    return [{"seed": seed, **row, "run": f"{row['method']}/{row['run']}"}
            for seed, seed_runs in runs.items() for row in table(seed_runs, target)]


def _by_method(rows: list[Row]) -> dict[str, list[Row]]:
    out: dict[str, list[Row]] = {}
    for r in rows:
        out.setdefault(r["method"], []).append(r)
    return out


def summary_rows(rows: list[Row]) -> list[Row]:
    """Per method: n_seeds, the seeds, and each figure's mean and standard deviation over the seeds
    that have it (None where none has; the deviation None below two)."""
    out = []
    for method, mine in _by_method(rows).items():
        row: Row = {"method": method, "n_seeds": len(mine), "seeds": " ".join(str(r["seed"]) for r in mine),
                    "time_to_target_s_n": sum(r["time_to_target_s"] is not None for r in mine)}
        for figure in FIGURES:
            values = [r[figure] for r in mine if r[figure] is not None]
            mean, std = mean_std(values) if values else (None, None)
            row[f"{figure}_mean"], row[f"{figure}_std"] = mean, std
        out.append(row)
    return out


def differences(rows: list[Row], reference: str, interval: str) -> list[Row]:
    """Each other method's paired difference (or ratio) against `reference`, figure by figure, over
    the seeds where both have the figure (and, for a ratio, both are positive)."""
    methods = _by_method(rows)
    ref = {r["seed"]: r for r in methods[reference]}
    out = []
    for method, mine in methods.items():
        if method == reference:
            continue
        for figure, kind in KINDS.items():
            pairs = [(ref[r["seed"]][figure], r[figure]) for r in mine if r["seed"] in ref]
            pairs = [(a, b) for a, b in pairs if a is not None and b is not None
                     and (kind == "difference" or (a > 0 and b > 0))]
            if not pairs:
                continue
            found = paired([a for a, _ in pairs], [b for _, b in pairs], kind, interval)
            out.append({"method": method, "reference": reference, "figure": figure, "kind": kind,
                        "n_pairs": found.n, "estimate": found.estimate, "low": found.low, "high": found.high,
                        "interval": interval})
    return out


LABELS = {"clean_acc": "clean", "sim_time_s": "simulated time", "time_to_target_s": "time to target",
          "energy_per_device_j": "energy per device"}  # the printed figures, adv_acc named by its attack


def printed(diffs: list[Row], attack: str) -> list[tuple[str, Row]]:
    """The differences comparison.md prints (LABELS' figures and the adversarial accuracy), each with
    its label."""
    return [(attack if d["figure"] == "adv_acc" else LABELS[d["figure"]], d) for d in diffs
            if d["figure"] == "adv_acc" or d["figure"] in LABELS]


def difference_lines(diffs: list[Row], attack: str, n_seeds: int) -> list[str]:
    """One line per method: its clean and adversarial accuracy in points, its simulated time, time to
    target and energy as ratios, each with its interval, e.g.
    `fedprophet - jfat: PGD-20 -2.7 pts [-4.6, -0.8], simulated time 0.89x [0.85, 0.93]`."""
    lines: dict[str, list[str]] = {}
    for label, d in printed(diffs, attack):
        part = f"{label} {figure_text(d, d['estimate'], True)} {interval_text(d)}"
        if d["n_pairs"] < n_seeds:
            part += f" ({d['n_pairs']} of {n_seeds} seeds)"
        lines.setdefault(f"{d['method']} - {d['reference']}", []).append(part)
    return [f"{pair}: {', '.join(parts)}" for pair, parts in lines.items()]


def figure_text(d: Row, value: float, signed: bool) -> str:
    """A difference's estimate (`signed`: with its sign and unit) or an interval bound, as the summary
    prints it: accuracies and shares in points, ratios as such."""
    if d["kind"] == "ratio":
        return f"{value:.2f}{'x' if signed else ''}"
    return f"{100 * value:{'+' if signed else ''}.1f}{' pts' if signed else ''}"


def interval_text(d: Row) -> str:
    """A difference's interval, `[low, high]` as `figure_text` prints its bounds."""
    if d["low"] is None:
        return "[no interval: one seed]"
    return f"[{figure_text(d, d['low'], False)}, {figure_text(d, d['high'], False)}]"


def differences_note(reference: str | None, interval: str, paired_any: bool) -> str:
    """The sentence above the paired differences, or the one that says why there are none."""
    if reference is None:
        return "No reference method among the methods: no paired differences (--reference)."
    if not paired_any:
        return f"No other method to pair against {reference}."
    how = "Student t" if interval == "t" else "percentile bootstrap"
    return (f"Paired differences against {reference} over the seeds both ran, 95 % {how} interval "
            "(accuracy in points, times as ratios)")


def compared_pairing(folder: Path, methods: list[str]) -> tuple[str | None, str]:
    """The reference method and the interval (`t`, `bootstrap`) the comparison in `folder` paired
    with, read from the differences.csv `edgefl compare` wrote there, so that a report pairs the
    seeds as the comparison did; without that file (or with one naming no compared method): jFAT
    where compared, and the t interval, as `edgefl compare` does by default."""
    try:
        with (folder / "differences.csv").open(newline="") as f:
            first = next(csv.DictReader(f), None)
    except (OSError, UnicodeDecodeError, csv.Error):
        first = None
    if first and first.get("reference") in methods and first.get("interval") in ("t", "bootstrap"):
        return first["reference"], first["interval"]
    return BASELINE if BASELINE in methods else None, "t"


def attack_label(scenario: dict[str, Any]) -> str:
    """The evaluation attack as the papers name it: PGD-20, CW-30, FGSM."""
    evaluation = scenario.get("evaluation", {})
    name = str(evaluation.get("attack", "pgd")).upper().replace("_", "-")
    return name if name == "FGSM" else f"{name}-{evaluation.get('steps', '')}"


def write_seed_comparison(rows: list[Row], out_dir: Path, target: float | None, reference: str | None,
                          interval: str, attack: str) -> list[Path]:
    """seeds.csv, comparison.csv, differences.csv (with a reference method) and comparison.md (with
    the difference lines) in the comparison folder `out_dir`; returns the files."""
    claim(out_dir, "compare")
    summary = summary_rows(rows)
    diffs = differences(rows, reference, interval) if reference else []
    n_seeds = max(r["n_seeds"] for r in summary)
    lines = difference_lines(diffs, attack, n_seeds)
    files = {"seeds.csv": csv_text(SEED_COLUMNS, rows), "comparison.csv": csv_text(SUMMARY_COLUMNS, summary),
             **({"differences.csv": csv_text(DIFFERENCE_COLUMNS, diffs)} if reference else {}),
             "comparison.md": _markdown(summary, target, reference, interval, lines)}
    for name, text in files.items():
        write_file(out_dir / name, text)
    stale = out_dir / "differences.csv"  # an earlier comparison's, with a reference this one lacks
    if reference is None and stale.is_file() and not stale.is_symlink():
        stale.unlink()
    return [out_dir / name for name in files]


def _markdown(summary: list[Row], target: float | None, reference: str | None, interval: str,
              lines: list[str]) -> str:
    """The mean +- sd table, what the spread and the speed-ups are, and the paired differences."""
    head = ["method", "n_seeds", *FIGURES]
    text = f"| {' | '.join(head)} |\n|{'---|' * len(head)}\n"
    for r in summary:
        cells = [r["method"], str(r["n_seeds"]), *(spread_text(r, f) for f in FIGURES)]
        text += f"| {' | '.join(cells)} |\n"
    text += f"\n{spread_note(summary[0]['seeds'], target)}\n"
    note = differences_note(reference, interval, bool(lines))
    return text + f"\n{note}" + (":\n\n" + "".join(f"- {x}\n" for x in lines) if lines else "\n")


def spread_note(seeds: str, target: float | None) -> str:
    """The sentence under the mean +- sd table: over which seeds, the target, the speed-ups' base."""
    goal = f"adversarial accuracy >= {target:g}" if target is not None else "none given"
    return (f"Mean ± sample standard deviation over seeds {seeds.replace(' ', ', ')}; target: {goal} (its "
            f"time averaged over the seeds that reached it, `(k/n)`); speed-ups against {BASELINE} on the "
            "same seed.")


def spread_text(row: Row, figure: str, scale: float = 1.0, fmt: str = "") -> str:
    """A summary row's `mean ± sd` of `figure` (times `scale`, formatted as `fmt`, by default as
    comparison.md formats the figure), the time to the target with `(k/n)`, the seeds that reached
    it; "" where no seed has the figure."""
    mean, std = row[f"{figure}_mean"], row[f"{figure}_std"]
    if mean is None:
        return ""
    fmt = fmt or FORMATS[figure]
    cell = format(scale * mean, fmt) + ("" if std is None else f" ± {format(scale * std, fmt)}")
    if figure == "time_to_target_s":
        cell += f" ({row['time_to_target_s_n']}/{row['n_seeds']})"
    return cell
