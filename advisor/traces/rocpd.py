"""rocpd SQLite databases (`rocprofv3 --output-format rocpd`, ROCm's profiler database).

Schema (rocprofiler-sdk `source/share/rocprofiler-sdk-rocpd/rocpd_tables.sql`,
`rocpd_views.sql`, `data_views.sql`): every table carries a per-run suffix,
`rocpd_kernel_dispatch_<uuid>`, `rocpd_info_agent_<uuid>`, ..., and `rocpd_views.sql` adds
unsuffixed views (`rocpd_kernel_dispatch`, ...) over them; `data_views.sql` adds joined views
such as `kernels`. We read the unsuffixed views when present (else each suffixed table set in
turn) and join in pandas, because the `kernels` view's inner joins drop dispatches whose
event, thread or region row is missing.

Two layouts exist and both are read:
- schema 3.x: `rocpd_kernel_dispatch` has `agent_id`, `queue_id`, `stream_id`, `tid`, `start`,
  `end` itself;
- schema 4.x: the dispatch points at a `rocpd_track` row (`track_id`: agent, queue, stream,
  thread) and, in some 4.0 builds, at `rocpd_timestamp` rows (`start_id`, `end_id`).

What becomes what:
- kernels: `grid_size_*` are work-items (as in every ROCm trace), so grid =
  ceil(grid_size / workgroup_size) per dimension; LDS: the symbol's `group_segment_size` is
  static, the dispatch's `group_segment_size` minus it dynamic; `arch_vgpr_count` is
  `registers_per_thread`; names from the symbol's `extdata` (`formatted_kernel_name`,
  `truncated_kernel_name`), else `display_name`, else `kernel_name`. `correlation_id` is the
  event's `stack_id` (rocprofiler's internal correlation id; `correlation_id` there is the
  external one).
- devices: GPU agents (`type` = 'GPU') that ran kernels or copies, numbered by `type_index`
  (the HIP device ordinal); limits from the agent's `extdata` (the rocprofiler agent record:
  `cu_count`, `wave_front_size`, `max_waves_per_cu`, `lds_size_in_kb`...).
- memcpy: `rocpd_memory_copy` (name MEMORY_COPY_HOST_TO_DEVICE... gives the kind; a
  DEVICE_TO_DEVICE copy between two different GPUs is PtoP, as CUPTI calls a peer copy).
- runtime / nvtx: `rocpd_region` rows whose event category is a HIP/HSA/RCCL API
  (runtime) or a roctx marker (nvtx, domain "roctx").

The file is opened strictly read-only (advisor.traces._sqlite). Table names come from
`sqlite_master` only after matching `rocpd_<known family><suffix>` with a plain suffix;
column names come from our own lists intersected with `PRAGMA table_info`. Nothing else from
the file ever reaches SQL text.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import TraceError
from ..model import Trace
from . import _sqlite
from ._amd import agent_device_row, copy_kind, gpu_frame, readonly_db, workgroups
from ._jsonio import to_int
from ._names import short_name, strip_kd

FORMAT = "rocpd"
DESCRIPTION = "rocpd SQLite database (rocprofv3 --output-format rocpd)"

_ANCHOR = "rocpd_kernel_dispatch"
_SUFFIX = re.compile(r"(_[0-9A-Za-z][0-9A-Za-z_-]*)?\Z")
_FAMILIES = (
    "kernel_dispatch",
    "info_kernel_symbol",
    "info_agent",
    "info_thread",
    "track",
    "timestamp",
    "event",
    "string",
    "info_category",
    "memory_copy",
    "region",
)
# Columns we may read, per family (intersected with what the table has).
_COLUMNS = {
    "kernel_dispatch": (
        "guid", "id", "tid", "agent_id", "kernel_id", "dispatch_id", "queue_id", "stream_id",
        "track_id", "start", "end", "start_id", "end_id", "group_segment_size",
        "workgroup_size_x", "workgroup_size_y", "workgroup_size_z",
        "grid_size_x", "grid_size_y", "grid_size_z", "event_id",
    ),
    "info_kernel_symbol": ("guid", "id", "kernel_name", "display_name", "group_segment_size", "arch_vgpr_count", "extdata"),
    "info_agent": ("guid", "id", "type", "type_index", "absolute_index", "name", "generic_name", "product_name", "extdata"),
    "info_thread": ("guid", "id", "tid"),
    "track": ("guid", "id", "tid", "agent_id", "queue_id", "stream_id"),
    "timestamp": ("guid", "id", "value"),
    "event": ("guid", "id", "stack_id", "category_id"),
    "string": ("guid", "id", "string"),
    "info_category": ("guid", "id", "name"),
    "memory_copy": (
        "guid", "id", "tid", "track_id", "start", "end", "start_id", "end_id", "name_id",
        "dst_agent_id", "src_agent_id", "size", "queue_id", "stream_id", "event_id",
    ),
    "region": ("guid", "id", "tid", "track_id", "start", "end", "start_id", "end_id", "name_id", "event_id"),
}
_COPY_KINDS = {
    "MEMORY_COPY_HOST_TO_HOST": "HtoH",
    "MEMORY_COPY_HOST_TO_DEVICE": "HtoD",
    "MEMORY_COPY_DEVICE_TO_HOST": "DtoH",
    "MEMORY_COPY_DEVICE_TO_DEVICE": "DtoD",
}


def _object_names(conn: sqlite3.Connection) -> set[str]:
    return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")}


def _is_rocpd(names: set[str]) -> bool:
    if "StringIds" in names:  # an Nsight Systems export
        return False
    return any(
        n == _ANCHOR or n.startswith(_ANCHOR + "_") or n == "rocpd_info_agent" or n.startswith("rocpd_info_agent_")
        for n in names
    )


def sniff(path: Path, head: bytes) -> bool:
    if not _sqlite.is_sqlite(head):
        return False
    with readonly_db(path) as conn:
        return _is_rocpd(_object_names(conn))


def read(path: Path, *, rank: int, cache_dir: Path | None = None) -> Trace:
    with readonly_db(path, "corrupt or unreadable rocpd database") as conn:
        return _read(conn, path, rank)


# ---------------------------------------------------------------------------------------------


def _table_sets(names: set[str], notes: list[str]) -> list[dict[str, str]]:
    """One {family: table} map per data set: the unsuffixed views, else each suffix."""
    suffixes = sorted({n[len(_ANCHOR):] for n in names if n == _ANCHOR or n.startswith(_ANCHOR + "_")})
    if not suffixes and any(n == "rocpd_info_agent" or n.startswith("rocpd_info_agent_") for n in names):
        suffixes = sorted({n[len("rocpd_info_agent"):] for n in names if n.startswith("rocpd_info_agent")})
    if "" in suffixes:
        suffixes = [""]
    sets = []
    for s in suffixes:
        if not _SUFFIX.match(s):
            notes.append(f"skipped rocpd tables with an unexpected name suffix {s[:40]!r}")
            continue
        sets.append({f: f"rocpd_{f}{s}" for f in _FAMILIES if f"rocpd_{f}{s}" in names})
    return sets


def _quote(table: str) -> str:
    # Table names passed here were built from a known family and a suffix matching _SUFFIX:
    # letters, digits, '_' and '-' only, so double quotes delimit them safely.
    if not re.fullmatch(r"rocpd_[a-z_]+(_[0-9A-Za-z][0-9A-Za-z_-]*)?", table):
        raise ValueError(f"refusing table name {table!r}")
    return f'"{table}"'


def _load(conn: sqlite3.Connection, tables: dict[str, str], family: str) -> pd.DataFrame | None:
    table = tables.get(family)
    if table is None:
        return None
    have = set(_sqlite.columns(conn, table))
    cols = [c for c in _COLUMNS[family] if c in have]
    if not cols:
        return None
    sql = f"SELECT {', '.join(_sqlite.ident(c) for c in cols)} FROM {_quote(table)}"
    rows = _sqlite.fetchall(conn, sql)
    # object dtype: integer columns with NULLs would otherwise turn float64 and lose ns digits
    return pd.DataFrame(rows, columns=cols, dtype="object")


def _lookup(df: pd.DataFrame, ref: str, table: pd.DataFrame | None, value: str, key: str = "id") -> pd.Series:
    """table[value] for each df[ref] (matching table[key], and guid when both have one), as an
    object series: SQLite's Python ints stay exact, misses are None."""
    if table is None or ref not in df.columns or value not in table.columns or key not in table.columns:
        return pd.Series([None] * len(df), index=df.index, dtype="object")
    refs = df[ref].tolist()
    if "guid" in df.columns and "guid" in table.columns:
        mapping = dict(zip(zip(table["guid"].tolist(), table[key].tolist()), table[value].tolist()))
        out = [mapping.get((g, r)) for g, r in zip(df["guid"].tolist(), refs)]
    else:
        mapping = dict(zip(table[key].tolist(), table[value].tolist()))
        out = [mapping.get(r) for r in refs]
    return pd.Series(out, index=df.index, dtype="object")


