"""rocprof v1 `results.db`: the SQLite database rocprof (ROCm <= 6.x) builds beside
results.csv and results.json.

Layout (ROCm/rocprofiler `bin/tblextr.py`, `bin/sqlitedb.py`): one table per record kind,
each column as the CSV names it. What is read:
- `KERN`, the dispatches: the columns of results.csv (`Index`, `KernelName`, `gpu-id`,
  `queue-id`, `grd`, `wgr`, `lds`, `arch_vgpr`, ..., `BeginNs`, `EndNs`, `DurationNs`). The
  kernel name is stored with its CSV quotes (`"compute_fd_x_kernel"`): they are dropped. The
  rows go through the same conversion as results.csv (`rocprof_csv.kernel_frames`): `grd`
  and `wgr` are work-item totals, so the grid is ceil(grd / wgr) workgroups, reported 1-D, and
  a CU plays the SM's role;
- `HIP` and `HSA` (with `--hip-trace`/`--hsa-trace`): host API calls (`BeginNs`, `EndNs`,
  `tid`, `Name`), the runtime frame;
- `OPS` (HIP activity): operations named Copy/Memcpy/Fill are copies and sets (memcpy frame,
  bytes unknown); the kernels among them repeat `KERN` and are not read again.
The database names no GPU model: `--sm-count` (or the device table of a companion file)
gives the CU count.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import TraceError
from ..model import Trace
from . import _sqlite, rocprof_csv, rocprof_v1_json
from ._amd import readonly_db

FORMAT = "rocprof-v1-db"
DESCRIPTION = "rocprof v1 results.db (SQLite, KERN table)"

_KERN = "KERN"
_NEEDED = {"KernelName", "BeginNs", "EndNs"}


def _is_v1(conn: sqlite3.Connection) -> bool:
    return _KERN in _sqlite.tables(conn) and _NEEDED <= set(_sqlite.columns(conn, _KERN))


def sniff(path: Path, head: bytes) -> bool:
    if not _sqlite.is_sqlite(head):
        return False
    with readonly_db(path) as conn:
        return _is_v1(conn)


def read(path: Path, *, rank: int, cache_dir: Path | None = None) -> Trace:
    with readonly_db(path, "corrupt or unreadable rocprof results.db") as conn:
        return _read(conn, path, rank)


def _rows(conn: sqlite3.Connection, table: str) -> list[dict[str, Any]]:
    """Every row of `table` (a name from our own list) as a dict of text cells (None for
    NULL), as results.csv holds them. Column names such as `gpu-id` come from the cursor,
    never into SQL."""
    cur = conn.execute(f"SELECT * FROM {_sqlite.ident(table)}")
    cols = [d[0] for d in cur.description]
    return [{c: _sqlite.text_value(v) for c, v in zip(cols, r)} for r in cur]


def _unquote(name: object) -> str:
    s = "" if name is None else str(name)
    return s[1:-1] if len(s) >= 2 and s[0] == s[-1] == '"' else s


def _read(conn: sqlite3.Connection, path: Path, rank: int) -> Trace:
    if not _is_v1(conn):
        raise TraceError(f"{path.name}: SQLite file without rocprof's KERN table (not a rocprof v1 results.db)")
    notes: list[str] = []
    rows = _rows(conn, _KERN)
    kernels = devices = None
    if rows:
        df = pd.DataFrame(rows)
        df["KernelName"] = df["KernelName"].map(_unquote)
        df = df.astype(object).where(df.notna(), "").astype(str)
        kernels, devices = rocprof_csv.kernel_frames(df, path=path, variant="rocprof v1", rank=rank, notes=notes)
    else:
        notes.append(f"no kernel dispatches in {path.name}'s KERN table")
    names = _sqlite.tables(conn)
    api = [r for t in ("HIP", "HSA") if t in names for r in _rows(conn, t) if r.get("Name")]
    copies = []
    if "OPS" in names:
        for r in _rows(conn, "OPS"):
            name = r.get("Name") or ""
            if rocprof_v1_json._COPY.search(name):
                copies.append({**r, "Name": name})
    meta: dict[str, Any] = {"format": FORMAT, "variant": "rocprof v1", "notes": notes}
    return Trace.build(
        meta=meta,
        kernels=kernels,
        devices=devices,
        runtime=rocprof_v1_json._api(api, rank) if api else None,
        memcpy=rocprof_v1_json._copies(copies, rank) if copies else None,
    )
