"""The one trace model every reader produces.

A `Trace` is a bag of pandas frames with fixed columns. Times are integer nanoseconds on the
source's own clock (`start_ns`, `end_ns`, `dur_ns`); grid is in blocks (AMD: workgroups) and
block in threads (AMD: work-items), whatever the source's convention. Optional numbers use
pandas' nullable dtypes so that "unknown" stays distinguishable from zero.

Readers build raw frames with whatever columns they have and pass them through `conform`,
which adds missing columns, orders them and casts them to the schema below.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

# dtype shorthands: nullable ints for optional numbers, plain int64 for required times.
_I = "Int64"
_F = "Float64"
# Text: pandas' NA-aware string dtype, always with Python storage. With pyarrow installed,
# pandas 3 would make "string" Arrow-backed, while the fast paths below and in
# symptoms/gemm.py build Python-backed StringArrays directly; frames mixing the two storages
# in one column failed to concatenate (pandas 3.0.6: AttributeError '_pa_array').
_S = pd.StringDtype("python")
STRING = _S


def string_array(values: np.ndarray) -> pd.arrays.StringArray:
    """A STRING array of an object ndarray holding str or pd.NA, built directly (validated in
    C; pd.array(..., STRING) is ~4x slower). pandas 3's StringArray(values) alone takes the
    default storage for its dtype (pyarrow, when installed) while its data stays Python."""
    try:
        return pd.arrays.StringArray(values, dtype=_S)
    except TypeError:  # pandas 2: no dtype argument, and Python storage by default
        return pd.arrays.StringArray(values)

SCHEMAS: dict[str, dict[str, str]] = {
    # One row per kernel execution.
    "kernels": {
        "rank": "int64",
        "device_id": _I,
        "stream_id": _I,
        "correlation_id": _I,
        "start_ns": "int64",
        "end_ns": "int64",
        "dur_ns": "int64",
        "name": _S,  # demangled (or source) name, untrusted text
        "short_name": _S,  # nsys shortName / Kineto name without arguments, when known
        "grid_x": _I,
        "grid_y": _I,
        "grid_z": _I,
        "block_x": _I,
        "block_y": _I,
        "block_z": _I,
        "grid_blocks": _I,  # grid_x * grid_y * grid_z
        "block_threads": _I,  # block_x * block_y * block_z
        "registers_per_thread": _I,  # AMD: arch VGPRs
        "static_smem_bytes": _I,  # AMD: LDS
        "dynamic_smem_bytes": _I,
        "graph_node_id": _I,  # launched from a CUDA graph when set
        # correlation id of the cudaGraphLaunch/hipGraphLaunch call that replayed the kernel
        # (advisor.traces.graphs); NA for a kernel launched on its own
        "graph_launch_id": _I,
        # Collectives (NCCL/RCCL kernels), when the trace records them (Kineto kernel args):
        "comm_name": _S,  # "allreduce", "all_gather", ... as the profiler names it
        "comm_in_nelems": _I,
        "comm_out_nelems": _I,
        "comm_dtype": _S,
        "comm_group_size": _I,
    },
    # Host-side runtime/driver API calls (cudaLaunchKernel, cudaMemcpy, cudaDeviceSynchronize...).
    "runtime": {
        "rank": "int64",
        "thread_id": _I,
        "correlation_id": _I,
        "start_ns": "int64",
        "end_ns": "int64",
        "dur_ns": "int64",
        "name": _S,
    },
    # Device-side copies and sets.
    "memcpy": {
        "rank": "int64",
        "device_id": _I,
        "stream_id": _I,
        "correlation_id": _I,
        "start_ns": "int64",
        "end_ns": "int64",
        "dur_ns": "int64",
        "op": _S,  # "memcpy" | "memset"
        "kind": _S,  # HtoD, DtoH, DtoD, HtoH, PtoP, memset, unknown
        "bytes": _I,
    },
    # NVTX push/pop and start/end ranges (marks have dur_ns 0).
    "nvtx": {
        "rank": "int64",
        "thread_id": _I,
        "start_ns": "int64",
        "end_ns": "int64",
        "dur_ns": "int64",
        "text": _S,
        "domain": _S,
    },
    # Framework operators on the CPU (Kineto cpu_op, rocprof roctx-less traces have none).
    "cpu_ops": {
        "rank": "int64",
        "thread_id": _I,
        "start_ns": "int64",
        "end_ns": "int64",
        "dur_ns": "int64",
        "name": _S,
        "input_dims": _S,  # JSON text of the shapes list, e.g. "[[4096, 4096], [4096, 4096]]"
        "input_types": _S,  # JSON text of the dtype list, e.g. '["c10::BFloat16", ...]'
        "input_strides": _S,  # JSON text of the strides list (Kineto, PyTorch >= 2.1), e.g. "[[4096, 1], []]"
        "concrete_inputs": _S,  # JSON text of the non-tensor arguments' values, e.g. '["", "[128, 128]", "False"]'
    },
    # One row per device seen, with the limits occupancy needs. Filled by the reader where the
    # trace has them and completed from advisor.devices' known-GPU table otherwise.
    "devices": {
        "rank": "int64",
        "device_id": "int64",
        "name": _S,
        "vendor": _S,  # "nvidia" | "amd" | "unknown"
        "arch": _S,  # "9.0" for NVIDIA compute capability, "gfx942" for AMD
        "cc_major": _I,
        "cc_minor": _I,
        "sm_count": _I,  # SMs (NVIDIA) or CUs (AMD)
        "sm_count_source": _S,  # "trace" | "known-gpu" | "user" | "unknown"
        "warp_size": _I,
        "max_warps_per_sm": _I,
        "max_blocks_per_sm": _I,
        "max_threads_per_block": _I,
        "regs_per_sm": _I,
        "max_regs_per_block": _I,
        "smem_per_sm_bytes": _I,
        "smem_per_block_optin_bytes": _I,
        "l2_bytes": _I,
        "mem_bandwidth_bytes_per_s": _F,
        "peak_tensor_tflops": _F,  # dense fp16/bf16 tensor-core rate, datasheet
    },
}

FRAMES = tuple(SCHEMAS)

# Columns `load_trace` stores as Int32 once it has made values no GPU can have unknown
# (advisor.traces: every value left is within 0..2**31-1): 5 bytes a value instead of 9,
# ~360 MB of a 10M-kernel trace, in the frames and in every copy the diagnosis makes.
# Readers and Trace.build still produce Int64; code must work with either. Products of them
# (grid_blocks, block_threads) are NARROW_IF_FIT.
NARROW: dict[str, dict[str, str]] = {
    "kernels": {
        c: "Int32"
        for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                  "registers_per_thread", "static_smem_bytes", "dynamic_smem_bytes")
    },
}


# Identifiers `narrow` stores as Int32 when every value of the column fits (nsys and most
# sources: device, stream and correlation ids are 32-bit; some thread ids are not): ~0.2 GB
# of a 10M-kernel trace's kernels and runtime. Code must work with Int32 or Int64.
NARROW_IF_FIT: dict[str, tuple[str, ...]] = {
    # grid_blocks and block_threads: products, Int64 from the readers; no code multiplies
    # them further (occupancy and waves work in float64)
    "kernels": ("device_id", "stream_id", "correlation_id", "grid_blocks", "block_threads"),
    "runtime": ("thread_id", "correlation_id"),
    "memcpy": ("device_id", "stream_id", "correlation_id"),
    "nvtx": ("thread_id",),
    "cpu_ops": ("thread_id",),
}


def _narrowable(frame: str) -> set[str]:
    return {*NARROW.get(frame, ()), *NARROW_IF_FIT.get(frame, ())}


def narrow_fitting(df: pd.DataFrame, frame: str) -> None:
    """A reader's early half of `narrow`: the `NARROW` and `NARROW_IF_FIT` columns of `df`
    (a raw `frame`) whose values all fit in int32 (all-NA ones left alone) cast in place, so
    that the frames are never held at full width (the read's peak: 10M kernels' Int64 columns
    before `narrow`, ~0.4 GB more). `conform` keeps them Int32; what `load_trace` masks or
    narrows afterwards comes out the same as from Int64."""
    for col in _narrowable(frame):
        if col not in df.columns:
            continue
        _int32_if_fit(df, col)


def _int32_if_fit(df: pd.DataFrame, col: str) -> None:
    """Cast the Int64 column `col` of `df` to Int32 in place where every value fits. All-NA
    columns are left as they are: their values were never written (see _missing)."""
    s = df[col]
    if not isinstance(s.dtype, pd.Int64Dtype) or not len(s):
        return
    lo, hi = s.min(), s.max()
    if lo is pd.NA or lo < -(2**31) or hi > 2**31 - 1:
        return
    df[col] = s.astype("Int32")


def constant_view(s: pd.Series) -> pd.Series:
    """`s`, or, where it holds one value in every row (no NA or NaN; a numpy or a nullable
    integer column), that value seen through a zero-stride read-only view: 0 bytes a row instead of
    4-9 (a file's rank, the one GPU of a single-GPU process). As with `_missing`'s text,
    pandas copies it before a write through `.loc` on a copy, every take, concat or copy
    makes a real array, and a write in place into the trace's own frame would raise."""
    n = len(s)
    if n < 2:
        return s
    arr = s.array
    if isinstance(arr, pd.arrays.IntegerArray):
        data, mask = arr._data, arr._mask
        if mask.any() or not data.strides[0] or data.min() != data.max():
            return s
        one = np.broadcast_to(data[:1].copy(), (n,))
        view = pd.arrays.IntegerArray(one, np.broadcast_to(np.zeros(1, dtype=bool), (n,)), copy=False)
        return pd.Series(view, index=s.index, copy=False)
    if s.dtype.kind in "iuf":
        data = s.to_numpy()
        if not data.strides[0] or not data.min() == data.max():  # NaN: not one value
            return s
        return pd.Series(np.broadcast_to(data[:1].copy(), (n,)), index=s.index, copy=False)
    return s


def narrow(trace: "Trace") -> None:
    """Cast the `NARROW` columns of `trace` in place (the caller guarantees they fit) and the
    `NARROW_IF_FIT` ones whose values fit in int32."""
    for frame, cols in NARROW.items():
        df = getattr(trace, frame)
        for col, dtype in cols.items():
            if col in df.columns and str(df[col].dtype) != dtype:
                df[col] = df[col].astype(dtype)
    for frame, names in NARROW_IF_FIT.items():
        df = getattr(trace, frame)
        for col in names:
            _int32_if_fit(df, col)
    # rank: the file's place on the command line, or the rank it declares; int32 where it fits
    # (4 bytes a row of every big frame). Code must work with int32 or int64 ranks.
    for frame in ("kernels", "runtime", "memcpy", "nvtx", "cpu_ops"):
        df = getattr(trace, frame)
        r = df["rank"]
        if r.dtype == np.int64 and len(r) and -(2**31) <= r.min() and r.max() < 2**31:
            df["rank"] = r = r.astype(np.int32)
        df["rank"] = constant_view(r)  # one rank a file: the usual case
    for frame, names in NARROW_IF_FIT.items():
        df = getattr(trace, frame)
        for col in names:  # one device (or thread) a process: the usual case
            df[col] = constant_view(df[col])


def conform(df: pd.DataFrame | None, frame: str) -> pd.DataFrame:
    """Return `df` with exactly the columns of `SCHEMAS[frame]`, in order and typed.

    Missing columns become all-NA (or 0 for the required int64 columns, which readers must
    fill themselves; an empty frame is fine). Extra columns are dropped.
    """
    schema = SCHEMAS[frame]
    keep32 = _narrowable(frame)  # a reader may have narrowed these already (narrow_fitting)
    if df is None:
        df = pd.DataFrame()
    out = {}
    n = len(df)
    for col, dtype in schema.items():
        if col not in df.columns and dtype != "int64":
            out[col] = _missing(dtype, df.index)
            continue
        if col in df.columns:
            s = df[col]
        else:
            s = pd.Series([pd.NA] * n, index=df.index, dtype="object")
        if dtype == "int64":
            if s.dtype != "int64" and not (col == "rank" and s.dtype == np.int32):
                # Int64 (what the SQLite readers give) is cast without to_numeric's copy
                if not isinstance(s.dtype, pd.Int64Dtype):
                    s = pd.to_numeric(s, errors="coerce")
                if s.isna().any():
                    raise ValueError(f"{frame}.{col} has missing values")
                s = s.astype("int64")
        elif dtype == _I:
            if not (n and col in keep32 and isinstance(s.dtype, pd.Int32Dtype)):
                s = _nullable_int(s)
            if n and s.isna().all():  # e.g. a NULL column of the source: see _missing
                s = _missing(dtype, df.index)
        elif dtype == _F:
            s = _numeric(s).astype(dtype)
        else:
            s = _text(s)
            if n and s.isna().all():  # e.g. NVTX domains of the default domain: one NA seen n times
                s = _missing(dtype, df.index)
        out[col] = s
    # copy=False: the columns are the reader's own (or new), not copied again (a second copy
    # of every frame at the peak of a read)
    return pd.DataFrame(out, index=df.index, copy=False).reset_index(drop=True)


def _missing(dtype: str, index: pd.Index) -> pd.Series:
    """An all-NA column of `dtype`, built directly (a column of a million pd.NA objects took
    0.3 s to convert, per column, on every frame without it)."""
    n = len(index)
    # np.zeros is calloc: pages never written stay off the process's resident memory, so an
    # all-NA number column costs its mask (1 byte a value) unless something writes it;
    # copy=False, as pd.Series would otherwise copy (and write) them.
    if dtype == _I:  # the mask too: one True seen through a zero-stride read-only view
        mask = np.broadcast_to(np.ones(1, dtype=bool), (n,))
        return pd.Series(pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), mask, copy=False), index=index,
                         copy=False)
    if dtype == _F:
        return pd.Series(pd.arrays.FloatingArray(np.zeros(n, dtype=np.float64), np.ones(n, dtype=bool)), index=index,
                         copy=False)
    # Text: one pd.NA seen through a zero-stride, read-only view (8 bytes a row otherwise: 80 MB
    # per column at 10M kernels); _simple_new, as StringArray's check writes to its values.
    # pandas copies it before any write, and every take, concat or copy makes a real array.
    na = np.broadcast_to(np.array([pd.NA], dtype=object), (n,))
    return pd.Series(pd.arrays.StringArray._simple_new(na, _S), index=index, copy=False)


