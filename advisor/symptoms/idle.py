"""Where and why the GPU sat idle: every gap between a device's activities, with who was late.

A gap ends when the next kernel (or copy) starts. Its launch call (joined by correlation id)
says whose turn it was: if the host issued that call only after the GPU had gone idle, the
GPU waited on the host (`host_bound`: the CPU was still launching); if the call was issued
before, the work was queued and waited on something on the device side (a dependency, an
event, another stream: `host_bound` false). Gaps without a launch call to judge by are
`host_bound` NA. launch_overhead sums the short host-bound gaps (what a CUDA graph removes);
the gate names the long ones and tells a one-off start-up gap from recurring waits.

`host_context` says what the host was doing during a gap: the runtime calls that overlapped
it and the innermost NVTX range or framework op around it.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..model import constant_view
from . import intervals
from .context import Context, id_array
from .gemm import _launch_arrays

# Calls that return only when the GPU has drained: the synchronises, and the blocking copies:
# cudaMemcpy/cuMemcpyDtoH and their HIP twins, plus hipMemcpyWithStream, which PyTorch on ROCm
# uses for every blocking copy (.item(), .cpu()) where CUDA builds call cudaMemcpyAsync +
# cudaStreamSynchronize (c10 memcpy_and_sync).
SYNC_CALLS = re.compile(
    r"synchronize|^cudaMemcpy(?:2D|3D)?(?:_v\d+)?$|^cuMemcpy[DH]to[DH](?:_v\d+)?$|"
    r"^hipMemcpy(?:2D|3D|WithStream|[DH]to[DH])?$|cudaStreamWaitEvent_blocking",
    re.I,
)

_COLS = ["rank", "device_id", "gap_start_ns", "gap_ns", "next_pos", "thread_id", "host_bound"]


def gaps(ctx: Context) -> pd.DataFrame:
    """One row per idle gap on each (rank, device): when it starts (`gap_start_ns`, absolute),
    how long (`gap_ns`), the activity that ends it (`next_pos`: position in ctx.kernels, -1
    for a copy), that activity's launch thread (`thread_id`) and `host_bound` (the launch
    call came after the GPU went idle). Ranks the profiler serialized are left out. Cached,
    with only these columns (one row per gap is nearly one per kernel, so each column costs
    as much as one of the kernels'); `named` adds the next activity's name, the rank's first
    timestamp and the device's busy time before the gap to the few rows that need them."""
    if "idle_gaps" in ctx.cache:
        return ctx.cache["idle_gaps"]
    t = ctx.trace
    k = t.kernels
    launch_k, thread_k = _launch_arrays(t)
    # plain arrays, kernels then copies (a frame of them, its group-by and per-device sorted
    # copies held ~3x the result's memory at 2M events: docs/scale.md); the kernels' own
    # columns where there are no copies (np.concatenate of one array is a copy)
    rank = [k["rank"].to_numpy()]  # as stored (int32, or one value: no int64 copy)
    dev = [_device_ids(k)]
    start = [k["start_ns"].to_numpy(np.int64)]
    end = [k["end_ns"].to_numpy(np.int64)]
    launch_ns = [launch_k]
    # the kernels' launch threads as _launch_arrays gave them (Int32: 5 bytes a kernel, not a
    # float64 each) where there are no copies to join; as floats at the gaps' rows below
    thread = [thread_k if not len(t.memcpy) else thread_k.to_numpy("float64", na_value=np.nan)]
    del launch_k, thread_k
    m = t.memcpy
    if len(m):
        launch = np.full(len(m), np.nan)
        tid = np.full(len(m), np.nan)
        rt = t.runtime.dropna(subset=["correlation_id"]).drop_duplicates(["rank", "correlation_id"])
        if len(rt) and m["correlation_id"].notna().any():
            j = m[["rank", "correlation_id"]].reset_index(drop=True).reset_index().merge(
                rt[["rank", "correlation_id", "start_ns", "thread_id"]], on=["rank", "correlation_id"], how="inner")
            at = j["index"].to_numpy()
            launch[at] = j["start_ns"].to_numpy("float64")
            tid[at] = j["thread_id"].astype("Float64").to_numpy("float64", na_value=np.nan)
        rank.append(m["rank"].to_numpy(np.int64))
        dev.append(_device_ids(m))
        start.append(m["start_ns"].to_numpy(np.int64))
        end.append(m["end_ns"].to_numpy(np.int64))
        launch_ns.append(launch)
        thread.append(tid)
    rank, dev, start, end, launch_ns, thread = (x[0] if len(x) == 1 else np.concatenate(x)
                                                for x in (rank, dev, start, end, launch_ns, thread))
    nk = len(k)
    keep = ~np.isin(rank, np.fromiter(ctx.serialized_ranks, dtype=np.int64)) if ctx.serialized_ranks else None
    rows = np.flatnonzero(keep) if keep is not None else None  # None: all rows
    out = []
    n_rows = len(rank) if rows is None else len(rows)
    if n_rows:
        r_sel = rank if rows is None else rank[rows]
        d_sel = dev if rows is None else dev[rows]
        s_sel = start if rows is None else start[rows]
        if bool((r_sel == r_sel[0]).all() and (d_sel == d_sel[0]).all()):
            # one device: no grouping; rows by start time (stable), and the columns themselves
            # when they come sorted (a trace's kernels usually do)
            if n_rows > 1 and not bool(np.all(s_sel[1:] >= s_sel[:-1])):
                rows = (np.arange(n_rows) if rows is None else rows)[np.argsort(s_sel, kind="stable")]
            groups = [rows]
        else:
            # (rank, device) groups in order of first appearance, rows by start time within each
            # (stable: as groupby(sort=False) then sort_values(kind="stable") ordered them)
            group = pd.DataFrame({"r": r_sel, "d": d_sel}).groupby(["r", "d"], sort=False).ngroup().to_numpy()
            by = np.lexsort((s_sel, group))
            order = by if rows is None else rows[by]
            groups = np.split(order, np.flatnonzero(np.diff(group[by])) + 1)
            del by, group, order
        del r_sel, d_sel, s_sel
        for gi, sel in enumerate(groups):
            last = gi == len(groups) - 1  # the per-kernel arrays are let go once the last group took its rows
            s, e = (start, end) if sel is None else (start[sel], end[sel])
            frontier = np.maximum.accumulate(e)  # the device's last end so far
            # the activity before each gap (a start past every earlier end); the next one ends it
            prev = np.flatnonzero(s[1:] > frontier[:-1])
            if not len(prev):
                continue
            gstart = frontier[prev]
            del e, frontier
            prev += 1  # (in place) the activity that ends each gap
            gsize = s[prev]
            gsize -= gstart  # (in place: no array of every activity's gap)
            del s
            at = prev if sel is None else sel[prev]
            del prev
            # host-bound (NA where no launch call matched) and the launch threads at the gaps'
            # rows, a chunk at a time (the launch times of every gap at once were this step's peak)
            # (each per-kernel array let go before the next is read, on the last group)
            hb_v, hb_na = np.empty(len(at), dtype=bool), np.empty(len(at), dtype=bool)
            for lo in range(0, len(at), _CHUNK):
                sl = slice(lo, lo + _CHUNK)
                launch = launch_ns[at[sl]]
                hb_na[sl] = np.isnan(launch)
                hb_v[sl] = np.where(hb_na[sl], False, launch >= gstart[sl])
            hb = pd.arrays.BooleanArray(hb_v, hb_na)
            del hb_v, hb_na, launch
            if last:
                launch_ns = None
            tid = np.empty(len(at))
            for lo in range(0, len(at), _CHUNK):
                a = at[lo:lo + _CHUNK]
                tid[lo:lo + len(a)] = thread[a] if isinstance(thread, np.ndarray) else \
                    thread.take(a).to_numpy("float64", na_value=np.nan)
            if last:
                thread = None
            first = 0 if sel is None else sel[0]
            r, d = int(rank[first]), int(dev[first])
            next_pos = at.astype(_small(nk))  # (a copy: not at's int64 through np.where)
            next_pos[at >= nk] = -1  # a copy ends it
            del at
            # the group's rank and device, and one launch thread (the usual case), as one value
            # seen through a zero-stride view (model.constant_view): the cache's largest
            # columns after the times
            # gap lengths int32 where they all fit (~2.1 s): a sum of them is int64 in numpy
            gsize = gsize.astype(np.int32) if not len(gsize) or int(gsize.max()) < 2**31 else gsize
            out.append(pd.DataFrame({
                "rank": _same(r, len(next_pos)), "device_id": _same(d, len(next_pos)),
                "gap_start_ns": gstart, "gap_ns": gsize, "next_pos": next_pos,
                "thread_id": constant_view(pd.Series(tid, copy=False)).to_numpy(), "host_bound": hb,
            }, copy=False))  # not consolidated: concat copies them once below
            del gstart, gsize, hb, tid, next_pos
    del rank, dev, start, end, launch_ns, thread  # (before the conversion below)
    res = (out[0] if len(out) == 1 else pd.concat(out, ignore_index=True)) if out else pd.DataFrame(columns=_COLS)
    del out
    tid = res["thread_id"]
    if len(res) > 1 and tid.dtype == np.float64 and tid.to_numpy().strides[0]:
        # the few launch threads as a categorical of them (1-2 bytes a gap, was 8); readers
        # take it as floats (to_numpy, a row's value), NaN where unknown, as before
        res["thread_id"] = _few_values(tid.to_numpy())
    ctx.cache["idle_gaps"] = res
    return res


def _device_ids(f: pd.DataFrame) -> np.ndarray:
    """device_id as int64, -1 where missing."""
    return id_array(f["device_id"])


_CHUNK = 1 << 20  # gaps per step where their launches are looked up


def _few_values(values: np.ndarray, chunk: int = 1 << 20):
    """Floats as a categorical of their distinct values (NaN: missing), built a chunk at a
    time (pd.Categorical's factorize held int64 codes and a hash of every value); `values`
    itself where they are not few."""
    parts = [np.unique(values[lo:lo + chunk]) for lo in range(0, len(values), chunk)]
    cats = np.unique(np.concatenate(parts)) if parts else np.empty(0)
    cats = cats[~np.isnan(cats)]
    if len(cats) >= 2**15:
        return values
    codes = np.empty(len(values), dtype=np.int8 if len(cats) < 2**7 else np.int16)
    for lo in range(0, len(values), chunk):
        v = values[lo:lo + chunk]
        c = np.searchsorted(cats, v)
        c[np.isnan(v)] = -1
        codes[lo:lo + chunk] = c
    return pd.Categorical.from_codes(codes, categories=cats)


def _same(v: int, n: int) -> np.ndarray:
    """`v` n times (int32 where it fits), read-only and zero-stride."""
    return np.broadcast_to(np.array([v], dtype=_small(v)), (n,))


def _small(v: int):
    """int32 for ids and positions that fit (4 bytes a gap instead of 8)."""
    return np.int32 if -(2**31) <= v < 2**31 else np.int64


def named(ctx: Context, rows: pd.DataFrame, busy: bool = False) -> pd.DataFrame:
    """Rows of gaps(ctx) with `next_name` (the kernel's name, NaN where missing, or "memcpy
    <kind>" for a copy) and `trace_start_ns` (the rank's first timestamp) added; with `busy`,
    `busy_before_ns` too (the device's busy time before the gap: one pass over its activities
    per row)."""
    starts = _rank_starts(ctx)
    if busy:
        rows = rows.assign(busy_before_ns=np.array(
            [busy_before(ctx, r, d, int(t0) + int(n)) for r, d, t0, n in
             zip(rows["rank"], rows["device_id"], rows["gap_start_ns"], rows["gap_ns"])], dtype=np.int64))
    names = _names(ctx, rows["rank"].to_numpy(), rows["device_id"].to_numpy(),
                   rows["gap_start_ns"].to_numpy() + rows["gap_ns"].to_numpy(), rows["next_pos"].to_numpy())
    # an object column, as gaps() held it (an object ndarray would become pandas 3's str)
    return rows.assign(next_name=pd.Series(names, index=rows.index, dtype=object),
                       trace_start_ns=np.array([starts[int(r)] for r in rows["rank"]], dtype=np.int64))


def busy_before(ctx: Context, rank, device_id, t: int) -> int:
    """Merged length of the device's kernels and copies that start before `t` (for a gap
    ending at `t`: all that ran before it, as every one of them ended by the gap's start)."""
    starts, ends = [], []
    for f in (ctx.trace.kernels, ctx.trace.memcpy):
        if len(f):
            st = f["start_ns"].to_numpy()
            on = (f["rank"].to_numpy() == rank) & (_device_ids(f) == device_id) & (st < t)
            starts.append(st[on])
            ends.append(f["end_ns"].to_numpy()[on])
    return intervals.total(np.concatenate(starts), np.concatenate(ends)) if starts else 0


def next_names(ctx: Context, at: np.ndarray) -> np.ndarray:
    """named()'s `next_name` for the gaps at positions `at` of gaps(ctx), as an object array."""
    g = ctx.cache["idle_gaps"]
    return _names(ctx, g["rank"].to_numpy()[at], g["device_id"].to_numpy()[at],
                  g["gap_start_ns"].to_numpy()[at] + g["gap_ns"].to_numpy()[at], g["next_pos"].to_numpy()[at])


def rank_start(ctx: Context, rank) -> int:
    """The rank's first timestamp (named()'s `trace_start_ns`)."""
    return _rank_starts(ctx)[int(rank)]


def _names(ctx: Context, r_rank, r_dev, r_end, pos) -> np.ndarray:
    k, m = ctx.trace.kernels, ctx.trace.memcpy
    next_name = np.empty(len(pos), dtype=object)
    is_kernel = pos >= 0
    next_name[is_kernel] = k["name"].array.take(pos[is_kernel]).to_numpy(dtype=object, na_value=np.nan)
    if not is_kernel.all():
        # the copy that ends the gap: its device's first copy (in frame order) starting then,
        # as gaps() ordered kernels, then copies, by start time (stable)
        copy_rank, copy_start, copy_dev = m["rank"].to_numpy(), m["start_ns"].to_numpy(), _device_ids(m)
        for i in np.flatnonzero(~is_kernel):
            at = np.flatnonzero((copy_rank == r_rank[i]) & (copy_dev == r_dev[i]) & (copy_start == r_end[i]))[0]
            kind = m["kind"].iloc[at]
            next_name[i] = "memcpy " + ("?" if pd.isna(kind) else str(kind))
    return next_name


def _rank_starts(ctx: Context) -> dict[int, int]:
    """Each rank's first timestamp over kernels, copies and runtime calls: where "t = 0" is
    for a person reading the timeline. Cached."""
    if "rank_starts" not in ctx.cache:
        ctx.cache["rank_starts"] = _first_times(ctx.trace)
    return ctx.cache["rank_starts"]


def _first_times(t) -> dict[int, int]:
    # each frame's minimum, then theirs (a concat of the three frames' columns was a copy)
    mins = [f.groupby("rank")["start_ns"].min() for f in (t.kernels, t.memcpy, t.runtime) if len(f)]
    if not mins:
        return {}
    return pd.concat(mins).groupby(level=0).min().astype("int64").to_dict()


def _host_arrays(ctx: Context, frame: str, col: str | None) -> tuple:
    """rank, start, end (and the thread id column; or whether `col` is set) of a host frame
    as plain arrays, once per diagnosis: host_context is asked about tens of gaps, and
    comparing pandas columns (a notna over a million Python strings each time) cost ~1 s at
    2M events. The thread ids stay the frame's column, read at the few rows a gap overlaps
    (a float copy of them was kept for the rest of the diagnosis: 8 bytes a call)."""
    key = ("host_arrays", frame, col)
    if key not in ctx.cache:
        f = getattr(ctx.trace, frame)
        extra = f["thread_id"] if col is None else f[col].notna().to_numpy(dtype=bool)
        # ranks as stored (int32, or one value: model.constant_view), not an int64 copy
        ctx.cache[key] = (f["rank"].to_numpy(), f["start_ns"].to_numpy(np.int64), f["end_ns"].to_numpy(np.int64), extra)
    return ctx.cache[key]


def host_context(ctx: Context, rank: int, t0: int, t1: int, thread_id=None, top: int = 3) -> dict:
    """What the host of `rank` did during [t0, t1): the runtime calls that overlap it (on
    `thread_id` when given), most time first, and the innermost NVTX range or framework op
    (cpu_op) that spans the gap's middle. Plain data for evidence and report lines."""
    t = ctx.trace
    out: dict = {"api_calls": [], "range": None}
    rt = t.runtime
    if len(rt):
        rk, st, en, tid = _host_arrays(ctx, "runtime", None)
        at = np.flatnonzero((rk == rank) & (en > t0) & (st < t1))
        if thread_id is not None and not pd.isna(thread_id):
            on = at[tid.iloc[at].astype("Float64").to_numpy("float64", na_value=np.nan) == thread_id]
            at = on if len(on) else at
        if len(at):
            r = rt.iloc[at]
            ov = np.minimum(r["end_ns"].to_numpy(), t1) - np.maximum(r["start_ns"].to_numpy(), t0)
            by = pd.Series(ov, index=r["name"].astype(object).to_numpy()).groupby(level=0).agg(["sum", "size"])
            by = by.sort_values("sum", ascending=False).head(top)
            out["api_calls"] = [{"name": str(n), "calls": int(c), "overlap_ns": int(s)} for n, (s, c) in by.iterrows()]
    mid = (t0 + t1) // 2
    best = None
    for frame, col, kind in (("nvtx", "text", "nvtx"), ("cpu_ops", "name", "cpu_op")):
        df = getattr(t, frame)
        if not len(df):
            continue
        rk, st, en, has = _host_arrays(ctx, frame, col)
        f = df.iloc[np.flatnonzero((rk == rank) & (st <= mid) & (en >= mid) & has)]
        if len(f):
            row = f.loc[f["dur_ns"].idxmin()]
            if best is None or row["dur_ns"] < best[0]:
                best = (int(row["dur_ns"]), kind, str(row[col]))
    if best is not None:
        out["range"] = {"kind": best[1], "text": best[2][:200], "dur_ns": best[0]}
    return out
