"""Split-K's knobs, how many ways K is split, its default config and its autotune search space.
The schedule itself (the idea, the kernel, the reductions and the launcher) is
kernels/split_k_gemm.py; what the choices measured: docs/schedules/split_k.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from .common import SMEM_PER_BLOCK_SM90, cdiv, num_sms
from .dp_configs import (
    TileConfig,
    _next_pow2,
    check_block_config,
    fits_shape,
    for_dtype,
)


# "atomic" computed wrong outputs on sm_90 (Triton 3.6: rel. error 0.47-0.58
# for 128-row tiles) while passing under the CPU interpreter, which runs one program at a time
# and cannot show a race. Cause, read off the sm_90 TTGIR: the last arriver loaded the sums and
# then stored zeros over them, and Triton gave the load and the store different thread layouts
# (#blocked1 vs #blocked), so one thread could zero an element before another had read it. The
# read-and-clear is now one atomic exchange per element. Re-checked on sm_90
# (experiments/check_atomic_reductions.py): 60 back-to-back launches each of 128-, 64- and 32-row tiles,
# splits 2-128, every 5th checked against float64, scratch left zeroed.
REDUCTIONS = ("atomic", "two_phase", "fixup")


@dataclass(frozen=True)
class Config(TileConfig):
    """Every knob of the Split-K schedule."""

    BLOCK_M: int = 16  # output tile rows (small for skinny M: no wasted rows of B traffic)
    BLOCK_N: int = 128  # output tile columns
    BLOCK_K: int = 128  # K step; a split is a whole number of these
    GROUP_M: int = 8  # grouped tile order (as dp_gemm)
    num_warps: int = 4
    num_stages: int = 4  # pipeline depth: memory-bound, so deep
    SPLIT_K: int = 4  # requested number of K chunks (see effective_split)
    reduction: str = "two_phase"  # "atomic" | "two_phase" | "fixup" (module docstring)
    REDUCE_BLOCK: int = 512  # two_phase: output elements per program of the reduction kernel

    def __post_init__(self):
        check_block_config(self)
        if not isinstance(self.SPLIT_K, int) or self.SPLIT_K < 1:
            raise ValueError(f"SPLIT_K={self.SPLIT_K!r}: must be a positive integer")
        if self.reduction not in REDUCTIONS:
            raise ValueError(f"reduction={self.reduction!r}: must be one of {REDUCTIONS}")
        if self.REDUCE_BLOCK < 16 or self.REDUCE_BLOCK & (self.REDUCE_BLOCK - 1):
            raise ValueError(f"REDUCE_BLOCK={self.REDUCE_BLOCK!r}: must be a power of two >= 16")

    def describe(self) -> str:
        return (f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K} g{self.GROUP_M} w{self.num_warps} "
                f"s{self.num_stages} split{self.SPLIT_K} {self.reduction}")


def effective_split(K: int, block_k: int, split_k: int) -> tuple[int, int]:
    """(chunks, K-steps per chunk): SPLIT_K chunks of whole BLOCK_K steps, dropping the empty
    ones (10 steps split 6 ways -> 5 chunks of 2)."""
    k_iters = cdiv(K, block_k)
    per_split = cdiv(k_iters, max(1, min(split_k, k_iters)))
    return cdiv(k_iters, per_split), per_split


def _pick_split(tiles: int, k_iters: int, target_programs: int, min_iters: int) -> int:
    """A split that brings tiles x split close to `target_programs` (not above), preferring a
    divisor of k_iters (equal chunks) within 25% below the target, and keeping at least
    `min_iters` K-steps per chunk."""
    want = max(1, min(target_programs // max(tiles, 1), k_iters // max(min_iters, 1)))
    for s in range(want, max(1, (3 * want) // 4) - 1, -1):
        if k_iters % s == 0:
            return s
    return want


def _tile_for(M: int, N: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, num_warps) for a skinny 16-bit problem: BLOCK_M just covers
    M (up to 128) so B is streamed once; BLOCK_K 128 while the tile is small (bigger loads per
    stage), 64 for 128-row tiles (wgmma-bound)."""
    bm = min(128, max(16, _next_pow2(M)))
    bn = min(128, max(16, _next_pow2(N)))
    bk = 64 if bm >= 128 else 128
    return bm, bn, bk, 4


