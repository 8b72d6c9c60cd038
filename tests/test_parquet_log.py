"""A Parquet log writes a round's rows on a thread of its own while the run goes on
(edgefl.runlog `ParquetLog`): what it writes is what it was given, even when the caller reuses its
arrays afterwards, rows outside BEHIND_BYTES are written before `write_columns` returns, and a
write that fails is one WriteFailed at the next call that waits for it."""

from __future__ import annotations

import errno
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from edgefl import runlog
from edgefl.rundir import WriteFailed

TYPES = {"round": pa.int64(), "wait_s": pa.float64()}


def test_rows_written_behind_are_those_given_though_the_caller_reuses_its_arrays(tmp_path: Path,
                                                                               monkeypatch) -> None:
    monkeypatch.setattr(runlog, "BEHIND_BYTES", (0, 1 << 20))
    path = tmp_path / "clients.parquet"
    rounds, waits = np.zeros(3, dtype=np.int64), np.array([1.5, np.nan, 3.0])
    with runlog.ParquetLog(path, TYPES, None) as log:
        for r in range(4):
            rounds[:], waits[0] = r, 10.0 * r  # the same arrays, changed after each write
            log.write_columns({"round": rounds, "wait_s": waits})
    table = pq.read_table(path)
    assert table.column("round").to_pylist() == [r for r in range(4) for _ in range(3)]
    assert table.column("wait_s").to_pylist() == [w for r in range(4) for w in (10.0 * r, None, 3.0)]


def test_rows_outside_the_window_are_written_before_the_call_returns(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(runlog, "BEHIND_BYTES", (32, 48))  # a row: two 8-byte columns, 16 bytes
    with runlog.ParquetLog(tmp_path / "clients.parquet", TYPES, None) as log:
        for rows, behind in ((4, False), (1, False), (2, True), (3, True), (2, True)):
            log.write_columns({"round": np.zeros(rows, dtype=np.int64), "wait_s": np.ones(rows)})
            assert (log.behind is not None) == behind, rows  # waited for: none under way
    assert pq.read_table(tmp_path / "clients.parquet").num_rows == 12


def test_a_failed_write_behind_is_one_write_failed_and_leaves_no_temporary(tmp_path: Path,
                                                                          monkeypatch) -> None:
    monkeypatch.setattr(runlog, "BEHIND_BYTES", (0, 1 << 20))
    path = tmp_path / "clients.parquet"

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    for more in (1, 0):  # a round after the failure (which meets it), or none (the end meets it)
        with pytest.raises(WriteFailed, match="No space left"), runlog.ParquetLog(path, TYPES, None) as log:
            log.write_columns({"round": np.zeros(2, dtype=np.int64), "wait_s": np.ones(2)})
            assert log.writer is not None
            log.writer.write_table = full  # type: ignore[method-assign]
            log.write_columns({"round": np.ones(2, dtype=np.int64), "wait_s": np.ones(2)})  # fails behind
            for _ in range(more):
                log.write_columns({"round": np.ones(2, dtype=np.int64), "wait_s": np.ones(2)})
        assert [p.name for p in tmp_path.iterdir()] == ["clients.parquet"]
        assert pq.read_table(path).num_rows == 0  # the last sealed file: empty


def test_a_log_whose_temporary_file_cannot_be_set_up_leaves_none(tmp_path: Path, monkeypatch) -> None:
    """A failure after the temporary file is made (its mode, its writer) is one WriteFailed, and the
    temporary file goes."""
    path = tmp_path / "clients.parquet"

    def denied(*_: object) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")

    with pytest.raises(WriteFailed, match="not permitted"), runlog.ParquetLog(path, TYPES, None) as log:
        monkeypatch.setattr(runlog.os, "fchmod", denied)  # (once the target is written)
        log.write_columns({"round": np.zeros(2, dtype=np.int64), "wait_s": np.ones(2)})
    assert [p.name for p in tmp_path.iterdir()] == ["clients.parquet"]
