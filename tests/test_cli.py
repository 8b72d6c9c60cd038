"""The edgefl command: devices list/show/validate, run and plot errors, exit codes, one-line errors."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import pytest
from support import QUICKSTART, ROOT, one_error_line, snapshot

from edgefl.cli import main, validated

PROFILES = ROOT / "device_profiles"


# devices -----------------------------------------------------------------------------------------


def listed_names(out: str) -> list[str]:
    lines = out.splitlines()
    assert lines[0].split()[0] == "name"
    return [line.split()[0] for line in lines[1:]]


def test_devices_list_prints_every_device(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "list"]) == 0
    captured = capsys.readouterr()
    assert sorted(listed_names(captured.out)) == sorted(p.stem for p in PROFILES.glob("*.toml"))
    assert captured.err == ""


def test_devices_list_filters_by_pool(capsys: pytest.CaptureFixture[str]) -> None:
    edge = sorted(p.stem for p in PROFILES.glob("*.toml")
                  if "edge" in tomllib.loads(p.read_text()).get("pools", []))
    assert edge  # the shipped profiles have an edge pool (the quickstart's default)
    assert main(["devices", "list", "--pool", "edge"]) == 0
    names = listed_names(capsys.readouterr().out)
    assert sorted(names) == edge
    assert "tx2" not in names


def test_devices_list_low_pool(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "list", "--pool", "low"]) == 0
    out = capsys.readouterr().out
    assert sorted(listed_names(out)) == sorted([
        "gtx_1650m", "tx2", "kcu1500", "vc709", "radeon_hd_6870", "quadro_m2200", "a12_gpu",
        "geforce_750", "grid_k240q", "radeon_rx_6300m"])
    tx2 = next(line for line in out.splitlines() if line.startswith("tx2 "))
    # memory 4e9 B = 4000 MB, the FP32 peak 665.6 GFLOP/s (the release's 1300 is FP16), 1.5e9 B/s
    assert [float(x) for x in tx2.split()[2:5]] == [4000.0, 665.6, 1500.0]
    assert tx2.split()[5] == str((PROFILES / "tx2.toml").resolve())  # the file it comes from


def test_devices_show_prints_the_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "show", "tx2"]) == 0
    out = capsys.readouterr().out
    path = (PROFILES / "tx2.toml").resolve()
    head = f"# {path}\n" + path.read_text()
    assert out.startswith(head)  # which file, then the file
    # then where the compute model's figures come from (issue 51), as comments: it still reads as TOML
    assert tomllib.loads(out)["name"] == "tx2"
    tail = out[len(head):].splitlines()
    assert tail[:2] == ["", "# where the compute model's figures come from:"] and len(tail) > 2
    assert all(line.startswith("#   ") for line in tail[2:])
    shown, table = "\n".join(tail), tomllib.loads(path.read_text())
    assert f"peak FP32 {table['compute_gflops']:g} GFLOP/s: the datasheet's" in shown
    assert f"memory bandwidth {table['memory_bandwidth_gbps']:g} GB/s: the profile's" in shown
    fitted = table["fitted"]  # tx2 carries its fitted figures, taken from its family's
    assert f"conv {fitted['efficiency']['conv']:.3g}" in shown and f"({table['family']})" in shown
    assert "[fitted]" in shown and fitted["source"] in shown


def test_devices_show_unknown(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "show", "nope"]) == 2
    captured = capsys.readouterr()
    line = one_error_line(captured.err)
    assert "nope" in line
    assert "tx2" in line  # lists the known devices
    assert "add --scenario FILE" in line and "EDGEFL_PROFILE_PATH" in line  # where else one may be
    assert captured.out == ""


@pytest.mark.parametrize("command", [["devices", "list"], ["devices", "show", "tx2"]])
def test_devices_of_a_scenario_that_does_not_exist(command: list[str], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """--scenario naming no file is refused, not read as 'no scenario' (the bundled profiles)."""
    missing = str(tmp_path / "nosuch.toml")
    assert main([*command, "--scenario", missing]) == 2
    captured = capsys.readouterr()
    assert one_error_line(captured.err).startswith(f"edgefl: error: {missing}: file: not found")
    assert captured.out == ""


def test_devices_validate_shipped_file(monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    assert main(["devices", "validate", "device_profiles/tx2.toml",
                 "device_profiles/kcu1500.toml"]) == 0
    out = capsys.readouterr().out
    assert "device_profiles/tx2.toml: ok" in out
    assert "device_profiles/kcu1500.toml: ok" in out


def test_devices_validate_broken_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "board.toml"
    text = (PROFILES / "tx2.toml").read_text().replace('name = "tx2"', 'name = "board"')
    bad.write_text(text.replace("memory_mb = 4000.0", "memory_mb = -4000.0"))
    assert main(["devices", "validate", str(bad)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(bad) in line
    assert "memory_mb" in line


def test_devices_validate_checks_every_file(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """One error line per wrong file, the good ones still said ok, exit 2."""
    monkeypatch.chdir(ROOT)
    (tmp_path / "a.toml").write_text("name = \n")
    (tmp_path / "b.toml").write_text('name = "b"\n')
    files = [str(tmp_path / "a.toml"), "device_profiles/tx2.toml", str(tmp_path / "b.toml")]
    assert main(["devices", "validate", *files]) == 2
    captured = capsys.readouterr()
    assert captured.out == f"device_profiles/tx2.toml: ok ({validated(PROFILES / 'tx2.toml')})\n"
    errors = captured.err.splitlines()
    assert len(errors) == 2 and all(e.startswith("edgefl: error: ") for e in errors)
    assert str(tmp_path / "a.toml") in errors[0] and str(tmp_path / "b.toml") in errors[1]


@pytest.mark.parametrize("text", ["name = \n", 'name = "board"\n'])
def test_devices_validate_bad_toml_or_missing_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str
) -> None:
    bad = tmp_path / "board.toml"
    bad.write_text(text)
    assert main(["devices", "validate", str(bad)]) == 2
    assert str(bad) in one_error_line(capsys.readouterr().err)


def test_devices_validate_checks_apps_and_networks_as_what_their_folder_says(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(ROOT)
    files = ["device_profiles/apps/idle.toml", "device_profiles/networks/wifi.toml"]
    assert main(["devices", "validate", *files]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [f"{files[0]}: ok (idle: app)", f"{files[1]}: ok (wifi: network)"]


def test_devices_validate_refuses_active_watts_below_idle(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    phone = tmp_path / "phone.toml"
    text = (PROFILES / "pixel_4a.toml").read_text().replace('name = "pixel_4a"', 'name = "phone"')
    phone.write_text(text.replace("idle_w = ", "idle_w = 50.0  # was ", 1))
    assert main(["devices", "validate", str(phone)]) == 2
    assert "active_w: must be at least idle_w" in one_error_line(capsys.readouterr().err)


def test_devices_validate_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "validate", str(tmp_path / "ghost.toml")]) == 2
    assert "ghost.toml" in one_error_line(capsys.readouterr().err)


# run ---------------------------------------------------------------------------------------------

# Valid, and tiny in case a bug let it train.
SMALL = """\
rounds = 1
[fleet]
clients = 2
[training]
local_iters = 1
"""


def test_run_bad_scenario_makes_no_run_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    scenario = tmp_path / "bad.toml"
    scenario.write_text(SMALL + "lrr = 1\n")
    out = tmp_path / "run"
    assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(scenario) in line
    assert "training.lrr" in line
    assert not out.exists()
    assert not (tmp_path / "runs").exists()


def test_run_bad_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "ok.toml"
    scenario.write_text(SMALL)
    out = tmp_path / "run"
    assert main(["run", str(scenario), "--out", str(out), "--set", "rounds=ten"]) == 2
    assert "rounds" in one_error_line(capsys.readouterr().err)
    assert not out.exists()


def test_run_refuses_existing_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "ok.toml"
    scenario.write_text(SMALL)
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.csv").write_text("round,sim_time_s\n0,1.0\n")
    (out / "notes.txt").write_text("keep me\n")
    before = snapshot(out)
    assert main(["run", str(scenario), "--out", str(out), "--quiet"]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "--out" in line
    assert "cannot tell they are its own" in line  # no run marker: not even --overwrite may replace it
    assert snapshot(out) == before


def test_run_overwrite_keeps_old_run_when_the_new_one_cannot_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The scenario loads, but 5000 clients cannot each get a sample of the 8x8 digits: the run
    # stops with exit 2 before any work, so the run it was told to replace must still be there.
    scenario = tmp_path / "crowd.toml"
    scenario.write_text("rounds = 1\n[fleet]\nclients = 5000\n[training]\nlocal_iters = 1\n")
    out = tmp_path / "run"
    out.mkdir()
    (out / "notes.txt").write_text("keep me\n")
    before = snapshot(out)
    assert main(["run", str(scenario), "--out", str(out), "--overwrite", "--quiet"]) == 2
    one_error_line(capsys.readouterr().err)
    assert out.is_dir()
    assert snapshot(out) == before


# plot --------------------------------------------------------------------------------------------


def test_plot_without_metrics(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "empty-run"
    run.mkdir()
    assert main(["plot", str(run), "--out", str(tmp_path / "fig.png")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert str(run) in line
    assert "metrics.csv" in line
    assert not (tmp_path / "fig.png").exists()


def test_the_command_shortens_openmp_spinning_unless_the_user_chose(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert main(["scenarios", "list"]) == 0
    assert os.environ["GOMP_SPINCOUNT"] == "3000"
    monkeypatch.setenv("GOMP_SPINCOUNT", "50")
    assert main(["scenarios", "list"]) == 0
    assert os.environ["GOMP_SPINCOUNT"] == "50"


def test_a_diverged_run_says_so_once_and_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    assert main(["run", str(QUICKSTART), "--out", str(out), "--quiet", "--set", "training.lr=1e30",
                 "--set", "rounds=4", "--set", "fleet.clients=4", "--set", "training.local_iters=1",
                 "--set", "attack.steps=1", "--set", "evaluation.steps=1", "--set", "threads=1"]) == 0
    err = capsys.readouterr().err
    losses = [line.split(",")[10] for line in (out / "metrics.csv").read_text().splitlines()[1:]]
    assert losses.count("nan") >= 2 and err.count("local training diverged (lower training.lr)") == 1
    assert f"round {losses.index('nan')}: the training loss is nan" in err
    assert (out / "summary.json").exists()


# the installed command ---------------------------------------------------------------------------


@pytest.mark.slow
def test_installed_command_bad_scenario(tmp_path: Path) -> None:
    exe = ROOT / ".venv" / "bin" / "edgefl"
    if not exe.exists():
        pytest.skip("no .venv/bin/edgefl")
    scenario = tmp_path / "bad.toml"
    scenario.write_text("rounds = 3\ncolour = 1\n")
    done = subprocess.run([str(exe), "run", str(scenario), "--quiet"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2
    line = one_error_line(done.stderr)
    assert str(scenario) in line
    assert "colour" in line
    assert done.stdout == ""
    assert not (tmp_path / "runs").exists()


def test_installed_command_stops_quietly_when_its_reader_goes(tmp_path: Path) -> None:
    """`edgefl devices list | head -1`: the reader closes the pipe early (here before edgefl writes
    at all); edgefl stops with no error line and SIGPIPE's exit code, as a shell tool does."""
    exe = ROOT / ".venv" / "bin" / "edgefl"
    if not exe.exists():
        pytest.skip("no .venv/bin/edgefl")
    proc = subprocess.Popen([str(exe), "devices", "list"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.close()
    _, err = proc.communicate(timeout=120)
    assert (proc.returncode, err) == (141, "")


def test_scenarios_list_shows_the_opening_comment_on_one_line() -> None:
    from edgefl.cli import opening_comment

    text = ("\n# A scenario on digits:\n# ten devices, the quickstart's fleet.\n#\n# Needs nothing.\n"
            "rounds = 3\n")
    assert opening_comment(text) == "A scenario on digits: ten devices, the quickstart's fleet."
    assert opening_comment(text, 30) == "A scenario on digits: ten ..."
    assert opening_comment("rounds = 3\n") == ""
