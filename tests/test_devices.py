"""Device, app and network profiles: the shipped files load and hold REFERENCE.md's numbers."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from support import device_text

from edgefl.devices.catalog import bundled, load_catalog, load_profile
from edgefl.devices.classes import perf_flops
from edgefl.devices.profile import AppProfile, DeviceProfile, NetworkProfile
from edgefl.errors import EdgeflError

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT / "device_profiles"

# REFERENCE.md, FedProphet's device pools: (peak FLOP/s, memory bytes, effective bandwidth B/s).
REF_DEVICES = {
    "gtx_1650m": (3.103e12, 4e9, 16e9),
    "tx2": (1.3e12, 4e9, 1.5e9),
    "kcu1500": (2e11, 2e9, 2e9),
    "vc709": (1.02e11, 2e9, 1.5e9),
    "radeon_hd_6870": (2.72e12, 1e9, 16e9),
    "quadro_m2200": (2.122e12, 4e9, 1.5e9),
    "a12_gpu": (4.88e11, 4e9, 1.5e9),
    "geforce_750": (1.11e12, 1e9, 16e9),
    "grid_k240q": (2.289e12, 1e9, 16e9),
    "radeon_rx_6300m": (3.686e12, 2e9, 16e9),
    "rx_7600": (21.75e12, 8e9, 16e9),
    "rx_6800": (16.17e12, 16e9, 16e9),
    "arc_a770": (19.66e12, 16e9, 16e9),
    "quadro_p5000": (5.304e12, 16e9, 1.5e9),
    "rtx_3080m": (18.98e12, 8e9, 16e9),
    "rtx_4090m": (32.98e12, 16e9, 16e9),
    "a17_gpu": (2.147e12, 8e9, 1.5e9),
    "p104_101": (8.617e12, 4e9, 16e9),
    "tesla_v100": (15.67e12, 32e9, 16e9),
    "rtx_4080m": (24.72e12, 12e9, 16e9),
    "rtx_3090": (35.58e12, 24e9, 16e9),
    "adreno_750": (4.730e12, 24e9, 1.5e9),
    "ryzen_9_3950": (1.038e12, 8e9, 16e9),
    "m2_gpu": (3.600e12, 24e9, 16e9),
}

REF_POOLS = {
    "low": {"gtx_1650m", "tx2", "kcu1500", "vc709", "radeon_hd_6870", "quadro_m2200", "a12_gpu",
            "geforce_750", "grid_k240q", "radeon_rx_6300m"},
    "mid": {"rx_7600", "rx_6800", "arc_a770", "quadro_p5000", "rtx_3080m", "rtx_4090m", "a17_gpu",
            "gtx_1650m", "tx2", "p104_101"},
    "high": {"tesla_v100", "rtx_4080m", "rtx_3090", "quadro_p5000", "rtx_3080m", "adreno_750",
             "ryzen_9_3950", "rtx_4090m", "m2_gpu", "a17_gpu"},
}

# REFERENCE.md, co-running apps: share of peak performance left for training.
REF_APPS = {
    "idle": 1.0,
    "video_1080p": 0.735,
    "video_4k": 0.459,
    "inference": 0.524,
    "object_detection": 0.167,
    "web_browsing": 0.231,
}

# REFERENCE.md, networks: up / down in Mbit/s, latency in ms.
REF_NETWORKS = {
    "dsl": ([1, 20], [3, 145], [11, 40]),
    "cable": ([1, 50], [25, 1000], [13, 27]),
    "4g": ([1, 30], [9, 60], [30, 50]),
    "5g": ([24, 58], [501, 635], [4, 10]),
    "wifi": ([1, 50], [25, 300], [10, 50]),
    "fiber": ([250, 1000], [30, 5000], [10, 12]),
    "satellite": ([3, 5], [12, 350], [594, 624]),
}


def test_bundled_profiles_are_the_repository_folder() -> None:
    assert bundled("device_profiles").resolve() == PROFILES.resolve()


@pytest.mark.parametrize("path", sorted(PROFILES.glob("*.toml")), ids=lambda p: p.stem)
def test_every_device_profile_loads(path: Path) -> None:
    p = load_profile(path, DeviceProfile)
    assert p.name == path.stem


@pytest.mark.parametrize("path", sorted((PROFILES / "apps").glob("*.toml")), ids=lambda p: p.stem)
def test_every_app_profile_loads(path: Path) -> None:
    assert load_profile(path, AppProfile).name == path.stem


@pytest.mark.parametrize("path", sorted((PROFILES / "networks").glob("*.toml")),
                         ids=lambda p: p.stem)
def test_every_network_profile_loads(path: Path) -> None:
    assert load_profile(path, NetworkProfile).name == path.stem


def test_catalog_holds_every_file() -> None:
    catalog = load_catalog()
    assert set(catalog.devices) == {p.stem for p in PROFILES.glob("*.toml")}
    assert set(catalog.apps) == {p.stem for p in (PROFILES / "apps").glob("*.toml")}
    assert set(catalog.networks) == {p.stem for p in (PROFILES / "networks").glob("*.toml")}


@pytest.mark.parametrize("pool", sorted(REF_POOLS))
def test_reference_pools_have_their_ten_devices(pool: str) -> None:
    names = [d.name for d in load_catalog().pool(pool)]
    assert len(names) == 10
    assert set(names) == REF_POOLS[pool]
    assert pool in load_catalog().pools()


def test_tx2_units() -> None:
    tx2 = load_catalog().devices["tx2"]
    # the release's 1.3e12 FLOP/s, 4e9 B and 1.5e9 B/s, in the files' units (GFLOP/s, MB, MB/s)
    assert tx2.release_gflops == pytest.approx(1300)
    assert tx2.memory_mb == pytest.approx(4000)
    assert tx2.storage_read_mb_s == pytest.approx(1500)
    assert tx2.memory_bytes == pytest.approx(4e9)
    assert perf_flops(tx2) == pytest.approx(1.3e12)
    # its datasheet's FP32 peak (issue 36): 256 CUDA cores x 2 FLOP x 1.3 GHz; the 1300 is FP16
    assert tx2.flops == pytest.approx(256 * 2 * 1.3e9) and tx2.fp16_gflops == pytest.approx(2 * 665.6)


@pytest.mark.parametrize("name", sorted(REF_DEVICES))
def test_reference_device_numbers(name: str) -> None:
    flops, memory, bandwidth = REF_DEVICES[name]
    d = load_catalog().devices[name]
    assert perf_flops(d) == pytest.approx(flops, rel=1e-9)  # what `paper` charges and pools draw by
    assert d.release_gflops == pytest.approx(flops / 1e9, rel=1e-9)
    assert d.memory_bytes == pytest.approx(memory, rel=1e-9)
    assert d.storage_read_mb_s * 1e6 == pytest.approx(bandwidth, rel=1e-9)


# The sustained FLOP/s the edge pool's microcontroller profiles carried before they gave their
# datasheet peaks (issue 36): each profile's efficiency is that figure over its peak, so its rate, and
# with it the bundled edge scenarios' draws and costs, stay exactly as they were (no published step
# time measures a microcontroller, so no fit replaces it).
EDGE_SUSTAINED = {"stm32h747": 0.5e9, "esp32_s3": 0.2e9}
# The edge profiles whose rate the fit on published step times now gives (issue 51): they keep their
# datasheet FP32 peaks (FLOP/s, as each profile's source works it out) and dropped the estimated
# `efficiency` line; their rate is their [fitted] table's `conv` share of that peak.
EDGE_FITTED_PEAK = {"raspberry_pi_4": 48e9, "raspberry_pi_zero_2w": 16e9, "iphone_12": 307.2e9,
                    "pixel_4a": 156.8e9}


@pytest.mark.parametrize("name", sorted(EDGE_SUSTAINED | EDGE_FITTED_PEAK))
def test_edge_profiles_give_their_peak_and_keep_their_rate(name: str) -> None:
    d = load_catalog().devices[name]
    if name in EDGE_SUSTAINED:
        assert perf_flops(d) == EDGE_SUSTAINED[name]  # exactly: a rounding would move a draw
        assert 0 < d.efficiency < 1 and d.flops > EDGE_SUSTAINED[name] and not d.fitted.efficiency
        return
    table = tomllib.loads((PROFILES / f"{name}.toml").read_text())
    assert "efficiency" not in table  # the estimate is gone: the fitted share replaces it
    conv = table["fitted"]["efficiency"]["conv"]
    assert d.flops == pytest.approx(EDGE_FITTED_PEAK[name], rel=1e-12)  # the peak kept
    assert 0 < conv < 1 and perf_flops(d) == pytest.approx(conv * EDGE_FITTED_PEAK[name], rel=1e-12)


def test_edge_pool_is_unchanged_and_the_new_pools_hold_the_new_devices() -> None:
    cat = load_catalog()
    assert {d.name for d in cat.pool("edge")} == {"stm32h747", "esp32_s3", "raspberry_pi_4",
                                                  "raspberry_pi_zero_2w", "iphone_12", "pixel_4a"}
    assert {d.name for d in cat.pool("current")} == {"esp32_s3", "raspberry_pi_5", "jetson_orin_nano",
                                                     "pixel_8", "galaxy_s24"}
    assert {d.name for d in cat.pool("jetson")} == {"jetson_nano", "jetson_xavier_nx", "jetson_orin_nano"}
    for d in cat.pool("current") + cat.pool("jetson"):
        assert d.source and d.compute_source and not d.release_gflops  # sourced; no FedProphet figure


def test_jetson_orin_nano_datasheet() -> None:
    """Orin Nano 8 GB module datasheet: 1024 CUDA cores at 625 MHz, 20 dense INT8 TOPS (40 sparse),
    8 GB LPDDR5 at 68 GB/s, a 15 W power mode; FP16 on the tensor cores at half the INT8 rate."""
    d = load_catalog().devices["jetson_orin_nano"]
    assert d.device_class == "gpu"
    assert d.flops == pytest.approx(1024 * 2 * 0.625e9)
    assert d.peak("int8") == pytest.approx(20e12) and d.peak("fp16") == pytest.approx(d.peak("int8") / 2)
    assert (d.memory_mb, d.memory_bandwidth_gbps, d.active_w) == (8000.0, 68.0, 15.0)


@pytest.mark.parametrize(("name", "peak_gflops", "battery_mah"), [("pixel_8", 299.2, 4575),
                                                                   ("galaxy_s24", 385.3, 4000)])
def test_current_phones(name: str, peak_gflops: float, battery_mah: float) -> None:
    """Their CPUs' NEON peaks (the clocks as reported; X3/X4 32, A715/A720 16, A510/A520 8 FLOP a
    cycle) and their spec sheets' typical battery at a 3.85 V nominal."""
    d = load_catalog().devices[name]
    assert d.device_class == "phone_cpu" and d.memory_mb == 8000.0 and "5g" in d.networks
    assert d.compute_gflops == pytest.approx(peak_gflops, abs=0.05)
    assert d.battery_wh == pytest.approx(battery_mah * 3.85 / 1000, abs=0.05)


