"""Issue 13, items 1 and 2: profiles and scenarios ship as package data; a user's own devices, apps
and networks are found beside the scenario or on EDGEFL_PROFILE_PATH, before the bundled ones.

(.ci/run builds the wheel, installs it alone in a fresh venv and runs it from outside the checkout;
these tests check the pieces offline and fast.)"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from support import device_text, one_error_line

from edgefl.cli import _found_how, main, scenario_file
from edgefl.config import FleetConfig
from edgefl.devices import catalog
from edgefl.devices.pool import DevicePool
from edgefl.rundir import fingerprint
from edgefl.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
BUNDLED = ROOT / "device_profiles"

LORA = """\
name = "lora"
description = "a user's network"
source = "test"
up_mbit_s = [0.01, 0.02]
down_mbit_s = [0.01, 0.02]
latency_ms = [100.0, 200.0]
"""


def board(folder: Path, name: str = "board", pool: str = "mine", memory_mb: float = 64.0,
          networks: str = "") -> Path:
    """A made-up device profile in `folder`; without `networks` the key is omitted."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = device_text(name, str(memory_mb), networks).replace('["test"]', f'["{pool}"]').splitlines()
    path = folder / f"{name}.toml"
    path.write_text("\n".join(line for line in lines if networks or not line.startswith("networks")))
    return path


@pytest.fixture(autouse=True)
def no_user_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(catalog.ENV, raising=False)


# 1. package data -----------------------------------------------------------------------------------


def test_pyproject_ships_every_package_and_the_data() -> None:
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "edgefl").rglob("__init__.py")}
    assert on_disk <= set(tool["packages"])  # a new package folder must be listed, or the wheel lacks it
    assert tool["package-dir"] == {"edgefl.device_profiles": "device_profiles",
                                   "edgefl.scenarios": "scenarios"}
    assert tool["package-data"]["edgefl.scenarios"] == ["*.toml", "*.json"]
    assert {"edgefl.device_profiles.apps", "edgefl.device_profiles.networks"} <= set(tool["package-data"])


def test_bundled_folders_are_the_repository_folders() -> None:
    assert catalog.bundled("device_profiles") == BUNDLED
    assert catalog.bundled("scenarios") == ROOT / "scenarios"
    assert catalog.search_path() == (BUNDLED,)


