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
* Kineto ``cpu_op`` events with ``Input Dims`` (and ``Input type`` for the dtype);
* what users write in their own ranges (NVTX, ``torch.profiler.record_function``): any text
  with ``M=``, ``N=``, ``K=`` tokens (``tail_gemm M=1664 N=1408 K=8192``) or one ``MxNxK``
  (``qkv 8192x3072x1024 bf16``). Such a free-form shape is given only to kernels whose names
  say GEMM: a range around a whole layer must not make its elementwise kernels GEMMs;
* the user's explicit ``--shape KERNEL_PATTERN=MxNxK[:dtype]`` (diagnose(...,
  shapes=...)), which wins over everything for the kernels it matches.

The innermost enclosing range wins. Everything here is evidence, not judgement.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pandas as pd

from ..basics import DTYPE_ALIASES, input_dims, input_dtypes, op_base
from ..model import Trace, string_array
from .strings import MATCH_CHARS, contains, factorize

_GEMM = re.compile(
    r"gemm|matmul|xmma|nvjet|cijk_|wgmma|tensorop|_mm_|\bmm_|mm_kernel|s16816|h16816|s1688|h1688|"
    r"_(?:nn|nt|tn|tt)(?:_|$)|scaled_mm|bmm|addmm",
    re.I,
)
# Kernels that are part of a GEMM but not a tiled GEMM themselves. torch.compile (Inductor)
# names its pointwise, reduction and persistent-reduction kernels `triton_poi_` / `triton_red_`
# / `triton_per_` + the ops they fuse, which may include the mm whose bias or activation they
# apply (`triton_poi_fused_addmm_relu_1`); its GEMMs are templates, `triton_tem_fused_addmm_0`.
# Attention kernels run GEMMs inside (cuDNN's sm90 SDPA names `wgmma`), but their shape is
# not a GEMM's and their schedule is the library's: the GEMM symptoms do not fit them.
_NOT_GEMM = re.compile(
    r"splitkreduce|split_k_reduce|reduce_kernel|gemv|gemvx|_fixup|elementwise|cast|^triton_(?:poi|red|per)_|"
    r"sdpa|fmha|flash_?attn|flash_(?:fwd|bwd|fprop|bprop)|attention",
    re.IGNORECASE,
)
_SPLIT_K = re.compile(r"splitk|split_k|stream_k|streamk|_sk_|segment_k_on|partition_k", re.I)
_WS = re.compile(r"warpspecialized|warp_specialized|warpspecialize|_ws_|_ws$|^ws_|nvjet", re.I)
_COMM = re.compile(
    r"nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|cross_device_reduce|multimem|"
    r"sendrecv|broadcast_kernel|msccl|"
    # expert-parallel all-to-all kernels (DeepEP and DeepSeek's copy of it): token dispatch and
    # combine move data between GPUs over NVLink/RDMA; get_dispatch_layout only computes
    r"(?:deep_?ep|dpsk::ep)::(?:intranode|internode(?:_ll)?)::\w*(?:dispatch|combine)|"
    # symmetric-memory signal kernels: a GPU waiting there waits for its peers, not computing
    r"(?:^|[^a-z])barrier_kernel|(?:put|wait)_signal_kernel",
    re.I,
)

_TILE_PATTERNS = [
    re.compile(r"tilesize(\d+)x(\d+)x(\d+)", re.I),
    re.compile(r"MT(\d+)x(\d+)x(\d+)"),
    # one lazy run, no nested quantifier: `(?:[a-z0-9]+_)+?` took 67 s on a 240 KB name
    re.compile(r"nvjet_[a-z0-9][a-z0-9_]*?_(\d+)x(\d+)_(\d+)x\d+", re.I),
    re.compile(r"(?:^|_)(\d+)x(\d+)x(\d+)_\d+x\d+x\d+"),  # CUTLASS 3: tile then cluster
    re.compile(r"(?:^|_)(\d+)x(\d+)_(\d+)x\d+(?:_|$)"),  # CUTLASS 2: tile_BKxstages
    re.compile(r"(?:^|_)(\d+)x(\d+)(?:_|$)()"),  # old cuBLAS ampere_sgemm_128x64_nn
]


def tile_from_name(name: str | None) -> tuple[int, int, int | None] | None:
    """(tile_m, tile_n, tile_k or None) named in a GEMM kernel name, else None. Only the
    first MATCH_CHARS characters are searched: tiles come early in real names, and a hostile
    megabyte name must not cost a search from every position."""
    if not isinstance(name, str):
        return None
    name = name[:MATCH_CHARS]
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
def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


def shape_from_op(op: str, dims: list[Any]) -> dict[str, int] | None:
    """M, N, K (and batch) of a GEMM operator from its input shapes, or None."""
    base = op_base(op)
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


