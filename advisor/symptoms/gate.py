"""The gate: basic problems that make scheduling work premature.

Checks, per rank (and device):
* gpu_idle: the GPU is busy (kernels or copies) for too little of the span of its own
  activity in the steady state; gaps inside launch-bound runs of tiny kernels are not
  counted as idle here, since launch_overhead reports them with a remedy. The message names
  the largest gaps: when, how long, whether the GPU waited on the host or on the device, the
  runtime calls and the NVTX range or op the host was in.
* startup_gap (premature=False): one leading gap (start-up, JIT compilation, data loading)
  made the whole span look idle while the steady state after it is busy: the profile window
  should leave it out. Only idle in the steady state makes scheduling work premature.
* sync_calls: the GPU idles after synchronising calls (device/stream/event synchronise,
  blocking memcpy) until the host launches again; a final synchronise costs nothing.
* host_copies: host<->device copies take a large share of device busy time.
* gemm_below_roofline: a big GEMM in whole waves runs far below its roofline
  (min(peak, bandwidth x arithmetic intensity)): the kernel itself needs work first.
gpu_idle and sync_calls skip ranks whose kernels the profiler ran one at a time (counter
collection, Context.serialized_ranks): their gaps are the profiler's.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .calibration import ceiling
from ..findings import Gate
from ..rules import Rule
from ..textutil import safe_text
from . import intervals
from .context import Context, as_int, gemm_bytes, gemm_flop, group_ids, id_array, shape_of
from .idle import gaps as idle_gaps
from .idle import host_context
from .idle import SYNC_CALLS as _SYNC
from .idle import named as idle_named
from .launch_overhead import find_runs
from .strings import contains
from .tail_wave import work_units

SYMPTOM = "gate"
REQUIRES = ()



def _idle(ctx: Context, rule: Rule) -> list[dict]:
    """Per (rank, device): busy fraction of the span of GPU activity (gaps inside launch-bound
    runs count as busy: launch_overhead reports them), the largest idle gaps with what the
    host did meanwhile, and whether the largest is a one-off start-up gap: it comes before
    `startup_busy_share` of the busy time and is `startup_gap_factor` times longer than any
    later gap. Then `steady_busy_fraction` is the busy fraction after it."""
    t = ctx.trace
    # kernels and copies as plain arrays, grouped by position (a frame of them and its
    # group-by copies were this symptom's peak: +130 MiB at 1M kernels)
    frames = [f for f in (t.kernels, t.memcpy) if len(f)]
    if not frames:
        return []
    def cat(parts):  # the frame's own column where there are no copies
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    a_rank = cat([f["rank"].to_numpy() for f in frames])
    a_dev = cat([id_array(f["device_id"]) for f in frames])
    a_start = cat([f["start_ns"].to_numpy() for f in frames])
    a_end = cat([f["end_ns"].to_numpy() for f in frames])
    del frames
    if bool((a_rank == a_rank[0]).all() and (a_dev == a_dev[0]).all()):
        members = [slice(None)]  # one device: all rows, in frame order
    else:
        group = pd.DataFrame({"r": a_rank, "d": a_dev}, copy=False).groupby(["r", "d"], sort=False).ngroup().to_numpy()
        by = np.argsort(group, kind="stable")  # each group's rows in frame order, as groupby gave them
        members = np.split(by, np.flatnonzero(np.diff(group[by])) + 1)
        del group, by
    lo_rule = ctx.rules.get("launch_overhead")
    runs = find_runs(ctx, lo_rule) if lo_rule is not None else pd.DataFrame()
    all_gaps = idle_gaps(ctx)
    # the gaps' columns as arrays: a device's gaps are picked by position, not copied (all
    # 11 columns of every gap, then sorted: +140 MiB at 2M events)
    g_rank, g_dev = all_gaps["rank"].to_numpy(), all_gaps["device_id"].to_numpy()
    g_ns, g_at = all_gaps["gap_ns"].to_numpy(), all_gaps["gap_start_ns"].to_numpy()
    rows = []
    for at in members:
        first_at = 0 if isinstance(at, slice) else at[0]
        rank, dev = a_rank[first_at], a_dev[first_at]
        if rank in ctx.serialized_ranks:
            continue  # the profiler's gaps, not the program's
        g_start, g_end = a_start[at], a_end[at]
        first, last = int(g_start.min()), int(g_end.max())
        span = last - first
        busy = intervals.total(g_start, g_end)
        del g_start, g_end
        r = runs[(runs["rank"] == rank) & (runs["device_id"] == dev)] if len(runs) else runs
        run_gaps = int(r["gap_ns"].sum()) if len(r) else 0
        frac = (busy + run_gaps) / span if span > 0 else 1.0
        gp = np.flatnonzero((g_rank == rank) & (g_dev == dev)) if len(all_gaps) else np.zeros(0, dtype=np.intp)
        row = {"rank": int(rank), "device_id": int(dev), "span_ns": span, "busy_ns": busy, "run_gap_ns": run_gaps,
               "busy_fraction": frac, "startup": None, "steady_busy_fraction": frac, "gaps": [], "jit_gaps": []}
        if len(gp):
            # largest first, ties in gap order (as sort_values(ascending=False, kind="stable")),
            # the few looked at only: those at least the m-th largest, then sorted (a sort of
            # every gap, and its copies, were the gate's peak)
            whole = len(gp) == len(g_ns)  # one device: its gaps are all of them, no copies
            vals = g_ns if whole else g_ns[gp]
            m = _JIT_LOOKED_AT + 1
            cand = np.flatnonzero(vals >= np.partition(vals, len(vals) - m)[len(vals) - m]) if len(vals) > m \
                else np.arange(len(vals))
            top = gp[cand[np.argsort(-vals[cand], kind="stable")][:m]]
            del vals, cand
            big = idle_named(ctx, all_gaps.iloc[top[:1]], busy=True).iloc[0]
            later = g_ns[g_at > big["gap_start_ns"]] if whole else g_ns[gp[g_at[gp] > big["gap_start_ns"]]]
            if (big["busy_before_ns"] <= rule["startup_busy_share"] * busy
                    and big["gap_ns"] >= rule["startup_gap_factor"] * (later.max() if len(later) else 0)):
                s0 = int(big["gap_start_ns"] + big["gap_ns"])
                in_steady = r[r["first_ns"] >= s0]["gap_ns"].sum() if len(r) else 0
                steady_span = last - s0
                steady_busy = busy - int(big["busy_before_ns"])
                row["startup"] = _describe(ctx, big)
                row["steady_busy_fraction"] = (steady_busy + in_steady) / steady_span if steady_span > 0 else 1.0
                top = top[1:]
            # loading and JIT compilation (a kernel's first launch) are one-off too, wherever
            # they fall: the largest gaps whose host was loading modules or compiling
            described = [_describe(ctx, x) for _, x in idle_named(ctx, all_gaps.iloc[top[:_JIT_LOOKED_AT]]).iterrows()]
            jit = [x for x in described if _is_jit(x)]
            if jit:
                s0 = int(row["startup"]["gap_ns"]) if row["startup"] else 0
                rest = span - s0 - sum(x["gap_ns"] for x in jit)
                base = row["steady_busy_fraction"] * (span - s0) if span - s0 > 0 else 0
                row["steady_busy_fraction"] = base / rest if rest > 0 else 1.0
            row["jit_gaps"] = jit
            row["gaps"] = [x for x in described if not _is_jit(x)][: rule["gaps_named"]]
        rows.append(row)
    return rows


# how many of a device's largest gaps are looked at for loading/JIT work (host context each)
_JIT_LOOKED_AT = 20
_JIT_API = re.compile(r"ModuleLoad|LibraryLoad|nvrtc|cuLink|ModuleGetFunction", re.I)
_JIT_RANGE = re.compile(r"compil|autotun|\bjit\b|nvrtc|triton\.runtime", re.I)


def _is_jit(x: dict) -> bool:
    """A gap the host spent loading modules or compiling kernels (one-off per kernel)."""
    return any(_JIT_API.search(c["name"]) for c in x["host_api_calls"]) or bool(
        x["host_range"] and _JIT_RANGE.search(x["host_range"]))


def _describe(ctx: Context, gap) -> dict:
    """One gap for people: ms from the rank's first event, how long, whose turn, host activity."""
    t0 = int(gap["gap_start_ns"])
    host = host_context(ctx, int(gap["rank"]), t0, t0 + int(gap["gap_ns"]), gap["thread_id"])
    hb = gap["host_bound"]
    return {
        "at_ms": round((t0 - int(gap["trace_start_ns"])) / 1e6, 3),
        "gap_ns": int(gap["gap_ns"]),
        "waited_on": "unknown" if pd.isna(hb) else ("host" if hb else "device"),
        "before": safe_text(gap["next_name"], 80),
        "host_api_calls": host["api_calls"],
        "host_range": host["range"]["text"] if host["range"] else None,
    }


