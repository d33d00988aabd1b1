"""Probe: the host time of a replayed call, piece by piece (GPU machine).

    python3 experiments/probe_replay_host.py [--calls 20000]

experiments/probe_launch_path.py says how long an eager call takes with replays on; this says
where the remaining host time goes. Each piece of split_k_gemm.matmul's replay path (input
checks, the output allocation, the call key, the lookup, gathering the live tensors, the
stream, the launch itself) is run `--calls` times on its own and timed with perf_counter,
beside the whole call and torch.matmul. The launch pieces use a tiny problem (32x32x256, a
few microseconds of GPU work) so that the GPU queue does not throttle the host; the call
pieces use 32x32x131072 (the skinny suite's shortest kernel, ~11 us of GPU work).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def per_call_us(fn, calls: int) -> float:
    import torch

    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - t
    torch.cuda.synchronize()
    return host / calls * 1e6


def time_pieces(M: int, N: int, K: int, n: int, launch_pieces: bool) -> tuple[list, int]:
    """(piece, us per call) rows for one shape, the first launcher's argument count and the launches."""
    import torch

    from kernels import runtime as L
    from kernels import split_k_gemm as skg
    from kernels.common import check_matmul_inputs, prepare_output

    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
    c = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    L.REPLAYS.clear()
    skg.matmul(a, b, out=c)  # records
    key = L.call_key("split_k", (a, b, c), None)
    rep = L.REPLAYS.calls[key]
    live = rep.gather(a, b, c)
    ptrs = [t.data_ptr() for t in live]
    stream = L._current_stream(0)
    pieces = [
        ("check_matmul_inputs", lambda: check_matmul_inputs(a, b)),
        ("prepare_output (new C)", lambda: prepare_output(None, M, N, a)),
        ("call_key", lambda: L.call_key("split_k", (a, b, c), None)),
        ("lookup", lambda: L.REPLAYS.calls.get(key)),
        ("gather (scratch)", lambda: rep.gather(a, b, c)),
        ("data_ptr x live", lambda: [t.data_ptr() for t in live]),
        ("current stream", lambda: L._current_stream(0)),
        ("launch (C launcher)", lambda: rep.steps[0](ptrs, stream)),
    ] if launch_pieces else None
    if pieces is None:
        pieces = [("gather (scratch)", lambda: rep.gather(a, b, c))]
        pieces += [(f"launch step {i}", lambda step=step: step(ptrs, stream)) for i, step in enumerate(rep.steps)]
    pieces += [
        ("whole matmul(out=c)", lambda: skg.matmul(a, b, out=c)),
        ("whole matmul()", lambda: skg.matmul(a, b)),
        ("torch.matmul(out=c)", lambda: torch.matmul(a, b, out=c)),
    ]
    rows = []
    for name, fn in pieces:
        before = L.REPLAYS.replayed
        rows.append((name, per_call_us(fn, n)))
        if name.startswith("whole") and L.REPLAYS.replayed - before < n:
            rows.append((f"  ({L.REPLAYS.replayed - before} of {n + 100} calls replayed)", float("nan")))
    # GPU time a call of eager launches queued back to back: the GPU sleeps while the host
    # enqueues 300 calls (well under the launch queue's depth), CUDA events around them
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for name, fn in (("GPU, queued matmul(out=c)", lambda: skg.matmul(a, b, out=c)),
                     ("GPU, queued torch.matmul", lambda: torch.matmul(a, b, out=c))):
        for _ in range(100):
            fn()
        torch.cuda.synchronize()
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU clock cycles
        start.record()
        for _ in range(300):
            fn()
        end.record()
        torch.cuda.synchronize()
        rows.append((name, start.elapsed_time(end) * 1e3 / 300))
    return rows, len(rep.steps[0].template), len(rep.steps)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=20000)
    args = ap.parse_args()
    import torch

    rows = []
    for M, N, K in ((32, 32, 256), (32, 32, 131072)):
        got, n_args, n_steps = time_pieces(M, N, K, args.calls, launch_pieces=K == 256)
        rows += [(f"{M}x{N}x{K} ({n_steps} launch{'es' if n_steps > 1 else ''})", name, us) for name, us in got]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}; {args.calls} calls a piece, host us a "
          f"call (split_k_gemm's default config; its kernel takes {n_args} launcher arguments)")
    for shape, name, us in rows:
        print(f"{shape:<28} {name:<30} {us:8.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
