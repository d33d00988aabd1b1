"""fp32 (tf32) GEMMs whose operands are strided in K: registers, a swap, or a K-major copy.

What
    Hopper's wgmma reads tf32 operands from shared memory only K-major: the instruction's
    transpose bits exist for 16-bit types alone. A row-major B (K, N) has N contiguous, so
    Triton 3.6 fills B's shared-memory tiles K-major itself. With pointer loads it issues
    4-byte cp.async copies in a transposing pattern (32 a thread for a 32x256 fp32 stage,
    against 8 sixteen-byte ones for a K-major B); after a TMA load it runs a shared ->
    register -> shared round trip of every B tile inside the K loop (seen in the sm_90
    compile check). Either way the MMA starves. The same holds for an A whose M is contiguous
    (a transposed view).

    Two remedies, both decided from the operands' layout alone:
    - Registers (dp and split-K, and the pointer-load configs of Stream-K and persistent).
      An A whose M is contiguous is fed to the MMA from registers (`a_through_registers`,
      dp_gemm.mac_loop's A_REGS): it reaches shared memory with 16-byte copies in its own
      layout and is read out in the MMA's. A strided B is swapped into A's place: C^T = B^T A^T (`swap_operands`; the
      config's tile is transposed with it, `transposed_tile`), so A^T, K-major, is the
      kernel's B. No copy, no extra traffic.
    - Copy (the TMA configs of persistent and Stream-K, and warp-specialized).
      `tf32_operands(a, b)` copies the operand into K-major storage (rows padded to 16 bytes
      for TMA) with `k_major_copy` when the copy costs less than the time it saves
      (`copy_pays`), and returns views with the original shapes and values. Persistent's
      `copy_sms` configs copy a row-major B chunk by chunk beside the GEMM instead
      (persistent_gemm.copy_beside, through `copy_into` with a few programs). A swap was
      tried for the persistent TMA path too (B^T loaded by TMA, then read out into
      registers; C^T stored through a descriptor over C, each tile transposed): correct,
      but a quarter slower than copying B (docs/layouts.md), so it was dropped.
    Every schedule's `matmul` calls tf32_operands first; bf16/fp16 inputs and K-major fp32
    ones pass through untouched.

When it pays
    fp32 GEMMs with a row-major B; torch.matmul runs them with tf32. Fixing the layout made
    such GEMMs several times faster, level with torch.matmul. The copy still costs more than
    it saves where the GEMM does little work per element of B (a skinny 64x4096x14336). The
    swap beat the copy on every shape measured, so dp and split-K never copy a B they can
    swap. The numbers: docs/layouts.md.

Caveats
    - The copy is a new tensor on every call, as large as the operand: a weight that never
      changes is copied again each time. Keep a K-major copy of it instead (made once, e.g.
      `b_km = b.t().contiguous().t()`) and pass that: nothing is copied then.
    - Where both operands are strided in K (a transposed A beside a row-major B) the swap
      gains nothing: dp and split-K then feed A through registers and copy B where it pays.
    - `ADVISOR_TF32_KMAJOR=0` turns all of this off (the 4-byte path), `=1` copies every
      strided-K fp32 operand, `=2` never copies (registers and swaps only); anything else
      (the default) follows the rules above.

Source of the idea
    CUTLASS's Hopper tf32 GEMMs accept only K-major ("TN") operands for the same reason
    (the PTX ISA's wgmma section: "matrices A and B must be K-major" for .tf32); cuBLAS
    reorders or transposes internally.
"""

from __future__ import annotations

import os
from dataclasses import replace

import torch
import triton
import triton.language as tl

from .common import aligned_empty, cdiv, needs_int64_offsets
from .runtime import launch

# Rates of the rule (sm_90, experiments/results/probe_tf32_layout/): the relayout
# kernel's copy rate (bytes read + written per second: 3.76-4.08 TB/s on 46-268 MB, where
# torch's transposing copy_ moved 1.05-1.16) and our schedules' sustained tf32 rate on a
# K-major B (300-350 TFLOP/s on the tail and balanced shapes).
_COPY_BYTES_PER_S = 4.0e12
_TF32_FLOPS_PER_S = 3.3e14
# A strided-K operand costs the GEMM ~3-4x its K-major time where the MMA is the limit and
# ~2-3x where the bytes are, so a copy that takes up to twice the ideal GEMM time still wins.
# Measured break-even: copy / ideal = 1.3 paid (256x256x131072), 2.6 about broke even
# (128x8192x8192), 5.1 lost (64x4096x14336).
_PAYS_UP_TO = 2.0


