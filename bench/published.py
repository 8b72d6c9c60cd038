"""edgefl's step times against published training measurements (issues 36, 51), judged on devices
the fit has never seen.

Every row of device_profiles/evidence/measurements.csv (its quotes in quotes.md) that the table marks
`use = fit` is priced by the compute model (edgefl.price: its torchvision or timm model, batch,
input, classes and precision, with its source's optimizer, or none where the source timed forward
and backward alone) on its bundled profile's datasheet peak and bandwidth, and compared with its
measured seconds per step. The fit (edgefl.calibration.fit) shares its figures by architecture,
core or GPU family, framework and device. The headline is **leave-one-device-out**: each device
predicted by the fit of every other device, whose ridge is chosen by cross-validation on those
devices alone (nested), as a user's own device would be; near-twins (rows of one device and one
architecture family: batch and width variants, two runs of one benchmark) count once in it, as
their geometric mean. Beside it: leave-one-group-out (a device's rows of one architecture family
left out together), leave-one-out, the class defaults with no fit (`prior`) and the in-sample fit.
Then every fitted figure with its range, and the rows kept apart with the reason.

    .venv/bin/python bench/published.py            # print
    .venv/bin/python bench/published.py --write    # and write each bundled profile's [fitted] table

Not a test: it prints its figures.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import math
import statistics
import sys
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgefl.calibration.fit import (  # noqa: E402
    BANDWIDTH,
    Fit,
    Priced,
    chosen_ridge,
    fit,
    left_out,
    model_family,
    priced,
)
from edgefl.calibration.profiles import write_fitted  # noqa: E402
from edgefl.devices.catalog import load_catalog  # noqa: E402
from edgefl.devices.profile import BANDWIDTH_FLOOR  # noqa: E402
from edgefl.price import atoms_of, step_for  # noqa: E402

TABLE = ROOT / "device_profiles" / "evidence" / "measurements.csv"
TRAINING = ("train_step", "epoch", "images_per_s_train")
SLOTS_OF = {"adamw": "adam", "rmsprop": "momentum", "unknown": "momentum", "": "momentum", "none": "sgd"}


def framework(text: str) -> str:
    """The framework a row's `framework` column names, as the fit keys it."""
    low = text.lower()
    return next((f for f in ("mnn", "tensorflow", "tflite", "torch7") if f in low), "pytorch")


def priced_rows(rows: list[dict[str, str]]) -> dict[str, Priced]:
    """Each priceable row, priced on its bundled profile (every model profiled once): its source's
    optimizer (unknown: momentum, the commonest), no optimizer step where it timed none."""
    devices, atoms, out = load_catalog().devices, {}, {}
    for r in rows:
        if not (r["price_model"] and r["profile"] and r["batch"].isdigit() and r["seconds_per_step"]
                and devices[r["profile"]].peak(r["price_precision"])):
            continue
        optimizer = r.get("optimizer", "")
        step = step_for(r["price_model"], int(r["batch"]), r["input"].split(" ")[0], int(r["classes"]),
                        optimizer=SLOTS_OF.get(optimizer, optimizer), precision=r["price_precision"])
        k = (step.model, step.input_shape, step.classes)
        if k not in atoms:
            atoms[k] = atoms_of(step)
        out[r["id"]] = priced(r["id"], r["hardware_kind"], float(r["seconds_per_step"]), step, atoms[k],
                              devices[r["profile"]], framework(r["framework"]), optimizer != "none")
    return out


def twins(ratios: dict[str, float], rows: list[Priced]) -> list[float]:
    """The ratios with near-twins (one device, one architecture family) as one geometric mean."""
    groups: dict[str, list[float]] = defaultdict(list)
    for p in rows:
        groups[f"{p.device}/{model_family(p.model)}"].append(math.log(ratios[p.id]))
    return [math.exp(statistics.fmean(xs)) for xs in groups.values()]


def summary(label: str, ratios: list[float]) -> str:
    logs = [abs(math.log2(x)) for x in ratios]
    return (f"{label:<44}{len(ratios):>4}  median |log2| {statistics.median(logs):.2f}  "
            f"within 1.5x {sum(x <= math.log2(1.5) for x in logs) / len(logs):>5.0%}  "
            f"within 2x {sum(x <= 1 for x in logs) / len(logs):>5.0%}  worst {2 ** max(logs):.2f}x")


