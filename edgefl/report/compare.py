"""Comparison of run directories: accuracy, time to finish and to a target, speed-up over jFAT,
memory need against the fleet, and where the time goes.

The columns are what FedProphet (Tang, Wang et al.) reports: the speed-up in total training time over
jFAT (§7.3, Fig. 8), the time breakdown into compute and data access (Fig. 3, Fig. 8) and the
methods' memory need against the fleet's available memory (Fig. 7). Runs that price energy
(`energy.enabled`) also get joules per device, over the run and to the target.

Time breakdown: in a synchronous round every client k spends
download + data access + compute + upload + wait = round time - server time, so the mean over the
round's clients of each component, summed over rounds, plus the server time, is the run's simulated
time: `breakdown` splits the total that way.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
import tomllib
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgefl.errors import EdgeflError, NotARunError
from edgefl.rundir import claim, marker_kind, write_file
from edgefl.runlog import log_file, read_rows

BASELINE = "jfat"
COLUMNS = ["method", "run", "clean_acc", "adv_acc", "sim_time_s", "time_to_target_s", "speedup_vs_jfat",
           "speedup_to_target_vs_jfat", "mem_need_mb", "mem_peak_mb", "fleet_mem_median_mb", "fits_share",
           "data_access_share", "compute_share", "comm_share", "wait_share", "energy_per_device_j",
           "energy_to_target_per_device_j"]
# the stacked breakdown's parts, each the sum of these clients.csv columns (server: metrics.csv)
PARTS = {"compute": ("compute_s",), "data_access": ("data_access_s",),
         "comm": ("download_s", "upload_s"), "wait": ("wait_s",)}
# how comparison.md shows each numeric column
FORMATS = {"clean_acc": ".4f", "adv_acc": ".4f", "sim_time_s": ".1f", "time_to_target_s": ".1f",
           "speedup_vs_jfat": ".2f", "speedup_to_target_vs_jfat": ".2f", "mem_need_mb": ".4g",
           "mem_peak_mb": ".4g", "fleet_mem_median_mb": ".4g", "fits_share": ".3f",
           "data_access_share": ".3f", "compute_share": ".3f", "comm_share": ".3f", "wait_share": ".3f",
           "energy_per_device_j": ".4g", "energy_to_target_per_device_j": ".4g"}

Row = dict[str, Any]
NEEDED = {"metrics.csv": ["round", "sim_time_s", "round_time_s", "server_s", "clean_acc", "adv_acc"],
          "events.csv": ["round", "client", "start_s", "end_s", "phase"],
          "clients.csv": ["round", "client", "flops", "mem_avail_bytes", "mem_req_bytes",
                          *(c for cols in PARTS.values() for c in cols)]}


@dataclass(frozen=True)
class Run:
    """One run directory's method and logs (CSV rows as strings)."""

    path: Path
    scenario: dict[str, Any]  # the resolved scenario.toml
    metrics: list[dict[str, str]]
    clients: list[dict[str, str]]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def method(self) -> str:
        return str(self.scenario["method"])


def load_run(path: Path) -> Run:
    """Read a run directory written by `edgefl run`, checking every value the reports use."""
    if not path.is_dir():
        raise NotARunError(str(path), "folder", "no such folder")
    if marker_kind(path) == "compare":
        runs = " ".join(str(p) for p in sorted(path.iterdir()) if marker_kind(p) == "run")
        raise NotARunError(str(path), "folder", "is a comparison, not a run", f"plot its runs ({runs}); "
                           "edgefl compare drew their figures into its figures/ already")
    metrics, clients = read_log(path, "metrics.csv"), read_log(path, "clients.csv")
    rounds = {r["round"] for r in metrics}
    stray = next((c["round"] for c in clients if c["round"] not in rounds), None)
    if stray is not None:  # killed between a round's rows, or a log cut by hand or by a full disk
        fix = ("the run finished (summary.json), so metrics.csv was cut since: run it again with "
               "edgefl run --overwrite" if (path / "summary.json").exists()
               else "if the run was interrupted, finish it with edgefl run --resume")
        raise NotARunError(str(path), "round",
                           f"clients.csv has rows of round {stray}, which metrics.csv lacks", fix)
    return Run(path, _read_scenario(path), metrics, clients)


# the scenario keys the reports read, and their types
SCENARIO_KEYS: dict[str, type | tuple[type, ...]] = {
    "method": str, "seed": int, "fleet.pool": str, "fleet.balance_s": (int, float),
    "fleet.reserved_memory_mb": (int, float)}