def _placed(df: pd.DataFrame, t: dict[str, pd.DataFrame | None]) -> pd.DataFrame:
    """Add start/end/tid/agent_id/queue_id/stream_id from timestamp and track rows (schema 4)."""
    df = df.copy()
    for col in ("start", "end"):
        if col not in df.columns and f"{col}_id" in df.columns:
            df[col] = _lookup(df, f"{col}_id", t["timestamp"], "value")
    if "track_id" in df.columns and t["track"] is not None:
        for col in ("tid", "agent_id", "queue_id", "stream_id"):
            if col not in df.columns:
                df[col] = _lookup(df, "track_id", t["track"], col)
    if "tid" in df.columns and t["info_thread"] is not None:
        os_tid = _lookup(df, "tid", t["info_thread"], "tid")
        df["tid"] = os_tid.where(os_tid.notna(), df["tid"])
    return df


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    if name in df.columns:
        return to_int(df[name])
    return pd.Series(pd.NA, index=df.index, dtype="Int64")


def _json(value: Any) -> dict:
    if isinstance(value, (bytes, bytearray)):
        value = value.decode("utf-8", errors="replace")
    if not isinstance(value, str) or not value:
        return {}
    try:
        out = json.loads(value)
    except (ValueError, RecursionError):
        return {}
    return out if isinstance(out, dict) else {}


