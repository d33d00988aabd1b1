"""Probe: how much do fp32 (tf32) GEMMs lose to an N-contiguous B, and does a K-major copy pay? (H200)

    python3 experiments/probe_tf32_layout.py [--shapes 4096x4096x8192,...] [--rounds 3]

Question (2026-12-01). The first fp32 benchmark run (bench/results/h200.csv.gz, run of
2026-12-01 ~15:50 UTC) had our schedules at 0.24-0.28x torch.matmul (tf32) on the tail and
balanced suites, 82-99 TFLOP/s. The sm_90 compile check says why it might be: Hopper's wgmma
takes tf32 operands only K-major in shared memory (the transpose bits exist for 16-bit types
alone), and a row-major B (K, N) has N contiguous. Triton then copies B into shared memory
4 bytes at a time with a transposing pattern (pointer loads: 32 four-byte cp.async per
thread per 32x256 stage instead of 8 sixteen-byte ones), or, after a TMA load, runs a
shared -> register -> shared round trip of every B tile inside the K loop (persistent).
A B stored transposed (N, K), passed as its .t() view, is K-major and loads 16 bytes wide.

Per shape (fp32, inputs rotated past the L2, CUDA-graph timer, median of --rounds
interleaved rounds, each variant checked first against float64 with NaN-poisoned outputs):
- torch.matmul with allow_tf32 on the row-major B, and on the K-major B;
- each schedule's default config on the row-major B without any copy
  (ADVISOR_TF32_KMAJOR=0), always copied (=1), never copied (=2: swapped where the schedule
  swaps), as `matmul` runs it now (kernels/tf32_layout.py copies B K-major where its rule
  says that pays; the pointer-load schedules otherwise compute C^T = B^T A^T with B^T fed to
  the MMA from registers), and on a K-major B made beforehand (the bound); --schedules
  limits the schedules;
- the copy alone: torch's transpose copy into a preallocated (N, K) buffer, and ours
  (tf32_layout.k_major_copy).
Rows go to DIR/probe_tf32_layout.csv; the table is printed.

What it showed (H200, 2026-12-01, results/probe_tf32_layout/): a K-major B made the fp32
schedules 3.5-4.6x faster (Stream-K 1664x1408x8192 555.9 -> 125.5 us, torch 148.0), and our
relayout kernel copies at ~4 TB/s where torch's transposing copy_ moves 1.1, so the TMA
schedules now copy where kernels/tf32_layout.py's rule says it pays. For dp and split-K,
swapping the operands (B^T through registers) beat the copy on every shape measured
(split-K 256x256x131072: 218.9 -> 76.0 us, against 150.9 with the copy), so they swap.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advisor.run.bench.rows import (
    append_csv,
    gemm_bytes,
    gemm_flops,
    make_row,
    new_run_id,
    parse_shape,
)
from advisor.run.bench.runner import environment
from advisor.run.bench.timing import l2_bytes, rotating, rotation_count, time_graph
from advisor.run.bench.verify import Checker, CheckFailed, make_generator, random_matrix

SHAPES = ["1664x1408x8192", "4096x4096x8192", "3072x3072x4096", "512x512x65536", "256x256x131072",
          "64x4096x14336", "128x8192x8192", "16x4096x16384", "32x32x131072"]


def schedules_for(M: int, N: int) -> list[str]:
    skinny = min(M, N) <= 512
    if skinny:
        return ["dp_gemm", "split_k_gemm", "stream_k_gemm"]
    return ["dp_gemm", "persistent_gemm", "stream_k_gemm", "ws_gemm"]


def with_mode(mode: str, mod):
    """mod.matmul on a row-major B with ADVISOR_TF32_KMAJOR=mode for the call (restored after)."""

    def call(a, b, bk, o, bt):
        before = os.environ.get("ADVISOR_TF32_KMAJOR")
        os.environ["ADVISOR_TF32_KMAJOR"] = mode
        try:
            return mod.matmul(a, b, out=o)
        finally:
            if before is None:
                del os.environ["ADVISOR_TF32_KMAJOR"]
            else:
                os.environ["ADVISOR_TF32_KMAJOR"] = before

    return call


def probe_shape(shape: str, rounds: int, env: dict, dev: str, schedules: list[str] | None = None) -> list[dict]:
    """Check, then time, every variant on one shape; returns its rows."""
    import torch

    from advisor.codegen.kernel_lib import load

    relayout = load("tf32_layout")
    rows = []
    M, N, K = parse_shape(shape)
    flops = gemm_flops(M, N, K)
    checker = Checker(M, N, K, torch.float32, dev)
    n_sets = rotation_count(gemm_bytes(M, N, K, 4) * 2, l2_bytes())
    g = make_generator(dev, 1234)
    sets = []
    for _ in range(n_sets):
        a = random_matrix(M, K, torch.float32, dev, g)
        b = random_matrix(K, N, torch.float32, dev, g)
        b_km = b.t().contiguous().t()  # same values, K-major (strides (1, K))
        out = torch.full((M, N), float("nan"), device=dev)
        bt = torch.empty((N, K), device=dev)
        sets.append((a, b, b_km, out, bt))

    variants = {}

    def add(name, call):
        variants[name] = call

    add("torch.matmul", lambda a, b, bk, o, bt: torch.matmul(a, b, out=o))
    add("torch.matmul Kmajor-B", lambda a, b, bk, o, bt: torch.matmul(a, bk, out=o))
    add("copy B -> K-major (torch)", lambda a, b, bk, o, bt: bt.copy_(b.t()))
    add("copy B -> K-major (k_major_copy)", lambda a, b, bk, o, bt: relayout.k_major_copy(b, 0))
    for name in schedules_for(M, N):
        if schedules and name not in schedules:
            continue
        mod = load(name)
        short = name.replace("_gemm", "")

        no_copy = with_mode("0", mod)
        copied = with_mode("1", mod)
        swap_only = with_mode("2", mod)

        def auto(a, b, bk, o, bt, mod=mod):
            return mod.matmul(a, b, out=o)

        def k_major(a, b, bk, o, bt, mod=mod):
            return mod.matmul(a, bk, out=o)

        add(f"{short} row-major B, no copy", no_copy)
        add(f"{short} row-major B, always copied", copied)
        add(f"{short} row-major B, swapped, never copied", swap_only)
        add(f"{short} row-major B (as matmul runs it)", auto)
        add(f"{short} K-major B (made beforehand)", k_major)

    ok = {}
    for name, call in variants.items():
        if name.startswith("copy"):
            ok[name] = 0.0
            continue
        try:
            def checked(a, b, o, call=call):
                bt = torch.empty((N, K), device=dev)
                return call(a, b, b.t().contiguous().t(), o, bt)
            ok[name] = checker.check(checked)
        except (CheckFailed, ValueError) as exc:
            print(f"{shape:>16s} {name:44s} skipped: {exc}")
    times = {name: [] for name in ok}
    for r in range(rounds):
        order = list(ok)
        order = order[r % len(order):] + order[:r % len(order)]
        for name in order:
            call = variants[name]
            fn = rotating([lambda s=s, call=call: call(*s) for s in sets])
            times[name].append(time_graph(fn).median_ms * 1000)
    base = statistics.median(times["torch.matmul"])
    for name, err in ok.items():
        us = statistics.median(times[name])
        copy = name.startswith("copy")
        rate = f"{2 * 4 * K * N / us / 1e3:6.0f} GB/s" if copy else f"{flops / us / 1e6:6.1f} TF/s"
        print(f"{shape:>16s} {name:44s} {us:9.1f} {rate:>11s} {base / us:8.2f}")
        rows.append(make_row(suite="probe_tf32_layout", shape=shape, M=M, N=N, K=K, dtype="fp32",
                             provider=name, status="ok", median_ms=us / 1000, rel_err=err,
                             timer="graph", flops=None if copy else flops,
                             bytes_moved=2 * 4 * K * N if copy else None,
                             env=env))
    del sets
    torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=None)
    ap.add_argument("--schedules", default=None, help="comma-separated module names (default: all that fit)")
    args = ap.parse_args(argv)
    out_dir = Path(args.out or "experiments/results/probe_tf32_layout")
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = "cuda"
    env = environment(dev, new_run_id())
    rows = []
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, fp32 inputs (tf32 MMA)")
    print(f"{'shape':>16s} {'variant':44s} {'us':>9s} {'rate':>11s} {'x torch':>8s}")
    for shape in args.shapes.split(","):
        rows += probe_shape(shape, args.rounds, env, dev,
                            args.schedules.split(",") if args.schedules else None)
    append_csv(out_dir / "probe_tf32_layout.csv", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
