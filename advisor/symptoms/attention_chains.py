"""Attention computed op by op, found from the host ops that launched it: one score matmul
(q [..., L, D] @ k^T), a softmax over its [..., L, S] output and an output matmul
([..., L, S] @ v) on one thread, outside `scaled_dot_product_attention`; and their backward
(`_softmax_backward_data` between the gradient matmuls). Kineto cpu_ops with Input Dims and
emit_nvtx ranges with sizes. Used by unfused_attention (the finding) and by the rules that
leave these kernels to it (misaligned_gemm, tensor_cores_unused, the Tier-4 schedules through
kernel_kinds.schedule_excluded); it imports none of them.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..basics import input_dims, input_dtypes, op_base
from .context import Context
from .gemm import _extract_sizes, _launch_points
from .strings import contains, factorize

_MATMUL = {"matmul", "bmm", "baddbmm"}
_SOFTMAX = {"softmax", "_softmax", "_safe_softmax"}
# host ranges worth parsing: the three ops above and SDPA (whose own math path is not ours)
_OPS = r"^(?:aten::)?(?:matmul|bmm|baddbmm|_?softmax|_safe_softmax|_softmax_backward_data|scaled_dot_product_attention|_scaled_dot_product)\b"
_SOFTMAX_OP = r"^(?:aten::)?(?:_?softmax|_safe_softmax)\b"
_SDPA = "scaled_dot_product"
# extents beyond these are not a real attention (hostile or corrupt Input Dims)
_MAX_EXTENT = 2**31 - 1
_MAX_SCORES = 2**48
_COLS = ["rank", "thread_id", "start_ns", "end_ns", "op", "dims", "dtype"]
# small matmuls looked past, before a softmax, for its score GEMM
_LOOK = 8


def _host_ops(ctx: Context) -> pd.DataFrame:
    """The matmul, softmax and SDPA ranges of the trace with their input dims: Kineto cpu_ops
    (Input Dims, Input type) and emit_nvtx ranges (`sizes = [...]`, no dtype)."""
    parts = []
    ops = ctx.trace.cpu_ops
    nv = ctx.trace.nvtx
    # nothing to parse without a softmax: most traces (and the huge ones) stop here
    has_ops = len(ops) > 0 and "input_dims" in ops.columns and bool(contains(ops["name"], _SOFTMAX_OP).any())
    has_nv = len(nv) > 0 and "thread_id" in nv.columns and bool(contains(nv["text"], _SOFTMAX_OP).any())
    if has_ops:
        sub = ops[contains(ops["name"], _OPS).to_numpy()]
        if len(sub):
            types = sub["input_types"] if "input_types" in sub.columns else pd.Series([None] * len(sub), index=sub.index)
            parts.append(pd.DataFrame({
                "rank": sub["rank"].to_numpy(), "thread_id": sub["thread_id"].array,
                "start_ns": sub["start_ns"].to_numpy(), "end_ns": sub["end_ns"].to_numpy(),
                "op": [op_base(str(n)) for n in sub["name"]],
                "dims": [input_dims(d) for d in sub["input_dims"]],
                "dtype": [next((d for d in input_dtypes(t) if d), None) for t in types],
            }))
    if has_nv:
        sub = nv[contains(nv["text"], _OPS).to_numpy()]
        if len(sub):
            texts = sub["text"].astype(str)
            parts.append(pd.DataFrame({
                "rank": sub["rank"].to_numpy(), "thread_id": sub["thread_id"].array,
                "start_ns": sub["start_ns"].to_numpy(), "end_ns": sub["end_ns"].to_numpy(),
                "op": [op_base(t.split(",", 1)[0]) for t in texts],
                "dims": [_extract_sizes(t) for t in texts],
                "dtype": [None] * len(sub),
            }))
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=_COLS)
    out = pd.concat(parts, ignore_index=True)
    return out[out["start_ns"].notna() & out["end_ns"].notna()].reset_index(drop=True)


def _tensor(d) -> list[int] | None:
    ok = isinstance(d, list) and 2 <= len(d) <= 8 and all(
        isinstance(x, int) and not isinstance(x, bool) and 0 < x <= _MAX_EXTENT for x in d)
    return d if ok and math.prod(d) <= _MAX_SCORES else None


def _batch(d: list[int]) -> int:
    return math.prod(d[:-2])


def _operands(dims, strip_added: bool) -> tuple[list[int], list[int]] | None:
    """The two operands a @ b of a matmul's input dims (a baddbmm's added term first dropped
    where `strip_added`), when their inner dimensions agree, else None."""
    ts = [t for t in (_tensor(d) for d in dims) if t is not None] if isinstance(dims, list) else []
    if strip_added and len(ts) == 3:
        ts = ts[1:]
    if len(ts) != 2 or ts[0][-1] != ts[1][-2]:
        return None
    return ts[0], ts[1]


def _product(dims) -> int:
    """Elements of a matmul's product (0 where its operands do not read as a @ b)."""
    ab = _operands(dims, strip_added=True)
    return 0 if ab is None else max(_batch(ab[0]), _batch(ab[1])) * ab[0][-2] * ab[1][-1]


