"""Probe: which part of a Stream-K schedule closes the tail-suite gap (H200, 2026-11-29)?

    python3 experiments/probe_stream_k_tail.py [--shapes 1664x1408x8192,...] [--rounds 3] [--out DIR]

Question. On the tail suite our best schedules ran at 0.84x torch.matmul and 1.04x our
data-parallel baseline (bench/RESULTS.md). Nsight Compute blamed the Stream-K programs'
staggered K offsets (L2 misses, tensor pipe 64% busy) and showed our 128x256 TMA tiles as the
fastest per SM. The aligned layout cuts each tail tile into equal K-chunks, one a program,
so concurrent programs read the same K panels; TMA loads feed the tensor cores as
persistent_gemm does. This probe times, side by side in one process, torch.matmul, dp and
persistent baselines, the old Stream-K winner (pointer loads, contiguous ranges) and the
new variants with one change at a time (aligned or not, TMA or not, tile, stages, flatten).

Method: every variant is checked first (fresh random bf16 inputs, NaN-poisoned output,
float64 reference, tolerance 1e-2); then each is timed with the CUDA-graph timer (GPU time
per call, inputs rotating over more than twice the L2) in --rounds interleaved rounds, and
the median of the round medians is kept. Long-format rows go to DIR/probe_stream_k_tail.csv
and a table is printed.

What it showed (H200, 2026-11-29, results/probe_stream_k_tail/): TMA loads plus the aligned
layout beat the old pointer/contiguous Stream-K on every shape (1664x1408x8192: 77 us with
128x128 tiles against 85; 4224^2x8192: 444 us with 128x256 against 458), each change alone
helping little; atomic partial sums then beat the deterministic fixup where tiles were split
12 ways (68 against 77 us), which experiments/probe_stream_k_phases.py traced to the last arriver
reading every partial alone, and the cooperative fixup fixed (63 us, deterministic).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from probe_configs import (  # bench/: the probes' shared method
    schedule_call,
    time_side_by_side,
)

from advisor.run.bench.rows import (
    append_csv,
    gemm_bytes,
    gemm_flops,
    make_row,
    new_run_id,
    parse_shape,
)
from advisor.codegen.kernel_lib import load

TAIL = "1664x1408x8192,2176x2176x8192,2304x2304x4096,3072x3072x4096,4224x4224x8192"


def variants():
    dp, ps, sk = load("dp_gemm"), load("persistent_gemm"), load("stream_k_gemm")
    T256 = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8}
    T128 = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4}
    out = [
        ("torch.matmul", None, None),
        ("dp", dp, dp.Config(**T256, num_stages=3)),
        ("dp", dp, dp.Config(**T128, num_stages=4)),
        ("persistent", ps, ps.Config(**T256, num_stages=3, use_tma=True)),
        ("persistent", ps, ps.Config(**T128, num_stages=4, use_tma=True)),
        # the old Stream-K winner: pointer loads, contiguous ranges
        ("stream_k", sk, sk.Config(**T128, num_stages=4, policy="hybrid1")),
        # one change at a time towards TMA + aligned
        ("stream_k", sk, sk.Config(**T256, num_stages=4, policy="hybrid1", aligned=True)),
        ("stream_k", sk, sk.Config(**T256, num_stages=3, policy="hybrid1", use_tma=True)),
        ("stream_k", sk, sk.Config(**T256, num_stages=3, policy="hybrid1", aligned=True, use_tma=True)),
        ("stream_k", sk, sk.Config(**T256, num_stages=3, policy="hybrid1", aligned=True, use_tma=True, FLATTEN=True)),
        ("stream_k", sk, sk.Config(**T256, num_stages=4, policy="hybrid1", aligned=True, use_tma=True,
                                   EPILOGUE_SUBTILE=True)),
        ("stream_k", sk, sk.Config(**T128, num_stages=4, policy="hybrid1", aligned=True, use_tma=True)),
        ("stream_k", sk, sk.Config(**{**T128, "num_warps": 8}, num_stages=4, policy="hybrid1", aligned=True,
                                   use_tma=True)),
        # atomic partial sums: the last arriver reads one tile instead of one per chunk
        ("stream_k", sk, sk.Config(**T128, num_stages=4, policy="hybrid1", deterministic=False, aligned=True,
                                   use_tma=True)),
        ("stream_k", sk, sk.Config(**T128, num_stages=4, policy="hybrid1", deterministic=False, aligned=True,
                                   use_tma=True, FLATTEN=True)),
        ("stream_k", sk, sk.Config(**T256, num_stages=3, policy="hybrid1", deterministic=False, aligned=True,
                                   use_tma=True)),
        ("stream_k", sk, sk.Config(**T256, num_stages=3, policy="hybrid1", deterministic=False, aligned=True,
                                   use_tma=True, FLATTEN=True)),
        ("stream_k", sk, sk.Config(**T256, num_stages=4, policy="hybrid1", deterministic=False, aligned=True,
                                   use_tma=True, EPILOGUE_SUBTILE=True)),
        # no Stream-K region: this kernel's own persistent loop, against persistent_gemm's
        ("stream_k", sk, sk.Config(**T128, num_stages=4, policy="dp", use_tma=True, FLATTEN=True)),
    ]
    return out


def describe(provider, config) -> str:
    """The config's one-line description ("-" for torch.matmul)."""
    return "-" if config is None else config.describe()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=TAIL)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rep-ms", type=float, default=40)
    ap.add_argument("--out", type=Path, default=Path("probe-stream-k-tail"))
    args = ap.parse_args()
    import torch
    import triton

    args.out.mkdir(parents=True, exist_ok=True)
    run_id, device = new_run_id(), torch.cuda.get_device_name()
    csv = args.out / "probe_stream_k_tail.csv"
    for shape in args.shapes.split(","):
        M, N, K = parse_shape(shape)
        todo = [((provider, config), f"{provider} {describe(provider, config)}", schedule_call(mod, config))
                for provider, mod, config in variants()]
        timed = time_side_by_side(shape, todo, args.rounds, args.rep_ms)
        base: dict[str, float] = {}
        rows = []
        env = {"device": device, "sm_count": torch.cuda.get_device_properties(0).multi_processor_count,
               "run_id": run_id, "torch": torch.__version__, "triton": triton.__version__}
        for (provider, config), _, err, medians in timed:
            us = statistics.median(medians)
            base[provider] = min(base.get(provider, us), us)
            row = make_row(suite="probe_tail", shape=shape, M=M, N=N, K=K, dtype="bf16", provider=provider,
                           config=config or "", status="ok", phase="final", median_ms=us / 1e3,
                           flops=gemm_flops(M, N, K), bytes_moved=gemm_bytes(M, N, K, 2), rel_err=err,
                           timer="graph", env=env)
            row["rounds_us"] = ";".join(f"{m:.1f}" for m in medians)
            row["describe"] = describe(provider, config)
            rows.append(row)
        append_csv(csv, rows)
        for r in rows:
            print(f"{shape:>16} {r['provider']:>12} {r['median_us']:8.1f} us {r['tflops']:6.1f} TF "
                  f"x{base['torch.matmul'] / r['median_us']:.3f} cuBLAS x{base['dp'] / r['median_us']:.3f} dp "
                  f"[{r['rounds_us']}] {r['describe']}", flush=True)
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
