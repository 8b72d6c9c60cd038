"""Issue 13, item 3: an empty scenario, a byte-order mark, defaults too large for the dataset, and
settings a method ignores."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support import QUICKSTART, ROOT, one_error_line

from edgefl.cli import main
from edgefl.devices.catalog import load_profile
from edgefl.devices.profile import DeviceProfile
from edgefl.errors import EdgeflError
from edgefl.methods.distill import DistillConfig
from edgefl.scenario import load_scenario, schema_kind
from edgefl.tomlschema import MOVED


@pytest.mark.parametrize("text", ["", "\n  \n", "# only a comment\n", "\ufeff", "[fleet]\n[training]\n"])
def test_an_empty_scenario_is_one_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                              text: str) -> None:
    path = tmp_path / "empty.toml"
    path.write_text(text, encoding="utf-8")
    assert main(["run", str(path), "--dry-run", "--out", str(tmp_path / "out")]) == 2
    assert one_error_line(capsys.readouterr().err) == (
        f"edgefl: error: {path}: file: is empty (no key set); a scenario sets at least one key, e.g. "
        'method = "jfat" (edgefl scenarios list shows complete ones)')
    assert not (tmp_path / "out").exists()
    assert main(["run", str(path), "--dry-run", "--quiet", "--set", "rounds=1", "--out",
                 str(tmp_path / "out")]) == 0  # keys from --set alone: the user chose the defaults


def test_a_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    scenario = tmp_path / "bom.toml"
    scenario.write_bytes(b"\xef\xbb\xbf" + QUICKSTART.read_bytes())
    assert load_scenario(scenario) == load_scenario(QUICKSTART)
    profile = tmp_path / "tx2.toml"
    profile.write_bytes(b"\xef\xbb\xbf" + (ROOT / "device_profiles" / "tx2.toml").read_bytes())
    assert load_profile(profile, DeviceProfile) == load_profile(ROOT / "device_profiles" / "tx2.toml",
                                                                DeviceProfile)


@pytest.mark.parametrize("method", ["feddf_at", "fedet_at"])
def test_an_unset_public_split_is_scaled_to_the_dataset(method: str) -> None:
    # digits: 1437 training samples; the default 5000 becomes a fifth of them, floor(1437 / 5) = 287
    assert load_scenario(QUICKSTART, [f"method={method}"]).knobs(DistillConfig).public_samples == 287
    assert load_scenario(QUICKSTART, [f"method={method}", "distill.public_samples=300"]
                         ).knobs(DistillConfig).public_samples == 300  # a value the user set is kept
    assert load_scenario(QUICKSTART).knobs(DistillConfig).public_samples == 5000  # no distillation: untouched
    cifar = load_scenario(QUICKSTART, [f"method={method}", "data.dataset=cifar10", "model.name=cnn3"])
    assert cifar.knobs(DistillConfig).public_samples == 5000  # 50000 / 5 = 10000 holds the default


def test_distillation_dry_runs_on_the_quickstart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "quickstart", "--dry-run", "--quiet", "--set", "method=feddf_at", "--set",
                 "rounds=1", "--out", str(tmp_path / "df")]) == 0
    assert "feddf_at: 1 rounds" in capsys.readouterr().out
    assert main(["run", "quickstart", "--dry-run", "--set", "method=feddf_at", "--set",
                 "distill.public_samples=5000", "--out", str(tmp_path / "big")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "distill.public_samples" in line and "the training set has 1437" in line


@pytest.mark.parametrize("key, value", [("training.local_epochs", "1"), ("training.objective", "trades"),
                                        ("training.objective", "mart")])
def test_fedprophet_refuses_the_settings_it_ignores(key: str, value: str) -> None:
    with pytest.raises(EdgeflError) as info:
        load_scenario(QUICKSTART, ["method=fedprophet", f"{key}={value}"])
    assert (info.value.where, info.value.key) == ("--set", key)
    assert "method fedprophet ignores it" in info.value.fix


def test_fedprophet_takes_the_defaults_and_others_take_the_settings() -> None:
    load_scenario(QUICKSTART, ["method=fedprophet", "training.local_epochs=0", "training.objective=pgd_at"])
    s = load_scenario(QUICKSTART, ["method=jfat", "training.local_epochs=1", "training.objective=trades"])
    assert (s.training.local_epochs, s.training.objective) == (1.0, "trades")


def test_a_scenario_file_setting_an_ignored_key_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text('method = "fedprophet"\n[training]\nobjective = "mart"\n')
    with pytest.raises(EdgeflError) as info:
        load_scenario(path)
    assert (info.value.where, info.value.key) == (str(path), "training.objective")


def test_scaffold_refuses_another_optimizer_and_is_priced_as_the_sgd_it_runs() -> None:
    with pytest.raises(EdgeflError) as info:
        load_scenario(QUICKSTART, ["method=scaffold_at", 'training.optimizer="adam"'])
    assert info.value.key == "training.optimizer" and "scaffold_at ignores it" in info.value.fix
    from edgefl.experiment import prepare

    exp = prepare(load_scenario(QUICKSTART, ["method=scaffold_at"]), str(QUICKSTART), dry_run=True)
    plan = exp.method.plan(0, 0, exp.pool.state(0, 0))
    assert plan.workload.slots == 2  # c and c_k beside each weight, no momentum buffer


@pytest.mark.parametrize("key, value, bound", [
    ("training.local_epochs", "1e300", "10,000"), ("training.local_epochs", "10001", "10,000"),
    ("training.local_iters", "9223372036854775807", "1,000,000"),
    ("training.batch_size", "100000000", "65,536"),
    ("round.buffer", "9223372036854775807", "10,000"), ("round.over_selection", "1e308", "10"),
    ("cost.server_s", "1e308", "1e+09"), ("round.deadline_s", "1e308", "1e+09"),
    ("cost.server_gflops", "1e-300", "1e-06"), ("fleet.balance_s", "400", "[-4, 4]"),
    ("fleet.balance_s", "-400", "[-4, 4]"),
    ("data.synthetic_shape", "[3,100000,100000]", "4,096 pixels a side"),
    ("data.synthetic_classes", "9223372036854775807", "100,000"),
])
def test_local_work_beyond_the_bounds_is_one_line(key: str, value: str, bound: str) -> None:
    with pytest.raises(EdgeflError) as info:
        load_scenario(QUICKSTART, [f"{key}={value}"])
    assert info.value.key == key and bound in info.value.fix


def test_a_distillation_family_must_be_listed_largest_first() -> None:
    """A client trains the first member that fits; smallcnn (3.39 MB at the quickstart's batch)
    after digits_cnn (1.91 MB) would never be trained."""
    from edgefl.experiment import prepare

    s = load_scenario(QUICKSTART, ["method=feddf_at", 'distill.family=["digits_cnn", "smallcnn"]'])
    with pytest.raises(EdgeflError) as info:
        prepare(s, str(QUICKSTART), dry_run=True)
    assert info.value.key == "distill.family" and "largest first: smallcnn needs 3.39 MB" in info.value.fix


def test_sfat_on_scaffold_refuses_another_optimizer_too() -> None:
    with pytest.raises(EdgeflError) as info:
        load_scenario(QUICKSTART, ["method=sfat", 'sfat.base="scaffold"', 'training.optimizer="adam"'])
    assert info.value.key == "training.optimizer" and "sfat on ScaffoldAT ignores it" in info.value.fix


def test_an_impossible_memory_budget_names_the_key_to_change(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """R_min of 1 kB holds no layer of the quickstart's model, one sample at a time: the error names
    fleet.reserved_memory_mb, in the file that set it, not a --set that set another fleet key; a
    device whose whole memory holds no step names the devices. Nothing is written."""
    scenario = tmp_path / "tiny.toml"
    scenario.write_text(QUICKSTART.read_text().replace("reserved_memory_mb = 1.3",
                                                        "reserved_memory_mb = 0.001"))
    out = tmp_path / "out"
    assert main(["run", str(scenario), "--dry-run", "--set", "fleet.clients=6", "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith(f"edgefl: error: {scenario}: fleet.reserved_memory_mb: device ")
    assert "keeps at least 0.001 MB" in line and line.endswith("raise fleet.reserved_memory_mb (up to the "
                                                              "device's memory) or drop the device")
    assert main(["run", str(QUICKSTART), "--dry-run", "--set", "fleet.reserved_memory_mb=0.001",
                 "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("edgefl: error: --set: fleet.reserved_memory_mb: ")
    assert main(["run", str(QUICKSTART), "--dry-run", "--set", 'fleet.devices=["esp32_s3"]', "--set",
                 "data.dataset=synthetic", "--set", "model.name=vgg11", "--out", str(out)]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("edgefl: error: --set: fleet.devices: device esp32_s3 keeps at least 1.300 MB")
    assert line.endswith("drop the device or choose a smaller model")
    assert not out.exists()


def test_trades_is_refused_with_fgsm() -> None:
    """TRADES's inner maximisation of KL(f(x) || f(x')) has a zero gradient at x' = x, where FGSM
    (no random start) would take its one step: x' = x."""
    with pytest.raises(EdgeflError, match=r"attack\.name: TRADES raises KL"):
        load_scenario(QUICKSTART, ['training.objective="trades"', 'attack.name="fgsm"'])
    load_scenario(QUICKSTART, ['training.objective="trades"', 'attack.name="pgd_l2"'])


