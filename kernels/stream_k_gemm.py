"""Stream-K GEMM: hybrid data-parallel + Stream-K, so that a partial last wave costs its share.

What
    C = A @ B with output tiles of BLOCK_M x BLOCK_N, each needing `iters` = cdiv(K, BLOCK_K)
    MAC-loop iterations. A data-parallel grid runs one program per tile; with T tiles on P
    SMs the last wave holds only T mod P tiles, and 143 tiles on 132 SMs cost two full
    tile-times for 1.08 tiles' worth of work. Stream-K instead hands out *iterations* of a
    Stream-K region of tiles over P programs, so every SM gets about the same MAC work
    whatever T is. The grid is persistent (about one program an SM): each program does its
    Stream-K work, then its data-parallel tiles sk_tiles + p, + grid, ... How the region is
    cut (`aligned`):

    aligned=False (contiguous ranges, the Stream-K paper's)
        the region's tiles laid end to end (sk_tiles x iters iterations), split evenly into
        one contiguous range a program. Concurrent programs then sit at staggered K offsets
        and share few operand panels in the L2: the tensor pipe starves and DRAM traffic
        grows well past the compulsory bytes (docs/schedules/stream_k.md).
    aligned=True
        each region tile cut into `chunks` equal K-chunks (`aligned_chunks`: one round of
        units when the region is at most half a wave, e.g. 11 tail tiles x 12 chunks on 132
        SMs; otherwise the chunk count whose rounds finish soonest); unit u = chunk
        u // sk_tiles of tile u % sk_tiles goes to program u mod P, so programs running at
        the same time read the same K panels. With SK_SPLIT_M (and SK_SPLIT_N) each region
        tile is first cut into row (and column) pieces, and the pieces are K-chunked and
        reduced as the tiles would be: smaller partials (the hand-in is mostly the cost of
        writing them while every program does the same) for a MAC loop on a smaller tile.
        Where the pieces fit one round of programs they need no K-chunks at all (forced by
        whole_pieces): the region is then a round of small data-parallel pieces, stored
        directly, with no fixup; their loops read little a step, so SK_STAGES gives them a
        deeper pipeline than the big tiles' (e.g. 5 against 3 stages for 64x128 pieces of
        128x256 tiles). With edge_first, a last tile
        column that N leaves ragged comes first in the tile order, so its tiles are the
        region's, and their column pieces wholly right of N are dropped instead of computing
        zeros (2176^2 in 128x256 tiles: a region of 25 pieces of 128x128 where 21 whole tiles
        would run; their loops at SK_STAGES=5).

    A tile split between programs is reduced by a fixup:

    deterministic=True (default): fp32 partials in per-contributor workspace slots.
        Contiguous: the program whose arrival completes the tile's counter ("last arriver")
        sums all partials in contributor order and stores the tile. Aligned: a cooperative
        fixup, because one SM reading all partials was the bottleneck (per-program
        timestamps, docs/schedules/stream_k.md). Each contributor counts its
        arrival in the tile's word (low 16 bits), and after its data-parallel tiles claims a
        slice (high bits): the k-th claimer, finding every partial in, sums row slice k; a
        claim that finds partials missing leaves its slice to the final arrival, which sums
        the slices of all earlier claimers. Either way each slice is summed in chunk order:
        same bits on every run.
    deterministic=False: contributors `atomic_add` their partials into one fp32 buffer per
        split tile. Aligned: the same cooperative read-out, each claimer taking its row slice
        out of the running sum (a load, a barrier, zeros stored back), so a claim moves 1/chunks
        of a tile instead of a tile's worth of partials. Contiguous: the last arriver takes the
        whole sum out with one atomic exchange per element (a load then a store of zeros
        races without a barrier: Triton gives them different thread layouts) and stores the
        tile. fp32
        additions in arrival order: not bit-reproducible.

    Two options of the aligned fixup: tma_hand_in hands a partial in as bulk TMA operations
    from shared memory (a reduce-add into the sum, or a store into the slot; the arrival then
    waits for their completion); it helps big tiles only, since the hand-in is bound by the L2
    taking every program's partial at once, not by issuing it. helper_claims lets the
    programs a plan leaves without Stream-K work claim the split pieces whole after their
    data-parallel tiles; one SM reads slowly, so it pays only where they have little to read.

    No program ever waits for another (no spin-wait): the schedule cannot deadlock whatever
    the launch order, and the CPU interpreter (programs one at a time, pid order) runs it
    unchanged, there through the final-arrival path (the tests also run it in reversed
    order).

    Loads and stores: pointer loads (dp_gemm's `mac_loop`) or, with use_tma, host tensor
    descriptors as in persistent_gemm (TMA boxes zero-filled at the edges, TMA stores of C,
    EPILOGUE_SUBTILE to store C in halves).

    The `policy` knob chooses the Stream-K region, in the spirit of Stream-K++:
      "dp"          no Stream-K: persistent data-parallel tiles;
      "sk"          every tile in the Stream-K region;
      "hybrid1..4"  data-parallel full waves, plus a Stream-K region of the last partial
                    wave's tiles (T mod P) and n-1 further full waves' worth (n-1) x P, i.e.
                    sk_tiles = min(T, T mod P + (n-1) P), the rest data-parallel.

When it wins
    GEMMs whose tile count leaves a partial last wave on a big GPU, e.g. on 132 SMs:
    1664x1408 (143 tiles of 128x128), 2176^2 (153 of 128x256), 2304^2 (162), 3072^2 (288),
    4224^2 (561). Aligned + TMA hybrid1 is our fastest schedule on all five, with 64-row
    pieces (SK_SPLIT_M=2) on 1664x1408, whole quarter pieces on 2304^2 and the ragged column
    first on 2176^2; against cuBLAS it is about even. The measurements, and what each
    option gained: docs/schedules/stream_k.md (tables: docs/results.md, "tail").
    cuBLAS picks tiles that Triton's power-of-two blocks cannot express, so that the waves
    come out nearly full and no fixup is needed: 128x160 on 1664x1408 (117 tiles, one wave),
    320x128 on 2176^2, 192x192 on 3072^2 and 4224^2 (experiments/probe_cublas_kernels.py).

Caveats
    - fp32 (tf32) operands strided in K (kernels/tf32_layout.py): TMA configs copy them
      K-major first where that pays, as persistent_gemm does; pointer-load configs feed a
      strided A through registers and swap a strided B into A's place, as dp_gemm does.
    - Workspaces: deterministic partial slots (allocated per call: 2 x P tiles contiguous,
      pieces x chunks pieces aligned, fp32); atomic sum tiles and int32 counters, one a
      program (contiguous) or a region piece (aligned), from kernels/common.py's
      ZeroedScratch pool (per device and stream), left zeroed by the kernel.
    - TMA needs 16-byte aligned bases and leading strides (persistent_gemm's caveats); an
      explicit use_tma=True config raises ValueError otherwise, the default config falls
      back to pointer loads.
    - Tiny problems (fewer iterations than SMs) run fewer Stream-K programs than SMs.
    - Few tiles with long K (T << P) is Split-K's territory (split_k_gemm).

Source of the idea
    Stream-K (Osama, Merrill, Cecka, Garland, Guo: "Stream-K: Work-centric Parallel
    Decomposition for Dense Matrix-Matrix Multiplication on the GPU", PPoPP 2023, arXiv
    2301.03598), its data-parallel + Stream-K hybrids and fixup; Stream-K++ (arXiv
    2408.11417) for choosing among such policies per shape. The K-aligned chunks and the
    cooperative fixup are ours, from the measurements above.
"""

