"""Nsight Systems SQLite exports (`nsys export --type sqlite`), schemas from 2021 to 2026.

What is read, and from where (every table and column is probed first; tables are created
lazily, so any of them may be missing, and columns came and went between versions):

- kernels: CUPTI_ACTIVITY_KIND_KERNEL. Names are ids into StringIds: `demangledName` (the
  full name, our `name`), `shortName` (our `short_name`) and `mangledName` (2022+; the name
  of last resort). Grid in blocks, block in threads, as CUPTI gives them.
- runtime: CUPTI_ACTIVITY_KIND_RUNTIME (`nameId`). nsys suffixes CUDA runtime names with
  the API version (`cudaLaunchKernel_v7000`); the suffix is dropped so names match other
  traces (driver names such as `cuGetProcAddress_v2` keep theirs: they are real API names).
- memcpy: CUPTI_ACTIVITY_KIND_MEMCPY (`copyKind`, named by ENUM_CUDA_MEMCPY_OPER when the
  export has it, else by CUPTI's documented values) and CUPTI_ACTIVITY_KIND_MEMSET.
- nvtx: NVTX_EVENTS push/pop and start/end ranges and marks (`eventType` ids from
  ENUM_NSYS_EVENT_TYPE when present, else the documented 59, 60 and 34). `text` is NULL
  when the string was registered, and then `textId` points into StringIds. Domains are
  named by their NvtxDomainCreate (75) event; the default domain (id 0) has no name (NA).
- devices: TARGET_INFO_GPU (name, SMs, compute capability, per-SM limits), else early-2021
  TARGET_INFO_CUDA_GPU; SM counts missing there come from TARGET_INFO_CUDA_DEVICE or the
  non-green rows of TARGET_INFO_CUDA_CONTEXT_INFO (`numMultiprocessors`). Kernel
  `deviceId` is TARGET_INFO_GPU.id (the join nsys's own reports use; `cuDevice` is only
  taken when it, not `id`, matches the device ids the activity tables use). nsys stores 0
  for values it did not know; those become NA. Only devices that ran GPU work are kept
  (an 8-GPU node with one busy GPU lists one device), unless none did.
- CUDA graphs: under `--cuda-graph-trace=node` their kernels are ordinary kernel rows
  (`graphNodeId` set). Under the default `graph` mode nsys records each replay as one row
  of CUPTI_ACTIVITY_KIND_GRAPH_TRACE and lists none of its kernels; such a replay becomes
  one kernels row named "CUDA graph <graphId> (whole replay)", with no grid or block, so the
  GPU's busy time stays right, and a note says how to get the kernels.
- threads: globalTid packs the thread id in its low 24 bits (the pid above them); kernels
  and copies carry the pid as `globalPid`.
- processes: one capture may hold several (torchrun or mpirun under one nsys, a forked
  server's workers), whose correlation, stream and thread ids restart per process. Where
  each process ran its GPU work on GPUs of its own, each is read as a rank (in pid order,
  from `rank` on); where they shared a GPU they stay one rank, with those ids kept apart
  per process (process i's stream s becomes stream i * 1,000,000 + s). A note says which.

The file is opened read-only and never written (see `_sqlite`). Integer columns are read
in bulk (see `_sqlite.read_int_columns`) and ids are mapped to strings through pandas, so a
million kernels load in seconds. A capture without a kernel table reads as an empty
kernels frame plus a note saying why; `load_trace` turns that into NoKernelsError.
"""

from __future__ import annotations

import re
import sqlite3
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import closing
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import TraceError
from ..model import Trace, narrow_fitting, string_array
from . import _sqlite
from ._jsonio import to_int

FORMAT = "nsys-sqlite"
DESCRIPTION = "Nsight Systems SQLite export (nsys export --type sqlite)"

KERNEL = "CUPTI_ACTIVITY_KIND_KERNEL"
RUNTIME = "CUPTI_ACTIVITY_KIND_RUNTIME"
MEMCPY = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET = "CUPTI_ACTIVITY_KIND_MEMSET"
NVTX = "NVTX_EVENTS"
GRAPH_TRACE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
STRINGS = "StringIds"
GPU = "TARGET_INFO_GPU"
CUDA_GPU_2021 = "TARGET_INFO_CUDA_GPU"
CUDA_DEVICE = "TARGET_INFO_CUDA_DEVICE"
CONTEXT_INFO = "TARGET_INFO_CUDA_CONTEXT_INFO"
MEMCPY_ENUM = "ENUM_CUDA_MEMCPY_OPER"
EVENT_TYPE_ENUM = "ENUM_NSYS_EVENT_TYPE"
META_TABLES = ("META_DATA_EXPORT", "EXPORT_META_DATA")

# Tables whose presence marks a SQLite file as an nsys export.
NSYS_TABLE_PREFIXES = (
    "CUPTI_ACTIVITY_KIND_",
    "TARGET_INFO_",
    "NVTX_EVENTS",
    "ENUM_NSYS_",
    "META_DATA_EXPORT",
    "EXPORT_META_DATA",
)