def _stages(bm: int, bn: int, bk: int, elt: int, budget: int = 160 * 1024) -> int:
    """Deepest pipeline (2..6 stages) within ~160 KB of shared memory."""
    per_stage = (bm * bk + bk * bn) * elt
    return max(2, min(6, budget // per_stage))


def _reduction_for(bm: int, bn: int, split: int) -> str:
    """Deterministic default: the one-launch fixup while the last arriver's read is small
    (<= 256 KB of partials), else the two-phase reduction spread over many programs."""
    if split * bm * bn * 4 <= 256 * 1024:
        return "fixup"
    return "two_phase"


@functools.lru_cache(maxsize=512)  # pure in its arguments; saves host time per call
def default_config(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> Config:
    """Tile from the shape (`_tile_for`), split so that tiles x split fills about one wave of
    SMs with chunks of at least 8 K-steps, a deep pipeline, and a deterministic reduction."""
    elt = dtype.itemsize
    bm, bn, bk, warps = _tile_for(M, N)
    base = for_dtype(Config(bm, bn, bk, 8, warps, 2, 1, "two_phase"), dtype)
    tiles = cdiv(M, bm) * cdiv(N, bn)
    split = _pick_split(tiles, cdiv(K, base.BLOCK_K), num_sms, 8)
    stages = _stages(bm, bn, base.BLOCK_K, elt)
    return Config(bm, bn, base.BLOCK_K, 8, base.num_warps, stages, split, _reduction_for(bm, bn, split))


def _tf32_wide_point(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> Config | None:
    """fp32 with M >= 256 and N >= 128: a 256x128 tile on 8 warps, split for one wave. With a
    row-major B, matmul swaps the operands (tf32_layout) and transposes the tile to 128x256,
    so the operand fed to the MMA from registers (B^T) is read out of shared memory once per
    256 output columns instead of 128. It beat the 128x128 default (and the tile the other way
    round) on 512x512x65536, and lost on 256x256x131072 (two tiles, split 64: twice the
    partial bytes of 128x128 tiles split 32); docs/schedules/split_k.md."""
    if dtype != torch.float32 or M < 256 or N < 128:
        return None
    tiles = cdiv(M, 256) * cdiv(N, 128)
    split = _pick_split(tiles, cdiv(K, 32), num_sms, 8)
    return Config(256, 128, 32, 8, 8, 4, split, "two_phase")


def _tf32_deep_k_point(bm: int, bn: int, bk: int, split: int, dtype: torch.dtype) -> Config | None:
    """fp32: the one-wave recipe's tile with the 16-bit BLOCK_K kept (for_dtype halves it) and
    as many stages as fit in 192 KB. With a row-major B the swapped kernel feeds B^T to the MMA
    from registers; half the K-steps pay off where the tile is tall, likely because each step
    waits for that read-out (not profiled): 128x64x64 at 4 stages beat 128x64x32 at 6 and at 8
    (the same 192 KB: the step count, not the bytes in flight, decides). Only tiles whose
    16-bit BLOCK_K is 64 (128 rows, `_tile_for`) get it: kept at 128, shorter tiles lost
    (docs/schedules/split_k.md)."""
    if dtype != torch.float32 or bk > 64:
        return None
    stages = _stages(bm, bn, bk, dtype.itemsize, budget=192 * 1024)
    if stages < 3:
        return None
    return Config(bm, bn, bk, 8, 4, stages, split, _reduction_for(bm, bn, split))


def search_space(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> list[Config]:
    """At most 12 candidates for a skinny, memory-bound problem: the default, its atomic
    twin and the default's recipe for the other tiles first, then the many-programs splits.

    Splitting for one wave of deep-pipelined programs (one ~160 KB program per SM) read B at
    a fraction of the HBM bandwidth: one program per SM cannot keep enough loads in flight
    (docs/schedules/split_k.md). So after the default, the space splits for about
    4 and 8 programs per SM with pipelines of at most ~56 KB (3-4 programs resident per SM),
    for the default tile, a narrower one and 64x64 tiles, under both deterministic
    reductions (the one-launch fixup only while its partial reads stay small); the atomic
    reduction for the default tile comes right after the default."""
    elt = dtype.itemsize
    bm, bn, bk, _ = _tile_for(M, N)
    tiles_to_try = [(bm, bn, bk)]
    if bn >= 128:
        tiles_to_try.append((bm, bn // 2, bk))
    if bm >= 64:
        tiles_to_try.append((64, 64, 128))
    default = default_config(M, N, K, dtype, num_sms)
    out: list[Config] = [default]
    # the one-launch atomic reduction (read-and-clear fixed, see REDUCTIONS) for the
    # default tile, ahead of the rest so that truncation to 12 keeps it
    atomic: list[Config] = []
    if effective_split(K, default.BLOCK_K, default.SPLIT_K)[0] > 1:
        atomic.append(replace(default, reduction="atomic"))
    wide = _tf32_wide_point(M, N, K, dtype, num_sms)
    if wide is not None:
        atomic.append(wide)
    # the default's recipe (one wave of deep-pipelined programs) for the other tiles, also
    # ahead of the rest: on sm_90 (experiments/probes/skinny_split_k*.json) 128x64
    # tiles without a split beat every split config on 128x8192x8192 (40-41 us against 45;
    # cuBLAS runs 128x64 tiles there too) and 64x64 tiles split 2 beat the 64x128 default on
    # 64x4096x14336 (33.3 against 34.6 us)
    for tbm, tbn, tbk in tiles_to_try[1:]:
        tiles = cdiv(M, tbm) * cdiv(N, tbn)
        if fits_shape(tbm, tbn, M, N) and tiles <= num_sms:
            base = for_dtype(Config(tbm, tbn, tbk, 8, 4, 2, 1), dtype)
            split = _pick_split(tiles, cdiv(K, base.BLOCK_K), num_sms, 8)
            stages = _stages(tbm, tbn, base.BLOCK_K, elt, budget=192 * 1024)
            atomic.append(Config(tbm, tbn, base.BLOCK_K, 8, 4, stages, split, _reduction_for(tbm, tbn, split)))
            deep = _tf32_deep_k_point(tbm, tbn, tbk, split, dtype)
            if deep is not None:
                atomic.append(deep)
    for i, (tbm, tbn, tbk) in enumerate(tiles_to_try):
        if not fits_shape(tbm, tbn, M, N):
            continue
        base = for_dtype(Config(tbm, tbn, tbk, 8, 4, 2, 1), dtype)
        tiles = cdiv(M, tbm) * cdiv(N, tbn)
        stages = _stages(tbm, tbn, base.BLOCK_K, elt, budget=56 * 1024)
        for per_sm in (4, 8):
            split = _pick_split(tiles, cdiv(K, base.BLOCK_K), per_sm * num_sms, 4)
            for red in ("two_phase", "fixup"):
                if red == "fixup" and split * tbm * tbn * 4 > 512 * 1024:
                    continue  # one program would read megabytes of partials
                cfg = Config(tbm, tbn, base.BLOCK_K, 8, 4, stages, split, red)
                if cfg.smem_bytes(dtype) <= SMEM_PER_BLOCK_SM90 and cfg not in out:
                    out.append(cfg)
            if i == 0 and split > 1:
                atomic.append(Config(tbm, tbn, base.BLOCK_K, 8, 4, stages, split, "atomic"))
    merged: list[Config] = []
    for cfg in out[:1] + atomic + out[1:]:
        if cfg not in merged and cfg.smem_bytes(dtype) <= SMEM_PER_BLOCK_SM90:
            merged.append(cfg)
    return merged[:12]
