"""Planning at fleet scale: client-rounds per second and peak memory of dry runs (no data, no training).

A dry run (`edgefl run --dry-run`) plays the SimPy engine and the cost model on a fleet: per round it
samples the clients and, in bulk as NumPy arrays (edgefl/experiment/rounds.py), draws each one's app,
memory and network, plans the workloads, prices them (compute, swap walk, communication), plays the
round with one SimPy event and streams the clients' rows to disk (Parquet above
`output.parquet_above` client-rounds). Each case runs in a fresh subprocess, so its peak resident
memory (`resource.getrusage(RUSAGE_SELF).ru_maxrss`, which includes the ~0.6 GB of importing torch
and profiling the model) is its own. The bench prints, per case, the time of `prepare` (profile,
fleet assignment, budget check) and of `run`, client-rounds per second of `run` and of the whole,
and the peak memory.

On this 2-core machine, quickstart, sample fraction 0.5 (one case per command, on a quiet machine):

      clients rounds  client-rounds  prepare s    run s  total s  c-r/s run  c-r/s total  peak MB  written MB
        10000     10          50000       0.02     1.01     1.03      49665        48660      635        23.5
       100000    100        5000000       0.03    11.64    11.66     429679       428720      784       715.7
      1000000     10        5000000       0.10    11.53    11.63     433547       429802     1254       726.0

(10k x 10 writes CSV, below `output.parquet_above`; the others Parquet.) Before the bulk engine
(commit 17fa3ce: every client drew from its own NumPy generator and was priced by its own swap walk),
100k x 10 ran at 12,395 client-rounds/s (40.4 s), against 352,053/s (1.45 s) after it, back to back
in one quiet window, so 100k x 100 took about 400 s then.

Run:
    .venv/bin/python bench/fleet.py                                        # 10k, 100k, 1M clients x 10
    .venv/bin/python bench/fleet.py --clients 100000 --rounds 100          # the issue's target
    .venv/bin/python bench/fleet.py --clients 1000000 --rounds 10
    .venv/bin/python bench/fleet.py --scenario scenarios/fedprophet-quickstart.toml
    # living fleets (docs/benchmarks.md, "Shared links"):
    .venv/bin/python bench/fleet.py --scenario scenarios/living-digits.toml --clients 100000 --rounds 100
    .venv/bin/python bench/fleet.py --scenario scenarios/living-digits.toml --clients 1000000 --rounds 10
    .venv/bin/python bench/fleet.py --scenario scenarios/energy-digits.toml --clients 100000 --rounds 100 \
        --fraction 0.5
    .venv/bin/python bench/fleet.py --scenario scenarios/async-digits.toml --clients 100000 --rounds 100 \
        --set round.concurrency=10000 --set round.buffer=1000
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CASE = """
import json, resource, sys, tempfile, time, warnings
from pathlib import Path
warnings.filterwarnings("ignore", message=r".*torch\\.jit\\.script.* is deprecated")  # from fvcore
from edgefl.scenario import load_scenario
from edgefl.experiment import prepare, run
scenario, overrides = sys.argv[1], json.loads(sys.argv[2])
s = load_scenario(scenario, overrides)
started = time.perf_counter()
exp = prepare(s, scenario, dry_run=True)
prepared = time.perf_counter()
with tempfile.TemporaryDirectory() as out:
    summary = run(exp, Path(out), progress=False)
    written = sum(p.stat().st_size for p in Path(out).iterdir())
done = time.perf_counter()
print(json.dumps({"client_rounds": summary["client_rounds"], "prepare_s": prepared - started,
                  "run_s": done - prepared, "written_mb": written / 1e6,
                  "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def plan(scenario: Path, clients: int, rounds: int, fraction: float,
         overrides: list[str]) -> dict[str, float]:
    """One dry run in a fresh subprocess: its timings, output size and peak memory."""
    sets = [*overrides, f"fleet.clients={clients}", f"rounds={rounds}", f"fleet.sample_fraction={fraction}"]
    done = subprocess.run([sys.executable, "-c", CASE, str(scenario), json.dumps(sets)], cwd=ROOT,
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{clients} clients x {rounds} rounds failed:\n{done.stderr.strip()}")
    r: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    total = r["prepare_s"] + r["run_s"]
    return {**r, "total_s": total, "run_rate": r["client_rounds"] / r["run_s"],
            "total_rate": r["client_rounds"] / total}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "quickstart.toml")
    p.add_argument("--clients", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    p.add_argument("--rounds", type=int, nargs="+", default=[10])
    p.add_argument("--fraction", type=float, default=0.5, help="clients selected per round (quickstart's)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    print(f"{'clients':>9}{'rounds':>7}{'client-rounds':>15}{'prepare s':>11}{'run s':>9}{'total s':>9}"
          f"{'c-r/s run':>11}{'c-r/s total':>13}{'peak MB':>9}{'written MB':>12}")
    for clients in args.clients:
        for rounds in args.rounds:
            r = plan(args.scenario, clients, rounds, args.fraction, args.overrides)
            print(f"{clients:>9}{rounds:>7}{r['client_rounds']:>15.0f}{r['prepare_s']:>11.2f}{r['run_s']:>9.2f}"
                  f"{r['total_s']:>9.2f}{r['run_rate']:>11.0f}{r['total_rate']:>13.0f}{r['peak_mb']:>9.0f}"
                  f"{r['written_mb']:>12.1f}", flush=True)


if __name__ == "__main__":
    main()