# Free-form shapes in users' range texts. Bounded repetitions and no nested quantifiers: range
# texts come from traces users do not control.
_FREE_KV = re.compile(r"(?<![A-Za-z0-9_])([MNK])\s{0,3}[=:]\s{0,3}(\d{1,10})(?![0-9])")
_FREE_MNK = re.compile(r"(?<![0-9xX.])(\d{1,10})\s{0,2}[xX]\s{0,2}(\d{1,10})\s{0,2}[xX]\s{0,2}(\d{1,10})(?![0-9xX.])")
_FREE_DTYPE = re.compile(r"(?<![A-Za-z0-9])(bf16|bfloat16|fp16|float16|half|fp32|float32|fp8|fp64|float64)(?![A-Za-z0-9])", re.I)
# Texts longer than this are not a label someone wrote around a GEMM.
_MAX_FREE_TEXT = 512


def parse_free_text(text: str) -> dict[str, Any] | None:
    """A GEMM shape from a user's own range label (M=/N=/K= tokens or one MxNxK), else None."""
    if not isinstance(text, str) or len(text) > _MAX_FREE_TEXT:
        return None
    kv: dict[str, int] = {}
    for key, val in _FREE_KV.findall(text):
        kv.setdefault(key, int(val))
    if len(kv) == 3:
        m, n, k = kv["M"], kv["N"], kv["K"]
    else:
        forms = _FREE_MNK.findall(text)
        if len(forms) != 1:  # none, or several (which one is the GEMM?)
            return None
        m, n, k = (int(x) for x in forms[0])
    if not _plausible(m, n, k):
        return None
    dt = _FREE_DTYPE.search(text)
    return {"M": m, "N": n, "K": k, "batch": 1, "dtype": DTYPE_ALIASES.get(dt.group(1).lower()) if dt else None,
            "op": "range text", "source": "nvtx-text"}


_USER_SHAPE = re.compile(r"^\s*(\d{1,10})\s*[xX]\s*(\d{1,10})\s*[xX]\s*(\d{1,10})\s*(?::\s*([A-Za-z0-9_:]+))?\s*$")


def parse_shape_override(spec: str) -> tuple[str, dict[str, Any]]:
    """`KERNEL_PATTERN=MxNxK[:dtype]` -> (pattern, shape). Raises ValueError with the reason."""
    if not isinstance(spec, str) or "=" not in spec:
        raise ValueError(f"{spec!r}: expected KERNEL_PATTERN=MxNxK[:dtype], e.g. 'dp_gemm=1664x1408x8192:bf16'")
    pattern, _, dims = spec.rpartition("=")
    pattern = pattern.strip()
    m = _USER_SHAPE.match(dims)
    if not pattern or not m:
        raise ValueError(f"{spec!r}: expected KERNEL_PATTERN=MxNxK[:dtype], e.g. 'dp_gemm=1664x1408x8192:bf16'")
    try:
        re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"{spec!r}: the kernel pattern is not a regular expression ({exc})") from None
    M, N, K = (int(x) for x in m.group(1, 2, 3))
    if not _plausible(M, N, K):
        raise ValueError(f"{spec!r}: each of M, N, K must be 1..{_MAX_EXTENT}")
    dtype = None
    if m.group(4):
        dtype = DTYPE_ALIASES.get(m.group(4).lower())
        if dtype is None:
            raise ValueError(f"{spec!r}: unknown dtype {m.group(4)!r} (bf16, fp16, fp32, fp8, fp64)")
    return pattern, {"M": M, "N": N, "K": K, "batch": 1, "dtype": dtype, "op": "--shape", "source": "user"}


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
        shape["dtype"] = DTYPE_ALIASES.get(kv.get("dtype", "").lower())
        shape["op"] = "advisor.gemm"
        shape["source"] = "nvtx-advisor"
        return shape
    if "::" not in text[:64]:
        return parse_free_text(text)
    op = text.split(",", 1)[0].strip()
    sizes = _extract_sizes(text)
    if sizes is None:
        return None
    shape = shape_from_op(op, sizes)
    if shape is None:
        return None
    shape.update(dtype=None, op=op, source="nvtx-emit")
    return shape


def leading_dims(op: str, dims: list[Any], strides: Any) -> str | None:
    """Which of M, N, K are the row length (leading dimension) of some operand of a GEMM
    operator, from Kineto's `Input Strides`: "NK" for x @ W^T. A row-major A [M, K] has rows
    of K elements, a transposed view of one (a weight gradient's dY^T) rows of M; B [K, N]
    rows of N, or of K when it is a transposed weight; C is allocated row-major, rows of N.
    Only a leading dimension must be a whole number of 16-byte units for the fast kernels.
    None when the strides are missing or do not match the dims."""
    if not isinstance(strides, list) or len(strides) != len(dims):
        return None
    base = op_base(op)
    # the operands as shape_from_op picks them (addmm's and baddbmm's added term first)
    mats = [(d, s) for d, s in zip(dims, strides) if isinstance(d, list) and all(isinstance(x, int) for x in d)]
    first = {"addmm": 1, "baddbmm": 1}.get(base, 0)
    if len(mats) < first + 2:
        return None
    (a, sa), (b, sb) = mats[first], mats[first + 1]
    if not (len(a) >= 2 and len(b) >= 2 and isinstance(sa, list) and isinstance(sb, list)
            and len(sa) == len(a) and len(sb) == len(b)):
        return None

    def rows(extents, st, along_last: str, along_other: str) -> set[str]:
        # the dimension of stride 1 is the row; a matrix of one row (or column) has only the
        # other, whatever the strides of a size-1 dimension say
        if extents[-2] == 1:
            return {along_last}
        if extents[-1] == 1:
            return {along_other}
        out = {d for d, s in ((along_last, st[-1]), (along_other, st[-2])) if s == 1}
        return out or {along_last, along_other}  # neither unit-stride: a strided view, both count

    lead = {"N"} | rows(a, sa, "K", "M")
    # linear's weight is [N, K] (B = W^T); the others' second matrix is B [K, N] itself
    lead |= rows(b, sb, "K", "N") if base == "linear" else rows(b, sb, "N", "K")
    return "".join(d for d in "MNK" if d in lead)


