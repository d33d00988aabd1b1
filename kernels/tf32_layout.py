"""K-major operands for fp32 (tf32) GEMMs: copy an operand whose K dimension is strided.

What
    Hopper's wgmma reads tf32 operands from shared memory only K-major: the instruction's
    transpose bits exist for 16-bit types alone. A row-major B (K, N) has N contiguous, so
    Triton 3.6 fills B's shared-memory tiles K-major itself. With pointer loads it issues
    4-byte cp.async copies in a transposing pattern (32 a thread for a 32x256 fp32 stage,
    against 8 sixteen-byte ones for a K-major B); after a TMA load it runs a shared ->
    register -> shared round trip of every B tile inside the K loop (sm_90 compile check,
    2026-12-01). Either way the MMA starves. The same holds for an A whose M is contiguous
    (a transposed view).

    `tf32_operands(a, b)` copies such an operand into K-major storage (rows padded to 16
    bytes, so that the TMA schedules can read it) when the copy costs less than the time it
    saves, and returns views with the original shapes and values. Each schedule's `matmul`
    calls it first; bf16/fp16 inputs and K-major fp32 ones pass through untouched.

When it pays (H200, 2026-12-01, bench/results/probe_tf32_layout/)
    Graph-timed fp32 GEMMs with a row-major B, without the copy -> with it (the copy
    included) -> on a B stored K-major beforehand, against torch.matmul with tf32:
    Stream-K 555.9 -> 145.5 -> 125.5 us on 1664x1408x8192 (torch 148.0); persistent
    3439.4 -> 821.4 -> 790.3 us on 4096x4096x8192 (torch 770.3); Stream-K 507.5 -> 188.0 ->
    124.0 us on 512x512x65536 (torch 139.1). The copy moves the operand twice (read +
    write, at ~4 TB/s), so it pays when the GEMM does enough work per operand element: the
    rule (`copy_pays`) compares the copy's time with the GEMM's ideal tf32 time. On
    64x4096x14336 the B copy alone (235 MB, 116 us) costs more than it saves, so B stays
    as it is there (split-K 172.6 us, K-major 63.6, torch 65.4).

Caveats
    - The copy is a new tensor on every call, as large as the operand: a weight that never
      changes is copied again each time. Keep a K-major copy of it instead (made once, e.g.
      `b_km = b.t().contiguous().t()`) and pass that: nothing is copied then.
    - `ADVISOR_TF32_KMAJOR=0` never copies, `=1` copies every strided-K fp32 operand,
      anything else (the default) follows the rule.

Source of the idea
    CUTLASS's Hopper tf32 GEMMs accept only K-major ("TN") operands for the same reason
    (the PTX ISA's wgmma section: "matrices A and B must be K-major" for .tf32); cuBLAS
    reorders or transposes internally.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .common import aligned_empty, cdiv, needs_int64_offsets
from .launch import launch

# Rates of the rule (H200, 2026-12-01, bench/results/probe_tf32_layout/): the relayout
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
def _relayout_kernel(src, dst, R, C, s_r, s_c, d_r, d_c,
                     BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, INT64: tl.constexpr):
    """dst[r, c] = src[r, c] over an (R, C) block grid; the two tensors' strides differ, so
    Triton loads along src's contiguous dimension, stores along dst's and converts the tile's
    layout in shared memory between the two."""
    r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    if INT64:
        r = r.to(tl.int64)
        c = c.to(tl.int64)
    mask = (r < R)[:, None] & (c < C)[None, :]
    x = tl.load(src + (r[:, None] * s_r + c[None, :] * s_c), mask=mask)
    tl.store(dst + (r[:, None] * d_r + c[None, :] * d_c), x, mask=mask)


def k_major(x: torch.Tensor, k_dim: int) -> bool:
    """Whether dimension `k_dim` of the 2-D `x` is contiguous (or has one element)."""
    return x.stride(k_dim) == 1 or x.shape[k_dim] == 1


def k_major_copy(x: torch.Tensor, k_dim: int) -> torch.Tensor:
    """A copy of the 2-D `x` (same shape, values, dtype, device) stored with dimension `k_dim`
    contiguous and the other dimension's stride padded to 16 bytes."""
    R, C = x.shape
    if k_dim == 1:  # (R, C) row-major
        out = aligned_empty(R, C, x.dtype, x.device)
    else:  # (R, C) column-major: the transpose of a row-major (C, R)
        out = aligned_empty(C, R, x.dtype, x.device).t()
    if x.numel() == 0:
        return out
    BR, BC = 64, 64
    launch(_relayout_kernel, (cdiv(R, BR), cdiv(C, BC)),
           x, out, R, C, x.stride(0), x.stride(1), out.stride(0), out.stride(1),
           BLOCK_R=BR, BLOCK_C=BC, INT64=needs_int64_offsets(x, out), num_warps=4)
    return out


def copy_pays(M: int, N: int, K: int, copied_elements: int) -> bool:
    """The rule: copying `copied_elements` fp32 values (read + write) takes at most
    _PAYS_UP_TO x the GEMM's ideal tf32 time. For B (K x N elements) this reduces to
    M >= 165, for A (M x K) to N >= 165: the copy is paid back over the other operand's
    rows or columns."""
    copy_s = 2 * 4 * copied_elements / _COPY_BYTES_PER_S
    ideal_s = 2 * M * N * K / _TF32_FLOPS_PER_S
    return copy_s <= _PAYS_UP_TO * ideal_s


def tf32_operands(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) with each fp32 operand whose K dimension is strided copied K-major where that
    pays (see the module docstring); anything else is returned as it is."""
    if a.dtype != torch.float32:
        return a, b
    a_strided, b_strided = not k_major(a, 1), not k_major(b, 0)
    if not (a_strided or b_strided):
        return a, b
    mode = os.environ.get("ADVISOR_TF32_KMAJOR", "")
    if mode == "0":
        return a, b
    M, K = a.shape
    N = b.shape[1]
    if a_strided and (mode == "1" or copy_pays(M, N, K, M * K)):
        a = k_major_copy(a, 1)
    if b_strided and (mode == "1" or copy_pays(M, N, K, K * N)):
        b = k_major_copy(b, 0)
    return a, b
