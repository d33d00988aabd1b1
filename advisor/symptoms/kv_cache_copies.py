"""kv_cache_copies: a KV cache copied every decode step (Tier 2: data movement the program adds).

What it detects, from the host ops that launched the kernels (Kineto cpu_ops with Input Dims,
emit_nvtx ranges with sizes; a trace without shapes gets nothing from this rule), around decode
attention: an attention op whose queries are at most `max_decode_query` positions (SDPA and the
fused attention ops, or a score matmul [B, H, Lq, D] @ [B, H, D, S] of eager attention):
- `cat_cache`: the cache kept by torch.cat: `aten::cat` of two 4-D tensors that agree in every
  dimension but the sequence one ([B, H, S, D] or [B, S, H, D]), the first (the cache) at least
  `min_cache_len` long and the second (this step's tokens) at most `max_new_tokens`, at one site
  `min_steps` times or more, the next attention op on the thread reading exactly the concatenated
  length (a cache grown each step, or a sliding window shifted by cat). Each step copies the
  whole cache to append a token.
- `repeat_kv`: grouped K/V repeated to the query heads before decode attention: copy ops
  (reshape, clone, contiguous, repeat, repeat_interleave, flatten) whose input is the expanded K
  or V (`[B, Hkv, n_rep, S, D]`, as transformers' repeat_kv reshapes an expand) or, for repeat
  and repeat_interleave, the grouped one (`[B, Hkv, S, D]`), two of them (K and V) before one
  attention op whose K has the query heads' count and the same B, S and D.
Why it matters: both copy the cache every step (the repeat n_rep times over), and attention on
repeated heads reads n_rep times the bytes it needs.
What to do: preallocate the cache and write in place (`static_kv_cache`); give attention the
grouped K/V (`native_gqa`: SDPA `enable_gqa=True`, FlashAttention).
Estimate: cat_cache, each cat launch's time over what the in-place write costs (its launch,
`inplace_write_ns`, or the new tokens' bytes at the measured bandwidth); repeat_kv, the repeat
copies' whole time (one finding on the copy kernels) and, where the attention is cuDNN's on a
Hopper-or-later GPU (what grouped K/V were measured on), its time x (1 - `grouped_attention_keep`)
never below reading the grouped K/V once (a second finding, on the attention kernels).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from ..basics import input_dims, input_dtypes, op_base
from ..findings import Finding
from ..rules import Rule
from .attention import ELEMENT_BYTES, attention_backend
from .calibration import measured_bandwidth
from .context import Context, as_int, by_device, finding_for, group_launches, launch_rows
from .decode_attention import attention_ranges
from .gemm import _extract_sizes, innermost_ranges
from .kernel_kinds import device_row
from .strings import contains

SYMPTOM = "kv_cache_copies"
REQUIRES = (("kernels", "name", "Does the trace name its kernels?"),)

_CAT = r"^(?:aten::)?cat\b"
_COPY = r"^(?:aten::)?(?:reshape|clone|contiguous|repeat_interleave|repeat|flatten|_unsafe_view|copy_)\b"
_REPEAT_OPS = {"repeat", "repeat_interleave"}
_MATMUL = r"^(?:aten::)?(?:matmul|bmm|baddbmm)\b"
# emit_nvtx texts worth parsing for a repeat: a 5-D first input, or a repeat op
_NVTX_REPEAT = r"^(?:aten::)?repeat|sizes = \[\[\d+, \d+, \d+, \d+, \d+\]"
_MAX_EXTENT = 2**31 - 1
_RANGE_COLS = ["rank", "thread_id", "start_ns", "end_ns", "op", "tensors", "elt"]
_READ_COLS = ["rank", "thread_id", "start_ns", "end_ns", "B", "Hq", "Hkv", "Lq", "S", "D", "dtype"]
# CatArrayBatchedCopy<OpaqueType<2u>, ...>: the element size ATen's cat kernel moves
_OPAQUE = re.compile(r"OpaqueType<(\d+)u?>")

FIX_CAT = ("model.generate(..., cache_implementation=\"static\") (transformers), or a buffer of the longest length "
           "written in place: k_cache[:, :, pos:pos + n] = k_new")
FIX_GQA = ("out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)   # k, v: [B, H_kv, S, D]")


def _tensors(dims) -> list[list[int]]:
    """The tensor shapes of an op's input dims, a TensorList (Kineto nests it, emit_nvtx
    flattens it) taken apart; scalars and empty entries left out."""
    out: list[list[int]] = []
    if not isinstance(dims, list):
        return out
    for d in dims:
        if isinstance(d, list) and d and all(isinstance(x, int) and not isinstance(x, bool) for x in d):
            out.append(d)
        elif isinstance(d, list) and d and all(isinstance(t, list) for t in d):
            out.extend(t for t in d if t and all(isinstance(x, int) and not isinstance(x, bool) for x in t))
    return [t for t in out if all(0 <= x <= _MAX_EXTENT for x in t)]


def _per_distinct(values: pd.Series, parse) -> list:
    """parse(v) for every value, computed once per distinct value (None for missing ones)."""
    codes, uniques = pd.factorize(values)
    parsed = [parse(u) for u in uniques] + [None]
    return [parsed[c] for c in codes]


def _host_ranges(ctx: Context, pattern: str, nvtx_filter: str | None = None) -> pd.DataFrame:
    """Host ranges whose op matches `pattern`, with their input tensors' shapes and the first
    input's element size where the trace gives it (Kineto Input type). `nvtx_filter`: a cheap
    regular expression an emit_nvtx text must also match to be parsed."""
    parts = []
    ops = ctx.trace.cpu_ops
    if len(ops) and "input_dims" in ops.columns:
        sub = ops[contains(ops["name"], pattern).to_numpy() & ops["input_dims"].notna().to_numpy()]
        if len(sub):
            types = sub["input_types"] if "input_types" in sub.columns else pd.Series([None] * len(sub), index=sub.index)
            # each distinct text parsed once: a decode loop repeats the same few shapes
            parts.append(pd.DataFrame({
                "rank": sub["rank"].to_numpy(), "thread_id": sub["thread_id"].array,
                "start_ns": sub["start_ns"].to_numpy(), "end_ns": sub["end_ns"].to_numpy(),
                "op": _per_distinct(sub["name"], lambda n: op_base(str(n))),
                "tensors": _per_distinct(sub["input_dims"], lambda d: _tensors(input_dims(d))),
                "elt": _per_distinct(types, lambda t: ELEMENT_BYTES.get(next((d for d in input_dtypes(t) if d), None) or "")),
            }))
    nv = ctx.trace.nvtx
    if len(nv) and "thread_id" in nv.columns:
        keep = contains(nv["text"], pattern).to_numpy()
        if nvtx_filter is not None and keep.any():
            keep = keep & contains(nv["text"], nvtx_filter).to_numpy()
        sub = nv[keep]
        if len(sub):
            texts = sub["text"].astype(str)
            parts.append(pd.DataFrame({
                "rank": sub["rank"].to_numpy(), "thread_id": sub["thread_id"].array,
                "start_ns": sub["start_ns"].to_numpy(), "end_ns": sub["end_ns"].to_numpy(),
                "op": [op_base(t.split(",", 1)[0]) for t in texts],
                "tensors": [_tensors(_extract_sizes(t)) for t in texts],
                "elt": [None] * len(sub),
            }))
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=_RANGE_COLS)
    out = pd.concat(parts, ignore_index=True)
    return out[out["start_ns"].notna() & out["end_ns"].notna()].reset_index(drop=True)


# Head dims in use run to 256 (Gemma, 576 for MLA's absorbed keys); a longer "head dim" is a
# sequence length
_MAX_HEAD_DIM = 1024


def _score_matmul(op: str, tensors: list[list[int]]) -> tuple | None:
    """(B, Hq, Hkv, Lq, S, D) of eager attention's score matmul q [B, Hq, Lq, D] @ k^T
    [B, Hkv, D, S] (baddbmm's added term first dropped), else None."""
    ts = tensors[1:] if op == "baddbmm" and len(tensors) == 3 else tensors
    if len(ts) != 2 or len(ts[0]) != 4 or len(ts[1]) != 4:
        return None
    (B, Hq, Lq, D), (Bk, Hk, Dk, S) = ts[0], ts[1]
    # D <= _MAX_HEAD_DIM: the output matmul p [B, H, Lq, S] @ v [B, H, S, D] has the same
    # form with S and D swapped, and reads no K
    if Bk != B or Dk != D or min(B, Hq, Hk, Lq, D, S) < 1 or D > _MAX_HEAD_DIM:
        return None
    return B, Hq, Hk, Lq, S, D


def attention_reads(ctx: Context, rule: Rule) -> pd.DataFrame:
    """Decode attention ops (queries <= max_decode_query) with the K they read: SDPA and the
    fused attention ops (decode_attention.attention_ranges), and eager attention's score
    matmuls. Sorted by start; `fused` says which of the two kinds."""
    key = "kv_cache_copies.reads"
    if key in ctx.cache:
        return ctx.cache[key]
    parts = []
    fused = attention_ranges(ctx.trace)
    if len(fused):
        parts.append(fused.assign(fused=True)[_READ_COLS + ["fused"]])
    mm = _host_ranges(ctx, _MATMUL)
    if len(mm):
        got = [_score_matmul(o, t) for o, t in zip(mm["op"], mm["tensors"])]
        ok = np.array([g is not None for g in got], dtype=bool)
        if ok.any():
            vals = np.array([g for g in got if g is not None], dtype=np.int64)
            m = mm[ok].reset_index(drop=True)
            parts.append(pd.DataFrame({"rank": m["rank"].to_numpy(), "thread_id": m["thread_id"].array,
                                       "start_ns": m["start_ns"].to_numpy(), "end_ns": m["end_ns"].to_numpy(),
                                       **{c: vals[:, i] for i, c in enumerate(("B", "Hq", "Hkv", "Lq", "S", "D"))},
                                       "dtype": None, "fused": False}))
    parts = [p for p in parts if len(p)]
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=_READ_COLS + ["fused"])
    if len(out):
        out = out[(out["Lq"].astype(float) <= float(rule["max_decode_query"])).to_numpy(dtype=bool)]
        out = out.sort_values("start_ns", kind="stable").reset_index(drop=True)
    ctx.cache[key] = out
    return out