def judged(name: str, predicted: dict[str, float], fitted: list[Priced]) -> list[str]:
    """A way of predicting: over near-twin groups (the headline's count), over rows, per kind."""
    ratio = {p.id: predicted[p.id] / p.seconds for p in fitted}
    out = [summary(f"{name}, near-twins once (groups)", twins(ratio, fitted)),
           summary(f"{name}, every row", list(ratio.values()))]
    for kind in sorted({p.group for p in fitted}):
        mine = [p for p in fitted if p.group == kind]
        out.append(summary(f"  {kind} (groups)", twins(ratio, mine)))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write each bundled profile's [fitted] table")
    args = ap.parse_args()
    rows = list(csv.DictReader(TABLE.open(encoding="utf-8")))
    priced_by_id = priced_rows(rows)
    fitted = [priced_by_id[r["id"]] for r in rows if r["use"] == "fit"]
    ridge = chosen_ridge(fitted)
    whole, none = fit(fitted, ridge), Fit({})
    names = {"leave-one-device-out": "device", "leave-one-group-out": "group", "leave-one-out": "id"}
    with ProcessPoolExecutor(2) as pool:  # each way's fits apart, on two cores
        done = {name: pool.submit(left_out, fitted, by) for name, by in names.items()}
        ways = {name: job.result() for name, job in done.items()}
    by_id = {r["id"]: r for r in rows}
    print(f"{'id':<6}{'profile':<19}{'model':<26}{'batch':>5}{'measured s':>11}{'prior':>7}{'LODO':>7}"
          f"{'LOGO':>7}{'LOO':>7}{'in-sample':>10}   (predicted / measured)")
    for p in fitted:
        r = by_id[p.id]
        print(f"{p.id:<6}{p.device:<19}{r['price_model'].split(':')[-1] + ' ' + r['price_precision']:<26}"
              f"{r['batch']:>5}{p.seconds:>11.4g}{none.predict(p) / p.seconds:>7.2f}"
              + "".join(f"{w[p.id] / p.seconds:>7.2f}" for w in ways.values())
              + f"{whole.predict(p) / p.seconds:>10.2f}")
    print("\nJudged out of sample (each prediction by a fit, and a ridge, that never saw the row):")
    for name, predicted in ways.items():
        print("\n".join(judged(name, predicted, fitted)))
    print("Beside, not judged:")
    print(summary("class defaults, no fit (prior), every row", [none.predict(p) / p.seconds for p in fitted]))
    print(summary("in-sample, every row", [whole.predict(p) / p.seconds for p in fitted]))
    print(f"\nThe whole table's fit (ridge {ridge}, chosen by {len(fitted)} rows' cross-validation over "
          "devices): shares of peak, of the bandwidth the memory-bound kinds stream (mem:), the sustained "
          "share of the datasheet bandwidth, the per-operator overhead:")
    shares, bands, overheads = [], [], []
    for p in {p.device: p for p in fitted}.values():
        keys = sorted({k for k in (*p.keys, *p.mkeys) if k})
        shares += [whole.share(p, k) for k in keys]
        bands.append(whole.share(p, BANDWIDTH))
        overheads.append(whole.overhead_us(p))
        print(f"  {p.device:<19}{p.family or p.arch:<17}"
              + ", ".join(f"{k} {whole.share(p, k):.3g}" for k in keys)
              + f"; bandwidth {bands[-1]:.2f} x {p.bandwidth_gbps:g} GB/s; overhead {overheads[-1]:.3g} us")
    print(f"Ranges: {len(shares)} shares in [{min(shares):.3g}, {max(shares):.3g}] (must be in (0, 1]); "
          f"bandwidth shares in [{min(bands):.3g}, {max(bands):.3g}] (must be in [{BANDWIDTH_FLOOR}, 1]); "
          f"overheads in [{min(overheads):.3g}, {max(overheads):.3g}] us (must be > 0): "
          + ("all inside" if min(shares) > 0 and max(shares) <= 1 and min(bands) >= BANDWIDTH_FLOOR
             and max(bands) <= 1 and min(overheads) > 0 else "NOT ALL INSIDE"))
    apart = [r for r in rows if r["use"] != "fit"]
    training = [r for r in apart if r["timed"] in TRAINING]
    print(f"\nKept apart: {len(training)} training rows and {len(apart) - len(training)} others (forward "
          f"passes, energy; every row stays in the table):")
    for r in training:
        p = priced_by_id.get(r["id"])
        seen = f"in-sample fit {whole.predict(p) / p.seconds:.2f}" if p else "not priced"
        print(f"  {r['id']:<6}{r['device'][:30]:<31}{r['model'][:24]:<25}{seen:<22}{r['use']}")
    if args.write:
        stamp = f"bench/published.py on {TABLE.name}, {datetime.date.today().isoformat()}"
        for path in write_fitted(whole, fitted, ways["leave-one-device-out"], stamp):
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