@pytest.mark.parametrize(("value", "hint"), [("esp32_s3", '(a list: ["esp32_s3"])'),
                                             ("[esp32_s3]", '(TOML quotes text inside a list: ["a", "b"])')])
def test_a_list_of_text_given_as_text_shows_how_to_write_it(value: str, hint: str, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", str(QUICKSTART), "--dry-run", "--set", f"fleet.devices={value}",
                 "--out", str(tmp_path / "out")]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert line.startswith("edgefl: error: --set: fleet.devices: must be a list of str")
    assert line.endswith(hint)


@pytest.mark.parametrize("key", ["attack.steps", "evaluation.steps"])
def test_attack_steps_are_capped(key: str) -> None:
    """Steps priced one by one in the swap walk: a billion once ran the host out of memory."""
    quickstart = Path(__file__).parents[1] / "scenarios" / "quickstart.toml"
    assert load_scenario(quickstart, [f"{key}=1000"])
    with pytest.raises(EdgeflError, match=f"{key}: must be 1 to 1,000"):
        load_scenario(quickstart, [f"{key}=1001"])


def test_a_scenario_that_is_a_device_or_too_large_is_refused_unread(tmp_path: Path) -> None:
    with pytest.raises(EdgeflError, match="/dev/zero: file: is not a regular file"):
        load_scenario("/dev/zero")
    big = tmp_path / "big.toml"
    big.write_text("rounds = 1\n" + "#" * (1 << 20))
    with pytest.raises(EdgeflError, match="too large for a scenario"):
        load_scenario(big)


