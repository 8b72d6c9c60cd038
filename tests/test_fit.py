"""Per-kind efficiencies fitted on step timings (issue 36: edgefl.calibration.fit, `edgefl devices
fit`): the prediction by hand, a known efficiency recovered from timings priced with it, and
leave-one-out predictions that never see their own row."""

from __future__ import annotations

import csv
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from support import one_error_line

from edgefl.calibration.fit import (
    BANDWIDTH,
    OVERHEAD,
    RIDGES,
    Fit,
    Priced,
    chosen_ridge,
    device_bandwidth_gbps,
    device_efficiencies,
    fit,
    leave_one_out,
    priced,
)
from edgefl.cli import main
from edgefl.devices.catalog import load_catalog, load_profile
from edgefl.devices.profile import DeviceProfile, Efficiencies
from edgefl.models import build_model
from edgefl.price import Step, price
from edgefl.profiling import profile_model


def test_a_prediction_by_hand():
    p = Priced("r", "dev", "sbc", 1.0, ("conv3x3", ""), np.array([2.0, 1.0]), np.array([1.0, 3.0]),
               np.array([0.5, 0.5]), prior=0.5, class_prior=0.5, overhead_us=10.0, bandwidth_gbps=4.0)
    # conv3x3 at 0.25 of peak: max(2 / 0.25, 1) + 0.5; the fixed operator: max(1, 3) + 0.5
    assert Fit({("sbc", "conv3x3"): math.log(0.25)}, {}).predict(p) == pytest.approx(8.5 + 3.5)
    # nothing fitted: the profile's own 0.5; the overhead doubled
    assert Fit({}, {("dev", OVERHEAD): math.log(2.0)}).predict(p) == pytest.approx(4 + 1 + 3 + 1)
    # a third of the bandwidth: max(2 / 0.5, 3) + 0.5 and max(1, 9) + 0.5
    assert Fit({("sbc", BANDWIDTH): math.log(1 / 3)}, {}).predict(p) == pytest.approx(4.5 + 9.5)


SMALL = {name: profile_model(build_model(name, 10, (3, 32, 32), [0.5] * 3, [0.25] * 3), name).atoms
         for name in ("smallcnn", "vgg11")}
PI = load_catalog().devices["raspberry_pi_5"]  # class sbc: efficiency 0.3 where it gives none
TRUE = replace(PI, efficiency_by_kind=Efficiencies(conv3x3=0.12))


def timings() -> list[tuple[str, Step]]:
    return [(f"{m}-{b}", Step(m, b, (3, 32, 32), 10)) for m in SMALL for b in (4, 32, 128)]


def test_a_known_efficiency_is_recovered_from_timings_priced_with_it():
    rows = [priced(i, "sbc", price(s, SMALL[s.model], TRUE).seconds, s, SMALL[s.model], PI)
            for i, s in timings()]
    f = fit(rows)
    # the ridge pulls toward the class's 0.3 a little; the timings pull to 0.12
    assert f.efficiency(rows[0], "conv3x3") == pytest.approx(0.12, rel=0.1)
    for p in rows:
        assert f.predict(p) == pytest.approx(p.seconds, rel=0.05)
    as_bundled = price(timings()[0][1], SMALL["smallcnn"], PI).seconds
    assert Fit({}, {}).predict(rows[0]) == pytest.approx(as_bundled)


def test_a_known_bandwidth_is_recovered_from_timings_priced_with_it():
    """A datasheet's peak bandwidth is more than training kernels move: timings of a device moving a
    tenth of it say so."""
    slow = replace(TRUE, memory_bandwidth_gbps=PI.memory_bandwidth_gbps / 10)
    rows = [priced(i, "sbc", price(s, SMALL[s.model], slow).seconds, s, SMALL[s.model], PI)
            for i, s in timings()]
    f = fit(rows, min(RIDGES))
    assert device_bandwidth_gbps(f, rows[0]) == pytest.approx(slow.memory_bandwidth_gbps, rel=0.15)
    assert f.efficiency(rows[0], "conv3x3") == pytest.approx(0.12, rel=0.15)


def test_leave_one_out_never_sees_the_row_it_predicts():
    rows = [priced(i, "sbc", price(s, SMALL[s.model], TRUE).seconds, s, SMALL[s.model], PI)
            for i, s in timings()]
    before = leave_one_out(rows)
    moved = [replace(rows[0], seconds=rows[0].seconds * 10), *rows[1:]]
    after = leave_one_out(moved)
    assert after[rows[0].id] == pytest.approx(before[rows[0].id])  # its own time left out
    assert after[rows[1].id] != pytest.approx(before[rows[1].id])  # the others' fits saw it


def test_the_ridge_is_chosen_by_how_well_it_predicts_rows_it_did_not_fit():
    """Timings priced at 0.12 of peak, far from the class's 0.3: rows held out are best predicted by
    the weakest pull toward the class, which also lands nearer the truth."""
    far = [priced(i, "sbc", price(s, SMALL[s.model], TRUE).seconds, s, SMALL[s.model], PI)
           for i, s in timings()]
    assert chosen_ridge(far) == min(RIDGES)
    weak, strong = fit(far, min(RIDGES)), fit(far, max(RIDGES))
    assert abs(math.log(weak.efficiency(far[0], "conv3x3") / 0.12)) < abs(
        math.log(strong.efficiency(far[0], "conv3x3") / 0.12))