from __future__ import annotations

import functools
import os
from dataclasses import replace

import torch
import triton
import triton.language as tl

from .common import (
    SCRATCH,
    fix_interpreter_descriptor_reduce,
    gemm_launch_metadata,
    needs_int64_offsets,
    num_sms,
    self_check,
    stride_hints,
)
from .dp_configs import check_smem
from .dp_gemm import mac_loop, store_tile, tile_coords
from .gemm_call import begin
from .persistent_gemm import (
    TensorDescriptor,
    resolve_tma,
    tma_descriptors,
    tma_step,
)
from .runtime import Recorder
from .stream_k_configs import (  # the knobs and the host's decisions, re-exported: the schedule's API
    HELPER_BYTES,
    MAX_ALIGNED_CHUNKS,
    MAX_HELPER_PIECES,
    POLICIES,
    TMA_POINTS,
    WHOLE_PIECES_MAX_K,
    Config,
    Plan,
    aligned_chunks,
    aligned_policy,
    default_config,
    default_policy,
    edge_region,
    fixup_rows,
    hand_in_strips,
    helper_bytes,
    helper_rows,
    plan_schedule,
    plausible_policies,
    search_space,
    sk_tile_count,
    skinny_points,
    slice_rows,
    tf32_swap_points,
    uses_helpers,
)
from .stream_k_fixup import (
    _arrive_aligned,
    _halves,
    _hand_in_partial,
    _reduce_rows,
    _sk_owner,
    _sk_start,
    _slot,
    _write_partial,
    _write_partial_tma,
)
from .tf32_layout import a_through_registers

PHASES = 5  # phase_times stamps a program: start, Stream-K MAC done, hand-in done, dp done, end


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------


@triton.jit
def _now(x):
    """The GPU's global nanosecond timer (%globaltimer); `x` only gives the asm an operand."""
    return tl.inline_asm_elementwise("mov.u64 $0, %globaltimer;", "=l,r", [x], dtype=tl.int64,
                                     is_pure=False, pack=1)