# nsys column -> kernels frame column, integer columns only.
_KERNEL_INTS = {
    "start": "start_ns",
    "end": "end_ns",
    "deviceId": "device_id",
    "streamId": "stream_id",
    "correlationId": "correlation_id",
    "gridX": "grid_x",
    "gridY": "grid_y",
    "gridZ": "grid_z",
    "blockX": "block_x",
    "blockY": "block_y",
    "blockZ": "block_z",
    "registersPerThread": "registers_per_thread",
    "staticSharedMemory": "static_smem_bytes",
    "dynamicSharedMemory": "dynamic_smem_bytes",
    "graphNodeId": "graph_node_id",
}
_KERNEL_NAME_IDS = ("demangledName", "shortName", "mangledName")

_RUNTIME_INTS = {"start": "start_ns", "end": "end_ns", "correlationId": "correlation_id"}
# what every GPU activity row (copy, set, graph replay) has
_ACTIVITY_INTS = {
    "start": "start_ns",
    "end": "end_ns",
    "deviceId": "device_id",
    "streamId": "stream_id",
    "correlationId": "correlation_id",
}
_COPY_INTS = {**_ACTIVITY_INTS, "bytes": "bytes"}

# CUPTI's CUpti_ActivityMemcpyKind (cupti_activity.h) plus nsys's unified-memory kinds
# 11-13 (ENUM_CUDA_MEMCPY_OPER in 2023-2026 exports), folded onto the model's kinds: CUDA
# arrays live in device memory, so HtoA counts as HtoD, AtoA as DtoD, and so on.
_COPY_KIND_BY_NAME = {
    "UNKNOWN": "unknown",
    "HTOD": "HtoD",
    "DTOH": "DtoH",
    "HTOA": "HtoD",
    "ATOH": "DtoH",
    "ATOA": "DtoD",
    "ATOD": "DtoD",
    "DTOA": "DtoD",
    "DTOD": "DtoD",
    "HTOH": "HtoH",
    "PTOP": "PtoP",
    "UVM_HTOD": "HtoD",
    "UVM_DTOH": "DtoH",
    "UVM_DTOD": "DtoD",
}
_COPY_KIND_IDS = {
    0: "UNKNOWN", 1: "HTOD", 2: "DTOH", 3: "HTOA", 4: "ATOH", 5: "ATOA", 6: "ATOD",
    7: "DTOA", 8: "DTOD", 9: "HTOH", 10: "PTOP", 11: "UVM_HTOD", 12: "UVM_DTOH", 13: "UVM_DTOD",
}

# ENUM_NSYS_EVENT_TYPE names and their documented ids (used when the enum table is absent).
_NVTX_TYPES = {"NvtxMark": 34, "NvtxPushPopRange": 59, "NvtxStartEndRange": 60, "NvtxDomainCreate": 75}

# TARGET_INFO_GPU column -> devices frame column.
_GPU_COLS = {
    "name": "name",
    "smCount": "sm_count",
    "computeMajor": "cc_major",
    "computeMinor": "cc_minor",
    "threadsPerWarp": "warp_size",
    "maxWarpsPerSm": "max_warps_per_sm",
    "maxBlocksPerSm": "max_blocks_per_sm",
    "maxThreadsPerBlock": "max_threads_per_block",
    "maxRegistersPerSm": "regs_per_sm",
    "maxRegistersPerBlock": "max_regs_per_block",
    "maxShmemPerSm": "smem_per_sm_bytes",
    "maxShmemPerBlockOptin": "smem_per_block_optin_bytes",
    "l2CacheSize": "l2_bytes",
    "memoryBandwidth": "mem_bandwidth_bytes_per_s",
}
# Early-2021 TARGET_INFO_CUDA_GPU, joined on deviceId by nsys's reports of that time.
_CUDA_GPU_2021_COLS = {
    "name": "name",
    "numMultiprocessors": "sm_count",
    "computeCapabilityMajor": "cc_major",
    "computeCapabilityMinor": "cc_minor",
    "numThreadsPerWarp": "warp_size",
    "maxWarpsPerMultiprocessor": "max_warps_per_sm",
}

# The process of a row, an internal column dropped before the Trace is built.
_PID = "_pid"
# Where processes share a GPU their stream ids are offset by this much per process.
_STREAM_STRIDE = 1_000_000

_RUNTIME_WANTED = [*_RUNTIME_INTS, "globalTid", "nameId"]

# Source columns read as Int32 where every value fits (`_sqlite.read_int_columns`): the ids
# and launch values the model stores as Int32 anyway (model.NARROW, NARROW_IF_FIT) and the
# string ids only mapped to names; 4 bytes a value less at the read's peak. Code below must
# work with Int32 or Int64 (times, pids and graph ids stay Int64).
_NARROW_READ = frozenset({
    "deviceId", "streamId", "correlationId", "gridX", "gridY", "gridZ", "blockX", "blockY", "blockZ",
    "registersPerThread", "staticSharedMemory", "dynamicSharedMemory", *_KERNEL_NAME_IDS,
    "nameId", "eventType", "textId", "domainId",
})
_NVTX_WANTED = ["start", "end", "eventType", "globalTid", "textId", "domainId"]
_NVTX_WHERE = f"{_sqlite.ident('eventType')} IN (?, ?, ?)"

