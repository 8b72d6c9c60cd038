"""Methods x seeds on one scenario: mean +- std of the final clean, FGSM, PGD and CW accuracy and
of the simulated time, with each method's round count (the scenario's `[compare] rounds` table, as
`edgefl compare` gives them). Not a test: it trains every (method, seed) pair for real. Each method's per-seed
final clean and PGD-20 accuracy and simulated time follow the table.

    .venv/bin/python bench/seed_table.py [--scenario scenarios/sfat-digits.toml] [--seeds 0 1 2]
        [--methods fedavg_at,jfat,...] [--set KEY=VALUE ...] [--runs DIR]

With `--runs DIR` every run is kept in DIR/<method>-<seed> and a finished one (its summary.json
written, the same resolved scenario) is read back instead of trained again. The FedProphet
comparison (issue 12):

    .venv/bin/python bench/seed_table.py --scenario scenarios/compare-digits.toml \
        --methods jfat,fedprophet,heterofl_at,feddrop_at,fedrolex_at,feddf_at,fedet_at
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from edgefl.config import Scenario
from edgefl.experiment import prepare, run
from edgefl.runlog import read_rows
from edgefl.scenario import compare_scenario, to_toml

METHODS = "fedavg_at,jfat,fedprox_at,scaffold_at,fedcurv_at,feddynat,fedavg_dynat,sfat,gma"
COLUMNS = ["clean_acc", "fgsm_acc", "adv_acc", "cw_acc"]


def final_row(out: Path) -> dict[str, float]:
    last = read_rows(out, "metrics")[1][-1]
    row = {c: 100 * float(last[c]) for c in COLUMNS if c in last}  # FGSM/CW: evaluation.extra
    row["sim_s"] = json.loads((out / "summary.json").read_text())["sim_time_s"]
    return row


def mean_std(values: list[float]) -> str:
    if not values:
        return "-"
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.1f} +- {std:.1f}"


def finished(out: Path, s: Scenario) -> bool:
    """A complete run of exactly this scenario is in `out`."""
    saved = out / "scenario.toml"
    return (out / "summary.json").exists() and saved.exists() and saved.read_text() == to_toml(s)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scenario", default="scenarios/sfat-digits.toml")
    p.add_argument("--methods", default=METHODS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--runs", type=Path, help="keep the runs here and reuse finished ones")
    args = p.parse_args()
    print(f"{args.scenario}, seeds {args.seeds}, overrides {args.overrides}")
    print(f"| method | rounds | clean % | FGSM % | PGD-20 % | CW % | simulated s |\n|{' --- |' * 7}")
    per_seed = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.runs or Path(tmp)
        for method in args.methods.split(","):
            rows = []
            for seed in args.seeds:
                s = compare_scenario(args.scenario, [*args.overrides, f"seed={seed}"], method)
                out = root / f"{method}-{seed}"
                if not finished(out, s):
                    run(prepare(s, args.scenario), out, progress=False)
                rows.append(final_row(out))
            cells = [mean_std([r[c] for r in rows if c in r]) for c in [*COLUMNS, "sim_s"]]
            print(f"| {method} | {s.rounds} | " + " | ".join(cells) + " |", flush=True)
            per_seed.append(f"{method}: " + ", ".join(
                f"{r['clean_acc']:.1f} / {r['adv_acc']:.1f} / {r['sim_s']:.0f}" for r in rows))
    print("\nper seed (clean % / PGD-20 % / simulated s):", *per_seed, sep="\n")


if __name__ == "__main__":
    main()
