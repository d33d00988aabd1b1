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
    parts = [pd.DataFrame({
        "rank": k["rank"].to_numpy(), "device_id": k["device_id"].astype("Float64").fillna(-1).to_numpy("int64"),
        "start_ns": k["start_ns"].to_numpy(), "end_ns": k["end_ns"].to_numpy(), "pos": np.arange(len(k)),
        "name": k["name"].astype(object).to_numpy(), "launch_ns": lp["launch_ns"].to_numpy("float64"),
        "thread_id": lp["thread_id"].astype("Float64").to_numpy("float64", na_value=np.nan),
    })]
    m = t.memcpy
    if len(m):
        launch = pd.Series(np.nan, index=m.index)
        tid = pd.Series(np.nan, index=m.index)
        rt = t.runtime.dropna(subset=["correlation_id"]).drop_duplicates(["rank", "correlation_id"])
        if len(rt) and m["correlation_id"].notna().any():
            j = m[["rank", "correlation_id"]].reset_index().merge(
                rt[["rank", "correlation_id", "start_ns", "thread_id"]], on=["rank", "correlation_id"], how="inner")
            launch.loc[j["index"].to_numpy()] = j["start_ns"].to_numpy("float64")
            tid.loc[j["index"].to_numpy()] = j["thread_id"].astype("Float64").to_numpy("float64", na_value=np.nan)
        parts.append(pd.DataFrame({
            "rank": m["rank"].to_numpy(), "device_id": m["device_id"].astype("Float64").fillna(-1).to_numpy("int64"),
            "start_ns": m["start_ns"].to_numpy(), "end_ns": m["end_ns"].to_numpy(), "pos": -1,
            "name": ("memcpy " + m["kind"].astype(object).fillna("?").astype(str)).to_numpy(),
            "launch_ns": launch.to_numpy(), "thread_id": tid.to_numpy(),
        }))
    a = pd.concat(parts, ignore_index=True)
    if ctx.serialized_ranks:
        a = a[~a["rank"].isin(ctx.serialized_ranks)]
    out = []
    starts = _rank_starts(ctx)
    for (rank, dev), g in a.groupby(["rank", "device_id"], sort=False):
        g = g.sort_values("start_ns", kind="stable")
        s, e = g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)
        frontier = np.maximum.accumulate(e)  # the device's last end so far
        gap = s[1:] - frontier[:-1]
        idx = np.flatnonzero(gap > 0) + 1
        if not len(idx):
            continue
        # busy time before each gap: merged length of everything that ended by then
        busy = np.cumsum(np.maximum(0, e - np.concatenate([[s[0]], np.maximum(s[1:], frontier[:-1])])))
        launch = g["launch_ns"].to_numpy()[idx]
        gstart = frontier[idx - 1]
        hb = pd.array(np.where(np.isnan(launch), False, launch >= gstart), dtype="boolean")
        hb[np.isnan(launch)] = pd.NA
        out.append(pd.DataFrame({
            "rank": int(rank), "device_id": int(dev), "gap_start_ns": gstart, "gap_ns": gap[idx - 1],
            "next_pos": g["pos"].to_numpy()[idx], "next_name": g["name"].to_numpy()[idx], "launch_ns": launch,
            "thread_id": g["thread_id"].to_numpy()[idx], "host_bound": hb, "busy_before_ns": busy[idx - 1],
            "trace_start_ns": starts.get(int(rank), int(s[0])),
        }))
    res = pd.concat(out, ignore_index=True) if out else pd.DataFrame(columns=_COLS)
    ctx.cache["idle_gaps"] = res
    return res


def _rank_starts(ctx: Context) -> dict[int, int]:
    """Each rank's first timestamp over kernels, copies and runtime calls: where "t = 0" is
    for a person reading the timeline."""
    t = ctx.trace
    frames = [f[["rank", "start_ns"]] for f in (t.kernels, t.memcpy, t.runtime) if len(f)]
    if not frames:
        return {}
    return pd.concat(frames).groupby("rank")["start_ns"].min().astype("int64").to_dict()


def host_context(ctx: Context, rank: int, t0: int, t1: int, thread_id=None, top: int = 3) -> dict:
    """What the host of `rank` did during [t0, t1): the runtime calls that overlap it (on
    `thread_id` when given), most time first, and the innermost NVTX range or framework op
    (cpu_op) that spans the gap's middle. Plain data for evidence and report lines."""
    t = ctx.trace
    out: dict = {"api_calls": [], "range": None}
    rt = t.runtime
    if len(rt):
        r = rt[(rt["rank"] == rank) & (rt["end_ns"] > t0) & (rt["start_ns"] < t1)]
        if thread_id is not None and not pd.isna(thread_id):
            on = r[r["thread_id"] == thread_id]
            r = on if len(on) else r
        if len(r):
            ov = np.minimum(r["end_ns"].to_numpy(), t1) - np.maximum(r["start_ns"].to_numpy(), t0)
            by = pd.Series(ov, index=r["name"].astype(object).to_numpy()).groupby(level=0).agg(["sum", "size"])
            by = by.sort_values("sum", ascending=False).head(top)
            out["api_calls"] = [{"name": str(n), "calls": int(c), "overlap_ns": int(s)} for n, (s, c) in by.iterrows()]
    mid = (t0 + t1) // 2
    best = None
    for frame, col, kind in ((t.nvtx, "text", "nvtx"), (t.cpu_ops, "name", "cpu_op")):
        if not len(frame):
            continue
        f = frame[(frame["rank"] == rank) & (frame["start_ns"] <= mid) & (frame["end_ns"] >= mid) & frame[col].notna()]
        if len(f):
            row = f.loc[f["dur_ns"].idxmin()]
            if best is None or row["dur_ns"] < best[0]:
                best = (int(row["dur_ns"]), kind, str(row[col]))
    if best is not None:
        out["range"] = {"kind": best[1], "text": best[2][:200], "dur_ns": best[0]}
    return out
