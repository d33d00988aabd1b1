"""The persistent schedule's knobs, where TMA can read a shape and where staging pays, its
default config and its autotune search space. The schedule itself (the idea, the kernel, the
staging and copy-beside host steps, the launcher) is kernels/persistent_gemm.py; what the
choices measured: docs/schedules/persistent.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from .common import (
    SMEM_PER_BLOCK_SM90,
    cdiv,
    num_sms,
    pipeline_smem_bytes,
)
from .dp_configs import (
    TileConfig,
    check_block_config,
    fits_shape,
    for_dtype,
)

try:  # Triton >= 3.4
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: the pointer path still works
    TensorDescriptor = None


@dataclass(frozen=True)
class Config(TileConfig):
    """Every knob of the persistent schedule."""

    BLOCK_M: int = 128
    BLOCK_N: int = 256
    BLOCK_K: int = 64
    GROUP_M: int = 8
    num_warps: int = 8
    num_stages: int = 3
    PROGRAMS_PER_SM: int = 1  # grid = min(SMs x this, tiles)
    use_tma: bool = True  # tensor-descriptor (TMA) loads and stores instead of pointer loads
    EPILOGUE_SUBTILE: bool = False  # TMA only: store C as two BLOCK_N/2-wide halves
    FLATTEN: bool = True  # flatten tile and K loops for the software pipeliner
    # TMA only: copy operands TMA cannot read into 16-byte aligned buffers first, and compute
    # C in one when TMA cannot store into it (stage_for_tma), instead of raising ValueError
    staged: bool = False
    # TMA, fp32 with a row-major B (copied K-major first, tf32_layout): copy it in at most
    # `copy_chunks` column chunks, the first on the whole GPU, the others on a side stream by
    # `copy_sms` programs while the GEMM computes the chunks before on the other SMs
    # (copy_beside, copy_beside_chunks); 0: copy all of B first
    copy_sms: int = 0
    copy_chunks: int = 4

    def __post_init__(self):
        check_block_config(self)
        if self.PROGRAMS_PER_SM not in (1, 2, 3, 4):
            raise ValueError(f"PROGRAMS_PER_SM={self.PROGRAMS_PER_SM!r}: must be 1..4")
        if not isinstance(self.copy_sms, int) or not 0 <= self.copy_sms <= 32:
            raise ValueError(f"copy_sms={self.copy_sms!r}: must be an integer in 0..32")
        if self.copy_sms and not self.use_tma:
            raise ValueError("copy_sms overlaps TMA's K-major copy of B: it needs use_tma=True")
        if not isinstance(self.copy_chunks, int) or self.copy_chunks < 2:
            raise ValueError(f"copy_chunks={self.copy_chunks!r}: must be an integer >= 2")
        if self.EPILOGUE_SUBTILE and not self.use_tma:
            raise ValueError("EPILOGUE_SUBTILE splits the TMA store: it needs use_tma=True")
        check_staged(self)

    def smem_bytes(self, dtype: torch.dtype) -> int:
        """Pipeline buffers plus the epilogue's staging buffer for C: the TMA store's source
        tile, or the layout-conversion scratch of the pointer store. In a persistent loop the
        pipeline buffers stay live across tiles, so the two cannot share memory (sm_90 compile
        check: 128x256x32 fp32 with pointer stores took 272 KB = 144 KB + the full fp32 tile).
        Without FLATTEN the pointer store's scratch reuses the pipeline buffers (as in
        stream_k_gemm; sm_90 compile check, 256x128x32 fp32 at 3 stages: 128 KB)."""
        elt = dtype.itemsize
        pipe = pipeline_smem_bytes(self.BLOCK_M, self.BLOCK_N, self.BLOCK_K, self.num_stages, elt)
        if not (self.use_tma or self.FLATTEN):
            return pipe
        epilogue = self.BLOCK_M * self.BLOCK_N * elt // (2 if self.EPILOGUE_SUBTILE else 1)
        return pipe + epilogue

    def describe(self) -> str:
        # No string literals inside the f-string: this module is inlined into generated
        # variants through ast.unparse, which on Python 3.12+ would write them with the
        # f-string's own quotes, a syntax error on 3.11 (tests/test_generate.py checks).
        flags = (" tma" if self.use_tma else "") + (" subtile" if self.EPILOGUE_SUBTILE else "")
        flags += ("" if self.FLATTEN else " noflat") + (" staged" if self.staged else "")
        flags += f" copy{self.copy_sms}x{self.copy_chunks}" if self.copy_sms else ""
        return (f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K} g{self.GROUP_M} w{self.num_warps} "
                f"s{self.num_stages} pps{self.PROGRAMS_PER_SM}{flags}")


def _check_smem(cfg: Config, dtype: torch.dtype) -> None:
    need = cfg.smem_bytes(dtype)
    if need * cfg.PROGRAMS_PER_SM > 228 * 1024 or need > SMEM_PER_BLOCK_SM90:
        raise ValueError(
            f"config {cfg.describe()} needs ~{need // 1024} KB of shared memory per program for {dtype} "
            f"(x{cfg.PROGRAMS_PER_SM} programs per SM): over what an sm_90 SM has")


def _fits_sm(cfg: Config, dtype: torch.dtype) -> bool:
    try:
        _check_smem(cfg, dtype)
    except ValueError:
        return False
    return True


def tma_layout(t: torch.Tensor) -> str | None:
    """"row" or "col" when a 2-D tensor can be read through a TMA descriptor (16-byte aligned
    base and leading stride, unit stride in the other dimension), else None."""
    elt = t.element_size()
    if t.data_ptr() % 16:
        return None
    if t.stride(1) == 1 and (t.stride(0) * elt) % 16 == 0:
        return "row"
    if t.stride(0) == 1 and (t.stride(1) * elt) % 16 == 0:
        return "col"
    return None


def tma_shape_ok(M: int, N: int, K: int, dtype: torch.dtype) -> bool:
    """This Triton has tensor descriptors and contiguous inputs of this shape, in either
    layout, meet the TMA stride rule."""
    elt = dtype.itemsize
    return TensorDescriptor is not None and all((d * elt) % 16 == 0 for d in (M, N, K))


def check_staged(config) -> None:
    """`staged` (a knob of the TMA schedules) is a bool and needs use_tma."""
    if not isinstance(config.staged, bool):
        raise TypeError(f"staged={config.staged!r}: must be a bool")
    if config.staged and not config.use_tma:
        raise ValueError("staged copies operands for TMA: it needs use_tma=True")


# Ideal-time model of staging_pays: the device-to-device copy rate and a sustained 16-bit GEMM
# rate of sm_90 (docs/results.md ceilings: 4.27 TB/s, 680-800 TFLOP/s at 8192^3); fp32
# runs as tf32, at half the 16-bit tensor-core rate
_COPY_BYTES_PER_S = 4.2e12


_GEMM_FLOPS_PER_S = 6.5e14


def staging_pays(M: int, N: int, K: int, dtype: torch.dtype) -> bool:
    """Whether configs for this shape should be TMA configs with `staged` set, where the shape
    breaks tma_shape_ok: TMA descriptors exist, and copying the row-major operands whose rows
    are misaligned (A's K, or B's and C's N, times the element size not a multiple of 16
    bytes: read and write of A, of B, and of C once more) takes less than half the GEMM's
    ideal time, or nothing needs copying at all (only M misaligned). Big GEMMs with a
    misaligned K or N pass; a skinny memory-bound one with misaligned B rows does not (its
    copy would move as many bytes as the GEMM reads)."""
    if TensorDescriptor is None or tma_shape_ok(M, N, K, dtype):
        return False
    elt = dtype.itemsize
    copied = 0
    if (K * elt) % 16:
        copied += 2 * M * K * elt
    if (N * elt) % 16:
        copied += 2 * K * N * elt + 2 * M * N * elt
    return copied == 0 or _copies_pay(copied, M, N, K, dtype)


def _copies_pay(copied_bytes: int, M: int, N: int, K: int, dtype: torch.dtype) -> bool:
    """Staging's rule: the copies take less than half the GEMM's ideal time (and there are some)."""
    rate = _GEMM_FLOPS_PER_S / (2 if dtype == torch.float32 else 1)
    return 0 < copied_bytes / _COPY_BYTES_PER_S < 0.5 * 2.0 * M * N * K / rate


@functools.lru_cache(maxsize=512)  # pure in its arguments; saves host time per call
def default_config(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> Config:
    """128x256x64 tiles, 8 warps, 3 stages with TMA (Triton's known-good Hopper point: 144 KB
    of pipeline + 64 KB of C staging) when the problem has at least a wave of such tiles;
    otherwise 128x128x64, 4 warps, 4 stages. TMA whenever the shape allows it, or `staged`
    where staging_pays (see caveats); fp32 through dp_gemm's `for_dtype`."""
    staged = staging_pays(M, N, K, dtype)
    tma = tma_shape_ok(M, N, K, dtype) or staged
    small = for_dtype(Config(128, 128, 64, 8, num_warps=4, num_stages=4, use_tma=tma, staged=staged), dtype)
    if not (M >= 128 and N >= 256 and cdiv(M, 128) * cdiv(N, 256) >= num_sms):
        return small
    cfg = for_dtype(Config(128, 256, 64, 8, num_warps=8, num_stages=3, use_tma=tma, staged=staged), dtype)
    if not _fits_sm(cfg, dtype) and tma:  # fp32: a 128x256 fp32 C tile is 128 KB; store it in halves
        cfg = replace(cfg, EPILOGUE_SUBTILE=True)
    if not _fits_sm(cfg, dtype):
        return small
    return with_copy_beside(cfg, dtype, num_sms)


