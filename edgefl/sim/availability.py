"""When each device is online: always, a seeded day/night charging pattern, or a trace.

`fleet.availability`:

* `always` (the default): every device is online all the time.
* `diurnal`: phones train while they charge at night (FedScale's behaviour traces show most devices
  available at night; Yang et al., "Characterizing impacts of heterogeneity in federated learning
  upon large-scale smartphone data", WWW 2021). Client k lives in a time zone offset by
  o_k = tz_spread_h x (u_k - 1/2) hours, u_k a counter-based uniform keyed by (seed, AVAILABILITY, k);
  its local hour at simulated second t is h_k(t) = (t / 3600 + o_k) mod 24, and it is online while
  (h_k(t) - online_start_h) mod 24 < online_hours. Simulated time 0 is midnight at offset 0.
* a trace file: per-client online intervals [start, end) in seconds, repeating with the trace's
  period; fleet client k follows trace client k mod (clients in the trace). Layouts:
  `.csv` with columns client,start_s,end_s (period: the latest end); `.json` either
  {"<client>": [[start, end], ...]} (period: the latest end) or FedScale's client behaviour trace,
  {"<client>": {"active": [...], "inactive": [...], "duration": seconds}}, online from active[i] to
  inactive[i], the period `duration` (FedScale's `finish_time` is read where `duration` is missing);
  `.pkl`/`.pickle`, FedScale's own file, only with `fleet.trace_pickle = true`, and then through an
  unpickler that accepts no class or function at all (plain dicts, lists and numbers only).

An `Availability` answers `online(k, t)`, `offline_at(k, t)` (when an online client next goes
offline; inf if never) and `online_at(k, t)` (when an offline client next comes online), and the
first two for an array of clients at once (`online_many`, `offline_many`: the diurnal pattern in
closed form over the arrays, a trace client by client).
"""

from __future__ import annotations

import csv
import functools
import io
import json
import math
import pickle
import warnings
from abc import ABC, abstractmethod
from bisect import bisect_right
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
from pyarrow import csv as pacsv

from edgefl.config import MAX_SECONDS, FleetConfig
from edgefl.devices import draws
from edgefl.errors import EdgeflError

AVAILABILITY = 4  # the random stream of the diurnal offsets (after edgefl.devices.pool's four)
DAY_S = 86400.0


class Availability(Protocol):
    def online_many(self, clients: np.ndarray, t: float) -> np.ndarray: ...

    def offline_many(self, clients: np.ndarray, t: float) -> np.ndarray: ...

    def online(self, client: int, t: float) -> bool: ...

    def offline_at(self, client: int, t: float) -> float: ...

    def online_at(self, client: int, t: float) -> float: ...


class OneByMany(ABC):
    """`online` and `offline_at` of one client as `online_many` and `offline_many` of one."""

    @abstractmethod
    def online_many(self, clients: np.ndarray, t: float) -> np.ndarray: ...

    @abstractmethod
    def offline_many(self, clients: np.ndarray, t: float) -> np.ndarray: ...

    def online(self, client: int, t: float) -> bool:
        return bool(self.online_many(np.array([client]), t)[0])

    def offline_at(self, client: int, t: float) -> float:
        return float(self.offline_many(np.array([client]), t)[0])


class Always(OneByMany):
    """Every device online all the time."""

    def online_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        return np.ones(len(clients), dtype=bool)

    def offline_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        return np.full(len(clients), math.inf)

    def online_at(self, client: int, t: float) -> float:
        return t


