"""The grouped schedule's knobs, its autotune search space and its default config.

The schedule itself (the idea, the kernel, the plan and launcher) is kernels/grouped_gemm.py;
this module is what the host chooses before a launch. What the candidates measured:
docs/schedules/grouped.md.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

import torch

from .common import cdiv
from .common import num_sms as _num_sms

ALIGN_BYTES = 16
SMEM_LIMIT_BYTES = 227 * 1024  # per block (opt-in maximum on sm_90)
SMEM_PER_SM_BYTES = 228 * 1024  # per SM, shared by its resident blocks

# --------------------------------------------------------------------------------------
# Knobs
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Every knob of the grouped schedule."""

    block_m: int = 128  # tile rows
    block_n: int = 128  # tile columns
    block_k: int = 64  # k-step; block_k * element size >= 32 bytes
    num_warps: int = 4  # warps per program
    num_stages: int = 3  # software-pipeline depth of the k loop (cp.async ring)
    use_tma: bool = False  # device-side TMA descriptors per tile instead of pointer loads
    lpt_order: bool = True  # schedule tiles by decreasing K (else group order)
    programs_per_sm: int = 2  # resident programs per SM (grid = this x #SMs): one's loads
    # and epilogue overlap another's MMAs, which matters when each tile has only a few k-steps
    stage: bool = False  # copy A_i and B_i into zero-padded, 16-byte aligned row-major buffers
    # first (one extra launch a call), so groups with odd K or N get cp.async/TMA loads

    def validate(self, dtype: torch.dtype | None = None) -> None:
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if v < 16 or v & (v - 1) or v > 256:
                raise ValueError(f"{name}={v} must be a power of two in 16..256")
        if self.num_warps not in (1, 2, 4, 8):
            raise ValueError("num_warps must be 1, 2, 4 or 8")
        if self.num_stages < 1:
            raise ValueError("num_stages must be >= 1")
        if self.programs_per_sm not in (1, 2, 3, 4):
            raise ValueError("programs_per_sm must be 1..4")
        if dtype is not None and self.stage and dtype == torch.float32:
            raise ValueError("stage is for 16-bit groups (fp32 rows need only 4 elements for 16 bytes)")
        if dtype is not None:
            elt = dtype.itemsize
            if self.block_k * elt < 32:
                raise ValueError(f"block_k={self.block_k} too small for {dtype} (needs >= 32 bytes)")
            if self.smem_bytes(dtype) > SMEM_LIMIT_BYTES:
                raise ValueError(f"config needs ~{self.smem_bytes(dtype)} B of shared memory")
            per_sm = self.programs_per_sm * (self.smem_bytes(dtype) + 1024)  # + per-block reserve
            if per_sm > SMEM_PER_SM_BYTES:
                raise ValueError(f"{self.programs_per_sm} programs per SM need ~{per_sm} B of shared "
                                 f"memory, over the SM's {SMEM_PER_SM_BYTES}")

    def smem_bytes(self, dtype: torch.dtype) -> int:
        """Operand ring (num_stages tiles of A and B) or, if larger, the epilogue's layout-
        conversion scratch (the compiler reuses the ring for it), plus barriers. Checked to
        be >= the compiler's number for every search-space entry (`--compile-sm90`)."""
        elt = dtype.itemsize
        ring = self.num_stages * (self.block_m + self.block_n) * self.block_k * elt
        return max(ring, self.block_m * self.block_n * elt // 2) + 1024

    def describe(self) -> str:  # the name tools/sm90_compile_check.py prints
        return self.label()

    def label(self) -> str:
        flags = [name for name, on in (("_tma", self.use_tma), ("_grouporder", not self.lpt_order),
                                       ("_staged", self.stage)) if on]
        return "".join([f"{self.block_m}x{self.block_n}x{self.block_k}_w{self.num_warps}_s{self.num_stages}"
                        f"_p{self.programs_per_sm}", *flags])


# --------------------------------------------------------------------------------------
# Search space
# --------------------------------------------------------------------------------------

# Candidates, best guess first for the 64 x (128..512) mix (about 500 tiles of 128x128, a
# few k-steps each). Every entry compiles for sm_90 in every layout/alignment variant and
# fits its programs_per_sm in the SM's shared memory (`--compile-sm90` prints the numbers).
_C16 = [
    Config(128, 128, 64, 4, 3, programs_per_sm=2),  # 96 KiB ring: two programs per SM
    Config(128, 128, 64, 4, 3, programs_per_sm=1),  # one program: measures the overlap
    Config(128, 128, 64, 8, 3, programs_per_sm=1),  # two warp groups share the tile
    Config(64, 128, 64, 4, 3, programs_per_sm=2),  # twice the tiles: balance over latency
    Config(128, 64, 64, 4, 3, programs_per_sm=2),
    Config(64, 64, 64, 4, 4, programs_per_sm=3),  # many small tiles, three per SM
    Config(128, 128, 32, 4, 4, programs_per_sm=2),  # shorter k-steps, deeper ring
    Config(128, 256, 64, 8, 3, programs_per_sm=1),  # for groups of larger members
    Config(128, 128, 64, 4, 3, programs_per_sm=2, lpt_order=False),  # what LPT order buys
    Config(128, 128, 64, 4, 3, programs_per_sm=2, use_tma=True),  # TMA vs cp.async
    Config(64, 128, 64, 4, 3, programs_per_sm=2, use_tma=True),
    Config(64, 64, 64, 4, 4, programs_per_sm=3, use_tma=True),
]
_C32 = [
    Config(128, 128, 32, 4, 3, programs_per_sm=2),
    Config(128, 128, 32, 4, 3, programs_per_sm=1),
    Config(128, 128, 32, 8, 3, programs_per_sm=1),
    Config(64, 128, 32, 4, 3, programs_per_sm=2),
    Config(128, 64, 32, 4, 3, programs_per_sm=2),
    Config(64, 64, 32, 4, 4, programs_per_sm=3),
    Config(64, 64, 16, 4, 4, programs_per_sm=3),
    Config(128, 128, 32, 4, 3, programs_per_sm=2, lpt_order=False),
    Config(128, 128, 32, 4, 3, programs_per_sm=2, use_tma=True),
    Config(64, 64, 32, 4, 4, programs_per_sm=3, use_tma=True),
]


# staged (odd-size) 16-bit groups: the configs that led on sm_90, in order (see search_space)
_STAGED_LEADERS = [
    Config(64, 128, 64, 4, 3, programs_per_sm=2),
    Config(128, 128, 64, 8, 3, programs_per_sm=1),
    Config(128, 64, 64, 4, 3, programs_per_sm=2),
]


def search_space(sizes: Sequence[tuple[int, int, int]], dtype: torch.dtype = torch.bfloat16,
                 num_sms: int | None = None, *, tma_ok: bool = True) -> list[Config]:
    """At most 12 configs for this group, best guess first. Tiles wider than twice the
    group's largest dimension are dropped; so are TMA configs on operands unless `tma_ok`
    (the caller knows every operand is row-major and 16-byte aligned; `prepare` re-checks).
    By default TMA is assumed possible when every K and N is a multiple of 16 bytes' worth
    of elements (the bench's aligned groups, and what `prepare` requires for use_tma).

    A 16-bit group with an odd K or N (sizes read off a trace: 237x432x261) would load its
    operands 2 bytes at a time, synchronously; its candidates are then mostly staged ones
    (`stage`: one copy into padded, aligned buffers, then cp.async or TMA loads), best guess
    first, with the unstaged best guess kept for comparison."""
    sizes = [tuple(int(x) for x in s) for s in sizes]
    elt = dtype.itemsize
    per = ALIGN_BYTES // elt
    aligned = all(N % per == 0 and K % per == 0 for M, N, K in sizes)
    tma_ok = tma_ok and aligned
    max_m = max(s[0] for s in sizes)
    max_n = max(s[1] for s in sizes)
    out = []
    for c in (_C32 if dtype == torch.float32 else _C16):
        if c.use_tma and not tma_ok:
            continue
        if c.block_m > 2 * max(max_m, 32) or c.block_n > 2 * max(max_n, 32):
            continue
        c.validate(dtype)
        out.append(c)
    if not out:
        out = [(_C32 if dtype == torch.float32 else _C16)[4]]
    # best guess first: the first (largest-tile) pointer-load config that still gives every
    # program it launches at least one tile
    sms = num_sms or _num_sms()
    tiles = {c: sum(cdiv(M, c.block_m) * cdiv(N, c.block_n) for M, N, _ in sizes) for c in out}
    enough = [c for c in out if not c.use_tma and c.lpt_order and tiles[c] >= c.programs_per_sm * sms]
    if enough:
        out.remove(enough[0])
        out.insert(0, enough[0])
    else:  # small group: the config with the most tiles goes first
        best = max(out, key=lambda c: (tiles[c], not c.use_tma))
        out.remove(best)
        out.insert(0, best)
    if aligned or dtype == torch.float32:
        return out[:12]
    # odd sizes: staged pointer configs, the measured leaders first, then two staged TMA ones
    # (the slots are aligned row-major), then the unstaged best guess and the next one. On
    # sm_90 (experiments/probe_grouped_staged_configs.py: the example trace's 64 GEMMs and
    # two seeded draws of 64 odd sizes in 128..512) 64x128 with two programs per SM, 128x128
    # with 8 warps and 128x64 were the three fastest on every group, 1.21-1.31x the staged
    # 128x128 with 4 warps, and the staged TMA 128x128 0.63-0.66x it.
    staged = [replace(c, stage=True) for c in out if not c.use_tma][:8]
    staged.sort(key=lambda c: _STAGED_LEADERS.index(replace(c, stage=False))
                if replace(c, stage=False) in _STAGED_LEADERS else len(_STAGED_LEADERS))
    staged_tma = [replace(c, stage=True) for c in _C16 if c.use_tma and c.block_m <= 2 * max(max_m, 32)
                  and c.block_n <= 2 * max(max_n, 32)]
    staged_tma.sort(key=lambda c: c.block_m)  # the 64-row TMA tiles ran 1.17-1.23x, the 128-row ones 0.63-0.66x
    return (staged[:3] + staged_tma[:1] + staged[3:] + staged_tma[1:2] + out[:2])[:12]


def default_config(sizes: Sequence[tuple[int, int, int]], dtype: torch.dtype = torch.bfloat16,
                   num_sms: int | None = None) -> Config:
    return search_space(sizes, dtype, num_sms)[0]
