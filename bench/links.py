"""Shared server links at scale (issue 15): seconds `edgefl.sim.links.shared_round` takes to play a
synchronous round of n clients on shared links by processor sharing: downloads all starting
together, uploads staggered over 100 s (as clients finish computing).

Transfers of 1-20 MB at 1-100 Mbit/s each on 1 Gbit/s server links, seeded; the best of --repeats
runs counts (the first call compiles the loop, and is not counted). Figures only: nothing is
asserted.

    .venv/bin/python bench/links.py [--sizes 10000 100000] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from edgefl.sim.links import Links, shared_round

MB, MBIT = 1e6, 1e6 / 8


def seconds(n: int, rng: np.random.Generator, repeats: int) -> float:
    """The best of `repeats` rounds of n clients: bytes and bandwidths drawn, the same down and up;
    the uploads ready 0-100 s into the round."""
    nbytes, caps, zero = rng.uniform(1, 20, n) * MB, rng.uniform(1, 100, n) * MBIT, np.zeros(n)
    phases = (zero, zero, rng.uniform(0, 100, n), zero)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        shared_round(Links(1000 * MBIT, 1000 * MBIT), phases, (nbytes, nbytes), (caps, caps), zero)
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    seconds(10, rng, 1)  # the loop compiled (or read from Numba's cache)
    print(f"{'clients':>10} {'round s':>8}")
    for n in args.sizes:
        print(f"{n:>10} {seconds(n, rng, args.repeats):>8.2f}")


if __name__ == "__main__":
    main()
