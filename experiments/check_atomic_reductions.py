"""GPU check: the atomic (read-and-clear) reductions under back-to-back launches.

    python3 experiments/check_atomic_reductions.py [--launches 60] [--match SUBSTRING]

Split-K's "atomic" reduction and Stream-K's atomic fixup add fp32 partials into a pooled
sum buffer and hand it back zeroed (kernels/common.ZeroedScratch), so each launch depends
on the previous one having cleaned up. On the H200 (2026-11-29) a load-then-store-zeros
read-out raced for 128-row tiles (Triton laid the load and the store out differently) and
lost about half of the sums; the CPU interpreter, one program at a time, cannot show such
a race. Here each config runs `--launches` times back to back on the same stream; every
5th launch gets fresh random inputs and a NaN-poisoned output and is checked against a
float64 reference; at the end the pooled scratch must be all zeros. Prints one line per
config and exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch

from advisor.codegen.kernel_lib import load


def cases():
    sk, sp = load("split_k_gemm"), load("stream_k_gemm")
    # 128-row tiles (the ones that raced), 64-row and tiny ones, with splits from 2 to 128
    yield "split_k 128x128x64 w4 split8", sk, sk.Config(128, 128, 64, 8, 4, 5, 8, "atomic"), (512, 512, 65536)
    yield "split_k 128x128x64 w8 split2", sk, sk.Config(128, 128, 64, 8, 8, 5, 2, "atomic"), (128, 8192, 8192)
    yield "split_k 128x64x64 w4 split16", sk, sk.Config(128, 64, 64, 8, 4, 6, 16, "atomic"), (256, 256, 131072)
    yield "split_k 64x64x128 w4 split2", sk, sk.Config(64, 64, 128, 8, 4, 6, 2, "atomic"), (64, 4096, 14336)
    yield "split_k 32x32x128 w4 split128", sk, sk.Config(32, 32, 128, 8, 4, 6, 128, "atomic"), (32, 32, 131072)
    yield "split_k 128x128x64 ragged", sk, sk.Config(128, 128, 64, 8, 4, 4, 5, "atomic"), (1000, 1032, 4104)
    # Stream-K's atomic fixups: the aligned cooperative read-out and the contiguous last arriver
    t128 = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 5}
    yield ("stream_k hybrid1 aligned atomic", sp,
           sp.Config(**t128, policy="hybrid1", deterministic=False, aligned=True, use_tma=True), (1664, 1408, 8192))
    yield ("stream_k sk aligned atomic 128x64", sp,
           sp.Config(128, 64, 64, 8, 4, 7, "sk", False, aligned=True, use_tma=True), (256, 256, 131072))
    yield ("stream_k sk contiguous atomic", sp, sp.Config(**t128, policy="sk", deterministic=False), (2176, 2176, 2048))
    # the same read-out on Stream-K tiles cut into row pieces (SK_SPLIT_M): 64- and 32-row
    # pieces of 128x128 and 128x256 tiles, one sum and counter a piece
    yield ("stream_k hybrid1 aligned atomic m/2", sp,
           sp.Config(**t128, policy="hybrid1", deterministic=False, aligned=True, use_tma=True, SK_SPLIT_M=2),
           (1664, 1408, 8192))
    yield ("stream_k hybrid1 aligned atomic 128x256 m/4", sp,
           sp.Config(128, 256, 64, 8, 8, 3, "hybrid1", False, aligned=True, use_tma=True, SK_SPLIT_M=4),
           (2304, 2304, 4096))
    # the TMA hand-in (bulk reduce-add into the sum, or bulk store into the slot, then a wait
    # for completion before the arrival) on 128x128 partials in 2 strips and 128x256 in 8; and
    # helper claims (the programs without Stream-K work sum the pieces whole: 7 of them on
    # 2176^2 with 128x128 tiles, 12 on 3072^2 with 128x256 ones)
    for det in (False, True):
        name = "atomic" if not det else "deterministic"
        yield (f"stream_k hybrid1 aligned {name} tmahand", sp,
               sp.Config(**t128, policy="hybrid1", deterministic=det, aligned=True, use_tma=True, tma_hand_in=True),
               (1664, 1408, 8192))
        yield (f"stream_k hybrid1 aligned {name} 128x256 tmahand", sp,
               sp.Config(128, 256, 64, 8, 8, 3, "hybrid1", det, aligned=True, use_tma=True, tma_hand_in=True),
               (3072, 3072, 4096))
        yield (f"stream_k hybrid1 aligned {name} helpers", sp,
               sp.Config(**t128, policy="hybrid1", deterministic=det, aligned=True, use_tma=True, helper_claims=True),
               (2176, 2176, 8192))
        yield (f"stream_k hybrid1 aligned {name} 128x256 tmahand helpers", sp,
               sp.Config(128, 256, 64, 8, 8, 3, "hybrid1", det, aligned=True, use_tma=True, tma_hand_in=True,
                         helper_claims=True), (3072, 3072, 4096))
    # column and quarter pieces (SK_SPLIT_N): atomic sums and claims a piece's 128 columns wide,
    # K-chunked with the per-thread and the TMA hand-in; and whole quarter pieces (no fixup,
    # 5-stage piece loops) as the tail search runs them
    q = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3,
         "policy": "hybrid1", "aligned": True, "use_tma": True, "SK_SPLIT_N": 2}
    yield "stream_k hybrid1 aligned atomic 128x256 n/2", sp, sp.Config(**q, deterministic=False), (3072, 3072, 4096)
    yield ("stream_k hybrid1 aligned atomic 128x256 m/2 n/2 tmahand", sp,
           sp.Config(**q, deterministic=False, SK_SPLIT_M=2, tma_hand_in=True), (2176, 2176, 8192))
    yield ("stream_k hybrid1 aligned 128x256 m/2 n/2 whole sks5", sp,
           sp.Config(**q, SK_SPLIT_M=2, whole_pieces=True, SK_STAGES=5), (3072, 3072, 4096))
    # the ragged column first (edge_first): the half-empty tiles' right-hand pieces dropped,
    # atomic (as searched) and deterministic, 25 pieces on 2176^2 and 33 on 4224^2
    for det in (False, True):
        name = "atomic" if not det else "deterministic"
        for shape in ((2176, 2176, 8192), (4224, 4224, 8192)):
            yield (f"stream_k hybrid1 aligned {name} 128x256 n/2 sks5 edge", sp,
                   sp.Config(**q, deterministic=det, SK_STAGES=5, edge_first=True), shape)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--launches", type=int, default=60)
    ap.add_argument("--match", default="", help="only the cases whose name contains this")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("check_atomic_reductions: needs a CUDA GPU", file=sys.stderr)
        return 2
    from kernels.common import SCRATCH, TOLERANCE, random_inputs, reference, rel_error

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, {args.launches} launches a config")
    failures = 0
    for name, mod, cfg, (M, N, K) in cases():
        if args.match not in name:
            continue
        worst, bad = 0.0, 0
        for i in range(args.launches):
            if i % 5 == 0:
                a, b = random_inputs(M, N, K, torch.bfloat16, "cuda", seed=1000 * i + M + N)
                out = torch.full((M, N), float("nan"), dtype=torch.bfloat16, device="cuda")
                mod.matmul(a, b, cfg, out=out)
                err = rel_error(out, reference(a, b))
                worst = max(worst, err)
                bad += not err <= TOLERANCE[torch.bfloat16]  # NaN fails too
            else:
                mod.matmul(a, b, cfg)
        torch.cuda.synchronize()
        dirty = [key[0] for key, buf in SCRATCH._buffers.items() if buf.any().item()]
        ok = not bad and not dirty
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {name:34s} {M}x{N}x{K} worst rel_err={worst:.2e} failed checks={bad}"
              f" dirty scratch={dirty or '-'}", flush=True)
    print(f"{failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