@dataclass(frozen=True)
class Diurnal(OneByMany):
    """Online while charging at night, local time shifted per device (see the module docstring)."""

    seed: int
    start_h: float
    hours: float
    spread_h: float
    known: list[np.ndarray] = field(default_factory=list, init=False, repr=False, compare=False)

    def offsets_h(self, clients: np.ndarray) -> np.ndarray:
        """o_k: each device's time-zone offset in hours (drawn once for the ids up to the largest
        asked so far, and kept: every round asks them of the whole fleet)."""
        known = self.known[0] if self.known else np.empty(0)
        top = int(clients.max(initial=-1)) + 1
        if top > len(known):
            keys = draws.keys(draws.key(self.seed, AVAILABILITY), np.arange(len(known), top))
            self.known[:] = [known := np.concatenate([known, self.spread_h * (draws.uniform(keys) - 0.5)])]
        return known[clients]

    def _into(self, clients: np.ndarray, t: float | np.ndarray) -> np.ndarray:
        """Hours since each device's last online_start (local), in [0, 24)."""
        return np.mod(t / 3600 + self.offsets_h(clients) - self.start_h, 24)

    def online_many(self, clients: np.ndarray, t: float | np.ndarray) -> np.ndarray:
        if self.hours >= 24:
            return np.ones(len(clients), dtype=bool)
        return np.asarray(self._into(clients, t) < self.hours)

    def offline_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        if self.hours >= 24:
            return np.full(len(clients), math.inf)
        return t + (self.hours - self._into(clients, t)) * 3600

    def online_at(self, client: int, t: float) -> float:
        return float(self.online_at_many(np.array([client]), t)[0])

    def online_at_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        """When each device is next online: `t` if it is now, else its window's next start (the first
        float from there at which `online_many` holds: first_online)."""
        at = np.where(self.online_many(clients, t), t, t + (24 - self._into(clients, t)) * 3600)
        return first_online(lambda u: self.online_many(clients, u), at)

    def online_seconds(self, clients: np.ndarray, a: np.ndarray, b: np.ndarray | float) -> np.ndarray:
        """Seconds each client is online in [a_k, b] (a_k <= b): F(b - s_k) - F(a_k - s_k), with
        s_k = 3600 (start_h - o_k), when its window opens, and F(y) = floor(y / 86400) x H +
        min(y mod 86400, H) the online seconds in [0, y) of a day-periodic window [0, H)."""
        if self.hours >= 24:
            return np.maximum(b - a, 0.0)
        opens = 3600 * (self.start_h - self.offsets_h(clients))
        h = self.hours * 3600

        def f(y: np.ndarray) -> np.ndarray:
            return np.floor(y / DAY_S) * h + np.minimum(np.mod(y, DAY_S), h)

        return f(b - opens) - f(a - opens)


@dataclass(frozen=True)
class Intervals:
    """Per trace client, sorted online intervals [start, end) within its repeating period."""

    intervals: list[list[tuple[float, float]]]
    periods: list[float]

    def _local(self, client: int, t: float) -> tuple[list[tuple[float, float]], float, float]:
        i = client % len(self.intervals)
        base = math.floor(t / self.periods[i]) * self.periods[i]
        return self.intervals[i], base, t - base

    def _holding(self, spans: list[tuple[float, float]], tau: float) -> int:
        """The interval holding tau, or -1."""
        i = bisect_right(spans, (tau, math.inf)) - 1  # the last interval starting at or before tau
        return i if i >= 0 and tau < spans[i][1] else -1

    def online(self, client: int, t: float) -> bool:
        spans, _, tau = self._local(client, t)
        return self._holding(spans, tau) >= 0

    def online_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        return np.array([self.online(k, t) for k in clients.tolist()], dtype=bool)

    def offline_many(self, clients: np.ndarray, t: float) -> np.ndarray:
        return np.array([self.offline_at(k, t) for k in clients.tolist()], dtype=np.float64)

    def offline_at(self, client: int, t: float) -> float:
        """The end of the run of touching intervals holding t, followed across the period's end
        (an interval ending at the period and one starting at 0 touch); inf if they fill it."""
        spans, base, tau = self._local(client, t)
        i = self._holding(spans, tau)
        if i < 0:
            return t
        end, last = _run_end(spans, i)
        period = self.periods[client % len(self.periods)]
        if last < len(spans) - 1 or end < period or spans[0][0] > 0:
            return base + end
        wrap_end, wrap_last = _run_end(spans, 0)  # online on into the next period
        return math.inf if wrap_last >= i else base + period + wrap_end

    def online_at(self, client: int, t: float) -> float:
        spans, base, tau = self._local(client, t)
        if not spans:
            return math.inf
        if self._holding(spans, tau) >= 0:
            return t
        j = bisect_right(spans, (tau, math.inf))  # the first interval starting after tau
        period = self.periods[client % len(self.periods)]
        at = base + spans[j][0] if j < len(spans) else base + period + spans[0][0]
        return float(first_online(lambda u: np.array([self.online(client, float(u[0]))]), np.array([at]))[0])


