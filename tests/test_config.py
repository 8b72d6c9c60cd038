"""Scenario files: validation errors name the file and the key, --set overrides, defaults, to_toml."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from edgefl.config import KNOBS, Knobs, KnobSections, Scenario
from edgefl.errors import EdgeflError
from edgefl.methods.fedcurv import CurvConfig
from edgefl.methods.fedprox import ProxConfig
from edgefl.methods.width import WidthConfig
from edgefl.scenario import load_scenario, to_toml


def write(tmp_path: Path, text: str, name: str = "scenario.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def expect_error(path: Path, key: str, overrides: list[str] | None = None) -> EdgeflError:
    """load_scenario must fail with one line naming the file and `key`."""
    with pytest.raises(EdgeflError) as info:
        load_scenario(path, overrides)
    err = info.value
    assert err.key == key
    assert err.where == str(path)
    message = str(err)
    assert str(path) in message
    assert key in message
    assert "\n" not in message
    return err


BAD = [
    pytest.param('rounds = 5\ncolour = "red"\n', "colour", id="unknown-top-level-key"),
    pytest.param("[training]\nlrr = 1\n", "training.lrr", id="unknown-section-key"),
    pytest.param("[nosuchsection]\nx = 1\n", "nosuchsection", id="unknown-section"),
    pytest.param('rounds = "ten"\n', "rounds", id="string-for-int"),
    pytest.param("rounds = true\n", "rounds", id="bool-for-int"),
    pytest.param("rounds = 2.5\n", "rounds", id="float-for-int"),
    pytest.param('[training]\nlr = "fast"\n', "training.lr", id="string-for-float"),
    pytest.param("[training]\nlr = true\n", "training.lr", id="bool-for-float"),
    pytest.param("training = 5\n", "training", id="scalar-for-section"),
    pytest.param('[fleet]\ndevices = "tx2"\n', "fleet.devices", id="string-for-list"),
    pytest.param("[fleet]\nreserved_memory_mb = -5\n", "fleet.reserved_memory_mb",
                 id="negative-memory"),
    pytest.param("[fleet]\nsample_fraction = 1.5\n", "fleet.sample_fraction",
                 id="fraction-above-1"),
    pytest.param("[fleet]\nsample_fraction = 0\n", "fleet.sample_fraction", id="fraction-zero"),
    pytest.param("[fleet]\nmemory_fraction = [0.3, 0.1]\n", "fleet.memory_fraction",
                 id="range-reversed"),
    pytest.param("[data]\nval_fraction = 1.0\n", "data.val_fraction", id="val-fraction-1"),
    pytest.param("rounds = 0\n", "rounds", id="zero-rounds"),
    pytest.param("[training]\nlr = -0.1\n", "training.lr", id="negative-lr"),
    pytest.param('method = "fedfoo"\n', "method", id="unknown-method"),
    pytest.param('[model]\nname = "resnet999"\n', "model.name", id="unknown-model"),
    pytest.param('[data]\ndataset = "nodataset"\n', "data.dataset", id="unknown-dataset"),
    pytest.param('[data]\npartition = "halves"\n', "data.partition", id="unknown-partition"),
    pytest.param('[fleet]\ndevices = ["tx2", "toaster"]\n', "fleet.devices",
                 id="unknown-device"),
    pytest.param('[fleet]\npool = "nowhere"\n', "fleet.pool", id="unknown-pool"),
    pytest.param('[fleet]\napps = ["idle", "mining"]\n', "fleet.apps", id="unknown-app"),
    pytest.param("[prox]\nnu = 1\n", "prox.nu", id="unknown-knob-key"),
    pytest.param('[prox]\nmu = "small"\n', "prox.mu", id="string-for-knob-float"),
    pytest.param("[prox]\nmu = -0.1\n", "prox.mu", id="knob-range-check"),
    pytest.param("prox = 1\n", "prox", id="scalar-for-knob-section"),
    pytest.param("sections = {}\n", "sections", id="the-schema-field-is-no-key"),
    pytest.param('[distill]\nfamily = ["vgg11", "toaster"]\n', "distill.family", id="knob-unknown-name"),
]


@pytest.mark.parametrize(("text", "key"), BAD)
def test_bad_scenario_names_file_and_key(tmp_path: Path, text: str, key: str) -> None:
    expect_error(write(tmp_path, text), key)


def test_unknown_names_list_the_known_ones(tmp_path: Path) -> None:
    err = expect_error(write(tmp_path, 'method = "fedfoo"\n'), "method")
    assert "fedfoo" in str(err)
    assert "jfat" in str(err)
    err = expect_error(write(tmp_path, '[fleet]\ndevices = ["toaster"]\n'), "fleet.devices")
    assert "toaster" in str(err)
    assert "tx2" in str(err)


def test_unknown_key_lists_known_keys(tmp_path: Path) -> None:
    err = expect_error(write(tmp_path, "[training]\nlrr = 1\n"), "training.lrr")
    assert "lr" in err.fix
    assert "local_iters" in err.fix


# method knob sections ---------------------------------------------------------------------------


def test_a_knob_section_reads_typed_and_round_trips(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, 'method = "fedprox_at"\n[prox]\nmu = 0.5\n'), ["width.levels=[0.5, 1]"])
    assert s.knobs(ProxConfig).mu == 0.5 and s.knobs(WidthConfig).levels == [0.5, 1.0]
    assert s.knobs(CurvConfig) == CurvConfig()  # a section not given: its defaults
    text = to_toml(s)
    assert "\n[prox]\nmu = 0.5\n" in text and "\n[width]\nlevels = [0.5, 1.0]\n" in text
    assert text.index("[cost]") < text.index("[curv]") < text.index("[prox]") < text.index("[ray]")
    assert load_scenario(write(tmp_path, text, "resolved.toml")) == s


def test_unknown_section_lists_the_knob_sections(tmp_path: Path) -> None:
    err = expect_error(write(tmp_path, "[proxx]\nmu = 1\n"), "proxx")
    sections = list(KNOBS.classes())  # every registered knob section, by name, among the scenario's
    assert sections and f"cost, {', '.join(sections)}, ray" in err.fix


def test_knob_sections_register_once_and_never_as_a_scenario_key() -> None:
    sections = KnobSections()

    @dataclasses.dataclass
    class Mine(Knobs):
        tau: float = 0.4

    assert sections.register("mine")(Mine) is Mine and Mine.section == "mine"
    assert sections.defaults() == {"mine": Mine()}
    for name in ("mine", "rounds", "training"):
        with pytest.raises(ValueError, match=name):
            sections.register(name)(Mine)


def test_an_unregistered_knob_class_is_refused() -> None:
    @dataclasses.dataclass
    class Loose(Knobs):
        tau: float = 0.4

    with pytest.raises(TypeError, match="Loose"):
        Scenario().knobs(Loose)


def test_invalid_toml_names_file(tmp_path: Path) -> None:
    expect_error(write(tmp_path, "rounds = \n[fleet\n"), "syntax")


def test_missing_file_names_file(tmp_path: Path) -> None:
    expect_error(tmp_path / "nope.toml", "file")


@pytest.mark.parametrize(("clients", "skew_s"), [(51, 2.0), (5, 25.0), (3, 60.0)])
def test_skew_partition_rejects_too_many_foreign_shares(
    tmp_path: Path, clients: int, skew_s: float
) -> None:
    # (clients - 1) x s >= 100: client k would hold a negative share of its own label group.
    text = f'[data]\npartition = "skew"\nskew_s = {skew_s}\n[fleet]\nclients = {clients}\n'
    expect_error(write(tmp_path, text), "data.skew_s")


@pytest.mark.parametrize(("clients", "skew_s"), [(50, 2.0), (5, 24.9), (5, 2.0)])
def test_skew_partition_accepts_feasible_shares(
    tmp_path: Path, clients: int, skew_s: float
) -> None:
    text = f'[data]\npartition = "skew"\nskew_s = {skew_s}\n[fleet]\nclients = {clients}\n'
    s = load_scenario(write(tmp_path, text))
    assert s.data.partition == "skew"
    assert s.fleet.clients == clients
    assert s.data.skew_s == skew_s


def test_skew_limit_only_applies_to_skew_partition(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, '[data]\npartition = "iid"\n[fleet]\nclients = 51\n'))
    assert s.fleet.clients == 51


# --set overrides ---------------------------------------------------------------------------------


def test_override_dotted_key_reaches_section(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, ""), ["training.lr=0.1"])
    assert s.training.lr == 0.1
    assert type(s.training.lr) is float


def test_override_into_a_file_value_that_is_no_table_says_so(tmp_path: Path) -> None:
    path = write(tmp_path, "[[fleet]]\nclients = 3\n")  # an array of tables, not [fleet]
    with pytest.raises(EdgeflError) as info:
        load_scenario(path, ["fleet.clients=4"])
    assert info.value.where == "--set" and "make it a [fleet] table" in info.value.fix
    plain = write(tmp_path, 'method = "jfat"\n[fleet]\npool = "edge"\n[prox]\nmu = 0.1\n', "v.toml")
    for key, says in (("method.x", "'method' is a value, not a section: --set method=VALUE"),
                      ("fleet.pool.x", "'fleet.pool' is a value, not a section: --set fleet.pool=VALUE"),
                      ("prox.mu.x", "'prox.mu' is a value, not a section: --set prox.mu=VALUE")):
        with pytest.raises(EdgeflError) as info:
            load_scenario(plain, [f"{key}=1"])
        assert says in info.value.fix


def test_override_int_accepted_for_float(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, ""), ["training.lr=1"])
    assert s.training.lr == 1.0
    assert type(s.training.lr) is float


def test_override_int_stays_int(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, "rounds = 3\n"), ["rounds=7", "fleet.clients=11"])
    assert s.rounds == 7
    assert type(s.rounds) is int
    assert s.fleet.clients == 11


def test_override_bare_string_replaces_bad_file_value(tmp_path: Path) -> None:
    # The file names an unknown method; the bare-string override fixes it before validation.
    path = write(tmp_path, 'method = "nosuchmethod"\n')
    s = load_scenario(path, ["method=jfat"])
    assert s.method == "jfat"
    s = load_scenario(write(tmp_path, "", "other.toml"), ["fleet.pool=low"])
    assert s.fleet.pool == "low"


def test_override_toml_list_value(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, ""), ['fleet.devices=["tx2", "kcu1500"]'])
    assert s.fleet.devices == ["tx2", "kcu1500"]


def test_later_override_wins(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, "rounds = 3\n"), ["rounds=4", "rounds=9"])
    assert s.rounds == 9


def expect_set_error(path: Path, key: str, overrides: list[str]) -> EdgeflError:
    """An override's error names the --set flag and the key, not the file that was fine."""
    with pytest.raises(EdgeflError) as info:
        load_scenario(path, overrides)
    assert info.value.where == "--set"
    assert key in info.value.key
    assert str(path) not in str(info.value) and "\n" not in str(info.value)
    return info.value


