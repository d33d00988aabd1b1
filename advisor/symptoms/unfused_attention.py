"""unfused_attention: attention computed op by op (matmul, softmax, matmul) instead of one fused kernel (Tier 3).

What it detects: on one host thread, a softmax operator over [..., L, S] scores between the
matmul that made them (q [..., L, D] @ k^T [..., D, S]: `matmul`, `bmm`, `baddbmm`) and the
matmul that consumes them ([..., L, S] @ v [..., S, Dv]), not inside a
`scaled_dot_product_attention` call, from Kineto cpu_ops with Input Dims or emit_nvtx ranges
with sizes. Every kernel the thread launched from the first matmul's start to the second's end
is the chain's (the scale, mask or bias add, casts and dropout between them too). Forward chains
only: the backward pass of the same attention gains as well and is not counted.
Why it matters: the scores ([..., L, S]) go to memory and back three to five times, and with
short or odd lengths (Swin's 7 x 7 = 49-token windows, 32-wide heads) the GEMMs fall back to
kernels for misaligned operands; a fused kernel (FlashAttention, memory-efficient, cuDNN)
keeps the scores on chip.
What to do: `torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias,
dropout_p=p, is_causal=...)`; in Hugging Face `transformers`, `attn_implementation="sdpa"`
where the model supports it; in timm, the layer's `fused_attn` (Swin's is off by default).
Estimate per shape group: the chains' kernel time minus the larger of (a) the roofline of
one fused kernel (both GEMMs' FLOPs at the measured peak for the dtype, q, k, v and the output
moved once at the measured bandwidth, a launch's latency each) and (b) the chains' time over
the speedup SDPA measured over the same op-by-op attention on the nearest measured shape
(rules/measured/<gpu>.toml [[attention_fusion]], bench/bench_attention_fusion.py); without a
measurement near the shape, the roofline alone at low confidence.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..basics import DTYPE_ALIASES, input_dims, input_dtypes, op_base
from ..findings import Finding
from ..rules import Rule
from .calibration import attention_fusion_ratio, measured_bandwidth, peak_flops
from .context import ELEMENT_BYTES, Context, as_int, finding_for
from .gemm import _extract_sizes, _launch_points
from .strings import contains, factorize

SYMPTOM = "unfused_attention"
REQUIRES = (("kernels", "name", "Does the trace name its kernels?"),)

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


def _qk(op: str, dims) -> tuple[int, int, int, int] | None:
    """(batch, L, S, D) of a score GEMM q [..., L, D] @ k^T [..., D, S], else None."""
    if not isinstance(dims, list):
        return None
    ts = [t for t in (_tensor(d) for d in dims) if t is not None]
    if op == "baddbmm" and len(ts) == 3:
        ts = ts[1:]
    if len(ts) != 2:
        return None
    a, b = ts
    if a[-1] != b[-2] or len(a) < 3:
        return None
    return max(_batch(a), _batch(b)), a[-2], b[-1], a[-1]


def _pv(dims) -> tuple[int, int, int, int] | None:
    """(batch, L, S, Dv) of p [..., L, S] @ v [..., S, Dv], else None."""
    ts = [t for t in (_tensor(d) for d in dims or []) if t is not None] if isinstance(dims, list) else []
    if len(ts) != 2:
        return None
    a, b = ts
    if a[-1] != b[-2] or len(a) < 3:
        return None
    return max(_batch(a), _batch(b)), a[-2], a[-1], b[-1]


def find_chains(ctx: Context) -> pd.DataFrame:
    """One row per op-by-op attention: rank, thread_id, start_ns, end_ns (the score GEMM's start
    to the output GEMM's end), BH, L, S, D, Dv, dtype. Cached per diagnosis."""
    key = "unfused_attention.chains"
    if key in ctx.cache:
        return ctx.cache[key]
    cols = ["rank", "thread_id", "start_ns", "end_ns", "BH", "L", "S", "D", "Dv", "dtype"]
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
            for i in np.flatnonzero([o in _SOFTMAX for o in opn]):
                h = np.searchsorted(sd_start, st[i], side="right") - 1
                if h >= 0 and sd_end_max[h] >= en[i]:
                    continue  # SDPA's own math path: dtype_churn's sdpa_backend, not this
                sm = _tensor((dims[i] or [None])[0]) if isinstance(dims[i], list) and dims[i] else None
                if sm is None or len(sm) < 3:
                    continue
                # the score GEMM: the matmul that ended last before the softmax began (an outer
                # aten::matmul ends after the bmm inside it, so it is the one taken)
                j = np.searchsorted(en[mm_end_order], st[i], side="right") - 1
                # the output GEMM: the matmul that began first after the softmax ended
                k = np.searchsorted(st[mm_start_order], en[i], side="left")
                if j < 0 or k >= len(mm_start_order):
                    continue
                q, p = mm_end_order[j], mm_start_order[k]
                qk, pv = _qk(opn[q], dims[q]), _pv(dims[p])
                if qk is None or pv is None:
                    continue
                bh, L, S, D = qk
                if (pv[0], pv[1], pv[2]) != (bh, L, S) or (_batch(sm), sm[-2], sm[-1]) != (bh, L, S) or S < 2:
                    continue
                dtype = dts[q] or dts[i] or dts[p]
                rows.append((int(rank), g["thread_id"].iloc[0], int(st[q]), int(en[p]), bh, L, S, D, pv[3], dtype))
    out = pd.DataFrame(rows, columns=cols).drop_duplicates(["rank", "thread_id", "start_ns"], keep="first")
    ctx.cache[key] = out
    ctx.cache["unfused_attention.backward"] = _backward_shapes(ops)
    return out


def _backward_shapes(ops: pd.DataFrame) -> dict:
    """{(rank, BH, L, S): count} of softmax backward ops (`_softmax_backward_data` over
    [..., L, S]) outside SDPA: the backward of op-by-op attention in a training step."""
    out: dict = {}
    if ops.empty:
        return out
    for r in ops[ops["op"] == "_softmax_backward_data"].itertuples():
        d = _tensor((r.dims or [None])[0]) if isinstance(r.dims, list) and r.dims else None
        if d is not None and len(d) >= 3:
            k = (int(r.rank), _batch(d), d[-2], d[-1])
            out[k] = out.get(k, 0) + 1
    return out


def chain_kernels(ctx: Context) -> np.ndarray:
    """Per kernel (by position in trace.kernels): the row of find_chains() whose window holds
    its launch call on the same thread, else -1. Cached."""
    key = "unfused_attention.kernels"
    if key in ctx.cache:
        return ctx.cache[key]
    chains = find_chains(ctx)
    k = ctx.trace.kernels
    hit = np.full(len(k), -1, dtype=np.int64)
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


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    """Per (rank, device, BH, L, S, D, Dv, dtype): chains, their kernels' launches and time,
    and the kernel that took the most of it."""
    cols = ["rank", "device_id", "BH", "L", "S", "D", "Dv", "dtype", "chains", "launches", "total_ns",
            "name", "top_ns", "kernel_names"]
    chains = find_chains(ctx)
    if chains.empty:
        return pd.DataFrame(columns=cols)
    hit = chain_kernels(ctx)
    k = ctx.trace.kernels
    at = np.flatnonzero(hit >= 0)
    if not len(at):
        return pd.DataFrame(columns=cols)
    sub = pd.DataFrame({
        "chain": hit[at], "device_id": k["device_id"].to_numpy()[at], "dur_ns": k["dur_ns"].to_numpy(np.int64)[at],
        "name": k["name"].to_numpy(dtype=object)[at],
    })
    c = chains.loc[sub["chain"].to_numpy()].reset_index(drop=True)
    sub = pd.concat([sub, c[["rank", "BH", "L", "S", "D", "Dv", "dtype"]]], axis=1)
    sub["dtype"] = sub["dtype"].fillna("")
    sub["device_id"] = sub["device_id"].fillna(-1)
    out = []
    keys = ["rank", "device_id", "BH", "L", "S", "D", "Dv", "dtype"]
    for key, g in sub.groupby(keys, sort=False):
        per_name = g.groupby("name", sort=False)["dur_ns"].sum().sort_values(ascending=False, kind="stable")
        out.append({**dict(zip(keys, key)), "chains": int(g["chain"].nunique()), "launches": len(g),
                    "total_ns": int(g["dur_ns"].sum()), "name": str(per_name.index[0]),
                    "top_ns": int(per_name.iloc[0]), "kernel_names": int(len(per_name))})
    return pd.DataFrame(out, columns=cols).sort_values("total_ns", ascending=False, kind="stable").reset_index(drop=True)


def fused_floor_ns(BH: int, L: int, S: int, D: int, Dv: int, dtype: str | None, device: dict | None,
                   latency_ns: float) -> tuple[float, str]:
    """The fastest one fused attention forward over these shapes can run: both GEMMs' FLOPs
    at the dtype's measured peak, q, k, v and the output moved once at the measured bandwidth,
    at least one launch's latency; and the basis in words."""
    dt = dtype or "bf16"
    elt = ELEMENT_BYTES.get(dt, 2)
    flop = 2.0 * BH * L * S * (D + Dv)
    nbytes = float(elt) * BH * (L * D + S * D + S * Dv + L * Dv)
    rate, rate_src = peak_flops(device or {}, "tf32" if dt == "fp32" else dt)
    bw = measured_bandwidth(device or {})
    compute = flop / rate * 1e9 if rate else 0.0
    memory = nbytes / bw * 1e9 if bw else 0.0
    floor = max(compute, memory, latency_ns)
    basis = (f"{flop / 1e9:.2f} GFLOP at {rate / 1e12:.0f} TFLOP/s ({rate_src})" if rate else "no FLOP rate known") + \
        (f", {nbytes / 1e6:.2f} MB at {bw / 1e12:.2f} TB/s" if bw else "")
    return floor, basis


def _group_estimate(row: dict, rule: Rule, device: dict | None, dtype: str | None) -> tuple[float, str, str, float | None]:
    """(what the group's chains would take fused, confidence, basis, measured speedup or None)
    for one shape group: never under the fused kernel's roofline, never more gain than SDPA
    measured over op-by-op attention near the shape."""
    chains = int(row["chains"])
    total = float(row["total_ns"])
    BH, L, S, D, Dv = (int(row[c]) for c in ("BH", "L", "S", "D", "Dv"))
    floor1, floor_basis = fused_floor_ns(BH, L, S, D, Dv, dtype, device, float(rule["latency_floor_ns"]))
    floor = floor1 * chains
    measured = attention_fusion_ratio(device, {"L": L, "S": S, "D": D, "dtype": dtype}, float(rule["near_factor"]))
    if measured is None:
        return total, "low", "SDPA was not measured on a shape this small or near it: no gain claimed", None
    ratio, src, how = measured
    where = {"exact": "on this shape", "near": "on the nearest measured shapes (the smallest ratio)",
             "below": "on the largest measured shape with fewer scores (L x S)"}[how]
    confidence = {"exact": "high", "near": "medium", "below": "low"}[how]
    return max(floor, total / ratio), confidence, (
        f"the chains' kernel time over the {ratio:.2f}x SDPA measured over the same op-by-op attention {where} "
        f"({src}); never under one fused kernel's roofline a chain: {floor_basis}"), ratio


def _note_no_gain(ctx: Context, rank, dev, groups: list[dict], launches: int, chains: int) -> None:
    """Op-by-op attention where fused kernels measured no faster: a result, said once."""
    top = groups[0]
    sp = [g["measured_speedup"] for g in groups if g["measured_speedup"] is not None]
    span = f"{min(sp):.2f}x" if sp and min(sp) == max(sp) else (f"{min(sp):.2f}-{max(sp):.2f}x" if sp else "")
    measured = (f"SDPA measured {span} the op-by-op speed near these shapes" if sp
                else "SDPA was not measured on shapes this small")
    ctx.notes.append(
        f"Attention is computed op by op on rank {rank} (device {dev}): {chains} chains of ~{launches / max(chains, 1):.0f} "
        f"kernels (L={top['query_len']} S={top['key_len']} D={top['head_dim']}, {top['dtype']}); {measured}, so fused "
        "attention saves no GPU time here; where the step waits on the host it still removes most of each chain's "
        "launches (measure the step)")


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    """One finding per (rank, device): one code change (the attention layer) serves every shape
    group; each group's estimate is bounded on its own and the confidence is the weakest."""
    out = []
    if ev.empty:
        return out
    for (rank, dev), grp in ev.groupby(["rank", "device_id"], sort=False):
        rank, dev = as_int(rank), as_int(dev)
        dev = None if dev == -1 else dev
        device = ctx.device_row(rank, dev)
        groups, total, bound, launches, chains = [], 0.0, 0.0, 0, 0
        confidence, basis, best = "low", "", -1.0
        for row in grp.to_dict("records"):
            dtype = DTYPE_ALIASES.get(str(row["dtype"]).lower()) if row["dtype"] else None
            b, conf, why, ratio = _group_estimate(row, rule, device, dtype)
            total += float(row["total_ns"])
            bound += b
            launches += int(row["launches"])
            chains += int(row["chains"])
            if float(row["total_ns"]) - b > best:  # the group that claims the most speaks for the finding
                best, confidence, basis = float(row["total_ns"]) - b, conf, why
            groups.append({"batch_heads": int(row["BH"]), "query_len": int(row["L"]), "key_len": int(row["S"]),
                           "head_dim": int(row["D"]), "value_dim": int(row["Dv"]), "dtype": dtype or "unknown",
                           "chains": int(row["chains"]), "kernel_ns": int(row["total_ns"]), "bound_ns": int(b),
                           "confidence": conf, "measured_speedup": ratio})
        bwd = ctx.cache.get("unfused_attention.backward", {})
        backward = sum(bwd.get((rank, g["batch_heads"], g["query_len"], g["key_len"]), 0) for g in groups)
        savings = total - bound
        share = ctx.share(rank, dev, total)
        if share < rule["min_share"]:
            continue
        if savings < rule["min_savings_ns"]:
            _note_no_gain(ctx, rank, dev, groups, launches, chains)
            continue
        top = grp.iloc[0]
        dtype = DTYPE_ALIASES.get(str(top["dtype"]).lower()) if top["dtype"] else None
        L, S, D = int(top["L"]), int(top["S"]), int(top["D"])
        out.append(finding_for(
            rule, {"rank": rank, "device_id": dev, "launches": launches, "total_ns": int(total)},
            kernel=f"{chains} attention chains of ~{launches / max(chains, 1):.0f} kernels (L={L} S={S} D={D}), "
                   f"most time in {top['name']}",
            rank=rank, device_id=dev, shape={"M": L, "N": S, "K": D, "batch": int(top["BH"]), "dtype": dtype},
            grid=None, block=None, est_savings_ns=int(max(savings, 0)), confidence=confidence,
            evidence={
                "chains": chains,
                "kernels_per_chain": round(launches / max(chains, 1), 1),
                "shape_groups": len(groups),
                "groups": groups[:8],
                "top_kernel": str(top["name"]),
                "top_kernel_ns": int(top["top_ns"]),
                "share_of_gpu_time": round(share, 4),
                "backward_chains": backward,
                "bound_ns": int(bound),
                "basis": ("forward chains only" + (f" ({backward} softmax backward ops of these shapes: the "
                          "backward pass gains too, not counted)" if backward else "") + ": ") + basis + (f" (the largest claim of {len(groups)} shape groups, each bounded so)"
                                  if len(groups) > 1 else ""),
            },
            suggestion={"fix": "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, "
                               "dropout_p=p if training else 0.0)"},
            tier=3,
            savings_unit="gpu",
        ))
    return out