def test_a_tf32_device_fits_its_dense_convolutions_apart_and_writes_them_as_its_fp32_efficiency():
    ampere = replace(PI, device_class="gpu", tf32_gflops=8 * PI.compute_gflops)
    true = replace(ampere, efficiency_by_kind=Efficiencies(conv3x3=0.2))
    rows = [priced(i, "gpu", price(s, SMALL[s.model], true).seconds, s, SMALL[s.model], ampere)
            for i, s in timings()]
    assert {k for p in rows for k in p.keys} >= {"conv3x3@tf32", "linear"}
    assert "conv3x3" not in {k for p in rows for k in p.keys}
    assert device_efficiencies(fit(rows, min(RIDGES)), rows[0])["conv3x3"] == pytest.approx(0.2, rel=0.15)


def test_leave_one_device_out_never_sees_the_device_it_predicts():
    rows = [priced(i, "sbc", price(s, SMALL[s.model], TRUE).seconds, s, SMALL[s.model], PI)
            for i, s in timings()]
    rows = [replace(p, device="other") if p.id.startswith("vgg11") else p for p in rows]
    before = leave_one_out(rows, by="device")
    slower = [replace(p, seconds=p.seconds * 10) if p.device == "other" else p for p in rows]
    after = leave_one_out(slower, by="device")
    for p in rows:  # the other device's rows moved: only the predictions of PI's rows see it
        assert (after[p.id] == pytest.approx(before[p.id])) == (p.device == "other")


def write_rows(path: Path, device: str) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, ["id", "profile", "price_model", "input", "classes", "batch",
                               "seconds_per_step"])
        w.writeheader()
        for i, s in timings():
            w.writerow({"id": i, "profile": device, "price_model": s.model, "input": "3,32,32", "classes": 10,
                        "batch": s.batch, "seconds_per_step": price(s, SMALL[s.model], TRUE).seconds})


def test_devices_fit_writes_a_profile_with_the_fitted_efficiencies(tmp_path, capsys):
    table, out = tmp_path / "mine.csv", tmp_path / "profiles" / "my_pi.toml"
    write_rows(table, "raspberry_pi_5")
    out.parent.mkdir()
    assert main(["devices", "fit", str(table), "--device", "raspberry_pi_5", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "leave-one-out median |log2 ratio| " in printed and f"-> {out}" in printed
    fitted = load_profile(out, DeviceProfile)
    assert fitted.name == "my_pi" and fitted.compute_gflops == PI.compute_gflops
    assert fitted.efficiency_by_kind.conv3x3 == pytest.approx(0.12, rel=0.1)
    assert fitted.memory_bandwidth_gbps == pytest.approx(PI.memory_bandwidth_gbps, rel=0.1)
    assert "edgefl devices fit on mine.csv: 6 rows" in fitted.efficiency_by_kind.source
    step = timings()[4][1]  # what the fitted profile charges is what the timings said
    assert price(step, SMALL[step.model], fitted).seconds == pytest.approx(
        price(step, SMALL[step.model], TRUE).seconds, rel=0.05)


def test_devices_fit_refuses_a_calibrated_profile(tmp_path, capsys):
    table = tmp_path / "mine.csv"
    write_rows(table, "dev_vm")
    assert main(["devices", "fit", str(table), "--device", "dev_vm", "--out", str(tmp_path / "x.toml")]) == 2
    assert "dev_vm: kernels: a calibrated profile's [kernels] set" in one_error_line(capsys.readouterr().err)


@pytest.mark.parametrize(("content", "says"), [
    ("id,profile,price_model,batch\nr,raspberry_pi_5,smallcnn,8\n", "seconds_per_step: missing column"),
    ("profile,price_model,batch,seconds_per_step\ntx2,smallcnn,8,1.0\n", "raspberry_pi_5: no row measures"),
    ("profile,price_model,batch,seconds_per_step\nraspberry_pi_5,smallcnn,8,-1\n", "row 2: needs a whole"),
    ("profile,price_model,batch,seconds_per_step\nraspberry_pi_5,nomodel,8,1\n", "nomodel: no such model"),
    ("profile,price_model,batch,classes,seconds_per_step\nraspberry_pi_5,smallcnn,8,ten,1\n",
     "row 2: needs a whole"),
])
def test_devices_fit_refuses_what_it_cannot_fit_in_one_line(tmp_path, capsys, content, says):
    table = tmp_path / "bad.csv"
    table.write_text(content)
    out = tmp_path / "fitted.toml"
    assert main(["devices", "fit", str(table), "--device", "raspberry_pi_5", "--out", str(out)]) == 2
    assert says in one_error_line(capsys.readouterr().err)
    assert not out.exists()
