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

import numpy as np
import pandas as pd

from .context import Context
from .gemm import _launch_points

_COLS = ["rank", "device_id", "gap_start_ns", "gap_ns", "next_pos", "next_name", "launch_ns", "thread_id",
         "host_bound", "busy_before_ns", "trace_start_ns"]


def gaps(ctx: Context) -> pd.DataFrame:
    """One row per idle gap on each (rank, device): when it starts (`gap_start_ns`, absolute;
    `trace_start_ns` is the rank's first timestamp), how long (`gap_ns`), the activity that ends
    it (`next_pos`: position in ctx.kernels, -1 for a copy; `next_name`), that activity's launch
    call (`launch_ns`, `thread_id`), `host_bound` (the call came after the GPU went idle) and the
    device's busy time before the gap. Ranks the profiler serialized are left out. Cached."""
    if "idle_gaps" in ctx.cache:
        return ctx.cache["idle_gaps"]
    t = ctx.trace
    k = t.kernels
    lp = _launch_points(t)
    # plain arrays, kernels then copies (a frame of them, its group-by and per-device sorted
    # copies held ~3x the result's memory at 2M events: docs/scale.md)
    rank = [k["rank"].to_numpy(np.int64)]
    dev = [k["device_id"].astype("Float64").fillna(-1).to_numpy("int64")]
    start = [k["start_ns"].to_numpy(np.int64)]
    end = [k["end_ns"].to_numpy(np.int64)]
    launch_ns = [lp["launch_ns"].to_numpy("float64")]
    thread = [lp["thread_id"].astype("Float64").to_numpy("float64", na_value=np.nan)]
    del lp
    m = t.memcpy
    copy_names = None
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
        dev.append(m["device_id"].astype("Float64").fillna(-1).to_numpy("int64"))
        start.append(m["start_ns"].to_numpy(np.int64))
        end.append(m["end_ns"].to_numpy(np.int64))
        launch_ns.append(launch)
        thread.append(tid)
        copy_names = ("memcpy " + m["kind"].astype(object).fillna("?").astype(str)).to_numpy()
    rank, dev, start, end = (np.concatenate(x) for x in (rank, dev, start, end))
    launch_ns, thread = np.concatenate(launch_ns), np.concatenate(thread)
    nk = len(k)
    keep = ~np.isin(rank, np.fromiter(ctx.serialized_ranks, dtype=np.int64)) if ctx.serialized_ranks else None
    rows = np.flatnonzero(keep) if keep is not None else np.arange(len(rank))
    out = []
    starts = _rank_starts(ctx)
    if len(rows):
        # (rank, device) groups in order of first appearance, rows by start time within each
        # (stable: as groupby(sort=False) then sort_values(kind="stable") ordered them)
        group = pd.DataFrame({"r": rank[rows], "d": dev[rows]}).groupby(["r", "d"], sort=False).ngroup().to_numpy()
        by = np.lexsort((start[rows], group))
        order, bounds = rows[by], np.flatnonzero(np.diff(group[by])) + 1
        del by, group
        names = None
        for sel in np.split(order, bounds):
            s, e = start[sel], end[sel]
            frontier = np.maximum.accumulate(e)  # the device's last end so far
            gap = s[1:] - frontier[:-1]
            idx = np.flatnonzero(gap > 0) + 1
            if not len(idx):
                continue
            # busy time before each gap: merged length of everything that ended by then
            busy = np.cumsum(np.maximum(0, e - np.concatenate([[s[0]], np.maximum(s[1:], frontier[:-1])])))
            at = sel[idx]
            launch = launch_ns[at]
            gstart = frontier[idx - 1]
            hb = pd.array(np.where(np.isnan(launch), False, launch >= gstart), dtype="boolean")
            hb[np.isnan(launch)] = pd.NA
            if names is None:
                # object pointers into the kernels' own strings (NaN where missing, as a str
                # column has it): a str column copied every name into Arrow (72 MiB at 2M events)
                names = k["name"].to_numpy(dtype=object, na_value=np.nan)
            is_kernel = at < nk
            next_name = np.empty(len(at), dtype=object)
            next_name[is_kernel] = names[at[is_kernel]]
            if copy_names is not None:
                next_name[~is_kernel] = copy_names[at[~is_kernel] - nk]
            r = int(rank[sel[0]])
            out.append(pd.DataFrame({
                "rank": r, "device_id": int(dev[sel[0]]), "gap_start_ns": gstart, "gap_ns": gap[idx - 1],
                "next_pos": np.where(is_kernel, at, -1), "next_name": pd.Series(next_name, dtype=object), "launch_ns": launch,
                "thread_id": thread[at], "host_bound": hb, "busy_before_ns": busy[idx - 1],
                "trace_start_ns": starts.get(r, int(s[0])),
            }, copy=False))  # not consolidated: concat copies them once below
    res = pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=_COLS)
    ctx.cache["idle_gaps"] = res
    return res


def _rank_starts(ctx: Context) -> dict[int, int]:
    """Each rank's first timestamp over kernels, copies and runtime calls: where "t = 0" is
    for a person reading the timeline."""
    t = ctx.trace
    # each frame's minimum, then theirs (a concat of the three frames' columns was a copy)
    mins = [f.groupby("rank")["start_ns"].min() for f in (t.kernels, t.memcpy, t.runtime) if len(f)]
    if not mins:
        return {}
    return pd.concat(mins).groupby(level=0).min().astype("int64").to_dict()


def _host_arrays(ctx: Context, frame: str, col: str | None) -> tuple:
    """rank, start, end (and thread id as float, NaN where missing; or whether `col` is set)
    of a host frame as plain arrays, once per diagnosis: host_context is asked about tens of
    gaps, and comparing pandas columns (a notna over a million Python strings each time) cost
    ~1 s at 2M events."""
    key = ("host_arrays", frame, col)
    if key not in ctx.cache:
        f = getattr(ctx.trace, frame)
        extra = (f["thread_id"].astype("Float64").to_numpy("float64", na_value=np.nan) if col is None
                 else f[col].notna().to_numpy(dtype=bool))
        ctx.cache[key] = (f["rank"].to_numpy(np.int64), f["start_ns"].to_numpy(np.int64), f["end_ns"].to_numpy(np.int64), extra)
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
            on = at[tid[at] == thread_id]
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
