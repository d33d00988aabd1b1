"""Probe: host time per eager call of each schedule's `matmul`, against torch.matmul (GPU).

    python3 experiments/host_overhead.py [--root DIR] [--calls 2000]

Why: the benchmarks time GPU work (CUDA-graph replays), but a user calling our `matmul`
eagerly also pays its Python launcher: argument checks, the default config, the plan,
scratch buffers, TMA descriptors and Triton's own launch path. Method: a tiny problem
(256x256x256 bf16, a few microseconds of GPU work), `--calls` eager calls back to back after
a warm-up, then one synchronize. The host cannot run ahead of the GPU by more than the
queue allows, so wall time per call is the larger of the host path and the GPU time, here
the host path. The shapes 16x4096x16384 (Split-K's ~35 us of GPU work) and 1664x1408x8192
(Stream-K's ~60 us) are timed the same way, to show what an eager caller of those gets. `--baseline DIR` also imports the
`kernels/` package of another checkout (e.g. an older commit) and times both versions in
interleaved rounds, the order rotated each round, so that neither machine drift nor the GPU's
state left by the previous timing decides the comparison.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import statistics
import sys
import time
from pathlib import Path

SCHEDULES = ("dp_gemm", "split_k_gemm", "persistent_gemm", "stream_k_gemm", "ws_gemm")
# shape -> schedules timed on it: a tiny one (host path only), Split-K's skinny shape and the
# first tail shape (~60 us of GPU work: is an eager Stream-K call GPU-bound?)
SHAPES = {(256, 256, 256): SCHEDULES, (16, 4096, 16384): ("split_k_gemm",),
          (1664, 1408, 8192): ("persistent_gemm", "stream_k_gemm")}


def per_call_us(fn, calls: int) -> float:
    import torch

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / calls * 1e6


def load_kernels(root: Path, name: str):
    """The `kernels` package of checkout `root`, imported as `name` (so that two versions
    can live in one process)."""
    init = root.resolve() / "kernels" / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(init.parent)])
    pkg = importlib.util.module_from_spec(spec)
    sys.modules[name] = pkg
    spec.loader.exec_module(pkg)
    return pkg


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, default=None,
                    help="another checkout whose kernels/ are timed beside this one's, interleaved")
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import torch

    versions = {"this": "kernels_this"}
    load_kernels(Path(__file__).resolve().parents[1], "kernels_this")
    if args.baseline:
        load_kernels(args.baseline, "kernels_base")
        versions["baseline"] = "kernels_base"
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; median of {args.rounds} interleaved "
          f"rounds of {args.calls} eager calls (baseline: {args.baseline})")
    for (M, N, K), names in SHAPES.items():
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        ref = torch.matmul(a, b).float()
        calls = {"torch.matmul": lambda a=a, b=b, out=out: torch.matmul(a, b, out=out)}
        for name in names:
            for version, pkg in versions.items():
                mod = importlib.import_module(f"{pkg}.{name}")
                try:
                    err = ((mod.matmul(a, b).float() - ref).norm() / ref.norm()).item()
                except (ValueError, RuntimeError) as exc:  # a schedule that refuses the shape is reported
                    print(f"{M}x{N}x{K} {name} ({version}) refused: {exc}")
                    continue
                if err > 1e-2:
                    raise SystemExit(f"{name} ({version}) rel err {err:.1e}")
                calls[f"{name} ({version})"] = lambda mod=mod, a=a, b=b, out=out: mod.matmul(a, b, out=out)
        times: dict[str, list[float]] = {k: [] for k in calls}
        names = list(calls)
        for r in range(args.rounds):  # the order rotated each round: none always follows the same
            for k in names[r % len(names):] + names[:r % len(names)]:
                times[k].append(per_call_us(calls[k], args.calls))
        for k, ts in times.items():
            print(f"{M}x{N}x{K} {k:>28} {statistics.median(ts):7.1f} us/call  [{' '.join(f'{t:.0f}' for t in ts)}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
