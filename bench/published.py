"""edgefl's step times against published training measurements (issue 36), judged out of sample.

Every row of device_profiles/evidence/measurements.csv (its quotes in quotes.md) is printed. A row
the table marks `use = fit` is priced by the compute model (edgefl.price: its torchvision or timm
model, batch, input, classes and precision, SGD with momentum, on its bundled profile) and compared
with its measured seconds per step. The fit (edgefl.calibration.fit) sets per-kind efficiencies
(conv, conv3x3, dwconv, linear; fp16 and TF32 apart), a bandwidth and an overhead factor for each
kind of hardware, and each device's deviation from them; a row's prediction is made
**leave-one-out**: the fit that predicts it never saw it (a device with one row is predicted by its
group's figures alone), nor did the choice of that fit's ridge (how far the rows may pull a kind of
hardware from its class defaults: chosen_ridge, by cross-validation on the other rows alone). The
leave-one-out figures at each fixed ridge are printed beside: a ridge picked from them would have
seen the rows it is judged on. The raw prediction (the profile as bundled, no fit), the in-sample
fit and leave-one-device-out (each device predicted by the other devices of its kind, as a device
the table does not hold would be) are shown beside, never instead. Rows kept apart (another
framework, a fine-tuning run, a relative figure, ...) are listed with the reason, priced raw where
they can be. Not a test: it prints its figures.

    .venv/bin/python bench/published.py
"""

from __future__ import annotations

import csv
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from edgefl.calibration.fit import RIDGES, Fit, Priced, chosen_ridges, fit, leave_one_out, priced  # noqa: E402
from edgefl.devices.catalog import load_catalog  # noqa: E402
from edgefl.price import atoms_of, step_for  # noqa: E402

TABLE = ROOT / "device_profiles" / "evidence" / "measurements.csv"
TRAINING = ("train_step", "epoch", "images_per_s_train")


def priced_rows(rows: list[dict[str, str]]) -> dict[str, Priced]:
    """Each priceable row, priced on its bundled profile (every model profiled once)."""
    devices, atoms, out = load_catalog().devices, {}, {}
    for r in rows:
        if not (r["price_model"] and r["profile"] and r["batch"].isdigit() and r["seconds_per_step"]
                and devices[r["profile"]].peak(r["price_precision"])):
            continue
        step = step_for(r["price_model"], int(r["batch"]), r["input"].split(" ")[0], int(r["classes"]),
                        optimizer="momentum", precision=r["price_precision"])
        k = (step.model, step.input_shape, step.classes)
        if k not in atoms:
            atoms[k] = atoms_of(step)
        out[r["id"]] = priced(r["id"], r["hardware_kind"], float(r["seconds_per_step"]), step, atoms[k],
                              devices[r["profile"]])
    return out


def summary(label: str, ratios: list[float]) -> str:
    logs = [abs(math.log2(x)) for x in ratios]
    return (f"{label:<38}{len(ratios):>4} rows  median |log2| {statistics.median(logs):.2f}  "
            f"within 1.5x {sum(x <= math.log2(1.5) for x in logs) / len(logs):>5.0%}  "
            f"within 2x {sum(x <= 1 for x in logs) / len(logs):>5.0%}  worst {2 ** max(logs):.2f}x")


def main() -> int:
    rows = list(csv.DictReader(TABLE.open(encoding="utf-8")))
    priced_by_id = priced_rows(rows)
    fitted = [priced_by_id[r["id"]] for r in rows if r["use"] == "fit"]
    ridges = chosen_ridges(fitted)
    loo, whole, raw = leave_one_out(fitted), fit(fitted, ridges), Fit({}, {})
    by_id = {r["id"]: r for r in rows}
    print(f"{'id':<6}{'profile':<19}{'model':<26}{'batch':>5}{'measured s':>11}{'raw':>7}{'LOO':>7}"
          f"{'in-sample':>10}   (predicted / measured)")
    by_kind: dict[str, list[float]] = defaultdict(list)
    for p in fitted:
        r = by_id[p.id]
        by_kind[p.group].append(loo[p.id] / p.seconds)
        print(f"{p.id:<6}{p.device:<19}{r['price_model'].split(':')[-1] + ' ' + r['price_precision']:<26}"
              f"{r['batch']:>5}{p.seconds:>11.4g}{raw.predict(p) / p.seconds:>7.2f}"
              f"{loo[p.id] / p.seconds:>7.2f}{whole.predict(p) / p.seconds:>10.2f}")
    print("\nLeave-one-out (the row's own measurement left out of the fit that predicts it, and of the "
          "choice of that fit's ridge):")
    print(summary("all training rows", [x for xs in by_kind.values() for x in xs]))
    for kind, xs in sorted(by_kind.items()):
        print(summary(f"  {kind}", xs))
    by_device = leave_one_out(fitted, by="device")  # a device the table does not hold
    print(summary("leave-one-device-out (beside)", [by_device[p.id] / p.seconds for p in fitted]))
    for kind in sorted(by_kind):
        print(summary(f"  {kind}", [by_device[p.id] / p.seconds for p in fitted if p.group == kind]))
    print(summary("raw profiles, no fit", [raw.predict(p) / p.seconds for p in fitted]))
    print(summary("in-sample (beside, not judged)", [whole.predict(p) / p.seconds for p in fitted]))
    for r in RIDGES:  # a ridge fixed after seeing these rows: optimistic, beside
        fixed = leave_one_out(fitted, r)
        print(summary(f"leave-one-out at a fixed ridge {r}", [fixed[p.id] / p.seconds for p in fitted]))
    print("\nRidges chosen on the whole table: " + ", ".join(f"{g} {r}" for g, r in ridges.items()))
    print("Fitted efficiencies (share of peak; the whole table), by kind of hardware and by device:")
    for (group, k), v in sorted(whole.group.items()):
        print(f"  {group:<14}{k:<14}{math.exp(v):>7.3f}")
    for p in {p.device: p for p in fitted}.values():
        mine = ", ".join(f"{k} {whole.efficiency(p, k):.3f}" for k in sorted({k for k in p.keys if k}))
        print(f"  {p.device:<19}{mine}")
    apart = [r for r in rows if r["use"] != "fit"]
    training = [r for r in apart if r["timed"] in TRAINING]
    print(f"\nKept apart: {len(training)} training rows and {len(apart) - len(training)} others (forward "
          f"passes, energy; every row stays in the table):")
    for r in training:
        p = priced_by_id.get(r["id"])
        seen = f"raw {raw.predict(p) / p.seconds:.2f}" if p else "not priced"
        print(f"  {r['id']:<6}{r['device'][:30]:<31}{r['model'][:24]:<25}{seen:<12}{r['use']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