def parse_cpu_op(name: str, input_dims_text: str | None, input_types: str | None,
                 input_strides: str | None = None) -> dict[str, Any] | None:
    dims = input_dims(input_dims_text)
    if not isinstance(name, str) or dims is None:
        return None
    shape = shape_from_op(name, dims)
    if shape is None:
        return None
    dtype = next((d for d in input_dtypes(input_types) if d), None)  # the first input of a known type
    strides = input_dims(input_strides)  # (the same JSON list-of-lists form as the dims)
    shape.update(dtype=dtype, op=name, source="kineto-input-dims", lead=leading_dims(name, dims, strides))
    return shape


# --------------------------------------------------------------------------- joining

_RANGE_COLUMNS = ["rank", "thread_id", "start_ns", "end_ns", "M", "N", "K", "batch", "dtype", "op", "source", "lead"]


def _ranges_with_shapes(rows: pd.DataFrame, codes: np.ndarray, shapes: list[dict | None]) -> pd.DataFrame:
    """Rows of `rows` whose shape (shapes[code], parsed once per distinct text) is known."""
    known = np.array([s is not None for s in shapes], dtype=bool)
    keep = known[codes]
    codes = codes[keep]
    sub = rows[keep]

    def col(key: str, dtype=object) -> np.ndarray:
        missing = 0 if dtype == "int64" else None  # never picked: rows without a shape are dropped
        return np.array([s.get(key) if s is not None else missing for s in shapes], dtype=dtype)[codes]

    return pd.DataFrame(
        {
            "rank": sub["rank"].to_numpy(),
            "thread_id": sub["thread_id"].array,
            "start_ns": sub["start_ns"].to_numpy(),
            "end_ns": sub["end_ns"].to_numpy(),
            **{k: col(k, "int64") for k in ("M", "N", "K", "batch")},
            # object columns: a column of str objects would become pandas 3's Arrow strings
            # (a copy of every text into Arrow's pool, which keeps the memory once freed)
            **{k: pd.Series(col(k), dtype=object, copy=False) for k in ("dtype", "op", "source", "lead")},
        }
    )


def _shape_ranges(trace: Trace) -> pd.DataFrame:
    """Host ranges that name a GEMM shape (NVTX text, Kineto cpu_op Input Dims). Each distinct
    text is parsed once: a long run repeats the same few shapes millions of times."""
    parts = []
    nv = trace.nvtx
    if len(nv):
        # Only texts that can be GEMM shapes are parsed: cheap prefilter on the whole column.
        cand = nv[contains(nv["text"], r"advisor\.gemm|sizes = \[|\b[MNK]\s{0,3}[=:]|\d\s{0,2}[xX]\s{0,2}\d").to_numpy()]
        if len(cand):
            codes, texts = pd.factorize(cand["text"])
            parts.append(_ranges_with_shapes(cand, codes, [parse_range_text(t) for t in texts]))
    ops = trace.cpu_ops
    if len(ops):
        cand = ops[ops["input_dims"].notna().to_numpy() & contains(ops["name"], r"mm|matmul|linear").to_numpy()]
        if len(cand):
            # one group per distinct (name, dims, types), numbered in order of first appearance:
            # the three columns factorized as strings (shared objects: cheap), then pairs of
            # codes combined (each product stays below rows**2); a groupby and drop_duplicates
            # over the strings themselves took ~0.4 s at 2M events
            codes = None
            by = [c for c in ("name", "input_dims", "input_types", "input_strides") if c in cand.columns]
            for col in by:
                c, u = factorize(cand[col])
                c = c.astype(np.int64) + 1  # -1 (missing) -> 0
                codes = c if codes is None else pd.factorize(codes * (len(u) + 1) + c)[0].astype(np.int64)
            first_at = np.empty(int(codes.max()) + 1, dtype=np.intp)
            first_at[codes[::-1]] = np.arange(len(codes) - 1, -1, -1)  # last write wins: the first row
            first = cand.iloc[first_at]
            strides = first["input_strides"] if "input_strides" in first.columns else [None] * len(first)
            shapes = [parse_cpu_op(n, d, t, st) for n, d, t, st in
                      zip(first["name"], first["input_dims"], first["input_types"], strides)]
            parts.append(_ranges_with_shapes(cand, codes, shapes))
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=_RANGE_COLUMNS)
    out = parts[0][_RANGE_COLUMNS] if len(parts) == 1 else pd.concat(parts, ignore_index=True)[_RANGE_COLUMNS]
    del parts
    # longest first, as innermost_ranges orders them (done here, where the unsorted frame can
    # be let go: one copy of the ranges instead of two alive at once)
    return _longest_first(out)


