"""Stream-K's fixup: how a tile split between programs is summed and stored.

Device functions of kernels/stream_k_gemm.py's kernel (the module docstring there tells the
story). A contributor hands its fp32 partial in (its own workspace slot, or added into the
tile's running sum), then counts its arrival in the tile's word; nobody ever waits for
another program. Contiguous ranges: the last arriver sums every partial and stores the
tile. Aligned K-chunks: the contributors claim row slices after their data-parallel tiles
(the cooperative fixup), and the final arrival sums the slices of claimers that came early.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .dp_gemm import store_block


@triton.jit
def _sk_start(program, q, r):
    """First Stream-K iteration of a program (the first r programs own q + 1 iterations)."""
    return program * q + tl.minimum(program, r)


@triton.jit
def _sk_owner(it, q, r):
    """Stream-K program that owns iteration `it`."""
    big = r * (q + 1)
    return tl.where(it < big, it // (q + 1), r + (it - big) // tl.maximum(q, 1))


@triton.jit
def _slot(j, tile_start, sk_q, sk_r):
    """Workspace slot of contiguous-range program j's partial of the split tile starting at
    iteration tile_start: slot 2j holds the tile where j's range starts, 2j + 1 the one where
    it ends. (The aligned layout's slot is its unit number.)"""
    return 2 * j + (_sk_start(j, sk_q, sk_r) < tile_start).to(tl.int32)


@triton.jit
def _halves(x, BLOCK_M: tl.constexpr, H: tl.constexpr):
    """The left and right H columns of a BLOCK_M x 2H block."""
    return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, H)), (0, 2, 1)))


@triton.jit
def _write_partial(acc, ws_ptr, slot, key, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                   DETERMINISTIC: tl.constexpr, INT64: tl.constexpr):
    """Hand in a split tile's partial: into workspace slot `slot`, or added into the tile's
    fp32 sum at `key`, by every thread for its own elements. Nobody may read it before
    `_count_arrival` has published it."""
    TILE: tl.constexpr = BLOCK_M * BLOCK_N
    local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    if INT64:
        local = local.to(tl.int64)
    if DETERMINISTIC:
        tl.store(ws_ptr + (slot * TILE + local), acc)
    else:
        tl.atomic_add(ws_ptr + (key * TILE + local), acc, sem="relaxed")