_RUNTIME_VERSION_SUFFIX = re.compile(r"_v\d{4,5}$")
_LAUNCH_NAMES = re.compile(r"^(?:cudaLaunch|cuLaunch|cudaGraphLaunch|cuGraphLaunch)")


def sniff(path: Path, head: bytes) -> bool:
    """SQLite with nsys tables (and no rocpd ones). A SQLite file whose schema cannot be
    read at all is accepted too, so that `read` can say what is wrong with it instead of
    "unknown format"."""
    if not _sqlite.is_sqlite(head):
        return False
    try:
        names = _sqlite.table_names(path)
    except TraceError:
        return True
    except OSError:
        return False
    return is_nsys_schema(names)


def is_nsys_schema(names: set[str]) -> bool:
    """True for the table names of an nsys export (and not of a rocpd database)."""
    if any(n.startswith("rocpd_") for n in names):
        return False
    return any(n.startswith(NSYS_TABLE_PREFIXES) for n in names)


def read(path: Path, *, rank: int = 0, cache_dir: Path | None = None) -> Trace:
    """The Trace held by the nsys SQLite export at `path` (`cache_dir` is unused)."""
    path = Path(path)
    conn = _sqlite.open_readonly(path)
    try:
        with closing(conn):
            return _Reader(path, conn, rank).read()
    except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:  # the latter: an undecodable error message
        raise _sqlite.db_error(path, exc) from None


def _thread_ids(global_tid: pd.Series) -> pd.Series:
    """Thread ids: the low 24 bits of nsys's globalTid (the pid sits in the 24 above)."""
    mask = global_tid.isna().to_numpy()
    values = global_tid.fillna(0).to_numpy(dtype=np.int64) & 0xFFFFFF
    return pd.Series(pd.arrays.IntegerArray(values, mask), index=global_tid.index)


def _same_text(value: str, n: int) -> pd.arrays.StringArray:
    """A string column holding one str object n times (8 bytes a row)."""
    return string_array(np.full(n, value, dtype=object))


def _na_if_zero(s: pd.Series) -> pd.Series:
    return s.mask(s == 0)


def _pids(global_id: pd.Series) -> pd.Series:
    """The process part of nsys's globalTid / globalPid (everything above the 24 thread bits);
    0 (what hand-made or partial exports hold) is unknown."""
    pid = pd.Series(global_id, dtype="Int64") // (1 << 24)
    return pid.mask(pid == 0)


