"""Methods x seeds on one scenario: mean +- std of the final clean, FGSM, PGD and CW accuracy and
of the simulated time. Not a test: it trains every (method, seed) pair for real.

    .venv/bin/python bench/seed_table.py [--scenario scenarios/sfat-digits.toml] [--seeds 0 1 2]
        [--methods fedavg_at,jfat,...] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from edgefl.config import load_scenario
from edgefl.experiment import prepare, run

METHODS = "fedavg_at,jfat,fedprox_at,scaffold_at,fedcurv_at,feddynat,fedavg_dynat,sfat,gma"
COLUMNS = ["clean_acc", "fgsm_acc", "adv_acc", "cw_acc"]


def final_row(out: Path) -> dict[str, float]:
    lines = (out / "metrics.csv").read_text().splitlines()
    header = lines[0].split(",")
    last = dict(zip(header, lines[-1].split(","), strict=True))
    row = {c: 100 * float(last[c]) for c in COLUMNS}
    row["sim_s"] = json.loads((out / "summary.json").read_text())["sim_time_s"]
    return row


def mean_std(values: list[float]) -> str:
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f} +- {std:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scenario", default="scenarios/sfat-digits.toml")
    p.add_argument("--methods", default=METHODS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", dest="overrides", action="append", default=[])
    args = p.parse_args()
    print(f"{args.scenario}, seeds {args.seeds}, overrides {args.overrides}")
    print(f"| method | clean % | FGSM % | PGD-20 % | CW % | simulated s |\n|{' --- |' * 6}")
    with tempfile.TemporaryDirectory() as tmp:
        for method in args.methods.split(","):
            rows = []
            for seed in args.seeds:
                s = load_scenario(args.scenario, [*args.overrides, f"method={method}", f"seed={seed}"])
                out = Path(tmp) / f"{method}-{seed}"
                run(prepare(s, args.scenario), out, progress=False)
                rows.append(final_row(out))
            cells = [mean_std([r[c] for r in rows]) for c in [*COLUMNS, "sim_s"]]
            print(f"| {method} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