def test_a_folder_named_like_a_bundled_scenario_does_not_hide_it(tmp_path: Path, monkeypatch) -> None:
    from edgefl.cli import scenario_file

    monkeypatch.chdir(tmp_path)
    (tmp_path / "quickstart").mkdir()
    assert scenario_file("quickstart").name == "quickstart.toml" and scenario_file("quickstart").is_file()
    (tmp_path / "quickstart.toml").write_text("rounds = 1\n")
    assert scenario_file("quickstart") == Path("quickstart.toml")  # a file of that name wins


@pytest.mark.parametrize(("key", "value", "says"), [
    ("rounds", "1000001", "rounds: must be 1 to 1,000,000"),
    ("compare.rounds.jfat", "1000001", "compare.rounds.jfat: must be 1 to 1,000,000"),
    ("fleet.reserved_memory_mb", "1e300", "fleet.reserved_memory_mb: must be positive (MB), at most 1e+09")])
def test_counts_and_budgets_past_any_fleet_are_refused(key: str, value: str, says: str) -> None:
    quickstart = Path(__file__).parents[1] / "scenarios" / "quickstart.toml"
    with pytest.raises(EdgeflError, match=says.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        load_scenario(quickstart, [f"{key}={value}"])


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["fifo", "link to /dev/zero"])
def test_a_profile_file_that_is_a_pipe_or_a_device_is_refused_not_read(tmp_path: Path, kind: str) -> None:
    """A FIFO or a link to /dev/zero named NAME.toml among a scenario's profiles: reading it would
    block or never end (issue 39); every command that lists the profiles refuses it in one line."""
    import subprocess
    import sys

    folder = tmp_path / "device_profiles"
    folder.mkdir()
    odd = folder / "odd.toml"
    if kind == "fifo":
        os.mkfifo(odd)
    else:
        odd.symlink_to("/dev/zero")
    scenario = tmp_path / "s.toml"
    scenario.write_text("rounds = 1\n")
    code = "import sys; from edgefl.cli import main; sys.exit(main())"
    for args in (["devices", "list", "--scenario", str(scenario)],
                 ["run", str(scenario), "--dry-run", "--out", str(tmp_path / "run")]):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 2, (args, done.stderr)
        assert done.stderr == (f"edgefl: error: {odd}: file: is not a regular file (a device or a pipe); "
                               "give a profile .toml file\n")
    with pytest.raises(EdgeflError, match="too large for a profile"):
        big = tmp_path / "big.toml"
        big.write_text("name = 'x'\n" + "#" * (1 << 20))
        load_profile(big, DeviceProfile)


