"""Scenario files: TOML loading, `--set` overrides, type and range checks, names checked against the
registries, and the resolved scenario written back as TOML.

A scenario file is a short diff over the defaults in edgefl.config (each method's knobs in its own
file, registered there). Unknown keys, wrong types and impossible values stop before any work with
one line naming the file, the key and the fix.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import typing
from pathlib import Path
from typing import Any

from edgefl.config import (
    KNOBS,
    MAX_BALANCE_S,
    MAX_BATCH,
    MAX_BUFFER,
    MAX_CHANNELS,
    MAX_CLASSES,
    MAX_EPOCHS,
    MAX_ITERS,
    MAX_OVER_SELECTION,
    MAX_SECONDS,
    MAX_SEEDS,
    MAX_SIDE,
    MAX_STEPS,
    MAX_THREADS,
    MAX_WIDTH,
    Check,
    Named,
    Scenario,
)
from edgefl.devices.profile import MAX_FIGURE, MAX_LINK_MBPS, MIN_FIGURE
from edgefl.errors import EdgeflError
from edgefl.methods import METHODS  # every method's knob section registers on import
from edgefl.methods.base import method_class, refuse_ignored
from edgefl.registry import unloaded
from edgefl.selection import SELECTORS  # every policy's knob section too
from edgefl.sim.links import server_mbps
from edgefl.tomlschema import build_value, printable, read_toml, reject_unknown, toml_value

NOT_FOUND = ("not found; give the path of a scenario .toml or the name of a bundled scenario "
             "(edgefl scenarios list)")


def load_scenario(path: str | Path, overrides: list[str] | None = None,
                  beside: str | None = None) -> Scenario:
    """Read (UTF-8, a byte-order mark allowed), override, type-check and validate a scenario file; a
    file with no key at all and no `--set` is refused rather than silently run as the defaults.
    Defaults the user did not set that cannot fit the chosen dataset are scaled to it (`fit_defaults`).
    Device profiles and a relative trace are found beside the file `beside` (default: `path`; a
    resumed run's is the scenario file it started from)."""
    where = str(path)
    raw = read_toml(Path(path), where, "scenario", NOT_FOUND)
    for item in overrides or []:
        apply_override(raw, item)
    try:
        scenario = scenario_from_toml(raw, where)  # unknown keys first, then a file that sets none
        if not sets_a_key(raw):
            raise EdgeflError(where, "file", "is empty (no key set); a scenario sets at least one key, e.g. "
                              "method = \"jfat\" (edgefl scenarios list shows complete ones)")
        validate(scenario, where, beside)
    except EdgeflError as exc:
        raise blame_set(exc, where, overrides or []) from None
    return fit_defaults(scenario, raw)


def fit_defaults(s: Scenario, raw: dict[str, Any]) -> Scenario:
    """Scale the method's defaults the chosen dataset cannot hold, when the user did not set them (a
    value the user set is kept, and refused later with one line if it does not fit)."""
    from edgefl.data.datasets import dataset_spec

    method_class(s.method, s).fit_defaults(s, raw, dataset_spec(s.data).train_samples)
    return s


def blame_set(exc: EdgeflError, where: str, overrides: list[str]) -> EdgeflError:
    """`exc` as an error of the --set flag when it is about `where`'s key that an override set."""
    keys = [item.partition("=")[0].strip() for item in overrides]
    if exc.where != where or not any(_same_key(k, exc.key) for k in keys):
        return exc
    return EdgeflError("--set", exc.key, exc.fix)


def _same_key(set_key: str, error_key: str) -> bool:
    """Whether an error about `error_key` is about the value `--set set_key=...` gave."""
    return (set_key == error_key or set_key.startswith(error_key + ".")
            or error_key.startswith(set_key + "."))


def sets_a_key(raw: dict[str, Any]) -> bool:
    """Whether a parsed scenario sets any key (tables that hold only empty tables set none)."""
    return any(not isinstance(v, dict) or sets_a_key(v) for v in raw.values())


def apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply one `--set a.b=value`; the value is read as TOML, or as a bare string. An inline table
    given to a section (`--set 'fleet={clients=4}'`) sets the keys it names and keeps the others, as
    `--set fleet.clients=4` does; a table that is a value (`compare.rounds`) is replaced whole."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise EdgeflError("--set", printable(item), "write it as KEY=VALUE, e.g. rounds=5")
    try:
        value = tomllib.loads(f"v = {text}")["v"]
    except (ValueError, RecursionError):  # TOMLDecodeError, an int over 4300 digits, deep nesting
        value = text
    *parents, leaf = key.strip().split(".")
    if not all(part.strip() for part in [*parents, leaf]):
        raise EdgeflError("--set", printable(item), "a dotted key has an empty part; write it as "
                          "SECTION.KEY=VALUE, e.g. fleet.clients=10")
    node = raw
    for i, part in enumerate(parents):
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise EdgeflError("--set", printable(key), not_a_table(parents[:i + 1]))
    _set(node, [*parents, leaf], value)


def _set(node: dict[str, Any], path: list[str], value: Any) -> None:
    """node[path[-1]] = value, a table into a section key by key."""
    leaf, there = path[-1], node.get(path[-1])
    if isinstance(value, dict) and isinstance(there, dict) and schema_kind(path) == "table":
        for key, inner in value.items():
            _set(there, [*path, key], inner)
    else:
        node[leaf] = value


def not_a_table(path: list[str]) -> str:
    """Why `--set` cannot reach into the dotted key `path`, whose value is not a table."""
    prefix, kind = ".".join(path), schema_kind(path)
    if kind == "table":
        return (f"{prefix!r} is not a table (the scenario file or an earlier --set gives it a value); "
                f"make it a [{prefix}] table")
    if kind == "value":
        return f"{prefix!r} is a value, not a section: --set {prefix}=VALUE"
    return f"{prefix!r} is not a key of a scenario (edgefl/config.py lists them)"


def schema_kind(path: list[str]) -> str | None:
    """What the dotted key `path` names in a scenario: a "table" (a section, a knob section), a
    "value", or None (no such key)."""
    kind: Any = schema().get(path[0])
    for part in path[1:]:
        kind = typing.get_type_hints(kind).get(part) if dataclasses.is_dataclass(kind) else None
    return None if kind is None else "table" if dataclasses.is_dataclass(kind) else "value"


def scenario_from_toml(raw: dict[str, Any], where: str) -> Scenario:
    """The Scenario of a TOML table, every key type-checked: the scenario's own keys and sections, and
    each registered knob section built as its method's dataclass."""
    keys = schema()
    reject_unknown(raw, list(keys), where, "")
    values = {name: build_value(keys[name], value, where, name) for name, value in raw.items()}
    knobs = {name: values.pop(name) for name in KNOBS.classes() if name in values}
    return Scenario(**values, sections={**KNOBS.defaults(), **knobs})


def compare_scenario(path: str | Path, overrides: list[str], method: str,
                     seed: int | None = None) -> Scenario:
    """One method's scenario in a comparison (`edgefl compare`): its count of the `[compare] rounds`
    table, unless `--set rounds=N` gives one and no table of its own; on `seed` when given, with no
    list of seeds of its own (a run is one seed, whichever others its comparison has)."""
    keys = {item.partition("=")[0].strip() for item in overrides}
    own_rounds = "rounds" in keys and not any(k.startswith("compare.rounds") for k in keys)
    table = {} if own_rounds else load_scenario(path, overrides).compare.rounds
    return load_scenario(path, [*overrides, f"method={json.dumps(method)}",
                                *([f"rounds={table[method]}"] if method in table else []),
                                *([f"seed={seed}", "compare.seeds=[]"] if seed is not None else [])])


def schema() -> dict[str, Any]:
    """The scenario's keys in file order, each with its type or its section's dataclass; the methods'
    knob sections stand where `Scenario.sections` does."""
    hints = typing.get_type_hints(Scenario)
    keys: dict[str, Any] = {}
    for f in dataclasses.fields(Scenario):
        keys.update(KNOBS.classes() if f.name == "sections" else {f.name: hints[f.name]})
    return keys


def validate(s: Scenario, where: str, beside: str | None = None) -> None:
    """Range checks and known-name checks, each failing on the first bad key (profiles and a trace
    found beside `beside`, default `where`)."""
    for key, ok, fix in range_checks(s):
        if not ok:
            raise EdgeflError(where, key, fix)
    _check_names(s, where, beside or where)
    check_device(s.device, where)
    _check_living(s, where, beside or where)


def range_checks(s: Scenario) -> list[Check]:
    """Every range check of a scenario, in the order `validate` runs them (the docs' reference lists
    what each asks)."""
    return [*_run_checks(s), *_data_checks(s), *_fleet_checks(s), *_training_checks(s), *_cost_checks(s)]


def _run_checks(s: Scenario) -> list[Check]:
    """The run's own keys, its outputs, Ray and compare."""
    return [
        ("rounds", 1 <= s.rounds <= MAX_ITERS, f"must be 1 to {MAX_ITERS:,}"),
        ("seed", s.seed >= 0, "must be a non-negative integer"),
        ("threads", 0 <= s.threads <= MAX_THREADS,
         f"must be 0 (PyTorch's default) or a positive count up to {MAX_THREADS}"),
        ("executor", s.executor in ("local", "ray"), "must be local or ray"),
        ("checkpoint_every", s.checkpoint_every >= 0, "must be 0 (no checkpoints) or a round count"),
        ("output.format", s.output.format in ("auto", "csv", "parquet"), "must be auto, csv or parquet"),
        ("output.parquet_above", s.output.parquet_above >= 0, "must be a client-round count, 0 or more"),
        ("output.trace_clients", s.output.trace_clients >= 0, "must be a client count, 0 or more"),
        ("ray.workers", s.ray.workers >= 0, "must be 0 (one per CPU) or positive"),
        ("ray.max_retries", s.ray.max_retries >= 0, "must be non-negative"),
        *((f"compare.rounds.{printable(m)}", 1 <= n <= MAX_ITERS, f"must be 1 to {MAX_ITERS:,}")
          for m, n in s.compare.rounds.items()),
        ("compare.seeds", all(n >= 0 for n in s.compare.seeds), "must be non-negative integers"),
        ("compare.seeds", len(set(s.compare.seeds)) == len(s.compare.seeds), "must name each seed once"),
        ("compare.seeds", len(s.compare.seeds) <= MAX_SEEDS, f"must be at most {MAX_SEEDS} seeds"),
        ("ray.address", s.ray.trust_address or is_local_address(s.ray.address),
         "joins a Ray cluster that is not on this machine; Ray runs code it receives pickled, so set "
         "ray.trust_address = true only for a cluster you trust, or leave the address empty"),
    ]


def _data_checks(s: Scenario) -> list[Check]:
    """The data and its split."""
    return [
        ("data.alpha", s.data.alpha > 0, "must be positive"),
        ("data.skew_s", 0 <= s.data.skew_s < 100, "must be a percentage in [0, 100)"),
        ("data.shards_per_client", s.data.shards_per_client >= 1, "must be at least 1"),
        ("data.iid_share", 0 <= s.data.iid_share <= 1, "must be a fraction in [0, 1]"),
        ("data.val_fraction", 0 <= s.data.val_fraction < 1, "must be a fraction in [0, 1)"),
        ("data.test_samples", s.data.test_samples >= 0, "must be 0 (all) or positive"),
        ("data.train_samples", s.data.train_samples >= 0, "must be 0 (all) or positive"),
        ("data.synthetic_shape", len(s.data.synthetic_shape) == 3 and min(s.data.synthetic_shape) >= 1
         and s.data.synthetic_shape[0] <= MAX_CHANNELS and max(s.data.synthetic_shape[1:]) <= MAX_SIDE,
         f"must be [channels, height, width], each at least 1, at most {MAX_CHANNELS} channels and "
         f"{MAX_SIDE:,} pixels a side"),
        ("data.synthetic_classes", 2 <= s.data.synthetic_classes <= MAX_CLASSES,
         f"must be 2 to {MAX_CLASSES:,}"),
        ("data.synthetic_train", s.data.synthetic_train >= 1, "must be at least 1"),
        ("data.synthetic_test", s.data.synthetic_test >= 1, "must be at least 1"),
        ("data.synthetic_seed", s.data.synthetic_seed >= 0, "must be a non-negative integer"),
        ("data.skew_s", s.data.partition != "skew" or (s.fleet.clients - 1) * s.data.skew_s < 100,
         "skew gives each client s % of every other group: (clients - 1) x s must stay below 100"),
    ]


def _fleet_checks(s: Scenario) -> list[Check]:
    """The fleet, how its rounds close, the server's links and client selection."""
    return [
        ("fleet.clients", s.fleet.clients >= 1, "must be at least 1"),
        ("fleet.sample_fraction", 0 < s.fleet.sample_fraction <= 1, "must be a fraction in (0, 1]"),
        ("fleet.memory_fraction", _is_range(s.fleet.memory_fraction, 0, 1),
         "must be [low, high] with 0 <= low <= high <= 1"),
        ("fleet.reserved_memory_mb", 0 < s.fleet.reserved_memory_mb <= MAX_FIGURE,
         f"must be positive (MB), at most {MAX_FIGURE:g}"),
        ("fleet.balance_s", abs(s.fleet.balance_s) <= MAX_BALANCE_S,
         f"must be in [-{MAX_BALANCE_S:g}, {MAX_BALANCE_S:g}] (0 balanced; the release's unbalanced "
         "fleet is -1)"),
        ("server.down_mbit_s", 0 <= s.server.down_mbit_s <= MAX_LINK_MBPS, f"must be 0 (unlimited) or "
         f"positive, at most {MAX_LINK_MBPS:g} (Mbit/s)"),
        ("server.up_mbit_s", 0 <= s.server.up_mbit_s <= MAX_LINK_MBPS, f"must be 0 (unlimited) or "
         f"positive, at most {MAX_LINK_MBPS:g} (Mbit/s)"),
        *_per_device_checks(s),
        ("fleet.online_start_h", 0 <= s.fleet.online_start_h < 24, "must be a local hour in [0, 24)"),
        ("fleet.online_hours", 0 < s.fleet.online_hours <= 24, "must be in (0, 24] (24: always online)"),
        ("fleet.tz_spread_h", 0 <= s.fleet.tz_spread_h <= 24, "must be in [0, 24] hours"),
        ("round.mode", s.round.mode in MODES, f"must be one of: {', '.join(MODES)}"),
        ("round.deadline_s", 0 < s.round.deadline_s <= MAX_SECONDS,
         f"must be positive, at most {MAX_SECONDS:g} (seconds)"),
        ("round.over_selection", 1 <= s.round.over_selection <= MAX_OVER_SELECTION,
         f"must be 1 to {MAX_OVER_SELECTION:g} (FedScale uses 1.3)"),
        ("round.buffer", 1 <= s.round.buffer <= MAX_BUFFER, f"must be 1 to {MAX_BUFFER:,}"),
        ("round.max_staleness", s.round.max_staleness >= 0, "must be non-negative"),
        ("round.concurrency", s.round.concurrency >= 1, "must be at least 1"),
    ]


def _per_device_checks(s: Scenario) -> list[Check]:
    """The server links' shares per device: none negative, each link's total for the fleet
    (edgefl.sim.links.server_mbps) within MAX_LINK_MBPS."""
    totals = server_mbps(s.server, s.fleet.clients)
    return [(f"server.{way}_mbit_s_per_device", share >= 0 and total <= MAX_LINK_MBPS,
             f"must be 0 (none) or positive, with {way}_mbit_s + {way}_mbit_s_per_device x fleet.clients "
             f"at most {MAX_LINK_MBPS:g} (Mbit/s)")
            for way, share, total in (("down", s.server.down_mbit_s_per_device, totals[0]),
                                      ("up", s.server.up_mbit_s_per_device, totals[1]))]


def _training_checks(s: Scenario) -> list[Check]:
    """Local training, its attack, the evaluation and the methods' knob sections."""
    return [
        ("model.width", 0 < s.model.width <= MAX_WIDTH, f"must be positive, at most {MAX_WIDTH:g}"),
        ("training.local_iters", 1 <= s.training.local_iters <= MAX_ITERS, f"must be 1 to {MAX_ITERS:,}"),
        ("training.batch_size", 1 <= s.training.batch_size <= MAX_BATCH, f"must be 1 to {MAX_BATCH:,}"),
        ("training.optimizer", s.training.optimizer in ("sgd", "adam"), "must be sgd or adam"),
        ("training.lr", s.training.lr > 0, "must be positive"),
        ("training.lr_decay", 0 < s.training.lr_decay <= 1, "must be in (0, 1]"),
        ("training.momentum", 0 <= s.training.momentum < 1, "must be in [0, 1)"),
        ("training.weight_decay", s.training.weight_decay >= 0, "must be non-negative"),
        ("training.warmup_rounds", s.training.warmup_rounds >= 0, "must be non-negative"),
        ("training.local_epochs", 0 <= s.training.local_epochs <= MAX_EPOCHS,
         f"must be 0 (use local_iters) or positive, at most {MAX_EPOCHS:,}"),
        ("training.beta", s.training.beta >= 0, "must be non-negative"),
        ("training.precision", s.training.precision in ("fp32", "bf16"), "must be fp32 or bf16"),
        ("attack.eps", s.attack.eps >= 0, "must be non-negative"),
        ("attack.step_size", s.attack.step_size >= 0, "must be non-negative"),
        ("attack.steps", 1 <= s.attack.steps <= MAX_STEPS, f"must be 1 to {MAX_STEPS:,}"),
        ("evaluation.every", s.evaluation.every >= 1, "must be at least 1"),
        ("evaluation.steps", 1 <= s.evaluation.steps <= MAX_STEPS, f"must be 1 to {MAX_STEPS:,}"),
        ("evaluation.eps", s.evaluation.eps >= 0, "must be non-negative"),
        ("evaluation.step_size", s.evaluation.step_size >= 0, "must be non-negative"),
        *((f"{name}.{key}", ok, fix) for name, cls in KNOBS.classes().items()
          for key, ok, fix in [*s.knobs(cls).checks(), *s.knobs(cls).fits(s)]),
        ("evaluation.extra", s.evaluation.attack not in s.evaluation.extra,
         f"must not repeat evaluation.attack ({s.evaluation.attack!r}, already the adv_acc column)"),
        ("evaluation.extra", len(set(s.evaluation.extra)) == len(s.evaluation.extra),
         "names an attack twice; give each once"),
    ]


def _cost_checks(s: Scenario) -> list[Check]:
    """The cost model and the energy model."""
    return [
        ("cost.accounting", s.cost.accounting in ("walk", "paper"), "must be walk or paper"),
        ("cost.server_s", 0 <= s.cost.server_s <= MAX_SECONDS, f"must be 0 to {MAX_SECONDS:g} (seconds)"),
        ("cost.server_gflops", MIN_FIGURE <= s.cost.server_gflops <= MAX_FIGURE,
         f"must be {MIN_FIGURE:g} to {MAX_FIGURE:g} (GFLOP/s)"),
        ("cost.paper_access_s", 0 <= s.cost.paper_access_s <= MAX_SECONDS,
         f"must be 0 to {MAX_SECONDS:g} (seconds)"),
        ("energy.battery_start", _is_range(s.energy.battery_start, 0, 1),
         "must be [low, high] with 0 <= low <= high <= 1 (a share of the battery's capacity)"),
        ("energy.batteries", s.energy.enabled or not s.energy.batteries,
         "needs energy.enabled = true (batteries drain by the energy model's joules)"),
        ("energy.charge_w", s.energy.charge_w >= 0, "must be 0 (never charges) or positive (watts)"),
        ("energy.charge_w", s.energy.batteries or not s.energy.charge_w,
         "charges batteries: set energy.batteries = true, or leave it 0"),
        ("energy.charge_start_h", 0 <= s.energy.charge_start_h < 24, "must be a local hour in [0, 24)"),
        ("energy.charge_hours", 0 < s.energy.charge_hours <= 24,
         "must be in (0, 24] (24: always plugged in)"),
    ]


MODES = ("sync", "deadline", "async")


def check_mode(s: Scenario, modes: tuple[str, ...], where: str) -> None:
    """Refuse a round mode the method (running in `modes`) does not run in."""
    if s.round.mode not in modes:
        raise EdgeflError(where, "round.mode", f"method {s.method} does not run in {s.round.mode} mode "
                          "(its update is not a whole model a stale one can be rebased on); choose "
                          f"{' or '.join(modes)}, or a whole-model method (jfat, fedavg_at, fedprox_at, "
                          "sfat on fedavg or fedprox, gma, fedavg_dynat)")


def _check_living(s: Scenario, where: str, beside: str) -> None:
    """The method runs in the round mode, and a trace given as availability reads."""
    check_mode(s, getattr(METHODS.get(s.method), "modes", MODES), where)  # a factory's: once it is made
    if s.fleet.availability not in ("always", "diurnal"):
        from edgefl.sim.availability import make_availability

        make_availability(s.fleet, s.seed, beside)


LOCAL_HOSTS = ("localhost", "127.0.0.1", "[::1]", "::1")


def is_local_address(address: str) -> bool:
    """"" (a new local Ray) or an address on this machine; "auto" may join any cluster."""
    host = address.removeprefix("ray://").rpartition(":")[0] or address.removeprefix("ray://")
    return address == "" or host in LOCAL_HOSTS


def check_device(name: str, where: str) -> None:
    """auto, cpu, cuda or cuda:N naming a GPU this machine has."""
    import re

    import torch

    match = re.fullmatch(r"cuda(?::(\d{1,4}))?", name)
    if name not in ("auto", "cpu") and match is None:
        raise EdgeflError(where, "device", f"unknown {name!r}; choose auto, cpu, cuda or cuda:N")
    if match is None:
        return
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if int(match.group(1) or 0) >= count:
        have = f"GPUs 0 to {count - 1}" if count else "no GPU PyTorch can use"
        raise EdgeflError(where, "device", f"{name} is not on this machine ({have}); choose auto or cpu")


def _is_range(values: list[float], low: float, high: float) -> bool:
    return len(values) == 2 and low <= values[0] <= values[1] <= high


def registry_names(s: Scenario) -> list[Named]:
    """Every key of `s` that names something registered, with its value and the names known."""
    from edgefl.attacks import ATTACKS
    from edgefl.data import DATASETS, PARTITIONS
    from edgefl.models import MODELS
    from edgefl.models.vision import is_vision
    from edgefl.training.objectives import OBJECTIVES

    named = [
        ("method", s.method, METHODS.names()),
        ("selection.policy", s.selection.policy, SELECTORS.names()),
        *([] if is_vision(s.model.name) else [("model.name", s.model.name, MODELS.names())]),  # built later
        ("data.dataset", s.data.dataset, DATASETS.names()),
        ("data.partition", s.data.partition, PARTITIONS.names()),
        ("attack.name", s.attack.name, [*ATTACKS.names(), "none"]),
        ("training.objective", s.training.objective, OBJECTIVES.names()),
        ("evaluation.attack", s.evaluation.attack, ATTACKS.names()),
    ]
    named += [("evaluation.extra", a, ATTACKS.names()) for a in s.evaluation.extra]
    named += [("compare.rounds", m, METHODS.names()) for m in s.compare.rounds]
    return named + [(f"{name}.{key}", value, known) for name, cls in KNOBS.classes().items()
                    for key, value, known in s.knobs(cls).named()]


def _check_names(s: Scenario, where: str, beside: str) -> None:
    """Names that must exist in a registry or along the scenario's profile search path."""
    from edgefl.attacks import ATTACKS
    from edgefl.devices.catalog import catalog_for

    named = registry_names(s)
    trainers = [n for n in ATTACKS.names() if ATTACKS.get(n).trains]
    if s.attack.name in ATTACKS.names() and s.attack.name not in trainers:
        raise EdgeflError(where, "attack.name", f"{s.attack.name} is an evaluation attack (give it as "
                          f"evaluation.attack or evaluation.extra); train with one of: {', '.join(trainers)}")
    if s.training.objective == "trades" and s.attack.name == "fgsm":
        raise EdgeflError(where, "attack.name", "TRADES raises KL(f(x) || f(x')), which is flat at x' = x, "
                          "where FGSM starts (it has no random start); train TRADES with pgd, pgd_l2 or cw")
    catalog = catalog_for(beside)
    named += [("fleet.devices", d, sorted(catalog.devices)) for d in s.fleet.devices]
    named += [("fleet.apps", a, sorted(catalog.apps)) for a in s.fleet.apps]
    for key, value, known in named:
        if value not in known:
            found = ("" if key not in ("fleet.devices", "fleet.apps") else
                     " (profiles are found in device_profiles/ beside the scenario, on EDGEFL_PROFILE_PATH, "
                     "then edgefl's own: a run resumed must see them as when it started)")
            raise EdgeflError(where, key, f"unknown {value!r}; choose one of: {', '.join(known)}{found}"
                              f"{unloaded(value)}")
    refuse_ignored(s, METHODS.get(s.method), s.method, where)
    _check_width(s, where)
    if not s.fleet.devices and not catalog.pool(s.fleet.pool):
        raise EdgeflError(
            where, "fleet.pool",
            f"no device profile is in pool {s.fleet.pool!r}; pools: {', '.join(catalog.pools())}",
        )


def _check_width(s: Scenario, where: str) -> None:
    """`model.width` other than 1 only for a model that scales (a fixed member of `distill.family`
    keeps its own size)."""
    from edgefl.models import SCALABLE

    if s.model.width != 1 and s.model.name not in SCALABLE:
        raise EdgeflError(where, "model.width", f"{s.model.name} has no width multiplier; it scales "
                          f"{', '.join(sorted(SCALABLE))} (leave model.width at 1 for other models)")


def to_toml(s: Scenario) -> str:
    """The resolved scenario as TOML (saved in every run directory): every key, the knob sections in
    the place of `sections`, sorted by name."""
    top, sections = [], []
    for f in dataclasses.fields(s):
        value = getattr(s, f.name)
        if f.name == "sections":
            sections += [_table(name, s.knobs(cls)) for name, cls in KNOBS.classes().items()]
        elif dataclasses.is_dataclass(value):
            sections.append(_table(f.name, value))
        else:
            top.append(f"{f.name} = {toml_value(value)}")
    return "\n".join(top) + "\n\n" + "\n".join(sections)


def _table(name: str, value: Any) -> str:
    body = "\n".join(f"{k} = {toml_value(v)}" for k, v in vars(value).items())
    return f"[{name}]\n{body}\n"
