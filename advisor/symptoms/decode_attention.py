"""decode_attention_unsplit: decode attention whose grid fills few SMs while the KV is long.

What it detects: attention kernels (FlashAttention 2/3, cuDNN SDPA, FlashInfer, PyTorch's
flash and memory-efficient kernels, Triton) launched on a grid (batch x heads x query
blocks) under `max_sm_fill` of the SMs, with a long KV sequence (from the shape of the
enclosing aten attention operator: Kineto `Input Dims` or emit_nvtx sizes; without a shape,
only a long launch on a small grid, at low confidence), and no split/combine kernel after
it. A kernel the library already split (`flash_fwd_splitkv_kernel`) is not a finding by
itself; its combine step is one when it is under-filled and a large part of the pair's time
while the pair runs well above the HBM floor. Why it matters: in decode each program walks
the whole KV cache, so most SMs idle while a few stream it; the floor is reading K and V once.
What to do: split the KV sequence (flash-decoding): the library's knob where it has one, a
backend already near the floor where there is one, else `advisor generate split_kv`.
Estimated recoverable time: the launch time minus the largest of the perfectly spread time
(launch x grid / SMs), `floor_reach` x the HBM floor of reading K and V once, and that floor
plus `fixed_cost_ns` a launch (what the fastest measured decode kernels paid beyond the read).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .attention import attention_backend, kv_bytes, num_splits_for, parse_attention_op, parse_attention_range
from ..findings import Finding
from ..model import Trace
from ..rules import Rule
from .context import Context, as_int, finding_for, sort_keys
from .gemm import innermost_ranges
from .strings import contains, factorize

SYMPTOM = "decode_attention_unsplit"
REQUIRES = (
    ("kernels", "grid_blocks", "Does the trace record each kernel's grid size?"),
    ("devices", "sm_count", "Does the trace (or --sm-count) give the GPU's SM count?"),
)
SHAPE_KEYS = ("B", "Hq", "Hkv", "Lq", "D")
_RANGE_COLUMNS = ["rank", "thread_id", "start_ns", "end_ns", *SHAPE_KEYS, "S", "dtype", "op"]


def attention_ranges(trace: Trace) -> pd.DataFrame:
    """Host ranges naming an attention problem: Kineto cpu_ops with Input Dims, emit_nvtx texts."""
    parts = []
    ops = trace.cpu_ops
    if len(ops):
        cand = ops[ops["input_dims"].notna().to_numpy() & contains(ops["name"], r"attention").to_numpy()]
        for row, shape in ((r, parse_attention_op(r.name, r.input_dims, r.input_types)) for r in cand.itertuples()):
            if shape is not None:
                parts.append({"rank": row.rank, "thread_id": row.thread_id, "start_ns": row.start_ns,
                              "end_ns": row.end_ns, **shape})
    nv = trace.nvtx
    if len(nv):
        cand = nv[contains(nv["text"], r"attention").to_numpy()]
        for row, shape in ((r, parse_attention_range(r.text)) for r in cand.itertuples()):
            if shape is not None:
                parts.append({"rank": row.rank, "thread_id": row.thread_id, "start_ns": row.start_ns,
                              "end_ns": row.end_ns, **shape})
    return pd.DataFrame(parts, columns=_RANGE_COLUMNS)


def attention_launches(ctx: Context) -> pd.DataFrame:
    """One row per attention kernel launch: backend, split/combine flags, the problem shape
    where a range gives it, and the kernel launched next on the same stream (a combine step?).
    Cached in ctx.cache (both attention symptoms read it)."""
    if "attention_launches" in ctx.cache:
        return ctx.cache["attention_launches"]
    k = ctx.kernels
    codes, uniques = factorize(k["name"])
    if "_name_code" in k.columns:  # the same codes, int32 and kept by Context.kernels (no second copy)
        codes = k["_name_code"].to_numpy()
    facts = [attention_backend(n) for n in np.asarray(uniques, dtype=object)]
    is_attn = np.array([f is not None for f in facts] + [False])[codes]
    combine = np.array([bool(f and f[2]) for f in facts] + [False])
    pos = np.flatnonzero(is_attn)  # everything below only for the attention launches
    c = codes[pos]
    out = pd.DataFrame({"backend": np.array([f[0] if f else None for f in facts] + [None], dtype=object)[c],
                        "lib_split": np.array([bool(f and f[1]) for f in facts] + [False])[c],
                        "is_combine": combine[c]}, index=k.index[pos])
    # the next kernel on the same stream: a combine step right after means the KV was split.
    # Kernels ordered by (rank, device, stream, start) over arrays, missing ids last (as
    # sort_values(kind="stable") put them: a frame of the four columns, its sort and an
    # index lookup of the order were this symptom's peak); only the attention launches'
    # successors are looked up.
    # (ids in their own width: int32 where the trace stores them so, ~16 bytes a kernel less
    # at this symptom's peak, the diagnosis's highest at 3M kernels)
    rank = k["rank"].to_numpy()
    dev_na, stream_na = k["device_id"].isna().to_numpy(), k["stream_id"].isna().to_numpy()
    dev, stream = _ids(k["device_id"]), _ids(k["stream_id"])
    order = np.lexsort(sort_keys(k["start_ns"].to_numpy(np.int64), stream, stream_na, dev, dev_na, rank))
    # each kernel's place in that order
    where = np.empty(len(order), dtype=np.int32 if len(order) < 2**31 else np.int64)
    where[order] = np.arange(len(order), dtype=where.dtype)
    after = where[pos] + 1
    del where
    has_next = after < len(order)
    nx = np.full(len(pos), -1, dtype=np.int64)
    nx[has_next] = order[after[has_next]]
    del order
    p2, n2 = pos[has_next], nx[has_next]
    # a missing device or stream is never "the same" (NA == NA is not true)
    same = ((rank[p2] == rank[n2]) & (dev[p2] == dev[n2]) & ~dev_na[p2] & ~dev_na[n2]
            & (stream[p2] == stream[n2]) & ~stream_na[p2] & ~stream_na[n2])
    nx[np.flatnonzero(has_next)[~same]] = -1
    del rank, dev, stream, dev_na, stream_na
    has_next = nx >= 0
    at = nx[has_next]
    next_is_combine = np.zeros(len(pos), dtype=bool)
    next_is_combine[has_next] = combine[codes[at]]
    out["next_is_combine"] = next_is_combine
    next_ns = np.full(len(pos), np.nan)
    next_ns[has_next] = k["dur_ns"].take(at).to_numpy(dtype=float)
    out["next_ns"] = next_ns
    next_grid = np.full(len(pos), np.nan)
    next_grid[has_next] = k["grid_blocks"].take(at).to_numpy(dtype=float)
    out["next_grid"] = next_grid
    ranges, hit = innermost_ranges(ctx.trace, attention_ranges(ctx.trace) if len(pos) else pd.DataFrame())
    all_hit, hit = hit, hit[pos]
    has = hit >= 0
    for col in (*SHAPE_KEYS, "S"):
        vals = np.full(len(pos), np.nan)
        if has.any():
            vals[has] = ranges[col].to_numpy(dtype=float)[hit[has]]
        out[col] = vals
    for col in ("dtype", "op"):
        vals = np.full(len(pos), None, dtype=object)
        if has.any():
            vals[has] = ranges[col].to_numpy(dtype=object)[hit[has]]
        out[col + "_attn"] = vals
        # the column's dtype as pandas inferred it over all kernels before (str where any
        # kernel, attention or not, sat in a range with a text here)
        if (out[col + "_attn"].dtype == object and not pd.notna(vals).any() and len(ranges)
                and _infers_text(ranges[col].to_numpy(dtype=object)[all_hit[all_hit >= 0]])):
            out[col + "_attn"] = out[col + "_attn"].astype("str")
    ctx.cache["attention_launches"] = out
    return out


def _ids(s: pd.Series) -> np.ndarray:
    """A nullable id column as numbers (0 where missing), int32 when the column is Int32
    (read-only and zero-stride for a column of one value: model.constant_view)."""
    a = s.array
    if isinstance(a, pd.arrays.IntegerArray) and len(a) > 1 and not a._data.strides[0] and not a._mask.strides[0]:
        return np.broadcast_to(np.array([0 if a._mask[0] else a._data[0]], dtype=a._data.dtype), (len(a),))
    return s.to_numpy(np.int32 if isinstance(s.dtype, pd.Int32Dtype) else np.int64, na_value=0)


def _infers_text(values: np.ndarray) -> bool:
    """Whether pandas infers its `str` dtype for an object column of `values`: at least one
    value, and every one that is not missing a str."""
    known = [v for v in pd.unique(values) if not pd.isna(v)]
    return bool(known) and all(isinstance(v, str) for v in known)


_KEYS = ["rank", "device_id", "name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
         "backend", "lib_split", *SHAPE_KEYS, "dtype_attn", "op_attn"]


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    """Attention launches that are not combine steps, grouped by kernel, grid and problem shape
    up to the KV length (a decode loop grows S by one a step): launches, time, the KV lengths,
    the summed HBM floor, whether a combine step followed and what it cost."""
    a = attention_launches(ctx)
    cols = _KEYS + ["launches", "total_ns", "median_ns", "S_median", "S_min", "S_max", "floor_ns", "floor_known",
                    "followed_by_combine", "combine_ns", "combine_grid", "sm_count", "grid_blocks", "read_bps"]
    if a.empty:
        return pd.DataFrame(columns=cols)
    k = ctx.kernels.loc[a.index]
    a = a[~a["is_combine"]]
    k = k.loc[a.index]
    df = pd.concat([k[["rank", "device_id", "name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z",
                       "dur_ns", "grid_blocks", "sm_count"]], a], axis=1)
    df = df[df["grid_blocks"].notna() & df["sm_count"].notna()]
    if df.empty:
        return pd.DataFrame(columns=cols)
    # the HBM floor of each launch: K and V read once at the device's achievable bandwidth
    bw = pd.Series([ctx.device_value(r, d, "mem_bandwidth_bytes_per_s") for r, d in zip(df["rank"], df["device_id"])],
                   index=df.index, dtype=float) * float(rule["achievable_hbm_fraction"])
    elt = df["dtype_attn"].map({"fp8": 1, "fp16": 2, "bf16": 2, "fp32": 4}).astype(float)
    nbytes = 2 * df["B"] * df["Hkv"] * df["S"] * df["D"] * elt.fillna(2.0)
    df["floor_ns"] = (nbytes / bw * 1e9).where(bw.notna() & df["S"].notna(), np.nan)
    df["read_bps"] = bw
    df["floor_known"] = elt.notna() & df["floor_ns"].notna()
    df["combine_ns"] = df["next_ns"].where(df["next_is_combine"], 0.0)
    df["combine_grid"] = df["next_grid"].where(df["next_is_combine"], np.nan)
    g = df.groupby(_KEYS, dropna=False, sort=False)
    out = g["dur_ns"].agg(launches="count", total_ns="sum", median_ns="median")
    out = out.join(g["S"].agg(S_median="median", S_min="min", S_max="max"))
    out = out.join(g["floor_ns"].sum(min_count=1)).join(g["floor_known"].all())
    out = out.join(g["next_is_combine"].mean().rename("followed_by_combine"))
    out = out.join(g["combine_ns"].sum()).join(g["combine_grid"].median()).join(g["sm_count"].first())
    out = out.join(g["grid_blocks"].first()).join(g["read_bps"].first()).reset_index()
    return out.sort_values("total_ns", ascending=False, kind="stable").reset_index(drop=True)[cols]


def _shape(row) -> dict | None:
    if pd.isna(row.get("S_median")) or any(pd.isna(row.get(c)) for c in SHAPE_KEYS):
        return None
    dtype = row.get("dtype_attn")
    return {**{c: int(row[c]) for c in SHAPE_KEYS}, "S": int(row["S_median"]),
            "dtype": None if dtype is None or pd.isna(dtype) else str(dtype)}


def _unsplit_programs(shape: dict, rule: Rule) -> int:
    """The most programs an unsplit decode kernel launches: one per (batch, query head, query
    block), a query block holding at least `min_query_block` rows. A grid beyond it divides the
    KV among programs in-kernel (cuDNN's decode graphs do: Whisper's cross-attention, 1 query
    over 1,500 keys, ran on an 8 x 12 grid for 12 heads)."""
    q_blocks = -(-shape["Lq"] // int(rule["min_query_block"]))
    return shape["B"] * shape["Hq"] * q_blocks


def _library(backend: str, name: str, shape: dict | None, split: int, rule: Rule) -> tuple[str, str]:
    """(library, the call to change) for an attention backend, with the split count."""
    long_kv = shape is not None and shape["S"] >= rule["cudnn_near_floor_min_kv"]
    cudnn = ("torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION) around the SDPA call: on the H200 cuDNN ran "
             "decode within 1.0-1.33x of the K/V read floor at 32k-128k keys (batch 1-8, 32/8 heads, D 128)")
    if backend == "flash" and "pytorch_flash" not in name:
        return "FlashAttention 2 (flash-attn)", (f"flash_attn_with_kvcache(..., num_splits={split}) (0 leaves it to its "
                                                  "heuristic, which the flash_attn_func path does not run)")
    if backend == "flash":
        if long_kv:
            return "PyTorch SDPA, flash backend", f"switch backend: {cudnn}"
        return "PyTorch SDPA, flash backend", (f"SDPA exposes no split knob: try {cudnn.split(':')[0]}, or a split-KV "
                                                f"kernel ({split} splits)")
    if backend == "flash3":
        return "FlashAttention 3", f"flash_attn_with_kvcache(..., num_splits={split}) (or num_splits=0: its own heuristic)"
    if backend == "cudnn":
        return "cuDNN SDPA", (f"this cuDNN graph did not split the KV: try SDPBackend.FLASH_ATTENTION (it splits decode), "
                              f"or a split-KV kernel ({split} splits)")
    if backend == "efficient":
        return "PyTorch SDPA, memory-efficient backend", f"switch backend: {cudnn}" if long_kv else \
            f"switch backend: SDPBackend.FLASH_ATTENTION or CUDNN_ATTENTION (they split decode); or {split} KV splits"
    if backend == "flashinfer":
        return "FlashInfer", ("decode through BatchDecodeWithPagedKVCacheWrapper: its plan() splits long KV "
                              "over the SMs when the batch is small")
    if backend == "paged":
        return "paged attention (vLLM/SGLang)", "the v2 kernel (paged_attention_v2: KV partitions + reduce) for long contexts"
    return "", ""


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out = []
    reach = float(rule["floor_reach"])
    fixed = float(rule["fixed_cost_ns"])
    for row in ev.to_dict("records"):
        sms = int(row["sm_count"])
        grid = int(row["grid_blocks"])
        fill = grid / sms
        shape = _shape(row)
        floor = 0.0 if pd.isna(row["floor_ns"]) else float(row["floor_ns"])
        total = float(row["total_ns"])
        combine_ns = float(row["combine_ns"] or 0.0)
        already = bool(row["lib_split"])
        if shape is not None and (shape["Lq"] > rule["max_query_len"] or shape["S"] < rule["min_kv_len"]):
            continue
        if already:
            # split by the library: only its combine step can be the problem
            cgrid = row["combine_grid"]
            if shape is None or not floor or pd.isna(cgrid) or cgrid / sms >= rule["max_sm_fill"]:
                continue
            pair = total + combine_ns
            if combine_ns / pair < rule["min_combine_share"]:
                continue
            ideal = max(reach * floor, floor + fixed * row["launches"])
            basis = (f"split kernel + combine ({pair / 1e3:.0f} us over {row['launches']} launches) minus "
                     f"{reach:g} x the HBM floor of reading K and V once, or that floor plus {fixed / 1e3:g} us a "
                     "launch where that is more")
            spent = pair
        else:
            if row["followed_by_combine"] >= 0.5 or fill >= rule["max_sm_fill"]:
                continue
            if shape is None and row["median_ns"] < rule["min_launch_ns_without_shape"]:
                continue
            if shape is not None and grid > _unsplit_programs(shape, rule):
                continue  # more programs than (batch, head, query block): the kernel splits the KV itself
            ideal = max(reach * floor, floor + fixed * row["launches"] if floor else 0.0, total * fill)
            basis = (f"launch time x grid / SMs ({fill:.2f}: the work spread over every SM), never below {reach:g} x "
                     f"the HBM floor of reading K and V once nor below that floor plus {fixed / 1e3:g} us a launch"
                     if floor else
                     f"launch time x grid / SMs ({fill:.2f}); no HBM floor (KV shape or bandwidth unknown)")
            spent = total
        if floor:  # the floor's rate and where it comes from (the rule's achievable_hbm_fraction)
            basis += (f" (K and V at {float(row['read_bps']) / 1e12:.2f} TB/s, {float(rule['achievable_hbm_fraction']):g} "
                      "of the device's bandwidth: the K/V read rate cuDNN SDPA reached in decode on the H200; "
                      f"{fixed / 1e3:g} us: the most the fastest measured decode kernels paid a call beyond that read)")
        savings = max(0.0, spent - ideal)
        share = ctx.share(row["rank"], row["device_id"], spent)
        if share < rule["min_share"] or savings < rule["min_savings_ns"]:
            continue
        key_blocks = -(-shape["S"] // int(rule["min_keys_per_split"])) if shape else int(rule["max_splits"])
        split = num_splits_for(grid, sms, key_blocks, int(rule["max_splits"]))
        library, change = _library(str(row["backend"]), str(row["name"]), shape, split, rule)
        if shape is None:
            confidence = "low"
        else:
            confidence = "high" if row["floor_known"] and floor else "medium"
        nbytes = kv_bytes(shape)[0] if shape else None
        out.append(finding_for(
            rule, row,
            title=rule.title + (" (the library's combine step)" if already else ""),
            shape=shape,
            total_ns=int(spent),
            est_savings_ns=int(savings),
            confidence=confidence,
            evidence={
                "backend": str(row["backend"]),
                "already_split": already,
                "grid_blocks": grid,
                "sm_count": sms,
                "sm_fill": round(fill, 3),
                "kv_len": None if shape is None else shape["S"],
                "kv_len_range": None if shape is None else [int(row["S_min"]), int(row["S_max"])],
                "kv_bytes": nbytes,
                "hbm_floor_ns": int(floor) if floor else None,
                "x_hbm_floor": round(spent / floor, 2) if floor else None,
                "combine_ns": int(combine_ns) if already else None,
                "combine_grid": as_int(row["combine_grid"]) if already else None,
                "median_ns": int(row["median_ns"]),
                "share_of_gpu_time": round(share, 4),
                "bound_ns": int(ideal),
                "basis": basis,
                "library": library,
                "library_change": change,
            },
            suggestion={"num_splits": split, "min_keys_per_split": int(rule["min_keys_per_split"])},
            tier=4,
            savings_unit="gpu",
        ))
    return out
