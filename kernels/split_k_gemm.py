"""Split-K GEMM: cut the K dimension into SPLIT_K chunks so that few output tiles fill the GPU.

What
    C = A @ B for problems whose output has few tiles but a long K (M, N in 16..512, K in the
    tens of thousands: LLM decode/prefill projections, weight-gradient GEMMs). A data-parallel
    grid launches one program per output tile; with, say, 4 tiles on 132 SMs, 128 SMs idle
    while four programs walk K=131072. Split-K launches tiles x SPLIT_K programs instead:
    program (split, tile) accumulates its tile over K-steps [split*ips, (split+1)*ips) of
    BLOCK_K each (ips = iterations per split, so every chunk is a whole number of BLOCK_K
    steps and only the very last step of K can be ragged). The partial fp32 tiles are then
    summed, by one of three reductions (the `reduction` knob):

    "atomic"     each program `atomic_add`s its fp32 partial into a per-tile fp32 buffer, then
                 bumps the tile's arrival counter; the program that arrives last takes the
                 sum out with an atomic exchange against zero (so the next launch needs no
                 memset), casts it to C's dtype, stores it and resets the counter. One launch. NOT
                 deterministic: fp32 additions happen in arrival order, so the last bits can
                 differ from run to run. Spreading a tile's adds over several sum buffers
                 (fewer adds queued per address) only made 32x32x131072 slower: the last
                 arriver's read-out is a latency chain, not the adds
                 (docs/schedules/split_k.md).
    "two_phase"  each program stores its partial into a workspace [SPLIT_K, M, N]; a second,
                 small kernel sums the SPLIT_K partials of each element in split order and
                 casts. Deterministic. Two launches; the partials make a round trip through
                 memory (2 x SPLIT_K x M x N x 4 bytes), spread over many programs.
    "fixup"      each program stores its partial into its own slot, bumps the tile's arrival
                 counter (acq_rel), and the last arriver sums all slots of the tile in split
                 order ("last arriver does the fixup", as in Stream-K). Deterministic, one
                 launch, but one program reads SPLIT_K partial tiles, so it only pays when
                 SPLIT_K x BLOCK_M x BLOCK_N is small (skinny tiles, modest split).

    Nothing ever waits for another program (no spin-waits): the order in which programs run
    cannot deadlock the GPU, and the CPU interpreter, which runs programs one at a time in
    pid order, runs the same code.

When it wins
    Memory-bound skinny GEMMs. Their floor is the bytes: (MK + KN + MN) x element size at
    the device's bandwidth; e.g. 16x4096x16384 in bf16 is 134 MB, and 97% of it is B.
    With BLOCK_M >= M every B element belongs to exactly one program, which streams its B
    chunk once with 16-byte coalesced loads (BLOCK_N or BLOCK_K contiguous, whichever B's
    layout makes contiguous) and a deep pipeline (num_stages 4-6) to keep ~100 KB in flight
    per SM; A (small) is re-read from L2 by each column tile. default_config picks
    SPLIT_K so that tiles x SPLIT_K ~ one wave of SMs with each chunk a whole number of
    BLOCK_K steps.

Caveats
    - fp32 operands strided in K go through registers or a swap, as in dp_gemm
      (kernels/tf32_layout.py).
    - Extra traffic: the partials (tiles x SPLIT_K x BLOCK_M x BLOCK_N x 4 bytes). At
      512x512x65536 with 128 programs that is 16 MB written and read again; keep SPLIT_K as
      low as fills the GPU.
    - "atomic" and "fixup" keep a per-tile counter (and, for "atomic", a zeroed fp32 sum
      buffer) in kernels/common.py's ZeroedScratch pool, per device and stream; the kernel
      leaves them zeroed. A launch killed mid-flight leaves them dirty (SCRATCH.clear()).
    - The effective split is the number of non-empty chunks: SPLIT_K=6 over 10 K-steps runs
      5 chunks of 2 (see `effective_split`).
    - SPLIT_K=1 (or a K that fits one chunk) stores the tile directly: no reduction.

Source of the idea
    Split-K as in CUTLASS (serial and parallel split-K reductions) and tritonbench's
    `operators/gemm` split-K variants; the last-arriver fixup from the Stream-K paper (Osama
    et al. 2023, arXiv 2301.03598). The inner loop is dp_gemm's `mac_loop`, so the only
    difference from the data-parallel baseline is the schedule.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import torch
import triton
import triton.language as tl

from .common import (
    SCRATCH,
    cdiv,
    gemm_launch_metadata,
    needs_int64_offsets,
    num_sms,
    self_check,
    stride_hints,
)
from .dp_configs import check_smem
from .dp_gemm import (
    mac_loop,
    store_block,
    store_tile,
    tile_coords,
)
from .gemm_call import begin
from .runtime import Recorder
from .split_k_configs import (  # the knobs and the host's choice of them, re-exported: the schedule's API
    Config,
    REDUCTIONS,
    _pick_split,
    _reduction_for,
    _stages,
    _tf32_deep_k_point,
    _tf32_wide_point,
    _tile_for,
    default_config,
    effective_split,
    search_space,
)
from .tf32_layout import a_through_registers


# --------------------------------------------------------------------------------------------
# Knobs
# --------------------------------------------------------------------------------------------


def fixup_rows(block_m: int, block_n: int) -> int:
    """Rows of a tile the last arriver reduces at a time: at most 4096 fp32 values."""
    return max(1, min(block_m, 4096 // block_n))


def fixup_chunk(block_m: int, block_n: int, split: int) -> int:
    """Partials the "fixup" program loads at once for one row block: up to 4096 fp32 values
    (32 registers a thread at 4 warps; 8192 spilled in the sm_90 compile check), so several
    loads are in flight instead of one per split."""
    rows = fixup_rows(block_m, block_n)
    chunk = 1
    while chunk < split and 2 * chunk * rows * block_n <= 4096:
        chunk *= 2
    return chunk


# --------------------------------------------------------------------------------------------
# Kernels
# --------------------------------------------------------------------------------------------


@triton.jit(launch_metadata=gemm_launch_metadata("split_k_gemm"))
def split_k_gemm_kernel(
    # pointers: A (M, K), B (K, N), C (M, N)
    a_ptr, b_ptr, c_ptr,
    # reduction state: fp32 workspace (layout per REDUCTION) and int32 per-tile arrival counters
    ws_ptr, counter_ptr,
    # problem size
    M, N, K,
    # element strides
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    # the split: number of chunks, and K-steps (of BLOCK_K) per chunk
    split_k, iters_per_split,
    # tile shape and order
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    # "none" (one chunk: store directly), "atomic", "two_phase" or "fixup"
    REDUCTION: tl.constexpr,
    FIXUP_ROWS: tl.constexpr,  # last arriver: tile rows reduced at a time
    FIXUP_CHUNK: tl.constexpr,  # fixup: partials summed per load
    # shape facts fixed by the host
    EVEN_K: tl.constexpr, INT64: tl.constexpr, STRIDE_HINTS: tl.constexpr, A_REGS: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    # split-major: all tiles of chunk 0 first, so programs that run together share K-ranges
    # of A and B in L2
    split = pid // num_tiles
    tile_id = pid % num_tiles
    pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)

    k_begin = split * iters_per_split
    k_end = tl.minimum(k_begin + iters_per_split, tl.cdiv(K, BLOCK_K))
    acc = mac_loop(a_ptr, b_ptr, stride_am, stride_ak, stride_bk, stride_bn, M, N, K,
                   pid_m, pid_n, k_begin, k_end,
                   BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INT64, HINTS=STRIDE_HINTS, A_REGS=A_REGS)

    if REDUCTION == "none":
        store_tile(c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, acc, BLOCK_M, BLOCK_N, INT64)
    elif REDUCTION == "two_phase":
        # partial -> workspace[split, m, n]; split_k_reduce_kernel sums it afterwards
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        base = split * M
        if INT64:
            rm = rm.to(tl.int64)
            rn = rn.to(tl.int64)
            base = base.to(tl.int64)
        ws = ws_ptr + ((base + rm)[:, None] * N + rn[None, :])
        tl.store(ws, acc, mask=(rm[:, None] < M) & (rn[None, :] < N))
    else:
        # Whole tiles, tile-blocked: slot t holds BLOCK_M x BLOCK_N contiguous fp32 values.
        TILE: tl.constexpr = BLOCK_M * BLOCK_N
        local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tile_off = tile_id
        if INT64:
            tile_off = tile_off.to(tl.int64)
        if REDUCTION == "atomic":
            tl.atomic_add(ws_ptr + (tile_off * TILE + local), acc, sem="relaxed")
        else:  # fixup
            tl.store(ws_ptr + (tile_off * split_k + split) * TILE + local, acc)
        # Every thread's partial must be in memory before this program announces itself: the
        # barrier orders the block, the acq_rel atomic publishes to (and, for the last
        # arriver, acquires from) the other programs.
        tl.debug_barrier()
        arrived = tl.atomic_add(counter_ptr + tile_id, 1, sem="acq_rel")
        if arrived == split_k - 1:
            # Last arriver: every partial of this tile is visible. Read them through L2
            # (.cg: another SM wrote them, L1 is not coherent), FIXUP_ROWS rows at a time so
            # the sum and the loaded partials fit in registers beside each other.
            for r0 in tl.static_range(0, BLOCK_M, FIXUP_ROWS):
                rows = (r0 + tl.arange(0, FIXUP_ROWS))[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
                if INT64:
                    rows = rows.to(tl.int64)
                if REDUCTION == "atomic":
                    # Read the sum and leave zeros for the next launch in ONE atomic exchange
                    # per element. A load followed by a store of zeros is a race: Triton may
                    # give the load and the store different layouts, so another thread can zero
                    # an element before its reader loaded it (on sm_90 that lost about half
                    # of the sums for 128-row tiles). Exchanged as int32 bits (the interpreter
                    # has no float exchange); the bits are the fp32 sum.
                    bits = ws_ptr.to(tl.pointer_type(tl.int32)) + (tile_off * TILE + rows)
                    total = tl.atomic_xchg(bits, tl.zeros((FIXUP_ROWS, BLOCK_N), dtype=tl.int32),
                                           sem="relaxed").to(tl.float32, bitcast=True)
                else:
                    # fixed split order -> the same bits whatever the arrival order;
                    # FIXUP_CHUNK partials per load keep several loads in flight
                    total = tl.zeros((FIXUP_ROWS, BLOCK_N), dtype=tl.float32)
                    offs_s = tl.arange(0, FIXUP_CHUNK)
                    for s0 in tl.range(0, split_k, FIXUP_CHUNK, num_stages=4):  # cp.async, 3 in flight
                        s = s0 + offs_s
                        slots = ws_ptr + ((tile_off * split_k + s)[:, None, None] * TILE + rows[None, :, :])
                        part = tl.load(slots, mask=(s < split_k)[:, None, None], other=0.0, cache_modifier=".cg")
                        total += tl.sum(part, axis=0)
                store_block(c_ptr, stride_cm, stride_cn, M, N, pid_m * BLOCK_M + r0, pid_n * BLOCK_N,
                            total, FIXUP_ROWS, BLOCK_N, INT64)
            tl.store(counter_ptr + tile_id, 0)  # counter back to zero for the next launch


@triton.jit
def split_k_reduce_kernel(
    ws_ptr,  # fp32 [split_k, M, N], contiguous
    c_ptr, stride_cm, stride_cn,
    M, N, split_k,
    BLOCK: tl.constexpr,  # output elements per program
    CHUNK: tl.constexpr,  # partials loaded at once (several loads in flight)
    INT64: tl.constexpr,
):
    """Second phase of "two_phase": C = sum over splits, in split order, cast to C's dtype."""
    idx = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    MN = M * N
    if INT64:
        idx = idx.to(tl.int64)
        MN = MN.to(tl.int64)
    in_bounds = idx < MN
    total = tl.zeros((BLOCK,), dtype=tl.float32)
    offs_s = tl.arange(0, CHUNK)
    for s0 in tl.range(0, split_k, CHUNK, num_stages=4):  # cp.async through shared memory, 3 in flight
        s = s0 + offs_s
        if INT64:
            s = s.to(tl.int64)
        part = tl.load(ws_ptr + (s[:, None] * MN + idx[None, :]),
                       mask=(s < split_k)[:, None] & in_bounds[None, :], other=0.0)
        total += tl.sum(part, axis=0)
    m = idx // N
    n = idx % N
    tl.store(c_ptr + (m * stride_cm + n * stride_cn), total.to(c_ptr.dtype.element_ty), mask=in_bounds)


