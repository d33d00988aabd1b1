"""What a kernel-time finding would do to the step: the trace's launches replayed with the
finding's kernels shortened.

Kernel time saved shortens a step only while the host keeps ahead of the GPU. An fp32 LSTM on
the H200 spent 16 ms of 43 on FFMA GEMMs; with TF32 its GPU time fell by ~13 ms and its step
by 0.4 ms a step (18.4 -> 18.0 ms): the host's launches were the floor once the GEMMs were fast.
A replay of the recorded timeline says so before anyone tries: each kernel starts when its
launch call was made and its stream's previous kernel has ended (dependencies between streams
are not recorded and are left out), and runs its recorded time, or that time less the
finding's share where the finding applies. The launch times are the profiled program's, whose
host paid the profiler a few microseconds per recorded operator; the replay takes that off at
the lowest and the highest per-op cost measured (rules/launch_overhead.toml), which brackets
the bare program's host. It cannot know a faster host: an fp32 LSTM whose GPU and host times
were close (18.3 ms steps either way) replayed to 0.1-0.9 ms a step for TF32 and measured
-0.2 to -0.6 ms on one H200 host, -3.0 to -4.8 on another the next session; with the launches
in a CUDA graph as well the step was 10.6 ms on the second, the GPU's own time.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pandas as pd

from ..findings import Finding
from ..symptoms import Context
from ..symptoms.gemm import _launch_arrays

# beyond this many kernels in the trace the replay is not run (its arrays are ~60 bytes a
# kernel, and the traces this large are the ones whose memory and time are tight)
MAX_KERNELS = 1_000_000


def _ends(launch: np.ndarray, dur: np.ndarray, streams: np.ndarray) -> float:
    """The last end of a replay: per stream (kernels in start order), e_i = max(l_i, e_{i-1}) +
    d_i, which is D_i + max over j <= i of (l_j - D_{j-1}) with D the running sum of d."""
    last = -np.inf
    for s in np.unique(streams):
        on = streams == s
        d = dur[on]
        csum = np.cumsum(d)
        prev = csum - d
        e = csum + np.maximum.accumulate(launch[on] - prev)
        last = max(last, float(e[-1]))
    return last


# a call that long waited for the GPU (not a no-op check of a drained stream)
WAITED_NS = 50_000


def _waits_inside(ctx: Context, rank: int, lo: float, hi: float) -> bool:
    """Whether the rank's host made a waiting call (a synchronize or blocking copy of
    WAITED_NS or more) that ended between `lo` and the last launch `hi` (absolute ns)."""
    rt = ctx.trace.runtime
    if not len(rt):
        return False
    sel = (rt["rank"].to_numpy() == rank) & (rt["dur_ns"].to_numpy() >= WAITED_NS)
    if not sel.any():
        return False
    sub = rt.loc[sel, ["name", "end_ns"]]
    sub = sub[(sub["end_ns"].to_numpy() > lo) & (sub["end_ns"].to_numpy() < hi)]
    from ..symptoms.gate import _SYNC  # calls that return once the GPU has drained (the gate's list)

    return bool(len(sub)) and any(_SYNC.search(n) for n in sub["name"].astype(str))


class StepReplay:
    """The replay of one device's kernels (not run on traces of more than MAX_KERNELS kernels, or
    without launch calls for nine in ten of them: `ok` is False); `effect(hit, saved_ns)` is how
    much earlier its last kernel ends with the kernels of `hit` shortened by `saved_ns` in all,
    at the low and the high per-op profiler cost of the trace's recorder (`op_cost_ns`: recorder
    -> (ns, ns); none recorded: the launch times as they are). `launch_all`: every kernel's
    launch time from `_launch_arrays`, where the caller has it already."""

    def __init__(self, ctx: Context, rank, device_id, op_cost_ns: dict[str | None, tuple[float, float]],
                 launch_all: np.ndarray | None = None):
        k = ctx.trace.kernels
        self.ok = False
        if len(k) > MAX_KERNELS:
            return
        on = (k["rank"].to_numpy() == (rank or 0)) & (k["device_id"].fillna(-1).to_numpy()
                                                      == (-1 if device_id is None else device_id))
        self.rows = np.flatnonzero(on)
        if not 2 <= len(self.rows) <= MAX_KERNELS:
            return
        if launch_all is None:
            launch_all, _ = _launch_arrays(ctx.trace)
        launch = launch_all[self.rows]
        if np.isnan(launch).mean() > 0.1:  # a trace without launch calls to replay from
            return
        # times from the first kernel's start, before float64 (absolute Kineto times near 1.8e18
        # ns would round to 256 ns)
        t0 = int(k["start_ns"].to_numpy()[self.rows].min())
        start = (k["start_ns"].to_numpy()[self.rows].astype(np.int64) - t0).astype(np.float64)
        end = (k["end_ns"].to_numpy()[self.rows].astype(np.int64) - t0).astype(np.float64)
        if _waits_inside(ctx, rank or 0, t0 + start.min(), np.nanmax(launch)):
            # a call that waited for the GPU mid-window (a synchronize, .item(), a blocking copy)
            # fixed every later launch to the old kernels' end: a replay from recorded launch times
            # would keep the GPU time saved before it (wrong: not run)
            return
        order = np.argsort(start, kind="stable")
        self.rows, start, end, launch = self.rows[order], start[order], end[order], launch[order] - t0
        self.dur = end - start
        self.streams = k["stream_id"].fillna(-1).to_numpy()[self.rows].astype(np.int64)
        # a kernel without a launch call takes its stream's previous launch (it follows that
        # kernel), or its own start where it is the stream's first
        if np.isnan(launch).any():
            launch = pd.Series(launch).groupby(self.streams).ffill().to_numpy()
            launch = np.where(np.isnan(launch), start, launch)
        from ..symptoms.launch_overhead import recorded_op_starts  # (a symptom module: imported late)

        ops, recorder = recorded_op_starts(ctx, rank or 0)
        before = (np.searchsorted(ops - t0, launch) - np.searchsorted(ops - t0, launch.min())).astype(np.float64)
        self.launches = [launch - c * before for c in op_cost_ns.get(recorder, (0.0, 0.0))]
        self.base = [_ends(lt, self.dur, self.streams) for lt in self.launches]
        self.ok = True

    def hit(self, names: set[str], ctx: Context) -> np.ndarray:
        """Which of the device's kernels (replay order) carry one of `names`."""
        return ctx.trace.kernels["name"].isin(names).to_numpy(dtype=bool)[self.rows]

    def effect(self, hit: np.ndarray, saved_ns: float) -> tuple[int, int]:
        dur = self.dur.copy()
        dur[hit] *= 1.0 - min(1.0, saved_ns / max(1.0, float(self.dur[hit].sum())))
        got = [int(b - _ends(lt, dur, self.streams)) for b, lt in zip(self.base, self.launches)]
        return max(0, min(got)), max(0, max(got))


