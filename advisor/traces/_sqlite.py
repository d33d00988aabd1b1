"""Read-only access to SQLite trace files (Nsight Systems exports, rocpd databases).

Trace databases belong to the user and may come from anywhere, so this module
- opens them strictly read-only (`mode=ro` URI, then `PRAGMA query_only`) without creating
  or changing anything beside them: a WAL database is read `immutable=1`, or from a private
  checkpointed copy when its `-wal` holds writes; a database locked by a writer, or with an
  unfinished `-journal`, is a clear error instead of a stall and a torn read (`open_readonly`);
- never runs SQL built from strings found in the file: table and column names used in
  queries come from the caller's own whitelist and pass `ident()`, everything else is a
  bound parameter;
- turns every SQLite failure (not a database, truncated, malformed) into a one-line
  `TraceError`.

Readers probe what a file holds with `tables()` and `columns()` and build their queries
from the intersection with what they know how to read.
"""

from __future__ import annotations

import atexit
import os
import re
import shutil
import sqlite3
import struct
import tempfile
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence
from urllib.parse import quote

import numpy as np
import pandas as pd

from ..errors import TraceError

MAGIC = b"SQLite format 3\x00"
_HEADER_BYTES = 100
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def is_sqlite(head: bytes) -> bool:
    """True if `head` (the file's first bytes) is a SQLite 3 database header."""
    return head.startswith(MAGIC)


def ident(name: str) -> str:
    """`name` as a quoted SQL identifier. Only plain names are allowed: callers pass names
    from their own whitelists, and this refuses anything else rather than escaping it."""
    if not _IDENT.match(name):
        raise ValueError(f"refusing SQL identifier {name!r}")
    return f'"{name}"'


def check_size(path: Path) -> None:
    """TraceError if the file is shorter than its own header says (a truncated copy).

    The header's page count is trusted only when its "version-valid-for" field matches the
    change counter, as the SQLite file format specifies; files written by old libraries
    without a valid count are left to SQLite's own checks.
    """
    size = path.stat().st_size
    with open(path, "rb") as fh:
        header = fh.read(_HEADER_BYTES)
    if len(header) < _HEADER_BYTES or not header.startswith(MAGIC):
        raise TraceError(f"{path.name}: truncated SQLite file ({size} bytes, shorter than its header)")
    (page_size,) = struct.unpack(">H", header[16:18])
    page_size = 65536 if page_size == 1 else page_size
    (pages,) = struct.unpack(">I", header[28:32])
    change_counter, valid_for = header[24:28], header[92:96]
    if pages and change_counter == valid_for and page_size * pages > size:
        raise TraceError(
            f"{path.name}: truncated SQLite file ({size} bytes, its header says "
            f"{page_size * pages}); copy the whole file again"
        )


# Seconds to wait for a writer's lock before saying so. A finished trace has no writer; one
# that is still being written (an export running) should fail fast and clearly, not stall.
BUSY_TIMEOUT_S = 2.0


def _connect(path: Path, immutable: bool) -> sqlite3.Connection:
    uri = f"file:{quote(str(path.resolve()))}?mode=ro" + ("&immutable=1" if immutable else "")
    conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
    try:
        conn.execute("PRAGMA query_only = ON")
        # A database file can carry views and triggers; do not let them call functions with
        # side effects (SQLite >= 3.31; older versions ignore an unknown pragma).
        conn.execute("PRAGMA trusted_schema = OFF")
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except BaseException:
        conn.close()
        raise
    return conn


def _journal_mode(path: Path) -> str:
    """"wal" when the header says WAL (bytes 18-19 = 2), else "rollback"."""
    with open(path, "rb") as fh:
        header = fh.read(20)
    return "wal" if header[18:20] == b"\x02\x02" else "rollback"


def _nonempty(path: Path) -> bool:
    try:
        return path.stat().st_size > 0
    except OSError:
        return False


# Private snapshots of WAL databases with a live log: {(path, identity): copy}. Removed at exit.
_SNAPSHOTS: dict[tuple, Path] = {}


