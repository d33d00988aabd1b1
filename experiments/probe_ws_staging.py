"""Probe: ws_gemm's staged operands through persistent_gemm.aligned_copy (a copy kernel on
8-byte aligned rows) against the torch `copy_` staging of an older checkout (GPU machine).

    python3 experiments/probe_ws_staging.py --baseline DIR [--rounds 5]

Shapes whose rows break TMA's 16-byte rule but stay 8-byte aligned (K = 8196 or N = 2900 in
bf16), so that the copy kernel, not copy_, stages them. Each version's default ws_gemm
config is checked against a float64 reference on a NaN-poisoned output, then graph-timed
(GPU time per call, copies included) in interleaved rounds, inputs rotating past the L2.
Prediction from experiments/results/staging/ (copy_ ~1.5 TB/s, the kernel 2.0-2.6 TB/s): a few
microseconds a call, e.g. ~14 us of 1664x1408x8196's ~100.
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from host_overhead import load_kernels

SHAPES = ((1664, 1408, 8196), (2000, 2900, 8192), (4096, 4100, 4096))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", type=Path, required=True, help="a checkout whose kernels/ stage with copy_")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    import torch

    from advisor.run.bench.timing import l2_bytes, rotating, rotation_count, time_fn

    load_kernels(Path(__file__).resolve().parents[1], "kernels_this")
    load_kernels(args.baseline, "kernels_base")
    versions = {v: importlib.import_module(f"{pkg}.ws_gemm") for v, pkg in
                (("this", "kernels_this"), ("baseline", "kernels_base"))}
    common = importlib.import_module("kernels_this.common")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; ws_gemm default config, bf16, "
          f"graph-timed us per call, median of {args.rounds} interleaved rounds")
    for M, N, K in SHAPES:
        nbytes = (M * K + K * N + M * N) * 2
        sets = [common.random_inputs(M, N, K, torch.bfloat16, "cuda", seed=i)
                for i in range(rotation_count(nbytes, l2_bytes()))]
        ref = common.reference(*sets[0])
        fns = {}
        for name, mod in versions.items():
            out = common.poison_(torch.empty(M, N, device="cuda", dtype=torch.bfloat16))
            err = common.rel_error(mod.matmul(*sets[0], out=out), ref)
            if not err <= common.TOLERANCE[torch.bfloat16]:
                raise SystemExit(f"{name} {M}x{N}x{K}: rel err {err:.2e}")
            fns[name] = rotating([lambda a=a, b=b, m=mod: m.matmul(a, b) for a, b in sets])
        times = {name: [] for name in fns}
        for _ in range(args.rounds):
            for name, fn in fns.items():
                times[name].append(time_fn(fn, method="graph", warmup_ms=10, rep_ms=60).median_ms * 1e3)
        for name, ts in times.items():
            print(f"{M}x{N}x{K} {name:>9} {statistics.median(ts):7.1f} us  [{' '.join(f'{t:.1f}' for t in ts)}]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
