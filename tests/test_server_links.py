"""The server's links sized for the fleet (issue 37): `[server] down_mbit_s_per_device` and
`up_mbit_s_per_device` add a share per device to the fixed Mbit/s (edgefl.sim.links.server_mbps,
`Links.of_server`), so that living-digits' rounds complete uploads at every fleet size."""

from __future__ import annotations

import csv
import math
from pathlib import Path

import pytest

from edgefl.config import ServerConfig
from edgefl.errors import EdgeflError
from edgefl.experiment import prepare, run
from edgefl.scenario import load_scenario
from edgefl.sim.links import Links, server_mbps

ROOT = Path(__file__).resolve().parent.parent
LIVING = ROOT / "scenarios" / "living-digits.toml"


def test_a_share_per_device_adds_to_the_fixed_link() -> None:
    """2 Mbit/s + 0.5 Mbit/s x 100 devices = 52 Mbit/s = 6.5e6 bytes/s down; 1 + 0.25 x 100 = 26
    Mbit/s = 3.25e6 bytes/s up."""
    server = ServerConfig(down_mbit_s=2.0, up_mbit_s=1.0, down_mbit_s_per_device=0.5,
                          up_mbit_s_per_device=0.25)
    assert server_mbps(server, 100) == (52.0, 26.0)
    assert Links.of_server(server, 100) == Links(6.5e6, 3.25e6)


def test_a_share_alone_scales_with_the_fleet() -> None:
    """living-digits' 0.05 Mbit/s per device: 1 Mbit/s (125,000 bytes/s) for 20 devices, 5,000
    Mbit/s (6.25e8 bytes/s) for 100,000."""
    server = ServerConfig(down_mbit_s_per_device=0.05, up_mbit_s_per_device=0.05)
    assert Links.of_server(server, 20) == Links(125000.0, 125000.0)
    assert Links.of_server(server, 100000) == Links(6.25e8, 6.25e8)


def test_the_default_is_unlimited_and_the_fixed_links_unchanged() -> None:
    assert Links.of_server(ServerConfig(), 100000).unlimited
    links = Links.of_server(ServerConfig(down_mbit_s=80.0, up_mbit_s=40.0), 100000)
    assert links == Links.of_mbps(80.0, 40.0) == Links(1e7, 5e6)
    up_only = Links.of_server(ServerConfig(up_mbit_s_per_device=0.008), 1000)  # 8 Mbit/s up
    assert math.isinf(up_only.down_bps) and up_only.up_bps == pytest.approx(1e6)


@pytest.mark.parametrize(("override", "key"), [
    ("server.down_mbit_s_per_device=-0.1", "server.down_mbit_s_per_device"),
    ("server.up_mbit_s_per_device=-1", "server.up_mbit_s_per_device"),
    ("server.down_mbit_s_per_device=2000", "server.down_mbit_s_per_device"),  # x 100,000 > 1e8 Mbit/s
    ("server.up_mbit_s_per_device=1001", "server.up_mbit_s_per_device"),
])
def test_a_bad_share_is_refused_naming_its_key(override: str, key: str) -> None:
    with pytest.raises(EdgeflError) as info:
        load_scenario(LIVING, ["fleet.clients=100000", override])
    assert info.value.key == key
    assert key in str(info.value) and "fleet.clients" in str(info.value) and "\n" not in str(info.value)


def test_a_share_within_the_limit_for_its_fleet_is_accepted() -> None:
    """1,000 Mbit/s a device is 1e8 Mbit/s for 100,000 devices: at the limit, accepted."""
    s = load_scenario(LIVING, ["fleet.clients=100000", "server.down_mbit_s_per_device=1000"])
    assert server_mbps(s.server, s.fleet.clients)[0] == 1e8


def test_living_digits_scales_its_links_with_the_fleet() -> None:
    s = load_scenario(LIVING)
    assert (s.server.down_mbit_s, s.server.up_mbit_s) == (0.0, 0.0)
    assert s.server.down_mbit_s_per_device > 0 and s.server.up_mbit_s_per_device > 0


@pytest.mark.parametrize("clients", [20, 400])
def test_living_digits_rounds_complete_uploads_at_two_sizes(tmp_path: Path, clients: int) -> None:
    """Dry runs of 2 deadline rounds: each completes uploads, most of the target. On the fixed 1
    Mbit/s link of before, 400 devices' 260 selected clients shared 125,000 bytes/s and every round
    reached its 270 s deadline with none completed."""
    s = load_scenario(LIVING, [f"fleet.clients={clients}", "rounds=2"])
    run(prepare(s, str(LIVING), dry_run=True), tmp_path, progress=False)
    rounds = list(csv.DictReader((tmp_path / "metrics.csv").open()))
    target = clients // 2  # fleet.sample_fraction 0.5
    assert len(rounds) == 2
    for m in rounds:
        assert int(m["completed"]) == target
        assert float(m["round_time_s"]) < s.round.deadline_s


def test_the_old_mbps_keys_read_as_the_mbit_s_ones_with_a_warning_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Links in *_mbit_s (issue 53 item 6): a scenario of an earlier edgefl, or a --set of its key,
    still reads, one warning line each naming today's key; both names at once is refused."""
    path = tmp_path / "old.toml"
    path.write_text("[server]\ndown_mbps = 2.0\nup_mbps_per_device = 0.25\n")
    s = load_scenario(path, ["server.up_mbps=3"])
    assert (s.server.down_mbit_s, s.server.up_mbit_s, s.server.up_mbit_s_per_device) == (2.0, 3.0, 0.25)
    assert sorted(capsys.readouterr().err.splitlines()) == sorted(
        f"edgefl: warning: {path}: server.{old} is now server.{new} (read as it; rename the key)"
        for old, new in (("down_mbps", "down_mbit_s"), ("up_mbps_per_device", "up_mbit_s_per_device"),
                         ("up_mbps", "up_mbit_s")))
    with pytest.raises(EdgeflError, match="keep only down_mbit_s"):
        load_scenario(path, ["server.down_mbit_s=1"])