@pytest.mark.parametrize("item", ["rounds", "=5", "training.lr"])
def test_malformed_override_names_the_item(tmp_path: Path, item: str) -> None:
    assert "KEY=VALUE" in expect_set_error(write(tmp_path, ""), item, [item]).fix


def test_override_wrong_type_names_key(tmp_path: Path) -> None:
    expect_set_error(write(tmp_path, ""), "rounds", ["rounds=ten"])


def test_override_unknown_key_names_key(tmp_path: Path) -> None:
    expect_set_error(write(tmp_path, ""), "training.lrr", ["training.lrr=1"])


def test_override_into_scalar_fails(tmp_path: Path) -> None:
    expect_set_error(write(tmp_path, "rounds = 3\n"), "rounds", ["rounds.x=1"])


def test_override_impossible_value_names_key(tmp_path: Path) -> None:
    expect_set_error(write(tmp_path, ""), "fleet.sample_fraction", ["fleet.sample_fraction=1.5"])


def test_a_file_error_beside_an_override_still_names_the_file(tmp_path: Path) -> None:
    expect_error(write(tmp_path, "rounds = 0\n"), "rounds", ["seed=3"])


# defaults ----------------------------------------------------------------------------------------


def test_empty_file_is_refused_and_with_a_set_gives_code_defaults(tmp_path: Path) -> None:
    with pytest.raises(EdgeflError) as info:  # issue 13: no longer silently the default scenario
        load_scenario(write(tmp_path, ""))
    assert info.value.key == "file" and "is empty" in info.value.fix
    assert load_scenario(write(tmp_path, ""), ["rounds=20"]) == Scenario()


