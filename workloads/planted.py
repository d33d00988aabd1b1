"""Small GPU workloads with known, planted scheduling symptoms (and clean controls).

Each scenario warms up (Triton compiles, cuBLAS picks its kernels), then runs its timed part
inside the profiler's capture window:

    tail         our data-parallel Triton GEMM, 1664x1408x8192 bf16: 143 tiles of 128x128 on
                 132 SMs -> a 1.08-wave grid, tail efficiency 0.54           -> tail_wave
    skinny       our data-parallel Triton GEMM, 256x256x131072 bf16: 4 tiles  -> small_grid_long_k
    tiny_stream  400 tiny elementwise kernels launched one by one from Python -> launch_overhead
    small_gemms  64 small torch.matmul (M,N,K in 128..512) in a Python loop   -> launch_overhead (grouped)
    huge_grid    a Triton copy with 64-element blocks, one warp: 512k blocks  -> launch_overhead (big grid)
    balanced     control: cuBLAS 8192^3 and 4096x4096x8192 bf16, whole waves  -> nothing
    mixed        tail + skinny + tiny_stream + small_gemms in one capture (the bundled example)
    graphs       an MLP step (2048x4096 -> 16384 -> 4096 bf16) captured once as a CUDA graph
                 and replayed 20 times, then one eager kernel: under nsys's default
                 --cuda-graph-trace=graph each replay is one CUPTI_ACTIVITY_KIND_GRAPH_TRACE
                 row and its kernels are not listed (capture_nsys_modes.sh takes both modes)
    two_procs    two processes on GPU 0 under one nsys session: process 0 runs the tail
                 GEMM, process 1 the skinny one; their correlation and stream ids overlap
                 (run with --profiler none and the whole process traced: see
                 capture_nsys_modes.sh)

Profilers (the timed part only):
    --profiler nsys    run under `nsys profile --capture-range=cudaProfilerApi ...` (see capture.sh)
    --profiler kineto  torch.profiler with record_shapes, written to --out as .json.gz

GEMM shapes are labelled with advisor.annotate (the `advisor.gemm M= N= K=` convention);
`small_gemms` is additionally run under emit_nvtx(record_shapes=True) for nsys captures so
that both conventions are exercised.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advisor.codegen import kernel_lib  # noqa: E402
from advisor.annotate import gemm  # noqa: E402
from kineto_out import export_gz  # noqa: E402  (beside this script)

DEV = "cuda"
BF16 = torch.bfloat16


@triton.jit
def tiny_block_copy(src, dst, n, BLOCK: tl.constexpr):
    # One 64-element block per program: a grid of n/64 very short-lived blocks.
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=mask) * 2.0, mask=mask)


def _randn(*shape):
    return torch.randn(*shape, device=DEV, dtype=BF16)


def _dp():
    return kernel_lib.load("dp")


# --gemm torch: the tail and skinny GEMMs as a user's program calls them (torch.matmul, so
# cuBLAS runs them and advisor.use can route them); triton (default): our planted kernel.
GEMM_VIA = {"via": "triton"}


def _gemm(dp, a, b, cfg):
    return torch.matmul(a, b) if GEMM_VIA["via"] == "torch" else dp.matmul(a, b, cfg)


def tail(iters: int):
    dp = _dp()
    M, N, K = 1664, 1408, 8192
    cfg = dp.Config(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    a, b = _randn(M, K), _randn(K, N)

    def run():
        # One range around the loop: per-launch NVTX/profiler overhead would starve the GPU
        # (84 us kernels) and plant an idle-GPU problem we do not want here.
        with gemm(M, N, K, dtype="bf16", label="planted tail"):
            for _ in range(iters):
                _gemm(dp, a, b, cfg)

    return run


def skinny(iters: int):
    dp = _dp()
    M, N, K = 256, 256, 131072
    cfg = dp.Config(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
    a, b = _randn(M, K), _randn(K, N)

    def run():
        for _ in range(iters):
            with gemm(M, N, K, dtype="bf16", label="planted skinny"):
                _gemm(dp, a, b, cfg)

    return run


def tiny_stream(iters: int):
    x = _randn(4096)

    def run():
        for _ in range(iters * 400):
            x.mul_(1.0001)

    return run


def small_gemms(iters: int, emit_nvtx: bool = False):
    g = torch.Generator().manual_seed(0)
    sizes = [tuple(int(v) for v in torch.randint(128, 513, (3,), generator=g)) for _ in range(64)]
    pairs = [(_randn(m, k), _randn(k, n)) for m, n, k in sizes]

    def run():
        ctx = torch.autograd.profiler.emit_nvtx(record_shapes=True) if emit_nvtx else contextlib.nullcontext()
        with ctx:
            for _ in range(iters):
                for (a, b), (m, n, k) in zip(pairs, sizes):
                    with gemm(m, n, k, dtype="bf16") if not emit_nvtx else contextlib.nullcontext():
                        torch.matmul(a, b)

    return run


def huge_grid(iters: int):
    n = 1 << 25  # 32M floats, 64 per block: 524288 blocks of 32 threads
    src = torch.randn(n, device=DEV)
    dst = torch.empty_like(src)

    def run():
        for _ in range(iters):
            tiny_block_copy[(triton.cdiv(n, 64),)](src, dst, n, BLOCK=64, num_warps=1)

    return run


def balanced(iters: int):
    shapes = [(8192, 8192, 8192), (4096, 4096, 8192)]
    ops = [(m, n, k, _randn(m, k), _randn(k, n)) for m, n, k in shapes]

    def run():
        for _ in range(iters):
            for m, n, k, a, b in ops:
                with gemm(m, n, k, dtype="bf16", label="control"):
                    torch.matmul(a, b)

    return run


def mixed(iters: int):
    parts = [tail(iters), skinny(max(1, iters // 2)), tiny_stream(1), small_gemms(1)]

    def run():
        for p in parts:
            p()

    return run


def graphs(iters: int):
    M, H = 2048, 4096
    x, w1, w2 = _randn(M, H), _randn(H, 4 * H), _randn(4 * H, H)

    def step():
        return torch.nn.functional.gelu(x @ w1) @ w2

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm up off the capture stream, as torch's graph docs do
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()

    def run():
        for _ in range(iters):
            graph.replay()
        x.mul_(1.0)  # one eager kernel after the replays

    return run


def _two_procs_child(index: int, iters: int) -> None:
    torch.cuda.set_device(0)
    run = tail(iters) if index == 0 else skinny(max(1, iters // 4))
    run()  # warm-up (compiles once; the other process finds the cache)
    torch.cuda.synchronize()
    run()
    torch.cuda.synchronize()


def two_procs(iters: int):
    def run():
        torch.multiprocessing.spawn(_two_procs_child, args=(iters,), nprocs=2)

    return run


SCENARIOS = {
    "tail": (tail, 20),
    "skinny": (skinny, 4),
    "tiny_stream": (tiny_stream, 1),
    "small_gemms": (small_gemms, 3),
    "huge_grid": (huge_grid, 5),
    "balanced": (balanced, 4),
    "mixed": (mixed, 6),
    "graphs": (graphs, 20),
    "two_procs": (two_procs, 12),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--profiler", choices=["nsys", "kineto", "none"], default="none")
    p.add_argument("--iters", type=int, default=None, help="Timed iterations (default per scenario).")
    p.add_argument("--out", type=Path, default=Path("out/traces"), help="Directory for Kineto traces.")
    p.add_argument("--emit-nvtx", action="store_true", help="small_gemms: label shapes with emit_nvtx instead of advisor.annotate.")
    p.add_argument("--gemm", choices=["triton", "torch"], default="triton",
                   help="tail/skinny/mixed: run the GEMMs with our planted Triton kernel (default) or torch.matmul.")
    p.add_argument("--steps", type=int, default=0,
                   help="With --profiler none: run the timed part N times, each inside a range named 'step' "
                        "(record_function and NVTX), for a profiler run from outside (advisor optimize/compare).")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("planted.py needs a CUDA GPU", file=sys.stderr)
        return 2
    GEMM_VIA["via"] = args.gemm
    factory, default_iters = SCENARIOS[args.scenario]
    iters = args.iters or default_iters
    if args.scenario == "two_procs":  # each child warms up and runs its part itself
        if args.profiler != "none":
            print("two_procs: run it with --profiler none under a whole-process nsys capture", file=sys.stderr)
            return 2
        two_procs(iters)()
        return 0
    run = factory(iters, emit_nvtx=True) if args.scenario == "small_gemms" and args.emit_nvtx else factory(iters)
    run()  # warm-up: compile Triton kernels, pick cuBLAS algorithms
    torch.cuda.synchronize()
    if args.profiler == "nsys":
        torch.cuda.cudart().cudaProfilerStart()
        run()
        torch.cuda.synchronize()
        torch.cuda.cudart().cudaProfilerStop()
    elif args.profiler == "kineto":
        from torch.profiler import ProfilerActivity, profile

        args.out.mkdir(parents=True, exist_ok=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            run()
            torch.cuda.synchronize()
        export_gz(prof, args.out / f"{args.scenario}.kineto.json")
    elif args.steps:
        for _ in range(args.steps):
            with torch.profiler.record_function("step"), torch.cuda.nvtx.range("step"):
                run()
                torch.cuda.synchronize()
    else:
        run()
        torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