def _read(conn: sqlite3.Connection, path: Path, rank: int) -> Trace:
    notes: list[str] = []
    names = _object_names(conn)
    if not _is_rocpd(names):
        raise TraceError(f"{path.name}: SQLite file without rocpd tables (not a rocpd database)")
    parts: dict[str, list[pd.DataFrame]] = {"kernels": [], "memcpy": [], "runtime": [], "nvtx": [], "devices": []}
    for tables in _table_sets(names, notes):
        t = {f: _load(conn, tables, f) for f in _FAMILIES}
        gpu_ids, agent_rows = _agents(t["info_agent"], rank)
        kernels = _kernels(t, gpu_ids, rank, notes)
        memcpy = _copies(t, gpu_ids, rank)
        runtime, nvtx = _regions(t, rank)
        used = set(kernels["device_id"].dropna().astype(int)) | set(memcpy["device_id"].dropna().astype(int))
        rows = [r for key, r in agent_rows.items() if not used or r["device_id"] in used]
        parts["kernels"].append(kernels)
        parts["memcpy"].append(memcpy)
        parts["runtime"].append(runtime)
        parts["nvtx"].append(nvtx)
        if rows:
            parts["devices"].append(pd.DataFrame(rows))
    # A table set without regions gives None for runtime/nvtx; concat refuses a list of Nones.
    frames = {k: pd.concat(v, ignore_index=True) if any(x is not None for x in v) else None for k, v in parts.items()}
    if frames["devices"] is not None:
        frames["devices"] = frames["devices"].drop_duplicates(subset=["rank", "device_id"])
    return Trace.build(meta={"format": FORMAT, "notes": notes}, **frames)


