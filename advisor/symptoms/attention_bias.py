"""materialised_attention_bias: a [B, H, L, S] attention bias built in memory by slow elementwise
kernels before a fused attention call (Tier 3).

What it detects: a `scaled_dot_product_attention` call (or one of its backends called directly)
whose attn_mask is a float tensor as large as the scores it biases (ending [L, S], with
batch x heads x L x S distinct elements by its recorded strides: no broadcast over the batch or
the heads), and, between the previous such call on the same host thread and this one, kernels
of elementwise operators whose tensor arguments broadcast to exactly the bias's element count
(not GEMMs, softmax or reductions, not op-by-op attention, not an autograd backward): the bias
being built (a broadcast add of per-row and per-column terms, a copy to make it contiguous).
SAM's and ViTDet's decomposed relative-position bias is the common case: a [B, H, L, kh, 1] +
[B, H, L, 1, kw] add, then a copy, written by PyTorch's broadcast kernels at ~0.8 TB/s.
Why it matters: the bias is as large as the scores (805 MB per SAM ViT-B global layer at 1024^2)
and an eager broadcast add writes it at a fifth of the bandwidth; on SAM's trace its build took
2.4 ms per global layer against the attention's 0.4 ms.
What to do (strategy `compile_bias`): torch.compile the attention module (or the function that
builds the bias, returning it .contiguous()): Inductor writes it in one fused kernel at 3.4-3.8
TB/s on the H200, in the layout SDPA takes, so no copy follows. On SAM ViT-B (H200): 21.4 ->
11.2-11.6 ms of kernels, 28-34 -> 12.5-12.9 ms a step (bench/results/attention_bias/sam/).
Compiling only a helper that returns a permuted view keeps the copy (compiled outputs keep
eager's strides): 16.1 ms, and this finding then names the copy. FlexAttention's score_mod
gathering a decomposed bias's terms measured 2-12x slower than the materialised path
(bench/bench_attention_bias.py): not advised.
Estimate: per build, its kernels' time minus the bias's bytes at the rate Inductor's build
reached on a bias of about that size (rules/measured/<gpu>.toml [[attention_bias]], the slowest
within `near_factor` in bytes); none where nothing was measured near. The attention's own
reading of the bias is not claimed (the compiled build keeps it).
Builds are counted by the calls whose window holds them: biases built ahead of one call (all
layers' before the first) would count as one, the floor would be low and the claim high; no
trace read so far builds them so.
In a training step (the trace records an autograd backward) nothing is claimed; a note says
what is built: compiling T5's padded-mask build saved 0.28 ms in the forward and lost 0.2 ms
elsewhere (the bias's gradient, which Inductor fused with its reduction over the batch into a
slower kernel, and copies): 26.24 -> 26.18 ms of kernels (bench/results/attention_bias/t5/).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from ..basics import input_dims, input_dtypes, json_list, op_base
from ..findings import Finding
from ..rules import Rule
from .attention import attention_backend
from .attention_chains import chain_kernels
from .calibration import bias_build_rate, measured_bandwidth
from .context import ELEMENT_BYTES, Context, as_int, finding_for, has_backward
from .gemm import innermost_ranges
from .strings import contains, factorize

SYMPTOM = "materialised_attention_bias"
REQUIRES = (
    ("cpu_ops", "input_dims", "Does the trace record operator shapes (Kineto with record_shapes=True)?"),
    ("runtime", "correlation_id", "Does the trace link kernels to their launch calls?"),
)

_SDPA = r"^aten::_?scaled_dot_product"
_MAX_EXTENT = 2**31 - 1
_CALL_COLS = ["rank", "thread_id", "start_ns", "end_ns", "BH", "L", "S", "D", "bias_elements", "bias_dtype"]
_EV_COLS = ["rank", "device_id", "BH", "L", "S", "D", "dtype", "calls", "builds", "bias_bytes", "build_ns",
            "build_launches", "attention_ns", "name", "top_ns", "decomposed"]


def _ints(d) -> list[int] | None:
    ok = isinstance(d, list) and all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x <= _MAX_EXTENT for x in d)
    return d if ok else None


def broadcast_shape(shapes: list[list[int]]) -> list[int] | None:
    """NumPy's broadcast of the tensor arguments' shapes, or None where they do not broadcast."""
    if not shapes:
        return None
    n = max(len(s) for s in shapes)
    out = []
    for i in range(n):
        sizes = {s[len(s) - n + i] for s in shapes if len(s) - n + i >= 0} - {1}
        if len(sizes) > 1:
            return None
        out.append(sizes.pop() if sizes else 1)
    return out


def _calls(ctx: Context) -> pd.DataFrame:
    """The outermost SDPA-family calls with a float bias as large as their scores."""
    ops = ctx.trace.cpu_ops
    if not len(ops) or "input_dims" not in ops.columns or "input_strides" not in ops.columns:
        return pd.DataFrame(columns=_CALL_COLS)
    # forward calls only: a backward's fourth argument is not the mask (grad_out, q, k, v, bias, ...)
    sub = ops[contains(ops["name"], _SDPA).to_numpy() & ~contains(ops["name"], "backward").to_numpy()]
    if not len(sub):
        return pd.DataFrame(columns=_CALL_COLS)
    sub = sub.sort_values(["rank", "thread_id", "start_ns"], kind="stable")
    rows, outer_end = [], {}
    types = sub["input_types"] if "input_types" in sub.columns else pd.Series([None] * len(sub), index=sub.index)
    for r, ty in zip(sub.itertuples(index=False), types):
        key = (r.rank, r.thread_id)
        if r.start_ns < outer_end.get(key, -1):
            continue  # a backend call inside the SDPA call already read
        outer_end[key] = r.end_ns
        dims, strides = input_dims(r.input_dims), json_list(r.input_strides)
        if not dims or len(dims) < 4 or not strides or len(strides) < 4:
            continue
        q, k, m, st = _ints(dims[0]), _ints(dims[1]), _ints(dims[3]), _ints(strides[3])
        dt = (input_dtypes(ty) + [None] * 4)[3]
        if not (q and k and m and st) or len(q) < 3 or len(k) < 2 or len(m) != len(st) or dt not in ELEMENT_BYTES:
            continue
        BH, L, S, D = math.prod(q[:-2]), q[-2], k[-2], q[-1]
        # a bias over the scores ends [L, S]; distinct elements: a broadcast dim (stride 0) holds one
        if min(BH, L, S, D) <= 0 or len(m) < 2 or m[-2:] != [L, S]:
            continue
        elements = math.prod(d for d, s in zip(m, st) if s != 0)
        rows.append((r.rank, r.thread_id, r.start_ns, r.end_ns, BH, L, S, D, elements, dt))
    return pd.DataFrame(rows, columns=_CALL_COLS)


def _tensor_elements(dims_text) -> tuple[int | None, bool]:
    """(elements of the broadcast of an operator's tensor arguments, whether two of them broadcast
    along different dims: [.., X, 1] + [.., 1, Y], a decomposed bias) or (None, False)."""
    dims = input_dims(dims_text)
    if not dims:
        return None, False
    shapes = [d for d in (_ints(x) for x in dims) if d]
    shape = broadcast_shape(shapes)
    if shape is None:
        return None, False
    n = len(shape)
    padded = [[1] * (n - len(s)) + s for s in shapes]
    grown = [{i for i, (a, b) in enumerate(zip(p, shape)) if a == 1 and b > 1} for p in padded]
    # one term along the key grid's rows, one along its columns: the last two dims of a 5-D+ shape
    last2 = [{n - 2}, {n - 1}]
    decomposed = n >= 5 and all(any(g == want for g in grown) for want in last2)
    return math.prod(shape), decomposed


# operators that write a tensor element by element (op_base names: no namespace, overload or
# in-place mark): what builds a bias. Softmax, reductions, GEMMs and normalisations are other
# work whatever their output's size
_BUILD_OPS = frozenset({
    "add", "sub", "rsub", "mul", "div", "where", "masked_fill", "copy", "clone", "contiguous", "to", "_to_copy",
    "repeat", "neg", "exp", "log", "abs", "clamp", "clamp_min", "clamp_max", "minimum", "maximum", "fill", "full",
    "full_like", "zeros_like", "ones_like", "expand_as", "type_as", "addcmul", "lerp", "pow", "sigmoid", "tanh",
    "logical_not", "logical_and", "logical_or", "eq", "ne", "lt", "le", "gt", "ge", "bitwise_not", "bitwise_and",
    "bitwise_or",
})


def _thread_keys(frame: pd.DataFrame) -> np.ndarray:
    """One int64 a (rank, thread) row; a thread id that is missing or not a number is -1."""
    tid = pd.to_numeric(frame["thread_id"], errors="coerce").fillna(-1).astype("int64").to_numpy()
    rank = pd.to_numeric(frame["rank"], errors="coerce").fillna(-1).astype("int64").to_numpy()
    return rank * 1_000_003 + tid


def _empty(ctx: Context, calls: pd.DataFrame, n: int):
    out = (calls, np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=bool))
    ctx.cache["attention_bias"] = out
    return out


def bias_builds(ctx: Context) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, np.ndarray]:
    """(the calls with a full bias, per kernel the call whose bias it builds or -1, per kernel
    the call that launched it or -1, per kernel whether its build operator was a decomposed
    add). A build kernel: launched under an elementwise operator (_BUILD_OPS) on the call's
    thread, after the previous call there and before this one (not inside an operator that
    encloses the call), whose tensor arguments broadcast to exactly the bias's element count;
    not a GEMM, an attention kernel, a kernel of an op-by-op attention (unfused_attention's) or
    of an autograd backward. Cached."""
    if "attention_bias" in ctx.cache:
        return ctx.cache["attention_bias"]
    k = ctx.kernels
    n = len(k)
    calls = _calls(ctx)
    rule = ctx.rules.get(SYMPTOM)
    frac = float(rule["min_full_fraction"]) if rule is not None else 1.0
    if len(calls):
        calls = calls[calls["bias_elements"] >= frac * calls["BH"] * calls["L"] * calls["S"]].reset_index(drop=True)
    if not len(calls) or not n:
        return _empty(ctx, calls, n)
    calls_out, build, inside, decomposed = _empty(ctx, calls, n)
    # the kernels each call launched
    ranges, hit = innermost_ranges(ctx.trace, calls.assign(call=np.arange(len(calls))))
    at = hit >= 0
    inside[at] = ranges["call"].to_numpy(np.int64)[hit[at]]
    # the operators around every kernel, on the threads that made such calls (all of them, so
    # that each kernel finds its innermost one; only elementwise ones can be builds)
    ops = ctx.trace.cpu_ops
    key = _thread_keys(ops)
    call_keys = _thread_keys(calls)
    on = np.isin(key, call_keys) & ops["input_dims"].notna().to_numpy(dtype=bool)
    on &= ops["name"].astype(str).str.startswith("aten::").to_numpy(dtype=bool)
    cand = ops.loc[on, ["rank", "thread_id", "start_ns", "end_ns", "name", "input_dims"]].reset_index(drop=True)
    if not len(cand):
        return calls_out, build, inside, decomposed
    ranges, hit = innermost_ranges(ctx.trace, cand)
    # per operator row: the call whose window it lies in, if its output is that bias's size
    rows = len(ranges)
    row_call = np.full(rows, -1, dtype=np.int64)
    row_dec = np.zeros(rows, dtype=bool)
    r_key = _thread_keys(ranges)
    r_start, r_end = ranges["start_ns"].to_numpy(np.int64), ranges["end_ns"].to_numpy(np.int64)
    n_codes, n_uniq = factorize(ranges["name"])
    is_build = np.array([op_base(str(x)) in _BUILD_OPS for x in n_uniq] + [False], dtype=bool)[
        np.where(n_codes >= 0, n_codes, len(n_uniq))]
    # each distinct Input Dims text parsed once: its broadcast element count (-1: none) and
    # whether it is a decomposed add
    d_codes, d_uniq = factorize(ranges["input_dims"])
    parsed = [_tensor_elements(t) for t in d_uniq]
    d_el = np.array([e if e is not None else -1 for e, _ in parsed] + [-1], dtype=np.int64)
    d_dec = np.array([dec for _, dec in parsed] + [False], dtype=bool)
    d_at = np.where(d_codes >= 0, d_codes, len(d_uniq))
    row_el, row_is_dec = d_el[d_at], d_dec[d_at]
    cs = calls.assign(key=call_keys, call=np.arange(len(calls))).sort_values(["key", "start_ns"], kind="stable")
    bias_el = calls["bias_elements"].to_numpy(np.int64)
    for kk, g in cs.groupby("key", sort=False):
        starts = g["start_ns"].to_numpy(np.int64)
        prev_end = np.concatenate([[np.iinfo(np.int64).min], g["end_ns"].to_numpy(np.int64)[:-1]])
        idx = g["call"].to_numpy(np.int64)
        sel = np.flatnonzero((r_key == kk) & is_build)
        j = np.searchsorted(starts, r_start[sel], side="right")  # the first call starting after the op
        ok = j < len(starts)
        jj = np.minimum(j, len(starts) - 1)
        # inside the window: not started within the previous call, not enclosing this one
        ok &= (r_start[sel] >= prev_end[jj]) & (r_end[sel] <= starts[jj])
        c = idx[jj]
        ok &= row_el[sel] == bias_el[c]
        row_call[sel[ok]] = c[ok]
        row_dec[sel[ok]] = row_is_dec[sel[ok]]
    cand_k = np.flatnonzero((hit >= 0) & (inside < 0))
    if not len(cand_k):
        return calls_out, build, inside, decomposed
    c_of = row_call[hit[cand_k]]
    keep = c_of >= 0
    cand_k, c_of = cand_k[keep], c_of[keep]
    if not len(cand_k):
        return calls_out, build, inside, decomposed
    codes, uniq = factorize(k["name"])
    attn = np.array([attention_backend(u) is not None for u in uniq] + [False], dtype=bool)
    gemm = k["is_gemm"].to_numpy(dtype=bool) if "is_gemm" in k else np.zeros(n, dtype=bool)
    bad = gemm[cand_k] | attn[np.where(codes[cand_k] >= 0, codes[cand_k], len(uniq))]
    bad |= chain_kernels(ctx)[cand_k] >= 0
    bad |= _backward_kernels(ctx)[cand_k]
    build[cand_k[~bad]] = c_of[~bad]
    decomposed[cand_k[~bad]] = row_dec[hit[cand_k[~bad]]]
    return calls_out, build, inside, decomposed


def _backward_kernels(ctx: Context) -> np.ndarray:
    """Per kernel: launched inside an autograd backward node's range (a recomputed forward's
    window under activation checkpointing holds the previous layer's backward)."""
    ops = ctx.trace.cpu_ops
    out = np.zeros(len(ctx.kernels), dtype=bool)
    if not len(ops):
        return out
    is_node = contains(ops["name"], r"Backward\d*\b").to_numpy(dtype=bool)
    if not is_node.any():
        return out
    nodes = ops.loc[is_node, ["rank", "thread_id", "start_ns", "end_ns"]].reset_index(drop=True)
    _, hit = innermost_ranges(ctx.trace, nodes)
    return hit >= 0


def claimable(ctx: Context) -> np.ndarray:
    """Per kernel: a build kernel this rule can put a number on (a compiled build measured near
    its bias's size, not a training step): other rules leave these to it (schedule_excluded).
    Builds it only notes stay theirs."""
    calls, build, _, _ = bias_builds(ctx)
    out = build >= 0
    if not out.any() or has_backward(ctx):
        return np.zeros(len(out), dtype=bool)
    rule = ctx.rules.get(SYMPTOM)
    near = float(rule["near_factor"]) if rule is not None else 2.0
    ok = np.zeros(len(calls), dtype=bool)
    dev = ctx.kernels["device_id"].to_numpy()
    for c in np.unique(build[out]):
        first = np.flatnonzero(build == c)[0]
        d = dev[first]
        device = ctx.device_row(int(calls.at[c, "rank"]), None if pd.isna(d) else int(d))
        nbytes = int(calls.at[c, "bias_elements"]) * ELEMENT_BYTES[calls.at[c, "bias_dtype"]]
        ok[c] = bias_build_rate(device, nbytes, near) is not None
    return out & ok[np.where(out, build, 0)]


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    """Per (rank, device, BH, L, S, D, bias dtype): the calls, the builds before them, the
    build kernels' launches and time, the attention kernels' time, the biggest build kernel."""
    calls, build, inside, decomposed = bias_builds(ctx)
    if not len(calls) or not (build >= 0).any():
        return pd.DataFrame(columns=_EV_COLS)
    k = ctx.kernels
    dur = k["dur_ns"].to_numpy(np.int64)
    dev = k["device_id"].fillna(-1).to_numpy()
    names = k["name"].to_numpy(dtype=object)
    out = []
    calls = calls.assign(call=np.arange(len(calls)))
    # a call's device: where its attention kernels ran, else its build kernels'
    dev_of = {}
    for pos in np.flatnonzero(inside >= 0):
        dev_of.setdefault(int(inside[pos]), dev[pos])
    for pos in np.flatnonzero(build >= 0):
        dev_of.setdefault(int(build[pos]), dev[pos])
    calls["device_id"] = [dev_of.get(c, -1) for c in calls["call"]]
    keys = ["rank", "device_id", "BH", "L", "S", "D", "bias_elements", "bias_dtype"]
    for key, g in calls.groupby(keys, sort=False):
        ids = g["call"].to_numpy(np.int64)
        bpos = np.flatnonzero(np.isin(build, ids))
        if not len(bpos):
            continue
        apos = np.flatnonzero(np.isin(inside, ids))
        per_name = pd.Series(dur[bpos]).groupby(names[bpos]).sum().sort_values(ascending=False, kind="stable")
        builds = int(len(np.unique(build[bpos])))
        elt = ELEMENT_BYTES[key[7]]
        out.append({**dict(zip(keys[:6], key[:6])), "dtype": key[7], "calls": len(g), "builds": builds,
                    "bias_bytes": int(key[6]) * elt, "build_ns": int(dur[bpos].sum()),
                    "build_launches": len(bpos), "attention_ns": int(dur[apos].sum()),
                    "name": str(per_name.index[0]), "top_ns": int(per_name.iloc[0]),
                    "decomposed": bool(decomposed[bpos].any())})
    return pd.DataFrame(out, columns=_EV_COLS).sort_values("build_ns", ascending=False, kind="stable").reset_index(drop=True)


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    """One finding per (rank, device): one code change (where the bias is built) serves every
    shape group; each group is bounded by the compiled build measured near its bias's size."""
    out = []
    if ev.empty:
        return out
    for (rank, dev), grp in ev.groupby(["rank", "device_id"], sort=False):
        rank, dev = as_int(rank), as_int(dev)
        dev = None if dev == -1 else dev
        device = ctx.device_row(rank, dev)
        groups, total, floor, unmeasured, best = [], 0.0, 0.0, 0, (-1.0, "low", "")
        for row in grp.to_dict("records"):
            got = bias_build_rate(device, row["bias_bytes"], float(rule["near_factor"]))
            g = {"batch_heads": int(row["BH"]), "query_len": int(row["L"]), "key_len": int(row["S"]),
                 "head_dim": int(row["D"]), "bias_dtype": row["dtype"], "bias_mb": round(row["bias_bytes"] / 1e6, 1),
                 "calls": int(row["calls"]), "builds": int(row["builds"]), "build_ns": int(row["build_ns"]),
                 "attention_ns": int(row["attention_ns"]), "decomposed": bool(row["decomposed"])}
            if got is None:
                unmeasured += 1
                g["claimed_ns"] = 0
                groups.append(g)
                continue
            rate, src, how = got
            g_floor = row["builds"] * row["bias_bytes"] / rate * 1e9
            g_claim = max(0.0, row["build_ns"] - g_floor)
            total += row["build_ns"]
            floor += min(g_floor, row["build_ns"])
            g["claimed_ns"] = int(g_claim)
            g["build_rate_tb_s"] = round(rate / 1e12, 2)
            groups.append(g)
            if g_claim > best[0]:
                where = {"exact": "on a bias of this size", "near": f"on biases within {rule['near_factor']:g}x of "
                         "its size (the slowest)", "other GPU": "on the H200, as a fraction of its copy bandwidth"}[how]
                best = (g_claim, "medium" if how != "other GPU" else "low",
                        f"{row['builds']} builds of a {row['bias_bytes'] / 1e6:.0f} MB bias took "
                        f"{row['build_ns'] / 1e6:.2f} ms of kernels (written at "
                        f"{row['bias_bytes'] * row['builds'] / row['build_ns'] / 1e3:.2f} TB/s); Inductor's "
                        f"compiled build wrote it at {rate / 1e12:.2f} TB/s {where} ({src})")
        savings = total - floor
        all_build = float(grp["build_ns"].sum())
        share = ctx.share(rank, dev, all_build)
        if has_backward(ctx) and share >= rule["min_share"]:
            # a training step: compiling the build changes the bias's gradient too, and on T5
            # (bench/results/attention_bias/t5/) the forward's gain went to a slower fused backward
            ctx.notes.append(
                f"A [B, H, L, S] attention bias is built in memory before SDPA on rank {rank} (device {dev}): "
                f"{int(grp['builds'].sum())} builds, {all_build / 1e6:.2f} ms of elementwise kernels in the forward. "
                "In training, compiling the build measured no net gain (T5 on the H200: the forward's builds -0.28 ms, "
                "the rest +0.2 ms: the bias's gradient fused with its reduction over the batch into a slower kernel, "
                "and copies), so nothing is claimed; torch.compile of the whole model may fuse more: measure the step")
            continue
        if share < rule["min_share"] or savings < rule["min_savings_ns"]:
            if unmeasured and share >= rule["min_share"]:
                ctx.notes.append(
                    f"A [B, H, L, S] attention bias is built in memory before SDPA on rank {rank} (device {dev}): "
                    f"{all_build / 1e6:.2f} ms of elementwise kernels; a compiled build was not measured on a bias this "
                    "size, so no gain is claimed (torch.compile the function that builds it, and measure)")
            continue
        top = grp.iloc[0]
        bw = measured_bandwidth(device or {})
        phys = sum(r["builds"] * r["bias_bytes"] for r in grp.to_dict("records")) / bw * 1e9 if bw else None
        decomposed = bool(grp["decomposed"].any())
        out.append(finding_for(
            rule, {"rank": rank, "device_id": dev, "launches": int(grp["build_launches"].sum()), "total_ns": int(all_build)},
            kernel=str(top["name"]), rank=rank, device_id=dev,
            shape={"M": int(top["L"]), "N": int(top["S"]), "K": int(top["D"]), "batch": int(top["BH"]), "dtype": top["dtype"]},
            grid=None, block=None, est_savings_ns=int(max(savings, 0)), confidence=best[1],
            evidence={
                "builds": int(grp["builds"].sum()),
                "calls": int(grp["calls"].sum()),
                "build_ns": int(all_build),
                "attention_ns": int(grp["attention_ns"].sum()),
                "bias_mb": round(float(top["bias_bytes"]) / 1e6, 1),
                "decomposed": decomposed,
                "groups": groups[:8],
                "share_of_gpu_time": round(share, 4),
                "bound_ns": int(phys) if phys is not None else None,
                "basis": best[2] + ("" if not unmeasured else
                                    f"; {unmeasured} shape group(s) with no compiled build measured near: not claimed"),
            },
            suggestion={"fix": "torch.compile the attention module, or the function that builds the bias returning it "
                               ".contiguous() (Inductor: one fused kernel in SDPA's layout, no copy)"},
            tier=3,
            savings_unit="gpu",
        ))
    return out
