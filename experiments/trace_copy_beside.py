"""Timeline of persistent_gemm's copy_beside (H200): which kernel runs when, on which stream.

    nsys profile -t cuda -s none --cpuctxsw=none --cuda-graph-trace=node -o beside -f true \
        python3 experiments/trace_copy_beside.py [--graph]
    nsys export -f true --type sqlite -o beside.sqlite beside.nsys-rep
    python3 experiments/trace_copy_beside.py --read beside.sqlite   (or beside.nsys-rep)

The first form runs each case (fp32, row-major B) three times after a warm-up, 3 ms apart
(cases 30 ms apart), eagerly or (--graph) as the replay of a CUDA graph holding two calls;
the last prints, for the last call (or replay) of each case, every kernel's start (us from
its first kernel), duration, stream and grid, so a stall (a GEMM chunk waiting for its
copy) or a slow chunk shows directly.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

BASE = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8, "num_stages": 3,
        "use_tma": True, "FLATTEN": True, "EPILOGUE_SUBTILE": True}
CASES = [((4096, 4096, 8192), 0, 4), ((4096, 4096, 8192), 4, 4), ((8192, 8192, 8192), 0, 4),
         ((8192, 8192, 8192), 4, 6)]


def run(graph: bool) -> None:
    import torch

    from kernels import persistent_gemm as pg

    for (M, N, K), sms, chunks in CASES:
        cfg = pg.Config(**BASE, copy_sms=sms, copy_chunks=chunks) if sms else pg.Config(**BASE)
        a, b = torch.randn(M, K, device="cuda"), torch.randn(K, N, device="cuda")
        c = torch.empty(M, N, device="cuda")
        for _ in range(3):
            pg.matmul(a, b, cfg, out=c)
        torch.cuda.synchronize()
        def call(a=a, b=b, c=c, cfg=cfg):
            return pg.matmul(a, b, cfg, out=c)
        if graph:  # two calls back to back, replayed as the graph timer does
            g = torch.cuda.CUDAGraph()
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.graph(g, stream=s):
                call()
                call()
            call = g.replay
        for _ in range(3):
            time.sleep(0.003)
            call()
            torch.cuda.synchronize()
        time.sleep(0.03)


def read(path: str) -> None:
    from advisor.traces import load_trace  # the diagnose pipeline's own reader

    k = load_trace(path).kernels.sort_values("start_ns")
    names = k["short_name"].fillna(k["name"])
    rows = list(zip(k["start_ns"], k["end_ns"], k["stream_id"], k["grid_x"], names))

    def split(rs, gap_ns):
        out, cur = [], []
        for r in rs:
            if cur and r[0] - max(x[1] for x in cur) > gap_ns:
                out.append(cur)
                cur = []
            cur.append(r)
        return out + [cur] if cur else out

    cases = split(rows, 15_000_000)  # cases: 30 ms apart; calls within a case: 3 ms
    for ((M, N, K), sms, chunks), case in zip(CASES, cases[-len(CASES):]):
        call = split(case, 1_500_000)[-1]
        t0 = call[0][0]
        span = (max(r[1] for r in call) - t0) / 1e3
        print(f"{M}x{N}x{K} copy_sms={sms} copy_chunks={chunks}: span {span:.1f} us")
        for start, end, stream, grid, name in call:
            print(f"  {(start - t0) / 1e3:8.1f} +{(end - start) / 1e3:8.1f} us  stream {stream:3d} grid {grid:5d}  {name}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--read", default="", help="print the timelines from this nsys report or its sqlite export")
    ap.add_argument("--graph", action="store_true", help="replay two calls captured in a CUDA graph")
    args = ap.parse_args()
    read(args.read) if args.read else run(args.graph)
