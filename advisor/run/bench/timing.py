"""Timing: median and 20th/80th percentiles of a zero-argument callable.

Three timers, recorded in each row's `timer` column:

* "do_bench" (CUDA, the default): `triton.testing.do_bench(fn, warmup, rep,
  quantiles=[0.5, 0.2, 0.8])`, device events around each call. Note that do_bench itself
  zeroes a 256 MB buffer before every timed call to flush the L2. If the L2 keeps those
  zeros as dirty lines, the timed kernel writes them back as it evicts them, and a
  memory-bound kernel of a few tens of microseconds may pay for up to one L2 (60 MB on
  the H200, ~14 us at 4.3 TB/s) of extra traffic: ratios between providers stay fair (all
  pay it), ratios to an HBM floor would be pessimistic. Not measured yet: bench_gemm.py
  times torch.matmul on the skinny shapes with both timers (suite "timer_check") to see.
* "events" (CUDA): the same structure (estimate, warm-up, one event pair per call,
  quantiles) but no flush: a short `torch.cuda._sleep` before each call keeps the host
  ahead of the GPU so that launch overhead stays out of the events, and the L2 is defeated
  only by rotating among input sets.
* "cpu": `time.perf_counter` around a few calls, for the CPU interpreter (tests).

With both CUDA timers the callable should rotate among several input sets whose total
size is over twice the L2 (`rotation_count`), so that no call finds its operands cached.
torch and triton are imported inside the functions: importing this module needs neither.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Sequence

# Fallback when the device does not report its L2 (the H100 has 50 MB, the H200 60 MB).
DEFAULT_L2_BYTES = 50 * 1024 * 1024
# Input sets to rotate among: enough to exceed 2x the L2, at most 16 and at most this much memory.
MAX_ROTATION_SETS = 16
MAX_ROTATION_BYTES = 4 * 1024**3
# "events" timer: GPU cycles of `torch.cuda._sleep` before each timed call (~50 us at
# 1.98 GHz), longer than the host needs to enqueue one call of any launcher here.
SLEEP_CYCLES = 100_000


@dataclass(frozen=True)
class Timing:
    median_ms: float
    p20_ms: float
    p80_ms: float
    method: str


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def gpu_available() -> bool:
    import torch

    return torch.cuda.is_available() and not interpreting()


def l2_bytes(device=None) -> int:
    """L2 size of a CUDA device, DEFAULT_L2_BYTES when unknown (or on the CPU)."""
    try:
        import torch

        if gpu_available():
            props = torch.cuda.get_device_properties(device or torch.cuda.current_device())
            size = int(getattr(props, "L2_cache_size", 0) or 0)
            if size > 0:
                return size
    except Exception:  # noqa: BLE001 - a missing property must not stop a benchmark
        pass
    return DEFAULT_L2_BYTES


def rotation_count(set_bytes: float, l2: int, *, factor: float = 2.0, min_sets: int = 1,
                   max_sets: int = MAX_ROTATION_SETS, max_bytes: int = MAX_ROTATION_BYTES) -> int:
    """Input sets to rotate among so that their total exceeds `factor` x the L2, capped by
    `max_sets` and by `max_bytes` of memory (never fewer than `min_sets`, memory allowing,
    and never fewer than one)."""
    if set_bytes <= 0:
        return max(1, min_sets)
    want = max(min_sets, math.ceil(factor * l2 / set_bytes) + 1)
    fit = max(1, int(max_bytes // set_bytes))
    return max(1, min(want, max_sets, fit))


def quantile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation quantile (numpy's default) of an already sorted sequence."""
    if not sorted_values:
        raise ValueError("no values")
    pos = q * (len(sorted_values) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def _summary(times_ms: Sequence[float], method: str) -> Timing:
    s = sorted(times_ms)
    return Timing(quantile(s, 0.5), quantile(s, 0.2), quantile(s, 0.8), method)


def resolve_timer(timer: str, device: str) -> str:
    """The timer to use on `device`: "cpu" off CUDA whatever was asked, "do_bench" for auto."""
    if not str(device).startswith("cuda"):
        return "cpu"
    return "do_bench" if timer in (None, "", "auto") else timer


def time_cpu(fn: Callable[[], object], reps: int = 3) -> Timing:
    """perf_counter around `reps` calls after one warm-up call (CPU / interpreter)."""
    fn()
    times = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return _summary(times, "cpu")


def time_do_bench(fn: Callable[[], object], warmup_ms: float = 10, rep_ms: float = 50) -> Timing:
    import triton.testing

    med, p20, p80 = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
    return Timing(float(med), float(p20), float(p80), "do_bench")


def time_events(fn: Callable[[], object], warmup_ms: float = 10, rep_ms: float = 50,
                max_reps: int = 2000) -> Timing:
    import torch

    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate = max(start.elapsed_time(end) / 5, 1e-3)
    n_warm = max(1, int(warmup_ms / estimate))
    n_rep = max(3, min(max_reps, int(rep_ms / estimate)))
    for _ in range(n_warm):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n_rep)]
    for i in range(n_rep):
        torch.cuda._sleep(SLEEP_CYCLES)
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    return _summary([s.elapsed_time(e) for s, e in zip(starts, ends)], "events")