@pytest.mark.parametrize("name", sorted(REF_APPS))
def test_reference_apps(name: str) -> None:
    app = load_catalog().apps[name]
    assert app.perf_left == pytest.approx(REF_APPS[name])
    assert 0 < app.memory_left <= 1


def test_exactly_the_reference_apps() -> None:
    assert set(load_catalog().apps) == set(REF_APPS)


@pytest.mark.parametrize("name", sorted(REF_NETWORKS))
def test_reference_networks(name: str) -> None:
    up, down, latency = REF_NETWORKS[name]
    net = load_catalog().networks[name]
    assert net.up_mbit_s == pytest.approx(up)
    assert net.down_mbit_s == pytest.approx(down)
    assert net.latency_ms == pytest.approx(latency)


def test_exactly_the_reference_networks() -> None:
    assert set(load_catalog().networks) == set(REF_NETWORKS)


# load_profile errors -----------------------------------------------------------------------------


APP = """\
name = "busy"
description = "Busy"
source = "made up"
perf_left = {perf_left}
memory_left = 0.5
"""

NETWORK = """\
name = "slow"
description = "Slow"
source = "made up"
up_mbit_s = {up}
down_mbit_s = [1.0, 2.0]
latency_ms = [10.0, 20.0]
"""


def expect_error(path: Path, cls: type, key: str) -> EdgeflError:
    with pytest.raises(EdgeflError) as info:
        load_profile(path, cls)
    err = info.value
    assert err.key == key
    assert err.where == str(path)
    assert str(path) in str(err)
    assert key in str(err)
    assert "\n" not in str(err)
    return err