def _gap_text(x: dict) -> str:
    what = ", ".join(f"{safe_text(c['name'], 40)} x{c['calls']}" for c in x["host_api_calls"][:2])
    where = f" in {safe_text(x['host_range'], 60)}" if x["host_range"] else ""
    host = f"; host: {what}{where}" if what or where else ""
    return f"{x['gap_ns'] / 1e6:.3g} ms at {x['at_ms']:g} ms before {x['before']} (waiting on the {x['waited_on']}{host})"


# a thread making at least this share of a rank's runtime calls launches its work (its syncs stall the GPU)
_LAUNCHER_SHARE = 0.1


def _sync(ctx: Context) -> list[dict]:
    """GPU time lost restarting after synchronising calls.

    A synchronising call drains the GPU; if the host then has to launch again, the GPU idles
    from the call's return until its next activity. That idle time, summed over the calls of
    the launching threads (each with at least _LAUNCHER_SHARE of the rank's runtime calls), is
    the cost. A final synchronise after all work is enqueued costs
    nothing (no GPU activity follows it) and is not counted.
    """
    t = ctx.trace
    rt = t.runtime
    if rt.empty:
        return []
    rows = []
    # a rank's calls by position, and its launching thread's synchronising calls found before
    # the rank's GPU activity is merged (copies of the runtime columns per rank, and then per
    # thread, were this step's peak with the merge's sort)
    rk = rt["rank"].to_numpy()
    ranks = pd.unique(rk)  # as groupby(sort=False) orders them
    for rank in ranks:
        if rank in ctx.serialized_ranks:
            continue
        at = np.flatnonzero(rk == rank) if len(ranks) > 1 else slice(None)
        thread = rt["thread_id"].iloc[at]
        # The threads that make the rank's runtime calls are the ones whose stalls delay the
        # GPU: in a training step two of them (the Python thread runs the forward and the
        # optimizer and calls .item(); autograd's device thread launches the backward, often
        # the more), not a data loader's few calls
        counts = thread.value_counts(dropna=False)
        launchers = counts.index[counts.to_numpy() >= _LAUNCHER_SHARE * counts.sum()]
        on = thread.isin([x for x in launchers if not pd.isna(x)]).fillna(False).to_numpy(dtype=bool)
        if any(pd.isna(x) for x in launchers):
            on |= thread.isna().to_numpy(dtype=bool)
        del thread, counts
        if on is not None and on.all():
            on = None  # one thread: all the rank's calls, without a copy of their names
        names = rt["name"].iloc[at]
        if on is not None:
            names = names.iloc[np.flatnonzero(on)]
        is_sync = np.flatnonzero(contains(names, _SYNC).to_numpy())
        sync_names = names.to_numpy()[is_sync]
        ends = rt["end_ns"].to_numpy()[at]
        ends = (ends if on is None else ends[on])[is_sync].astype(np.int64)
        del on, names, is_sync
        gs, ge = _rank_times(t, rank)
        if not len(gs):
            continue
        ms, me = intervals.merge(gs, ge)
        del gs, ge
        span = int(me[-1] - ms[0])
        if not len(ends):
            rows.append({"rank": int(rank), "span_ns": span, "stall_ns": 0, "sync_calls": 0, "stall_fraction": 0.0, "top_call": None})
            continue
        nxt = np.searchsorted(ms, ends, side="left")  # first busy interval starting at/after the return
        covered = intervals.covered_before(ms, me, ends + 1) - intervals.covered_before(ms, me, ends)
        # a call that returns before the rank's first GPU activity drained nothing: the wait
        # after it is start-up, outside the span (one at set-up made a real trace's "idle" 137%
        # of its span)
        has_next = (nxt < len(ms)) & (ends >= ms[0])
        idle = np.where(has_next & (covered == 0), ms[np.clip(nxt, 0, len(ms) - 1)] - ends, 0)
        # several calls returning in one idle gap: the gap is lost once, from the earliest
        # return (each counted its own wait before: 5 syncs a step read as 386% of the span)
        counted = np.flatnonzero(idle > 0)
        if len(counted):
            gap_of = nxt[counted]
            order = np.lexsort((ends[counted], gap_of))  # by gap, then by return time
            first = order[np.r_[True, gap_of[order][1:] != gap_of[order][:-1]]]
            keep = np.zeros(len(idle), dtype=bool)
            keep[counted[first]] = True
            idle = np.where(keep, idle, 0)
        stall = int(idle.clip(min=0).sum())
        by_call = pd.Series(idle, index=sync_names).groupby(level=0).sum().sort_values(ascending=False)
        rows.append(
            {
                "rank": int(rank),
                "span_ns": span,
                "stall_ns": stall,
                "sync_calls": int(has_next.sum()),
                "stall_fraction": stall / span if span else 0.0,
                "top_call": str(by_call.index[0]) if stall else None,
            }
        )
    return rows


