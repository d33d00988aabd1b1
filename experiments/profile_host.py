"""Probe: where an eager call of a schedule's `matmul` spends its host time (GPU machine).

    python3 experiments/profile_host.py [--calls 2000] [--top 25]

experiments/host_overhead.py says how long an eager call takes; this says why. Each case (a
schedule, a shape and its config) is called `--calls` times under cProfile after a
warm-up, and the functions with the most own time are printed, with the share of the call
spent inside Triton's `JITFunction.run` (argument binding, the cache key, the launch) as
against our own wrapper (checks, config, plan, scratch, descriptors).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# (schedule, M, N, K, config or None for the default)
CASES = (
    ("stream_k_gemm", 1664, 1408, 8192, None),
    ("stream_k_gemm", 256, 256, 256, None),
    ("split_k_gemm", 16, 4096, 16384, None),
    ("persistent_gemm", 1664, 1408, 8192, None),
    ("ws_gemm", 1664, 1408, 8192, None),
    ("dp_gemm", 256, 256, 256, None),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    import importlib

    import torch

    from kernels.runtime import LAUNCHES

    for name, M, N, K, config in CASES:
        mod = importlib.import_module(f"kernels.{name}")
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        for _ in range(20):
            mod.matmul(a, b, config, out=out)
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(args.calls):
            mod.matmul(a, b, config, out=out)
        host = (time.perf_counter() - t) / args.calls * 1e6
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t) / args.calls * 1e6
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            mod.matmul(a, b, config, out=out)
        prof.disable()
        torch.cuda.synchronize()
        stats = pstats.Stats(prof)
        total = stats.total_tt / args.calls * 1e6
        run = next((v[3] for k, v in stats.stats.items() if k[2] == "run" and k[0].endswith("runtime/jit.py")), 0.0)
        print(f"== {name} {M}x{N}x{K}: host {host:.1f} us/call before sync, {wall:.1f} with it; "
              f"under cProfile {total:.1f} us/call, JITFunction.run {run / args.calls * 1e6:.1f}; "
              f"launches so far {LAUNCHES.fast} fast, {LAUNCHES.slow} through Triton's binding")
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(args.top)
        print("\n".join(line for line in buf.getvalue().splitlines() if line.strip())[-6000:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
