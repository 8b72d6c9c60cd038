"""Shared server links at scale (issue 15): seconds `edgefl.sim.links.finish_times` takes to play
n transfers on one link by processor sharing, all starting together and staggered over 100 s.

Transfers of 1-20 MB at 1-100 Mbit/s each on a 1 Gbit/s server link, seeded; the best of
--repeats runs counts. Figures only: nothing is asserted.

    .venv/bin/python bench/links.py [--sizes 10000 100000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from edgefl.sim.links import finish_times

MB, MBIT = 1e6, 1e6 / 8


def seconds(start: np.ndarray, nbytes: np.ndarray, caps: np.ndarray, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        finish_times(start, nbytes, caps, 1000 * MBIT)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"{'transfers':>10} {'together s':>11} {'staggered s':>12}")
    for n in args.sizes:
        nbytes, caps = rng.uniform(1, 20, n) * MB, rng.uniform(1, 100, n) * MBIT
        together = seconds(np.zeros(n), nbytes, caps, args.repeats)
        staggered = seconds(np.sort(rng.uniform(0, 100, n)), nbytes, caps, args.repeats)
        print(f"{n:>10} {together:>11.2f} {staggered:>12.2f}")


if __name__ == "__main__":
    main()
