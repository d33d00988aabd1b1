"""The data-parallel schedule's knobs, its default config and its autotune search space,
and the config checks every tiled schedule shares (`TileConfig`, `check_block_config`,
`check_smem`, `for_dtype`, `fits_shape`). The schedule itself is kernels/dp_gemm.py.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, replace

import torch

from .common import SMEM_PER_BLOCK_SM90, cdiv, pipeline_smem_bytes


class TileConfig:
    """What every tiled GEMM schedule's Config shares: its knobs as a dict, and the shared
    memory of a software-pipelined main loop (a schedule that stages more overrides it)."""

    def smem_bytes(self, dtype: torch.dtype) -> int:
        return pipeline_smem_bytes(self.BLOCK_M, self.BLOCK_N, self.BLOCK_K, self.num_stages, dtype.itemsize)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Config(TileConfig):
    """Every knob of the data-parallel schedule."""

    BLOCK_M: int = 128  # output tile rows per program
    BLOCK_N: int = 128  # output tile columns per program
    BLOCK_K: int = 64  # K step of the main loop
    GROUP_M: int = 8  # row-tiles per group in the grouped tile order (1 = row-major order)
    num_warps: int = 4  # warps per program (8 for 128x256 tiles: two warpgroups)
    num_stages: int = 4  # software-pipeline depth (shared-memory buffers per operand)

    def __post_init__(self):
        check_block_config(self)

    def describe(self) -> str:
        return (f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K} g{self.GROUP_M} "
                f"w{self.num_warps} s{self.num_stages}")


def _pow2(x: int) -> bool:
    return isinstance(x, int) and x > 0 and (x & (x - 1)) == 0


def check_block_config(cfg) -> None:
    """Checks shared by every schedule's Config: tile sizes Triton's `tl.dot` accepts (powers
    of two, >= 16), a positive group size, warps and stages Triton supports."""
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        value = getattr(cfg, name)
        if not _pow2(value) or value < 16:
            raise ValueError(f"{name}={value!r}: must be a power of two >= 16 (tl.dot needs it)")
    if not isinstance(cfg.GROUP_M, int) or cfg.GROUP_M < 1:
        raise ValueError(f"GROUP_M={cfg.GROUP_M!r}: must be a positive integer")
    if cfg.num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps={cfg.num_warps!r}: must be 1, 2, 4, 8 or 16")
    if not isinstance(cfg.num_stages, int) or cfg.num_stages < 1:
        raise ValueError(f"num_stages={cfg.num_stages!r}: must be a positive integer")


def check_smem(cfg, dtype: torch.dtype, extra_bytes: int = 0) -> None:
    """Refuse a config whose pipeline buffers cannot fit one sm_90 block (it would fail to
    launch with 'out of resources' on the GPU)."""
    need = cfg.smem_bytes(dtype) + extra_bytes
    if need > SMEM_PER_BLOCK_SM90:
        raise ValueError(
            f"config {cfg.describe()} needs ~{need // 1024} KB of shared memory for {dtype}, "
            f"over the {SMEM_PER_BLOCK_SM90 // 1024} KB an sm_90 block can have: lower "
            f"num_stages or BLOCK_K")


def _next_pow2(x: int) -> int:
    return 1 << max(0, (x - 1).bit_length())


def fits_shape(block_m: int, block_n: int, M: int, N: int) -> bool:
    """A tile no larger than the problem rounded up to a power of two (at least 16): bigger
    tiles only compute padding."""
    return block_m <= max(16, _next_pow2(M)) and block_n <= max(16, _next_pow2(N))


def for_dtype(cfg: Config, dtype: torch.dtype):
    """Adapt a 16-bit config to fp32 (tf32) inputs: halve BLOCK_K so the shared-memory
    footprint stays the same, and give tiles of 128x128 elements or more 8 warps (sm_90
    compile check: a 64x256 fp32 tile on 4 warps spills registers). Works on any schedule's
    Config (dataclasses.replace keeps its other knobs)."""
    if dtype != torch.float32:
        return cfg
    warps = max(cfg.num_warps, 8) if cfg.BLOCK_M * cfg.BLOCK_N >= 128 * 128 else cfg.num_warps
    return replace(cfg, BLOCK_K=max(16, cfg.BLOCK_K // 2), num_warps=warps)


@functools.lru_cache(maxsize=512)  # pure in its arguments; saves host time per call
def default_config(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> Config:
    """A sane config without measuring.

    bf16/fp16 on sm_90 GPUs: 128x256x64 tiles with 8 warps and 3 stages is Triton's
    known-good large-GEMM point (2 warpgroups, 144 KB of pipeline buffers); it is used when it
    still yields at least one full wave of tiles. Otherwise 128x128x64, 4 warps, 4 stages
    (128 KB). Skinny problems get 64-row (M <= 64) or 64-column (N <= 64) tiles: a 128x128
    tile over N = 8 computes 94% padding. fp32 goes through `for_dtype`."""
    if M >= 128 and N >= 256 and cdiv(M, 128) * cdiv(N, 256) >= num_sms:
        cfg = Config(128, 256, 64, 8, num_warps=8, num_stages=3)
    elif M <= 64:
        cfg = Config(64, 128 if N >= 128 else 64, 64, 8, num_warps=4, num_stages=4)
    elif N <= 64:
        cfg = Config(128, 64, 64, 8, num_warps=4, num_stages=4)
    else:
        cfg = Config(128, 128, 64, 8, num_warps=4, num_stages=4)
    cfg = for_dtype(cfg, dtype)
    if K < cfg.BLOCK_K:
        # K shorter than one step runs only the peeled, masked step: a 64-deep masked tile
        # spilled 760 bytes of stack on 8192x8x8 (sm_90 compile check); cover K instead
        cfg = replace(cfg, BLOCK_K=max(16, _next_pow2(K)))
    return cfg


def search_space(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> list[Config]:
    """Autotune candidates for one shape (at most 12): the tile shapes Triton GEMMs win with
    on Hopper, pruned to those that fit the problem and the sm_90 shared-memory budget."""
    candidates = [
        Config(128, 256, 64, 8, num_warps=8, num_stages=3),
        Config(256, 128, 64, 8, num_warps=8, num_stages=3),
        Config(128, 256, 64, 8, num_warps=8, num_stages=4),
        Config(128, 128, 64, 8, num_warps=4, num_stages=4),
        Config(128, 128, 64, 8, num_warps=8, num_stages=4),
        Config(128, 128, 128, 8, num_warps=8, num_stages=3),
        Config(128, 64, 64, 8, num_warps=4, num_stages=4),
        Config(64, 128, 64, 8, num_warps=4, num_stages=4),
        Config(64, 64, 64, 8, num_warps=4, num_stages=4),
        Config(64, 256, 64, 8, num_warps=4, num_stages=4),
        Config(32, 64, 64, 8, num_warps=4, num_stages=5),
        Config(16, 64, 128, 4, num_warps=4, num_stages=5),
    ]
    out = []
    for cfg in (for_dtype(c, dtype) for c in candidates):
        if (fits_shape(cfg.BLOCK_M, cfg.BLOCK_N, M, N) and cfg.smem_bytes(dtype) <= SMEM_PER_BLOCK_SM90
                and cfg not in out):
            out.append(cfg)
    if not out:
        out.append(default_config(M, N, K, dtype, num_sms))
    return out[:12]
