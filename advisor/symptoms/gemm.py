"""Which kernels are GEMMs, their tiles, their problem shapes, and how they are scheduled.

Kernel names say a lot: cuBLAS `sm90_xmma_gemm_..._tilesize128x128x64_...`, Hopper cuBLAS
`nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT` (tile 320x128, BK 64, 3 stages),
CUTLASS 3 `..._256x128x64_1x2x1_..._warpspecialized_cooperative_epi_tma`, hipBLASLt
`Cijk_..._MT128x128x64_...`. Problem shapes come from the ranges that enclose the launch on
the host thread:

* advisor's own NVTX convention (advisor.annotate):  ``advisor.gemm M=4096 N=4096 K=4096 dtype=bf16``
  optionally followed by ``batch=B`` and free text;
* ``torch.autograd.profiler.emit_nvtx(record_shapes=True)``:
  ``aten::mm, seq = 0, op_id = 1, sizes = [[4096, 4096], [4096, 4096]], ...``;
* Kineto ``cpu_op`` events with ``Input Dims`` (and ``Input type`` for the dtype).

The innermost enclosing range wins. Everything here is evidence, not judgement.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pandas as pd

from ..model import Trace

_GEMM = re.compile(
    r"gemm|matmul|xmma|nvjet|cijk_|wgmma|tensorop|_mm_|\bmm_|mm_kernel|s16816|h16816|s1688|h1688|"
    r"_(?:nn|nt|tn|tt)(?:_|$)|scaled_mm|bmm",
    re.I,
)
# Kernels that are part of a GEMM but not a tiled GEMM themselves.
_NOT_GEMM = re.compile(r"splitkreduce|split_k_reduce|reduce_kernel|gemv|gemvx|_fixup|elementwise|cast", re.I)
_SPLIT_K = re.compile(r"splitk|split_k|stream_k|streamk|_sk_|segment_k_on|partition_k", re.I)
_WS = re.compile(r"warpspecialized|warp_specialized|warpspecialize|_ws_|_ws$|^ws_|nvjet", re.I)
_COMM = re.compile(
    r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|cross_device_reduce|multimem|"
    r"sendrecv|broadcast_kernel",
    re.I,
)

_TILE_PATTERNS = [
    re.compile(r"tilesize(\d+)x(\d+)x(\d+)", re.I),
    re.compile(r"MT(\d+)x(\d+)x(\d+)"),
    re.compile(r"nvjet_(?:[a-z0-9]+_)+?(\d+)x(\d+)_(\d+)x\d+", re.I),
    re.compile(r"(?:^|_)(\d+)x(\d+)x(\d+)_\d+x\d+x\d+"),  # CUTLASS 3: tile then cluster
    re.compile(r"(?:^|_)(\d+)x(\d+)_(\d+)x\d+(?:_|$)"),  # CUTLASS 2: tile_BKxstages
    re.compile(r"(?:^|_)(\d+)x(\d+)(?:_|$)()"),  # old cuBLAS ampere_sgemm_128x64_nn
]


def tile_from_name(name: str | None) -> tuple[int, int, int | None] | None:
    """(tile_m, tile_n, tile_k or None) named in a GEMM kernel name, else None."""
    if not isinstance(name, str):
        return None
    for pat in _TILE_PATTERNS:
        m = pat.search(name)
        if m:
            tm, tn = int(m.group(1)), int(m.group(2))
            tk = int(m.group(3)) if m.group(3) else None
            if 8 <= tm <= 1024 and 8 <= tn <= 1024:
                return tm, tn, tk
    return None


# --------------------------------------------------------------------------- shape parsing

_ADVISOR = re.compile(r"^advisor\.gemm\b(.*)$")
_KV = re.compile(r"\b([A-Za-z_]+)=([A-Za-z0-9_.]+)")
_DTYPES = {
    "bf16": "bf16", "bfloat16": "bf16", "c10::bfloat16": "bf16",
    "fp16": "fp16", "half": "fp16", "float16": "fp16", "c10::half": "fp16",
    "fp32": "fp32", "float": "fp32", "float32": "fp32",
    "fp8": "fp8", "c10::float8_e4m3fn": "fp8", "c10::float8_e5m2": "fp8",
}


def _op_base(name: str) -> str:
    """'aten::addmm_.out' -> 'addmm'."""
    base = name.split("::")[-1].split(".")[0].strip()
    return base.rstrip("_")


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def shape_from_op(op: str, dims: list[Any]) -> dict[str, int] | None:
    """M, N, K (and batch) of a GEMM operator from its input shapes, or None."""
    base = _op_base(op)
    mats = [d for d in dims if isinstance(d, list) and all(isinstance(x, int) for x in d)]
    try:
        if base in ("mm", "_scaled_mm", "_int_mm") and len(mats) >= 2:
            (m, k), (k2, n) = mats[0][-2:], mats[1][-2:]
            batch = 1
        elif base == "addmm" and len(mats) >= 3:
            (m, k), (k2, n) = mats[1][-2:], mats[2][-2:]
            batch = 1
        elif base == "bmm" and len(mats) >= 2 and len(mats[0]) == 3:
            batch, m, k = mats[0]
            k2, n = mats[1][-2:]
        elif base == "baddbmm" and len(mats) >= 3 and len(mats[1]) == 3:
            batch, m, k = mats[1]
            k2, n = mats[2][-2:]
        elif base == "matmul" and len(mats) >= 2 and len(mats[0]) >= 2 and len(mats[1]) >= 2:
            a, b = mats[0], mats[1]
            m, k = a[-2], a[-1]
            k2, n = b[-2], b[-1]
            batch = _prod(a[:-2]) if len(b) == 2 else max(_prod(a[:-2]), _prod(b[:-2]))
            if len(b) == 2:  # (..., M, K) @ (K, N): the batch folds into M
                m, batch = m * batch, 1
        elif base == "linear" and len(mats) >= 2 and len(mats[1]) == 2:
            x, w = mats[0], mats[1]
            m, k = _prod(x[:-1]), x[-1]
            n, k2 = w
            batch = 1
        else:
            return None
    except (ValueError, TypeError):
        return None
    if k != k2 or not _plausible(m, n, k, batch):
        return None
    return {"M": int(m), "N": int(n), "K": int(k), "batch": int(batch)}


# A GEMM dimension (or batch) is a tensor extent: 1..2**31-1 (what `advisor generate` accepts).
# Larger values in a trace are corrupt or hostile, and would overflow the int64 tile counts.
_MAX_EXTENT = 2**31 - 1


def _plausible(*extents: int) -> bool:
    return all(1 <= int(e) <= _MAX_EXTENT for e in extents)


def _extract_sizes(text: str) -> list[Any] | None:
    """The `sizes = [[...], ...]` list of an emit_nvtx range text, parsed as JSON."""
    i = text.find("sizes = [")
    if i < 0:
        return None
    start = text.index("[", i)
    depth = 0
    for j in range(start, min(len(text), start + 4096)):
        c = text[j]
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth == 0:
                try:
                    val = json.loads(text[start : j + 1])
                except ValueError:
                    return None
                return val if isinstance(val, list) else None
    return None


def parse_range_text(text: str) -> dict[str, Any] | None:
    """GEMM shape from one NVTX range text (advisor convention or emit_nvtx), else None."""
    if not isinstance(text, str):
        return None
    m = _ADVISOR.match(text)
    if m:
        kv = dict(_KV.findall(m.group(1)))
        try:
            shape = {"M": int(kv["M"]), "N": int(kv["N"]), "K": int(kv["K"]), "batch": int(kv.get("batch", 1))}
        except (KeyError, ValueError):
            return None
        if not _plausible(*shape.values()):
            return None
        shape["dtype"] = _DTYPES.get(kv.get("dtype", "").lower())
        shape["op"] = "advisor.gemm"
        shape["source"] = "nvtx-advisor"
        return shape
    if "::" not in text[:64]:
        return None
    op = text.split(",", 1)[0].strip()
    sizes = _extract_sizes(text)
    if sizes is None:
        return None
    shape = shape_from_op(op, sizes)
    if shape is None:
        return None
    shape.update(dtype=None, op=op, source="nvtx-emit")
    return shape


def parse_cpu_op(name: str, input_dims: str | None, input_types: str | None) -> dict[str, Any] | None:
    if not isinstance(name, str) or not isinstance(input_dims, str):
        return None
    try:
        dims = json.loads(input_dims)
    except ValueError:
        return None
    if not isinstance(dims, list):
        return None
    shape = shape_from_op(name, dims)
    if shape is None:
        return None
    dtype = None
    if isinstance(input_types, str):
        try:
            types = json.loads(input_types)
        except ValueError:
            types = []
        for t in types if isinstance(types, list) else []:
            dtype = _DTYPES.get(str(t).lower())
            if dtype:
                break
    shape.update(dtype=dtype, op=name, source="kineto-input-dims")
    return shape


# --------------------------------------------------------------------------- joining

def _shape_ranges(trace: Trace) -> pd.DataFrame:
    rows = []
    nv = trace.nvtx
    if len(nv):
        # Only texts that can be GEMM shapes are parsed: cheap prefilter on the whole column.
        cand = nv[nv["text"].str.contains(r"advisor\.gemm|sizes = \[", regex=True, na=False)]
        for r in cand.itertuples(index=False):
            s = parse_range_text(r.text)
            if s:
                rows.append((r.rank, r.thread_id, r.start_ns, r.end_ns, s))
    ops = trace.cpu_ops
    if len(ops):
        cand = ops[ops["input_dims"].notna() & ops["name"].str.contains(r"mm|matmul|linear", regex=True, na=False)]
        for r in cand.itertuples(index=False):
            s = parse_cpu_op(r.name, r.input_dims, r.input_types)
            if s:
                rows.append((r.rank, r.thread_id, r.start_ns, r.end_ns, s))
    if not rows:
        return pd.DataFrame(columns=["rank", "thread_id", "start_ns", "end_ns", "M", "N", "K", "batch", "dtype", "op", "source"])
    df = pd.DataFrame(
        [(rk, tid, st, en, s["M"], s["N"], s["K"], s["batch"], s["dtype"], s["op"], s["source"]) for rk, tid, st, en, s in rows],
        columns=["rank", "thread_id", "start_ns", "end_ns", "M", "N", "K", "batch", "dtype", "op", "source"],
    )
    return df


def _launch_points(trace: Trace) -> pd.DataFrame:
    """Host thread and time of each kernel's launch call (via correlation ids)."""
    k = trace.kernels
    rt = trace.runtime
    base = pd.DataFrame({"rank": k["rank"], "correlation_id": k["correlation_id"]}, index=k.index)
    if rt.empty or k["correlation_id"].isna().all():
        return base.assign(thread_id=pd.NA, launch_ns=np.nan)
    r = rt.dropna(subset=["correlation_id"]).drop_duplicates(["rank", "correlation_id"])
    r = r[["rank", "correlation_id", "thread_id", "start_ns"]].rename(columns={"start_ns": "launch_ns"})
    merged = base.reset_index().merge(r, on=["rank", "correlation_id"], how="left").set_index("index")
    return merged.reindex(k.index)