def _numeric(s: pd.Series) -> pd.Series:
    """pd.to_numeric(errors="coerce"), also for integers too large for a float64."""
    try:
        return pd.to_numeric(s, errors="coerce")
    except OverflowError:
        def one(v: Any) -> float:
            try:
                return float(v)
            except (TypeError, ValueError, OverflowError):
                return float("nan")

        return pd.Series([one(v) for v in s], index=s.index, dtype="float64")


def _nullable_int(s: pd.Series) -> pd.Series:
    """Int64 of `s`. Readers pass Int64 or int64 already; anything else (floats, numbers as
    text, values a corrupt file put there) is rounded, and NaN, infinities and values beyond
    int64 become <NA> rather than an error."""
    if isinstance(s.dtype, pd.Int64Dtype):
        return s
    if s.dtype.kind in "ib":
        return s.astype("Int64")
    num = _numeric(s)
    if num.dtype.kind in "ib":
        return num.astype("Int64")
    if num.dtype.kind == "u":  # exact below 2**63, <NA> above
        raw = num.to_numpy()
        big = raw > np.uint64(2**63 - 1)
        return pd.Series(pd.arrays.IntegerArray(np.where(big, 0, raw).astype("int64"), big), index=s.index)
    if isinstance(num.dtype, pd.Int64Dtype):
        return num
    values = num.to_numpy(dtype="float64", na_value=np.nan)
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(values) & (np.abs(values) < 2.0**63)
    ints = np.round(np.where(ok, values, 0.0)).astype("int64")
    return pd.Series(pd.arrays.IntegerArray(ints, ~ok), index=s.index)