def _agents(agents: pd.DataFrame | None, rank: int) -> tuple[dict[tuple, int], dict[tuple, dict]]:
    """{(guid, agent id): device id} for GPU agents, and their device rows."""
    ids: dict[tuple, int] = {}
    rows: dict[tuple, dict] = {}
    if agents is None:
        return ids, rows
    gpus = agents[agents["type"].astype(str).str.upper() == "GPU"] if "type" in agents.columns else agents.iloc[0:0]
    for n, rec in enumerate(gpus.to_dict("records")):
        ext = _json(rec.get("extdata"))
        dev = _index(rec.get("type_index"), n)
        key = (rec.get("guid"), rec.get("id"))
        ids[key] = dev
        ids.setdefault((None, rec.get("id")), dev)  # for tables without a guid column
        info = dict(ext)
        for col, field in (("generic_name", "name"), ("product_name", "product_name")):
            if rec.get(col) and not info.get(field):
                info[field] = rec[col]
        if not info.get("name") and isinstance(rec.get("name"), str):
            info["name"] = rec["name"]
        rows[key] = agent_device_row(info, dev, rank)
    return ids, rows


def _index(value: Any, default: int) -> int:
    """A device ordinal from the agent table (`default` when it is not a small whole number)."""
    if isinstance(value, bool) or value is None:
        return default
    try:
        idx = int(value)
    except (TypeError, ValueError, OverflowError):
        return default
    if isinstance(value, float) and value != idx:
        return default
    return idx if 0 <= idx < 2**31 else default


def _device_ids(df: pd.DataFrame, col: str, gpu_ids: dict[tuple, int]) -> list:
    guids = df["guid"].tolist() if "guid" in df.columns else [None] * len(df)
    agent = df[col].tolist() if col in df.columns else [None] * len(df)
    return [gpu_ids.get((g, a)) for g, a in zip(guids, agent)]


def _kernels(t: dict, gpu_ids: dict, rank: int, notes: list[str]) -> pd.DataFrame:
    kd = t["kernel_dispatch"]
    if kd is None or kd.empty:
        return pd.DataFrame(columns=["rank", "device_id", "start_ns", "end_ns", "dur_ns"])
    kd = _placed(kd, t)
    start, end = _col(kd, "start"), _col(kd, "end")
    ok = (start.notna() & end.notna() & (end >= start)).to_numpy(dtype=bool)
    if not ok.all():
        notes.append(f"{int((~ok).sum())} kernel dispatch(es) without valid start/end were skipped")
    # names and resources from the kernel symbols
    syms = t["info_kernel_symbol"]
    ext = _lookup(kd, "kernel_id", syms, "extdata").map(_json)
    display = _lookup(kd, "kernel_id", syms, "display_name")
    mangled = _lookup(kd, "kernel_id", syms, "kernel_name")
    names, shorts = [], []
    cache: dict[tuple, tuple] = {}
    for e, d, m in zip(ext.tolist(), display.tolist(), mangled.tolist()):
        key = (e.get("formatted_kernel_name"), e.get("truncated_kernel_name"), d, m)
        got = cache.get(key)
        if got is None:
            name = next((strip_kd(v) for v in (key[0], d, m) if isinstance(v, str) and v), None)
            trunc = key[1]
            got = cache[key] = (name, strip_kd(trunc) if isinstance(trunc, str) and trunc else (short_name(name) if name else None))
        names.append(got[0])
        shorts.append(got[1])
    static = to_int(_lookup(kd, "kernel_id", syms, "group_segment_size"))
    total = _col(kd, "group_segment_size")
    wg = [_col(kd, f"workgroup_size_{a}") for a in "xyz"]
    grid = [workgroups(_col(kd, f"grid_size_{a}"), w) for a, w in zip("xyz", wg)]
    stream = _col(kd, "stream_id")
    stream = stream.where(stream.notna(), _col(kd, "queue_id"))
    df = gpu_frame(
        rank,
        to_int(_device_ids(kd, "agent_id", gpu_ids)),
        stream,
        to_int(_lookup(kd, "event_id", t["event"], "stack_id")),
        start,
        end,
        grid=grid,
        block=wg,
        name=names,
        short_name=shorts,
        registers_per_thread=to_int(_lookup(kd, "kernel_id", syms, "arch_vgpr_count")),
        static_smem_bytes=static,
        dynamic_smem_bytes=(total - static).where(total >= static),
    )
    return df[ok].reset_index(drop=True)


