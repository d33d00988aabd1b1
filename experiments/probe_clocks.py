"""Probe: SM clock, power and time per call while a GEMM runs for seconds on end (H200).

    python3 experiments/probe_clocks.py [--shapes 2176x2176x8192,...] [--seconds 3] [--variants FILE]

Question (2026-12-01). The same Stream-K launch spans 380 us in the phase probe (a few
launches after a pause) and takes 440-460 us graph-timed in the bench (back-to-back replays
for tens of milliseconds) on 4224^2x8192; torch.matmul's graph-timed times move by 7-12%
between runs of the same day. Is the GPU lowering its clock under sustained load (power or
thermal limit), and does each kernel pay for it alike?

Method: for each shape, torch.matmul and each stream_k_gemm config of the variants file
(default: the tail winners' two tiles), one CUDA graph of 20 calls over input sets rotating
past the L2 is replayed back to back for --seconds, after a 2 s idle pause. nvidia-smi
samples the SM clock, power draw, temperature and the active clock-throttle reasons every
100 ms meanwhile; CUDA events time each replay. Printed: per kernel, the time per call in
the first 50 ms and in the last second, and the median clock, power and temperature, with
the throttle reasons seen, over the last second. Only nvidia-smi queries are used (no
setting is changed, as METHOD.md asks).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advisor.run.bench.rows import parse_shape
from advisor.run.bench.timing import l2_bytes, rotation_count
from advisor.codegen.kernel_lib import load

SHAPES = "2176x2176x8192,3072x3072x4096,4224x4224x8192"
# the active clock-limit reasons, a bitmask (0x1 idle, 0x4 software power cap, 0x20 software
# thermal slowdown, 0x40 hardware thermal slowdown; `nvidia-smi --help-query-gpu`), under its
# newer name first
REASONS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
FIELDS = "timestamp,clocks.sm,power.draw,temperature.gpu,{reasons}"
DEFAULT_CONFIGS = [
    {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 5,
     "policy": "hybrid1", "aligned": True, "use_tma": True, "deterministic": False},
    {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3,
     "policy": "hybrid1", "aligned": True, "use_tma": True, "deterministic": False},
]
CALLS_PER_GRAPH = 20


def query_fields() -> str:
    """FIELDS with the first clock-reasons field name this nvidia-smi knows."""
    for name in REASONS:
        fields = FIELDS.format(reasons=name)
        if subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                          check=False, capture_output=True).returncode == 0:
            return fields
    raise RuntimeError("nvidia-smi answers none of the clock-reason fields " + ", ".join(REASONS))


def sampler(fields: str):
    """nvidia-smi printing `fields` every 100 ms until terminated."""
    return subprocess.Popen(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-lms", "100"],
                            stdout=subprocess.PIPE, text=True)


def parse_samples(text: str) -> list[tuple[float, float, float, float, str]]:
    """(unix time, SM MHz, W, C, throttle reasons) a sample; unparsable lines are skipped."""
    from datetime import datetime

    out = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 5:
            continue
        try:
            t = datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            out.append((t, float(parts[1]), float(parts[2]), float(parts[3]), parts[4]))
        except ValueError:
            continue
    return out


def run_kernel(call, sets, seconds: float):
    """Replays of one graph of CALLS_PER_GRAPH calls for `seconds`: [(host time at the end
    of the replay, us per call)]."""
    import torch

    outs = [torch.empty(a.shape[0], b.shape[1], dtype=a.dtype, device="cuda") for a, b in sets]
    for (a, b), o in zip(sets, outs):  # compile and warm outside the graph
        call(a, b, o)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(CALLS_PER_GRAPH):
            a, b = sets[i % len(sets)]
            call(a, b, outs[i % len(sets)])
    torch.cuda.synchronize()
    time.sleep(2.0)  # idle first, as before a short launch
    points = []
    t_end = time.time() + seconds
    while time.time() < t_end:
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        points.append((time.time(), start.elapsed_time(stop) * 1e3 / CALLS_PER_GRAPH))
    return points


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--variants", default=None, help="a variants file: its stream_k_gemm configs")
    args = ap.parse_args()
    import torch

    sk = load("stream_k_gemm")
    configs = DEFAULT_CONFIGS
    if args.variants:
        spec = json.loads(Path(args.variants).read_text())
        configs = [v["config"] for v in spec["variants"] if v["schedule"] == "stream_k_gemm"]
    fields = query_fields()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.seconds} s a kernel; {fields}")
    print(f"{'shape':>16} {'kernel':<58} {'us first 50ms':>13} {'us last 1s':>10} {'MHz':>6} {'W':>6} {'C':>4} "
          f"throttle reasons (last 1 s)")
    for shape in args.shapes.split(","):
        M, N, K = parse_shape(shape)
        n_sets = rotation_count(2 * (M * K + K * N + M * N), l2_bytes())
        sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                 torch.randn(K, N, device="cuda", dtype=torch.bfloat16)) for _ in range(n_sets)]
        kernels = [("torch.matmul", lambda a, b, o: torch.matmul(a, b, out=o))]
        for c in configs:
            cfg = sk.Config(**c)
            kernels.append((f"stream_k {cfg.describe()}", lambda a, b, o, cfg=cfg: sk.matmul(a, b, cfg, out=o)))
        for name, call in kernels:
            proc = sampler(fields)
            try:
                points = run_kernel(call, sets, args.seconds)
            finally:
                proc.terminate()
                text, _ = proc.communicate(timeout=10)
            samples = parse_samples(text)
            t0, t1 = points[0][0], points[-1][0]
            first = [us for t, us in points if t - t0 <= 0.05] or [points[0][1]]
            last = [us for t, us in points if t >= t1 - 1.0]
            tail = [s for s in samples if t1 - 1.0 <= s[0] <= t1]
            mhz, watts, temp = ((statistics.median(s[i] for s in tail) if tail else float("nan")) for i in (1, 2, 3))
            reasons = sorted({s[4] for s in tail}) or ["-"]
            print(f"{shape:>16} {name:<58} {statistics.median(first):13.1f} {statistics.median(last):10.1f} "
                  f"{mhz:6.0f} {watts:6.0f} {temp:4.0f} {' '.join(reasons)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