def _run_end(spans: list[tuple[float, float]], k: int) -> tuple[float, int]:
    """The end of the run of touching intervals from spans[k], and the index of its last one."""
    while k + 1 < len(spans) and spans[k + 1][0] <= spans[k][1]:
        k += 1
    return spans[k][1], k


def first_online(online: Callable[[np.ndarray], np.ndarray], at: np.ndarray) -> np.ndarray:
    """`at`, or, element by element, the first float after it at which `online` holds: a window's
    start worked out in floating point may land a few ulps before the window, where `online` still
    says no."""
    at = at.astype(np.float64)
    for _ in range(1 << 16):
        early = ~online(at)
        if not early.any():
            break
        at[early] = np.nextafter(at[early], math.inf)
    return at


def make_availability(fleet: FleetConfig, seed: int, where: str) -> Availability:
    """The fleet's availability (`fleet.availability`), a trace read relative to the scenario."""
    if fleet.availability == "always":
        return Always()
    if fleet.availability == "diurnal":
        return Diurnal(seed, fleet.online_start_h, fleet.online_hours, fleet.tz_spread_h)
    path = trace_file(fleet, where)
    assert path is not None
    return read_trace(path, fleet.trace_pickle, where)


def trace_file(fleet: FleetConfig, where: str) -> Path | None:
    """The trace file `fleet.availability` names (relative to the scenario file `where`); None for
    `always` and `diurnal`."""
    if fleet.availability in ("always", "diurnal"):
        return None
    path = Path(fleet.availability).expanduser()
    return path if path.is_absolute() else Path(where).parent / path


PICKLES = (".pkl", ".pickle")  # FedScale's trace files; read only with fleet.trace_pickle


def read_trace(path: Path, allow_pickle: bool, where: str) -> Intervals:
    """An availability trace file (layouts in the module docstring), checked. The scenario's checks
    and the run read the same file: it is parsed once while its size and mtime stay the same."""
    key = "fleet.availability"
    if not path.is_file():
        raise EdgeflError(where, key, f"no trace file {str(path)!r}; give always, diurnal or a trace's path "
                          "(a relative one is read from the scenario file's folder)")
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".json", *PICKLES):
        raise EdgeflError(where, key, f"unknown trace type {suffix!r}; use .csv or .json "
                          "(or a FedScale .pkl)")
    if suffix in PICKLES and not allow_pickle:
        raise EdgeflError(where, "fleet.trace_pickle", f"{path.name} is a pickle, which can run code when "
                          "read; convert it to JSON, or set fleet.trace_pickle = true for a file you trust")
    stat = path.stat()
    try:
        return _parse(path.resolve(), stat.st_mtime_ns, stat.st_size)
    except KeyError as exc:
        raise EdgeflError(where, key, f"cannot read the trace {path.name}: it has no {exc} "
                          f"({LAYOUTS})") from None
    except (ValueError, TypeError, IndexError, EOFError, RecursionError, OverflowError, MemoryError,
            pickle.UnpicklingError) as exc:
        reason = str(exc)[:200] or type(exc).__name__  # a 1 TiB claim in a 20-byte pickle: MemoryError
        raise EdgeflError(where, key, f"cannot read the trace {path.name} ({reason}): {LAYOUTS}") from None


LAYOUTS = ("a .csv has the columns client,start_s,end_s; a .json maps each client to [[start_s, end_s], "
           "...] or to FedScale's {active, inactive, duration}")


@functools.lru_cache(maxsize=2)
def _parse(path: Path, mtime_ns: int, size: int) -> Intervals:
    """The trace at `path` as it was at (mtime_ns, size), the cache's key; pickles already allowed."""
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return _from_csv(path)
    if suffix == ".json":
        return from_mapping(json.loads(path.read_text(encoding="utf-8-sig")))
    warnings.warn(f"reading the pickle {path} (fleet.trace_pickle): plain data only", stacklevel=3)
    return from_mapping(_PlainUnpickler(io.BytesIO(path.read_bytes())).load())