def _rank_times(t, rank) -> tuple[np.ndarray, np.ndarray]:
    """Start and end times of the rank's kernels, then its copies (not the rows' other columns)."""
    parts = [f for f in (t.kernels, t.memcpy) if len(f)]
    at = [(f["rank"] == rank).to_numpy(dtype=bool) for f in parts]
    if len(parts) == 1 and at[0].all():  # one rank's kernels only: the columns themselves, not copies
        return parts[0]["start_ns"].to_numpy(), parts[0]["end_ns"].to_numpy()
    return (np.concatenate([f["start_ns"].to_numpy()[m] for f, m in zip(parts, at)] or [np.zeros(0, np.int64)]),
            np.concatenate([f["end_ns"].to_numpy()[m] for f, m in zip(parts, at)] or [np.zeros(0, np.int64)]))


def _copies(ctx: Context) -> list[dict]:
    t = ctx.trace
    m = t.memcpy
    if m.empty:
        return []
    rows = []
    for rank, g in m.groupby("rank", sort=False):
        host = g[g["kind"].isin(["HtoD", "DtoH"])]
        busy = intervals.total(*_rank_times(t, rank))  # the rank's kernels, then its copies
        ns = intervals.total(host["start_ns"].to_numpy(), host["end_ns"].to_numpy())
        rows.append({"rank": int(rank), "copy_ns": ns, "busy_ns": busy, "copy_fraction": ns / busy if busy else 0.0, "bytes": int(host["bytes"].fillna(0).sum())})
    return rows