def test_absent_keys_take_defaults(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, "rounds = 4\n[training]\nlr = 0.1\n"))
    expected = Scenario()
    expected.rounds = 4
    expected.training = dataclasses.replace(expected.training, lr=0.1)
    assert s == expected


def test_defaults_follow_release_protocol() -> None:
    # REFERENCE.md, training protocol: momentum 0.9, lr x0.994 per round, weight decay 1e-4,
    # PGD-10 training at eps 8/255 with step 2/255, PGD-20 evaluation, 20 % kept for validation,
    # available memory U(0, 0.2) x device memory.
    s = Scenario()
    assert s.training.momentum == 0.9
    assert s.training.lr_decay == 0.994
    assert s.training.weight_decay == 1e-4
    assert s.attack.name == "pgd"
    assert s.attack.steps == 10
    assert s.attack.eps == pytest.approx(8 / 255)
    assert s.attack.step_size == pytest.approx(2 / 255)
    assert s.evaluation.steps == 20
    assert s.data.val_fraction == 0.2
    assert s.fleet.memory_fraction == [0.0, 0.2]


# to_toml round trip ------------------------------------------------------------------------------


ROUND_TRIP = """\
method = "jfat"
rounds = 7
seed = 3
device = "cpu"

[data]
root = 'C:\\data\\"quoted" dir'
partition = "skew"
skew_s = 1.5

[fleet]
clients = 12
sample_fraction = 0.25
devices = ["tx2", "kcu1500"]
balance_s = -1
apps = ["idle", "video_4k"]
app_memory = false
memory_fraction = [0.05, 0.15]
reserved_memory_mb = 60

[training]
lr = 0.01
fedbn = false

[attack]
eps = 0.0313725

[cost]
accounting = "paper"
communication = false
"""


