"""Data-parallel GEMM: one program per output tile, tiles visited in grouped order.

What
    C = A @ B with A (M, K), B (K, N). The output is cut into BLOCK_M x BLOCK_N tiles and the
    grid launches exactly one program per tile. Each program walks the whole K dimension in
    BLOCK_K steps, accumulating in fp32 registers (`tl.dot`, tensor cores; fp32 inputs run as
    tf32), then casts to the input dtype and stores its tile.

    Program ids are mapped to tiles in *grouped* order: GROUP_M consecutive row-tiles share one
    sweep over the column-tiles. Programs that run at the same time then touch a compact
    GROUP_M x (a few) block of tiles, so the A rows and B columns they read are still in L2
    when their neighbours ask for them (the plain row-major order streams all of B for every
    row of tiles).

When it wins
    This is the baseline every other schedule is measured against. It is the right schedule
    whenever the tile count fills the GPU in (close to) whole waves and each tile has enough
    K work: large balanced GEMMs. It loses (a) when tiles < SMs and K is long (most SMs idle:
    use split_k_gemm), (b) when the last wave is mostly empty (1.08 waves costs 2 tile-times:
    use stream_k_gemm), (c) when there are many tiny tiles, where launch and prologue costs
    dominate (persistent_gemm).

Caveats
    - fp32 (tf32) operands strided in K (a row-major B, a transposed A) would reach shared
      memory 4 bytes at a time; matmul feeds such an A through registers (mac_loop A_REGS)
      and swaps such a B into A's place, C^T = B^T A^T (kernels/tf32_layout.py).
    - Rows/columns past the matrix edge are wrapped (`% M`, `% N`) onto valid ones inside the
      K loop, so the loop needs no M/N masks; their results are dropped by the masked store.
      The wrap keeps Triton's contiguity facts when M and N are multiples of 16, which is what
      lets loads vectorize.
    - Only the last BLOCK_K step of K can be ragged: it is peeled off the main loop and runs
      masked after it (EVEN_K=False), in 16-deep slices, so the pipelined loop never carries
      masks and the peeled step does not spill.
    - Element offsets are int32 unless some tensor spans 2**31 elements, then int64 (INT64).
    - Inputs may be any strided views (row-major, transposed); nothing is copied. Loads are
      16 bytes wide only where the leading strides are 16-byte multiples: the host passes
      each stride's power-of-two factor (`common.stride_hints`), because Triton itself only
      recognises strides divisible by 16 elements (K = 8200 ran 10x slower without it,
      experiments/probes/ragged_k.json). Rows that are not 16-byte aligned (K = 1000 in bf16)
      get narrower loads; copy such inputs into padded buffers when they are hot.

Source of the idea
    Triton tutorial 03-matrix-multiplication (grouped ordering, fp32 accumulator, pointer
    increments along K). The helpers `tile_coords`, `mac_loop` and `store_tile` below are
    shared with split_k_gemm, persistent_gemm and stream_k_gemm, so that every schedule runs
    the same inner loop and comparisons between them measure only the schedule.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .common import (
    cdiv,
    gemm_launch_metadata,
    needs_int64_offsets,
    self_check,
    stride_hints,
)
from .dp_configs import (  # the knobs and the host's choice of them, re-exported: the schedule's API
    Config,
    TileConfig,
    _next_pow2,
    _pow2,
    check_block_config,
    check_smem,
    default_config,
    fits_shape,
    for_dtype,
    search_space,
)
from .gemm_call import begin, inputs_and_output
from .runtime import Recorder
from .tf32_layout import a_through_registers

# --------------------------------------------------------------------------------------------
# Device helpers shared by the schedules in this folder
# --------------------------------------------------------------------------------------------


@triton.jit
def tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of linear tile `tile_id` in grouped order: tiles are numbered down a
    band of GROUP_M row-tiles first, then across; the last band may be shorter."""
    tiles_per_group = GROUP_M * num_pid_n
    group_id = tile_id // tiles_per_group
    first_pid_m = group_id * GROUP_M
    group_rows = tl.minimum(num_pid_m - first_pid_m, GROUP_M)
    within = tile_id % tiles_per_group
    pid_m = first_pid_m + within % group_rows
    pid_n = within // group_rows
    return pid_m, pid_n


