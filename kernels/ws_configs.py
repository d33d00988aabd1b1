"""The warp-specialized schedule's knobs, its default config (the first candidate) and its
autotune search space. The schedule itself is kernels/ws_gemm.py; what the candidates
measured: docs/schedules/ws.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .common import cdiv
from .common import num_sms as _num_sms


# sm_90 allow at most 227 KiB of dynamic shared memory per block.
SMEM_LIMIT_BYTES = 227 * 1024


# What we budget per config: operand ring + epilogue staging + ~1 KiB of mbarriers and
# alignment slack, so that the estimate stays conservative against the compiler's number.
SMEM_SLACK_BYTES = 1024


TMA_ALIGN_BYTES = 16


@dataclass(frozen=True)
class Config:
    """Every knob of the schedule. The defaults are the 8192^3 bf16 flagship (see
    `search_space` for why)."""

    block_m: int = 128  # output tile rows; WS splits them over two consumer warp groups
    block_n: int = 256  # output tile columns; <= 256 (TMA box and wgmma N limit)
    block_k: int = 64  # k-step; block_k * element size >= 32 bytes (one wgmma k-chunk)
    group_m: int = 8  # tile rows walked together (grouped order, L2 reuse)
    num_warps: int = 4  # warps before WS adds its groups; Hopper WS needs exactly 4
    num_stages: int = 4  # depth of the shared-memory ring for the A/B tiles
    warp_specialize: bool = True  # producer/consumer warp groups on the tile loop
    flatten: bool = False  # fuse tile and k loops (prefetch next tile during the epilogue)
    epilogue_subtile: int = 1  # TMA store of C in 1, 2 or 4 column slices (less staging smem)
    host_descriptors: bool = False  # TensorDescriptor on the host vs tl.make_tensor_descriptor (WS needs False)
    tma_store: bool = False  # C through TMA (smem staging) vs masked pointer stores

    def validate(self, dtype: torch.dtype | None = None) -> None:
        """Raise ValueError for combinations that do not compile with Triton 3.6 on sm_90, or
        that would silently run something other than what they say. Every rule below was
        found by compiling for sm_90 (`compile_for_sm90`), not guessed."""
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1) or v > 256:
                raise ValueError(f"{name}={v} must be a power of two in 16..256 (TMA box limit)")
        if self.epilogue_subtile not in (1, 2, 4) or self.block_n // self.epilogue_subtile < 8:
            raise ValueError(f"epilogue_subtile={self.epilogue_subtile} must be 1, 2 or 4 and leave >= 8 columns")
        if self.epilogue_subtile != 1 and not self.tma_store:
            raise ValueError("epilogue_subtile only applies to the TMA store (tma_store=True)")
        if self.group_m < 1:
            raise ValueError("group_m must be >= 1")
        if self.num_warps not in (4, 8):
            raise ValueError("num_warps must be 4 or 8 (one or two wgmma warp groups)")
        if self.num_stages < 1:
            raise ValueError("num_stages must be >= 1")
        if self.warp_specialize:
            if self.num_warps != 4:
                raise ValueError("Hopper WS (Triton 3.6) only engages with num_warps=4; with 8 the "
                                 "compiler silently drops the request")
            if self.num_stages < 2:
                raise ValueError("warp_specialize needs num_stages >= 2 (the ring the producer fills)")
            if self.flatten:
                raise ValueError("flatten=True adds runtime branches that make the Hopper pass drop WS")
            if self.block_m < 128:
                raise ValueError("WS splits block_m over two consumer warp groups: needs block_m >= 128")
            if self.host_descriptors:
                raise ValueError("WS with host-side TensorDescriptors hung on sm_90 (Triton 3.6: every "
                                 "such config timed out in compile-and-run, while the same configs with "
                                 "device-side descriptors ran; docs/schedules/ws.md); use host_descriptors=False")
            if self.tma_store and (self.host_descriptors or self.epilogue_subtile != 1):
                raise ValueError("with WS the TMA store only compiles with device-side descriptors and "
                                 "epilogue_subtile=1 (the pass halves the store but not a host descriptor)")
        if dtype is not None:
            elt = dtype.itemsize
            if self.block_k * elt < 32:
                raise ValueError(f"block_k={self.block_k} too small for {dtype} (needs >= 32 bytes)")
            if self.warp_specialize and dtype == torch.float32:
                raise ValueError("WS with tf32 operands does not compile for row-major B in Triton 3.6")
            need = self.smem_bytes(dtype)
            if need > SMEM_LIMIT_BYTES:
                raise ValueError(f"config needs ~{need} B of shared memory, over {SMEM_LIMIT_BYTES}")

    def smem_bytes(self, dtype: torch.dtype) -> int:
        """Shared-memory estimate: operand ring + C staging + barriers. Checked against the
        compiler's own number for every search-space entry (it is never below it there)."""
        elt = dtype.itemsize
        ring = self.num_stages * (self.block_m + self.block_n) * self.block_k * elt
        if self.tma_store:  # the TMA store reads C from a shared-memory copy of the slice
            staging = self.block_m * (self.block_n // self.epilogue_subtile) * elt
        else:  # pointer stores still convert the wgmma layout through shared scratch
            staging = self.block_m * self.block_n * elt // 2
        return ring + staging + SMEM_SLACK_BYTES

    def describe(self) -> str:  # the name tools/sm90_compile_check.py prints
        return self.label()

    def label(self) -> str:
        flags = [name for name, on in (("_ws", self.warp_specialize), ("_flat", self.flatten)) if on]
        store = f"tma{self.epilogue_subtile}" if self.tma_store else "ptrstore"
        where = "host" if self.host_descriptors else "dev"
        return "".join([f"{self.block_m}x{self.block_n}x{self.block_k}_g{self.group_m}_w{self.num_warps}"
                        f"_s{self.num_stages}", *flags, f"_{store}_{where}"])


def default_config(M: int, N: int, K: int, dtype: torch.dtype = torch.bfloat16,
                   num_sms: int | None = None) -> Config:
    """One good config without autotuning: the first entry of `search_space`."""
    return _first_candidate(M, N, K, dtype, num_sms or _num_sms())


@functools.lru_cache(maxsize=512)  # pure in its arguments; saves host time per call
def _first_candidate(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> Config:
    return search_space(M, N, K, dtype, num_sms)[0]


# Candidates, best guess first. Every entry compiles for sm_90 with Triton 3.6 in all four
# operand layouts (checked by `python -m kernels.ws_gemm --compile-sm90`, which also prints
# the compiler's shared-memory footprint and whether WS engaged: 12 warps).
_C16 = [
    # 1. Flagship: 128x256 tile, WS (producer + two 64x256 wgmma consumers), 4-deep ring
    #    (192 KiB) and a pointer-store epilogue, which needs no C staging tile: 229,608 B of
    #    shared memory, the only way a 4-deep 128x256 WS ring fits under 227 KiB. Device-side
    #    descriptors: every WS config with host descriptors hung on sm_90.
    Config(128, 256, 64, 8, 4, 4, warp_specialize=True),
    # 2. WS with a TMA-store epilogue: only compiles with device descriptors and C in one
    #    piece, so the ring drops to 3 stages (213,464 B).
    Config(128, 256, 64, 8, 4, 3, warp_specialize=True, host_descriptors=False, tma_store=True),
    # 3. 256x128 WS: each consumer owns a 128x128 half (same smem as 1, other wgmma shape).
    Config(256, 128, 64, 8, 4, 4, warp_specialize=True),
    # 4. 128x256x128 WS, 2 stages: the same ring bytes as 1 in half as many k-steps (half
    #    the producer/consumer barrier round trips), at the price of double buffering.
    Config(128, 256, 128, 8, 4, 2, warp_specialize=True),
    # 5. Flagship with a taller tile group (more A reuse per wave of 132 tiles).
    Config(128, 256, 64, 16, 4, 4, warp_specialize=True),
    # 6. Non-WS twin: two cooperating wgmma warp groups, software pipelined, TMA store in
    #    halves (229,408 B). DESIGN.md measured this family at 548 TFLOP/s on 8192^3.
    Config(128, 256, 64, 8, 8, 4, warp_specialize=False, host_descriptors=True, epilogue_subtile=2, tma_store=True),
    # 7. Non-WS with flatten: the pipeliner fetches the next tile's first k-steps while the
    #    epilogue of this one runs (quarters: 213,024 B).
    Config(128, 256, 64, 8, 8, 4, warp_specialize=False, host_descriptors=True, flatten=True, epilogue_subtile=4, tma_store=True),
    # (A 128x128 WS config with 5 stages was dropped: on sm_90, it left output
    # elements unwritten (NaN under the poisoned-output check) on all seven shapes tried. So
    # did 128x64 WS with 6 or 8 stages and 128x128 WS with 6; with 4 stages they
    # were right but slower than the non-WS twins: experiments/results/probe_configs/README.md.)
    # 8. 128x128 non-WS, flatten, two warp groups.
    Config(128, 128, 64, 8, 8, 4, warp_specialize=False, host_descriptors=True, flatten=True, tma_store=True),
    # 9./10. Small problems: tiles that still give most SMs work.
    Config(64, 128, 64, 8, 4, 4, warp_specialize=False, host_descriptors=True, tma_store=True),
    Config(64, 64, 64, 8, 4, 4, warp_specialize=False, host_descriptors=True, tma_store=True),
]


# tf32: WS does not compile for row-major B, so these are the pipelined TMA variants.
_C32 = [
    Config(128, 128, 32, 8, 8, 4, warp_specialize=False, host_descriptors=True, tma_store=True),
    Config(128, 128, 32, 8, 8, 4, warp_specialize=False, host_descriptors=True, flatten=True, tma_store=True),
    Config(128, 256, 32, 8, 8, 3, warp_specialize=False, host_descriptors=True, epilogue_subtile=2, tma_store=True),
    Config(128, 64, 32, 8, 4, 4, warp_specialize=False, host_descriptors=True, tma_store=True),
    Config(64, 128, 32, 8, 4, 4, warp_specialize=False, host_descriptors=True, tma_store=True),
    Config(64, 64, 32, 8, 4, 3, warp_specialize=False, host_descriptors=True, tma_store=True),
]


def search_space(M: int, N: int, K: int, dtype: torch.dtype = torch.bfloat16,
                 num_sms: int | None = None) -> list[Config]:
    """At most 12 configs for this shape, best guess first (see the comments on `_C16`).
    Pruning: a tile more than twice the problem in a dimension is mostly padding, and a
    tile larger than 128x128 must still give at least half the SMs (`num_sms`, default:
    this device's) a tile."""
    cands = _C32 if dtype == torch.float32 else _C16
    sms = num_sms or _num_sms()

    def useful(c: Config) -> bool:
        if c.block_m > 2 * max(M, 64) or c.block_n > 2 * max(N, 64):
            return False
        tiles = cdiv(M, c.block_m) * cdiv(N, c.block_n)
        return c.block_m * c.block_n <= 128 * 128 or tiles >= sms // 2

    picked = [c for c in cands if useful(c)] or cands[-1:]
    for c in picked:
        c.validate(dtype)
    return picked[:12]
