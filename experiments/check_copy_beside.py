"""GPU correctness of persistent_gemm's copy_beside (the K-major copy of an fp32 B on a side
stream, chunk by chunk, beside the GEMM), eagerly and captured in a CUDA graph.

    python3 experiments/check_copy_beside.py

Each case: an fp32 GEMM with a row-major B and a copy_sms config. Eagerly, 20 back-to-back
calls on fresh random inputs into NaN-poisoned outputs, each checked against a float64
reference (a chunk computed before its copy finished would read stale or uninitialised
values and fail). Then 3 calls captured in one CUDA graph; the graph is replayed 5 times,
the inputs refilled with new random values and the outputs poisoned before each replay.
Prints one line a case and the failure count; exits 1 on any failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("check_copy_beside: needs a CUDA GPU", file=sys.stderr)
        return 2
    from kernels import persistent_gemm as pg
    from kernels.common import TOLERANCE, poison_, rel_error

    tol = TOLERANCE[torch.float32]
    base = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_M": 8, "num_warps": 8, "num_stages": 3,
            "use_tma": True, "FLATTEN": True, "EPILOGUE_SUBTILE": True}
    cases = [  # (M, N, K, copy_sms, copy_chunks): each makes 3 or more chunks (printed)
        (8192, 4096, 2048, 4, 4),
        (8192, 8192, 1024, 4, 8),
        (8192, 8000, 1024, 4, 6),  # N not a multiple of the tile: a narrower last chunk
        (6000, 8192, 2048, 4, 5),  # M not a multiple of the tile
    ]
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    bad = 0
    for M, N, K, sms, chunks in cases:
        cfg = pg.Config(**base, copy_sms=sms, copy_chunks=chunks)
        a = torch.randn(M, K, device="cuda")
        b = torch.randn(K, N, device="cuda")
        c = torch.empty(M, N, device="cuda")
        if not pg.copy_beside_applies(a, b, c, cfg):
            print(f"BAD {M}x{N}x{K} copy_sms={sms} chunks={chunks}: copy_beside does not apply")
            bad += 1
            continue
        chunks_made = len(pg.copy_beside_chunks(M, N, K, cfg, pg.num_sms(a.device) - sms))
        errs = []
        for _ in range(20):
            a.normal_()
            b.normal_()
            poison_(c)
            pg.matmul(a, b, cfg, out=c)
            errs.append(rel_error(c, (a.double() @ b.double()).cpu()))
        eager = max(errs)
        sets = [(torch.randn(M, K, device="cuda"), torch.randn(K, N, device="cuda"), torch.empty(M, N, device="cuda"))
                for _ in range(3)]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for x, y, z in sets:
                pg.matmul(x, y, cfg, out=z)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            for x, y, z in sets:
                pg.matmul(x, y, cfg, out=z)
        errs = []
        for _ in range(5):
            for x, y, z in sets:
                x.normal_()
                y.normal_()
                poison_(z)
            graph.replay()
            torch.cuda.synchronize()
            errs += [rel_error(z, (x.double() @ y.double()).cpu()) for x, y, z in sets]
        graphed = max(errs)
        ok = eager <= tol and graphed <= tol and chunks_made >= 3
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {M}x{N}x{K} copy_sms={sms} copy_chunks={chunks} ({chunks_made} made): "
              f"max rel err eager {eager:.1e} "
              f"(20 calls), graph {graphed:.1e} (5 replays x 3 calls)")
    print(f"{bad} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