def _next_read(cand: pd.DataFrame, reads: pd.DataFrame) -> np.ndarray:
    """Per candidate range: the row of `reads` that starts first at or after the candidate's
    end on the same rank and thread, or -1."""
    out = np.full(len(cand), -1, dtype=np.int64)
    if cand.empty or reads.empty:
        return out
    for (rank, tid), rows in reads.groupby(["rank", "thread_id"], sort=False):
        on = ((cand["rank"] == rank) & (cand["thread_id"] == tid)).fillna(False).to_numpy(dtype=bool)
        if not on.any():
            continue
        starts = rows["start_ns"].to_numpy(np.float64)  # reads are sorted by start
        at = np.searchsorted(starts, cand.loc[on, "end_ns"].to_numpy(np.float64), side="left")
        ok = at < len(starts)
        pick = np.full(int(on.sum()), -1, dtype=np.int64)
        pick[ok] = rows.index.to_numpy()[at[ok]]
        out[np.flatnonzero(on)] = pick
    return out


def _appended(tensors: list[list[int]], rule: Rule) -> tuple[int, int, int, tuple] | None:
    """(sequence dimension, cache length, new length, the other extents) of a cat that appends
    a few positions to a long 4-D K or V ([B, H, S, D] or [B, S, H, D]), else None."""
    if len(tensors) != 2:
        return None
    a, b = tensors
    if len(a) != 4 or len(b) != 4:
        return None
    diff = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(diff) != 1 or diff[0] not in (1, 2):
        return None
    ax = diff[0]
    if a[ax] < rule["min_cache_len"] or not 1 <= b[ax] <= rule["max_new_tokens"]:
        return None
    return ax, a[ax], b[ax], tuple(a[:ax] + a[ax + 1:])