@triton.jit
def _write_partial_tma(acc, ws_ref, slot, key, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                       STRIPS: tl.constexpr, DETERMINISTIC: tl.constexpr):
    """The same hand-in as bulk TMA operations: the partial is staged in shared memory and the
    TMA unit stores it into slot `slot` or reduce-adds it into the sum at `key` (ws_ref: the
    workspace as rows of BLOCK_N fp32, boxes of one piece's rows and BLOCK_N / STRIPS
    columns). STRIPS column strips (1, 2, 4 or 8, `hand_in_strips`): the staging buffer comes
    on top of the kernel's others (the sm_90 compile check: a whole 128x128 fp32 partial took
    the 5-stage kernel from 192 to 256 KB), so big partials go in narrower strips. Where
    per-thread writes issue one scalar fp32 atomic an element (Triton 3.6 on sm_90), this is
    a few bulk instructions; only their completion, which `_count_arrival` waits for, takes
    time."""
    row = (slot if DETERMINISTIC else key) * BLOCK_M
    if STRIPS == 1:
        _tma_put(ws_ref, row, 0, acc, DETERMINISTIC)
    else:
        H: tl.constexpr = BLOCK_N // 2
        left, right = _halves(acc, BLOCK_M, H)
        _put_half(ws_ref, row, 0, left, BLOCK_M, H, STRIPS // 2, DETERMINISTIC)
        _put_half(ws_ref, row, H, right, BLOCK_M, H, STRIPS // 2, DETERMINISTIC)


@triton.jit
def _put_half(ws_ref, row, col, x, BLOCK_M: tl.constexpr, W: tl.constexpr, STRIPS: tl.constexpr,
              DETERMINISTIC: tl.constexpr):
    """Columns [col, col + W) of a partial in STRIPS (1, 2 or 4) strips."""
    if STRIPS == 1:
        _tma_put(ws_ref, row, col, x, DETERMINISTIC)
    else:
        H: tl.constexpr = W // 2
        left, right = _halves(x, BLOCK_M, H)
        if STRIPS == 2:
            _tma_put(ws_ref, row, col, left, DETERMINISTIC)
            _tma_put(ws_ref, row, col + H, right, DETERMINISTIC)
        else:
            Q: tl.constexpr = H // 2
            q0, q1 = _halves(left, BLOCK_M, Q)
            q2, q3 = _halves(right, BLOCK_M, Q)
            _tma_put(ws_ref, row, col, q0, DETERMINISTIC)
            _tma_put(ws_ref, row, col + Q, q1, DETERMINISTIC)
            _tma_put(ws_ref, row, col + 2 * Q, q2, DETERMINISTIC)
            _tma_put(ws_ref, row, col + 3 * Q, q3, DETERMINISTIC)


@triton.jit
def _tma_put(ws_ref, row, col, x, DETERMINISTIC: tl.constexpr):
    if DETERMINISTIC:
        ws_ref.store([row, col], x)
    else:
        ws_ref.atomic_add([row, col], x)


@triton.jit
def _bulk_writes_done(x):
    """Wait until this thread's bulk (TMA) writes are complete in global memory, and order
    them before its later generic-proxy accesses. Triton's own wait after a TMA store or
    reduction (cp.async.bulk.wait_group.read) only waits until the shared-memory source has
    been read; a release after that alone would not publish the data. `x` only gives the asm
    an operand; GPU only (the interpreter writes at once and has no inline asm)."""
    return tl.inline_asm_elementwise(
        "cp.async.bulk.wait_group 0;\n\tfence.proxy.async.global;\n\tmov.u32 $0, $1;",
        "=r,r", [x], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _count_arrival(counter_ptr, key, BULK_WAIT: tl.constexpr = False):
    """Publish this program's partials written so far and count its arrival in the tile's
    word at `key`; returns the word as it was before. BULK_WAIT: the partials were written by
    TMA, so wait for their completion first."""
    if BULK_WAIT:
        _bulk_writes_done(key)
    # all threads' partials are written before the block announces itself. (Counting the
    # arrival after the first data-parallel tile instead, so that the writes complete
    # meanwhile, was measured no faster, for per-thread and for bulk writes alike: every
    # program hands in at once and the L2 takes the partials at ~2.4 TB/s, sm_90,
    # experiments/results/probe_configs/README.md.)
    tl.debug_barrier()
    return tl.atomic_add(counter_ptr + key, 1, sem="acq_rel")


@triton.jit
def _publish_partial(acc, ws_ptr, counter_ptr, slot, key, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     DETERMINISTIC: tl.constexpr, INT64: tl.constexpr):
    """Hand in a split tile's partial (into workspace slot `slot`, or added into the tile's
    fp32 sum at `key`) and count the arrival in the tile's word at `key`; returns the word as
    it was before this arrival. Both fixups (last-arriver and cooperative) start with this."""
    _write_partial(acc, ws_ptr, slot, key, BLOCK_M, BLOCK_N, DETERMINISTIC, INT64)
    return _count_arrival(counter_ptr, key)


@triton.jit
def _arrive_aligned(
    ws_ptr, counter_ptr, c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, v, pieces, sk_chunks,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, FIXUP_ROWS: tl.constexpr, INT64: tl.constexpr,
    DETERMINISTIC: tl.constexpr, BULK_WAIT: tl.constexpr, HELPERS: tl.constexpr,
):
    """Cooperative fixup, arrival at piece v: count it in the piece's word (arrivals in the
    low 16 bits, claims above). The final arrival owes the slices of the programs that claimed
    before it (they found partials missing) and sums them: rows 0 .. owed x BLOCK_M / chunks,
    FIXUP_ROWS at a time (slice by slice, a 132-chunk tile of 1-row slices took ~1 ms when
    no data-parallel tile delayed the claims). HELPERS: the one claim, a helper's, was of
    every slice, so the final arrival sums the whole piece and, being the last to touch the
    word, clears it."""
    word = _count_arrival(counter_ptr, v, BULK_WAIT)
    owed = word >> 16
    if (word & 0xFFFF) == sk_chunks - 1 and owed > 0:
        _reduce_rows(ws_ptr, c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n,
                     v, pieces, sk_chunks, 0, owed * BLOCK_M // sk_chunks,
                     BLOCK_M, BLOCK_N, FIXUP_ROWS, INT64, DETERMINISTIC)
        if HELPERS:
            tl.atomic_xchg(counter_ptr + v, 0, sem="relaxed")


@triton.jit
def _hand_in_partial(
    acc, ws_ptr, counter_ptr, c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n,
    my_slot, key, j_first, j_last, tile_start, sk_q, sk_r,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    DETERMINISTIC: tl.constexpr, FIXUP_ROWS: tl.constexpr, INT64: tl.constexpr,
):
    """Last-arriver fixup (contiguous ranges) of a split tile whose contributors are programs
    j_first..j_last: hand in this program's partial; the last to arrive sums all partials and
    stores the tile. `key` is unique to the
    tile: it indexes the tile's arrival counter (and, for atomic sums, its sum buffer)."""
    TILE: tl.constexpr = BLOCK_M * BLOCK_N
    arrived = _publish_partial(acc, ws_ptr, counter_ptr, my_slot, key, BLOCK_M, BLOCK_N, DETERMINISTIC, INT64)
    if arrived == j_last - j_first:
        # Last arriver: every contributor's partial is visible (read via L2, .cg). Summed
        # FIXUP_ROWS rows at a time, so the sum and the loaded partial need no more
        # registers than the main loop's accumulator.
        for r0 in tl.static_range(0, BLOCK_M, FIXUP_ROWS):
            rows = (r0 + tl.arange(0, FIXUP_ROWS))[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
            if INT64:
                rows = rows.to(tl.int64)
            if DETERMINISTIC:
                total = tl.zeros((FIXUP_ROWS, BLOCK_N), dtype=tl.float32)
                # Contributor order: same bits every run. num_stages makes Triton stream the
                # partials through shared memory (cp.async, up to 3 in flight). Measured on the
                # sm_90: four independent loads a step over smaller row blocks made
                # the fixup slower (a 12-way split 128x128 tile: 78 -> 86 us for the GEMM).
                for j in tl.range(j_first, j_last + 1, num_stages=4):
                    slot = _slot(j, tile_start, sk_q, sk_r)
                    total += tl.load(ws_ptr + (slot * TILE + rows), cache_modifier=".cg")
            else:
                # Take the sum out and leave zeros for the next launch in ONE atomic exchange
                # per element (as int32 bits: the interpreter has no float exchange). A load
                # then a store of zeros raced on sm_90: Triton gave them different thread
                # layouts, so an element could be zeroed before the thread that reads it had
                # loaded it.
                bits = ws_ptr.to(tl.pointer_type(tl.int32)) + (key * TILE + rows)
                total = tl.atomic_xchg(bits, tl.zeros((FIXUP_ROWS, BLOCK_N), dtype=tl.int32),
                                       sem="relaxed").to(tl.float32, bitcast=True)
            store_block(c_ptr, stride_cm, stride_cn, M, N, pid_m * BLOCK_M + r0, pid_n * BLOCK_N,
                        total, FIXUP_ROWS, BLOCK_N, INT64)
        tl.store(counter_ptr + key, 0)  # ready for the next launch


@triton.jit
def _reduce_rows(
    ws_ptr, c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, tile_id, sk_tiles, chunks, r_lo, r_hi,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, ROWS: tl.constexpr, INT64: tl.constexpr,
    DETERMINISTIC: tl.constexpr,
):
    """Cooperative fixup, aligned layout: rows [r_lo, r_hi) of a split tile, ROWS at a time,
    stored in C (a claim's slice k is rows [k BLOCK_M / chunks, (k + 1) BLOCK_M / chunks)).
    Deterministic: summed over the tile's `chunks` partials in chunk order (same bits
    whoever does it); three partial slices in flight (cp.async): 7 or 12 were no faster on
    sm_90, nor were partials stored with an L2 evict_last hint
    (experiments/results/probe_configs/README.md): all programs claim at once, so the ~4-5 us of
    claims go to reading the region's partials (64 KB a program), not to load latency.
    Atomic: taken out of the tile's fp32 running sum (1/chunks of a tile a claim), zeros
    stored back for the next launch."""
    TILE: tl.constexpr = BLOCK_M * BLOCK_N
    for r0 in range(r_lo, r_hi, ROWS):
        rows = r0 + tl.arange(0, ROWS)
        offs = rows[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        if INT64:
            offs = offs.to(tl.int64)
        in_slice = (rows < r_hi)[:, None]
        if DETERMINISTIC:
            total = tl.zeros((ROWS, BLOCK_N), dtype=tl.float32)
            for c in tl.range(0, chunks, num_stages=4):
                total += tl.load(ws_ptr + ((c * sk_tiles + tile_id) * TILE + offs), mask=in_slice,
                                 other=0.0, cache_modifier=".cg")
        else:
            # A load, then zeros stored in its place. The barrier keeps a thread's store from
            # landing before another thread's load of the same element (Triton may lay the two
            # out differently, which raced on sm_90 in the last-arriver read-out).
            sums = ws_ptr + (tile_id * TILE + offs)
            total = tl.load(sums, mask=in_slice, other=0.0, cache_modifier=".cg")
            tl.debug_barrier()
            tl.store(sums, tl.zeros((ROWS, BLOCK_N), dtype=tl.float32), mask=in_slice)
        store_block(c_ptr, stride_cm, stride_cn, tl.minimum(M, pid_m * BLOCK_M + r_hi), N,
                    pid_m * BLOCK_M + r0, pid_n * BLOCK_N, total, ROWS, BLOCK_N, INT64)