def _snapshot(path: Path) -> Path:
    """A private, checkpointed copy of a WAL database whose `-wal` holds writes.

    Reading it in place, even `mode=ro`, writes read marks into the `-shm` file beside it
    (someone else's file, maybe a live writer's); `immutable=1` would ignore the log and miss
    the last writes. So the database and its log are copied into a private directory, the
    copy's log is checkpointed (SQLite applies only complete, checksummed commits: a log
    still being appended to gives the last committed state), and the copy is read alone."""
    wal = path.with_name(path.name + "-wal")
    ident = tuple(os.stat(p).st_mtime_ns for p in (path, wal)) + (os.path.getsize(path), os.path.getsize(wal))
    key = (str(path.resolve()), ident)
    copy = _SNAPSHOTS.get(key)
    if copy is not None and copy.exists():
        return copy
    work = Path(tempfile.mkdtemp(prefix="advisor-sqlite-"))
    atexit.register(shutil.rmtree, work, True)
    copy = work / "snapshot.sqlite"
    try:
        shutil.copyfile(path, copy)
        shutil.copyfile(wal, work / "snapshot.sqlite-wal")
        conn = sqlite3.connect(copy)
        try:
            conn.execute("PRAGMA trusted_schema = OFF")
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            conn.execute("PRAGMA journal_mode = DELETE")
        finally:
            conn.close()
    except (OSError, sqlite3.Error) as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise TraceError(f"{path.name}: cannot read its write-ahead log ({exc})") from None
    _SNAPSHOTS[key] = copy
    return copy


def _locked(path: Path) -> TraceError:
    return TraceError(
        f"{path.name}: the database is being written by another process (it holds a lock; an export or capture "
        "still running?): wait until it finishes, or copy it when it is complete"
    )


def db_error(path: Path, exc: BaseException, what: str = "corrupt SQLite file") -> TraceError:
    """The one-line error for a SQLite failure while reading `path`: a writer's lock is said
    to be one (not "corrupt")."""
    text = str(exc)
    if "database is locked" in text or "database table is locked" in text:
        return _locked(Path(path))
    return TraceError(f"{Path(path).name}: {what} ({exc})")


def open_readonly(path: str | os.PathLike) -> sqlite3.Connection:
    """A read-only connection to the SQLite database at `path`, or a one-line TraceError.
    Nothing beside the file is created or changed.

    - WAL database with writes in its `-wal`: read from a private checkpointed copy
      (`_snapshot`); WAL database without a log: `immutable=1`, which reads the file alone
      (a `mode=ro` open would create `-wal` and `-shm` beside it).
    - Otherwise `mode=ro`. A writer's lock held past BUSY_TIMEOUT_S, or a `-journal` beside
      the file (a write in progress, or a writer that crashed mid-transaction), is an error:
      reading the file as it is then could see half a transaction.
    - `immutable=1` only when `mode=ro` cannot open a file with no journal (a read-only
      directory where SQLite cannot take its locks).
    """
    path = Path(path)
    check_size(path)
    name = path.name
    if _journal_mode(path) == "wal":
        if _nonempty(path.with_name(path.name + "-wal")):
            path = _snapshot(path)
        order = (True,)
    else:
        if _nonempty(path.with_name(path.name + "-journal")):
            raise TraceError(
                f"{name}: the database is being written, or its writer crashed (a -journal beside it holds an "
                "unfinished transaction): wait until the writer finishes, or open it once with sqlite3 to recover it"
            )
        order = (False, True)
    first_error: sqlite3.Error | None = None
    for immutable in order:
        try:
            return _connect(path, immutable)
        except UnicodeDecodeError:
            # sqlite3 decodes SQLite's error message, which quotes the damaged schema text
            raise TraceError(f"{name}: corrupt SQLite file (malformed schema)") from None
        except sqlite3.DatabaseError as exc:
            text = str(exc)
            if "not a database" in text or "malformed" in text:
                raise TraceError(f"{name}: corrupt SQLite file ({exc})") from None
            if "locked" in text or "busy" in text:
                raise _locked(Path(name)) from None
            first_error = first_error or exc
    raise TraceError(f"{name}: cannot open SQLite file read-only ({first_error})")