def _read_scenario(path: Path) -> dict[str, Any]:
    file = path / "scenario.toml"
    if not file.is_file():
        raise NotARunError(str(path), "scenario.toml", "missing")
    try:
        scenario = tomllib.loads(file.read_text())
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise NotARunError(str(file), "scenario.toml", f"cannot be read as TOML ({reason})") from None
    for key, kind in SCENARIO_KEYS.items():
        value = _value(scenario, key)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise NotARunError(str(file), key, "missing or of the wrong type")
    return scenario


SETUP = ("seed", "data", "fleet", "model", "training", "attack", "evaluation", "cost", "round")  # alike in
# a comparison's runs: `edgefl compare` varies the method, its knobs and its rounds only


def differing_setup(paths: list[Path], keys: Sequence[str] = SETUP) -> list[str]:
    """The `keys` (of SETUP) in which a run's scenario.toml differs from the first run's."""
    first, *rest = [_read_scenario(p) for p in paths]
    return [key for key in keys if any(r.get(key) != first.get(key) for r in rest)]


def _value(scenario: dict[str, Any], key: str, default: Any = None) -> Any:
    """The dotted `key` of a scenario.toml read as TOML (`default` where it is left out; None where
    its section is not a table)."""
    section, _, leaf = key.rpartition(".")
    table = scenario.get(section, {}) if section else scenario
    return table.get(leaf, default) if isinstance(table, dict) else None


# how each column the reports read must parse ("" allowed where a round may leave it empty)
NUMBERS = {"round": int, "client": int, "mem_avail_bytes": int, "mem_req_bytes": int}
OPTIONAL = {"clean_acc", "adv_acc", "eps", "round_time_s"}
TEXT = {"phase"}  # read as it is


def read_log(path: Path, name: str) -> list[dict[str, str]]:
    """A log's rows as text, checked; clients and events may be CSV or Parquet (`runlog.read_rows`)."""
    stem = name.removesuffix(".csv")
    header, rows = read_rows(path, stem)
    file = log_file(path, stem)
    needed = [*NEEDED[name], *(["finish_s"] if "status" in header else [])]  # where a client stopped
    missing = [c for c in needed if c not in header]
    if missing:
        raise NotARunError(str(file), missing[0], "missing from the header: not a log edgefl wrote, or "
                           "an older edgefl's", "run it again")
    if not rows:
        raise NotARunError(str(file), "rows", "no rounds logged yet", "run at least one round")
    for line, row in enumerate(rows, start=2):
        _check_row(file, line, row, [*needed, *(c for c in ("eps", "energy_j") if c in header)])
    return rows


def _check_row(file: Path, line: int, row: dict[Any, Any], columns: list[str]) -> None:
    """A whole row whose read columns are numbers (integers where counted, finite)."""
    if None in row or None in row.values():
        raise NotARunError(str(file), f"line {line}", "has a different number of fields than the header "
                           "(cut or edited)")
    if "adv_acc" in columns and (row["clean_acc"] == "") != (row["adv_acc"] == ""):
        raise NotARunError(str(file), f"line {line}", "gives one of clean_acc and adv_acc without the other")
    for column in columns:
        text = row[column]
        if (text == "" and column in OPTIONAL) or column in TEXT:
            continue
        try:
            ok = math.isfinite(NUMBERS.get(column, float)(text))
        except ValueError:
            ok = False
        if not ok:
            raise NotARunError(str(file), f"line {line}", f"{column} is {text[:20]!r}, not a number")


def evaluated(run: Run) -> list[tuple[float, float, float]]:
    """(simulated seconds, clean acc, adversarial acc) of the evaluated rounds; none in a dry run."""
    return [(float(r["sim_time_s"]), float(r["clean_acc"]), float(r["adv_acc"]))
            for r in _evaluated_rows(run)]


def evaluated_rounds(run: Run) -> list[int]:
    """The evaluated rounds, counted from 1, in the order of `evaluated`."""
    return [int(r["round"]) + 1 for r in _evaluated_rows(run)]


def _evaluated_rows(run: Run) -> list[dict[str, str]]:
    return [r for r in run.metrics if r.get("adv_acc")]


def sim_time(run: Run) -> float:
    """Simulated seconds to finish the logged rounds."""
    return float(run.metrics[-1]["sim_time_s"])


def time_to_target(run: Run, target: float | None) -> float | None:
    """First simulated time at which the adversarial accuracy reaches `target`; None if never."""
    if target is None:
        return None
    return next((t for t, _, adv in evaluated(run) if adv >= target), None)