def _longest_first(ranges: pd.DataFrame) -> pd.DataFrame:
    """`ranges` sorted by duration, longest first (stable), index reset, with `_dur`; as is
    when it is so already."""
    dur = ranges["end_ns"].to_numpy() - ranges["start_ns"].to_numpy()
    if "_dur" in ranges.columns and isinstance(ranges.index, pd.RangeIndex) and ranges.index.start == 0 \
            and ranges.index.step == 1 and (len(dur) < 2 or bool(np.all(dur[1:] <= dur[:-1]))):
        return ranges
    # (the order found on the durations alone, then the rows taken once: assign, sort_values
    # and reset_index each copied the ranges)
    order = pd.Series(dur).sort_values(ascending=False, kind="stable").index.to_numpy()
    ranges = ranges.take(order).reset_index(drop=True)
    ranges["_dur"] = dur[order]
    return ranges


def _launch_arrays(trace: Trace) -> tuple[np.ndarray, pd.api.extensions.ExtensionArray]:
    """Per kernel (by position in trace.kernels): the start of its launch call (float64, NaN
    where no launch call matched) and the calling thread (Int64, NA there), via correlation
    ids. The first runtime row of a (rank, correlation id) is the launch call."""
    k = trace.kernels
    rt = trace.runtime
    n = len(k)
    none = (np.full(n, np.nan), pd.arrays.IntegerArray(np.zeros(n, dtype=np.int64), np.ones(n, dtype=bool)))
    if rt.empty or k["correlation_id"].isna().all():
        return none
    kc, rc = k["correlation_id"], rt["correlation_id"]
    r_ok = rc.notna().to_numpy()
    if not r_ok.any():
        return none
    k_ok = kc.notna().to_numpy()
    # ids and ranks in their stored widths (int32, or one value seen n times: model.constant_view),
    # widened to int64 a chunk at a time below (full-length int64 copies of all four, and the
    # search's temporaries, were the peak of idle.gaps and of Context.kernels' shapes)
    rc_v, kc_v = _stored(rc), _stored(kc)
    r_rank, k_rank = rt["rank"].to_numpy(), k["rank"].to_numpy()
    if _key_fits(kc_v, k_ok, rc_v, r_ok, k_rank, r_rank):
        # one int64 key per (rank, correlation id), looked up in the runtime's keys sorted
        # (stable, so a key's first row comes first; nsys writes them in order already): a hash
        # index and two copies of the runtime frame (dropna, drop_duplicates) were ~60 bytes a
        # call at the peak of a 10M-kernel diagnosis
        r_key = np.empty(len(rc_v), dtype=np.int64)
        for lo in range(0, len(r_key), _KEY_CHUNK):
            sl = slice(lo, lo + _KEY_CHUNK)
            r_key[sl] = np.where(r_ok[sl], r_rank[sl].astype(np.int64) << 40 | rc_v[sl].astype(np.int64), -1)
        del rc_v, r_rank
        order = None if len(r_key) < 2 or bool(np.all(r_key[1:] > r_key[:-1])) else np.argsort(r_key, kind="stable")
        if order is not None:
            r_key = r_key[order]
        pos, found = np.empty(n, dtype=np.int64), np.empty(n, dtype=bool)
        for lo in range(0, n, _KEY_CHUNK):
            sl = slice(lo, lo + _KEY_CHUNK)
            k_key = k_rank[sl].astype(np.int64) << 40 | kc_v[sl].astype(np.int64)
            at = np.minimum(np.searchsorted(r_key, k_key, side="left"), len(r_key) - 1)
            found[sl] = (r_key[at] == k_key) & k_ok[sl]
            pos[sl] = np.where(found[sl], order[at] if order is not None else at, 0)
        del kc_v, k_rank, r_key, k_ok, order
        tid = rt["thread_id"].array.take(pos)
        tid[~found] = pd.NA
        starts, launch = rt["start_ns"].to_numpy(np.int64), np.empty(n)
        for lo in range(0, n, _KEY_CHUNK):  # (the call starts taken, cast and masked a chunk at a time)
            sl = slice(lo, lo + _KEY_CHUNK)
            launch[sl] = np.where(found[sl], starts[pos[sl]].astype(np.float64), np.nan)
        return launch, tid
    merged = _launch_merge(trace)
    return merged["launch_ns"].to_numpy(np.float64, na_value=np.nan), merged["thread_id"].astype("Int64").array


