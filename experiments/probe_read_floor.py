"""Probe: how fast can one kernel on this GPU just *read* a skinny GEMM's bytes? (H200)

    python3 experiments/probe_read_floor.py [--shapes 32x32x131072,...] [--out DIR]

The skinny suite's second bar is "within 1.3x of the HBM floor", the floor being the bytes a
GEMM must move (A + B + C once) over the measured copy bandwidth of a 2 GB copy. For the
small problems of that suite the floor is a few microseconds (32x32x131072: 16.8 MB, 3.9 us)
and a kernel also pays for its launch, its ramp-up (the first loads' latency before the
pipeline is full) and its drain. This probe measures that cost without any GEMM: per shape,
one buffer of exactly the GEMM's bytes (bf16), rotated past the L2 like the benchmark's
inputs, read by

- `empty`: a one-program Triton kernel that does nothing (the fixed cost of a launch in a
  CUDA graph);
- `torch.sum`: PyTorch's reduction over the buffer;
- `triton_read`: a streaming sum (grid-stride loop of 16-byte vector loads, one fp32 partial
  a program, no atomics), best of a few grid sizes and block widths.

Every read is checked first (its sum against a float64 sum of the same buffer) and timed
with the CUDA-graph timer (advisor.run.bench.timing.time_graph, the benchmark's timer), median of
--rounds interleaved rounds. The best read time is a practical floor for any kernel that
must stream those bytes once; "x floor" divides by the copy-bandwidth floor.
Rows go to DIR/probe_read_floor.csv; the table is printed.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton
import triton.language as tl

from advisor.run.bench.rows import append_csv, gemm_bytes, make_row, new_run_id, parse_shape

SKINNY = ["16x4096x16384", "64x4096x14336", "256x256x131072", "512x512x65536", "128x8192x8192", "32x32x131072"]
# (elements per program per step, programs per SM, warps): 16-byte loads, 4-8 warps, enough
# programs to keep tens of KB in flight per SM
READ_CONFIGS = [(4096, 4, 4), (8192, 2, 8), (8192, 4, 8), (16384, 2, 8), (4096, 8, 4)]


@triton.jit
def read_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    """Program p sums x[p*BLOCK : ...] strided by the grid; one fp32 partial per program."""
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    offs = pid * BLOCK + tl.arange(0, BLOCK)
    for start in range(0, n, step):
        idx = start + offs
        acc += tl.load(x_ptr + idx, mask=idx < n, other=0.0).to(tl.float32)
    tl.store(out_ptr + pid, tl.sum(acc, axis=0))


@triton.jit
def empty_kernel(out_ptr):
    pass


def triton_read(x, partials, block: int, warps: int):
    grid = (partials.numel(),)
    read_kernel[grid](x, partials, x.numel(), BLOCK=block, num_warps=warps)
    return partials


def check_cpu() -> int:
    """The read kernel sums an odd-length buffer exactly as a float64 sum (interpreter)."""
    import os

    import torch

    os.environ.setdefault("TRITON_INTERPRET", "1")
    x = torch.randn(3 * 4096 + 17, dtype=torch.float32)
    partials = torch.full((5,), float("nan"), dtype=torch.float32)
    triton_read(x, partials, 1024, 4)
    got = partials.double().sum().item()
    want = x.double().sum().item()
    return 0 if abs(got - want) <= 1e-4 * x.abs().sum().item() else 1


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=",".join(SKINNY), help="comma list of MxNxK")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--copy-gbps", type=float, default=None,
                    help="copy bandwidth for the floor (default: measured here, as bench_gemm.py does)")
    ap.add_argument("--out", type=Path, default=Path("probe-read-floor"))
    args = ap.parse_args(argv)

    import torch

    from advisor.run.bench.grouped import copy_gbps, measure_ceilings
    from advisor.run.bench.timing import l2_bytes, rotating, rotation_count, time_graph

    if not torch.cuda.is_available():
        print("probe_read_floor: needs a CUDA GPU", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    props = torch.cuda.get_device_properties(dev)
    sms = props.multi_processor_count
    env = {"device": props.name, "sm_count": sms, "torch": torch.__version__, "triton": triton.__version__,
           "run_id": new_run_id()}
    gbps = args.copy_gbps or copy_gbps(measure_ceilings("bf16", timer="do_bench"))
    print(f"# {props.name}, {sms} SMs, torch {torch.__version__}, Triton {triton.__version__}; copy {gbps:.0f} GB/s")
    gen = torch.Generator(device=dev).manual_seed(0)
    rows, table = [], []
    for shape in [s for s in args.shapes.split(",") if s]:
        M, N, K = parse_shape(shape)
        nbytes = gemm_bytes(M, N, K, 2)
        n = int(nbytes // 2)
        sets = rotation_count(nbytes, l2_bytes(dev))
        bufs = [torch.randn(n, device=dev, generator=gen).to(torch.bfloat16) for _ in range(sets)]
        floor_us = nbytes / (gbps * 1e3)
        providers = {}
        empty_out = torch.empty(1, device=dev)
        providers["empty"] = lambda o=empty_out: empty_kernel[(1,)](o)
        sums = [torch.empty((), device=dev) for _ in bufs]
        providers["torch.sum"] = rotating([lambda b=b, s=s: torch.sum(b, dim=0, dtype=torch.float32, out=s)
                                           for b, s in zip(bufs, sums)])
        for block, per_sm, warps in READ_CONFIGS:
            programs = max(1, min(per_sm * sms, triton.cdiv(n, block)))
            parts = [torch.empty(programs, device=dev) for _ in bufs]
            # check on every rotated buffer: poison, run, compare with a float64 sum
            for b, p in zip(bufs, parts):
                p.fill_(float("nan"))
                triton_read(b, p, block, warps)
                got, want = p.double().sum().item(), b.double().sum().item()
                if not abs(got - want) <= 1e-3 * b.double().abs().sum().item():
                    raise SystemExit(f"{shape} read {block}x{per_sm}/SM w{warps}: sum {got} != {want}")
            providers[f"triton_read {block} {per_sm}/SM w{warps}"] = rotating(
                [lambda b=b, p=p, bk=block, w=warps: triton_read(b, p, bk, w) for b, p in zip(bufs, parts)])
        rounds: dict[str, list[float]] = {k: [] for k in providers}
        for _ in range(args.rounds):
            for name, fn in providers.items():
                rounds[name].append(time_graph(fn).median_ms * 1e3)
        med = {k: statistics.median(v) for k, v in rounds.items()}
        best_read = min((k for k in med if k.startswith("triton_read")), key=med.get)
        for name, us in med.items():
            rows.append(make_row(suite="probe_read_floor", shape=shape, M=M, N=N, K=K, dtype="bf16",
                                 provider=name.split(" ")[0], config=name, status="ok", phase="final",
                                 median_ms=us / 1e3, bytes_moved=nbytes if name != "empty" else 0,
                                 timer="graph", env=env, hbm_gbps=gbps))
        table.append((shape, nbytes / 1e6, floor_us, med["empty"], med["torch.sum"], med[best_read], best_read))
        del bufs
    args.out.mkdir(parents=True, exist_ok=True)
    append_csv(args.out / "probe_read_floor.csv", rows)
    print(f"{'shape':>16} {'MB':>7} {'floor us':>9} {'empty us':>9} {'torch.sum us':>13} {'read us':>8} "
          f"{'read x floor':>13}  best read")
    for shape, mb, floor_us, empty, tsum, read, name in table:
        print(f"{shape:>16} {mb:7.1f} {floor_us:9.2f} {empty:9.2f} {tsum:13.2f} {read:8.2f} {read / floor_us:13.2f}  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