def assign_shapes(trace: Trace) -> pd.DataFrame:
    """Per kernel: M, N, K, batch, dtype, op, shape_source from the innermost enclosing range."""
    k = trace.kernels
    out = pd.DataFrame(
        {
            "M": pd.array([pd.NA] * len(k), dtype="Int64"),
            "N": pd.array([pd.NA] * len(k), dtype="Int64"),
            "K": pd.array([pd.NA] * len(k), dtype="Int64"),
            "batch": pd.array([pd.NA] * len(k), dtype="Int64"),
            "dtype": pd.array([pd.NA] * len(k), dtype="string"),
            "op": pd.array([pd.NA] * len(k), dtype="string"),
            "shape_source": pd.array([pd.NA] * len(k), dtype="string"),
        },
        index=k.index,
    )
    if k.empty:
        return out
    ranges = _shape_ranges(trace)
    if ranges.empty:
        return out
    launches = _launch_points(trace).dropna(subset=["launch_ns"])
    if launches.empty:
        return out
    hit = np.full(len(k), -1, dtype=np.int64)
    pos_of = pd.Series(np.arange(len(k)), index=k.index)
    # Longest ranges first so that inner (shorter) ranges overwrite outer ones.
    ranges = ranges.assign(_dur=ranges["end_ns"] - ranges["start_ns"]).sort_values("_dur", ascending=False)
    ranges = ranges.reset_index(drop=True)
    for (rank, tid), lg in launches.groupby(["rank", "thread_id"], sort=False):
        rg = ranges[(ranges["rank"] == rank) & (ranges["thread_id"] == tid)]
        if rg.empty:
            continue
        lg = lg.sort_values("launch_ns")
        t = lg["launch_ns"].to_numpy(dtype=np.float64)
        idx = pos_of.loc[lg.index].to_numpy()
        lo = np.searchsorted(t, rg["start_ns"].to_numpy(dtype=np.float64), side="left")
        hi = np.searchsorted(t, rg["end_ns"].to_numpy(dtype=np.float64), side="right")
        for ri, a, b in zip(rg.index, lo, hi):
            if b > a:
                hit[idx[a:b]] = ri
    has = hit >= 0
    if not has.any():
        return out
    sel = ranges.loc[hit[has]]
    rows = k.index[has]
    for col in ("M", "N", "K", "batch"):
        out.loc[rows, col] = sel[col].to_numpy()
    out.loc[rows, "dtype"] = sel["dtype"].astype("string").to_numpy()
    out.loc[rows, "op"] = sel["op"].astype("string").to_numpy()
    out.loc[rows, "shape_source"] = sel["source"].astype("string").to_numpy()
    return out