_KEY_CHUNK = 1 << 20  # kernels (runtime calls) per step of _launch_arrays' keys


def _stored(s: pd.Series) -> np.ndarray:
    """A nullable integer column's values in its own width (0 where missing); a column of one
    value stays one value seen n times (no copy)."""
    a = s.array
    data, mask = getattr(a, "_data", None), getattr(a, "_mask", None)
    if data is None:
        return s.to_numpy(np.int64, na_value=0)
    if len(data) > 1 and not data.strides[0] and not mask.strides[0]:
        return data if not mask[0] else np.broadcast_to(np.zeros(1, dtype=data.dtype), data.shape)
    return s.to_numpy(data.dtype, na_value=0)


def _launch_merge(trace: Trace) -> pd.DataFrame:
    """_launch_points by a two-column merge (keys that do not fit one int64)."""
    k, rt = trace.kernels, trace.runtime
    r = rt.dropna(subset=["correlation_id"]).drop_duplicates(["rank", "correlation_id"])
    r = r[["rank", "correlation_id", "thread_id", "start_ns"]].rename(columns={"start_ns": "launch_ns"})
    base = pd.DataFrame({"rank": k["rank"], "correlation_id": k["correlation_id"]}, index=k.index)
    return base.reset_index().merge(r, on=["rank", "correlation_id"], how="left").set_index("index").reindex(k.index)


def _fits_one_key(trace: Trace) -> bool:
    """Whether _launch_arrays joins by one int64 key (else by _launch_merge)."""
    k, rt = trace.kernels, trace.runtime
    if rt.empty or k.empty:
        return True
    kc, rc = k["correlation_id"], rt["correlation_id"]
    return _key_fits(_stored(kc), kc.notna().to_numpy(), _stored(rc), rc.notna().to_numpy(), k["rank"].to_numpy(),
                     rt["rank"].to_numpy())


def _key_fits(kc, k_ok, rc, r_ok, k_rank, r_rank) -> bool:
    """Correlation ids (where set) in 0..2**40 and ranks in 0..2**22: (rank, id) packs into
    one int64. Masked reductions: no copies of the columns."""
    if not k_ok.any() or not r_ok.any():
        return True

    def lo(a, ok):  # (the initial value in the array's own width: ids may be int32)
        return int(np.min(a, where=ok, initial=np.iinfo(a.dtype).max))

    def hi(a, ok):
        return int(np.max(a, where=ok, initial=np.iinfo(a.dtype).min))

    return (lo(kc, k_ok) >= 0 and lo(rc, r_ok) >= 0 and max(hi(kc, k_ok), hi(rc, r_ok)) < 2**40
            and 0 <= int(k_rank.min()) and int(k_rank.max()) < 2**22 and 0 <= int(r_rank.min()) and int(r_rank.max()) < 2**22)


def _launch_points(trace: Trace) -> pd.DataFrame:
    """Host thread and time of each kernel's launch call (via correlation ids); same index
    as trace.kernels, launch_ns NaN where no launch call matched."""
    k = trace.kernels
    if not _fits_one_key(trace):
        return _launch_merge(trace)
    launch, tid = _launch_arrays(trace)
    return pd.DataFrame({"rank": k["rank"], "correlation_id": k["correlation_id"],
                         "thread_id": pd.Series(tid, index=k.index), "launch_ns": launch}, index=k.index)


def _sorted_search(haystack: np.ndarray, needles: np.ndarray, side: str) -> np.ndarray:
    """np.searchsorted with the needles visited in sorted order (ranges come sorted by
    duration, so their times are scattered; sorted keys keep the binary searches in cache:
    0.4 s -> 0.05 s for 300k ranges over 1M launches)."""
    order = np.argsort(needles, kind="stable")
    out = np.empty(len(needles), dtype=np.int64)
    out[order] = np.searchsorted(haystack, needles[order], side=side)
    return out


# Beyond this many (range, launch) pairs the innermost-range search loops range by range
# rather than expanding every pair at once (memory).
_MAX_PAIRS = 20_000_000


