"""GPU correctness of the staged TMA path (persistent_gemm / stream_k_gemm `staged` configs).

    python3 experiments/check_staged.py

Shapes whose rows break TMA's 16-byte rule (K = 4100, N = 2050, 4095 or 2001), in fp16, bf16
and fp32, with A or B transposed or neither, into a new output and into a NaN-poisoned
column-major `out`: each schedule's default config (staged where staging_pays, else pointer
loads), checked against a float64 reference with the dtype's tolerance. Prints one line a
case and the failure count; exits 1 on any failure. Results in experiments/results/staging/.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = [(2048, 2050, 4100), (1000, 4095, 4096), (3000, 2001, 4096)]


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("check_staged: needs a CUDA GPU", file=sys.stderr)
        return 2
    from kernels import persistent_gemm as pg
    from kernels import stream_k_gemm as sk
    from kernels.common import TOLERANCE, random_inputs, reference, rel_error

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    bad = 0
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        for M, N, K in SHAPES:
            for ta, tb in ((False, False), (True, False), (False, True)):
                a, b = random_inputs(M, N, K, dtype, "cuda", transpose_a=ta, transpose_b=tb, seed=M + N)
                ref = reference(a, b)
                for name, mod in (("stream_k", sk), ("persistent", pg)):
                    cfg = mod.default_config(M, N, K, dtype, 132)
                    for out_kind in ("new", "col"):
                        out = None
                        if out_kind == "col":
                            out = torch.full((N, M), float("nan"), device="cuda", dtype=dtype).t()
                        err = rel_error(mod.matmul(a, b, cfg, out=out), ref)
                        ok = err <= TOLERANCE[dtype]
                        bad += not ok
                        print(f"{'ok ' if ok else 'BAD'} {name:10s} {dtype!s:14s} {M}x{N}x{K} ta={ta:d} tb={tb:d} "
                              f"out={out_kind} {cfg.describe()} rel err {err:.1e}")
    print(f"{bad} failure(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
