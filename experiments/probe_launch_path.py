"""Probe: the same kernels launched three ways, side by side on the GPU machine: replayed calls
("replay": kernels/runtime.py's Recorder/replay, the default), the fast launch path with each
call's own host work ("fast": `REPLAYS.enabled = False`) and Triton's own binding ("triton":
`LAUNCHES.enabled = False` as well).

    python3 experiments/probe_launch_path.py [--rounds 5]

Two questions. (1) Is the GPU work the same? It must be: every mode launches the very kernel
Triton compiled for that specialization; graph-timed GPU time per call should match within
the run-to-run noise. (2) What does an eager caller gain? Timed three ways per mode:
CUDA-graph replay (GPU time), `triton.testing.do_bench` (eager, the L2 flushed between calls,
the issue's method) and back-to-back eager calls (wall time per call: the larger of the host
path and the GPU time). Each case is checked against a float64 reference on a NaN-poisoned
output in both modes first; modes alternate within each round, inputs rotate past the L2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_overhead import per_call_us

# (schedule, M, N, K): the issue-4 winners' shapes, each schedule's default config
CASES = (
    ("stream_k_gemm", 1664, 1408, 8192),
    ("stream_k_gemm", 4224, 4224, 8192),
    ("split_k_gemm", 16, 4096, 16384),
    ("split_k_gemm", 32, 32, 131072),
    ("stream_k_gemm", 256, 256, 131072),
    ("persistent_gemm", 4096, 4096, 8192),
    ("persistent_gemm", 1664, 1408, 8192),
)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--same-inputs", action="store_true",
                    help="one input set and one output for every call (as experiments/host_overhead.py), not rotated")
    ap.add_argument("--match", default="", help="only the cases whose 'schedule MxNxK' contains this")
    args = ap.parse_args()
    import importlib

    import torch

    from advisor.run.bench.timing import l2_bytes, rotating, rotation_count, time_fn
    from kernels.common import TOLERANCE, poison_, rel_error
    from kernels.runtime import LAUNCHES, REPLAYS

    modes = {"replay": (True, True), "fast": (False, True), "triton": (False, False)}

    def use(mode):
        REPLAYS.enabled, LAUNCHES.enabled = modes[mode]

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; median of {args.rounds} rounds, "
          f"modes alternating (order rotated each round); us per call; "
          f"{'one input set' if args.same_inputs else 'inputs rotated past the L2'}")
    print(f"{'case':<34} {'mode':<7} {'graph':>8} {'do_bench':>9} {'eager':>8}")
    for name, M, N, K in CASES:
        if args.match not in f"{name} {M}x{N}x{K}":
            continue
        mod = importlib.import_module(f"kernels.{name}")
        nbytes = (M * K + K * N + M * N) * 2
        sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16),
                 torch.randn(K, N, device="cuda", dtype=torch.bfloat16))
                for _ in range(1 if args.same_inputs else rotation_count(nbytes, l2_bytes()))]
        outs = [torch.empty(M, N, device="cuda", dtype=torch.bfloat16) for _ in sets]
        calls = [lambda a=a, b=b, o=o, m=mod: m.matmul(a, b, out=o) for (a, b), o in zip(sets, outs)]
        fn = rotating(calls)
        refs = [(a.double() @ b.double()).cpu() for a, b in sets[:2]]  # float64 on the GPU: 4224^2 x 8192 in ms
        for mode in modes:
            use(mode)
            for i in (0, 1):  # the second call replays, or takes the fast path, where enabled
                j = i % len(sets)
                poison_(outs[j])
                calls[j]()
                err = rel_error(outs[j], refs[j])
                if not err <= TOLERANCE[torch.bfloat16]:
                    raise SystemExit(f"{name} {M}x{N}x{K} {mode}: rel err {err:.2e}")
        times = {m: {"graph": [], "do_bench": [], "eager": []} for m in modes}
        for r in range(args.rounds):
            names = list(modes)
            for mode in names[r % len(names):] + names[:r % len(names)]:  # no mode always first
                use(mode)
                times[mode]["graph"].append(time_fn(fn, method="graph", warmup_ms=10, rep_ms=60).median_ms * 1e3)
                times[mode]["do_bench"].append(time_fn(fn, method="do_bench", warmup_ms=10, rep_ms=60).median_ms * 1e3)
                times[mode]["eager"].append(per_call_us(fn, 300))
        use("replay")
        for mode, t in times.items():
            print(f"{name + ' ' + f'{M}x{N}x{K}':<34} {mode:<7} " + " ".join(
                f"{statistics.median(t[k]):{w}.1f}" for k, w in (("graph", 8), ("do_bench", 9), ("eager", 8))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