def breakdown(run: Run) -> dict[str, float]:
    """Seconds the run's mean client spends in compute, data access, comm (download + upload), wait
    and server; the parts add up to the run's simulated time.

    Rounds (sync, deadline): the mean over each round's clients, summed over rounds. A client
    stopped early (dropped, late, offline) counts its phases up to where it stopped (`finish_s`);
    what is left of its round, like a finished client's wait for the stragglers (and any time the
    round waited for a device to come online), is wait. Async: the mean over the
    min(`round.concurrency`, clients) slots of the phases in the events log (cut where a client
    stopped); a slot's time without a client working is wait, and the server aggregates beside the
    slots (edgefl.sim.fedbuff `Buffered`), so its time is not part of theirs: the other parts add up
    to the simulated time, the server's comes on top. (A client still working when an async run
    ends, or whose upload still waits for the server, has its phases in the events log under the
    last aggregation, edgefl.experiment.living `AsyncRounds.ending`.)"""
    asynchronous = _mode(run) == "async"
    work = _slot_work(run) if asynchronous else _round_work(run)
    server = sum(float(r["server_s"]) for r in run.metrics)
    beside = 0.0 if asynchronous else server
    return {**work, "wait": sim_time(run) - beside - sum(work.values()), "server": server}


WORK = {"download_s": "comm", "data_access_s": "data_access", "compute_s": "compute", "upload_s": "comm"}


def _mode(run: Run) -> str:
    return str(_value(run.scenario, "round.mode", "sync") or "sync")


def _round_work(run: Run) -> dict[str, float]:
    """Compute, data access and comm seconds: each round's clients' mean, summed over rounds."""
    starts, end = {}, 0.0
    for r in run.metrics:  # a round starts round_time_s before its end (a log without it: at the last's)
        length = r.get("round_time_s")
        starts[r["round"]] = float(r["sim_time_s"]) - float(length) if length else end
        end = float(r["sim_time_s"])
    per_round: dict[str, list[dict[str, str]]] = defaultdict(list)
    for c in run.clients:
        per_round[c["round"]].append(c)
    totals = dict.fromkeys(WORK.values(), 0.0)
    for round_, clients in per_round.items():
        for c in clients:
            for phase, seconds in _spent(c, starts[round_]).items():
                totals[WORK[phase]] += seconds / len(clients)
    return totals


def _spent(client: dict[str, str], start: float) -> dict[str, float]:
    """A client's phase seconds in order, cut at its `finish_s` if it stopped early."""
    stopped = client.get("status", "completed") not in ("", "completed")
    left = float(client["finish_s"]) - start if stopped else math.inf
    spent = {}
    for phase in WORK:
        spent[phase] = min(float(client[phase]), max(left, 0.0))
        left -= spent[phase]
    return spent


def _slot_work(run: Run) -> dict[str, float]:
    """Compute, data access and comm seconds of an async run's mean slot, from its events' spans."""
    slots = min(_count(run, "round.concurrency", 8), _count(run, "fleet.clients", 20))
    totals = dict.fromkeys(WORK.values(), 0.0)
    for e in read_log(run.path, "events.csv"):
        part = WORK.get(f"{e['phase']}_s")
        if part is not None:
            totals[part] += (float(e["end_s"]) - float(e["start_s"])) / slots
    return totals