class _Reader:
    def __init__(self, path: Path, conn: sqlite3.Connection, rank: int):
        self.path = path
        self.conn = conn
        self.rank = rank
        self.tables = _sqlite.tables(conn)
        self.notes: list[str] = []
        self.kernel_rows = 0  # rows in the kernel table, before dropping invalid ones
        self._columns: dict[str, list[str]] = {}
        self.connect = partial(_sqlite.open_readonly, path)
        self._pending: dict[tuple, Future] = {}

    # -- helpers --------------------------------------------------------------------------
    def columns(self, table: str) -> list[str]:
        if table not in self._columns:
            self._columns[table] = _sqlite.columns(self.conn, table) if table in self.tables else []
        return self._columns[table]

    def strings(self, *id_series: pd.Series) -> pd.Series:
        if STRINGS not in self.tables or not {"id", "value"} <= set(self.columns(STRINGS)):
            return pd.Series([], dtype="object", index=pd.Index([], dtype="int64"))
        ids = pd.concat([s.dropna() for s in id_series]) if id_series else pd.Series([], dtype="Int64")
        return _sqlite.lookup_strings(self.conn, STRINGS, ids)

    def ints(self, table: str, wanted, *, where: str = "", params=(), rowid: bool = False) -> pd.DataFrame:
        pending = self._pending.pop((table, tuple(wanted), where, tuple(params), rowid), None)
        if pending is not None:
            return pending.result()
        have = set(self.columns(table))
        cols = [c for c in wanted if c in have]
        return _sqlite.read_int_columns(self.connect, table, cols, where=where, params=params, rowid=rowid,
                                        narrow=_NARROW_READ)

    def prefetch(self, pool: ThreadPoolExecutor, table: str, wanted, *, where: str = "", params=(), rowid: bool = False) -> None:
        """Start reading what a later `ints(...)` with the same arguments will ask for, on
        `pool`: SQLite works (GIL released, own connections) while this thread turns the
        kernel table into a frame, which kept the second core idle before."""
        have = set(self.columns(table))
        cols = [c for c in wanted if c in have]
        key = (table, tuple(wanted), where, tuple(params), rowid)
        self._pending[key] = pool.submit(
            _sqlite.read_int_columns, self.connect, table, cols, where=where, params=params, rowid=rowid,
            narrow=_NARROW_READ,
        )

    def small_rows(self, table: str, wanted, text=("name",)) -> pd.DataFrame:
        """A small table (device info, enums) read whole, whitelisted columns only: `text`
        columns as str (or None), every other column as Int64 (cells that are not whole
        numbers become <NA>, whatever a corrupt file holds)."""
        have = set(self.columns(table))
        cols = [c for c in wanted if c in have]
        if not cols:
            return pd.DataFrame()
        sql = f"SELECT {', '.join(_sqlite.ident(c) for c in cols)} FROM {_sqlite.ident(table)}"
        df = pd.DataFrame.from_records(_sqlite.fetchall(self.conn, sql), columns=cols)
        for c in cols:
            if c in text:
                df[c] = pd.Series([_sqlite.text_value(v) for v in df[c]], index=df.index, dtype="object")
            else:
                df[c] = to_int(df[c].astype("object"))
        return df

    def _drop_bad_times(self, df: pd.DataFrame, what: str) -> pd.DataFrame:
        bad = df["start_ns"].isna() | df["end_ns"].isna() | (df["end_ns"] < df["start_ns"]).fillna(False)
        if bad.any():
            self.notes.append(f"{int(bad.sum())} {what} without a valid start/end time were left out")
            df = df[~bad]
        return df

    # -- frames ---------------------------------------------------------------------------
    def read(self) -> Trace:
        if not is_nsys_schema(self.tables):
            raise TraceError(f"{self.path.name}: SQLite file is not an Nsight Systems export (no nsys tables)")
        with ThreadPoolExecutor(1) as pool:
            if RUNTIME in self.tables and {"start", "end"} <= set(self.columns(RUNTIME)):
                self.prefetch(pool, RUNTIME, _RUNTIME_WANTED)
            if {"start", "eventType"} <= set(self.columns(NVTX)):
                kinds = self._nvtx_kinds()
                self.prefetch(pool, NVTX, _NVTX_WANTED, where=_NVTX_WHERE, params=kinds, rowid=True)
            try:
                kernels = self.with_graph_replays(self.kernels())
                runtime = self.runtime()
                memcpy = self.memcpy()
                nvtx = self.nvtx()
            finally:
                for f in self._pending.values():
                    f.cancel()
                self._pending.clear()
        if kernels is None or kernels.empty:
            self.notes.insert(0, self._why_no_kernels(kernels, runtime))
        used = set()
        for df in (kernels, memcpy):
            if df is not None and len(df):
                used.update(int(d) for d in df["device_id"].dropna().unique())
        devices = self.devices(used)
        frames = {"kernels": kernels, "runtime": runtime, "memcpy": memcpy, "nvtx": nvtx, "devices": devices}
        # int32 where it fits, as `narrow` would store it (8 bytes a row of every frame before)
        rank_dtype = np.int32 if -(2**31) <= self.rank < 2**31 else np.int64
        for name, df in frames.items():
            if df is not None:  # the device table keeps int64 (narrow leaves it)
                df["rank"] = np.full(len(df), self.rank, dtype=np.int64 if name == "devices" else rank_dtype)
        self.split_processes(frames)
        meta = {"format": FORMAT, "sources": [self.path.name], "notes": self.notes, **self.meta()}
        return Trace.build(meta=meta, **frames)

    def split_processes(self, frames: dict[str, pd.DataFrame | None]) -> None:
        """Rows of several processes (see the module docstring): one rank per process where
        each ran on GPUs of its own, else ids kept apart per process. Drops the pid column."""
        acts = [frames[n] for n in ("kernels", "memcpy") if frames[n] is not None and _PID in frames[n]]
        gpu_rows = pd.concat([df[[_PID, "device_id"]] for df in acts], ignore_index=True) if acts else None
        gpu_pids = sorted(int(p) for p in gpu_rows[_PID].dropna().unique()) if gpu_rows is not None else []
        if len(gpu_pids) > 1:
            devs = {p: set(gpu_rows.loc[gpu_rows[_PID] == p, "device_id"].dropna().astype(int)) for p in gpu_pids}
            owned = all(devs.values()) and sum(len(d) for d in devs.values()) == len(set().union(*devs.values()))
            if owned:
                self._ranks_per_process(frames, gpu_pids, devs)
            else:
                self._ids_per_process(frames, gpu_pids)
        for name, df in frames.items():
            if df is not None and _PID in df:
                frames[name] = df.drop(columns=_PID)

    def _ranks_per_process(self, frames, gpu_pids: list[int], devs: dict[int, set[int]]) -> None:
        rank_of = {p: self.rank + i for i, p in enumerate(gpu_pids)}
        dropped = 0
        for name in ("kernels", "memcpy", "runtime", "nvtx"):
            df = frames[name]
            if df is None or _PID not in df:
                continue
            # rows of an unknown process stay on the first rank; those of a process without
            # GPU work (a launcher, a tokenizer worker) have no rank to go to
            pid = df[_PID]
            keep = pid.isna() | pid.isin(rank_of)
            dropped += int((~keep).sum())
            df = df[keep.to_numpy()].copy()
            df["rank"] = df[_PID].map(rank_of).fillna(self.rank).astype("int64")
            frames[name] = df.reset_index(drop=True)
        dev = frames["devices"]
        if dev is not None:
            parts = []
            for p in gpu_pids:
                own = dev[dev["device_id"].isin(devs[p])].copy()
                own["rank"] = rank_of[p]
                parts.append(own)
            frames["devices"] = pd.concat(parts, ignore_index=True)
        note = (f"{len(gpu_pids)} processes ran GPU work in this capture, each on GPUs of its own: read as "
                f"ranks {self.rank}-{self.rank + len(gpu_pids) - 1} in pid order")
        if dropped:
            note += f" ({dropped} API calls and NVTX events of processes without GPU work were left out)"
        self.notes.append(note)

    def _ids_per_process(self, frames, gpu_pids: list[int]) -> None:
        others = set()
        for name in ("runtime", "nvtx"):
            df = frames[name]
            if df is not None and _PID in df:
                others.update(int(p) for p in df[_PID].dropna().unique())
        index = {p: i for i, p in enumerate([*gpu_pids, *sorted(others - set(gpu_pids))])}
        for name in ("kernels", "memcpy", "runtime", "nvtx"):
            df = frames[name]
            if df is None or _PID not in df:
                continue
            i = df[_PID].map(index).astype("Int64").fillna(0)
            if "correlation_id" in df:
                df["correlation_id"] = i * (1 << 32) + df["correlation_id"]
            if "stream_id" in df:
                df["stream_id"] = i * _STREAM_STRIDE + df["stream_id"]
            if "thread_id" in df:
                df["thread_id"] = i * (1 << 24) + df["thread_id"]
        self.notes.append(
            f"{len(gpu_pids)} processes ran GPU work on the same GPU in this capture: read as one rank, their "
            f"kernels time-sharing the device; process i's stream s is shown as stream i x {_STREAM_STRIDE:,} + s"
        )

    def with_graph_replays(self, kernels: pd.DataFrame | None) -> pd.DataFrame | None:
        """`kernels` plus one row per CUDA graph replay that nsys recorded whole (default
        `--cuda-graph-trace=graph`: its kernels are not in the kernel table)."""
        if GRAPH_TRACE not in self.tables or not {"start", "end"} <= set(self.columns(GRAPH_TRACE)):
            return kernels
        raw = self.ints(GRAPH_TRACE, [*_ACTIVITY_INTS, "graphId", "globalPid"])
        if raw.empty:
            return kernels
        df = pd.DataFrame({dst: raw[src] for src, dst in _ACTIVITY_INTS.items() if src in raw})
        graph = raw["graphId"] if "graphId" in raw else pd.Series(pd.NA, index=raw.index, dtype="Int64")
        df["name"] = string_array(np.array([f"CUDA graph {'?' if pd.isna(g) else int(g)} (whole replay)" for g in graph],
                                           dtype=object))
        if "globalPid" in raw:
            df[_PID] = _pids(raw["globalPid"])
        df = self._drop_bad_times(df, "CUDA graph replays")
        df["dur_ns"] = df["end_ns"] - df["start_ns"]
        if df.empty:
            return kernels
        self.notes.append(
            f"{len(df)} CUDA graph replays were recorded whole (nsys --cuda-graph-trace=graph, its default): "
            "each counts as one interval of GPU work named after its graph, and the kernels inside are not "
            "listed, so no kernel finding can see them; profile again with --cuda-graph-trace=node for those"
        )
        if kernels is None or kernels.empty:
            return df.reset_index(drop=True)
        return pd.concat([kernels, df], ignore_index=True)

    def _why_no_kernels(self, kernels: pd.DataFrame | None, runtime: pd.DataFrame | None) -> str:
        launches = 0
        if runtime is not None and len(runtime):
            launches = int(runtime["name"].astype("string").str.contains(_LAUNCH_NAMES, na=False).sum())
        if kernels is None:
            where = f"the export has no {KERNEL} table"
        elif self.kernel_rows:
            where = f"none of the {self.kernel_rows} rows of the export's {KERNEL} table has a valid start/end time"
        else:
            where = f"the export's {KERNEL} table is empty"
        if launches:
            return (
                f"{where} although the CPU side made {launches} kernel launch calls: nsys did not "
                "record GPU activity (GPU tracing unsupported there, e.g. WSL or an old driver, or the "
                "program exited before the activity buffers were flushed)"
            )
        return f"{where}: the capture holds no CUDA kernels (profile with `nsys profile -t cuda`)"

    def kernels(self) -> pd.DataFrame | None:
        if KERNEL not in self.tables:
            return None
        cols = self.columns(KERNEL)
        if "start" not in cols or "end" not in cols:
            raise TraceError(f"{self.path.name}: {KERNEL} has no start/end columns (unknown nsys schema)")
        name_cols = [c for c in _KERNEL_NAME_IDS if c in cols]
        if {"demangledName", "shortName"} <= set(name_cols):
            name_cols = ["demangledName", "shortName"]  # mangled names are then never needed
        raw = self.ints(KERNEL, [*_KERNEL_INTS, *name_cols, "globalPid"])
        self.kernel_rows = len(raw)
        df = pd.DataFrame({dst: raw[src] for src, dst in _KERNEL_INTS.items() if src in raw}, copy=False)
        if "globalPid" in raw:
            df[_PID] = _pids(raw["globalPid"])
        # Names coalesced as codes into one table of the distinct strings, and built as the
        # model's string arrays directly: object columns assigned to a frame became pandas 3
        # Arrow strings (a copy of every name's bytes), then a new str per row in conform.
        strings = self.strings(*(raw[c] for c in name_cols))
        table = _sqlite.string_table(strings, pd.NA)
        code = np.full(len(raw), -1, dtype=np.intp)
        for c in name_cols:  # demangled first, then short, then mangled
            codes = _sqlite.id_codes(raw[c], strings)
            unset = code < 0
            code[unset] = codes[unset]
            if c == "shortName":
                df["short_name"] = string_array(table[codes])
            del codes, unset
        df["name"] = string_array(table[code])
        del code
        if len(df) and df["name"].isna().all():
            self.notes.append(f"kernel names not found ({STRINGS} or the name columns are missing)")
        df = self._drop_bad_times(df, "kernels")
        df["dur_ns"] = df["end_ns"] - df["start_ns"]
        # products in Int64 (the dimensions may come as Int32: _NARROW_READ)
        if {"grid_x", "grid_y", "grid_z"} <= set(df.columns):
            df["grid_blocks"] = df["grid_x"].astype("Int64") * df["grid_y"] * df["grid_z"]
        if {"block_x", "block_y", "block_z"} <= set(df.columns):
            df["block_threads"] = df["block_x"].astype("Int64") * df["block_y"] * df["block_z"]
        narrow_fitting(df, "kernels")
        return df

    def runtime(self) -> pd.DataFrame | None:
        if RUNTIME not in self.tables or not {"start", "end"} <= set(self.columns(RUNTIME)):
            return None
        raw = self.ints(RUNTIME, _RUNTIME_WANTED)
        df = pd.DataFrame({dst: raw[src] for src, dst in _RUNTIME_INTS.items() if src in raw}, copy=False)
        if "globalTid" in raw:
            df["thread_id"] = _thread_ids(raw["globalTid"])
            df[_PID] = _pids(raw["globalTid"])
        if "nameId" in raw:
            strings = self.strings(raw["nameId"])
            strings = strings.str.replace(_RUNTIME_VERSION_SUFFIX, "", regex=True) if len(strings) else strings
            df["name"] = string_array(_sqlite.map_ids(raw["nameId"], strings, pd.NA))
        df = self._drop_bad_times(df, "runtime API calls")
        df["dur_ns"] = df["end_ns"] - df["start_ns"]
        narrow_fitting(df, "runtime")
        return df

    def _copy_kind_names(self) -> dict[int, str]:
        enum = self.small_rows(MEMCPY_ENUM, ["id", "name"]) if MEMCPY_ENUM in self.tables else pd.DataFrame()
        if {"id", "name"} <= set(enum.columns) and len(enum):
            return {
                int(i): _COPY_KIND_BY_NAME.get(str(n).removeprefix("CUDA_MEMCPY_KIND_"), "unknown")
                for i, n in zip(enum["id"], enum["name"])
                if not pd.isna(i)
            }
        return {i: _COPY_KIND_BY_NAME[n] for i, n in _COPY_KIND_IDS.items()}

    def memcpy(self) -> pd.DataFrame | None:
        parts = []
        if MEMCPY in self.tables and {"start", "end"} <= set(self.columns(MEMCPY)):
            raw = self.ints(MEMCPY, [*_COPY_INTS, "copyKind", "globalPid"])
            df = pd.DataFrame({dst: raw[src] for src, dst in _COPY_INTS.items() if src in raw})
            if "globalPid" in raw:
                df[_PID] = _pids(raw["globalPid"])
            df["op"] = _same_text("memcpy", len(df))
            if "copyKind" in raw:
                kinds = self._copy_kind_names()
                by_id = pd.Series(list(kinds.values()), index=pd.Index(list(kinds), dtype="int64"), dtype="object")
                df["kind"] = string_array(_sqlite.map_ids(raw["copyKind"], by_id, "unknown"))
            else:
                df["kind"] = _same_text("unknown", len(df))
            parts.append(df)
        if MEMSET in self.tables and {"start", "end"} <= set(self.columns(MEMSET)):
            raw = self.ints(MEMSET, [*_COPY_INTS, "globalPid"])
            df = pd.DataFrame({dst: raw[src] for src, dst in _COPY_INTS.items() if src in raw})
            if "globalPid" in raw:
                df[_PID] = _pids(raw["globalPid"])
            df["op"] = _same_text("memset", len(df))
            df["kind"] = _same_text("memset", len(df))
            parts.append(df)
        if not parts:
            return None
        df = pd.concat(parts, ignore_index=True)
        df = self._drop_bad_times(df, "memcpy/memset operations")
        df["dur_ns"] = df["end_ns"] - df["start_ns"]
        return df.sort_values("start_ns", kind="stable").reset_index(drop=True)

    def _nvtx_kinds(self, types: dict[str, int] | None = None) -> list[int]:
        types = types or self._nvtx_type_ids()
        return [types["NvtxPushPopRange"], types["NvtxStartEndRange"], types["NvtxMark"]]

    def _nvtx_type_ids(self) -> dict[str, int]:
        ids = dict(_NVTX_TYPES)
        if EVENT_TYPE_ENUM in self.tables:
            enum = self.small_rows(EVENT_TYPE_ENUM, ["id", "name"])
            if {"id", "name"} <= set(enum.columns):
                for i, n in zip(enum["id"], enum["name"]):
                    if n in ids and not pd.isna(i):
                        ids[n] = int(i)
        return ids

    def nvtx(self) -> pd.DataFrame | None:
        cols = set(self.columns(NVTX))
        if not {"start", "eventType"} <= cols:
            return None
        types = self._nvtx_type_ids()
        kinds = self._nvtx_kinds(types)
        where = _NVTX_WHERE
        raw = self.ints(NVTX, _NVTX_WANTED, where=where, params=kinds, rowid=True)
        df = pd.DataFrame({"start_ns": raw["start"]}, copy=False)
        is_mark = (raw["eventType"] == types["NvtxMark"]).fillna(False).to_numpy()
        end = raw["end"] if "end" in raw else pd.Series(pd.NA, index=raw.index, dtype="Int64")
        end = end.mask(is_mark & end.isna().to_numpy(), raw["start"])
        df["end_ns"] = end
        open_ranges = int((df["end_ns"].isna() & df["start_ns"].notna()).sum())
        if open_ranges:
            self.notes.append(f"{open_ranges} NVTX ranges were still open when the capture ended and are left out")
            df = df[df["end_ns"].notna()]
            raw = raw.loc[df.index]
        if "globalTid" in raw:
            df["thread_id"] = _thread_ids(raw["globalTid"])
            df[_PID] = _pids(raw["globalTid"])
        text = pd.Series([None] * len(raw), index=raw.index, dtype="object")
        if "text" in cols:
            inline = _sqlite.read_text_column(self.conn, NVTX, "text", where=where, params=kinds)
            text = pd.Series(inline.reindex(raw["rowid"].astype("int64")).to_numpy(), index=raw.index, dtype="object")
        if "textId" in raw:
            strings = self.strings(raw["textId"][text.isna()])
            text = text.where(text.notna(), pd.Series(_sqlite.map_ids(raw["textId"], strings), index=raw.index))
        df["text"] = string_array(text.to_numpy(dtype=object, copy=True))
        del text
        if "domainId" in raw:
            domains = self._nvtx_domains(types["NvtxDomainCreate"])
            by_id = pd.Series(list(domains.values()), index=pd.Index(list(domains), dtype="int64"), dtype="object")
            df["domain"] = string_array(_sqlite.map_ids(raw["domainId"], by_id, pd.NA))
        df = self._drop_bad_times(df, "NVTX events")
        df["dur_ns"] = df["end_ns"] - df["start_ns"]
        narrow_fitting(df, "nvtx")
        return df.reset_index(drop=True)

    def _nvtx_domains(self, create_type: int) -> dict[int, str]:
        cols = [c for c in ("domainId", "text", "textId") if c in self.columns(NVTX)]
        if "domainId" not in cols:
            return {}
        sql = (
            f"SELECT {', '.join(_sqlite.ident(c) for c in cols)} FROM {_sqlite.ident(NVTX)} "
            f"WHERE {_sqlite.ident('eventType')} = ?"
        )
        rows = pd.DataFrame.from_records(_sqlite.fetchall(self.conn, sql, (create_type,)), columns=cols)
        if rows.empty:
            return {}
        if "text" in rows:
            names = pd.Series([_sqlite.text_value(v) for v in rows["text"]], index=rows.index, dtype="object")
        else:
            names = pd.Series([None] * len(rows), index=rows.index, dtype="object")
        if "textId" in rows:
            ids = to_int(rows["textId"].astype("object"))
            by_id = pd.Series(_sqlite.map_ids(ids, self.strings(ids)), index=rows.index)
            names = names.where(names.notna(), by_id)
        domain_ids = to_int(rows["domainId"].astype("object"))
        return {int(d): str(n) for d, n in zip(domain_ids, names) if not pd.isna(d) and n is not None}

    # -- devices --------------------------------------------------------------------------
    def devices(self, used: set[int]) -> pd.DataFrame | None:
        gpu = pd.DataFrame()
        key = None
        if GPU in self.tables:
            gpu = self.small_rows(GPU, ["id", "cuDevice", *_GPU_COLS])
            key = self._pick_key(gpu, ("id", "cuDevice"), used)
            gpu = gpu.rename(columns=_GPU_COLS)
        elif CUDA_GPU_2021 in self.tables:
            gpu = self.small_rows(CUDA_GPU_2021, ["deviceId", "id", *_CUDA_GPU_2021_COLS])
            key = self._pick_key(gpu, ("deviceId", "id"), used)
            gpu = gpu.rename(columns=_CUDA_GPU_2021_COLS)
        if key is not None:
            gpu = gpu[gpu[key].notna()].copy()
            gpu["device_id"] = gpu[key].astype("int64")
            gpu = gpu.drop_duplicates("device_id")
        else:
            gpu = pd.DataFrame({"device_id": pd.Series([], dtype="int64")})
        gpu = self._fill_sm_counts(gpu, key, used)
        if gpu.empty:
            self.notes.append(f"the export has no GPU description ({GPU} / {CUDA_DEVICE} missing)")
            return None
        if used & set(gpu["device_id"]):
            gpu = gpu[gpu["device_id"].isin(used)]
        gpu = gpu.copy()
        for col in set(_GPU_COLS.values()) - {"name", "cc_minor"}:  # a minor revision of 0 is real
            if col in gpu:
                gpu[col] = _na_if_zero(pd.to_numeric(gpu[col], errors="coerce"))
        if "name" in gpu:
            gpu["name"] = gpu["name"].where(gpu["name"].astype("string").str.strip().fillna("") != "", None)
        gpu["vendor"] = "nvidia"
        if {"cc_major", "cc_minor"} <= set(gpu.columns):
            known = gpu["cc_major"].notna()
            gpu["arch"] = None
            majors, minors = gpu.loc[known, "cc_major"], gpu.loc[known, "cc_minor"]
            gpu.loc[known, "arch"] = [f"{int(a)}.{0 if pd.isna(b) else int(b)}" for a, b in zip(majors, minors)]
        if "sm_count" in gpu:
            gpu["sm_count_source"] = np.where(gpu["sm_count"].notna(), "trace", None)
        return gpu.reset_index(drop=True)

    @staticmethod
    def _pick_key(df: pd.DataFrame, candidates: tuple[str, ...], used: set[int]) -> str | None:
        """Of the id columns `candidates` in `df`, the one holding most of the device ids the
        activity tables use (the first one on a tie, and when nothing ran)."""
        best, best_hits = None, -1
        for col in candidates:
            if col in df.columns:
                ids = set(pd.to_numeric(df[col], errors="coerce").dropna().astype("int64"))
                hits = len(used & ids)
                if hits > best_hits:
                    best, best_hits = col, hits
        return best

    def _fill_sm_counts(self, gpu: pd.DataFrame, key: str | None, used: set[int]) -> pd.DataFrame:
        """SM counts from TARGET_INFO_CUDA_DEVICE / CONTEXT_INFO where the GPU table has none
        (or where there is no GPU table at all)."""
        sources = []
        if CUDA_DEVICE in self.tables:
            dev = self.small_rows(CUDA_DEVICE, ["gpuId", "cudaId", "numMultiprocessors"])
            if "numMultiprocessors" in dev:
                # gpuId is TARGET_INFO_GPU.id and cudaId its cuDevice: follow the GPU table's key.
                order = ("cudaId", "gpuId") if key == "cuDevice" else ("gpuId", "cudaId")
                dev_key = self._pick_key(dev, order, used)
                if dev_key is not None:
                    sources.append(dev[[dev_key, "numMultiprocessors"]].set_axis(["device_id", "sms"], axis=1))
        if CONTEXT_INFO in self.tables:
            ctx = self.small_rows(CONTEXT_INFO, ["deviceId", "numMultiprocessors", "isGreenContext"])
            if {"deviceId", "numMultiprocessors"} <= set(ctx.columns):
                if "isGreenContext" in ctx:
                    ctx = ctx[ctx["isGreenContext"].fillna(0) == 0]  # green contexts own a subset of SMs
                sources.append(ctx[["deviceId", "numMultiprocessors"]].set_axis(["device_id", "sms"], axis=1))
        if not sources:
            return gpu
        extra = pd.concat(sources, ignore_index=True)
        extra["sms"] = _na_if_zero(pd.to_numeric(extra["sms"], errors="coerce"))
        extra = extra.dropna().astype("int64").drop_duplicates("device_id")
        if gpu.empty:
            return extra.rename(columns={"sms": "sm_count"})
        if "sm_count" not in gpu:
            gpu["sm_count"] = pd.NA
        fill = gpu["device_id"].map(dict(zip(extra["device_id"], extra["sms"])))
        gpu["sm_count"] = _na_if_zero(pd.to_numeric(gpu["sm_count"], errors="coerce")).fillna(fill)
        return gpu

    def meta(self) -> dict:
        for table in META_TABLES:
            if table in self.tables and {"name", "value"} <= set(self.columns(table)):
                rows = dict(self.conn.execute(
                    f"SELECT name, value FROM {_sqlite.ident(table)} WHERE name IN (?, ?)",
                    ("EXPORT_PRODUCT_VERSION", "EXPORT_SCHEMA_VERSION"),
                ).fetchall())
                return {
                    "nsys_version": rows.get("EXPORT_PRODUCT_VERSION"),
                    "export_schema_version": rows.get("EXPORT_SCHEMA_VERSION"),
                }
        return {}
