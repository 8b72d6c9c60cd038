"""A run's per-client logs (clients and events), streamed to disk round by round as CSV or Parquet.

Small runs log `clients.csv` and `events.csv`; at fleet scale the same rows go to `clients.parquet`
and `events.parquet` (Apache Parquet through pyarrow, a round's rows in row groups of at most 8192,
which pandas and DuckDB read directly). `output.format = "auto"` picks Parquet when the run's
expected client-rounds (rounds x clients per round) exceed `output.parquet_above`. Either log is
sealed at each checkpoint with its length and SHA-256, so `--resume` keeps exactly the rows the
checkpoint saw.

A CSV log appends to its file. A Parquet file is readable only once closed, so a Parquet log writes
into a temporary file beside its target; at each checkpoint it closes it into a pending file, which
the checkpoint names by its digest and which then moves into place (at the end likewise); the next
round reopens a temporary file that starts with the sealed file's row groups. The target on disk is
always a whole file; a crash between a checkpoint and the move leaves the pending file, which resume
takes when the checkpoint vouches for it.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import tempfile
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from edgefl.errors import NotARunError
from edgefl.rundir import Appender, WriteFailed, _fsync_folder, _umask, write_file

# per-client columns and their Parquet types (all CSV columns are text)
CLIENT_TYPES = {"round": pa.int64(), "client": pa.int64(), "device": pa.string(), "app": pa.string(),
                "network": pa.string(), "flops": pa.float64(), "mem_avail_bytes": pa.int64(),
                "mem_req_bytes": pa.int64(), "swapped": pa.int64(), "compute_s": pa.float64(),
                "data_access_s": pa.float64(), "download_s": pa.float64(), "upload_s": pa.float64(),
                "wait_s": pa.float64(), "finish_s": pa.float64(), "read_bytes": pa.int64(),
                "write_bytes": pa.int64(), "real_compute_s": pa.float64(),
                "status": pa.string(), "staleness": pa.int64()}  # the last two: a living fleet's only
# clients' columns with energy.enabled / energy.batteries (edgefl.experiment.rows.energy_headers)
ENERGY_TYPES = {"energy_j": pa.float64(), "battery_j": pa.float64(), "battery_dropped": pa.int64()}
EVENT_TYPES = {"round": pa.int64(), "client": pa.int64(), "phase": pa.string(), "start_s": pa.float64(),
               "end_s": pa.float64()}
LOGS = ("clients", "events")  # the per-client logs, whose format follows `output.format`
ROW_GROUP = 8192  # rows per Parquet row group
# A round's Parquet rows of this many bytes are written while the next round plays (pyarrow writes
# without the GIL): bigger ones (a million devices') are waited for, so that no two rounds' rows
# are held, and smaller ones too, whose write costs less than the Python running meanwhile may lose
# to the writer's hand-offs of the GIL (async-digits at 100,000 devices, aggregations of 170-330 KB:
# 40-46 s written behind, 31-32 s waited for, on a noisy 2-core machine).
BEHIND_BYTES = (1 << 20, 64 << 20)
Columns = dict[str, np.ndarray | pa.Array]  # rows as columns: numbers (NaN: not measured), text in Arrow


def log_format(fmt: str, parquet_above: int, client_rounds: int) -> str:
    """csv or parquet: `fmt` itself, or for auto, parquet above `parquet_above` client-rounds."""
    if fmt != "auto":
        return fmt
    return "parquet" if client_rounds > parquet_above else "csv"


def log_names(fmt: str) -> dict[str, str]:
    """Each log's file name: metrics.csv always, the per-client logs in `fmt`."""
    return {"metrics": "metrics.csv", **{name: f"{name}.{fmt}" for name in LOGS}}


class Log(Protocol):
    path: Path

    def write_columns(self, columns: Columns) -> None: ...

    def seal(self) -> list[Any]: ...

    def commit(self) -> None: ...

    def rows(self) -> Iterator[dict[str, str]]: ...


