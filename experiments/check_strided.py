"""GPU check: the pointer-load schedules on strides that are multiples of 8 but not of 16.

    python3 experiments/check_strided.py

mac_loop marks A's and B's offsets with each stride's power-of-two factor as the host
measured it (kernels/common.stride_hints); the CPU interpreter ignores such hints, so only a
GPU run shows whether a hint was ever wrong (a misaligned vector load gives wrong values or
a fault). Here every pointer-load schedule (dp, split-K with each reduction, Stream-K in both
layouts, persistent) runs row-major, transposed-A and transposed-B inputs whose dimensions
are 8 x odd (and one odd shape, no hint at all) in bf16 and fp32, on fresh random inputs with
a NaN-poisoned output, against a float64 reference. Prints one line per case and exits 1 on
the first failure.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from advisor.codegen.kernel_lib import load

SHAPES = [(1000, 1032, 4104), (24, 4104, 8200), (1664, 1408, 8200), (37, 53, 97)]


def cases():
    dp, sk, sp, ps = (load(n) for n in ("dp_gemm", "split_k_gemm", "stream_k_gemm", "persistent_gemm"))
    yield "dp 128x128x64", dp, dp.Config(128, 128, 64, 8, 4, 4)
    yield "dp 128x256x64", dp, dp.Config(128, 256, 64, 8, 8, 3)
    for red in ("atomic", "two_phase", "fixup"):
        yield f"split_k 64x64x128 split4 {red}", sk, sk.Config(64, 64, 128, 8, 4, 4, 4, red)
    yield "stream_k hybrid1 aligned", sp, sp.Config(128, 128, 64, 8, 4, 4, "hybrid1", True, aligned=True)
    yield "stream_k sk contiguous atomic", sp, sp.Config(128, 128, 64, 8, 4, 4, "sk", False)
    yield "persistent 128x128x64", ps, ps.Config(128, 128, 64, 8, 4, 4, use_tma=False)


def main() -> int:
    if not torch.cuda.is_available():
        print("check_strided: needs a CUDA GPU", file=sys.stderr)
        return 2
    from kernels.common import (
        TOLERANCE,
        random_inputs,
        reference,
        rel_error,
        stride_hints,
    )
    from kernels.dp_gemm import for_dtype

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    failures = 0
    for name, mod, cfg in cases():
        for (M, N, K) in SHAPES:
            for dtype in (torch.bfloat16, torch.float32):  # fp16 takes the bf16 code path
                for ta, tb in ((False, False), (True, False), (False, True)):
                    a, b = random_inputs(M, N, K, dtype, "cuda", transpose_a=ta, transpose_b=tb, seed=M + N + K)
                    out = torch.full((M, N), float("nan"), dtype=dtype, device="cuda")
                    mod.matmul(a, b, for_dtype(cfg, dtype), out=out)
                    err = rel_error(out, reference(a, b))
                    hints = [(stride_hints(a, b) >> (5 * i)) & 31 for i in range(4)]
                    ok = err <= TOLERANCE[dtype]
                    failures += not ok
                    print(f"{'ok  ' if ok else 'FAIL'} {name:30s} {M}x{N}x{K} {str(dtype)[6:]:8s} ta={ta:d} tb={tb:d} "
                          f"hints={hints} rel_err={err:.2e}")
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