def _count(run: Run, key: str, default: int) -> int:
    """The run's positive count `key` (`default` where its scenario.toml leaves it out)."""
    value = _value(run.scenario, key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise NotARunError(str(run.path / "scenario.toml"), key, "not a positive count")
    return value


def energy_per_device(run: Run, target: float | None) -> tuple[float | None, float | None]:
    """Joules per device (edgefl.sim.energy): the clients' energy_j summed over the run, and up to the
    round that first reaches `target`, each over the devices that took part in those rounds (a
    client that sat a round out for its battery, `battery_dropped`, took no part in it); None
    where the run priced no energy (`energy.enabled`) or never reached the target."""
    if "energy_j" not in run.clients[0]:
        return None, None

    def upto(last: int | None) -> float:
        rows = [c for c in run.clients if last is None or int(c["round"]) <= last]
        took_part = {c["client"] for c in rows if c.get("battery_dropped", "0") != "1"}
        return sum(float(c["energy_j"]) for c in rows) / max(len(took_part), 1)

    reached = None if target is None else next(
        (int(r["round"]) for r in run.metrics if r.get("adv_acc") and float(r["adv_acc"]) >= target), None)
    return upto(None), None if reached is None else upto(reached)


def memory(run: Run) -> tuple[float, float, float, float]:
    """MB: (the least MemReq over client-rounds: what the method asks of its smallest client, e.g.
    FedProphet's lightest module or the narrowest sub-model; the peak MemReq; the median available
    memory), and the share of client-rounds whose MemReq fit their available memory."""
    req = [int(c["mem_req_bytes"]) for c in run.clients]
    avail = [int(c["mem_avail_bytes"]) for c in run.clients]
    fits = sum(r <= a for r, a in zip(req, avail, strict=True)) / len(req)
    return min(req) / 1e6, max(req) / 1e6, statistics.median(avail) / 1e6, fits


def check_target(target: float | None) -> None:
    """A target is an adversarial accuracy, a fraction as metrics.csv logs it."""
    if target is not None and not 0 < target <= 1:
        raise EdgeflError("--target", f"{target:g}", "give the adversarial accuracy as a fraction in "
                          "(0, 1], e.g. 0.5 for 50 %")


def compare_table(runs: list[Path], target: float | None) -> list[Row]:
    """One row per run directory (columns: COLUMNS); None where a value does not apply."""
    check_target(target)
    return table([load_run(p) for p in runs], target)


def table(runs: list[Run], target: float | None) -> list[Row]:
    """The comparison rows of loaded runs; speed-ups are against the first jFAT run, if any."""
    rows = [_row(run, target) for run in runs]
    base = next((r for r in rows if r["method"] == BASELINE), None)
    for r in rows:
        r["speedup_vs_jfat"] = _ratio(base["sim_time_s"], r["sim_time_s"]) if base else None
        r["speedup_to_target_vs_jfat"] = (_ratio(base["time_to_target_s"], r["time_to_target_s"])
                                          if base else None)
    return [{c: r[c] for c in COLUMNS} for r in rows]


def _row(run: Run, target: float | None) -> Row:
    acc = evaluated(run)
    parts = breakdown(run)
    total = sum(parts.values())
    need, peak, median, fits = memory(run)
    joules, to_target = energy_per_device(run, target)
    return {"method": run.method, "run": run.name,
            "clean_acc": acc[-1][1] if acc else None, "adv_acc": acc[-1][2] if acc else None,
            "sim_time_s": sim_time(run), "time_to_target_s": time_to_target(run, target),
            "mem_need_mb": need, "mem_peak_mb": peak, "fleet_mem_median_mb": median, "fits_share": fits,
            **{f"{p}_share": parts[p] / total for p in PARTS},
            "energy_per_device_j": joules, "energy_to_target_per_device_j": to_target}


def _ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num is not None and den else None


def target_line(rows: list[Row], target: float | None) -> str:
    """The sentence under the table: what the target was and which run the speed-ups divide."""
    goal = f"adversarial accuracy >= {target:g}" if target is not None else "none given"
    base = next((r["run"] for r in rows if r["method"] == BASELINE), None)
    against = f"jFAT run `{base}`" if base else "no jFAT run given, so no speed-ups"
    return f"Target: {goal}; speed-ups against {against}."


def write_comparison(rows: list[Row], out_dir: Path, target: float | None) -> list[Path]:
    """comparison.md (a Markdown table and the target line) and comparison.csv in `out_dir`, a
    comparison folder (created, or an empty or edgefl-marked one)."""
    claim(out_dir, "compare")
    md, csv_path = out_dir / "comparison.md", out_dir / "comparison.csv"
    header = f"| {' | '.join(COLUMNS)} |\n|{'---|' * len(COLUMNS)}\n"
    body = "".join(f"| {' | '.join(_cell(r[c], FORMATS.get(c, '')) for c in COLUMNS)} |\n" for r in rows)
    write_file(md, f"{header}{body}\n{target_line(rows, target)}\n")
    write_file(csv_path, csv_text(COLUMNS, rows))
    return [md, csv_path]


def csv_text(columns: list[str], rows: list[Row]) -> str:
    """`rows` as CSV with a header of `columns`; None is written as an empty field."""
    text = io.StringIO(newline="")
    writer = csv.DictWriter(text, columns)
    writer.writeheader()
    writer.writerows({c: "" if r[c] is None else r[c] for c in columns} for r in rows)
    return text.getvalue()


def _cell(value: Any, fmt: str) -> str:
    return "" if value is None else format(value, fmt)
