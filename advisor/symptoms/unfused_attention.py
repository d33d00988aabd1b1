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
from .kernel_kinds import kinds
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
                # the score GEMM: the matmul that ended last before the softmax began (an outer
                # aten::matmul ends after the bmm inside it, so it is the one taken)
                j = np.searchsorted(mm_ends, st[i], side="right") - 1
                # the output GEMM: the matmul that began first after the softmax ended
                k = np.searchsorted(mm_starts, en[i], side="left")
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
    ts = [t for t in (_tensor(d) for d in dims or []) if t is not None] if isinstance(dims, list) else []
    if len(ts) == 3:  # baddbmm: the added term first
        ts = ts[1:]
    if len(ts) != 2 or ts[0][-1] != ts[1][-2]:
        return False
    prod = [*ts[0][:-1], ts[1][-1]]
    return any(_batch(t) == bh and tuple(t[-2:]) in ((L, S), (S, L)) for t in (*ts, prod))


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
    cols = ["rank", "device_id", "BH", "L", "S", "D", "Dv", "dtype", "kind", "chains", "launches", "total_ns",
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
    sub = pd.concat([sub, c[["rank", "BH", "L", "S", "D", "Dv", "dtype", "kind"]]], axis=1)
    # no dtype from the ops (emit_nvtx ranges, Kineto without Input type): a chain whose GEMM
    # kernels are full fp32 or TF32 (by name) is an fp32 one; the 16-bit rows are read otherwise
    prec = kinds(ctx)["precision"].astype(object).to_numpy()[at]
    gemm = ctx.kernels["is_gemm"].to_numpy(dtype=bool)[at]
    fp32_chain = pd.Series(gemm & np.isin(prec, ["fp32", "tf32"])).groupby(sub["chain"].to_numpy()).any()
    unknown = sub["dtype"].isna().to_numpy() & sub["chain"].map(fp32_chain).fillna(False).to_numpy(dtype=bool)
    sub.loc[unknown, "dtype"] = "fp32"
    sub["dtype"] = sub["dtype"].fillna("")
    sub["device_id"] = sub["device_id"].fillna(-1)
    out = []
    keys = ["rank", "device_id", "BH", "L", "S", "D", "Dv", "dtype", "kind"]
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


# a fused backward recomputes the scores and makes dQ, dK, dV and dP: 5 GEMMs against the
# forward's 2, and reads q, k, v, o, dO and writes dq, dk, dv: about twice the forward's bytes
_BWD_FLOP, _BWD_BYTES = 2.5, 2.0


def _group_estimate(row: dict, rule: Rule, device: dict | None, dtype: str | None,
                    backward: bool = False) -> tuple[float, str, str, float | None]:
    """(what the group's chains would take fused, confidence, basis, measured speedup or None)
    for one shape group, forward or backward: never under the fused kernel's roofline, never
    more gain than SDPA measured over op-by-op attention near the shape (its backward alone,
    for the backward)."""
    chains = int(row["chains"])
    total = float(row["total_ns"])
    BH, L, S, D, Dv = (int(row[c]) for c in ("BH", "L", "S", "D", "Dv"))
    floor1, floor_basis = fused_floor_ns(BH, L, S, D, Dv, dtype, device, float(rule["latency_floor_ns"]))
    if backward:
        floor1 *= max(_BWD_FLOP, _BWD_BYTES)
    floor = floor1 * chains
    measured = attention_fusion_ratio(device, {"L": L, "S": S, "D": D, "dtype": dtype}, float(rule["near_factor"]),
                                      key="ratio_bwd" if backward else "ratio")
    if measured is None:
        return total, "low", "SDPA was not measured on a shape this small or near it: no gain claimed", None
    ratio, src, how = measured
    where = {"exact": "on this shape", "near": "on the nearest measured shapes (the smallest ratio)",
             "below": "on the largest measured shape with fewer scores (L x S)"}[how]
    confidence = {"exact": "high", "near": "medium", "below": "low"}[how]
    part = "backward" if backward else "forward"
    return max(floor, total / ratio), confidence, (
        f"the {part} chains' kernel time over the {ratio:.2f}x SDPA's {part} measured over the same op-by-op attention "
        f"{where} ({src}); never under one fused kernel's roofline a chain: {floor_basis}"
        + (f" x {max(_BWD_FLOP, _BWD_BYTES):g} for the backward" if backward else "")), ratio


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
    group and its backward; each group's estimate is bounded on its own, and the group that
    claims the most gives the confidence and the basis."""
    out = []
    if ev.empty:
        return out
    for (rank, dev), grp in ev.groupby(["rank", "device_id"], sort=False):
        rank, dev = as_int(rank), as_int(dev)
        dev = None if dev == -1 else dev
        device = ctx.device_row(rank, dev)
        fwd, bwd = grp[grp["kind"] == "fwd"], grp[grp["kind"] == "bwd"]
        if fwd.empty:
            continue  # a backward without its forward chain in the trace is not known to be attention
        # each backward (BH, L, S) goes to one forward group: the one with the most chains
        owner = {}
        for row in fwd.sort_values("chains", ascending=False, kind="stable").to_dict("records"):
            owner.setdefault((row["BH"], row["L"], row["S"]), (row["D"], row["Dv"], row["dtype"]))
        groups, total, bound, launches, chains, bchains, bwd_ns = [], 0.0, 0.0, 0, 0, 0, 0
        confidence, basis, best = "low", "", -1.0
        for row in fwd.to_dict("records"):
            dtype = DTYPE_ALIASES.get(str(row["dtype"]).lower()) if row["dtype"] else None
            b, conf, why, ratio = _group_estimate(row, rule, device, dtype)
            g_total, g_bound = float(row["total_ns"]), b
            mine = owner.get((row["BH"], row["L"], row["S"])) == (row["D"], row["Dv"], row["dtype"])
            back = bwd[(bwd["BH"] == row["BH"]) & (bwd["L"] == row["L"]) & (bwd["S"] == row["S"])] if mine else bwd.iloc[:0]
            b_ratio = None
            if len(back):
                brow = dict(row, chains=int(back["chains"].sum()), total_ns=int(back["total_ns"].sum()),
                            launches=int(back["launches"].sum()))
                bb, bconf, bwhy, b_ratio = _group_estimate(brow, rule, device, dtype, backward=True)
                bchains += brow["chains"]
                bwd_ns += brow["total_ns"]
                if b_ratio is not None:  # claimed: its kernels and bound join the finding's
                    g_total += brow["total_ns"]
                    g_bound += bb
                    launches += brow["launches"]
                    why = f"{why}; and {bwhy}"
            total += g_total
            bound += g_bound
            launches += int(row["launches"])
            chains += int(row["chains"])
            if g_total - g_bound > best:  # the group that claims the most speaks for the finding
                best, confidence, basis = g_total - g_bound, conf, why
            groups.append({"batch_heads": int(row["BH"]), "query_len": int(row["L"]), "key_len": int(row["S"]),
                           "head_dim": int(row["D"]), "value_dim": int(row["Dv"]), "dtype": dtype or "unknown",
                           "chains": int(row["chains"]), "kernel_ns": int(row["total_ns"]),
                           "backward_chains": int(back["chains"].sum()) if len(back) else 0,
                           "backward_ns": int(back["total_ns"].sum()) if len(back) else 0,
                           "bound_ns": int(g_bound), "confidence": conf, "measured_speedup": ratio,
                           "measured_backward_speedup": b_ratio})
        savings = total - bound
        share = ctx.share(rank, dev, total)
        if share < rule["min_share"]:
            continue
        if savings < rule["min_savings_ns"]:
            if all(g["measured_speedup"] is None or g["measured_speedup"] <= 1.0 for g in groups):
                _note_no_gain(ctx, rank, dev, groups, int(fwd["launches"].sum()), chains)
            continue
        top = fwd.iloc[0]
        dtype = DTYPE_ALIASES.get(str(top["dtype"]).lower()) if top["dtype"] else None
        L, S, D = int(top["L"]), int(top["S"]), int(top["D"])
        claimed_bwd = any(g["measured_backward_speedup"] is not None for g in groups)
        if not bchains:
            scope = "forward chains (no backward in the trace)"
        elif claimed_bwd:
            scope = f"forward and backward ({bchains} backward chains, {bwd_ns / 1e6:.2f} ms)"
        else:
            scope = (f"forward chains only: the {bchains} backward chains ({bwd_ns / 1e6:.2f} ms) gain too, but SDPA's "
                     "backward was not measured near these shapes, so none of it is claimed")
        out.append(finding_for(
            rule, {"rank": rank, "device_id": dev, "launches": launches, "total_ns": int(total)},
            kernel=f"{chains} attention chains of ~{int(fwd['launches'].sum()) / max(chains, 1):.0f} kernels "
                   f"(L={L} S={S} D={D}), most time in {top['name']}",
            rank=rank, device_id=dev, shape={"M": L, "N": S, "K": D, "batch": int(top["BH"]), "dtype": dtype},
            grid=None, block=None, est_savings_ns=int(max(savings, 0)), confidence=confidence,
            evidence={
                "chains": chains,
                "kernels_per_chain": round(int(fwd["launches"].sum()) / max(chains, 1), 1),
                "backward_chains": bchains,
                "backward_ns": bwd_ns,
                "shape_groups": len(groups),
                "groups": groups[:8],
                "top_kernel": str(top["name"]),
                "top_kernel_ns": int(top["top_ns"]),
                "share_of_gpu_time": round(share, 4),
                "bound_ns": int(bound),
                "basis": f"{scope}: {basis}" + (f" (the largest claim of {len(groups)} shape groups, each bounded so)"
                                                if len(groups) > 1 else ""),
            },
            suggestion={"fix": "torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, "
                               "dropout_p=p if training else 0.0)"},
            tier=3,
            savings_unit="gpu",
        ))
    return out