def test_scenarios_list_shows_each_with_its_opening_comment(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["scenarios", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines] == sorted(p.stem for p in (ROOT / "scenarios").glob("*.toml"))
    quick = next(line for line in lines if line.startswith("quickstart "))
    first = (ROOT / "scenarios" / "quickstart.toml").read_text().splitlines()[0]
    assert quick.split(None, 1)[1].startswith(first.lstrip("# "))


def test_a_bundled_scenario_by_name_from_any_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert scenario_file("quickstart") == ROOT / "scenarios" / "quickstart.toml"
    assert scenario_file("quickstart.toml") == ROOT / "scenarios" / "quickstart.toml"
    assert main(["run", "quickstart", "--dry-run", "--quiet", "--set", "rounds=1"]) == 0
    assert "-> runs/quickstart-dry" in capsys.readouterr().out  # the default folder, in the cwd
    (tmp_path / "quickstart.toml").write_text("rounds = 1\n")  # a file of that name here wins,
    assert scenario_file("quickstart") == scenario_file("quickstart.toml") == Path("quickstart.toml")
    (tmp_path / "quickstart").write_text("rounds = 1\n")  # and a path that exists as given first
    assert scenario_file("quickstart") == Path("quickstart")
    assert main(["run", "nosuch", "--dry-run"]) == 2
    assert "edgefl scenarios list" in one_error_line(capsys.readouterr().err)


# 2. a user's own profiles --------------------------------------------------------------------------


def test_search_order_beside_then_env_then_bundled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = tmp_path / "exp" / "s.toml"
    beside, env_a, env_b = tmp_path / "exp" / "device_profiles", tmp_path / "a", tmp_path / "b"
    for folder in (beside, env_a, env_b):
        folder.mkdir(parents=True)
    monkeypatch.setenv(catalog.ENV, f"{env_a}:{env_b}")
    assert catalog.search_path(scenario) == (beside, env_a, env_b, BUNDLED)
    assert catalog.search_path(tmp_path / "elsewhere.toml") == (env_a, env_b, BUNDLED)


def test_a_user_profile_shadows_a_bundled_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    mine = board(tmp_path / "mine", name="tx2", pool="low", memory_mb=123.0)
    monkeypatch.setenv(catalog.ENV, str(tmp_path / "mine"))
    cat = catalog.load_catalog()
    assert cat.devices["tx2"].memory_mb == 123.0
    assert cat.file("devices", "tx2") == mine
    assert cat.file("devices", "rtx_3090") == BUNDLED / "rtx_3090.toml"
    assert main(["devices", "list", "--pool", "low"]) == 0
    row = next(r for r in capsys.readouterr().out.splitlines() if r.startswith("tx2 "))
    assert row.split()[2] == "123.000" and row.split()[-1] == str(mine)


def test_profiles_beside_the_scenario_need_no_variable(tmp_path: Path) -> None:
    board(tmp_path / "device_profiles")
    (tmp_path / "s.toml").write_text('rounds = 1\n[fleet]\nclients = 2\ndevices = ["board"]\n')
    assert load_scenario(tmp_path / "s.toml").fleet.devices == ["board"]
    cat = catalog.catalog_for(tmp_path / "s.toml")
    assert cat.devices["board"].networks == sorted(cat.networks)  # omitted: every network found


def test_user_networks_and_apps_are_found_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "mine"
    (root / "networks").mkdir(parents=True)
    (root / "networks" / "lora.toml").write_text(LORA)
    (root / "apps").mkdir()
    (root / "apps" / "busy.toml").write_text('name = "busy"\ndescription = "x"\nsource = "test"\n'
                                             "perf_left = 0.5\nmemory_left = 0.25\n")
    path = board(root, networks='["lora", "wifi"]')
    assert main(["devices", "validate", str(path)]) == 0  # lora: a network of that folder
    monkeypatch.setenv(catalog.ENV, str(root))
    cat = catalog.load_catalog()
    assert cat.devices["board"].networks == ["lora", "wifi"]
    assert cat.apps["busy"].perf_left == 0.5 and "idle" in cat.apps
    pool = DevicePool(cat, FleetConfig(clients=3, devices=["board"], apps=["busy"]), 0)
    states = [pool.state(k, 0) for k in range(3)]
    assert {s.app for s in states} == {"busy"} and {s.network for s in states} <= {"lora", "wifi"}
    monkeypatch.delenv(catalog.ENV)
    capsys.readouterr()
    elsewhere = board(tmp_path / "other", networks='["lora"]')
    assert main(["devices", "validate", str(elsewhere)]) == 2  # no lora along this path
    line = one_error_line(capsys.readouterr().err)
    assert ": networks: unknown 'lora'; networks found: 4g, 5g, cable" in line


def test_catalog_is_cached_per_search_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    first = catalog.load_catalog()
    assert catalog.load_catalog() is first
    board(tmp_path / "mine")
    monkeypatch.setenv(catalog.ENV, str(tmp_path / "mine"))
    other = catalog.load_catalog()
    assert other is not first and "board" in other.devices and "board" not in first.devices


def test_fingerprint_hashes_the_profiles_the_run_used(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "mine"
    used = board(mine, name="board", networks='["wifi"]')
    monkeypatch.setenv(catalog.ENV, str(mine))
    pool = DevicePool(catalog.load_catalog(), FleetConfig(clients=2, devices=["board"], apps=["idle"]), 0)
    assert pool.profile_files() == [used, BUNDLED / "apps" / "idle.toml", BUNDLED / "networks" / "wifi.toml"]
    before = fingerprint("x", pool.profile_files())
    board(mine, name="unused")  # a profile the run does not use changes nothing
    assert fingerprint("x", pool.profile_files()) == before
    used.write_text(used.read_text().replace("memory_mb = 64.0", "memory_mb = 65.0"))
    after = fingerprint("x", pool.profile_files())
    assert after["profiles"] != before["profiles"] and after["code"] == before["code"]


def test_calibrate_says_how_a_scenario_finds_the_profile(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    beside = tmp_path / "exp" / "device_profiles" / "h.toml"
    beside.parent.mkdir(parents=True)
    assert _found_how(beside, "h") == (f"a scenario file in {tmp_path / 'exp'} finds it there: use "
                                       f"fleet.devices = ['h']; from elsewhere, export "
                                       f"EDGEFL_PROFILE_PATH={beside.parent}")
    assert "export EDGEFL_PROFILE_PATH=" + str(tmp_path) in _found_how(tmp_path / "h.toml", "h")
    monkeypatch.setenv(catalog.ENV, str(tmp_path))
    assert _found_how(tmp_path / "h.toml", "h").startswith("scenarios find it (")


def test_a_profile_path_that_is_not_a_folder_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(catalog.ENV, f"{tmp_path}:{tmp_path / 'typo'}")
    assert main(["devices", "list"]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"edgefl: error: EDGEFL_PROFILE_PATH: {tmp_path / 'typo'}: is not a folder; give folders of "
        "profiles, colon-separated")
