"""A tensor-parallel MLP block on 2+ ranks, with its communication exposed or overlapped.

    torchrun --nproc-per-node N workloads/planted_comm.py {plain,overlap} [--shape TxHxF]
        [--iters 8] [--chunks 2] [--comm-ctas 0] [--transport nccl|p2p] [--sm-carveout 0] [--graph] [--profiler nsys|kineto|none] [--out DIR]
        [--device cuda|cpu]

One step of a Megatron-style MLP with sequence parallelism over the N ranks: every rank holds
T/N tokens x (T/N, H), a column-parallel weight w1 (H, F/N) and a row-parallel w2 (F/N, H).

    plain    y = reduce_scatter(gelu(all_gather(x) @ w1) @ w2): the all-gather, then the GEMM,
             then the GEMM, then the reduce-scatter, each waiting for the last -> exposed_comm
    overlap  kernels/comm_overlap.py: all_gather_matmul (chunks of the gather on a side stream
             hide behind the GEMM of the previous chunk, the local shard first) and
             matmul_reduce_scatter (chunk c's reduce-scatter runs under chunk c+1's GEMM)
             -> exposed_comm should not fire (only the last reduce-scatter chunk is exposed)

--graph captures one step into a CUDA graph (kernels/comm_overlap.capture_graph) and replays
it: a chunked schedule issues several ops per chunk, and on a slow host the eager schedule
leaves the GPU waiting for launches (advisor then reports gpu_idle and nothing overlaps).

Both give the same y (checked against plain before anything is profiled, relative Frobenius
error <= 1e-2 in bf16: both sum the same fp32 products and round once per GEMM).

Profilers (the timed steps only, after 3 warm-up steps):
    nsys    run each rank under `nsys profile --capture-range=cudaProfilerApi` (capture_comm.sh
            does: `torchrun --no-python nsys profile -o DIR/NAME_rank%q{RANK} ...`); every step
            is an NVTX range `step`
    kineto  torch.profiler per rank: DIR/<schedule>_rank<r>.kineto.json.gz
    none    just run (a smoke test)

--device cpu runs the same code with gloo (no streams, no overlap: the tests use it).
NVLink multicast stays off (kernels/comm_overlap sets NCCL_NVLS_ENABLE=0 etc. before the
process group exists).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advisor.codegen.kernel_lib import load  # noqa: E402
from kineto_out import export_gz  # noqa: E402  (beside this script)

co = load("comm_overlap")  # before torch.distributed initialises: multicast off

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

SCHEDULES = ("plain", "overlap")
DEFAULT_SHAPE = (8192, 4096, 4096)  # tokens x hidden x inner: an attention-sized, comm-heavy block


def parse_shape(text: str) -> tuple[int, int, int]:
    try:
        t, h, f = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not TxHxF with integers") from None
    if min(t, h, f) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} has an empty dimension")
    return t, h, f


def step_fn(schedule: str, x, w1, w2, cfg, group):
    """One MLP step as a callable; `schedule` picks the plain sequence or the overlapped one."""
    gelu = torch.nn.functional.gelu
    if schedule == "plain":
        return lambda: co.matmul_reduce_scatter_reference(gelu(co.all_gather_matmul_reference(x, w1, group=group)),
                                                          w2, group=group)
    return lambda: co.matmul_reduce_scatter(gelu(co.all_gather_matmul(x, w1, cfg, group=group)), w2, cfg,
                                            group=group)


def _nvtx_range(name: str, on: bool):
    return torch.cuda.nvtx.range(name) if on else contextlib.nullcontext()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("schedule", choices=SCHEDULES)
    ap.add_argument("--shape", type=parse_shape, default=DEFAULT_SHAPE,
                    help="tokens x hidden x inner width (default %(default)s); T and F divisible by N")
    ap.add_argument("--iters", type=int, default=8, help="profiled steps (default 8)")
    ap.add_argument("--chunks", type=int, default=2, help="overlap: chunks per collective (default 2)")
    ap.add_argument("--comm-ctas", type=int, default=0, help="overlap: CTA cap of the chunked collectives (0: NCCL's)")
    ap.add_argument("--transport", choices=("nccl", "p2p"), default="nccl",
                    help="overlap: NCCL collectives or copy-engine copies through symmetric memory")
    ap.add_argument("--sm-carveout", type=int, default=0, help="overlap: SMs the GEMMs leave to the collective")
    ap.add_argument("--graph", action="store_true", help="replay each step from a CUDA graph (both schedules)")
    ap.add_argument("--profiler", choices=("nsys", "kineto", "none"), default="none")
    ap.add_argument("--out", type=Path, default=Path("out/comm_traces"), help="kineto: folder of the per-rank traces")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cpu: gloo, for tests")
    args = ap.parse_args(argv)
    if args.iters < 1 or args.chunks < 1 or min(args.comm_ctas, args.sm_carveout) < 0:
        ap.error("--iters and --chunks must be positive, --comm-ctas >= 0")
    if "WORLD_SIZE" not in os.environ:
        ap.error("launch with torchrun --nproc-per-node N (N >= 2)")
    cuda = args.device == "cuda"
    if cuda and torch.cuda.device_count() < int(os.environ["WORLD_SIZE"]):
        print(f"planted_comm: {os.environ['WORLD_SIZE']} ranks but {torch.cuda.device_count()} GPUs", file=sys.stderr)
        return 2
    if (args.profiler == "nsys" or args.graph) and not cuda:
        ap.error("--profiler nsys and --graph need --device cuda")

    local = int(os.environ.get("LOCAL_RANK", "0"))
    timeout = datetime.timedelta(seconds=180)
    if cuda:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        dist.init_process_group("nccl", device_id=dev, timeout=timeout)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        t, h, f = args.shape
        if t % world or f % world:
            raise SystemExit(f"planted_comm: T={t} and F={f} must be divisible by {world} ranks")
        dtype = torch.bfloat16 if cuda else torch.float32
        g = torch.Generator(device=dev).manual_seed(11 + rank)
        x = torch.randn((t // world, h), generator=g, device=dev).to(dtype)
        w1 = (torch.randn((h, f // world), generator=g, device=dev) / h ** 0.5).to(dtype)
        w2 = (torch.randn((f // world, h), generator=g, device=dev) / (f // world) ** 0.5).to(dtype)
        cfg = co.Config(chunks=args.chunks, comm_ctas=args.comm_ctas, sm_carveout=args.sm_carveout,
                        transport=args.transport)
        run = step_fn(args.schedule, x, w1, w2, cfg, None)
        if args.graph:
            replay, static = co.capture_graph(run)

            def run():
                replay()
                return static

        # Same result as the plain sequence, on every rank, before anything is profiled.
        ref, got = step_fn("plain", x, w1, w2, cfg, None)(), run().clone()
        err = torch.tensor([float(torch.linalg.norm((got - ref).double()) / torch.linalg.norm(ref.double()))],
                           device=dev, dtype=torch.float64)
        dist.all_reduce(err, op=dist.ReduceOp.MAX)
        if not err.item() <= 1e-2:
            raise SystemExit(f"planted_comm: {args.schedule} differs from plain, rel err {err.item():.2e}")
        for _ in range(3):
            run()
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()

        def steps():
            for _ in range(args.iters):
                with _nvtx_range("step", cuda):
                    run()
            if cuda:
                torch.cuda.synchronize()

        if args.profiler == "nsys":
            torch.cuda.cudart().cudaProfilerStart()
            steps()
            torch.cuda.cudart().cudaProfilerStop()
        elif args.profiler == "kineto":
            from torch.profiler import ProfilerActivity, profile

            args.out.mkdir(parents=True, exist_ok=True)
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
            with profile(activities=acts, record_shapes=True) as prof:
                steps()
            export_gz(prof, args.out / f"{args.schedule}_rank{rank}.kineto.json")
        else:
            steps()
        run = replay = static = None  # a captured graph holding NCCL work must go before its communicator
        if rank == 0:
            print(f"planted_comm {args.schedule} {t}x{h}x{f} on {world} ranks{' (CUDA graph)' if args.graph else ''}: "
                  f"ok (rel err {err.item():.1e}), {args.iters} steps, profiler {args.profiler}", flush=True)
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