def gemm_table(trace: Trace) -> pd.DataFrame:
    """Per kernel (same index as trace.kernels): is_gemm, is_comm, is_split_k, is_ws,
    tile_m/n/k, M, N, K, batch, dtype, op, shape_source, tiles (output tiles when both shape
    and tile are known, else NA)."""
    k = trace.kernels
    names = k["name"].fillna("").astype(str)
    uniq = pd.Series(names.unique())
    flags = pd.DataFrame(
        {
            "name": uniq,
            "is_comm": uniq.str.contains(_COMM),
            "is_gemm_name": uniq.str.contains(_GEMM) & ~uniq.str.contains(_NOT_GEMM),
            "is_split_k": uniq.str.contains(_SPLIT_K),
            "is_ws": uniq.str.contains(_WS),
        }
    )
    tiles = uniq.map(tile_from_name)
    flags["tile_m"] = pd.array([t[0] if t else pd.NA for t in tiles], dtype="Int64")
    flags["tile_n"] = pd.array([t[1] if t else pd.NA for t in tiles], dtype="Int64")
    flags["tile_k"] = pd.array([t[2] if t and t[2] else pd.NA for t in tiles], dtype="Int64")
    per = flags.set_index("name").reindex(names.to_numpy())
    per.index = k.index
    shapes = assign_shapes(trace)
    out = pd.concat([per, shapes], axis=1)
    # A kernel launched inside a GEMM operator's range is a GEMM even when its name says
    # nothing (a Triton kernel called "kernel_0"), unless it is communication or a helper.
    named_helper = names.str.contains(_NOT_GEMM)
    out["is_gemm"] = (out["is_gemm_name"] | (out["M"].notna() & ~named_helper)) & ~out["is_comm"]
    tm, tn = out["tile_m"], out["tile_n"]
    b = out["batch"].fillna(1)
    tiles_known = -(-out["M"] // tm) * -(-out["N"] // tn) * b
    # extents up to 2**31 can multiply past int64 (which wraps silently): unknown instead
    approx = (out["M"].astype("Float64") / tm) * (out["N"].astype("Float64") / tn) * b.astype("Float64")
    out["tiles"] = tiles_known.astype("Int64").mask((approx >= 2.0**62).fillna(False))
    return out.drop(columns=["is_gemm_name"])
