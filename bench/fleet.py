"""Planning at fleet scale: simulated client-rounds per second of a dry run (no data, no training).

A dry run (`edgefl run --dry-run`) plays the SimPy engine and the cost model on a fleet: per round it
samples the clients, draws each one's app, memory and network, plans its workload, prices it
(compute, swap walk, communication) and plays the round. This bench times `prepare` (profile, fleet
assignment, budget check) and `run` separately on the quickstart scenario (jFAT, digits_cnn, the
edge pool, 10 % of the clients a round by default) for several fleet sizes and round counts, in a
temporary directory, and prints client-rounds per second of `run` and of the whole.

Run:
    .venv/bin/python bench/fleet.py                                   # 1k, 10k, 100k clients
    .venv/bin/python bench/fleet.py --clients 10000 --rounds 100      # the issue's target
    .venv/bin/python bench/fleet.py --scenario scenarios/fedprophet-quickstart.toml
"""

from __future__ import annotations

import argparse
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def plan(scenario: Path, clients: int, rounds: int, fraction: float,
         overrides: list[str]) -> dict[str, float]:
    from edgefl.config import load_scenario
    from edgefl.experiment import prepare, run

    s = load_scenario(scenario, [*overrides, f"fleet.clients={clients}", f"rounds={rounds}",
                                 f"fleet.sample_fraction={fraction}"])
    started = time.perf_counter()
    exp = prepare(s, str(scenario), dry_run=True)
    prepared = time.perf_counter()
    with tempfile.TemporaryDirectory() as out:
        summary = run(exp, Path(out), progress=False)
    done = time.perf_counter()
    n = summary["client_rounds"]
    return {"clients": clients, "rounds": rounds, "client_rounds": n, "prepare_s": prepared - started,
            "run_s": done - prepared, "total_s": done - started, "run_rate": n / (done - prepared),
            "total_rate": n / (done - started)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else "")
    p.add_argument("--scenario", type=Path, default=ROOT / "scenarios" / "quickstart.toml")
    p.add_argument("--clients", type=int, nargs="+", default=[1000, 10000, 100000])
    p.add_argument("--rounds", type=int, nargs="+", default=[10])
    p.add_argument("--fraction", type=float, default=0.1, help="clients selected per round")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = p.parse_args()
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.* is deprecated")  # from fvcore
    print(f"{'clients':>8}{'rounds':>8}{'client-rounds':>15}{'prepare s':>11}{'run s':>9}"
          f"{'total s':>9}{'c-r/s run':>11}{'c-r/s total':>13}")
    for clients in args.clients:
        for rounds in args.rounds:
            r = plan(args.scenario, clients, rounds, args.fraction, args.overrides)
            print(f"{clients:>8}{rounds:>8}{r['client_rounds']:>15}{r['prepare_s']:>11.2f}{r['run_s']:>9.2f}"
                  f"{r['total_s']:>9.2f}{r['run_rate']:>11.0f}{r['total_rate']:>13.0f}", flush=True)


if __name__ == "__main__":
    main()
