"""Host calibration: the median of repeats, the written profile, and `edgefl devices calibrate`."""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support import one_error_line

from edgefl.calibration.calibrate import (
    QUICK,
    Calibration,
    Compute,
    Storage,
    measure_flops,
    measure_storage,
    median_time,
    per_call,
    render_profile,
    write_profile,
)
from edgefl.calibration.kernels import Sample, fit_one
from edgefl.cli import main
from edgefl.devices import catalog
from edgefl.devices.catalog import load_profile
from edgefl.devices.profile import MAX_FIGURE, DeviceProfile
from edgefl.errors import EdgeflError
from edgefl.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
CALIBRATION = Calibration(
    memory_mb=16000.0,
    compute=Compute(matmul_gflops=123.456, conv_gflops=98.7),
    storage=Storage(read_mbps=2500.04, write_mbps=0.0123456, read_latency_ms=0.1, write_latency_ms=2.0,
                    direct=False),
)


def fake_clock(ticks: list[float]) -> Iterator[float]:
    return iter(ticks)


def test_median_time_of_odd_repeats() -> None:
    # start/stop pairs (0, 3), (10, 11), (20, 22): durations 3, 1, 2 -> sorted 1, 2, 3 -> median 2
    clock = fake_clock([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])
    calls: list[int] = []
    assert median_time(lambda: calls.append(1), 3, lambda: next(clock)) == 2.0
    assert len(calls) == 3


def test_median_time_of_even_repeats() -> None:
    # durations 1 and 4: the median of an even count is the mean of the middle two, (1 + 4) / 2
    clock = fake_clock([0.0, 1.0, 5.0, 9.0])
    assert median_time(lambda: None, 2, lambda: next(clock)) == 2.5


def test_per_call_times_batches_sized_by_the_fastest_probe() -> None:
    """A kernel of 1 ms whose first call is held up 16 ms (a thread woken late): the probes' fastest
    is 1 ms, so batches of ceil(0.02 / 0.001) = 20 calls are timed, and two batches of 20 ms and 24 ms
    (one holds a 5 ms hold-up) have the median 22 ms, 1.1 ms a call; one call timed alone read 16 ms."""
    durations = iter([0.016, 0.001, 0.001] + [0.001] * 19 + [0.005] + [0.001] * 20)
    now = [0.0]

    def kernel() -> None:
        now[0] += next(durations)

    assert per_call(kernel, 2, lambda: now[0]) == pytest.approx(0.0011)
    assert next(durations, None) is None  # 3 probes and 2 batches of 20 calls


def test_peak_compute_and_mean_latency() -> None:
    assert CALIBRATION.compute.peak_gflops == 123.456  # max(123.456, 98.7)
    assert CALIBRATION.storage.latency_ms == pytest.approx(1.05)  # (0.1 + 2.0) / 2


def test_profile_round_trips_through_load_profile(tmp_path: Path) -> None:
    path = tmp_path / "my_host.toml"
    written = write_profile(path, render_profile("my_host", "host", CALIBRATION))
    loaded = load_profile(path, DeviceProfile)
    assert written == loaded
    # four significant digits: 123.456 -> 123.5, 2500.04 -> 2500.0, a tiny 0.0123456 -> 0.01235 (not 0)
    assert (loaded.name, loaded.pools, loaded.memory_mb) == ("my_host", ["host"], 16000.0)
    assert loaded.compute_gflops == 123.5
    assert (loaded.storage_read_mb_s, loaded.storage_write_mb_s) == (2500.0, 0.01235)
    assert loaded.storage_latency_ms == 1.05
    assert [p.name for p in tmp_path.iterdir()] == ["my_host.toml"]  # no staging folder left


def test_profile_joins_the_catalog_and_a_scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "device_profiles"  # beside the scenario: found with no copying
    root.mkdir()
    write_profile(root / "my_host.toml", render_profile("my_host", "host", CALIBRATION))
    shutil.copy(ROOT / "scenarios" / "quickstart.toml", tmp_path / "mine.toml")
    cat = catalog.catalog_for(tmp_path / "mine.toml")
    assert [d.name for d in cat.pool("host")] == ["my_host"]
    assert cat.file("devices", "my_host") == (root / "my_host.toml").resolve()
    s = load_scenario(tmp_path / "mine.toml", ['fleet.devices = ["my_host"]'])
    assert s.fleet.devices == ["my_host"]
    with pytest.raises(EdgeflError) as info:  # the bundled quickstart does not see it
        load_scenario(ROOT / "scenarios" / "quickstart.toml", ['fleet.devices = ["my_host"]'])
    assert info.value.key == "fleet.devices"


def test_measurements_are_positive_and_leave_no_file(tmp_path: Path) -> None:
    compute = measure_flops(QUICK, repeats=2)
    assert compute.matmul_gflops > 0 and compute.conv_gflops > 0
    storage = measure_storage(tmp_path, QUICK, repeats=2)
    assert min(storage.read_mbps, storage.write_mbps) > 0
    assert min(storage.read_latency_ms, storage.write_latency_ms) > 0
    assert list(tmp_path.iterdir()) == []


def test_storage_without_o_direct_syncs_each_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "O_DIRECT", raising=False)  # as on macOS
    storage = measure_storage(tmp_path, QUICK, repeats=1)
    assert not storage.direct
    assert min(storage.read_latency_ms, storage.write_latency_ms) > 0
    assert list(tmp_path.iterdir()) == []
    text = render_profile("h", "host", dataclasses.replace(CALIBRATION, storage=storage))
    assert "and write + fsync" in text


