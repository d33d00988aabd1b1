"""Probe: can a Triton tile that is not a power of two wide (two dots, 128 + 32 = 160
columns) fill the waves the way cuBLAS's 128x160 tile does on 1664x1408x8192 (H200)?

    python3 experiments/probe_wide_tile.py [--shapes 1664x1408x8192] [--rounds 3]
    TRITON_INTERPRET=1 python3 experiments/probe_wide_tile.py --check   # CPU: correctness only

Question (2026-11-29). cuBLAS runs 1664x1408x8192 as 117 tiles of 128x160, one wave on 132
SMs, in 55-57 us (experiments/probe_cublas_kernels.py); our best, the aligned Stream-K hybrid of
128x128 tiles, takes 60-63 us. Triton blocks must be powers of two, but a tile can hold two
accumulators, BM x BN0 and BM x BN1, fed by two B descriptors and stored by two C
descriptors, so a 128x160 tile is 128x128 + 128x32. Does such a tile run at the per-SM rate
of our 128x128 tiles (one wave of them takes ~43 us at K=8192), which would put 117 of them
near 54 us?

The kernel below is this probe's own, not a schedule of kernels/: persistent over tiles in
grouped order, TMA loads and stores (zero-filled and clipped at the edges), row-major bf16
inputs. Method as experiments/probe_configs.py: each variant checked against a float64 reference
(NaN-poisoned output, fresh inputs), then graph-timed side by side with torch.matmul and
our 128x128 and 128x256 data-parallel tiles (the same kernel with BN1 = 0), inputs rotating
past the L2, median of interleaved rounds.

What it showed (H200, 2026-11-29, results/probe_wide_tile/): no. The best two-dot tile,
128x(128+32) with 4 warps and 4 stages, took 65.5 us for its one wave: 5.1 TFLOP/s per SM,
18% below a 128x128 tile's 6.2, so 0.87x cuBLAS (56.8 us), level with our Stream-K hybrid
(60-67 us across runs). 8 warps were slower still (77-79 us), as was 128x(128+64). The
narrow second dot (wgmma N=32, the A tile read from shared memory a second time) costs
more than the full wave gains. Wave-fitting tiles would need a kernel whose per-SM rate
does not drop with the odd width, as cuBLAS's warp-specialized 128x160 does not.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernels.dp_gemm import tile_coords

try:
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # Triton < 3.4
    TensorDescriptor = None


@triton.jit
def wide_tile_kernel(a_desc, b0_desc, b1_desc, c0_desc, c1_desc, M, N, K,
                     BM: tl.constexpr, BN0: tl.constexpr, BN1: tl.constexpr, BK: tl.constexpr,
                     GROUP_M: tl.constexpr):
    BN: tl.constexpr = BN0 + BN1
    num_pid_m = tl.cdiv(M, BM)
    num_pid_n = tl.cdiv(N, BN)
    for tile_id in tl.range(tl.program_id(0), num_pid_m * num_pid_n, tl.num_programs(0)):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BM
        off_n = pid_n * BN
        acc0 = tl.zeros((BM, BN0), dtype=tl.float32)
        if BN1 > 0:
            acc1 = tl.zeros((BM, BN1), dtype=tl.float32)
        for k in range(tl.cdiv(K, BK)):
            a = a_desc.load([off_m, k * BK])
            acc0 = tl.dot(a, b0_desc.load([k * BK, off_n]), acc0)
            if BN1 > 0:
                acc1 = tl.dot(a, b1_desc.load([k * BK, off_n + BN0]), acc1)
        c0_desc.store([off_m, off_n], acc0.to(c0_desc.dtype))
        if BN1 > 0:
            c1_desc.store([off_m, off_n + BN0], acc1.to(c1_desc.dtype))


def wide_matmul(a, b, out, bm=128, bn0=128, bn1=32, bk=64, group_m=8, num_warps=8, num_stages=4, sms=None):
    """out = a @ b with BM x (BN0 + BN1) tiles; row-major a (M, K), b (K, N), out (M, N)."""
    M, K = a.shape
    N = b.shape[1]
    a_d = TensorDescriptor(a, [M, K], [a.stride(0), 1], [bm, bk])
    b0_d = TensorDescriptor(b, [K, N], [b.stride(0), 1], [bk, bn0])
    c0_d = TensorDescriptor(out, [M, N], [out.stride(0), 1], [bm, bn0])
    # BN1 = 0: the second descriptors are never read; pass the first ones
    b1_d = TensorDescriptor(b, [K, N], [b.stride(0), 1], [bk, bn1]) if bn1 else b0_d
    c1_d = TensorDescriptor(out, [M, N], [out.stride(0), 1], [bm, bn1]) if bn1 else c0_d
    tiles = triton.cdiv(M, bm) * triton.cdiv(N, bn0 + bn1)
    sms = sms or (torch.cuda.get_device_properties(0).multi_processor_count if a.is_cuda else 4)
    wide_tile_kernel[(min(sms, tiles),)](a_d, b0_d, b1_d, c0_d, c1_d, M, N, K, BM=bm, BN0=bn0, BN1=bn1, BK=bk,
                                        GROUP_M=group_m, num_warps=num_warps, num_stages=num_stages)
    return out


VARIANTS = [  # (label, kwargs)
    ("128x(128+32) w8 s4", {"bn0": 128, "bn1": 32, "num_warps": 8, "num_stages": 4}),
    ("128x(128+32) w8 s5", {"bn0": 128, "bn1": 32, "num_warps": 8, "num_stages": 5}),
    ("128x(128+32) w4 s4", {"bn0": 128, "bn1": 32, "num_warps": 4, "num_stages": 4}),
    ("128x(128+64) w8 s4", {"bn0": 128, "bn1": 64, "num_warps": 8, "num_stages": 4}),
    ("128x128 w4 s4 (BN1=0)", {"bn0": 128, "bn1": 0, "num_warps": 4, "num_stages": 4}),
    ("128x256 w8 s3 (BN1=0)", {"bn0": 256, "bn1": 0, "num_warps": 8, "num_stages": 3}),
]


def check_cpu() -> int:
    """Interpreter check on odd small shapes (edges in M, N and K), fp16 and fp32 inputs."""
    torch.manual_seed(0)
    for (M, N, K) in ((70, 88, 48), (33, 120, 80)):  # TMA: N and K give 16-byte strides
        for dtype in (torch.float16, torch.float32):
            a = torch.randn(M, K).to(dtype)
            b = torch.randn(K, N).to(dtype)
            ref = a.double() @ b.double()
            for bn0, bn1 in ((16, 8), (32, 16), (16, 0)):
                out = torch.full((M, N), float("nan"), dtype=dtype)
                wide_matmul(a, b, out, bm=16, bn0=bn0, bn1=bn1, bk=16, group_m=2, num_warps=4, num_stages=1, sms=3)
                err = ((out.double() - ref).norm() / ref.norm()).item()
                print(f"{M}x{N}x{K} {dtype} 16x({bn0}+{bn1}): rel err {err:.1e}")
                if not err < 2e-3:
                    return 1
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1664x1408x8192")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="CPU interpreter correctness check only")
    args = ap.parse_args()
    if args.check:
        if os.environ.get("TRITON_INTERPRET") != "1":
            ap.error("--check runs under TRITON_INTERPRET=1")
        return check_cpu()
    from probe_configs import schedule_call, time_side_by_side

    from advisor.codegen.kernel_lib import load

    sk = load("stream_k_gemm")
    best_sk = sk.Config(128, 128, 64, 8, 4, 5, "hybrid1", True, aligned=True, use_tma=True)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}")
    for shape in args.shapes.split(","):
        M, N, K = (int(x) for x in shape.split("x"))
        todo = [("torch.matmul", schedule_call(None, None)),
                (f"stream_k {best_sk.describe()}", schedule_call(sk, best_sk))]
        todo += [(label, lambda a, b, o, kw=kw: wide_matmul(a, b, o, **kw)) for label, kw in VARIANTS]
        live = time_side_by_side(shape, [(label, label, call) for label, call in todo], args.rounds, 40)
        base = statistics.median(live[0][3]) if live and live[0][0] == "torch.matmul" else None
        for label, _, err, ts in live:
            us = statistics.median(ts)
            tf = 2 * M * N * K / us / 1e6
            rel = f"x{base / us:.3f} cuBLAS" if base else ""
            print(f"{shape:>16} {label:<40} {us:7.1f} us {tf:6.1f} TF {rel} [{';'.join(f'{t:.1f}' for t in ts)}] "
                  f"err {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