def _text(s: pd.Series) -> pd.Series:
    """StringDtype of `s`; bytes (a SQLite BLOB where text belongs) are decoded with
    replacement characters instead of failing on invalid UTF-8."""
    try:
        return s.astype(_S)
    except UnicodeDecodeError:
        fixed = [v.decode("utf-8", "replace") if isinstance(v, (bytes, bytearray)) else v for v in s]
        return pd.Series(fixed, index=s.index, dtype="object").astype(_S)


def empty(frame: str) -> pd.DataFrame:
    return conform(None, frame)


@dataclass
class Trace:
    """Everything advisor knows about one or more profiler files, as frames.

    `meta` holds `format` (reader name, or a list when several files were merged),
    `sources` (file names, not full paths), and `notes` (plain sentences about what the
    reader could not find, e.g. "no SM count in the trace"); `serialized_ranks`, when set,
    lists the ranks whose kernels the profiler ran one at a time (counter collection), whose
    gaps and overlaps are therefore not the program's.
    """

    kernels: pd.DataFrame = field(default_factory=lambda: empty("kernels"))
    runtime: pd.DataFrame = field(default_factory=lambda: empty("runtime"))
    memcpy: pd.DataFrame = field(default_factory=lambda: empty("memcpy"))
    nvtx: pd.DataFrame = field(default_factory=lambda: empty("nvtx"))
    cpu_ops: pd.DataFrame = field(default_factory=lambda: empty("cpu_ops"))
    devices: pd.DataFrame = field(default_factory=lambda: empty("devices"))
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(cls, meta: dict[str, Any] | None = None, **frames: pd.DataFrame | None) -> "Trace":
        unknown = set(frames) - set(FRAMES)
        if unknown:
            raise TypeError(f"unknown frames: {sorted(unknown)}")
        conformed = {name: conform(frames.get(name), name) for name in FRAMES}
        meta = dict(meta or {})
        meta.setdefault("notes", [])
        return cls(**conformed, meta=meta)

    def frames(self) -> dict[str, pd.DataFrame]:
        return {name: getattr(self, name) for name in FRAMES}

    @property
    def ranks(self) -> list[int]:
        seen: set[int] = set()
        for df in self.frames().values():
            seen.update(int(r) for r in df["rank"].unique())
        return sorted(seen)

    def note(self, text: str) -> None:
        if text not in self.meta.setdefault("notes", []):
            self.meta["notes"].append(text)
