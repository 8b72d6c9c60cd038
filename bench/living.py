"""Issue 15's figures: one living-fleet scenario under each round mode, time to a PGD accuracy and
joules per device.

Runs `scenarios/living-digits.toml` (or --scenario) once per round mode with real training (or
--dry-run), each with its own --set overrides, and prints for each: rounds (aggregations in async
mode), simulated time, final clean and PGD accuracy, the time the PGD accuracy first reaches
--target (edgefl.report.compare.time_to_target), joules per device to then and over the run
(energy_per_device), and the clients' statuses.

    python bench/living.py --runs /tmp/living                      # sync, deadline, async
    python bench/living.py --runs /tmp/living --set rounds=30 --modes async
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from edgefl.experiment import prepare, run
from edgefl.report.compare import energy_per_device, load_run, sim_time, time_to_target
from edgefl.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def one(scenario: Path, mode: str, sets: list[str], out: Path, dry_run: bool) -> None:
    s = load_scenario(scenario, [*sets, f"round.mode={mode}"])
    run(prepare(s, str(scenario), dry_run=dry_run), out, progress=False)


def line(mode: str, out: Path, target: float) -> str:
    r = load_run(out)
    last = r.metrics[-1]
    reached = time_to_target(r, target)
    per_device, to_target = energy_per_device(r, target)
    statuses = Counter(row["status"] for row in r.clients)  # CSV or Parquet, read by load_run
    acc = (f"{float(last['clean_acc']):.3f} {float(last['adv_acc']):.3f}" if last["adv_acc"] else "- -")

    def cell(x: float | None, fmt: str) -> str:
        return "-" if x is None else format(x, fmt)

    figures = " ".join(f"{cell(x, '10.1f'):>10s}" for x in (reached, to_target, per_device))
    return (f"{mode:9s} {len(r.metrics):6d} {sim_time(r):9.1f} {acc:>12s} {figures}  "
            + " ".join(f"{k} {v}" for k, v in sorted(statuses.items())))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "living-digits.toml")
    p.add_argument("--modes", default="sync,deadline,async")
    p.add_argument("--set", action="append", default=[], help="an override for every mode")
    p.add_argument("--target", type=float, default=0.5)
    p.add_argument("--runs", type=Path, required=True, help="folder for the run directories")
    p.add_argument("--dry-run", action="store_true")
    a = p.parse_args()
    modes = a.modes.split(",")
    for mode in modes:
        one(a.scenario, mode, a.set, a.runs / mode, a.dry_run)
    print(f"{a.scenario.name}, target PGD {a.target:g}, overrides {a.set or 'none'}")
    print(f"{'mode':9s} {'rounds':>6s} {'sim_s':>9s} {'clean  PGD':>12s} {'to_target':>10s} "
          f"{'J/dev->tg':>10s} {'J/dev run':>10s}  statuses")
    for mode in modes:
        print(line(mode, a.runs / mode, a.target))


if __name__ == "__main__":
    main()