def _roofline(ctx: Context, rule: Rule) -> list[dict]:
    k = ctx.kernels
    pos = np.flatnonzero((k["is_gemm"] & k["M"].notna() & k["dtype"].notna() & k["sm_count"].notna()
                          & k["grid_blocks"].notna()).to_numpy(dtype=bool))
    if not len(pos):
        return []
    # whole waves found over the three columns work_units reads, then only the launches kept
    # and the columns read below taken (a copy of ~20 columns of every shaped GEMM launch and
    # its concat were the gate's peak)
    # (in chunks: the four float columns of every shaped launch at once were the gate's peak)
    keep = np.zeros(len(pos), dtype=bool)
    for lo in range(0, len(pos), 1 << 18):
        at = pos[lo:lo + (1 << 18)]
        units = work_units(pd.DataFrame({c: k[c].iloc[at] for c in ("tiles", "grid_blocks", "sm_count")}, copy=False))
        keep[lo:lo + len(at)] = ((units["waves_units"] >= 1) & (units["tail_eff_units"] >= 0.9)).to_numpy(dtype=bool)
    pos = pos[keep]
    del units, keep
    # the launches grouped by (rank, device, name, shape) in order of first appearance, as
    # groupby(dropna=False, sort=False) numbers them, a key column at a time (a frame of the
    # nine columns and its group-by were this step's peak)
    keys = ("rank", "device_id", "name", "M", "N", "K", "batch", "dtype")
    # over the launch groups first (Context.kernels' `_launch_group` splits by these keys and
    # the launch shape), then their first rows' keys: the same ids, numbered in order of first
    # appearance, without eight full-length factorizations of the launches (the gate's peak)
    lg_codes, lg_uniq = pd.factorize(k["_launch_group"].to_numpy()[pos])
    lg_first = np.empty(len(lg_uniq), dtype=np.int64)
    lg_first[lg_codes[::-1]] = np.arange(len(lg_codes) - 1, -1, -1)
    ids = group_ids(k[c].iloc[pos[lg_first]] for c in keys)[lg_codes]
    del lg_codes, lg_uniq, lg_first
    first_at = np.empty(int(ids.max()) + 1 if len(ids) else 0, dtype=np.int64)
    first_at[ids[::-1]] = np.arange(len(ids) - 1, -1, -1)  # last write wins: each group's first row
    by = np.argsort(ids, kind="stable")
    members = np.split(by, np.flatnonzero(np.diff(ids[by])) + 1) if len(ids) else []
    del by
    dur = k["dur_ns"].to_numpy()[pos]
    rows = []
    for gi, at in enumerate(members):
        first = {c: k[c].iloc[pos[first_at[gi]]] for c in keys}
        shape = shape_of(first)
        flop = gemm_flop(shape)
        if flop < rule["min_gemm_flop"]:
            continue
        if shape["dtype"] not in ("bf16", "fp16"):
            continue  # the 16-bit tensor rate is the one every device table and measurement has
        # the measured ceiling where we measured this GPU (the H200: 796 TFLOP/s bf16, 4.27
        # TB/s), else the datasheet derated by the H200's measured ratio (advisor.symptoms.calibration)
        c = ceiling(ctx.device_row(first["rank"], first["device_id"]), shape["dtype"])
        peak, bw = c.tflops, c.bytes_per_s
        if not peak or not bw:
            continue
        nbytes, _ = gemm_bytes(shape)
        attainable = min(peak * 1e12, bw * flop / nbytes)
        med = float(pd.Series(dur[at]).median())
        achieved = flop / (med * 1e-9)
        rows.append({"rank": int(first["rank"]), "kernel": str(first["name"]), "shape": shape, "achieved_tflops": achieved / 1e12, "attainable_tflops": attainable / 1e12, "fraction": achieved / attainable})
    return rows