def _qk(op: str, dims) -> tuple[int, int, int, int] | None:
    """(batch, L, S, D) of a score GEMM q [..., L, D] @ k^T [..., D, S], else None."""
    ab = _operands(dims, strip_added=op == "baddbmm")
    if ab is None or len(ab[0]) < 3:
        return None
    a, b = ab
    return max(_batch(a), _batch(b)), a[-2], b[-1], a[-1]


def _pv(dims) -> tuple[int, int, int, int] | None:
    """(batch, L, S, Dv) of p [..., L, S] @ v [..., S, Dv], else None."""
    ab = _operands(dims, strip_added=False)
    if ab is None or len(ab[0]) < 3:
        return None
    a, b = ab
    return max(_batch(a), _batch(b)), a[-2], a[-1], b[-1]


def find_chains(ctx: Context) -> pd.DataFrame:
    """One row per op-by-op attention: rank, thread_id, start_ns, end_ns (the score GEMM's start
    to the output GEMM's end), BH, L, S, D, Dv, dtype. Cached per diagnosis."""
    key = "unfused_attention.chains"
    if key in ctx.cache:
        return ctx.cache[key]
    cols = ["rank", "thread_id", "start_ns", "end_ns", "BH", "L", "S", "D", "Dv", "dtype", "kind"]
    ops = _host_ops(ctx)
    rows = []
    if len(ops):
        codes, _ = factorize(ops["thread_id"].astype(str))
        ops = ops.assign(_t=codes)
        for (rank, _t), g in ops.groupby(["rank", "_t"], sort=False):
            g = g.sort_values("start_ns", kind="stable")
            st, en = g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)
            opn = g["op"].to_numpy(dtype=object)
            dims, dts = g["dims"].to_numpy(dtype=object), g["dtype"].to_numpy(dtype=object)
            is_mm = np.array([o in _MATMUL for o in opn], dtype=bool)
            # SDPA ranges by start, with the running maximum of their ends: a softmax lies
            # inside one iff some range starting at or before it ends at or after it
            sd = np.flatnonzero([_SDPA in o for o in opn])
            sd_start = st[sd]
            sd_end_max = np.maximum.accumulate(en[sd]) if len(sd) else en[sd]
            mm_idx = np.flatnonzero(is_mm)
            mm_end_order = mm_idx[np.argsort(en[mm_idx], kind="stable")]
            mm_start_order = mm_idx[np.argsort(st[mm_idx], kind="stable")]
            mm_ends, mm_starts = en[mm_end_order], st[mm_start_order]  # sorted once a thread
            for i in np.flatnonzero([o in _SOFTMAX for o in opn]):
                h = np.searchsorted(sd_start, st[i], side="right") - 1
                if h >= 0 and sd_end_max[h] >= en[i]:
                    continue  # SDPA's own math path: dtype_churn's sdpa_backend, not this
                sm = _tensor((dims[i] or [None])[0]) if isinstance(dims[i], list) and dims[i] else None
                if sm is None or len(sm) < 3:
                    continue
                want = (_batch(sm), sm[-2], sm[-1])
                # the score GEMM: the last matmul to end before the softmax began whose product is
                # the softmax's [..., L, S] (an outer aten::matmul ends after the bmm inside it, so
                # it is the one taken). Small GEMMs in between (a decomposed relative position's
                # einsums, 1/kw of the scores: 1/14 in ViTDet's windows, 1/64 in its global layers)
                # are passed over, at most _LOOK; one of a quarter of the scores or more (DeBERTa's
                # and XLNet's position scores, 1-2x) ends the search: those GEMMs stay after
                # fusion, and the estimate would count them as gained
                j = np.searchsorted(mm_ends, st[i], side="right") - 1
                q = None
                for x in range(j, max(-1, j - _LOOK), -1):
                    cand = mm_end_order[x]
                    r = _qk(opn[cand], dims[cand])
                    if r is not None and (r[0], r[1], r[2]) == want:
                        q = cand
                        break
                    if _product(dims[cand]) * 4 >= want[0] * want[1] * want[2]:
                        break
                # the output GEMM: the first matmul to begin after the softmax ended
                k = np.searchsorted(mm_starts, en[i], side="left")
                if q is None or k >= len(mm_start_order) or want[2] < 2:
                    continue
                p = mm_start_order[k]
                qk, pv = _qk(opn[q], dims[q]), _pv(dims[p])
                if pv is None or (pv[0], pv[1], pv[2]) != want:
                    continue
                bh, L, S, D = qk
                dtype = dts[q] or dts[i] or dts[p]
                rows.append((int(rank), g["thread_id"].iloc[0], int(st[q]), int(en[p]), bh, L, S, D, pv[3], dtype, "fwd"))
            rows += _backward_chains(int(rank), g["thread_id"].iloc[0], st, en, opn, dims, dts,
                                     mm_end_order, mm_start_order, mm_ends, mm_starts)
    out = pd.DataFrame(rows, columns=cols).drop_duplicates(["rank", "thread_id", "start_ns"], keep="first")
    # a backward is attention's only where the same rank ran a forward chain of its shape (SDPA's
    # own math backward has the same ops: its forward ran inside scaled_dot_product_attention)
    fwd = out[out["kind"] == "fwd"]
    known = set(zip(fwd["rank"], fwd["BH"], fwd["L"], fwd["S"]))
    keep = [k == "fwd" or (r, b, l_, s_) in known for k, r, b, l_, s_ in
            zip(out["kind"], out["rank"], out["BH"], out["L"], out["S"])]
    out = out[np.asarray(keep, dtype=bool)].reset_index(drop=True)
    ctx.cache[key] = out
    return out