@triton.jit
def _tile_at(t, num_pid_m, num_pid_n, GROUP_M: tl.constexpr, EDGE_FIRST: tl.constexpr):
    """(pid_m, pid_n) of tile t in the schedule's order: grouped (dp_gemm.tile_coords), or with
    EDGE_FIRST the ragged last tile column first, top to bottom, then the other columns grouped."""
    if EDGE_FIRST:
        rest_m, rest_n = tile_coords(tl.maximum(t - num_pid_m, 0), num_pid_m, num_pid_n - 1, GROUP_M)
        edge = t < num_pid_m
        pid_m = tl.where(edge, t, rest_m)
        pid_n = tl.where(edge, num_pid_n - 1, rest_n)
    else:
        pid_m, pid_n = tile_coords(t, num_pid_m, num_pid_n, GROUP_M)
    return pid_m, pid_n


@triton.jit
def _piece_coords(v, num_pid_m, num_pid_n, sk_edge, edge_cols, GROUP_M: tl.constexpr,
                  SK_SPLIT_M: tl.constexpr, SK_SPLIT_N: tl.constexpr, EDGE_FIRST: tl.constexpr):
    """(pid_m, pid_n) of Stream-K piece v, in units of BLOCK_M / SK_SPLIT_M rows and
    BLOCK_N / SK_SPLIT_N columns: piece s = v % (SK_SPLIT_M x SK_SPLIT_N) of region tile
    v // (SK_SPLIT_M x SK_SPLIT_N) (_tile_at order), row s // SK_SPLIT_N, column s % SK_SPLIT_N.
    EDGE_FIRST: the first sk_edge region tiles are the ragged column's, and only their first
    edge_cols piece columns (those that reach into C) are pieces; the whole tiles follow."""
    SUBS: tl.constexpr = SK_SPLIT_M * SK_SPLIT_N
    if EDGE_FIRST:
        edge_pieces = SK_SPLIT_M * edge_cols  # pieces of a ragged tile
        in_edge = v < sk_edge * edge_pieces
        w = tl.maximum(v - sk_edge * edge_pieces, 0)  # piece number among the whole tiles'
        t = tl.where(in_edge, v // edge_pieces, sk_edge + w // SUBS)
        row = tl.where(in_edge, (v % edge_pieces) // edge_cols, (w % SUBS) // SK_SPLIT_N)
        col = tl.where(in_edge, v % edge_cols, w % SK_SPLIT_N)
    else:
        t = v // SUBS
        row = (v % SUBS) // SK_SPLIT_N
        col = v % SK_SPLIT_N
    pid_m, pid_n = _tile_at(t, num_pid_m, num_pid_n, GROUP_M, EDGE_FIRST)
    return pid_m * SK_SPLIT_M + row, pid_n * SK_SPLIT_N + col


@triton.jit
def _mac(
    a_ref, b_ref, stride_am, stride_ak, stride_bk, stride_bn, M, N, K,
    pid_m, pid_n, k_begin, k_end,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    EVEN_K: tl.constexpr, INT64: tl.constexpr,
    USE_TMA: tl.constexpr, A_COL_MAJOR: tl.constexpr, B_COL_MAJOR: tl.constexpr,
    HINTS: tl.constexpr = 0, STAGES: tl.constexpr = 0, A_REGS: tl.constexpr = False,
):
    """fp32 accumulator of iterations [k_begin, k_end) of tile (pid_m, pid_n): one TMA box per
    operand and step (edges come back zero-filled), or dp_gemm's pointer loop. STAGES (TMA
    only): this loop's own pipeline depth (0: the kernel's num_stages). A_REGS (pointer loads
    only): A to the MMA from registers (tf32_layout.a_through_registers)."""
    if USE_TMA:
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        if STAGES == 0:
            for ki in range(k_begin, k_end):
                acc = tma_step(a_ref, b_ref, off_m, off_n, ki * BLOCK_K, acc, A_COL_MAJOR, B_COL_MAJOR)
        else:
            for ki in tl.range(k_begin, k_end, num_stages=STAGES):
                acc = tma_step(a_ref, b_ref, off_m, off_n, ki * BLOCK_K, acc, A_COL_MAJOR, B_COL_MAJOR)
    else:
        acc = mac_loop(a_ref, b_ref, stride_am, stride_ak, stride_bk, stride_bn, M, N, K,
                       pid_m, pid_n, k_begin, k_end, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INT64, HINTS=HINTS,
                       A_REGS=A_REGS)
    return acc


@triton.jit
def _store_whole(
    c_ref, c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, acc,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INT64: tl.constexpr,
    USE_TMA: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr,
):
    """Store a finished tile: a TMA store (clipped at the edges; in two halves with
    EPILOGUE_SUBTILE) or dp_gemm's masked pointer store."""
    if USE_TMA:
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        if EPILOGUE_SUBTILE:
            left, right = _halves(acc, BLOCK_M, BLOCK_N // 2)
            c_ref.store([off_m, off_n], left.to(c_ref.dtype))
            c_ref.store([off_m, off_n + BLOCK_N // 2], right.to(c_ref.dtype))
        else:
            c_ref.store([off_m, off_n], acc.to(c_ref.dtype))
    else:
        store_tile(c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, acc, BLOCK_M, BLOCK_N, INT64)


@triton.jit
def _dp_tiles(
    a_ref, b_ref, c_ref, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    first, stop, grid,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    USE_TMA: tl.constexpr, A_COL_MAJOR: tl.constexpr, B_COL_MAJOR: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr, FLATTEN: tl.constexpr, EVEN_K: tl.constexpr, INT64: tl.constexpr,
    HINTS: tl.constexpr = 0, EDGE_FIRST: tl.constexpr = False, A_REGS: tl.constexpr = False,
):
    """Data-parallel tiles first, first + grid, ... below stop (_tile_at order), in a persistent
    loop (program p takes tiles sk_tiles + p, + grid, ... of those after the Stream-K region)."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    iters = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(first, stop, grid, flatten=FLATTEN):
        pid_m, pid_n = _tile_at(tile_id, num_pid_m, num_pid_n, GROUP_M, EDGE_FIRST)
        acc = _mac(a_ref, b_ref, stride_am, stride_ak, stride_bk, stride_bn, M, N, K,
                   pid_m, pid_n, 0, iters, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INT64,
                   USE_TMA, A_COL_MAJOR, B_COL_MAJOR, HINTS=HINTS, A_REGS=A_REGS)
        _store_whole(c_ref, c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, acc,
                     BLOCK_M, BLOCK_N, INT64, USE_TMA, EPILOGUE_SUBTILE)


@triton.jit(launch_metadata=gemm_launch_metadata("stream_k_gemm"))
def stream_k_gemm_kernel(
    # A (M, K), B (K, N), C (M, N): element pointers, or host TensorDescriptors when USE_TMA;
    # A and B once more for the Stream-K pieces (descriptors of the pieces' boxes)
    a_ref, b_ref, c_ref, a_sk_ref, b_sk_ref,
    # the fixup workspace as rows of a piece's width in fp32 with one-piece boxes (TMA_HAND_IN), else ws_ptr
    ws_ref,
    # C as an element pointer (the fixup stores split tiles through it), fixup state: fp32
    # partials (per-contributor slots, or per-tile sums) and int32 arrival counters; int64
    # phase timestamps, 4 a program (PHASE_TIMES only)
    c_ptr, ws_ptr, counter_ptr, times_ptr,
    # problem size
    M, N, K,
    # element strides
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    # the plan (see Plan): Stream-K programs and tiles, iterations per program (q, r) for
    # contiguous ranges, K-chunks per tile for aligned ones
    sk_programs, sk_tiles, sk_q, sk_r, sk_chunks,
    # EDGE_FIRST: ragged-column tiles at the head of the region, piece columns of theirs in C
    sk_edge, edge_cols,
    # tile shape and order
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    # schedule options
    ALIGNED: tl.constexpr, DETERMINISTIC: tl.constexpr,
    SK_SPLIT_M: tl.constexpr,  # aligned: row pieces a Stream-K tile is cut into
    SK_SPLIT_N: tl.constexpr,  # aligned: column pieces a Stream-K tile is cut into
    SK_STAGES: tl.constexpr,  # aligned + TMA: the Stream-K MAC loop's pipeline depth (0: num_stages)
    EDGE_FIRST: tl.constexpr,  # aligned: the ragged last tile column first in the order (Plan.edge_tiles)
    FIXUP_ROWS: tl.constexpr,  # rows summed at a time by a last arriver (or final arrival's owed slices)
    SLICE_ROWS: tl.constexpr,  # rows summed at a time in the cooperative fixup (aligned)
    USE_TMA: tl.constexpr,
    A_COL_MAJOR: tl.constexpr,  # TMA: A's descriptor is over A^T (K, M)
    B_COL_MAJOR: tl.constexpr,  # TMA: B's descriptor is over B^T (N, K)
    EPILOGUE_SUBTILE: tl.constexpr, FLATTEN: tl.constexpr,
    # shape facts fixed by the host
    EVEN_K: tl.constexpr, INT64: tl.constexpr,
    DP_FIRST: tl.constexpr,  # data-parallel tiles before the Stream-K work (else after)
    TMA_HAND_IN: tl.constexpr,  # aligned: partials handed in by bulk TMA operations (ws_ref)
    HAND_IN_STRIPS: tl.constexpr,  # TMA_HAND_IN: column strips a partial goes in (hand_in_strips)
    HELPERS: tl.constexpr,  # aligned: programs pid >= sk_programs claim the split pieces whole
    HELPER_ROWS: tl.constexpr,  # HELPERS: rows a helper reads at a time (helper_rows)
    BULK_WAIT: tl.constexpr,  # wait for the bulk writes' completion (GPU; the interpreter has no asm)
    STRIDE_HINTS: tl.constexpr,
    A_REGS: tl.constexpr,  # pointer loads: A to the MMA from registers (tf32_layout.a_through_registers)
    # diagnosis (GPU only): record start, last Stream-K MAC loop done, Stream-K work done,
    # data-parallel tiles done, end (after the cooperative fixup's claims)
    PHASE_TIMES: tl.constexpr = False,
):
    pid = tl.program_id(0)
    grid = tl.num_programs(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    iters = tl.cdiv(K, BLOCK_K)
    PHASES: tl.constexpr = 5  # stamps a program (PHASE_TIMES)
    SK_BM: tl.constexpr = BLOCK_M // SK_SPLIT_M  # rows of a Stream-K piece (aligned)
    SK_BN: tl.constexpr = BLOCK_N // SK_SPLIT_N  # columns of a Stream-K piece (aligned)
    SUBS: tl.constexpr = SK_SPLIT_M * SK_SPLIT_N  # pieces a Stream-K tile
    pieces = sk_tiles * SUBS  # Stream-K pieces (aligned)
    if EDGE_FIRST:  # a ragged tile has only the pieces that reach into C (Plan.sk_pieces)
        pieces = (sk_tiles - sk_edge) * SUBS + sk_edge * SK_SPLIT_M * edge_cols
    num_tiles = num_pid_m * num_pid_n
    if PHASE_TIMES:
        t_start = _now(pid)
        t_mac = t_start
    if DP_FIRST:
        _dp_tiles(a_ref, b_ref, c_ref, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, sk_tiles + pid, num_tiles, grid, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                  USE_TMA, A_COL_MAJOR, B_COL_MAJOR, EPILOGUE_SUBTILE, FLATTEN, EVEN_K, INT64,
                  HINTS=STRIDE_HINTS, EDGE_FIRST=EDGE_FIRST, A_REGS=A_REGS)
    if pid < sk_programs:
        if ALIGNED:
            # ---- Stream-K region: each tile cut into SUBS pieces of SK_BM x SK_BN, each
            # piece into sk_chunks equal K-chunks; unit u is chunk u // pieces of piece
            # u % pieces, so the programs running at the same time work at the same K offsets
            # and share operand panels in the L2. Piece v is piece v % SUBS of tile v // SUBS
            # (_piece_coords): its partial is 1/SUBS of a tile, and so is every fixup transfer
            # below (partials, arrival counters and slots are a piece's).
            for u in range(pid, pieces * sk_chunks, grid):
                v = u % pieces
                chunk = u // pieces
                k0 = chunk * iters // sk_chunks
                k1 = (chunk + 1) * iters // sk_chunks
                pid_m, pid_n = _piece_coords(v, num_pid_m, num_pid_n, sk_edge, edge_cols, GROUP_M,
                                             SK_SPLIT_M, SK_SPLIT_N, EDGE_FIRST)
                acc = _mac(a_sk_ref, b_sk_ref, stride_am, stride_ak, stride_bk, stride_bn, M, N, K,
                           pid_m, pid_n, k0, k1, SK_BM, SK_BN, BLOCK_K, EVEN_K, INT64,
                           USE_TMA, A_COL_MAJOR, B_COL_MAJOR, HINTS=STRIDE_HINTS, STAGES=SK_STAGES,
                           A_REGS=A_REGS)
                if PHASE_TIMES:
                    t_mac = _now(pid)
                if sk_chunks == 1:
                    if SUBS == 1:
                        _store_whole(c_ref, c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, acc,
                                     BLOCK_M, BLOCK_N, INT64, USE_TMA, EPILOGUE_SUBTILE)
                    else:  # C's descriptor has whole-tile boxes: store the piece by pointer
                        store_tile(c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, acc, SK_BM, SK_BN, INT64)
                else:
                    # Cooperative fixup, step 1: hand in the partial (its own slot, or added
                    # into the piece's fp32 sum) and count the arrival in the piece's word
                    # (arrivals in the low 16 bits, claims above; step 2 after the
                    # data-parallel tiles). The final arrival owes the slices of the programs
                    # that claimed before it (they found partials missing).
                    if TMA_HAND_IN:
                        _write_partial_tma(acc, ws_ref, u, v, SK_BM, SK_BN, HAND_IN_STRIPS, DETERMINISTIC)
                    else:
                        _write_partial(acc, ws_ptr, u, v, SK_BM, SK_BN, DETERMINISTIC, INT64)
                    _arrive_aligned(ws_ptr, counter_ptr, c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n,
                                    v, pieces, sk_chunks, SK_BM, SK_BN, FIXUP_ROWS, INT64,
                                    DETERMINISTIC, TMA_HAND_IN and BULK_WAIT, HELPERS)
        else:
            # ---- Stream-K program: iterations [my_start, end) of the region, tile by tile.
            # Programs start at staggered K offsets: Nsight Compute on sm_90
            # (1664x1408x8192, all Stream-K, 128x256 tiles) saw the tensor pipe busy 64% of
            # the time against 95% in data-parallel tiles, with 2.7x the compulsory DRAM
            # traffic: concurrent programs rarely share an operand panel in the L2 (the
            # aligned layout above is the answer to that).
            my_start = _sk_start(pid, sk_q, sk_r)
            end = _sk_start(pid + 1, sk_q, sk_r)
            for tile_id in range(my_start // iters, (end + iters - 1) // iters):
                tile_start = tile_id * iters
                k0 = tl.maximum(my_start, tile_start) - tile_start
                k1 = tl.minimum(end, tile_start + iters) - tile_start
                pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
                acc = _mac(a_ref, b_ref, stride_am, stride_ak, stride_bk, stride_bn, M, N, K,
                           pid_m, pid_n, k0, k1, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INT64,
                           USE_TMA, A_COL_MAJOR, B_COL_MAJOR, HINTS=STRIDE_HINTS, A_REGS=A_REGS)
                if PHASE_TIMES:
                    t_mac = _now(pid)
                if k1 - k0 == iters:
                    # the whole tile is ours
                    _store_whole(c_ref, c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, acc,
                                 BLOCK_M, BLOCK_N, INT64, USE_TMA, EPILOGUE_SUBTILE)
                else:
                    # Split tile: contributors are programs first..last. `first` owns the
                    # tile's first iteration and is unique to this tile, so it is the key.
                    first = _sk_owner(tile_start, sk_q, sk_r)
                    last = _sk_owner(tile_start + iters - 1, sk_q, sk_r)
                    my_slot = _slot(pid, tile_start, sk_q, sk_r)
                    _hand_in_partial(acc, ws_ptr, counter_ptr, c_ptr, stride_cm, stride_cn, M, N,
                                     pid_m, pid_n, my_slot, first, first, last, tile_start, sk_q, sk_r,
                                     BLOCK_M, BLOCK_N, DETERMINISTIC, FIXUP_ROWS, INT64)
    if PHASE_TIMES:
        t_sk = _now(pid)
    if not DP_FIRST:
        _dp_tiles(a_ref, b_ref, c_ref, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                  stride_cm, stride_cn, sk_tiles + pid, num_tiles, grid, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M,
                  USE_TMA, A_COL_MAJOR, B_COL_MAJOR, EPILOGUE_SUBTILE, FLATTEN, EVEN_K, INT64,
                  HINTS=STRIDE_HINTS, EDGE_FIRST=EDGE_FIRST, A_REGS=A_REGS)
    if PHASE_TIMES:
        t_dp = _now(pid)
    if ALIGNED and HELPERS:
        if pid >= sk_programs:
            # Helper claims: a program without Stream-K work takes pieces pid - sk_programs,
            # + helpers, ... whole (one claim of every slice), after its data-parallel tiles,
            # which began while the contributors were still in the Stream-K phase, so every
            # partial is normally in; if not, the final arrival sums the piece instead. All
            # claims first, then the read-outs: a claim's release waits for this program's
            # earlier writes, so claiming between read-outs would wait for each one's stores
            # (a helper took ~5.5 us a 64 KB piece that way, sm_90). The host keeps
            # a helper's pieces within the 32 bits of `found`.
            helpers = grid - sk_programs
            mine = tl.cdiv(pieces - (pid - sk_programs), helpers)  # pieces pid - sk_programs + j helpers
            found = 0
            for j in range(mine):
                v = pid - sk_programs + j * helpers
                word = tl.atomic_add(counter_ptr + v, sk_chunks << 16, sem="acq_rel")
                found |= ((word & 0xFFFF) == sk_chunks).to(tl.int32) << j
            for j in range(mine):
                if (found >> j) & 1:
                    v = pid - sk_programs + j * helpers
                    pid_m, pid_n = _piece_coords(v, num_pid_m, num_pid_n, sk_edge, edge_cols, GROUP_M,
                                                 SK_SPLIT_M, SK_SPLIT_N, EDGE_FIRST)
                    _reduce_rows(ws_ptr, c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n,
                                 v, pieces, sk_chunks, 0, SK_BM, SK_BM, SK_BN, HELPER_ROWS, INT64,
                                 DETERMINISTIC)
                    tl.atomic_xchg(counter_ptr + v, 0, sem="relaxed")
    elif ALIGNED:  # noqa: SIM102  (compile-time test around a run-time one)
        if pid < sk_programs and sk_chunks > 1:
            # Cooperative fixup, step 2: claim a slice of each split tile this program worked
            # on. With every partial in (the usual case by now) the k-th claimer sums slice k,
            # so S contributors share the reduction instead of one program reading all S
            # partials (a 12-way split 128x128 tile: ~18 us on one SM, sm_90). A
            # claim that finds partials missing leaves its slice to the final arrival, so no
            # program ever waits for another (and the interpreter, one program at a time,
            # gets the last-arriver fixup). The last claimer clears the word. The claims take
            # 4-5 us a program on the tail shapes (sm_90): every program claims at
            # once; an acquire-only claim was no faster.
            for u in range(pid, pieces * sk_chunks, grid):
                v = u % pieces
                pid_m, pid_n = _piece_coords(v, num_pid_m, num_pid_n, sk_edge, edge_cols, GROUP_M,
                                             SK_SPLIT_M, SK_SPLIT_N, EDGE_FIRST)
                word = tl.atomic_add(counter_ptr + v, 1 << 16, sem="acq_rel")
                k = word >> 16
                if (word & 0xFFFF) == sk_chunks:
                    _reduce_rows(ws_ptr, c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n,
                                 v, pieces, sk_chunks, k * SK_BM // sk_chunks,
                                 (k + 1) * SK_BM // sk_chunks, SK_BM, SK_BN, SLICE_ROWS, INT64,
                                 DETERMINISTIC)
                if k == sk_chunks - 1:
                    tl.atomic_xchg(counter_ptr + v, 0, sem="relaxed")
    if PHASE_TIMES:
        t_end = _now(pid)
        tl.store(times_ptr + PHASES * pid, t_start)
        tl.store(times_ptr + PHASES * pid + 1, t_mac)
        tl.store(times_ptr + PHASES * pid + 2, t_sk)
        tl.store(times_ptr + PHASES * pid + 3, t_dp)
        tl.store(times_ptr + PHASES * pid + 4, t_end)


# --------------------------------------------------------------------------------------------
# Host launcher
# --------------------------------------------------------------------------------------------


def _interpreted(kernel) -> bool:
    """Whether `kernel` runs under the CPU interpreter (decided when the module was imported,
    as Triton does; the sm_90 compile check sets TRITON_INTERPRET later, for its CPU tensors,
    and must still compile the GPU code)."""
    return not isinstance(kernel, triton.runtime.JITFunction)


def matmul(a: torch.Tensor, b: torch.Tensor, config: Config | None = None, *,
           out: torch.Tensor | None = None, phase_times: torch.Tensor | None = None) -> torch.Tensor:
    """C = a @ b with the Stream-K schedule. a: (M, K), b: (K, N), fp16/bf16/fp32, any strides
    (TMA configs: see persistent_gemm's caveats). Returns `out` (filled) when given, else a new
    (M, N) tensor in a's dtype. Bit-reproducible when config.deterministic (the default). With
    config=None, misfit tensors are staged for TMA where that pays, else TMA is dropped; an
    explicit use_tma=True config raises ValueError instead unless it is `staged`. `phase_times` (diagnosis, GPU only): an int64 tensor of
    at least PHASES x grid elements that receives each program's %globaltimer stamps (start,
    last Stream-K MAC loop done, Stream-K work done incl. hand-in, data-parallel tiles done,
    end after the fixup claims) in nanoseconds."""
    # input checks; fp32 with a strided K: a pointer-load config feeds a strided A through
    # registers and swaps a strided B into A's place (as dp and split-K), TMA configs copy it
    # K-major where that pays (tf32_layout); the output; a call like one before: its launches
    # again (not a diagnostic call with phase_times)
    call = begin("stream_k", matmul, a, b, config, out, registers=config is not None and not config.use_tma,
                 replayable=phase_times is None, phase_times=phase_times)
    result = c = call.c
    if call.done:
        return result
    M, N, K, a, b, key = call.M, call.N, call.K, call.a, call.b, call.key
    sms = num_sms(a.device)
    config, layouts, a, b, c, staged_out, key = resolve_tma(config, default_config, check_smem, sms, a, b, c, key)
    plan = plan_schedule(M, N, K, config, sms)
    piece_elems = config.sk_block_m * config.sk_block_n  # the fixup's unit: a Stream-K piece
    fresh_ws = plan.split_tiles and config.deterministic
    ws_numel = (plan.partial_slots if fresh_ws else plan.fixup_keys if plan.split_tiles else 0) * piece_elems
    rec = Recorder(key, functools.partial(_live, max(1, plan.fixup_keys), max(1, ws_numel), fresh_ws), a, b, c)
    ws, counters = rec.live[3:]
    if config.use_tma:
        a_arg, b_arg, c_arg, a_col, b_col = tma_descriptors(a, b, c, M, N, K, config, layouts)
        a_sk, b_sk = a_arg, b_arg
        if config.SK_SPLIT_M > 1 or config.SK_SPLIT_N > 1:  # the pieces' A and B boxes
            piece = replace(config, BLOCK_M=config.sk_block_m, BLOCK_N=config.sk_block_n, SK_SPLIT_M=1,
                            SK_SPLIT_N=1, EPILOGUE_SUBTILE=False)
            a_sk, b_sk = tma_descriptors(a, b, c, M, N, K, piece, layouts)[:2]
    else:
        a_arg, b_arg, c_arg, a_col, b_col = a, b, c, False, False
        a_sk, b_sk = a, b
    ws_arg, strips = ws, 1
    if config.tma_hand_in and plan.split_tiles:
        # the workspace as rows of a piece's width in fp32, one box a piece's strip (slot or sum)
        strips = hand_in_strips(config, a.dtype)
        width = config.sk_block_n
        ws_arg = TensorDescriptor(ws, [ws.numel() // width, width], [width, 1],
                                  [config.sk_block_m, width // strips])
        fix_interpreter_descriptor_reduce()
    if phase_times is not None and (phase_times.dtype != torch.int64 or phase_times.numel() < PHASES * plan.grid
                                    or not phase_times.is_cuda):
        raise ValueError(f"phase_times must be a CUDA int64 tensor of >= {PHASES * plan.grid} elements")
    rec.launch(stream_k_gemm_kernel, (plan.grid,),
        a_arg, b_arg, c_arg, a_sk, b_sk, ws_arg,
        c, ws, counters, c if phase_times is None else phase_times,
        M, N, K,
        *a.stride(), *b.stride(), *c.stride(),
        plan.sk_programs, plan.sk_tiles, plan.sk_iters_per_program, plan.sk_extra, plan.chunks,
        plan.edge_tiles, max(1, plan.edge_cols),
        BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K, GROUP_M=config.GROUP_M,
        ALIGNED=config.aligned, DETERMINISTIC=config.deterministic, SK_SPLIT_M=config.SK_SPLIT_M,
        SK_SPLIT_N=config.SK_SPLIT_N, SK_STAGES=config.SK_STAGES, EDGE_FIRST=plan.edge_tiles > 0,
        FIXUP_ROWS=fixup_rows(config.sk_block_m, config.sk_block_n),
        SLICE_ROWS=slice_rows(config.sk_block_m, config.sk_block_n, plan.chunks),
        USE_TMA=config.use_tma, A_COL_MAJOR=a_col, B_COL_MAJOR=b_col,
        EPILOGUE_SUBTILE=config.EPILOGUE_SUBTILE, FLATTEN=config.FLATTEN,
        EVEN_K=K % config.BLOCK_K == 0,
        INT64=needs_int64_offsets(a, b, c, ws),
        DP_FIRST=config.dp_first, TMA_HAND_IN=config.tma_hand_in and plan.split_tiles,
        HAND_IN_STRIPS=strips,
        HELPERS=uses_helpers(config, plan),
        HELPER_ROWS=helper_rows(config),
        BULK_WAIT=not _interpreted(stream_k_gemm_kernel), STRIDE_HINTS=stride_hints(a, b),
        A_REGS=not config.use_tma and a_through_registers(a),
        PHASE_TIMES=phase_times is not None,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    rec.commit()
    if staged_out:
        result.copy_(c)
    return result


def _live(counter_count: int, ws_numel: int, fresh_ws: bool, a, b, c) -> tuple:
    """A call's live tensors: a, b, c, then the fixup's workspace and arrival counters (the
    counters and atomic sums from the zeroed pool; deterministic partial slots fresh). Without
    split tiles the fixup code never runs, but the compiler still type-checks it: the
    placeholders must be int32 counters and fp32 partials (C as a placeholder failed to compile
    for sm_90, while the interpreter, which skips untaken branches, ran it)."""
    counters = SCRATCH.get("stream_k_counters", counter_count, torch.int32, a.device)
    if fresh_ws:
        ws = torch.empty(ws_numel, dtype=torch.float32, device=a.device)
    else:
        ws = SCRATCH.get("stream_k_sums", ws_numel, torch.float32, a.device)
    return a, b, c, ws, counters


if __name__ == "__main__":
    if os.environ.get("TRITON_INTERPRET") == "1":
        for policy in POLICIES:
            self_check(matmul, [(70, 50, 80)], config=Config(16, 16, 16, 2, 4, 1, policy, True))
        self_check(matmul, [(70, 50, 80)], config=Config(16, 16, 16, 2, 4, 1, "hybrid1", False))
    else:
        self_check(matmul, [(37, 53, 97), (1664, 1408, 1024), (2176, 2176, 512)])
        for policy in POLICIES:
            for deterministic in (True, False):
                def run(a, b, policy=policy, deterministic=deterministic):
                    cfg = default_config(a.shape[0], b.shape[1], a.shape[1], a.dtype, num_sms(a.device))
                    return matmul(a, b, replace(cfg, policy=policy, deterministic=deterministic))

                print(f"policy={policy} deterministic={deterministic}")
                self_check(run, [(1664, 1408, 1024)])
