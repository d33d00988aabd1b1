"""Probe: how fast do a few programs copy an fp32 B K-major (tf32_layout.copy_into), next to
the whole GPU doing it (H200)?

    python3 experiments/probe_copy_beside.py [--shapes 8192x4096,8192x8192] [--programs 2,4,8,16] [--out DIR]
    python3 experiments/probe_copy_beside.py --variants [--match prefetch]   # also the probe's own kernels
    python3 experiments/probe_copy_beside.py --shapes '' --gemm 8192x8192x8192 --programs 4   # interference

Question (2026-12-01). persistent_gemm's `copy_sms` hides the K-major copy of a row-major fp32
B behind the GEMM: while the GEMM computes one column chunk of C on SMs - copy_sms programs,
copy_sms programs copy the next chunk of B on a side stream. That only hides the copy where
those few programs keep up with the GEMM: a chunk of B (K x W fp32, 8 K W bytes read and
written) against its GEMM (2 M W K flops), so 4 x the tf32 rate / M bytes a second, about
320 GB/s at M = 4096 and 160 at M = 8192 for a ~330 TFLOP/s GEMM. This times the copy alone
(graph timer, inputs rotating past the L2) with one program a block (the whole GPU) and with
each given number of programs, and prints bytes read + written per second. Long-format rows
go to DIR/probe_copy_beside.csv.

What it showed (H200, 2026-12-01, results/probe_copy_beside/): the plain relayout loop moved
47 GB/s a program. Issuing the next block's load before the current block's store moved 69
with 64x128 blocks on 8 warps, and copy_into now does that. Larger blocks were slower (53 and
20), two loads ahead no faster (66-71), and TMA in, transpose, TMA out slower still (20-35).
Beside a 128-program GEMM the 4-program copy did not slow it (8192^3: 3124 us, against
3110-3244 alone).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import triton
import triton.language as tl

from advisor.run.bench.rows import append_csv, make_row, new_run_id
from advisor.run.bench.timing import l2_bytes, rotating, rotation_count, time_graph
from kernels.tf32_layout import _relayout_beside_kernel, _relayout_kernel


@triton.jit
def _prefetch2_copy_kernel(src, dst, R, C, s_r, s_c, d_r, d_c, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """As tf32_layout's _relayout_beside_kernel (what copy_into runs beside a GEMM), two blocks ahead: a program keeps two loads in flight during
    each store (a program's second block may not exist: its loads and stores are masked)."""
    blocks_r = tl.cdiv(R, BLOCK_R)
    blocks = blocks_r * tl.cdiv(C, BLOCK_C)
    step = tl.num_programs(0)
    b0 = tl.program_id(0)
    b1 = b0 + step
    r0 = (b0 % blocks_r) * BLOCK_R + tl.arange(0, BLOCK_R)
    c0 = (b0 // blocks_r) * BLOCK_C + tl.arange(0, BLOCK_C)
    m0 = (r0 < R)[:, None] & (c0 < C)[None, :]
    r1 = (b1 % blocks_r) * BLOCK_R + tl.arange(0, BLOCK_R)
    c1 = (b1 // blocks_r) * BLOCK_C + tl.arange(0, BLOCK_C)
    m1 = (r1 < R)[:, None] & (c1 < C)[None, :] & (b1 < blocks)
    x0 = tl.load(src + (r0[:, None] * s_r + c0[None, :] * s_c), mask=m0)
    x1 = tl.load(src + (r1[:, None] * s_r + c1[None, :] * s_c), mask=m1)
    for nxt in range(b0 + 2 * step, blocks, step):
        r2 = (nxt % blocks_r) * BLOCK_R + tl.arange(0, BLOCK_R)
        c2 = (nxt // blocks_r) * BLOCK_C + tl.arange(0, BLOCK_C)
        m2 = (r2 < R)[:, None] & (c2 < C)[None, :]
        x2 = tl.load(src + (r2[:, None] * s_r + c2[None, :] * s_c), mask=m2)
        tl.store(dst + (r0[:, None] * d_r + c0[None, :] * d_c), x0, mask=m0)
        x0, r0, c0, m0 = x1, r1, c1, m1
        x1, r1, c1, m1 = x2, r2, c2, m2
    tl.store(dst + (r0[:, None] * d_r + c0[None, :] * d_c), x0, mask=m0)
    tl.store(dst + (r1[:, None] * d_r + c1[None, :] * d_c), x1, mask=m1)


@triton.jit
def _tma_copy_kernel(src_desc, dst_desc, R, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                     STAGES: tl.constexpr):
    """The relayout copy through TMA: a box of the row-major source in, its transpose out
    through a descriptor over the destination's (C, R) row-major storage."""
    blocks_r = tl.cdiv(R, BLOCK_R)
    for blk in tl.range(tl.program_id(0), blocks_r * tl.cdiv(C, BLOCK_C), tl.num_programs(0), num_stages=STAGES):
        r0 = (blk % blocks_r) * BLOCK_R
        c0 = (blk // blocks_r) * BLOCK_C
        x = src_desc.load([r0, c0])
        dst_desc.store([c0, r0], tl.trans(x))


def variant_copies(src, dst, programs):
    """(label, fn) of the probe's own copy kernels for src (R, C) row-major into dst (R, C)
    column-major, `programs` programs each."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    R, C = src.shape
    out = []
    for br, bc, w in ((128, 128, 8), (128, 128, 16), (256, 128, 16), (64, 128, 8)):
        grid = (min(programs, triton.cdiv(R, br) * triton.cdiv(C, bc)),)
        out.append((f"prefetch {br}x{bc} w{w}", lambda br=br, bc=bc, w=w, grid=grid: _relayout_beside_kernel[grid](
            src, dst, R, C, src.stride(0), src.stride(1), dst.stride(0), dst.stride(1),
            BLOCK_R=br, BLOCK_C=bc, INT64=False, num_warps=w)))
    for br, bc, w in ((64, 128, 8), (64, 128, 16), (32, 128, 4), (64, 64, 4)):
        grid = (min(programs, triton.cdiv(R, br) * triton.cdiv(C, bc)),)
        out.append((f"prefetch2 {br}x{bc} w{w}", lambda br=br, bc=bc, w=w, grid=grid: _prefetch2_copy_kernel[grid](
            src, dst, R, C, src.stride(0), src.stride(1), dst.stride(0), dst.stride(1),
            BLOCK_R=br, BLOCK_C=bc, num_warps=w)))
    dst_t = dst.t()  # (C, R) row-major storage
    for br, bc, stages, w in ((64, 128, 3, 4), (128, 128, 2, 8), (64, 64, 4, 4), (128, 64, 3, 4)):
        s_d = TensorDescriptor(src, [R, C], [src.stride(0), 1], [br, bc])
        d_d = TensorDescriptor(dst_t, [C, R], [dst_t.stride(0), 1], [bc, br])
        grid = (min(programs, triton.cdiv(R, br) * triton.cdiv(C, bc)),)
        out.append((f"tma {br}x{bc} s{stages} w{w}", lambda s_d=s_d, d_d=d_d, br=br, bc=bc, stages=stages, w=w,
                    grid=grid: _tma_copy_kernel[grid](s_d, d_d, R, C, BLOCK_R=br, BLOCK_C=bc, STAGES=stages,
                                                      num_warps=w)))
    return out


def gemm_beside(text, M, N, K, counts, sms, report):
    """The persistent fp32 winner (128x256x32, 3 stages, subtiled TMA store) on a B stored
    K-major beforehand: on all SMs, on SMs - p programs, and on SMs - p programs while p
    programs copy a K x N fp32 tensor on a side stream (two copy kernels). Inputs rotate."""
    import torch

    from kernels import persistent_gemm as pg
    from kernels.tf32_layout import copy_into, k_major_empty

    dev = torch.device("cuda")
    cfg = pg.Config(128, 256, 32, 8, 8, 3, 1, True, True, True)
    sets = rotation_count(4 * (M * K + K * N + M * N), l2_bytes(dev))
    ins = []
    for _ in range(sets):
        b = k_major_empty(K, N, 0, torch.float32, dev)
        b.copy_(torch.randn(K, N, device=dev))
        ins.append((torch.randn(M, K, device=dev), b, torch.empty(M, N, device=dev)))
    src, dst = torch.randn(K, N, device=dev), k_major_empty(K, N, 0, torch.float32, dev)
    side = torch.cuda.Stream()

    def gemm(programs):
        return rotating([lambda a=a, b=b, c=c: pg.matmul(a, b, cfg, out=c, programs=programs) for a, b, c in ins])

    def beside(programs, copy):
        g = gemm(sms - programs)

        def fn():
            main = torch.cuda.current_stream()
            side.wait_stream(main)
            with torch.cuda.stream(side):
                copy()
            g()
            main.wait_stream(side)
        return fn

    report(text, M, N, K, f"persistent, {sms} programs", time_graph(gemm(None)))
    for p in counts:
        report(text, M, N, K, f"persistent, {sms - p} programs", time_graph(gemm(sms - p)))
        grid = (p,)  # the plain loop: what copy_into ran beside a GEMM before the prefetch
        plain = lambda grid=grid: _relayout_kernel[grid](
            src, dst, K, N, src.stride(0), src.stride(1), dst.stride(0), dst.stride(1),
            BLOCK_R=128, BLOCK_C=128, INT64=False, num_warps=8)
        report(text, M, N, K, f"... beside the plain loop 128x128 on {p} programs", time_graph(beside(p, plain)))
        report(text, M, N, K, f"... beside copy_into (prefetch 64x128) on {p} programs",
               time_graph(beside(p, lambda p=p: copy_into(src, dst, programs=p))))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="8192x4096,8192x8192", help="K x N of B, comma-separated")
    ap.add_argument("--programs", default="2,4,8,16", help="program counts to try beside the full grid")
    ap.add_argument("--variants", action="store_true", help="also time the probe's own copy kernels")
    ap.add_argument("--match", default="", help="with --variants: only the kernels whose label contains this")
    ap.add_argument("--gemm", default="", help="MxNxK shapes: also time the persistent fp32 GEMM on a K-major B "
                    "alone, on SMs - p programs, and beside a p-program copy (interference)")
    ap.add_argument("--out", type=Path, default=None, help="directory for probe_copy_beside.csv")
    args = ap.parse_args(argv)

    import torch

    from kernels.tf32_layout import copy_into, k_major_empty

    dev = torch.device("cuda")
    run_id = new_run_id()
    name = torch.cuda.get_device_name(dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    env = {"device": name, "sm_count": sms, "run_id": run_id, "torch": torch.__version__,
           "triton": triton.__version__}
    print(f"# {name}, torch {torch.__version__}")
    rows = []

    def report(text, K, N, label, programs, t, nbytes):
        gbps = nbytes / (t.median_ms * 1e-3) / 1e9
        per = "" if programs is None else f" ({gbps / programs:5.0f} a program)"
        count = "one a block" if programs is None else f"{programs} programs"
        print(f"  B {text:>10} fp32 {label:>22} {count:>12}: {t.median_ms * 1e3:8.1f} us {gbps:7.0f} GB/s{per}")
        rows.append(make_row(suite="probe_copy_beside", shape=text, M=0, N=N, K=K, dtype="fp32",
                             provider=label, config={"programs": programs}, status="ok",
                             median_ms=t.median_ms, p20_ms=t.p20_ms, p80_ms=t.p80_ms,
                             bytes_moved=nbytes, timer="graph", env=env))

    def report_gemm(text, M, N, K, label, t):
        tf = 2 * M * N * K / (t.median_ms * 1e-3) / 1e12
        print(f"  {text} {label:>48}: {t.median_ms * 1e3:8.1f} us {tf:6.1f} TFLOP/s")
        rows.append(make_row(suite="probe_copy_beside", shape=text, M=M, N=N, K=K, dtype="fp32",
                             provider=label, config={}, status="ok", median_ms=t.median_ms, p20_ms=t.p20_ms,
                             p80_ms=t.p80_ms, flops=2 * M * N * K, timer="graph", env=env))

    for text in filter(None, args.shapes.split(",")):
        K, N = (int(x) for x in text.lower().split("x"))
        nbytes = 2 * 4 * K * N
        sets = rotation_count(nbytes, l2_bytes(dev))
        srcs = [torch.randn(K, N, device=dev) for _ in range(sets)]
        dsts = [k_major_empty(K, N, 0, torch.float32, dev) for _ in range(sets)]
        counts = [int(p) for p in args.programs.split(",")]
        for programs in [None] + counts:
            dsts[0].fill_(float("nan"))
            copy_into(srcs[0], dsts[0], programs=programs)
            if not torch.equal(dsts[0], srcs[0]):
                print(f"  {text} copy_into programs={programs}: WRONG copy")
                continue
            fn = rotating([lambda s=s, d=d, p=programs: copy_into(s, d, programs=p) for s, d in zip(srcs, dsts)])
            report(text, K, N, "copy_into", programs, time_graph(fn), nbytes)
        if not args.variants:
            continue
        for programs in counts:
            for i, (label, _) in enumerate(variant_copies(srcs[0], dsts[0], programs)):
                if args.match not in label:
                    continue
                calls = [variant_copies(s, d, programs)[i][1] for s, d in zip(srcs, dsts)]
                dsts[0].fill_(float("nan"))
                calls[0]()
                if not torch.equal(dsts[0], srcs[0]):
                    print(f"  {text} {label} programs={programs}: WRONG copy")
                    continue
                report(text, K, N, label, programs, time_graph(rotating(calls)), nbytes)
    for text in filter(None, args.gemm.split(",")):
        M, N, K = (int(x) for x in text.lower().split("x"))
        gemm_beside(text, M, N, K, [int(p) for p in args.programs.split(",")], sms, report_gemm)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        append_csv(args.out / "probe_copy_beside.csv", rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