def test_to_toml_round_trips(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, ROUND_TRIP))
    assert s.data.root == 'C:\\data\\"quoted" dir'
    assert s.fleet.balance_s == -1.0
    assert s.fleet.reserved_memory_mb == 60.0
    again = load_scenario(write(tmp_path, to_toml(s), "resolved.toml"))
    assert again == s


def test_to_toml_round_trips_defaults(tmp_path: Path) -> None:
    s = Scenario()
    assert load_scenario(write(tmp_path, to_toml(s), "resolved.toml")) == s


def test_to_toml_round_trips_control_characters(tmp_path: Path) -> None:
    # A TOML basic string may hold "\n" as an escape; the resolved file must stay valid TOML.
    s = load_scenario(write(tmp_path, '[data]\nroot = "runs\\ndata\\u0001x"\n'))
    assert s.data.root == "runs\ndata\x01x"
    again = load_scenario(write(tmp_path, to_toml(s), "resolved.toml"))
    assert again == s


def test_compare_rounds_table_round_trips(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, '[compare]\nrounds = { jfat = 500, fedprophet = 3500 }\n'))
    assert s.compare.rounds == {"jfat": 500, "fedprophet": 3500}
    assert load_scenario(write(tmp_path, to_toml(s), "resolved.toml")) == s