def test_valid_made_up_profile_loads(tmp_path: Path) -> None:
    path = tmp_path / "board.toml"
    path.write_text(device_text())
    p = load_profile(path, DeviceProfile)
    assert p.memory_bytes == 100e6
    assert p.flops == 10e9
    assert p.networks == ["wifi", "4g"]
    assert p.pools == ["test"]


def test_networks_default_to_all(tmp_path: Path) -> None:
    path = tmp_path / "board.toml"
    path.write_text("\n".join(line for line in device_text().splitlines()
                              if not line.startswith("networks")))
    assert set(load_profile(path, DeviceProfile).networks) == set(REF_NETWORKS)


@pytest.mark.parametrize("key", ["name", "memory_mb", "compute_gflops", "storage_read_mb_s",
                                 "storage_latency_ms", "source"])
def test_missing_required_key(tmp_path: Path, key: str) -> None:
    path = tmp_path / "board.toml"
    path.write_text("\n".join(line for line in device_text().splitlines()
                              if not line.startswith(f"{key} ")))
    expect_error(path, DeviceProfile, key)


def test_every_missing_key_is_named_at_once(tmp_path: Path) -> None:
    path = tmp_path / "board.toml"
    path.write_text("\n".join(line for line in device_text().splitlines()
                              if not line.startswith(("compute_gflops ", "source "))))
    err = expect_error(path, DeviceProfile, "source")
    assert err.fix == "missing (so are compute_gflops); every device profile needs it"