def note_step_effect(findings: list[Finding], ctx: Context, op_cost_ns: dict[str | None, tuple[float, float]],
                     max_share: float) -> list[Finding]:
    """Each kernel-time finding with its kernels named gets `step_effect_ns` [low, high]: how
    much earlier the replayed window ends with its kernels shortened by its estimate; where even
    the high end is under `max_share` of the estimate, a `step_time_caveat` saying so."""
    out, replays, launch = [], {}, None
    for f in findings:
        names = set(f.evidence.get("covers_kernels") or ([f.kernel] if f.kernel else []))
        if f.savings_unit != "gpu" or not f.est_savings_ns or not names:
            out.append(f)
            continue
        key = (f.rank, f.device_id)
        if key not in replays:
            if launch is None and len(ctx.trace.kernels) <= MAX_KERNELS:
                launch, _ = _launch_arrays(ctx.trace)  # every kernel's launch call, once for all devices
            replays[key] = StepReplay(ctx, f.rank, f.device_id, op_cost_ns, launch)
        rep = replays[key]
        hit = rep.hit(names, ctx) if rep.ok else None
        if hit is None or not hit.any():
            out.append(f)
            continue
        lo, hi = rep.effect(hit, f.est_savings_ns)
        ev = {**f.evidence, "step_effect_ns": [lo, hi]}
        if hi < max_share * f.est_savings_ns:
            ev["step_time_caveat"] = (
                f"replaying this device's recorded launches with these kernels {f.est_savings_ns / 1e6:.2f} ms shorter "
                f"ends the window only {lo / 1e6:.2f}-{hi / 1e6:.2f} ms earlier (host times net of the profiler's own "
                "cost per recorded op, at the lowest and highest measured; on a host as fast as the one profiled): "
                "the host's launches are the floor here, so the step shortens only as far as the host keeps ahead of "
                "the GPU; close the launch gaps (a CUDA graph) to collect it, and measure the step")
        out.append(replace(f, evidence=ev))
    return out