class CsvLog:
    """An append-only CSV log, written through rundir's appender. It starts from its header, or on
    resume from the bytes the checkpoint vouches for (rows of later rounds are dropped, so no round
    appears twice); `seal` gives the length and SHA-256 of everything written so far."""

    def __init__(self, path: Path, columns: list[str], kept: bytes | None) -> None:
        self.path, self.columns = path, columns
        self.data = kept if kept is not None else self._render([], header=True)
        self.digest = hashlib.sha256(self.data)
        self.length = len(self.data)

    def __enter__(self) -> CsvLog:
        write_file(self.path, self.data)
        self.file = Appender(self.path)  # closed in __exit__
        return self

    def rows(self) -> Iterator[dict[str, str]]:
        """The rows this log started from."""
        return csv.DictReader(io.StringIO(self.data.decode(), newline=""))

    def _render(self, rows: Iterable[Iterable[Any]], header: bool = False) -> bytes:
        text = io.StringIO(newline="")
        writer = csv.writer(text)
        if header:
            writer.writerow(self.columns)
        writer.writerows(rows)
        return text.getvalue().encode()

    def write(self, rows: list[dict[str, Any]]) -> None:
        """Append rows given as dicts (every column)."""
        self._append(self._render([r[c] for c in self.columns] for r in rows))

    def write_columns(self, columns: Columns) -> None:
        """Append rows given as columns."""
        self._append(self._render(zip(*(cells(columns[c]) for c in self.columns), strict=True)))

    def _append(self, payload: bytes) -> None:
        self.file.append(payload)
        self.digest.update(payload)
        self.length += len(payload)

    def seal(self) -> list[Any]:
        return [self.length, self.digest.hexdigest()]

    def commit(self) -> None:
        """Appended rows are in place already."""

    def __exit__(self, *exc: object) -> None:
        self.file.close()
        del self.data  # the kept bytes are not needed after the start


class ParquetLog:
    """A Parquet log: one row group per `write`, written by a thread of its own while the run goes
    on (one write at a time, of BEHIND_BYTES; `seal` and the end wait for it). `seal` closes
    the rows written so far into a whole file beside the target (`pending_path`) and returns its
    length and SHA-256; `commit`, once the checkpoint naming that seal is saved, moves it into
    place. `kept` is the sealed file a resume starts from (None for a new log)."""

    def __init__(self, path: Path, types: dict[str, pa.DataType], kept: bytes | None) -> None:
        self.path = path
        self.schema = pa.schema(list(types.items()))
        self.kept = kept
        self.writer: pq.ParquetWriter | None = None
        self.tmp: str | None = None
        self.thread = ThreadPoolExecutor(1, thread_name_prefix=f"write {path.name}")
        self.behind: Future[None] | None = None

    def __enter__(self) -> ParquetLog:
        if self.kept is None:
            empty = io.BytesIO()
            self._writer(empty).close()
            self.kept = empty.getvalue()
        write_file(self.path, self.kept)
        pending_path(self.path).unlink(missing_ok=True)  # a seal no checkpoint named
        self.sealed = [len(self.kept), hashlib.sha256(self.kept).hexdigest()]
        return self

    def rows(self) -> Iterator[dict[str, str]]:
        """The rows this log started from, as text as the CSV log gives them."""
        yield from text_rows(pq.ParquetFile(io.BytesIO(self.kept or b"")))

    def _writer(self, sink: Any) -> pq.ParquetWriter:
        """A writer of this log's schema: dictionaries for its text columns only (a dictionary of
        numbers, each near-unique, costs half the write and saves nothing)."""
        return pq.ParquetWriter(sink, self.schema,
                                use_dictionary=[f.name for f in self.schema if pa.types.is_string(f.type)])

    def _open(self) -> None:
        """A temporary file beside the target, holding the sealed rows first."""
        try:
            fd, self.tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp",
                                            dir=self.path.parent)
            self.file = os.fdopen(fd, "wb")  # (before anything can fail: `_discard` closes it)
            os.fchmod(fd, 0o666 & ~_umask())
            self.writer = self._writer(self.file)
            sealed = pq.ParquetFile(self.path)
            for group in range(sealed.num_row_groups):
                self.writer.write_table(sealed.read_row_group(group))
        except OSError as exc:
            raise WriteFailed(self.path, exc) from None

    def write_columns(self, columns: Columns) -> None:
        """Append rows given as columns (NaN is null), in row groups of ROW_GROUP rows: written
        behind when they are small enough (NumPy columns copied, as Arrow would share their memory
        with the caller), else before returning."""
        if self.writer is None:
            self._open()
        assert self.writer is not None
        given = [columns[f.name] for f in self.schema]
        behind = BEHIND_BYTES[0] <= sum(c.nbytes for c in given) <= BEHIND_BYTES[1]
        arrays = [c if isinstance(c, pa.Array) else pa.array(c.copy() if behind else c, f.type,
                                                             from_pandas=True)
                  for c, f in zip(given, self.schema, strict=True)]
        table = pa.Table.from_arrays(arrays, schema=self.schema)
        self._caught_up()
        self.behind = self.thread.submit(self.writer.write_table, table, ROW_GROUP)
        if not behind:
            self._caught_up()

    def _caught_up(self) -> None:
        """Wait for the write under way, if any (its failure raised here)."""
        behind, self.behind = self.behind, None
        if behind is None:
            return
        try:
            behind.result()
        except OSError as exc:
            raise WriteFailed(self.path, exc) from None

    def seal(self) -> list[Any]:
        """Close the rows so far into the pending file; its length and SHA-256."""
        if self.writer is None:
            return self.sealed
        assert self.tmp is not None
        self._caught_up()
        pending = pending_path(self.path)
        try:
            self.writer.close()
            self.file.flush()
            os.fsync(self.file.fileno())
            self.file.close()
            os.replace(self.tmp, pending)
            digest, length = _hash(pending)
        except OSError as exc:
            raise WriteFailed(self.path, exc) from None
        self.writer, self.tmp = None, None
        self.sealed = [length, digest]
        return self.sealed

    def commit(self) -> None:
        """Move the sealed rows into place (after the checkpoint that names them is saved)."""
        pending = pending_path(self.path)
        if pending.exists():
            try:
                os.replace(pending, self.path)
                _fsync_folder(self.path.parent)
            except OSError as exc:
                raise WriteFailed(self.path, exc) from None

    def __exit__(self, *exc: object) -> None:
        self.thread.shutdown()  # the write under way done (after a failure, whatever its end)
        try:
            if exc[0] is None:
                self.seal()
                self.commit()
        finally:
            if self.tmp is not None:  # unsealed (a failure): the last sealed file stays, no temporary
                self._discard()

    def _discard(self) -> None:
        """Remove the temporary file (closing its writer first, whose footer goes into it)."""
        assert self.tmp is not None
        try:
            if self.writer is not None:
                self.writer.close()
        except OSError:
            pass
        finally:
            self.file.close()
            Path(self.tmp).unlink(missing_ok=True)