def evidence(ctx: Context, rule: Rule) -> dict[str, list[dict]]:
    return {"gpu_idle": _idle(ctx, rule), "sync_calls": _sync(ctx), "host_copies": _copies(ctx), "gemm_below_roofline": _roofline(ctx, rule)}


def judge(ev: dict[str, list[dict]], rule: Rule, ctx: Context) -> list[Gate]:
    gates = []
    for r in ev["gpu_idle"]:
        named = "; largest gaps: " + "; ".join(_gap_text(x) for x in r["gaps"]) if r["gaps"] else ""
        one_off = ([r["startup"]] if r["startup"] else []) + r["jit_gaps"]
        if one_off and r["busy_fraction"] < rule["min_busy_fraction"]:
            # one-off gaps (a leading one, loading/JIT compilation) made the span look idle: say
            # where, and how to leave them out of the window
            what = "; ".join(_gap_text(x) for x in one_off[:3])
            gates.append(Gate(
                "startup_gap",
                f"the profile window includes start-up on rank {r['rank']} (device {r['device_id']}): "
                f"{len(one_off)} one-off idle gap{'s' if len(one_off) > 1 else ''} (start-up, module loading or JIT "
                f"compilation): {what}; narrow the window with a capture range (nsys --capture-range=cudaProfilerApi) "
                "or a profiler schedule (torch.profiler.schedule(wait, warmup, active)). Without them the GPU is busy "
                f"{r['steady_busy_fraction']:.0%} of the time",
                round(r["busy_fraction"], 3), rule["min_busy_fraction"], rank=r["rank"], premature=False,
                gaps=one_off,
            ))
        if r["steady_busy_fraction"] < rule["min_busy_fraction"]:
            steady = " after start-up" if r["startup"] is not None else ""
            gates.append(
                Gate(
                    "gpu_idle",
                    f"GPU busy only {r['steady_busy_fraction']:.0%} of its active span{steady} on rank {r['rank']} "
                    f"(device {r['device_id']}): the GPU waits on the host{named}",
                    round(r["steady_busy_fraction"], 3),
                    rule["min_busy_fraction"],
                    rank=r["rank"],
                    gaps=r["gaps"],
                )
            )
    for r in ev["sync_calls"]:
        if r["stall_fraction"] > rule["max_sync_stall_fraction"]:
            gates.append(
                Gate(
                    "sync_calls",
                    f"on rank {r['rank']} the GPU sits idle for {r['stall_fraction']:.0%} of its span after {r['sync_calls']} "
                    "synchronising calls, waiting for the host to launch again"
                    + (f" (mostly after {safe_text(r['top_call'], 60)})" if r["top_call"] else ""),
                    round(r["stall_fraction"], 3),
                    rule["max_sync_stall_fraction"],
                    rank=r["rank"],
                )
            )
    for r in ev["host_copies"]:
        if r["copy_fraction"] > rule["max_copy_fraction"]:
            gates.append(
                Gate(
                    "host_copies",
                    f"host<->device copies take {r['copy_fraction']:.0%} of device busy time on rank {r['rank']}",
                    round(r["copy_fraction"], 3),
                    rule["max_copy_fraction"],
                    rank=r["rank"],
                )
            )
    for r in ev["gemm_below_roofline"]:
        if r["fraction"] < rule["min_roofline_fraction"]:
            s = r["shape"]
            gates.append(
                Gate(
                    "gemm_below_roofline",
                    f"GEMM {s['M']}x{s['N']}x{s['K']} {s['dtype']} runs at {r['achieved_tflops']:.0f} TFLOP/s in whole waves, "
                    f"{r['fraction']:.0%} of its {r['attainable_tflops']:.0f} TFLOP/s roofline: fix the kernel before its schedule",
                    round(r["fraction"], 3),
                    rule["min_roofline_fraction"],
                    rank=as_int(r["rank"]),
                    kernel=r["kernel"],
                )
            )
    return gates