# --------------------------------------------------------------------------------------------
# Host launcher
# --------------------------------------------------------------------------------------------


def matmul(a: torch.Tensor, b: torch.Tensor, config: Config | None = None, *,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """C = a @ b with Split-K. a: (M, K), b: (K, N), fp16/bf16/fp32, any strides. Returns `out`
    (filled) when given, else a new (M, N) tensor in a's dtype. See the module docstring for
    which reductions are deterministic."""
    # input checks, fp32 layout (a strided B swapped into A's place), output, replay
    call = begin("split_k", matmul, a, b, config, out, default_config=default_config, check_smem=check_smem)
    if call.done:
        return call.c
    M, N, K, a, b, c, config = call.M, call.N, call.K, call.a, call.b, call.c, call.config
    BM, BN, BK = config.BLOCK_M, config.BLOCK_N, config.BLOCK_K
    tiles = cdiv(M, BM) * cdiv(N, BN)
    split, per_split = effective_split(K, BK, config.SPLIT_K)
    reduction = config.reduction if split > 1 else "none"

    ws_numel = {"fixup": tiles * split * BM * BN, "two_phase": split * M * N}.get(reduction, tiles * BM * BN)
    rec = Recorder(call.key, functools.partial(_live, reduction, tiles, ws_numel), a, b, c)
    ws, counters = rec.live[3:]
    int64 = needs_int64_offsets(a, b, c, ws if ws is not c else None)

    rec.launch(split_k_gemm_kernel, (tiles * split,),
        a, b, c,
        ws, counters,
        M, N, K,
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1),
        c.stride(0), c.stride(1),
        split, per_split,
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=config.GROUP_M,
        REDUCTION=reduction, FIXUP_ROWS=fixup_rows(BM, BN), FIXUP_CHUNK=fixup_chunk(BM, BN, split),
        EVEN_K=K % BK == 0, INT64=int64, STRIDE_HINTS=stride_hints(a, b), A_REGS=a_through_registers(a),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    if reduction == "two_phase":
        chunk = min(8, 1 << max(0, (split - 1).bit_length()))
        rec.launch(split_k_reduce_kernel, (cdiv(M * N, config.REDUCE_BLOCK),),
            ws, c, c.stride(0), c.stride(1), M, N, split,
            BLOCK=config.REDUCE_BLOCK, CHUNK=chunk, INT64=int64, num_warps=4,
        )
    rec.commit()
    return c


def _live(reduction: str, tiles: int, ws_numel: int, a, b, c) -> tuple:
    """A call's live tensors: a, b, c, then the reduction's workspace and per-tile counters
    (atomic sums and counters from the zeroed pool, fixup and two-phase partials fresh; C as
    the placeholder where the kernel never touches them)."""
    ws = counters = c
    if reduction == "atomic":
        ws = SCRATCH.get("split_k_sums", ws_numel, torch.float32, a.device)
        counters = SCRATCH.get("split_k_counters", tiles, torch.int32, a.device)
    elif reduction == "fixup":
        ws = torch.empty(ws_numel, dtype=torch.float32, device=a.device)
        counters = SCRATCH.get("split_k_counters", tiles, torch.int32, a.device)
    elif reduction == "two_phase":
        ws = torch.empty(ws_numel, dtype=torch.float32, device=a.device)
    return a, b, c, ws, counters


if __name__ == "__main__":
    import os

    if os.environ.get("TRITON_INTERPRET") == "1":
        for red in REDUCTIONS:
            self_check(matmul, [(37, 53, 300)], config=Config(16, 32, 16, 2, 4, 2, SPLIT_K=5, reduction=red))
    else:
        for red in REDUCTIONS:
            def run(a, b, red=red):
                cfg = default_config(a.shape[0], b.shape[1], a.shape[1], a.dtype, num_sms(a.device))
                return matmul(a, b, replace(cfg, reduction=red))

            print(f"reduction={red}")
            self_check(run, [(37, 53, 3000), (16, 4096, 16384), (256, 256, 131072)])