def tables(conn: sqlite3.Connection) -> set[str]:
    """Names of the real tables (not views) in the database."""
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def columns(conn: sqlite3.Connection, table: str) -> list[str]:
    """Column names of `table`, in order (empty if there is no such table)."""
    return [row[0] for row in conn.execute("SELECT name FROM pragma_table_info(?)", (table,))]


def text_value(v: object) -> object:
    """A cell read where text belongs: bytes (a BLOB) decoded with replacement characters,
    numbers as their text, None kept."""
    if v is None or isinstance(v, str):
        return v
    if isinstance(v, (bytes, bytearray)):
        return bytes(v).decode("utf-8", "replace")
    return str(v)


def _lenient(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def fetchall(conn: sqlite3.Connection, sql: str, params: Sequence[object] = ()) -> list[tuple]:
    """conn.execute(sql, params).fetchall(), also when a TEXT cell holds invalid UTF-8
    (then that query is repeated with replacement characters)."""
    try:
        return conn.execute(sql, tuple(params)).fetchall()
    except sqlite3.OperationalError as exc:
        if "decode" not in str(exc):
            raise
    factory = conn.text_factory
    conn.text_factory = _lenient
    try:
        return conn.execute(sql, tuple(params)).fetchall()
    finally:
        conn.text_factory = factory


def table_names(path: str | os.PathLike) -> set[str]:
    """Table names of the database at `path` (for sniffers); TraceError if unreadable."""
    path = Path(path)
    try:
        conn = open_readonly(path)
    except OSError as exc:
        raise TraceError(f"{path.name}: cannot read ({exc})") from None
    try:
        return tables(conn)
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        raise db_error(path, exc) from None
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------
# Fast bulk reads.
#
# Building one Python object per cell (cursor.fetchall) costs about 0.25 us per value, so a
# million kernels x 17 columns take ~5 s before pandas even starts. Instead each integer
# column is aggregated inside SQLite into one comma-separated string (group_concat, which
# runs in sqlite3_step with the GIL released) and parsed by numpy; row ranges are read on
# a few threads, each with its own read-only connection. NULL becomes a sentinel first
# (group_concat skips NULLs, which would misalign the columns) and NA afterwards. Chunks
# are rowid ranges, concatenated in order; within a chunk an unfiltered read walks the
# rowid range in order, and a filtered one (which may go through an index) also reads the
# rowid and is sorted by it.

_NULL = np.iinfo(np.int64).min
_NULL_SQL = "-9223372036854775807 - 1"  # the literal 9223372036854775808 would be a REAL
_CHUNK_ROWS = 250_000
_MAX_THREADS = 4


def _int_sql(cols: Sequence[str], not_null: set[str]) -> str:
    def cell(c: str) -> str:
        return ident(c) if c in not_null else f"coalesce({ident(c)}, {_NULL_SQL})"

    return ", ".join(f"group_concat({cell(c)}, ',')" for c in cols)


def not_null_columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """Columns declared NOT NULL (they need no NULL sentinel), plus rowid."""
    rows = conn.execute('SELECT name, "notnull" FROM pragma_table_info(?)', (table,)).fetchall()
    return {name for name, notnull in rows if notnull} | {"rowid"}


def _parse_ints(text: str | None, n: int) -> np.ndarray | None:
    """The n integers in `text`, or None if it holds anything else (REAL or TEXT cells)."""
    if n == 0:
        return np.empty(0, dtype=np.int64)
    if not isinstance(text, str):
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            values = np.fromstring(text, dtype=np.int64, sep=",")
        except (DeprecationWarning, ValueError):
            return None
    return values if len(values) == n else None


# NULL in a column stored as int32 (which then holds only -2**31+1 .. 2**31-1)
_NULL32 = np.iinfo(np.int32).min


def _fits32(a: np.ndarray) -> bool:
    """Every non-NULL value of the int64 array `a` fits int32 beside _NULL32."""
    if not len(a):
        return True
    if a.max() > 2**31 - 1:
        return False
    lo = a.min()
    if lo == _NULL:
        valid = a[a != _NULL]
        lo = valid.min() if len(valid) else 0
    return lo > _NULL32


def _to64(col: np.ndarray) -> np.ndarray:
    """An int32 column (_NULL32 for NULL) as int64 (_NULL for NULL)."""
    wide = col.astype(np.int64)
    wide[col == _NULL32] = _NULL
    return wide


def _to32(a: np.ndarray) -> np.ndarray:
    out = a.astype(np.int32)
    out[a == _NULL] = _NULL32
    return out


def _store(col: np.ndarray, at: int, a: np.ndarray) -> np.ndarray:
    """`a` (int64, _NULL for NULL) written into `col` at `at`; an int32 `col` becomes int64
    (what is written so far copied) when `a` does not fit it. Returns the column."""
    n = len(a)
    if col.dtype == np.int32:
        if _fits32(a):
            col[at : at + n] = a
            if n and a.min() == _NULL:
                col[at : at + n][a == _NULL] = _NULL32
            return col
        wide = np.empty(len(col), dtype=np.int64)
        wide[:at] = _to64(col[:at])
        col = wide
    col[at : at + n] = a
    return col


def _parse_chunks(rows, width: int, total: int | None = None, narrow: Sequence[bool] = ()) -> list[np.ndarray] | None:
    """The `width` columns parsed from each chunk's result row, joined in order; None if any
    cell was not an integer. With `total` (the row count, when no filter applies) each chunk
    is copied into columns allocated once and let go: the chunks are never all held beside
    the joined columns (10M kernels x 17 columns: 1.3 GB less at the peak). Columns marked in
    `narrow` are int32 (NULL as _NULL32) when all their values fit, else int64 (NULL as
    _NULL): allocated int32 and widened at the first chunk that does not fit, so that a
    10M-row table's ids are never held at 8 bytes a value."""
    narrow = list(narrow) or [False] * width
    out = ([np.empty(total, dtype=np.int32 if nw else np.int64) for nw in narrow] if total is not None else None)
    parts: list[list[np.ndarray]] = []
    at = 0
    for row in rows:
        if row is None:
            return None
        arrays = [_parse_ints(text, row[0]) for text in row[1:]]
        del row
        if any(a is None for a in arrays):
            return None
        n = len(arrays[0]) if arrays else 0
        if out is not None and at + n <= total:
            for i, a in enumerate(arrays):
                out[i] = _store(out[i], at, a)
        else:  # more rows than counted (cannot happen read-only): join what came
            if out is not None:
                parts, out = [[_to64(col[:at]) if col.dtype == np.int32 else col[:at] for col in out]], None
            parts.append(arrays)
        at += n
    if out is not None:
        return [col[:at] for col in out] if at < total else out
    if not parts:
        return [np.empty(0, dtype=np.int32 if nw else np.int64) for nw in narrow]
    joined = [np.concatenate([p[i] for p in parts]) for i in range(width)]
    return [_to32(c) if nw and _fits32(c) else c for c, nw in zip(joined, narrow)]


def _ordered_map(pool: ThreadPoolExecutor, fn, items, ahead: int):
    """pool.map(fn, items) with at most `ahead` results waiting: pool.map submits every
    item at once, and chunks read faster than they were parsed piled up as text (a 10M-row
    table: ~2 GB of it)."""
    items = list(items)
    futures = deque(pool.submit(fn, x) for x in items[:ahead])
    nxt = ahead
    while futures:
        result = futures.popleft().result()
        if nxt < len(items):
            futures.append(pool.submit(fn, items[nxt]))
            nxt += 1
        yield result


def _fetch_chunk(conn, table, cols, not_null, where, params, lo, hi):
    """(count, concatenated column texts...) of one rowid range; None when a cell held a
    BLOB that is not UTF-8 (the slow path then reads the table cell by cell)."""
    sql = (
        f"SELECT count(*), {_int_sql(cols, not_null)} FROM {ident(table)} "
        f"WHERE rowid BETWEEN ? AND ?{' AND (' + where + ')' if where else ''}"
    )
    try:
        return conn.execute(sql, (lo, hi, *params)).fetchone()
    except sqlite3.OperationalError as exc:
        if "decode" in str(exc):
            return None
        raise


def _fetch_chunk_own_connection(connect, *args):
    conn = connect()
    try:
        return _fetch_chunk(conn, *args)
    finally:
        conn.close()


def _slow_read(conn, table, names, where, params) -> pd.DataFrame:
    """cursor.fetchall, for tables whose cells are not all integers."""
    sql = f"SELECT {', '.join(ident(c) for c in names)} FROM {ident(table)}"
    if where:
        sql += f" WHERE {where}"
    rows = fetchall(conn, sql + " ORDER BY rowid", params)
    df = pd.DataFrame.from_records(rows, columns=names)
    out = {}
    for c in names:
        v = pd.to_numeric(df[c], errors="coerce").astype("Float64") if len(df) else df[c]
        if len(df):  # fractions and values beyond int64 are not integers: NA
            v = v.where((v == v.round()) & (v.abs() < 2.0**63))
        out[c] = v.astype("Int64")
    return pd.DataFrame(out)


def read_int_columns(
    connect: Callable[[], sqlite3.Connection],
    table: str,
    cols: Sequence[str],
    *,
    where: str = "",
    params: Sequence[object] = (),
    rowid: bool = False,
    narrow: Sequence[str] = (),
) -> pd.DataFrame:
    """Integer columns `cols` of `table` (rows matching `where`) as nullable Int64 columns,
    in rowid order; with `rowid=True` the rowid comes too (to align with other queries).
    Columns named in `narrow` come as Int32 instead when every value fits int32 (and one
    of them is not NULL).

    `connect()` returns a new read-only connection (one per worker thread). `cols` must be
    existing column names; `where` is SQL written by the caller from whitelisted names,
    with `?` placeholders bound to `params`. Cells that are not integers become NA.
    """
    # Without a filter SQLite walks the rowid range of each chunk in rowid order; with one it
    # may use an index, so the rowid comes along to put the rows back in order.
    names = ["rowid", *cols] if (rowid or where or not cols) else list(cols)
    conn = connect()
    try:
        not_null = not_null_columns(conn, table)
        lo, hi, count = conn.execute(
            f"SELECT min(rowid), max(rowid), count(*) FROM {ident(table)}"
        ).fetchone()
        if lo is None:
            return pd.DataFrame({c: pd.array([], dtype="Int64") for c in (["rowid", *cols] if rowid else cols)})
        if hi - lo + 1 > 4 * count:
            ranges = [(lo, hi)]  # sparse rowids: chunks by rowid would be uneven, read at once
        else:
            ranges = [(b, min(b + _CHUNK_ROWS - 1, hi)) for b in range(lo, hi + 1, _CHUNK_ROWS)]
        threads = min(_MAX_THREADS, os.cpu_count() or 1, len(ranges))
        total = None if where else count
        narrowed = [c in narrow for c in names]
        if threads <= 1:
            columns = _parse_chunks((_fetch_chunk(conn, table, names, not_null, where, params, *r) for r in ranges),
                                    len(names), total, narrowed)
        else:
            with ThreadPoolExecutor(threads) as pool:
                # Results arrive in order; each is parsed here while later chunks are read.
                columns = _parse_chunks(
                    _ordered_map(
                        pool,
                        lambda r: _fetch_chunk_own_connection(connect, table, names, not_null, where, params, *r),
                        ranges,
                        threads,
                    ),
                    len(names),
                    total,
                    narrowed,
                )
        if columns is None:
            slow = _slow_read(conn, table, ["rowid", *cols], where, params)
            return slow if rowid else slow.drop(columns="rowid")
    finally:
        conn.close()
    order = None
    if names[0] == "rowid" and len(columns[0]) > 1 and not bool(np.all(columns[0][1:] > columns[0][:-1])):
        order = np.argsort(columns[0], kind="stable")
    out = {}
    for name, values in zip(names, columns):
        if name == "rowid" and not rowid:
            continue
        if order is not None:
            values = values[order]
        mask = values == (_NULL32 if values.dtype == np.int32 else _NULL)
        if values.dtype == np.int32 and (mask.all() or not len(values)):  # all NULL: Int64, as before
            values, mask = np.zeros(len(values), dtype=np.int64), mask
        out[name] = pd.arrays.IntegerArray(values, mask)
    return pd.DataFrame(out, copy=False)


def read_text_column(
    conn: sqlite3.Connection, table: str, col: str, *, where: str = "", params: Sequence[object] = ()
) -> pd.Series:
    """Column `col` of the rows matching `where`, as an object Series indexed by rowid.

    Grouped by value inside SQLite (one row per distinct text with its rowids concatenated):
    trace texts repeat (300k NVTX ranges may hold a handful of distinct strings), and
    building one Python string per row cost most of the read."""
    sql = f"SELECT {ident(col)}, count(*), group_concat(rowid, ',') FROM {ident(table)}"
    if where:
        sql += f" WHERE {where}"
    groups = fetchall(conn, sql + f" GROUP BY {ident(col)}", params)
    if not groups:
        return pd.Series([], dtype="object", index=pd.Index([], dtype="int64"))
    counts = np.array([g[1] for g in groups], dtype=np.int64)
    ids = np.fromstring(",".join(g[2] for g in groups), dtype=np.int64, sep=",")
    distinct = np.empty(len(groups), dtype=object)
    distinct[:] = [text_value(g[0]) for g in groups]
    values = np.repeat(distinct, counts)
    order = np.argsort(ids, kind="stable")
    return pd.Series(values[order], index=pd.Index(ids[order], dtype="int64"), dtype="object")


def lookup_strings(
    conn: sqlite3.Connection, table: str, ids: pd.Series | np.ndarray, *, key: str = "id", value: str = "value"
) -> pd.Series:
    """`value` by `key` from a string table (e.g. nsys StringIds) for the distinct `ids`,
    as a Series indexed by id. Reads only the ids asked for, in batches of bound params."""
    wanted = pd.unique(pd.Series(ids).dropna().astype("int64"))
    keys: list[int] = []
    values: list[object] = []
    batch = 500  # well under SQLite's oldest host-parameter limit (999)
    sql_head = f"SELECT {ident(key)}, {ident(value)} FROM {ident(table)} WHERE {ident(key)} IN "
    for i in range(0, len(wanted), batch):
        chunk = [int(x) for x in wanted[i : i + batch]]
        marks = ",".join("?" * len(chunk))
        for k, v in fetchall(conn, f"{sql_head}({marks})", chunk):
            if not isinstance(k, int):  # a TEXT id column matched by affinity ('7' = 7)
                try:
                    k = int(k)
                except (TypeError, ValueError, OverflowError):
                    continue
            keys.append(k)
            values.append(text_value(v))
    out = pd.Series(values, index=pd.Index(keys, dtype="int64"), dtype="object")
    return out[~out.index.duplicated()]


def map_ids(ids: pd.Series, strings: pd.Series, missing: object = None) -> np.ndarray:
    """Object array: strings[id] for each id (`missing` where the id is NA or unknown). Rows
    of one id share one str object: a name column costs 8 bytes a row, not a string each."""
    codes = id_codes(ids, strings)
    return string_table(strings, missing)[codes]  # code -1 picks the trailing `missing`


def id_codes(ids: pd.Series, strings: pd.Series) -> np.ndarray:
    """Positions in `strings` of each id: -1 where the id is NA, unknown, or its string is
    None (a NULL value), so that codes of several id columns can be coalesced."""
    ids = pd.Series(ids)
    if strings.empty or ids.empty:
        return np.full(len(ids), -1, dtype=np.intp)
    if isinstance(ids.dtype, (pd.Int64Dtype, pd.Int32Dtype)):  # no float round trip
        codes = strings.index.get_indexer(ids.to_numpy(dtype="int64", na_value=-1))
    else:
        codes = strings.index.get_indexer(ids.fillna(-1).astype("int64"))
    null = strings.isna().to_numpy()
    if null.any():
        codes[(codes >= 0) & null[np.maximum(codes, 0)]] = -1
    return codes


def string_table(strings: pd.Series, missing: object = None) -> np.ndarray:
    """`strings` as an object array with `missing` appended (what code -1 picks)."""
    return np.append(strings.to_numpy(dtype=object), np.array([missing], dtype=object))