@triton.jit
def _block(blk, blocks_r, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr):
    """Row and column indices of block `blk`, blocks numbered down the rows first (blocks_r
    of them a column of blocks)."""
    r = (blk % blocks_r) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = (blk // blocks_r) * BLOCK_C + tl.arange(0, BLOCK_C)
    if INT64:
        r = r.to(tl.int64)
        c = c.to(tl.int64)
    return r, c


@triton.jit
def _inside(r, c, R, C):
    """The in-bounds mask of the block at rows r, columns c of an (R, C) tensor."""
    return (r < R)[:, None] & (c < C)[None, :]


@triton.jit
def _relayout_kernel(src, dst, R, C, s_r, s_c, d_r, d_c,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr):
    """dst[r, c] = src[r, c] over the (R, C) blocks, program p taking blocks p, p + grid, ...
    (a grid of one program per block, or a few programs that leave the other SMs to a GEMM);
    the two tensors' strides differ, so Triton loads along src's contiguous dimension, stores
    along dst's and converts the tile's layout in shared memory between the two."""
    blocks_r = tl.cdiv(R, BLOCK_R)
    for blk in tl.range(tl.program_id(0), blocks_r * tl.cdiv(C, BLOCK_C), tl.num_programs(0)):
        r, c = _block(blk, blocks_r, BLOCK_R, BLOCK_C, INT64)
        mask = _inside(r, c, R, C)
        x = tl.load(src + (r[:, None] * s_r + c[None, :] * s_c), mask=mask)
        tl.store(dst + (r[:, None] * d_r + c[None, :] * d_c), x, mask=mask)


def k_major(x: torch.Tensor, k_dim: int) -> bool:
    """Whether dimension `k_dim` of the 2-D `x` is contiguous (or has one element)."""
    return x.stride(k_dim) == 1 or x.shape[k_dim] == 1


def k_major_empty(R: int, C: int, k_dim: int, dtype: torch.dtype, device) -> torch.Tensor:
    """An uninitialised (R, C) tensor stored with dimension `k_dim` contiguous and the other
    dimension's stride padded to 16 bytes (what k_major_copy returns)."""
    if k_dim == 1:  # (R, C) row-major
        return aligned_empty(R, C, dtype, device)
    return aligned_empty(C, R, dtype, device).t()  # column-major: the transpose of a row-major (C, R)


@triton.jit
def _relayout_beside_kernel(src, dst, R, C, s_r, s_c, d_r, d_c,
                            BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr):
    """_relayout_kernel for a few programs beside a GEMM (grid <= blocks): the next block's
    load is issued before the current block's store, so each program keeps a load and a store
    in flight: about 1.5x the plain loop's rate a program, with 64x128 blocks on 8 warps
    (128x128 blocks were slower; docs/schedules/persistent.md)."""
    blocks_r = tl.cdiv(R, BLOCK_R)
    blocks = blocks_r * tl.cdiv(C, BLOCK_C)
    r, c = _block(tl.program_id(0), blocks_r, BLOCK_R, BLOCK_C, INT64)
    x = tl.load(src + (r[:, None] * s_r + c[None, :] * s_c), mask=_inside(r, c, R, C))
    for nxt in range(tl.program_id(0) + tl.num_programs(0), blocks, tl.num_programs(0)):
        r2, c2 = _block(nxt, blocks_r, BLOCK_R, BLOCK_C, INT64)
        y = tl.load(src + (r2[:, None] * s_r + c2[None, :] * s_c), mask=_inside(r2, c2, R, C))
        tl.store(dst + (r[:, None] * d_r + c[None, :] * d_c), x, mask=_inside(r, c, R, C))
        x, r, c = y, r2, c2
    tl.store(dst + (r[:, None] * d_r + c[None, :] * d_c), x, mask=_inside(r, c, R, C))


def copy_into(x: torch.Tensor, out: torch.Tensor, programs: int | None = None) -> torch.Tensor:
    """out[...] = x for two 2-D tensors of one shape and any strides. With the whole GPU
    (programs=None): 64x64 blocks, one program a block. Beside a GEMM (`programs` programs, each
    looping over its share): 64x128 blocks with the next load in flight during each store; a
    program's 32 KB of layout-conversion scratch does not fit beside a 128x256 persistent GEMM
    program (208 KB for fp32), so the block scheduler cannot put the two on one SM. Returns out."""
    R, C = x.shape
    if x.numel() == 0:
        return out
    int64 = needs_int64_offsets(x, out)
    args = (x, out, R, C, x.stride(0), x.stride(1), out.stride(0), out.stride(1))
    if programs is None:
        launch(_relayout_kernel, (cdiv(R, 64) * cdiv(C, 64),), *args,
               BLOCK_R=64, BLOCK_C=64, INT64=int64, num_warps=4)
    else:
        blocks = cdiv(R, 64) * cdiv(C, 128)
        launch(_relayout_beside_kernel, (max(1, min(programs, blocks)),), *args,
               BLOCK_R=64, BLOCK_C=128, INT64=int64, num_warps=8)
    return out


def k_major_copy(x: torch.Tensor, k_dim: int) -> torch.Tensor:
    """A copy of the 2-D `x` (same shape, values, dtype, device) stored with dimension `k_dim`
    contiguous and the other dimension's stride padded to 16 bytes."""
    return copy_into(x, k_major_empty(*x.shape, k_dim, x.dtype, x.device))


def copy_pays(M: int, N: int, K: int, copied_elements: int) -> bool:
    """The rule: copying `copied_elements` fp32 values (read + write) takes at most
    _PAYS_UP_TO x the GEMM's ideal tf32 time. For B (K x N elements) this reduces to
    M >= 165, for A (M x K) to N >= 165: the copy is paid back over the other operand's
    rows or columns."""
    copy_s = 2 * 4 * copied_elements / _COPY_BYTES_PER_S
    ideal_s = 2 * M * N * K / _TF32_FLOPS_PER_S
    return copy_s <= _PAYS_UP_TO * ideal_s


def copy_wanted(M: int, N: int, K: int, copied_elements: int) -> bool:
    """Whether the rule, under ADVISOR_TF32_KMAJOR, copies an operand of `copied_elements`
    fp32 values K-major: never with 0 or 2, always with 1, else where copy_pays."""
    mode = copy_mode()
    return mode not in ("0", "2") and (mode == "1" or copy_pays(M, N, K, copied_elements))


def copy_mode() -> str:
    """ADVISOR_TF32_KMAJOR: "0" leaves fp32 operands alone, "1" always copies, "2" never
    copies (swaps and feeds A through registers only), anything else follows the rule."""
    return os.environ.get("ADVISOR_TF32_KMAJOR", "")


def enabled() -> bool:
    """False where ADVISOR_TF32_KMAJOR=0 turns all of this off (the 4-byte path)."""
    return copy_mode() != "0"


def a_through_registers(a: torch.Tensor) -> bool:
    """Whether the pointer-load schedules should feed this A to the MMA from registers
    (dp_gemm.mac_loop's A_REGS): an fp32 A whose K dimension is strided, which would
    otherwise reach shared memory through 4-byte transposing copies."""
    return a.dtype == torch.float32 and not k_major(a, 1) and enabled()


def swap_operands(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether to compute C^T = B^T A^T instead (after tf32_operands): an fp32 B whose K
    dimension is still strided (its copy did not pay) beside a K-major A. Swapped, B^T is the
    kernel's A and goes through registers (a_through_registers), and A^T, K-major, is the
    kernel's B: no 4-byte copies left."""
    return (a.dtype == torch.float32 and not k_major(b, 0) and k_major(a, 1) and enabled()
            and a.shape[0] > 1 and b.shape[1] > 1)


def transposed_tile(config):
    """`config` for the swapped problem: the same output tiles, transposed (BLOCK_M and
    BLOCK_N exchanged, and Stream-K's row and column pieces with them), every other knob as
    it was."""
    swapped = {"BLOCK_M": config.BLOCK_N, "BLOCK_N": config.BLOCK_M}
    if hasattr(config, "SK_SPLIT_M"):
        swapped.update(SK_SPLIT_M=config.SK_SPLIT_N, SK_SPLIT_N=config.SK_SPLIT_M)
    return replace(config, **swapped)


def matmul_swapped(matmul, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config, **kwargs) -> bool:
    """Where swap_operands(a, b): C = a @ b written into `c` as C^T = b^T a^T by `matmul`
    (the caller's own, given `kwargs` too), with the config's tile transposed; True when it
    ran."""
    if not swap_operands(a, b):
        return False
    matmul(b.t(), a.t(), None if config is None else transposed_tile(config), out=c.t(), **kwargs)
    return True


def tf32_operands(a: torch.Tensor, b: torch.Tensor, *, registers: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) with each fp32 operand whose K dimension is strided copied K-major where that
    pays (see the module docstring); anything else is returned as it is. `registers`: the
    caller's kernels feed a strided A through registers (a_through_registers) and swap the
    operands for a strided B (swap_operands), which beat the copy on every shape measured, so
    then only a B beside a strided A (no swap possible) is copied."""
    if a.dtype != torch.float32:
        return a, b
    a_strided, b_strided = not k_major(a, 1), not k_major(b, 0)
    if not (a_strided or b_strided):
        return a, b
    mode = copy_mode()
    if mode in ("0", "2"):
        return a, b
    M, K = a.shape
    N = b.shape[1]
    if registers and mode != "1":
        if a_strided and b_strided and copy_pays(M, N, K, K * N):
            b = k_major_copy(b, 0)
        return a, b
    if a_strided and copy_wanted(M, N, K, M * K):
        a = k_major_copy(a, 1)
    if b_strided and copy_wanted(M, N, K, K * N):
        b = k_major_copy(b, 0)
    return a, b