def _cat_cache(ctx: Context, rule: Rule, reads: pd.DataFrame) -> pd.DataFrame:
    """The cat ranges that append to a cache each step, with the new tokens' element count and
    whether the attention after them read grouped K/V (fewer K heads than query heads)."""
    cats = _host_ranges(ctx, _CAT)
    if cats.empty or reads.empty:
        return cats.iloc[:0]
    parsed = [_appended(t, rule) for t in cats["tensors"]]
    keep = np.array([p is not None for p in parsed], dtype=bool)
    cats = cats[keep].reset_index(drop=True)
    if cats.empty:
        return cats
    parsed = [p for p in parsed if p is not None]
    cats["cache_len"] = [p[1] for p in parsed]
    cats["site"] = [(p[0], p[3]) for p in parsed]
    cats["new_elems"] = [math.prod(t[1]) for t in cats["tensors"]]
    total = np.array([p[1] + p[2] for p in parsed], dtype=float)
    nxt = _next_read(cats, reads)
    has = nxt >= 0
    s_next = np.full(len(cats), -1.0)
    s_next[has] = reads["S"].to_numpy(dtype=float)[nxt[has]]
    cats["read_next"] = s_next == total
    grouped = np.zeros(len(cats), dtype=bool)
    grouped[has] = (reads["Hkv"].to_numpy(dtype=float) < reads["Hq"].to_numpy(dtype=float))[nxt[has]]
    cats["grouped_next"] = grouped & cats["read_next"].to_numpy(dtype=bool)
    site = cats.groupby(["rank", "thread_id", "site"], sort=False, dropna=False)
    n = site["cache_len"].transform("size")
    read = site["read_next"].transform("mean") >= 0.5
    cats["growing"] = (site["cache_len"].transform("nunique") > 1).to_numpy(dtype=bool)
    return cats[((n >= rule["min_steps"]) & read).to_numpy(dtype=bool)].reset_index(drop=True)


