"""rocmProfileData (RPD) SQLite traces (`runTracer.sh`, `rpd_tracer`, vLLM's ROCm profiling).

Schema (ROCm/rocmProfileData `rocpd_python/rocpd/schema_data/tableSchema.cmd`): plain tables
`rocpd_op` (GPU work), `rocpd_api` (host calls), `rocpd_api_ops` (api_id -> op_id),
`rocpd_kernelapi` / `rocpd_copyapi` (launch arguments, keyed by the api row),
`rocpd_string` (every text, by id), `rocpd_metadata`, and optional `ext_autogradapi`.
This is not rocprofiler-sdk's rocpd (`rocpd_kernel_dispatch_<uuid>`...: advisor.traces.rocpd).

What becomes what:
- kernels: ops whose type (`opType_id` -> string) is `KernelExecution`, or `Task` with a
  name (what hipGraphLaunch replays: graph kernel nodes; their launch call is the
  hipGraphLaunch api row, which has no kernelapi row, so no grid is known). Name: the op's
  description (rpd_tracer copies the kernel name there), else the kernelapi's kernelName.
  `gpuId` is the device, `queueId` the stream. `correlation_id` is the api row's id, so
  kernels replayed by one hipGraphLaunch carry its id and `graphs.attribute` links them.
- grid: `rocpd_kernelapi.gridX..Z` holds whatever the launch call took (rpd_tracer's
  RoctracerDataSource copies the arguments): work-items for hipExtModuleLaunchKernel and
  hipHccModuleLaunchKernel (`globalWorkSize`), workgroups for every other launch call
  (hipLaunchKernel's numBlocks, hipModuleLaunchKernel's gridDim). The vLLM trace shows both:
  hipLaunchKernel grids of 1 with 256-wide workgroups, and Tensile GEMMs from
  hipExtModuleLaunchKernel with gridX 151552 = 592 x 256. `groupSegmentSize` is the launch's
  dynamic LDS (sharedMemBytes).
- memcpy: `Copy*` ops (kind from the op type), bytes from the copyapi row of their call.
- runtime: api rows named hip*/hsa*; `UserMarker` rows (roctx ranges) are NVTX ranges, or
  CPU operators where `ext_autogradapi` marks them as PyTorch autograd ops; the tracer's own
  bookkeeping rows (`OpTable::writeRows`, `rpdflush`...) are left out.
- devices: RPD records no GPU model, CU count or architecture: each gpuId becomes an AMD
  device with unknown limits (`--sm-count` fills the CU count), said in a note.

The file is opened read-only (advisor.traces._sqlite); table and column names in SQL come
from our own lists, intersected with what the file has.
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import TraceError
from ..model import Trace
from . import _sqlite
from ._amd import workgroups
from ._jsonio import to_int
from ._names import short_names, strip_kd

FORMAT = "rpd"
DESCRIPTION = "rocmProfileData RPD SQLite trace (rpd_tracer / runTracer.sh: rocpd_op, rocpd_api)"

_NEEDED = ("rocpd_op", "rocpd_api", "rocpd_string")
_COLUMNS = {
    "rocpd_op": ("id", "gpuId", "queueId", "start", "end", "description_id", "opType_id"),
    "rocpd_api": ("id", "pid", "tid", "start", "end", "apiName_id", "args_id"),
    "rocpd_api_ops": ("api_id", "op_id"),
    "rocpd_kernelapi": (
        "api_ptr_id", "gridX", "gridY", "gridZ", "workgroupX", "workgroupY", "workgroupZ",
        "groupSegmentSize", "kernelName_id",
    ),
    "rocpd_copyapi": ("api_ptr_id", "size"),
    "rocpd_string": ("id", "string"),
    "ext_autogradapi": ("api_ptr_id", "autogradName_id", "sizes"),
}
# Launch calls whose grid arguments are work-item totals (HSA-style globalWorkSize).
_WORK_ITEM_GRIDS = frozenset({"hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel"})
_COPY_KINDS = {
    "CopyHostToDevice": "HtoD",
    "CopyDeviceToHost": "DtoH",
    "CopyDeviceToDevice": "DtoD",
    "CopyHostToHost": "HtoH",
}
_RUNTIME = re.compile(r"^(?:hip|hsa)[A-Z_]")
_MARKER = "UserMarker"


def _is_rpd(names: set[str]) -> bool:
    return all(t in names for t in _NEEDED)


def sniff(path: Path, head: bytes) -> bool:
    if not _sqlite.is_sqlite(head):
        return False
    conn = _sqlite.open_readonly(path)
    try:
        return _is_rpd(_sqlite.tables(conn))
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        raise _sqlite.db_error(path, exc) from None
    finally:
        conn.close()


def read(path: Path, *, rank: int, cache_dir: Path | None = None) -> Trace:
    conn = _sqlite.open_readonly(path)
    try:
        return _read(conn, path, rank)
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
        raise _sqlite.db_error(path, exc, "corrupt or unreadable RPD database") from None
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------


def _load(conn: sqlite3.Connection, table: str, names: set[str]) -> pd.DataFrame | None:
    """The columns of `table` we know (those it has), as object columns (exact Python ints)."""
    if table not in names:
        return None
    have = set(_sqlite.columns(conn, table))
    cols = [c for c in _COLUMNS[table] if c in have]
    if not cols:
        return None
    rows = _sqlite.fetchall(conn, f"SELECT {', '.join(_sqlite.ident(c) for c in cols)} FROM {_sqlite.ident(table)}")
    return pd.DataFrame(rows, columns=cols, dtype="object")


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    if name in df.columns:
        return to_int(df[name])
    return pd.Series(pd.NA, index=df.index, dtype="Int64")


def _text(ids: pd.Series, strings: dict[Any, str]) -> list:
    """The string of each id (None where the id is missing or names no string)."""
    return [strings.get(i) if i is not None and not (isinstance(i, float) and np.isnan(i)) else None for i in ids.tolist()]


def _by_key(df: pd.DataFrame | None, key: str, value: str, refs: pd.Series) -> list:
    """df[value] where df[key] == each ref (None where there is no such row)."""
    if df is None or key not in df.columns or value not in df.columns:
        return [None] * len(refs)
    mapping = dict(zip(df[key].tolist(), df[value].tolist()))
    return [mapping.get(r) for r in refs.tolist()]


def _read(conn: sqlite3.Connection, path: Path, rank: int) -> Trace:
    names = _sqlite.tables(conn)
    if not _is_rpd(names):
        raise TraceError(f"{path.name}: SQLite file without rocmProfileData tables (not an RPD trace)")
    t = {table: _load(conn, table, names) for table in _COLUMNS}
    ops = t["rocpd_op"]
    if ops is None or not {"start", "end", "opType_id"} <= set(ops.columns):
        raise TraceError(f"{path.name}: RPD rocpd_op table lacks start/end/opType_id columns (unsupported RPD schema)")
    notes: list[str] = []
    st = t["rocpd_string"]
    strings = dict(zip(st["id"].tolist(), (_sqlite.text_value(s) for s in st["string"].tolist()))) if st is not None and {"id", "string"} <= set(st.columns) else {}

    # The call that enqueued each op (the lowest api id where an op has several links).
    links = t["rocpd_api_ops"]
    if links is not None and {"api_id", "op_id"} <= set(links.columns) and len(links):
        first = links.assign(api_id=to_int(links["api_id"]), op_id=to_int(links["op_id"])).dropna()
        first = first.groupby("op_id")["api_id"].min()
        api_of = to_int(pd.Series([first.get(i) for i in to_int(ops["id"]).tolist()] if "id" in ops.columns else [None] * len(ops), index=ops.index, dtype="object"))
    else:
        api_of = pd.Series(pd.NA, index=ops.index, dtype="Int64")

    api = t["rocpd_api"]
    api_ids = to_int(api["id"]) if api is not None and "id" in api.columns else pd.Series([], dtype="Int64")
    api_names = dict(zip(api_ids.tolist(), _text(api["apiName_id"], strings))) if api is not None and "apiName_id" in api.columns else {}

    op_type = pd.Series(_text(ops["opType_id"], strings), index=ops.index, dtype="object").fillna("")
    desc = pd.Series(_text(ops["description_id"], strings) if "description_id" in ops.columns else [None] * len(ops), index=ops.index, dtype="object")
    start, end = _col(ops, "start"), _col(ops, "end")
    timed = (start.notna() & end.notna() & (end >= start)).to_numpy(dtype=bool)
    named = desc.fillna("").astype(str).str.len().to_numpy() > 0
    is_kernel = (op_type == "KernelExecution").to_numpy() | ((op_type == "Task").to_numpy() & named)
    is_copy = op_type.str.startswith("Copy").to_numpy()
    bad = int((~timed & (is_kernel | is_copy)).sum())
    if bad:
        notes.append(f"{bad} RPD op(s) without a valid start/end were skipped")
    other = op_type[~is_kernel & ~is_copy]
    if len(other):
        counts = sorted(other.replace("", "(no type)").value_counts().items(), key=lambda kv: (-kv[1], str(kv[0])))
        notes.append("RPD ops not read (neither kernels nor copies): " + ", ".join(f"{n} {k}" for k, n in counts))

    kernels = _kernels(ops[is_kernel & timed], t, strings, desc, api_of, api_names, rank, notes)
    memcpy = _copies(ops[is_copy & timed], t, op_type, api_of, rank)
    runtime, nvtx, cpu_ops = _api_frames(api, t["ext_autogradapi"], strings, rank, notes)
    used = sorted(set(kernels["device_id"].dropna().astype(int)) | set(memcpy["device_id"].dropna().astype(int)))
    devices = pd.DataFrame([{"rank": rank, "device_id": d, "vendor": "amd"} for d in used]) if used else None
    if used:
        notes.append(
            "the RPD trace does not record the GPU model, CU count or architecture: device limits are unknown "
            "unless given (--sm-count)"
        )
    return Trace.build(
        meta={"format": FORMAT, "notes": notes},
        kernels=kernels, memcpy=memcpy, runtime=runtime, nvtx=nvtx, cpu_ops=cpu_ops, devices=devices,
    )


def _kernels(ops, t, strings, desc, api_of, api_names, rank, notes) -> pd.DataFrame:
    if ops.empty:
        return pd.DataFrame(columns=["rank", "device_id", "start_ns", "end_ns", "dur_ns"])
    corr = api_of[ops.index]
    ka = t["rocpd_kernelapi"]
    if ka is not None and "api_ptr_id" in ka.columns:
        ka = ka.assign(api_ptr_id=to_int(ka["api_ptr_id"]))

    def launch(col: str) -> pd.Series:
        return to_int(pd.Series(_by_key(ka, "api_ptr_id", col, corr), index=ops.index, dtype="object"))

    kname = pd.Series(_text(pd.Series(_by_key(ka, "api_ptr_id", "kernelName_id", corr)), strings), index=ops.index, dtype="object")
    name = desc[ops.index].where(desc[ops.index].fillna("").astype(str).str.len() > 0, kname)
    name = name.map(lambda s: strip_kd(s) if isinstance(s, str) and s else None)
    missing = int(name.isna().sum())
    if missing:
        notes.append(f"{missing} RPD kernel op(s) have no name (string id missing from rocpd_string)")
    wg = [launch(f"workgroup{a}") for a in "XYZ"]
    raw = [launch(f"grid{a}") for a in "XYZ"]
    items = pd.Series([api_names.get(c) in _WORK_ITEM_GRIDS for c in corr.tolist()], index=ops.index)
    grid = [g.where(~items, workgroups(g, w)) for g, w in zip(raw, wg)]
    start, end = _col(ops, "start"), _col(ops, "end")
    return pd.DataFrame(
        {
            "rank": rank,
            "device_id": _col(ops, "gpuId"),
            "stream_id": _col(ops, "queueId"),
            "correlation_id": corr,
            "start_ns": start,
            "end_ns": end,
            "dur_ns": end - start,
            "name": name,
            "short_name": short_names(name.tolist()),
            "grid_x": grid[0],
            "grid_y": grid[1],
            "grid_z": grid[2],
            "block_x": wg[0],
            "block_y": wg[1],
            "block_z": wg[2],
            "grid_blocks": grid[0] * grid[1] * grid[2],
            "block_threads": wg[0] * wg[1] * wg[2],
            "dynamic_smem_bytes": launch("groupSegmentSize"),
        }
    ).reset_index(drop=True)


def _copies(ops, t, op_type, api_of, rank) -> pd.DataFrame:
    if ops.empty:
        return pd.DataFrame(columns=["rank", "device_id", "start_ns", "end_ns", "dur_ns"])
    corr = api_of[ops.index]
    ca = t["rocpd_copyapi"]
    if ca is not None and "api_ptr_id" in ca.columns:
        ca = ca.assign(api_ptr_id=to_int(ca["api_ptr_id"]))
    start, end = _col(ops, "start"), _col(ops, "end")
    return pd.DataFrame(
        {
            "rank": rank,
            "device_id": _col(ops, "gpuId"),
            "stream_id": _col(ops, "queueId"),
            "correlation_id": corr,
            "start_ns": start,
            "end_ns": end,
            "dur_ns": end - start,
            "op": "memcpy",
            "kind": [_COPY_KINDS.get(k, "unknown") for k in op_type[ops.index].tolist()],
            "bytes": to_int(pd.Series(_by_key(ca, "api_ptr_id", "size", corr), index=ops.index, dtype="object")),
        }
    ).reset_index(drop=True)


def _api_frames(api, autograd, strings, rank, notes):
    """(runtime, nvtx, cpu_ops) from the api rows."""
    if api is None or api.empty or not {"start", "end", "apiName_id"} <= set(api.columns):
        return None, None, None
    start, end = _col(api, "start"), _col(api, "end")
    ok = (start.notna() & end.notna() & (end >= start)).to_numpy(dtype=bool)
    name = pd.Series(_text(api["apiName_id"], strings), index=api.index, dtype="object")
    args = pd.Series(_text(api["args_id"], strings) if "args_id" in api.columns else [None] * len(api), index=api.index, dtype="object")
    ids = _col(api, "id")
    base = pd.DataFrame({"rank": rank, "thread_id": _col(api, "tid"), "start_ns": start, "end_ns": end, "dur_ns": end - start})
    text = name.fillna("").astype(str)
    is_api = text.str.match(_RUNTIME).to_numpy(dtype=bool) & ok
    is_marker = (text == _MARKER).to_numpy(dtype=bool) & ok
    op_name = pd.Series([None] * len(api), index=api.index, dtype="object")
    sizes = op_name.copy()
    if autograd is not None and "api_ptr_id" in autograd.columns and len(autograd):
        auto = autograd.assign(api_ptr_id=to_int(autograd["api_ptr_id"]))
        if "autogradName_id" in auto.columns:
            op_name = pd.Series(_text(pd.Series(_by_key(auto, "api_ptr_id", "autogradName_id", ids)), strings), index=api.index, dtype="object")
        if "sizes" in auto.columns:
            sizes = pd.Series(_by_key(auto, "api_ptr_id", "sizes", ids), index=api.index, dtype="object")
        is_op = is_marker & pd.Series(_by_key(auto.assign(hit=True), "api_ptr_id", "hit", ids)).fillna(False).to_numpy(dtype=bool)
    else:
        is_op = np.zeros(len(api), dtype=bool)
    runtime = base[is_api].assign(correlation_id=ids[is_api], name=name[is_api]).reset_index(drop=True)
    nv = is_marker & ~is_op
    nvtx = base[nv].assign(text=args[nv], domain="roctx").reset_index(drop=True)
    # autograd sizes are written as the shapes list text ("[[4096, 4096], []]") or left empty
    dims = sizes[is_op].map(lambda s: s if isinstance(s, str) and s.startswith("[") else None)
    cpu_ops = base[is_op].assign(name=op_name[is_op].where(op_name[is_op].notna(), args[is_op]), input_dims=dims).reset_index(drop=True)
    skipped = int((ok & ~is_api & ~is_marker).sum())
    if skipped:
        notes.append(f"{skipped} RPD api row(s) that are neither HIP/HSA calls nor user markers (the tracer's own) were left out")
    return runtime, nvtx, cpu_ops
