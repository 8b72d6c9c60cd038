"""Accuracy against simulated wall-clock time, one line per run (clean solid, PGD dashed)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from edgefl.errors import EdgeflError


def read_curve(run: Path) -> tuple[str, list[float], list[float], list[float]]:
    """(label, simulated hours, clean acc %, adversarial acc %) of the evaluated rounds."""
    metrics = run / "metrics.csv"
    if not metrics.is_file():
        raise EdgeflError(str(run), "metrics.csv", "missing; give a run directory made by edgefl run")
    hours, clean, adv = [], [], []
    with open(metrics, newline="") as f:
        for row in csv.DictReader(f):
            if row.get("clean_acc"):
                hours.append(float(row["sim_time_s"]) / 3600)
                clean.append(100 * float(row["clean_acc"]))
                adv.append(100 * float(row["adv_acc"]))
    summary = run / "summary.json"
    method = json.loads(summary.read_text())["method"] if summary.is_file() else run.name
    return f"{method} ({run.name})", hours, clean, adv


def plot_accuracy(runs: list[Path], out: Path) -> Path:
    """Clean and adversarial accuracy against simulated hours; saved to `out` (PNG)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, run in enumerate(runs):
        label, hours, clean, adv = read_curve(run)
        color = f"C{i}"
        ax.plot(hours, clean, color=color, marker="o", ms=3, label=f"{label} clean")
        ax.plot(hours, adv, color=color, marker="o", ms=3, ls="--", label=f"{label} PGD")
    ax.set_xlabel("simulated wall-clock time (hours)")
    ax.set_ylabel("test accuracy (%)")
    ax.set_title("Accuracy against simulated time")
    ax.set_ylim(0, 100)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out