class _PlainUnpickler(pickle.Unpickler):
    """Refuses every global: only dicts, lists, tuples, strings and numbers come out."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"the trace holds {module}.{name}; only plain data is read")


CSV_COLUMNS = ("client", "start_s", "end_s")


def _from_csv(path: Path) -> Intervals:
    """A CSV trace read as columns (pyarrow's reader; `bench/trace_read.py` times it against Python
    rows); a byte-order mark is skipped."""
    with path.open(encoding="utf-8-sig", newline="") as f:
        header = next(csv.reader(f), [])
    missing = [c for c in CSV_COLUMNS if c not in header]
    if missing:
        raise KeyError(missing[0])
    types = {"client": pa.string(), "start_s": pa.float64(), "end_s": pa.float64()}
    table = pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(include_columns=list(CSV_COLUMNS),
                                                                       column_types=types))
    names = table["client"].to_numpy(zero_copy_only=False).tolist()
    start, end = (table[c].to_numpy(zero_copy_only=False).astype(np.float64) for c in CSV_COLUMNS[1:])
    index = {k: i for i, k in enumerate(_client_order(set(names)))}
    row = np.array([index[k] for k in names], dtype=np.int64)
    return _intervals(row, start, end, np.full(len(index), end.max() if len(end) else 0.0))


def from_mapping(data: Any) -> Intervals:
    """Intervals from {client: [[start, end], ...]} or FedScale's {client: {active, inactive,
    duration}}, clients in key order (numeric keys sorted as numbers)."""
    if not isinstance(data, dict) or not data:
        raise ValueError("expected a non-empty mapping of client -> intervals")
    keys = _client_order(data)
    fedscale = isinstance(data[keys[0]], dict)  # online active[i] to inactive[i], repeating each duration
    pairs = [_fedscale_spans(k, data[k]) if fedscale else _pairs(data[k]) for k in keys]
    row = np.repeat(np.arange(len(keys)), [len(p) for p in pairs])
    start = np.array([a for p in pairs for a, _ in p], dtype=np.float64)
    end = np.array([b for p in pairs for _, b in p], dtype=np.float64)
    periods = (np.array([_fedscale_period(k, data[k]) for k in keys]) if fedscale
               else np.full(len(keys), end.max() if len(end) else 0.0))
    return _intervals(row, start, end, periods)


def _client_order(keys: Iterable[Any]) -> list[Any]:
    """A trace's clients in order: numeric keys as numbers, then the others as text."""
    return sorted(keys, key=lambda k: (0, int(k), "") if str(k).isdigit() else (1, 0, str(k)))


def _intervals(row: np.ndarray, start: np.ndarray, end: np.ndarray, periods: np.ndarray) -> Intervals:
    """The intervals of len(periods) clients from columns (each interval's client row, start and end,
    in any order), sorted and checked as arrays: finite, 0 <= start < end <= the client's period (> 0,
    at most MAX_SECONDS), not overlapping within a client."""
    if not len(row):
        raise ValueError("no client has an online interval; give each device when it is online")
    order = np.lexsort((end, start, row))
    row, start, end = row[order], start[order], end[order]
    same = row[1:] == row[:-1]
    if not (np.all((periods > 0) & (periods <= MAX_SECONDS)) and np.all((start >= 0) & (start < end)
                                                                           & (end <= periods[row]))
            and not np.any(same & (end[:-1] > start[1:]))):
        raise ValueError(f"intervals must be finite, 0 <= start < end <= period (> 0 and at most "
                         f"{MAX_SECONDS:.0e} s: about 32 years), and not overlap")
    cuts = np.cumsum(np.bincount(row, minlength=len(periods)))[:-1]
    spans = [list(zip(a.tolist(), b.tolist(), strict=True))
             for a, b in zip(np.split(start, cuts), np.split(end, cuts), strict=True)]
    return Intervals(spans, periods.tolist())


def _fedscale_spans(client: Any, entry: dict[str, Any]) -> list[tuple[float, float]]:
    if len(entry["active"]) != len(entry["inactive"]):
        raise ValueError(f"client {client}: active and inactive have different lengths")
    return _pairs(zip(entry["active"], entry["inactive"], strict=True))


def _fedscale_period(client: Any, entry: dict[str, Any]) -> float:
    period = entry.get("duration", entry.get("finish_time"))
    if period is None:
        raise ValueError(f"client {client}: no duration (the period its active/inactive times repeat with)")
    return _seconds(period)


def _pairs(pairs: Any) -> list[tuple[float, float]]:
    return [(_seconds(a), _seconds(b)) for a, b in pairs]


def _seconds(value: Any) -> float:
    """A trace's time: a number (or, from a CSV, its text); true/false are not seconds."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{value!r} is not a number of seconds")
    return float(value)