def test_name_must_match_file_stem(tmp_path: Path) -> None:
    path = tmp_path / "board.toml"
    path.write_text(device_text(name="other"))
    err = expect_error(path, DeviceProfile, "name")
    assert "board" in err.fix


@pytest.mark.parametrize("memory_mb", ["-5.0", "0"])
def test_memory_must_be_positive(tmp_path: Path, memory_mb: str) -> None:
    path = tmp_path / "board.toml"
    path.write_text(device_text(memory_mb=memory_mb))
    expect_error(path, DeviceProfile, "memory_mb")


def test_memory_wrong_type(tmp_path: Path) -> None:
    path = tmp_path / "board.toml"
    path.write_text(device_text(memory_mb='"lots"'))
    expect_error(path, DeviceProfile, "memory_mb")


@pytest.mark.parametrize("networks", ['["wifi", "6g"]', "[]"])
def test_unknown_or_empty_network(tmp_path: Path, networks: str) -> None:
    path = tmp_path / "board.toml"
    path.write_text(device_text(networks=networks))
    expect_error(path, DeviceProfile, "networks")


def test_unknown_profile_key(tmp_path: Path) -> None:
    path = tmp_path / "board.toml"
    path.write_text(device_text() + 'pool = ["low"]\n')
    expect_error(path, DeviceProfile, "pool")


def test_a_figure_below_the_least_is_refused(tmp_path: Path) -> None:
    """1e-300 MB would price a client at ~1e300 s: refused as the typo it is."""
    path = tmp_path / "board.toml"
    path.write_text(device_text(memory_mb="1e-300"))
    assert "1e-06 to 1e+09" in expect_error(path, DeviceProfile, "memory_mb").fix