def time_graph(fn: Callable[[], object], warmup_ms: float = 10, rep_ms: float = 50,
               calls_per_graph: int = 20, max_replays: int = 500) -> Timing:
    """GPU time per call without the host: `calls_per_graph` calls of `fn` captured in one CUDA
    graph, replays timed with events, per-call time = replay time / calls.

    Why: on the H200 (2026-11-29) a split-K call whose kernels take ~37 us (graph) timed 49-76 us
    under do_bench and 121 us back to back, because its Python launcher (two Triton launches,
    a workspace allocation) costs ~100 us of host time that do_bench only partly hides. Kernel
    schedules are compared on GPU time; host overhead is a separate (launch_overhead) matter.
    The inputs still rotate (fn), so no call finds its operands in the L2."""
    import torch

    for _ in range(3):  # compile, allocate workspaces, fill caches outside the capture
        fn()
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls_per_graph):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    end.synchronize()
    per_replay = max(start.elapsed_time(end), 1e-3)
    for _ in range(max(1, int(warmup_ms / per_replay))):
        graph.replay()
    n = max(5, min(max_replays, int(rep_ms / per_replay)))
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
    for i in range(n):
        starts[i].record()
        graph.replay()
        ends[i].record()
    torch.cuda.synchronize()
    return _summary([s.elapsed_time(e) / calls_per_graph for s, e in zip(starts, ends)], "graph")


def time_fn(fn: Callable[[], object], *, method: str = "auto", warmup_ms: float = 10,
            rep_ms: float = 50, cpu_reps: int = 3) -> Timing:
    """Time `fn` with `method` ("auto": do_bench on a GPU, cpu otherwise)."""
    if method == "auto":
        method = "do_bench" if gpu_available() else "cpu"
    if method == "cpu":
        return time_cpu(fn, cpu_reps)
    if method == "do_bench":
        return time_do_bench(fn, warmup_ms, rep_ms)
    if method == "events":
        return time_events(fn, warmup_ms, rep_ms)
    if method == "graph":
        return time_graph(fn, warmup_ms, rep_ms)
    raise ValueError(f"unknown timer {method!r} (auto, do_bench, events, graph, cpu)")


def rotating(calls: Sequence[Callable[[], object]]) -> Callable[[], object]:
    """One zero-argument callable that runs calls[0], calls[1], ... in turn, one per call."""
    if not calls:
        raise ValueError("nothing to rotate")
    state = {"i": 0}
    n = len(calls)

    def fn():
        i = state["i"]
        state["i"] = i + 1 if i + 1 < n else 0
        return calls[i]()

    return fn