def pending_path(path: Path) -> Path:
    """Where a Parquet log's sealed rows wait for their checkpoint (a temporary name, so never
    mistaken for a user's file)."""
    return path.with_name(f".{path.name}.sealed.tmp")


def cells(column: np.ndarray | pa.Array, rows: np.ndarray | None = None) -> list[Any]:
    """A column's cells (those at `rows`, or all) as Python numbers and text, NaN (not measured) empty."""
    if isinstance(column, pa.Array):
        return (column if rows is None else column.take(rows)).to_pylist()
    picked = column if rows is None else column[rows]
    values = picked.tolist()
    if picked.dtype.kind == "f" and np.isnan(picked).any():
        return ["" if v != v else v for v in values]
    return values


def _hash(path: Path) -> tuple[str, int]:
    digest, length = hashlib.sha256(), 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
            length += len(chunk)
    return digest.hexdigest(), length


def text_rows(file: pq.ParquetFile) -> Iterator[dict[str, str]]:
    """A Parquet log's rows as CSV text: nulls empty, numbers as Python prints them."""
    for batch in file.iter_batches():
        for row in batch.to_pylist():
            yield {k: "" if v is None else str(v) for k, v in row.items()}


def log_file(folder: Path, name: str) -> Path:
    """The file of a run folder's log `name` (`clients`, `events` or `metrics`): NAME.parquet where
    the run wrote one, else NAME.csv."""
    parquet = folder / f"{name}.parquet"
    return parquet if name in LOGS and parquet.is_file() else folder / f"{name}.csv"


def read_rows(folder: Path, name: str) -> tuple[list[str], list[dict[str, str]]]:
    """A log of a run folder (`clients`, `events` or `metrics`) as its header and text rows, from
    whichever of NAME.csv and NAME.parquet the run wrote (`log_file`)."""
    path = log_file(folder, name)
    if path.suffix == ".parquet":
        try:
            file = pq.ParquetFile(path)
            return list(file.schema_arrow.names), list(text_rows(file))
        except (OSError, pa.ArrowException) as exc:
            raise NotARunError(str(path), "file", f"cannot be read as Parquet ({exc})") from None
    if not path.is_file():
        raise NotARunError(str(folder), f"{name}.csv", "missing")
    try:
        reader = csv.DictReader(io.StringIO(_whole_lines(path.read_bytes().decode()), newline=""))
        rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise NotARunError(str(path), "file", f"cannot be read as CSV ({exc})") from None
    return list(reader.fieldnames or []), rows


def _whole_lines(text: str) -> str:
    """The text up to its last line end: a row torn by a full disk or a crash is dropped."""
    end = text.rfind("\n")
    return text[:end + 1] if end >= 0 else ""
