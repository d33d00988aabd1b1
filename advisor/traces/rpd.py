"""rocmProfileData (RPD) SQLite traces (`runTracer.sh`, `rpd_tracer`, vLLM's ROCm profiling).

Schema (ROCm/rocmProfileData, as rpd_tracer creates it; schema_version 2): plain tables
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
- one file is one rank: rows of several processes (pid) are read together, told apart
  by thread id only.
- devices: RPD records no GPU model, CU count or architecture: each gpuId becomes an AMD
  device with unknown limits (`--sm-count` fills the CU count), said in a note.

The file is opened read-only (advisor.traces._sqlite); table and column names in SQL come
from our own lists, intersected with what the file has.
"""

from __future__ import annotations

import re
import sqlite3
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import TraceError
from ..model import Trace
from . import _sqlite
from ._amd import gpu_frame, readonly_db, workgroups
from ._jsonio import to_int
from ._names import short_names, strip_kd

FORMAT = "rpd"
DESCRIPTION = "rocmProfileData RPD SQLite trace (rpd_tracer / runTracer.sh: rocpd_op, rocpd_api)"

_NEEDED = ("rocpd_op", "rocpd_api", "rocpd_string")
# Integer columns we read, per table (intersected with what the table has).
_COLUMNS = {
    "rocpd_op": ("id", "gpuId", "queueId", "start", "end", "description_id", "opType_id"),
    "rocpd_api": ("id", "tid", "start", "end", "apiName_id", "args_id"),
    "rocpd_api_ops": ("api_id", "op_id"),
    "rocpd_kernelapi": (
        "api_ptr_id", "gridX", "gridY", "gridZ", "workgroupX", "workgroupY", "workgroupZ",
        "groupSegmentSize", "kernelName_id",
    ),
    "rocpd_copyapi": ("api_ptr_id", "size"),
    "ext_autogradapi": ("api_ptr_id", "autogradName_id"),
}
# Launch calls whose grid arguments are work-item totals (HSA-style globalWorkSize).
_WORK_ITEM_GRIDS = ("hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel")
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
    with readonly_db(path) as conn:
        return _is_rpd(_sqlite.tables(conn))


def read(path: Path, *, rank: int, cache_dir: Path | None = None) -> Trace:
    with readonly_db(path, "corrupt or unreadable RPD database") as conn:
        return _Reader(conn, partial(_sqlite.open_readonly, path), path).read(rank)


# ---------------------------------------------------------------------------------------------


def _col(df: pd.DataFrame, name: str) -> pd.Series:
    if name in df.columns:
        return df[name]
    return pd.Series(pd.NA, index=df.index, dtype="Int64")


def _by_key(df: pd.DataFrame | None, key: str, value: str, refs: pd.Series) -> pd.Series:
    """df[value] of the row whose df[key] is each ref (the first such row; NA where none), as
    a Series on refs' index."""
    if df is None or key not in df.columns or value not in df.columns or df.empty:
        return pd.Series(pd.NA, index=refs.index, dtype="Int64" if df is None or value not in df.columns else df[value].dtype)
    table = df.dropna(subset=[key]).drop_duplicates(key)
    keys = pd.Index(table[key].astype("int64"))
    codes = keys.get_indexer(refs.fillna(-1).astype("int64").to_numpy()) if len(refs) else np.empty(0, dtype=np.int64)
    codes = np.where(refs.isna().to_numpy(), -1, codes)
    values = table[value].reset_index(drop=True)
    out = values.reindex(codes)  # code -1 (no row) gives NA
    out.index = refs.index
    return out