@pytest.mark.slow
def test_cli_calibrate_writes_a_valid_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "tmp" / "x.toml"
    assert main(["devices", "calibrate", "--quick", "--repeats", "2", "--out", str(out)]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "GFLOP/s" in printed and str(out) in printed
    assert captured.err.startswith("edgefl: warning: --quick") and captured.err.count("\n") == 1  # rough
    assert f"export EDGEFL_PROFILE_PATH={out.parent.resolve()}" in printed  # how a scenario finds it
    assert main(["devices", "validate", str(out)]) == 0
    assert capsys.readouterr().out.startswith(f"{out}: ok (x:")
    assert [p.name for p in out.parent.iterdir()] == ["x.toml"]


def test_cli_calibrate_refuses_to_overwrite(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.toml"
    out.write_text("keep me")
    assert main(["devices", "calibrate", "--quick", "--out", str(out)]) == 2
    assert "--overwrite" in one_error_line(capsys.readouterr().err)
    assert out.read_text() == "keep me"
    assert main(["devices", "calibrate", "--quick", "--out", str(out), "--overwrite"]) == 2  # not a profile
    assert "not one" in one_error_line(capsys.readouterr().err) and out.read_text() == "keep me"
    out.write_text('name = "x"\nmemory_mb = 1.0\ncompute_gflops = 1.0\n')  # an older calibration
    assert main(["devices", "calibrate", "--quick", "--repeats", "1", "--out", str(out), "--overwrite"]) == 0
    assert load_profile(out, DeviceProfile).name == "x"


@pytest.mark.parametrize(("flag", "value"), [("--repeats", "0"), ("--threads", "-1"), ("--threads", "1025"),
                                           ("--threads", "1099511627776")])
def test_cli_calibrate_bad_counts(flag: str, value: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "mine" / "x.toml"
    assert main(["devices", "calibrate", "--quick", "--out", str(out), flag, value]) == 2
    assert f": {flag}: " in one_error_line(capsys.readouterr().err)
    assert not out.parent.exists()  # refused before its folder is made


def test_cli_calibrate_unwritable_folder_is_one_line(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["devices", "calibrate", "--quick", "--out", str(blocker / "x.toml")]) == 2
    assert ": --out: " in one_error_line(capsys.readouterr().err)


def test_cli_calibrate_needs_a_toml_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "calibrate", "--quick", "--out", str(tmp_path / "x.txt")]) == 2
    assert ".toml" in one_error_line(capsys.readouterr().err)


def test_a_fit_whose_bytes_explain_no_time_keeps_its_bandwidth_within_a_profiles_figures() -> None:
    """Times that fall as the bytes grow (timing noise on tiny shapes): no bandwidth explains them,
    so the fit is all overhead, the geometric mean of the times in log least squares, (4 x 3 x 2
    x 1)^(1/4) = 2.213 us; unbounded, the fitted bandwidth ran to 1.9e20 B/s (1.9e11 GB/s, which
    a profile refuses); it stops at MAX_FIGURE GB/s."""
    times = {1: 4e-6, 2: 3e-6, 4: 2e-6, 8: 1e-6}
    samples = [Sample("norm", "forward", 1e3 * k, 1e4 * k, 1, t) for k, t in times.items()]
    roof = fit_one(samples, flops=1e15)  # compute explains nothing either
    assert roof.bandwidth <= MAX_FIGURE * 1e9
    assert roof.overhead_s == pytest.approx(24 ** 0.25 * 1e-6, rel=1e-3)


def test_a_profile_with_an_absurd_kernel_figure_is_refused(tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    phone = tmp_path / "phone.toml"
    text = (ROOT / "device_profiles" / "pixel_4a.toml").read_text()
    text = text.replace('name = "pixel_4a"', 'name = "phone"')
    phone.write_text(text + "\n[kernels]\nconv = [[115.9, 1e300, 1e308]]\n")
    assert main(["devices", "validate", str(phone)]) == 2
    assert "kernels.conv" in capsys.readouterr().err


def test_the_fixed_costs_are_what_the_rooflines_leave_unpriced():
    """Timed: 0.2 s for 100 plain iterations, 0.7 s with 5 PGD steps, 3 ms a client-round's set-up;
    rooflines that price nothing leave 2 ms per iteration, (7 - 2) / 5 = 1 ms per PGD step, 3 ms per
    round; rooflines that charge a second per operator leave nothing (never below 0)."""
    import math

    from edgefl.calibration.fixed import ITERS, measure_fixed
    from edgefl.sim.compute import Rooflines

    def timer() -> Callable[[Callable[[], object]], float]:
        times = iter([0.2, 0.7, 0.003])
        return lambda fn: next(times)

    assert ITERS == 100
    free = measure_fixed(Rooflines.uniform(math.inf, math.inf, 0.0), timer())
    assert (free.iteration_us, free.attack_step_us, free.round_ms) == pytest.approx((2000.0, 1000.0, 3.0))
    dear = measure_fixed(Rooflines.uniform(math.inf, math.inf, 1.0), timer())
    assert (dear.iteration_us, dear.attack_step_us) == (0.0, 0.0)