def test_an_inline_table_set_on_a_section_keeps_its_other_keys() -> None:
    """`--set 'fleet={clients=4}'` replaced the whole [fleet] table silently (issue 39); now it sets
    what it names, as `--set fleet.clients=4` does. A table that is one value is still replaced."""
    whole = load_scenario(QUICKSTART)
    inline = load_scenario(QUICKSTART, ["fleet={clients=4}"])
    assert inline.fleet == load_scenario(QUICKSTART, ["fleet.clients=4"]).fleet
    assert inline.fleet.clients == 4 and inline.fleet.pool == whole.fleet.pool == "edge"
    assert inline.fleet.reserved_memory_mb == whole.fleet.reserved_memory_mb == 1.3
    compare = load_scenario(ROOT / "scenarios" / "compare-digits.toml", ["compare.rounds={jfat=3}"])
    assert compare.compare.rounds == {"jfat": 3}


@pytest.mark.parametrize("old", sorted(MOVED))
def test_a_key_that_moved_is_named_with_where_it_is_now(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                        old: str) -> None:
    """A scenario written for an earlier edgefl (`selection.oort_alpha`, now `[oort] alpha`): one line
    naming the new key, in the file and from --set; every new key is one of the schema's."""
    new = MOVED[old]
    assert schema_kind(new.split(".")) == "value", new
    section, key = old.split(".")
    path = tmp_path / "old.toml"
    path.write_text(f'method = "jfat"\n[{section}]\n{key} = 1\n', encoding="utf-8")
    part, leaf = new.split(".")
    for argv, where in ([str(path)], path), (["quickstart", "--set", f"{old}=1"], "--set"):
        assert main(["run", *argv, "--dry-run", "--out", str(tmp_path / "out")]) == 2
        assert one_error_line(capsys.readouterr().err) == (
            f"edgefl: error: {where}: {old}: unknown key: it moved to {new} (write {leaf} under [{part}])")
    assert not (tmp_path / "out").exists()