def _touches(dims, bh: int, L: int, S: int) -> bool:
    """Whether a matmul's operands or product include a [bh, L, S] or [bh, S, L] tensor."""
    ab = _operands(dims, strip_added=True)
    if ab is None:
        return False
    prod = [*ab[0][:-1], ab[1][-1]]
    return any(_batch(t) == bh and tuple(t[-2:]) in ((L, S), (S, L)) for t in (*ab, prod))


def _backward_chains(rank, thread, st, en, opn, dims, dts, mm_end_order, mm_start_order,
                     mm_ends, mm_starts) -> list[tuple]:
    """The backward of op-by-op attention on one thread: around each `_softmax_backward_data`
    over [..., L, S], the two matmuls before it (the output GEMM's gradients: dP = dO V^T and
    dV = P^T dO) and the two after it (the score GEMM's: dQ = dS K, dK = dS^T Q), each touching
    an [L, S] tensor. Rows as find_chains', kind "bwd", D and Dv 0 (the forward group's are used)."""
    out = []
    for i in np.flatnonzero([o == "_softmax_backward_data" for o in opn]):
        d = _tensor((dims[i] or [None])[0]) if isinstance(dims[i], list) and dims[i] else None
        if d is None or len(d) < 3:
            continue
        bh, L, S = _batch(d), d[-2], d[-1]
        j = np.searchsorted(mm_ends, st[i], side="right")
        k = np.searchsorted(mm_starts, en[i], side="left")
        before, after = mm_end_order[max(0, j - 2):j], mm_start_order[k:k + 2]
        if len(before) < 2 or len(after) < 2:
            continue
        if not all(_touches(dims[m], bh, L, S) for m in (*before, *after)):
            continue
        dtype = next((dts[m] for m in (*before, *after) if dts[m]), None) or dts[i]
        lo, hi = min(int(st[m]) for m in (*before, *after)), max(int(en[m]) for m in (*before, *after))
        out.append((rank, thread, lo, hi, bh, L, S, 0, 0, dtype, "bwd"))
    return out


def chain_kernels(ctx: Context) -> np.ndarray:
    """Per kernel (by position in trace.kernels): the row of find_chains() whose window holds
    its launch call on the same thread, else -1. Cached."""
    key = "unfused_attention.kernels"
    if key in ctx.cache:
        return ctx.cache[key]
    chains = find_chains(ctx)
    k = ctx.trace.kernels
    # int32 row numbers where they fit: the cache is kept for the whole diagnosis (4 bytes a kernel)
    hit = np.full(len(k), -1, dtype=np.int32 if len(chains) < 2**31 else np.int64)
    if len(chains) and len(k):
        lp = _launch_points(ctx.trace)
        t = lp["launch_ns"].to_numpy(np.float64)
        tid = lp["thread_id"].astype(str).to_numpy(dtype=object)
        rank = lp["rank"].to_numpy()
        for (r, th), c in chains.groupby(["rank", chains["thread_id"].astype(str)], sort=False):
            on = np.flatnonzero((rank == r) & (tid == th) & ~np.isnan(t))
            if not len(on):
                continue
            order = on[np.argsort(t[on], kind="stable")]
            ts = t[order]
            lo = np.searchsorted(ts, c["start_ns"].to_numpy(np.float64), side="left")
            hi = np.searchsorted(ts, c["end_ns"].to_numpy(np.float64), side="right")
            for row, a, b in zip(c.index.to_numpy(), lo, hi):
                hit[order[a:b]] = row
    ctx.cache[key] = hit
    return hit