def _repeat_factor(op: str, t: list[int], B, Hq, Hk, S, D) -> int:
    """n_rep when tensor `t`, the first input of copy op `op`, is the expanded (or, for repeat
    ops, grouped) K or V of an attention that read Hk == Hq heads of B x S x D, else 0."""
    if Hk != Hq or t[0] != B or t[-1] != D:
        return 0
    if len(t) == 5 and t[2] > 1 and t[3] == S and t[1] * t[2] == Hq:  # [B, Hkv, n_rep, S, D]
        return t[2]
    if len(t) == 5 and t[3] > 1 and t[1] == S and t[2] * t[3] == Hq:  # [B, S, Hkv, n_rep, D]
        return t[3]
    if len(t) == 4 and op in _REPEAT_OPS:
        h = t[1] if t[2] == S else (t[2] if t[1] == S else 0)
        if 0 < h < Hq and Hq % h == 0:
            return Hq // h
    return 0


def _repeat_kv(ctx: Context, reads: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The copy ranges that repeat K/V to the query heads (with n_rep), and the attention reads
    they fed (with n_rep): at least two copies (K and V) per read."""
    none = (pd.DataFrame(columns=_RANGE_COLS + ["n_rep"]), reads.iloc[:0].assign(n_rep=[]))
    if reads.empty or not (reads["Hkv"] == reads["Hq"]).any():
        return none
    copies = _host_ranges(ctx, _COPY, nvtx_filter=_NVTX_REPEAT)
    if copies.empty:
        return none
    first = [t[0] if t else [] for t in copies["tensors"]]
    cand = np.array([len(f) == 5 or (len(f) == 4 and op in _REPEAT_OPS) for f, op in zip(first, copies["op"])],
                    dtype=bool)
    copies = copies[cand].reset_index(drop=True)
    nxt = _next_read(copies, reads)
    cols = {c: reads[c].to_numpy(dtype=np.int64) for c in ("B", "Hq", "Hkv", "S", "D")}
    reps = np.array([_repeat_factor(op, ts[0], *(cols[c][j] for c in ("B", "Hq", "Hkv", "S", "D"))) if j >= 0 else 0
                     for op, ts, j in zip(copies["op"], copies["tensors"], nxt)], dtype=np.int64)
    hit = reps > 1
    copies = copies[hit].assign(n_rep=reps[hit], read_row=nxt[hit]).reset_index(drop=True)
    per_read = copies.groupby("read_row")["n_rep"].agg(["size", "max"])
    per_read = per_read[per_read["size"] >= 2]  # K and V both repeated: one repeated tensor is no GQA
    copies = copies[copies["read_row"].isin(per_read.index)]
    fed = reads.loc[per_read.index].assign(n_rep=per_read["max"].to_numpy())
    return copies.drop(columns=["read_row"]).reset_index(drop=True), fed.reset_index(drop=True)


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    """One row per kernel launch that a cache copy made: pattern (cat_cache, repeat_kv, or
    repeat_attention for fused attention launches fed repeated K/V), its duration, and what the
    estimate needs (new tokens' bytes; n_rep and the grouped K/V bytes)."""
    cols = ["pos", "pattern", "dur_ns", "new_bytes", "n_rep", "grouped_kv_bytes", "backend", "example", "growing",
            "grouped_next"]
    k = ctx.kernels
    if k.empty:
        return pd.DataFrame(columns=cols)
    reads = attention_reads(ctx, rule)
    if reads.empty:
        return pd.DataFrame(columns=cols)
    parts = []
    cats = _cat_cache(ctx, rule, reads)
    if len(cats):
        ranges, hit = innermost_ranges(ctx.trace, cats)
        pos = np.flatnonzero(hit >= 0)
        r = ranges.iloc[hit[pos]]
        names = k["name"].astype(str).to_numpy()[pos]
        elt = [e if e else int(m.group(1)) if (m := _OPAQUE.search(nm)) else 2 for e, nm in zip(r["elt"], names)]
        parts.append(pd.DataFrame({
            "pos": pos, "pattern": "cat_cache", "dur_ns": k["dur_ns"].to_numpy(dtype=float)[pos],
            "new_bytes": r["new_elems"].to_numpy(dtype=float) * np.array(elt, dtype=float),
            "example": [f"{t[0]} + {t[1]}" for t in r["tensors"]], "growing": r["growing"].to_numpy(dtype=bool),
            "grouped_next": r["grouped_next"].to_numpy(dtype=bool)}))
    copies, fed = _repeat_kv(ctx, reads)
    if len(copies):
        ranges, hit = innermost_ranges(ctx.trace, copies)
        pos = np.flatnonzero(hit >= 0)
        r = ranges.iloc[hit[pos]]
        parts.append(pd.DataFrame({
            "pos": pos, "pattern": "repeat_kv", "dur_ns": k["dur_ns"].to_numpy(dtype=float)[pos],
            "n_rep": r["n_rep"].to_numpy(dtype=float), "example": [str(t[0]) for t in r["tensors"]]}))
        ranges, hit = innermost_ranges(ctx.trace, fed)
        names = k["name"].to_numpy()
        pos = np.flatnonzero(hit >= 0)
        backends = [attention_backend(n) for n in names[pos]]
        keep = np.array([b is not None for b in backends], dtype=bool)  # attention kernels, not mask fills
        pos = pos[keep]
        if len(pos):
            r = ranges.iloc[hit[pos]]
            elt = r["dtype"].map(ELEMENT_BYTES).fillna(2).to_numpy(dtype=float)
            grouped = 2 * r["B"].to_numpy(float) * (r["Hq"].to_numpy(float) / r["n_rep"].to_numpy(float)) \
                * r["S"].to_numpy(float) * r["D"].to_numpy(float) * elt
            parts.append(pd.DataFrame({
                "pos": pos, "pattern": "repeat_attention", "dur_ns": k["dur_ns"].to_numpy(dtype=float)[pos],
                "n_rep": r["n_rep"].to_numpy(dtype=float), "grouped_kv_bytes": grouped,
                "backend": [b[0] for b, ok in zip(backends, keep) if ok],
                "example": [f"q [{b}, {hq}, {lq}, {d}], K/V {s} keys" for b, hq, lq, d, s in
                            zip(r["B"], r["Hq"], r["Lq"], r["D"], r["S"])]}))
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame(columns=cols)
    out = pd.concat(parts, ignore_index=True).reindex(columns=cols)
    return out.drop_duplicates("pos", keep="first").reset_index(drop=True)  # one pattern a launch


def _calibrated(ctx: Context, rank, dev) -> bool:
    """Whether grouped K/V's attention time was measured for this device's kind: cuDNN SDPA on a
    Hopper-or-later GPU (docs/kv_cache.md)."""
    major = (device_row(ctx, rank, dev) or {}).get("cc_major")
    return major is not None and not pd.isna(major) and int(major) >= 9


def _savings(ev: pd.DataFrame, rule: Rule, bw: float | None, calibrated: bool) -> np.ndarray:
    dur = ev["dur_ns"].to_numpy(dtype=float)
    pat = ev["pattern"].to_numpy()
    out = np.zeros(len(ev))
    cat = pat == "cat_cache"
    write = np.full(len(ev), float(rule["inplace_write_ns"]))
    if bw:
        write = np.maximum(write, 2 * ev["new_bytes"].fillna(0).to_numpy(dtype=float) / bw * 1e9)
    out[cat] = np.maximum(dur[cat] - write[cat], 0.0)
    rep = pat == "repeat_kv"
    out[rep] = dur[rep]
    att = (pat == "repeat_attention") & (ev["backend"].to_numpy() == "cudnn") & calibrated
    keep = dur * float(rule["grouped_attention_keep"])
    if bw:
        keep = np.maximum(keep, ev["grouped_kv_bytes"].fillna(0).to_numpy(dtype=float) / bw * 1e9)
    out[att] = np.maximum(dur[att] - keep[att], 0.0)
    return out


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    if ev.empty:
        return out
    k = ctx.kernels
    pos = ev["pos"].to_numpy()
    ev = ev.assign(rank=k["rank"].to_numpy()[pos],
                   device_id=k["device_id"].iloc[pos].astype("Float64").to_numpy(dtype=float, na_value=np.nan))
    for (rank, dev), grp in by_device(ev):
        bw = measured_bandwidth(device_row(ctx, rank, dev) or {})
        calibrated = _calibrated(ctx, rank, dev)
        grp = grp.assign(save=_savings(grp, rule, bw, calibrated))
        for pattern, parts in (("cat_cache", ("cat_cache",)), ("repeat_kv", ("repeat_kv", "repeat_attention"))):
            sub = grp[grp["pattern"].isin(parts)]
            savings = float(sub["save"].sum())
            share = ctx.share(rank, dev, savings)
            if sub.empty or savings < rule["min_savings_ns"] or not share >= rule["min_savings_share"]:
                continue
            if pattern == "cat_cache":
                out.append(_cat_finding(ctx, rule, sub, share, rank, dev))
            else:
                out += _repeat_findings(ctx, rule, sub, share, rank, dev, bw, calibrated)
    return out


def _top_row(ctx: Context, positions: np.ndarray) -> dict:
    """The biggest launch group (kernel, grid) among the kernels at `positions`."""
    k = ctx.kernels
    mask = np.zeros(len(k), dtype=bool)
    mask[positions] = True
    return group_launches(launch_rows(k, mask, []), [], k).iloc[0].to_dict()


def _names(ctx: Context, positions: np.ndarray) -> list[str]:
    return sorted({str(n) for n in ctx.kernels["name"].to_numpy()[positions]})


def _example(sub: pd.DataFrame) -> str:
    return str(sub.sort_values("dur_ns", ascending=False, kind="stable")["example"].iloc[0])


def _cat_finding(ctx: Context, rule: Rule, sub: pd.DataFrame, share: float, rank, dev) -> Finding:
    write = float(rule["inplace_write_ns"])
    savings = float(sub["save"].sum())
    # a model whose attention reads grouped K/V: under transformers' SDPA path a static cache's
    # mask makes it repeat them (native_gqa's copies), which can eat the gain
    grouped = bool(sub["grouped_next"].fillna(False).astype(bool).any())
    return finding_for(
        rule, _top_row(ctx, sub["pos"].to_numpy()),
        strategy=rule.strategy_for("cat_cache"),
        rank=as_int(rank), device_id=None if dev < 0 else int(dev), shape=None,
        launches=int(len(sub)), total_ns=int(sub["dur_ns"].sum()), est_savings_ns=int(savings),
        confidence="medium" if grouped else "high", tier=2,
        evidence={"pattern": "cat_cache", "copy_launches": int(len(sub)), "copy_ns": int(sub["dur_ns"].sum()),
                  "example_inputs": _example(sub), "growing": bool(sub["growing"].fillna(False).astype(bool).any()),
                  "attention_reads_grouped_kv": grouped, "share_of_gpu_time": round(share, 4),
                  "bound_ns": int(len(sub) * write), "covers_kernels": _names(ctx, sub["pos"].to_numpy()),
                  "basis": (f"each cat launch's time over what writing its new tokens in place costs: at least "
                            f"{write / 1e3:.1f} us a launch (the slowest in-place write measured on the H200) or the new "
                            f"tokens' bytes read and written at the measured bandwidth")
                  + ("; the attention reads grouped K/V: keep it so (native_gqa) when the cache is preallocated, or "
                     "transformers' SDPA path repeats them under the static cache's mask" if grouped else "")},
        suggestion={"fix": FIX_CAT},
    )


def _repeat_findings(ctx: Context, rule: Rule, sub: pd.DataFrame, share: float, rank, dev,
                     bw: float | None, calibrated: bool) -> list[Finding]:
    """The repeat copies (kernel: the copy), and the attention's excess where it was measured
    (kernel: the attention): two findings, so that each shares its budget with any other
    finding on the same kernels."""
    copies = sub[sub["pattern"] == "repeat_kv"]
    att = sub[sub["pattern"] == "repeat_attention"]
    keep = float(rule["grouped_attention_keep"])
    backends = sorted({str(b) for b in att["backend"].dropna()})
    measured = calibrated and backends == ["cudnn"]
    common = {"pattern": "repeat_kv", "n_rep": int(sub["n_rep"].max()), "copy_launches": int(len(copies)),
              "copy_ns": int(copies["dur_ns"].sum()), "attention_launches": int(len(att)),
              "attention_ns": int(att["dur_ns"].sum()), "attention_backends": backends,
              "attention_excess_ns": int(att["save"].sum()), "share_of_gpu_time": round(share, 4)}
    why_att = (f"decode attention's time x {1 - keep:.2f} (grouped K/V ran at most {keep:.2f} of the repeated ones' "
               f"time in cuDNN on the H200), never below reading the grouped K/V once at the measured bandwidth")
    fix_note = ("" if measured else "; grouped K/V with a mask were measured in cuDNN on the H200 only: check which "
                "backend takes them here (a math fallback repeats them itself)")
    out = []
    if len(copies):
        out.append(finding_for(
            rule, _top_row(ctx, copies["pos"].to_numpy()),
            strategy=rule.strategy_for("repeat_kv"),
            rank=as_int(rank), device_id=None if dev < 0 else int(dev), shape=None,
            launches=int(len(copies)), total_ns=int(copies["dur_ns"].sum()),
            est_savings_ns=int(copies["save"].sum()), confidence="high" if measured else "medium", tier=2,
            evidence={**common, "example_inputs": _example(copies), "bound_ns": 0,
                      "covers_kernels": _names(ctx, sub["pos"].to_numpy()),
                      "basis": "the repeat copies' whole time: attention on grouped K/V needs none" + fix_note},
            suggestion={"fix": FIX_GQA}))
    save_att = float(att["save"].sum())
    if save_att >= rule["min_savings_ns"]:
        floor = float(att["grouped_kv_bytes"].sum()) / bw * 1e9 if bw else 0.0
        out.append(finding_for(
            rule, _top_row(ctx, att["pos"].to_numpy()),
            strategy=rule.strategy_for("repeat_kv"),
            rank=as_int(rank), device_id=None if dev < 0 else int(dev), shape=None,
            launches=int(len(att)), total_ns=int(att["dur_ns"].sum()), est_savings_ns=int(save_att),
            confidence="medium", tier=2,
            evidence={**common, "example_inputs": _example(att), "bound_ns": int(floor),
                      "covers_kernels": _names(ctx, att["pos"].to_numpy()), "basis": why_att},
            suggestion={"fix": FIX_GQA}))
    return out