# copy_beside's default: 4 copy programs (4 of 132 SMs on sm_90), at most 6 chunks; on
# 4096x4096x8192 and 8192^3 fp32 this beat copying B first by 4.3% and 2.4% (sm_90,
# experiments/results/probe_configs/), and
# where no chunk plan hides anything it is one chunk, the copy-first path.
COPY_BESIDE_SMS, COPY_BESIDE_CHUNKS = 4, 6


def with_copy_beside(cfg: Config, dtype: torch.dtype, num_sms: int) -> Config:
    """`cfg` with copy_beside's default knobs where they can apply: fp32, TMA, not staged, and
    a GPU of at least 64 SMs (so that the copy's SMs are a small share)."""
    if dtype != torch.float32 or not cfg.use_tma or cfg.staged or num_sms < 64:
        return cfg
    return replace(cfg, copy_sms=COPY_BESIDE_SMS, copy_chunks=COPY_BESIDE_CHUNKS)


def search_space(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> list[Config]:
    """At most 12 candidates around the Hopper sweet spot: 128x256 / 256x128 tiles with 8
    warps and 3-4 stages (4 only with a subtiled epilogue, to fit 227 KB), 128x128 tiles, a
    64x128 tile with two programs per SM, and pointer-load twins of the two main points, all
    pruned by the shape (tile no larger than the problem, TMA only when strides allow it or,
    `staged`, when staging_pays)."""
    staged = staging_pays(M, N, K, dtype)
    tma = tma_shape_ok(M, N, K, dtype) or staged
    candidates = [
        Config(128, 256, 64, 8, 8, 3, 1, tma, False, True, staged),
        Config(128, 256, 64, 8, 8, 4, 1, tma, tma, True, staged),
        Config(128, 256, 64, 8, 8, 3, 1, tma, tma, True, staged),
        Config(256, 128, 64, 8, 8, 3, 1, tma, False, True, staged),
        Config(128, 256, 64, 8, 8, 3, 1, tma, False, False, staged),
        Config(128, 128, 64, 8, 4, 4, 1, tma, False, True, staged),
        Config(128, 128, 64, 8, 8, 4, 1, tma, False, True, staged),
        Config(128, 128, 128, 8, 8, 3, 1, tma, tma, True, staged),
        Config(64, 128, 64, 8, 4, 4, 2, tma, False, True, staged),
        Config(128, 256, 64, 8, 8, 3, 1, False, False, True),
        Config(128, 128, 64, 8, 4, 4, 1, False, False, True),
        Config(64, 64, 64, 8, 4, 4, 2, False, False, True),
    ]
    if dtype == torch.float32 and min(M, N) > 512:
        # fp32 with a row-major B: pointer loads swap the operands (tf32_layout; the tile
        # becomes 128x256, B^T through registers, no copy of B) where the TMA configs copy B
        # K-major first. sm_90 (experiments/probes/balanced_tf32_swap.json, 3 rounds):
        # 835.7 against 857.3 us on 4096x4096x8192, but 3437 against 3292 on 8192^3; in the
        # bench run that followed level on 4096x4096x8192 (871.8
        # against 865.8). Stream-K's tail winners on fp32 are this tile (tf32_swap_points).
        candidates.insert(0, Config(256, 128, 64, 8, 8, 3, 1, False, False, False))
        # and the TMA winner with its copy of B hidden behind the GEMM (copy_beside), at two
        # chunk caps: 4 won 4096x4096x8192 and 6 won 8192^3 (probe above)
        candidates[1:1] = [Config(128, 256, 64, 8, 8, 3, 1, tma, True, True, staged, copy_sms=COPY_BESIDE_SMS,
                                  copy_chunks=n) for n in (4, 6) if tma and not staged and num_sms >= 64]
    out: list[Config] = []
    for cfg in (for_dtype(c, dtype) for c in candidates):
        if fits_shape(cfg.BLOCK_M, cfg.BLOCK_N, M, N) and _fits_sm(cfg, dtype) and cfg not in out:
            out.append(cfg)
    if not out:
        out.append(default_config(M, N, K, dtype, num_sms))
    return out[:12]