def innermost_ranges(trace: Trace, ranges: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """Per kernel (by position in trace.kernels): the row of `ranges` (host ranges with rank,
    thread_id, start_ns, end_ns), innermost first, that encloses the kernel's launch call on
    the same thread, or -1. Returns the ranges as indexed (sorted longest first) and the rows."""
    k = trace.kernels
    n = len(k)
    hit = np.full(n, -1, dtype=np.int64)  # row of `ranges` per kernel, by position
    if not len(ranges) or not n:
        return ranges, hit
    # Longest ranges first so that inner (shorter) ranges win: the highest row number.
    ranges = _longest_first(ranges)
    # the launches with a call and a thread, grouped by (rank, thread) and ordered by launch
    # time within each (stable), over arrays: a frame of them, its copies and group-by held
    # ~4x these at the peak of Context.kernels. (The groups' order does not matter: each
    # writes the maximum of the rows it finds.)
    launch, tid = _launch_arrays(trace)
    pos = np.flatnonzero(~np.isnan(launch) & ~tid.isna())
    if not len(pos):  # no launch call matched a kernel (no runtime table): nothing is inside anything
        return ranges, hit
    t_all = launch[pos]
    del launch
    tid = tid.take(pos).to_numpy(np.int64)
    rank = k["rank"].to_numpy(np.int64)[pos]
    order = np.lexsort((t_all, tid, rank))
    # group bounds compared one key at a time; each group's (rank, thread) read at its start
    change = np.zeros(max(len(order) - 1, 0), dtype=bool)
    for col in (rank, tid):
        sk = col[order]
        change |= sk[1:] != sk[:-1]
        del sk
    starts = np.concatenate([[0], np.flatnonzero(change) + 1])
    del change
    g_rank, g_tid = rank[order[starts]], tid[order[starts]]
    del rank, tid
    pos, t_all = pos[order], t_all[order]
    del order
    for gi, (lo_at, hi_at) in enumerate(zip(starts, np.append(starts[1:], len(pos)))):
        if hi_at <= lo_at:
            continue
        rg = ranges[((ranges["rank"] == g_rank[gi]) & (ranges["thread_id"] == g_tid[gi])).fillna(False).to_numpy(dtype=bool)]
        if rg.empty:
            continue
        t = t_all[lo_at:hi_at]
        idx = pos[lo_at:hi_at]
        lo = _sorted_search(t, rg["start_ns"].to_numpy(dtype=np.float64), "left")
        hi = _sorted_search(t, rg["end_ns"].to_numpy(dtype=np.float64), "right")
        rows = rg.index.to_numpy()
        lens = np.maximum(hi - lo, 0)
        if int(lens.sum()) <= _MAX_PAIRS:
            keep = lens > 0
            lens, lo, rows = lens[keep], lo[keep], rows[keep]
            first = np.repeat(np.cumsum(lens) - lens, lens)
            launch = np.repeat(lo, lens) + (np.arange(int(lens.sum())) - first)
            np.maximum.at(hit, idx[launch], np.repeat(rows, lens))
        else:
            for ri, a, b in zip(rows, lo, hi):
                if b > a:
                    hit[idx[a:b]] = np.maximum(hit[idx[a:b]], ri)
    return ranges, hit


def assign_shapes(trace: Trace) -> pd.DataFrame:
    """Per kernel: M, N, K, batch, dtype, op, shape_source and lead (leading_dims, where the
    range recorded strides) from the innermost enclosing range."""
    k = trace.kernels
    n = len(k)
    ranges, hit = innermost_ranges(trace, _shape_ranges(trace) if n else pd.DataFrame())
    has = hit >= 0
    take = np.where(has, hit, 0)

    def ints(col: str) -> pd.arrays.IntegerArray:
        # extents are 1..2**31-1 (_plausible): Int32, 5 bytes a kernel instead of 9
        values = ranges[col].to_numpy(dtype=np.int64) if has.any() else np.zeros(1, dtype=np.int64)
        dtype = np.int32 if int(values.min(initial=0)) >= -(2**31) and int(values.max(initial=0)) < 2**31 else np.int64
        return pd.arrays.IntegerArray(values.astype(dtype)[take], ~has)

    def texts(col: str, category: bool = False):
        # the ranges' few distinct texts, spread by code (an isna per kernel cost ~0.1 s a
        # column at 2M events); `category`: as a categorical of them (1 byte a kernel instead
        # of an 8-byte pointer: op and shape_source, which symptoms only compare)
        if has.any():
            codes, uniques = pd.factorize(ranges[col].to_numpy(dtype=object), use_na_sentinel=True)
            at = np.where(has, codes[take], -1)
        else:
            uniques, at = np.empty(0, dtype=object), np.full(n, -1, dtype=np.int8)
        if category:
            return pd.Categorical.from_codes(at, categories=list(uniques))
        table = np.append(np.asarray(uniques, dtype=object), pd.NA)  # code -1 -> NA
        return string_array(table[at])

    return pd.DataFrame(
        {"M": ints("M"), "N": ints("N"), "K": ints("K"), "batch": ints("batch"),
         "dtype": texts("dtype"), "op": texts("op", True), "shape_source": texts("source", True),
         "lead": texts("lead", True)},
        index=k.index,
    )


def _apply_overrides(out: pd.DataFrame, uniq: pd.Series, codes: np.ndarray, overrides) -> pd.Series:
    """Write the user's --shape overrides (pattern, shape) onto the kernels whose names match
    (re.search; the first matching override wins). Returns the mask of kernels overridden."""
    hit = np.zeros(len(out), dtype=bool)
    for pattern, shape in overrides:
        names = uniq.str.slice(0, 4096).str.contains(pattern, regex=True).to_numpy(dtype=bool)
        mask = names[codes] & ~hit
        if not mask.any():
            continue
        for col in ("M", "N", "K", "batch"):
            out.loc[mask, col] = shape[col]
        for col, key in (("dtype", "dtype"), ("op", "op"), ("shape_source", "source")):
            value = shape[key] if shape[key] is not None else pd.NA
            if isinstance(out[col].dtype, pd.CategoricalDtype) and value is not pd.NA \
                    and value not in out[col].cat.categories:
                out[col] = out[col].cat.add_categories([value])
            out.loc[mask, col] = value
        out.loc[mask, "lead"] = pd.NA  # the user's shape says nothing of the operands' layout
        hit |= mask
    return pd.Series(hit, index=out.index)


def gemm_table(trace: Trace, overrides: list[tuple[str, dict]] | None = None) -> pd.DataFrame:
    """Per kernel (same index as trace.kernels): is_gemm, is_comm, is_split_k, is_ws,
    tile_m/n/k, M, N, K, batch, dtype, op, shape_source, lead (leading_dims or NA), tiles
    (output tiles when both shape and tile are known, else NA). `overrides`: the user's (kernel pattern, shape) pairs."""
    k = trace.kernels
    # Name facts are computed once per distinct name and spread to the kernels by their
    # factorized code (`_name_code`, -1 for a missing name, which counts as "").
    name_codes, uniques = factorize(k["name"])
    uniq = pd.Series(np.append(np.asarray(uniques, dtype=object), ""), dtype=object).astype(str)
    codes = np.where(name_codes >= 0, name_codes, len(uniq) - 1)
    helper = uniq.str.contains(_NOT_GEMM)
    flags = pd.DataFrame(
        {
            "is_comm": uniq.str.contains(_COMM),
            "is_gemm_name": uniq.str.contains(_GEMM) & ~helper,
            "is_split_k": uniq.str.contains(_SPLIT_K),
            "is_ws": uniq.str.contains(_WS),
        }
    )
    tiles = uniq.map(tile_from_name)
    # Int32 where the values fit (tile_m/n are 8..1024; tile_k is whatever the name says):
    # 5 bytes a kernel instead of 9 (docs/scale.md)
    flags["tile_m"] = narrow_ints(pd.array([t[0] if t else pd.NA for t in tiles], dtype="Int64"))
    flags["tile_n"] = narrow_ints(pd.array([t[1] if t else pd.NA for t in tiles], dtype="Int64"))
    flags["tile_k"] = narrow_ints(pd.array([t[2] if t and t[2] else pd.NA for t in tiles], dtype="Int64"))
    # the shapes first: the name facts spread per kernel (~20 bytes a kernel) need not be
    # alive at assign_shapes' peak
    shapes = assign_shapes(trace)
    per = flags.iloc[codes].set_axis(k.index)
    out = pd.concat([per, shapes], axis=1)
    del per, shapes
    # A free-form label (a user's range around a layer) names a GEMM only for kernels whose
    # names say GEMM; the others in the range keep no shape.
    free = (out["shape_source"] == "nvtx-text").fillna(False).to_numpy(dtype=bool) & ~out["is_gemm_name"].to_numpy(dtype=bool)
    if free.any():
        for col in ("M", "N", "K", "batch", "dtype", "op", "shape_source", "lead"):
            out.loc[free, col] = pd.NA
    user = _apply_overrides(out, uniq, codes, overrides or [])
    # A kernel launched inside a GEMM operator's range is a GEMM even when its name says
    # nothing (a Triton kernel called "kernel_0"), unless it is communication or a helper;
    # so is one the user gave a shape with --shape.
    named_helper = pd.Series(helper.to_numpy(dtype=bool)[codes], index=k.index)
    out["is_gemm"] = ((out["is_gemm_name"] | (out["M"].notna() & ~named_helper)) & ~out["is_comm"]) | user
    out["_name_code"] = small_ints(name_codes)
    column_major = pd.Series(uniq.str.contains(_COLUMN_MAJOR).to_numpy(dtype=bool)[codes], index=k.index)
    out["tile_m"], out["tile_n"] = orient_tiles(out, k["grid_blocks"], column_major)
    out["tiles"] = narrow_ints(_tile_count_known(out, out["tile_m"], out["tile_n"]))  # Int32 where they fit
    return out.drop(columns=["is_gemm_name"])


# BLAS libraries that are column-major: cuBLAS/cuBLASLt (nvjet, xmma, the sm*/ampere_* kernels
# and the CUTLASS kernels it ships, cutlass_80_tensorop_*), hipBLASLt/Tensile (Cijk_).
# PyTorch computes its row-major C = A @ B there as C^T = B^T @ A^T, so the first extent of
# the tile in such a kernel's name runs along PyTorch's N, the second along its M.
_COLUMN_MAJOR = re.compile(
    r"nvjet|xmma|^(?:void )?(?:sm\d+|ampere|volta|turing|maxwell)_|cutlass_\d+_(?:tensorop|wmma|simt)|cijk_",
    re.IGNORECASE,
)


def small_ints(values: np.ndarray) -> np.ndarray:
    """Codes and ids as int32 where they fit (4 bytes a kernel instead of 8)."""
    values = np.asarray(values)
    fits = not len(values) or (int(values.min()) >= -(2**31) and int(values.max()) < 2**31)
    return values.astype(np.int32) if fits else values.astype(np.int64)


def narrow_ints(values) -> pd.arrays.IntegerArray:
    """An Int64 array as Int32 when every value fits."""
    values = pd.array(values, dtype="Int64")
    ok = values.dropna()
    if not len(ok) or (int(ok.min()) >= -(2**31) and int(ok.max()) < 2**31):
        return values.astype("Int32")
    return values


def _tile_count(out: pd.DataFrame, tm: pd.Series, tn: pd.Series) -> pd.Series:
    """Output tiles of tm x tn over M x N (x batch); NA where unknown or past int64."""
    # in Int64: the extents and tiles may be Int32, whose products wrap
    tm, tn = tm.astype("Int64"), tn.astype("Int64")
    b = out["batch"].fillna(1).astype("Int64")
    count = -(-out["M"].astype("Int64") // tm) * -(-out["N"].astype("Int64") // tn) * b
    # extents up to 2**31 can multiply past int64 (which wraps silently): unknown instead
    approx = (out["M"].astype("Float64") / tm) * (out["N"].astype("Float64") / tn) * b.astype("Float64")
    return count.astype("Int64").mask((approx >= 2.0**62).fillna(False))


def _known_tiles(out: pd.DataFrame, tm: pd.Series, tn: pd.Series) -> np.ndarray:
    """Positions where M, N and both tile extents are known: elsewhere every tile count is NA.
    The counts' Int64 and Float64 temporaries over every kernel were Context.kernels' peak
    (~40 bytes a kernel each; most kernels have no shape or no named tile)."""
    known = out["M"].notna().to_numpy() & out["N"].notna().to_numpy() & tm.notna().to_numpy() & tn.notna().to_numpy()
    return np.flatnonzero(known)


def _tile_count_known(out: pd.DataFrame, tm: pd.Series, tn: pd.Series) -> pd.arrays.IntegerArray:
    """_tile_count over every row, computed only where it can be known (NA elsewhere)."""
    pos = _known_tiles(out, tm, tn)
    values, mask = np.zeros(len(out), dtype=np.int64), np.ones(len(out), dtype=bool)
    if len(pos):
        sub = _tile_count(out[["M", "N", "batch"]].iloc[pos], tm.iloc[pos], tn.iloc[pos]).array
        values[pos], mask[pos] = sub.to_numpy(np.int64, na_value=0), sub.isna()
    return pd.arrays.IntegerArray(values, mask)


def orient_tiles(out: pd.DataFrame, grid_blocks: pd.Series, column_major: pd.Series) -> tuple[pd.Series, pd.Series]:
    """The named tile's extents along PyTorch's M and N: (tile_m, tile_n) as named, or swapped.

    The launch's grid decides where it can: the orientation whose tile count equals the grid's
    blocks, else the one whose count divides them (split-K, a batch in z), when just one does.
    Otherwise the library's convention: swapped for column-major BLAS kernels (`_COLUMN_MAJOR`),
    as named for the rest (row-major callers: our own and most hand-written kernels). On the
    H200 (workloads/model_step.py traces) cuBLAS ran aten::mm 3072x1024x8192 as
    nvjet_sm90_tst_128x192 on 128 CTAs: ceil(1024/128) x ceil(3072/192), not the 144 tiles of
    128 rows over M that would have made a tail; each of the 7 GEMM shapes there whose grid
    tells the two apart fit the swapped tile (6 by an equal count, a split-K one by a
    multiple), none the named one."""
    tm, tn = out["tile_m"], out["tile_n"]
    swap = column_major.copy()
    # the grid decides only where both counts are known (elsewhere they are NA and `only`
    # is False): computed at those rows alone
    pos = _known_tiles(out, tm, tn)
    if len(pos):
        sub = out[["M", "N", "batch"]].iloc[pos]
        stm, stn = tm.iloc[pos], tn.iloc[pos]
        as_named, swapped = _tile_count(sub, stm, stn), _tile_count(sub, stn, stm)
        g = grid_blocks.iloc[pos].astype("Int64")

        def only(a: pd.Series, b: pd.Series) -> np.ndarray:
            return (a & ~b).fillna(False).astype(bool).to_numpy()

        eq_named, eq_swapped = g == as_named, g == swapped
        div_named, div_swapped = (g % as_named) == 0, (g % swapped) == 0
        sw = swap.to_numpy(dtype=bool)[pos]
        sw[only(div_named, div_swapped)] = False
        sw[only(div_swapped, div_named)] = True
        sw[only(eq_named, eq_swapped)] = False
        sw[only(eq_swapped, eq_named)] = True
        swap = swap.to_numpy(dtype=bool, copy=True)
        swap[pos] = sw
        swap = pd.Series(swap, index=tm.index)
    return tm.where(~swap, tn), tn.where(~swap, tm)
