"""advisor.traces._amd's frame and database helpers, which the rpd, rocpd, rocprofv3 JSON and
rocprof v1 results.db readers share (their output is checked in the readers' own tests)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pandas as pd
import pytest
from tracefiles import write_db

from advisor.errors import TraceError
from advisor.traces import _amd, rocpd, rocprof_v1_db, rpd


def ints(values, index):
    return pd.Series(values, index=index, dtype="Int64")


def test_gpu_frame_kernels_geometry_and_extra_columns():
    idx = pd.Index([7, 3])  # readers pass rows of a filtered table: the index is not 0..n-1
    start, end = ints([100, 200], idx), ints([150, 260], idx)
    grid = [ints([4, 2], idx), ints([1, pd.NA], idx), ints([2, 1], idx)]
    block = [ints([256, 64], idx), ints([1, 2], idx), ints([1, 1], idx)]
    df = _amd.gpu_frame(3, ints([0, 1], idx), ints([5, 5], idx), ints([11, 12], idx), start, end,
                        grid=grid, block=block, name=["a", "b"], dynamic_smem_bytes=ints([0, 512], idx))
    assert list(df.index) == [7, 3]
    assert df["rank"].tolist() == [3, 3]
    assert df["dur_ns"].tolist() == [50, 60]
    assert df["grid_blocks"].tolist()[0] == 8 and pd.isna(df["grid_blocks"].tolist()[1])  # a missing dimension
    assert df["block_threads"].tolist() == [256, 128]
    assert df["name"].tolist() == ["a", "b"] and df["dynamic_smem_bytes"].tolist() == [0, 512]
    assert df["correlation_id"].tolist() == [11, 12] and df["stream_id"].tolist() == [5, 5]


def test_gpu_frame_copies_have_no_geometry():
    idx = pd.RangeIndex(1)
    df = _amd.gpu_frame(0, ints([2], idx), ints([1], idx), ints([9], idx), ints([10], idx), ints([40], idx),
                        op="memcpy", kind=["HtoD"], bytes=ints([4096], idx))
    assert list(df.columns) == ["rank", "device_id", "stream_id", "correlation_id", "start_ns", "end_ns", "dur_ns",
                                "op", "kind", "bytes"]
    assert df.iloc[0].tolist() == [0, 2, 1, 9, 10, 40, 30, "memcpy", "HtoD", 4096]


def test_readonly_db_closes_and_names_the_error(tmp_path):
    path = write_db(tmp_path / "x.db", {"t": (["a INTEGER"], [(1,)])})
    with _amd.readonly_db(path) as conn:
        assert conn.execute("SELECT a FROM t").fetchall() == [(1,)]
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")  # closed on leaving
    with pytest.raises(TraceError, match=r"^x\.db: corrupt or unreadable thing \(no such table: nope\)$"):
        with _amd.readonly_db(path, "corrupt or unreadable thing") as conn:
            conn.execute("SELECT * FROM nope")
    with pytest.raises(sqlite3.ProgrammingError):
        conn.execute("SELECT 1")  # closed after an error too


# A writer that takes its lock after the reader opened the file: the first query of the
# reader's check fails with SQLite's "database is locked". Each SQLite reader says so, in
# sniff (format detection) and in read, instead of calling the file corrupt.
@pytest.mark.parametrize("module, check", [(rpd, "_is_rpd"), (rocpd, "_is_rocpd"), (rocprof_v1_db, "_is_v1")])
def test_lock_met_after_open_is_said_to_be_one(tmp_path, monkeypatch, module, check):
    path = Path(write_db(tmp_path / "l.db", {"t": (["a INTEGER"], [(1,)])}))

    def locked(*_):
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(module, check, locked)
    with pytest.raises(TraceError, match="being written by another process"):
        module.sniff(path, path.read_bytes()[:100])
    with pytest.raises(TraceError, match="being written by another process"):
        module.read(path, rank=0)
