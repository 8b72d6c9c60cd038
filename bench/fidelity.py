"""Fidelity of the compute model: simulated vs measured PGD-10 adversarial training on this host.

For digits_cnn (scikit-learn digits, 1x8x8), cnn3, vgg11, resnet10 and vgg16 (the `synthetic`
dataset, 3x32x32) at two batch sizes each, one jFAT client trains for real through the method's own
`train` (edgefl's local loop: PGD-10, one SGD step per iteration), timed as `real_compute_s` is in a
run, and the walk accounting prices the same workload on the calibrated host profile with the idle
app (edgefl.sim.compute). Prints, per case, the simulated and the measured seconds per iteration
(median of the repeats, after one untimed warm-up call) and their ratio.

The host profile must be calibrated first, with the thread count the bench uses:
    edgefl devices calibrate --out device_profiles/my_host.toml --threads 1
    .venv/bin/python bench/fidelity.py --device my_host --threads 1
On a shared machine, time both on the process's CPU clock (add --cpu-time to each): other processes'
time is left out, and with one thread it equals wall time on an idle machine.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
import warnings
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = [("digits_cnn", "digits"), ("cnn3", "synthetic"), ("vgg11", "synthetic"),
         ("resnet10", "synthetic"), ("vgg16", "synthetic"), ("mobilenet_v2", "synthetic"),
         ("smallcnn", "digits")]


def case(model: str, dataset: str, batch: int, device: str, threads: int, repeats: int,
         min_seconds: float, clock: Callable[[], float]) -> tuple[float, float, int]:
    """(simulated, measured) seconds per iteration and the iterations each timed call ran."""
    from dataclasses import replace

    from edgefl.executors.executor import train_timed
    from edgefl.experiment import prepare
    from edgefl.scenario import load_scenario
    from edgefl.sim.cost import walk_compute_seconds

    s = load_scenario(ROOT / "scenarios" / "quickstart.toml", [
        f'model.name = "{model}"', f'data.dataset = "{dataset}"', f"training.batch_size = {batch}",
        f'fleet.devices = ["{device}"]', 'fleet.apps = ["idle"]', "fleet.clients = 4",
        "data.synthetic_train = 2048", "data.synthetic_test = 16", f"threads = {threads}",
        "fleet.reserved_memory_mb = 4000",
        'method = "jfat"', "training.local_iters = 1"])
    exp = prepare(s, "bench/fidelity.py")
    state = exp.pool.state(0, 0)
    plan = exp.method.plan(0, 0, state)
    iters = max(1, math.ceil(min_seconds / walk_compute_seconds(plan.workload, state)))
    work = replace(plan, workload=replace(plan.workload, iterations=iters))
    simulated = walk_compute_seconds(work.workload, state) / iters
    train_timed(exp.method, 0, 0, work)  # warm-up
    measured = [train_timed(exp.method, r, 0, work, clock).real_compute_s / iters
                for r in range(1, repeats + 1)]
    return simulated, statistics.median(measured), iters


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", required=True, help="the calibrated host profile (in device_profiles/ or on "
                    "EDGEFL_PROFILE_PATH)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (as the profile was calibrated)")
    ap.add_argument("--batches", type=int, nargs=2, default=[32, 64])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--min-seconds", type=float, default=2.0, help="simulated seconds per timed call")
    ap.add_argument("--models", nargs="*", default=[m for m, _ in CASES])
    ap.add_argument("--cpu-time", action="store_true",
                    help="time on the process's CPU clock, as `edgefl devices calibrate --cpu-time`")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message=r".*torch\.jit\.script.* is deprecated")
    clock = time.process_time if args.cpu_time else time.perf_counter
    print(f"PGD-10 adversarial training, seconds per iteration, {args.threads} thread(s), device "
          f"{args.device}, {'process CPU' if args.cpu_time else 'wall'} time, median of {args.repeats}")
    print(f"{'model':<11}{'batch':>6}{'iters':>6}{'simulated':>11}{'measured':>10}{'sim/meas':>10}")
    for model, dataset in CASES:
        if model not in args.models:
            continue
        for batch in args.batches:
            sim, real, iters = case(model, dataset, batch, args.device, args.threads, args.repeats,
                                    args.min_seconds, clock)
            print(f"{model:<11}{batch:>6}{iters:>6}{sim:>11.4f}{real:>10.4f}{sim / real:>10.3f}", flush=True)


if __name__ == "__main__":
    main()