class _Reader:
    def __init__(self, conn: sqlite3.Connection, connect, path: Path):
        self.conn, self.connect, self.path = conn, connect, path
        self.names = _sqlite.tables(conn)
        self.notes: list[str] = []

    def ints(self, table: str) -> pd.DataFrame | None:
        """The integer columns of `table` we know (those it has), as Int64 columns."""
        if table not in self.names:
            return None
        have = set(_sqlite.columns(self.conn, table))
        cols = [c for c in _COLUMNS[table] if c in have]
        if not cols:
            return None
        return _sqlite.read_int_columns(self.connect, table, cols)

    def text(self, ids: pd.Series) -> pd.Series:
        """rocpd_string's text for each id (None where the id is NA or names no string)."""
        strings = _sqlite.lookup_strings(self.conn, "rocpd_string", ids, key="id", value="string")
        return pd.Series(_sqlite.map_ids(ids, strings), index=ids.index, dtype="object")

    def read(self, rank: int) -> Trace:
        if not _is_rpd(self.names):
            raise TraceError(f"{self.path.name}: SQLite file without rocmProfileData tables (not an RPD trace)")
        if not {"id", "string"} <= set(_sqlite.columns(self.conn, "rocpd_string")):
            raise TraceError(f"{self.path.name}: RPD rocpd_string table lacks id/string columns (unsupported RPD schema)")
        ops = self.ints("rocpd_op")
        if ops is None or not {"start", "end", "opType_id"} <= set(ops.columns):
            raise TraceError(f"{self.path.name}: RPD rocpd_op table lacks start/end/opType_id columns (unsupported RPD schema)")
        notes = self.notes
        # The call that enqueued each op (the lowest api id where an op has several links).
        links = self.ints("rocpd_api_ops")
        if links is not None and {"api_id", "op_id"} <= set(links.columns) and len(links):
            first = links.dropna().groupby("op_id")["api_id"].min()
            api_of = _col(ops, "id").map(first).astype("Int64")
        else:
            api_of = pd.Series(pd.NA, index=ops.index, dtype="Int64")
        api = self.ints("rocpd_api")
        api_name = self.text(_col(api, "apiName_id")) if api is not None else None

        op_type = self.text(ops["opType_id"]).fillna("")
        desc = self.text(_col(ops, "description_id"))
        start, end = ops["start"], ops["end"]
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

        call_name = pd.Series(dtype="object") if api is None else _by_key(
            pd.DataFrame({"id": _col(api, "id"), "name": api_name}), "id", "name", api_of)
        kernels = self.kernels(ops[is_kernel & timed], desc, api_of, call_name, rank)
        memcpy = self.copies(ops[is_copy & timed], op_type, api_of, rank)
        runtime, nvtx, cpu_ops = self.api_frames(api, api_name, rank) if api is not None else (None, None, None)
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

    def kernels(self, ops, desc, api_of, call_name, rank) -> pd.DataFrame:
        if ops.empty:
            return pd.DataFrame(columns=["rank", "device_id", "start_ns", "end_ns", "dur_ns"])
        corr = api_of[ops.index]
        ka = self.ints("rocpd_kernelapi")

        def launch(col: str) -> pd.Series:
            return _by_key(ka, "api_ptr_id", col, corr).astype("Int64")

        own = desc[ops.index]
        name = own.where(own.fillna("").astype(str).str.len() > 0, self.text(launch("kernelName_id")))
        name = pd.Series(_strip_all(name.to_numpy(dtype=object)), index=ops.index, dtype="object")
        missing = int(name.isna().sum())
        if missing:
            self.notes.append(f"{missing} RPD kernel op(s) have no name (string id missing from rocpd_string)")
        wg = [launch(f"workgroup{a}") for a in "XYZ"]
        raw = [launch(f"grid{a}") for a in "XYZ"]
        items = call_name[ops.index].isin(_WORK_ITEM_GRIDS).to_numpy(dtype=bool)
        grid = [g.where(~items, workgroups(g, w)) for g, w in zip(raw, wg)]
        return gpu_frame(
            rank, _col(ops, "gpuId"), _col(ops, "queueId"), corr, ops["start"], ops["end"], grid=grid, block=wg,
            name=name, short_name=short_names(name.tolist()), dynamic_smem_bytes=launch("groupSegmentSize"),
        ).reset_index(drop=True)

    def copies(self, ops, op_type, api_of, rank) -> pd.DataFrame:
        if ops.empty:
            return pd.DataFrame(columns=["rank", "device_id", "start_ns", "end_ns", "dur_ns"])
        corr = api_of[ops.index]
        return gpu_frame(
            rank, _col(ops, "gpuId"), _col(ops, "queueId"), corr, ops["start"], ops["end"],
            op="memcpy",
            kind=op_type[ops.index].map(lambda k: _COPY_KINDS.get(k, "unknown")),
            bytes=_by_key(self.ints("rocpd_copyapi"), "api_ptr_id", "size", corr),
        ).reset_index(drop=True)

    def api_frames(self, api, name, rank):
        """(runtime, nvtx, cpu_ops) from the api rows."""
        if api.empty or not {"start", "end"} <= set(api.columns):
            return None, None, None
        start, end = api["start"], api["end"]
        ok = (start.notna() & end.notna() & (end >= start)).to_numpy(dtype=bool)
        ids = _col(api, "id")
        base = pd.DataFrame({"rank": rank, "thread_id": _col(api, "tid"), "start_ns": start, "end_ns": end, "dur_ns": end - start})
        label = name.fillna("").astype(str)
        is_api = label.str.match(_RUNTIME).to_numpy(dtype=bool) & ok
        is_marker = (label == _MARKER).to_numpy(dtype=bool) & ok
        # a marker's text is its args string; only markers need it (hip args are mostly empty)
        args = pd.Series(None, index=api.index, dtype="object")
        if "args_id" in api.columns and is_marker.any():
            args[is_marker] = self.text(api["args_id"][is_marker])
        auto = self.ints("ext_autogradapi")
        if auto is not None and "api_ptr_id" in auto.columns and len(auto):
            is_op = is_marker & ids.isin(auto["api_ptr_id"].dropna()).to_numpy(dtype=bool)
        else:
            is_op = np.zeros(len(api), dtype=bool)
        runtime = base[is_api].assign(correlation_id=ids[is_api], name=name[is_api]).reset_index(drop=True)
        nv = is_marker & ~is_op
        nvtx = base[nv].assign(text=args[nv], domain="roctx").reset_index(drop=True)
        cpu_ops = None
        if is_op.any():
            op_ids = ids[is_op]
            op_name = self.text(_by_key(auto, "api_ptr_id", "autogradName_id", op_ids)) if "autogradName_id" in auto.columns else args[is_op]
            cpu_ops = base[is_op].assign(name=op_name.where(op_name.notna(), args[is_op]), input_dims=self.sizes(op_ids))
            cpu_ops = cpu_ops.reset_index(drop=True)
        skipped = int((ok & ~is_api & ~is_marker).sum())
        if skipped:
            self.notes.append(f"{skipped} RPD api row(s) that are neither HIP/HSA calls nor user markers (the tracer's own) were left out")
        return runtime, nvtx, cpu_ops

    def sizes(self, op_ids: pd.Series) -> pd.Series:
        """ext_autogradapi.sizes of each op: the shapes list text ("[[4096, 4096], []]"), or NA
        where the tracer left it empty (it does unless shapes were recorded)."""
        out = pd.Series(None, index=op_ids.index, dtype="object")
        if "sizes" not in set(_sqlite.columns(self.conn, "ext_autogradapi")):
            return out
        rows = _sqlite.fetchall(
            self.conn, 'SELECT "api_ptr_id", "sizes" FROM "ext_autogradapi" WHERE "sizes" LIKE \'[%\''
        )
        if rows:
            table = pd.DataFrame({"k": to_int([r[0] for r in rows]), "v": [_sqlite.text_value(r[1]) for r in rows]})
            out = _by_key(table, "k", "v", op_ids).astype("object")
            out = out.where(out.notna(), None)
        return out


def _strip_all(names: np.ndarray) -> list:
    """strip_kd of each name, once per distinct name; missing and empty names become None."""
    cache: dict[str, str] = {}
    out = []
    for n in names:
        if not isinstance(n, str) or not n:
            out.append(None)
            continue
        s = cache.get(n)
        if s is None:
            s = cache[n] = strip_kd(n)
        out.append(s)
    return out