@triton.jit
def mac_loop(
    # operands (element pointers) and their element strides
    a_ptr, b_ptr, stride_am, stride_ak, stride_bk, stride_bn,
    # problem size
    M, N, K,
    # which tile, and which K steps of it: iterations [k_begin, k_end) of BLOCK_K each
    pid_m, pid_n, k_begin, k_end,
    # meta-parameters
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr,  # K % BLOCK_K == 0: no K masks at all
    INT64: tl.constexpr,  # compute element offsets in int64
    RAGGED_K: tl.constexpr = 16,  # depth of the slices the ragged last K step is cut into
    HINTS: tl.constexpr = 0,  # common.stride_hints(a, b): the strides' known power-of-two factors
    A_REGS: tl.constexpr = False,  # feed A to the MMA from registers (tf32_layout.a_through_registers)
):
    """fp32 accumulator of A[tile rows, k-range] @ B[k-range, tile cols]. An empty range
    (k_begin >= k_end) returns zeros."""
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = k_begin * BLOCK_K + tl.arange(0, BLOCK_K)
    step_a = BLOCK_K * stride_ak
    step_b = BLOCK_K * stride_bk
    if INT64:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
        rk = rk.to(tl.int64)
        step_a = BLOCK_K * stride_ak.to(tl.int64)
        step_b = BLOCK_K * stride_bk.to(tl.int64)
    # Rows/cols past the edge read valid memory (wrapped); the store drops them.
    rm = rm % M
    rn = rn % N
    # Triton marks an integer argument divisible only when it divides by 16; a K of 8200 (rows
    # 16-byte aligned: 8200 = 8 x 1025) then left A's loads 2 bytes wide and a 128x128
    # data-parallel launch on 1664x1408x8200 took 1.2 ms against 94 us at K = 8192 (sm_90).
    # The host measured each stride's power-of-two factor (HINTS); say so on the
    # offsets (on the scalar strides the hint is not used). Inline on purpose: the same
    # multiple_of in a helper @triton.jit function did not reach the loads (sm_90 compile
    # check, split-K at 1664x1408x8200: 167 registers again instead of 96).
    a_rows = rm * stride_am
    a_cols = rk * stride_ak
    b_rows = rk * stride_bk
    b_cols = rn * stride_bn
    if (HINTS & 31) > 1:
        a_rows = tl.multiple_of(a_rows, HINTS & 31)
    if ((HINTS >> 5) & 31) > 1:
        a_cols = tl.multiple_of(a_cols, (HINTS >> 5) & 31)
    if ((HINTS >> 10) & 31) > 1:
        b_rows = tl.multiple_of(b_rows, (HINTS >> 10) & 31)
    if ((HINTS >> 15) & 31) > 1:
        b_cols = tl.multiple_of(b_cols, (HINTS >> 15) & 31)
    a_ptrs = a_ptr + (a_rows[:, None] + a_cols[None, :])
    b_ptrs = b_ptr + (b_rows[:, None] + b_cols[None, :])
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Full BLOCK_K steps need no mask. Only the last step of K can be ragged; it is peeled
    # off the pipelined loop (a mask in every step costs registers and spilled at 128x128).
    k_full = k_end
    if not EVEN_K:
        k_full = tl.minimum(k_end, K // BLOCK_K)
    for ki in range(k_begin, k_full):
        a = tl.load(a_ptrs)
        if A_REGS:
            # Not a no-op for the compiler: the MMA's A operand is then computed, so it is fed
            # from registers, read out of shared memory in the MMA's own layout. A tf32 A with
            # M contiguous otherwise reaches shared memory through 4-byte transposing copies
            # (wgmma reads tf32 from shared memory only K-major; sm_90 compile check of a
            # 128x64x32 tile: 128 four-byte cp.async in the kernel without this line, none
            # with it). Adding +0.0 changes no sum.
            a = a + 0.0
        b = tl.load(b_ptrs)
        acc = tl.dot(a, b, acc)
        a_ptrs += step_a
        b_ptrs += step_b
    if not EVEN_K:  # noqa: SIM102  (compile-time test around a run-time one)
        if k_full < k_end:
            # The ragged step runs outside the software pipeline, so its operands go through
            # registers: a whole BLOCK_K-deep masked tile beside the accumulator spilled
            # (sm_90 compile check, 1664x1408x8200 at 128x128x64: 704 bytes of stack). In
            # 16-deep slices nothing spills there (dp, split-K; Stream-K 1008 -> 96 bytes),
            # but persistent_gemm's tile loop spilled more (616 -> 2208 bytes, rm and rn kept
            # live for the slices' pointers): it passes RAGGED_K=BLOCK_K, the one-slice path.
            k_left = K - k_full * BLOCK_K
            if RAGGED_K == BLOCK_K:  # one slice: the loop's own pointers, nothing else kept live
                a = tl.load(a_ptrs, mask=tl.arange(0, BLOCK_K)[None, :] < k_left, other=0.0)
                if A_REGS:
                    a = a + 0.0
                b = tl.load(b_ptrs, mask=tl.arange(0, BLOCK_K)[:, None] < k_left, other=0.0)
                acc = tl.dot(a, b, acc)
            else:
                rs = k_full * BLOCK_K + tl.arange(0, RAGGED_K)  # the ragged step's first slice
                if INT64:
                    rs = rs.to(tl.int64)
                a_rag = a_ptr + rm[:, None] * stride_am + rs[None, :] * stride_ak
                b_rag = b_ptr + rs[:, None] * stride_bk + rn[None, :] * stride_bn
                rs = tl.arange(0, RAGGED_K)
                sa = stride_ak
                sb = stride_bk
                if INT64:  # kk x stride can pass 2**31 where INT64 is needed at all
                    sa = stride_ak.to(tl.int64)
                    sb = stride_bk.to(tl.int64)
                for kk in tl.static_range(0, BLOCK_K, RAGGED_K):
                    a = tl.load(a_rag + kk * sa, mask=(kk + rs)[None, :] < k_left, other=0.0)
                    if A_REGS:
                        a = a + 0.0
                    b = tl.load(b_rag + kk * sb, mask=(kk + rs)[:, None] < k_left, other=0.0)
                    acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def store_block(
    c_ptr, stride_cm, stride_cn, M, N, row0, col0, vals,
    ROWS: tl.constexpr, COLS: tl.constexpr, INT64: tl.constexpr,
):
    """Cast a ROWS x COLS fp32 block to C's dtype and store its in-bounds part at (row0, col0)."""
    rm = row0 + tl.arange(0, ROWS)
    rn = col0 + tl.arange(0, COLS)
    if INT64:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
    c_ptrs = c_ptr + (rm[:, None] * stride_cm + rn[None, :] * stride_cn)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(c_ptrs, vals.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def store_tile(
    c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, acc,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr,
):
    """Cast the fp32 tile (pid_m, pid_n) to C's dtype and store the in-bounds part."""
    store_block(c_ptr, stride_cm, stride_cn, M, N, pid_m * BLOCK_M, pid_n * BLOCK_N, acc,
                BLOCK_M, BLOCK_N, INT64)


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------


@triton.jit(launch_metadata=gemm_launch_metadata("dp_gemm"))
def dp_gemm_kernel(
    # pointers: A (M, K), B (K, N), C (M, N)
    a_ptr, b_ptr, c_ptr,
    # problem size
    M, N, K,
    # element strides
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    # tile shape and order
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    # shape facts fixed by the host
    EVEN_K: tl.constexpr, INT64: tl.constexpr, STRIDE_HINTS: tl.constexpr, A_REGS: tl.constexpr,
):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = tile_coords(tl.program_id(0), num_pid_m, num_pid_n, GROUP_M)
    acc = mac_loop(a_ptr, b_ptr, stride_am, stride_ak, stride_bk, stride_bn, M, N, K,
                   pid_m, pid_n, 0, tl.cdiv(K, BLOCK_K),
                   BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INT64, HINTS=STRIDE_HINTS, A_REGS=A_REGS)
    store_tile(c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, acc, BLOCK_M, BLOCK_N, INT64)


# --------------------------------------------------------------------------------------------
# Host launcher
# --------------------------------------------------------------------------------------------


def matmul(a: torch.Tensor, b: torch.Tensor, config: Config | None = None, *,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """C = a @ b with the data-parallel schedule. a: (M, K), b: (K, N), both fp16, bf16 or fp32
    (any strides). Returns `out` (filled) when given, else a new (M, N) tensor in a's dtype."""
    # input checks, fp32 layout (a strided B swapped into A's place), output, replay
    call = begin("dp", matmul, a, b, config, out, default_config=default_config, check_smem=check_smem)
    if call.done:
        return call.c
    M, N, K, a, b, c, config = call.M, call.N, call.K, call.a, call.b, call.c, call.config
    grid = (cdiv(M, config.BLOCK_M) * cdiv(N, config.BLOCK_N),)
    rec = Recorder(call.key, inputs_and_output, a, b, c)
    rec.launch(dp_gemm_kernel, grid,
        a, b, c,
        M, N, K,
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1),
        c.stride(0), c.stride(1),
        BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K,
        GROUP_M=config.GROUP_M,
        EVEN_K=K % config.BLOCK_K == 0,
        INT64=needs_int64_offsets(a, b, c), STRIDE_HINTS=stride_hints(a, b),
        A_REGS=a_through_registers(a),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    rec.commit()
    return c


if __name__ == "__main__":
    import os

    if os.environ.get("TRITON_INTERPRET") == "1":
        self_check(matmul, [(37, 53, 97), (130, 70, 300)], config=Config(16, 16, 16, 2, num_warps=4, num_stages=1))
    else:
        self_check(matmul, [(37, 53, 97), (1664, 1408, 1024), (2048, 2048, 2048)])
