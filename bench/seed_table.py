"""Methods x seeds on one scenario through `edgefl compare --seeds` (the runs, their resume, the
spread and the paired differences are its), then the attacks `edgefl compare` does not tabulate:
mean +- std of the final clean, FGSM, PGD and CW accuracy (FGSM and CW where the scenario's
`evaluation.extra` asks for them) and of the simulated time, with each method's round count.
Not a test: it trains every (method, seed) pair for real.

    .venv/bin/python bench/seed_table.py [--scenario scenarios/sfat-digits.toml] [--seeds 0 1 2]
        [--methods fedavg_at,jfat,...] [--set KEY=VALUE ...] [--runs DIR]

The runs are kept in DIR/<method>/seed-<s> (a temporary folder without `--runs`); a finished one is
read back instead of trained again. The FedProphet comparison (issue 12):

    .venv/bin/python bench/seed_table.py --scenario scenarios/compare-digits.toml \
        --methods jfat,fedprophet,heterofl_at,feddrop_at,fedrolex_at,feddf_at,fedet_at
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from edgefl.cli import main as edgefl
from edgefl.report.stats import mean_std
from edgefl.runlog import read_rows

METHODS = "fedavg_at,jfat,fedprox_at,scaffold_at,fedcurv_at,feddynat,fedavg_dynat,sfat,gma"
COLUMNS = ["clean_acc", "fgsm_acc", "adv_acc", "cw_acc"]


def final_row(out: Path) -> dict[str, float]:
    """A finished run's last evaluation in percent and its simulated seconds (`sim_s`)."""
    last = read_rows(out, "metrics")[1][-1]
    row = {c: 100 * float(last[c]) for c in COLUMNS if c in last}  # FGSM/CW: evaluation.extra
    row["sim_s"] = json.loads((out / "summary.json").read_text())["sim_time_s"]
    return row


def spread(values: list[float]) -> str:
    """`mean +- std` with one decimal; `-` for no values."""
    if not values:
        return "-"
    mean, std = mean_std(values)
    return f"{mean:.1f} +- {std or 0.0:.1f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--scenario", default="scenarios/sfat-digits.toml")
    p.add_argument("--methods", default=METHODS)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--set", dest="overrides", action="append", default=[])
    p.add_argument("--runs", type=Path, help="keep the runs here and reuse finished ones")
    args = p.parse_args()
    if len(set(args.seeds)) < 2:
        p.error("give two seeds or more (one seed has no spread: edgefl run is the tool for it)")
    with tempfile.TemporaryDirectory() as tmp:
        root = args.runs or Path(tmp) / "compare"
        seeds = ",".join(map(str, args.seeds))
        sets = [flag for item in args.overrides for flag in ("--set", item)]
        if edgefl(["compare", args.scenario, "--methods", args.methods, "--seeds", seeds, "--out", str(root),
                   "--quiet", *sets]) != 0:
            raise SystemExit(2)
        print(f"\n| method | rounds | clean % | FGSM % | PGD-20 % | CW % | simulated s |\n|{' --- |' * 7}")
        for method in args.methods.split(","):
            rows = [final_row(root / method / f"seed-{s}") for s in args.seeds]
            rounds = len(read_rows(root / method / f"seed-{args.seeds[0]}", "metrics")[1])
            cells = [spread([r[c] for r in rows if c in r]) for c in [*COLUMNS, "sim_s"]]
            print(f"| {method} | {rounds} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
