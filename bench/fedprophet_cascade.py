"""How a FedProphet run's cascade grew, module by module, from its metrics.csv (FedProphet §5-6).

    python bench/fedprophet_cascade.py RUN [RUN ...]

For each module: the rounds it trained, its validation clean and adversarial accuracy through its own
auxiliary head at the round of its best validation PGD accuracy, the perturbation eps_m = alpha x E[d*]
it was trained against (APA, Eq. 9-10) with alpha's path, the deepest module DMA (Eq. 12-15) gave any
client of a round (`max_assigned`), averaged over the module's rounds and at most, and the test
accuracy of the whole model at the module's last evaluation. Several runs (seeds) are printed one
after another.
"""

from __future__ import annotations

import csv
import sys
from itertools import groupby
from pathlib import Path


def rows(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def pair(row: dict[str, str] | None, clean: str, adv: str) -> str:
    """A row's clean and adversarial accuracy in percent, blank without the row."""
    return f"{float(row[clean]):6.1%} {float(row[adv]):6.1%}" if row else " " * 13


def module_line(module: str, stage: list[dict[str, str]]) -> str:
    scored = [r for r in stage if r["val_clean"] and r["val_adv"]]
    best = max(scored, key=lambda r: float(r["val_adv"]), default=None)
    alphas = " ".join(dict.fromkeys(r["alpha"] for r in stage))  # each value once, in order
    assigned = [int(r["max_assigned"]) for r in stage]
    tested = next((r for r in reversed(stage) if r["clean_acc"]), None)
    val, test = pair(best, "val_clean", "val_adv"), pair(tested, "clean_acc", "adv_acc")
    dma = f"{sum(assigned) / len(assigned):4.1f} {max(assigned):>3}"
    return (f"{module:>6} {stage[0]['round']:>5}-{stage[-1]['round']:<5} {len(stage):>6} {val}  {test}  "
            f"{float(stage[-1]['eps'] or 'nan'):8.4f}  {dma}  {alphas}")


def main(runs: list[str]) -> None:
    for run in map(Path, runs):
        table = rows(run)
        if not table or "module" not in table[0]:
            sys.exit(f"{run}: no FedProphet metrics (module, eps, alpha columns) in metrics.csv")
        print(f"{run}: {table[0]['modules']} modules, {len(table)} rounds")
        print(" module rounds      n  val clean/PGD   test clean/PGD      eps  DMA mean/max  alpha path")
        for module, stage in groupby(table, key=lambda r: r["module"]):
            print(module_line(module, list(stage)))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