def _copies(t: dict, gpu_ids: dict, rank: int) -> pd.DataFrame:
    mc = t["memory_copy"]
    if mc is None or mc.empty:
        return pd.DataFrame(columns=["rank", "device_id", "start_ns", "end_ns", "dur_ns"])
    mc = _placed(mc, t)
    start, end = _col(mc, "start"), _col(mc, "end")
    ok = (start.notna() & end.notna()).to_numpy(dtype=bool)
    op_names = _lookup(mc, "name_id", t["string"], "string")
    dst = _device_ids(mc, "dst_agent_id", gpu_ids)
    src = _device_ids(mc, "src_agent_id", gpu_ids)
    df = gpu_frame(
        rank,
        to_int([d if d is not None else s for d, s in zip(dst, src)]),
        _col(mc, "stream_id"),
        to_int(_lookup(mc, "event_id", t["event"], "stack_id")),
        start,
        end,
        op="memcpy",
        kind=[copy_kind(_COPY_KINDS.get(str(n), "unknown"), s, d) for n, s, d in zip(op_names.tolist(), src, dst)],
        bytes=_col(mc, "size"),
    )
    return df[ok].reset_index(drop=True)


def _regions(t: dict, rank: int) -> tuple[pd.DataFrame | None, pd.DataFrame | None]:
    rg = t["region"]
    if rg is None or rg.empty:
        return None, None
    rg = _placed(rg, t)
    start, end = _col(rg, "start"), _col(rg, "end")
    names = _lookup(rg, "name_id", t["string"], "string")
    cat_id = _lookup(rg, "event_id", t["event"], "category_id")
    probe = pd.DataFrame({"category_id": cat_id})
    if "guid" in rg.columns:
        probe["guid"] = rg["guid"].to_numpy()
    # schema 4.1 keeps categories in rocpd_info_category, 3.x in rocpd_string
    category = _lookup(probe, "category_id", t["info_category"], "name")
    category = category.where(category.notna(), _lookup(probe, "category_id", t["string"], "string"))
    cat = category.fillna("").astype(str).str.upper()
    ok = (start.notna() & end.notna()).to_numpy(dtype=bool)
    is_marker = cat.str.contains("MARKER").to_numpy(dtype=bool) & ok
    is_api = (cat.str.contains("_API") & ~cat.str.contains("MARKER")).to_numpy(dtype=bool) & ok
    base = pd.DataFrame(
        {
            "rank": rank,
            "thread_id": _col(rg, "tid"),
            "correlation_id": to_int(_lookup(rg, "event_id", t["event"], "stack_id")),
            "start_ns": start,
            "end_ns": end,
            "dur_ns": end - start,
            "name": names,
        }
    )
    runtime = base[is_api].reset_index(drop=True)
    nvtx = base[is_marker].rename(columns={"name": "text"}).drop(columns=["correlation_id"]).reset_index(drop=True)
    nvtx["domain"] = "roctx"
    return runtime, nvtx