@pytest.mark.parametrize("perf_left", ["1.5", "0", "-0.2", "1e-320"])
def test_app_perf_left_must_be_a_fraction(tmp_path: Path, perf_left: str) -> None:
    path = tmp_path / "busy.toml"
    path.write_text(APP.format(perf_left=perf_left))
    expect_error(path, AppProfile, "perf_left")


def test_app_valid_fraction_loads(tmp_path: Path) -> None:
    path = tmp_path / "busy.toml"
    path.write_text(APP.format(perf_left="1.0"))
    assert load_profile(path, AppProfile).perf_left == 1.0


@pytest.mark.parametrize("up", ["[5.0, 1.0]", "[0.0, 1.0]", "[1.0]", "[1e-320, 1e-320]"])
def test_network_range_must_be_low_high(tmp_path: Path, up: str) -> None:
    path = tmp_path / "slow.toml"
    path.write_text(NETWORK.format(up=up))
    expect_error(path, NetworkProfile, "up_mbit_s")


# keys an earlier edgefl wrote (issue 53 item 6) ----------------------------------------------------


def test_old_storage_and_link_keys_read_as_todays_with_a_warning_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    board, slow = tmp_path / "board.toml", tmp_path / "slow.toml"
    board.write_text(device_text().replace("storage_read_mb_s", "storage_read_mbps"))
    slow.write_text(NETWORK.format(up="[1.0, 3.0]").replace("up_mbit_s", "up_mbps"))
    now = tmp_path / "now.toml"
    now.write_text(device_text(name="now"))
    read = load_profile(board, DeviceProfile).storage_read_mb_s
    assert read == load_profile(now, DeviceProfile).storage_read_mb_s
    assert load_profile(slow, NetworkProfile).up_mbit_s == [1.0, 3.0]
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"edgefl: warning: {board}: storage_read_mbps is now storage_read_mb_s (read as it; "
                     "rename the key)",
                     f"edgefl: warning: {slow}: up_mbps is now up_mbit_s (read as it; rename the key)"]


def test_an_old_key_beside_its_new_name_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "board.toml"
    path.write_text(device_text() + "storage_read_mbps = 5.0\n")
    assert "keep only storage_read_mb_s" in expect_error(path, DeviceProfile, "storage_read_mbps").fix


def test_a_class_default_is_an_absent_key_and_an_old_zero_reads_as_absent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "board.toml"
    path.write_text(device_text())
    assert load_profile(path, DeviceProfile).efficiency is None  # absent: the class default
    path.write_text(device_text() + "efficiency = 0\nidle_w = 0.0\n")
    p = load_profile(path, DeviceProfile)
    assert (p.efficiency, p.idle_w) == (None, None)
    assert capsys.readouterr().err.count("no longer means the class default") == 2
    path.write_text(device_text() + "efficiency = 1e-9\n")  # a figure given must be one
    assert "omit it for the class default" in expect_error(path, DeviceProfile, "efficiency").fix


def test_bad_toml(tmp_path: Path) -> None:
    path = tmp_path / "board.toml"
    path.write_text(device_text() + "memory_mb = = 3\n")
    expect_error(path, DeviceProfile, "syntax")


def test_missing_file(tmp_path: Path) -> None:
    expect_error(tmp_path / "ghost.toml", DeviceProfile, "file")


def test_catalog_from_another_folder(tmp_path: Path) -> None:
    (tmp_path / "apps").mkdir()
    (tmp_path / "networks").mkdir()
    (tmp_path / "board.toml").write_text(device_text(networks='["slow"]'))  # this folder's networks
    (tmp_path / "apps" / "busy.toml").write_text(APP.format(perf_left="0.5"))
    (tmp_path / "networks" / "slow.toml").write_text(NETWORK.format(up="[1.0, 2.0]"))
    catalog = load_catalog(tmp_path)
    assert list(catalog.devices) == ["board"]
    assert [d.name for d in catalog.pool("test")] == ["board"]
    assert catalog.pool("low") == []
    assert catalog.pools() == ["test"]
    assert catalog.apps["busy"].perf_left == 0.5
    assert catalog.networks["slow"].up_mbit_s == [1.0, 2.0]
