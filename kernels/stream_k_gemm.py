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
from dataclasses import asdict, dataclass, replace

import torch
import triton
import triton.language as tl

from .common import (
    SCRATCH,
    SMEM_PER_BLOCK_SM90,
    cdiv,
    fix_interpreter_descriptor_reduce,
    gemm_launch_metadata,
    needs_int64_offsets,
    num_sms,
    pipeline_smem_bytes,
    self_check,
    stride_hints,
)
from .dp_gemm import (
    _next_pow2,
    check_block_config,
    check_smem,
    fits_shape,
    for_dtype,
    mac_loop,
    store_block,
    store_tile,
    tile_coords,
)
from .gemm_call import begin
from .runtime import Recorder
from .persistent_gemm import (
    TensorDescriptor,
    check_staged,
    stage_for_tma,
    staging_pays,
    tma_descriptors,
    tma_or_pointer_loads,
    tma_shape_ok,
    tma_step,
)
from .tf32_layout import a_through_registers

POLICIES = ("dp", "sk", "hybrid1", "hybrid2", "hybrid3", "hybrid4")
PHASES = 5  # phase_times stamps a program: start, Stream-K MAC done, hand-in done, dp done, end


# --------------------------------------------------------------------------------------------
# Knobs and the schedule they imply
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Config:
    """Every knob of the Stream-K schedule."""

    BLOCK_M: int = 128
    BLOCK_N: int = 128
    BLOCK_K: int = 64
    GROUP_M: int = 8
    num_warps: int = 4
    num_stages: int = 4
    policy: str = "hybrid2"  # "dp" | "sk" | "hybrid1".."hybrid4" (module docstring)
    deterministic: bool = True  # fixed-order fixup (True) or atomic partial sums (False)
    aligned: bool = False  # Stream-K region as equal K-chunks a tile (True) or contiguous ranges
    use_tma: bool = False  # tensor-descriptor (TMA) loads and stores instead of pointer loads
    EPILOGUE_SUBTILE: bool = False  # TMA only: store C tiles as two BLOCK_N/2-wide halves
    FLATTEN: bool = False  # flatten the data-parallel tile loop and its K loop for the pipeliner
    dp_first: bool = False  # data-parallel tiles before the Stream-K work (measured slower, see TMA_POINTS)
    # aligned only: cut each Stream-K tile into SK_SPLIT_M x SK_SPLIT_N pieces of BLOCK_M /
    # SK_SPLIT_M rows and BLOCK_N / SK_SPLIT_N columns before its K-chunks, so a split tile's
    # partials (handed in, then read by the claims) are that fraction of a tile each, or, where
    # the pieces fill no more than one round of programs, the region needs no K-chunks and no
    # fixup at all: a round of smaller data-parallel pieces (measured: TMA_POINTS)
    SK_SPLIT_M: int = 1
    # aligned + TMA only: hand in a split piece's partial as one bulk TMA operation from shared
    # memory (a reduce-add into the piece's fp32 sum, or a store into its slot) instead of
    # per-thread atomics or stores; the arrival then waits for the bulk write to complete
    tma_hand_in: bool = False
    # aligned only: where the plan leaves programs without Stream-K work ("helpers", e.g. 12
    # of 132 on 3072^2x4096 with 128x256 tiles), they claim the split pieces whole after
    # their data-parallel tiles, instead of every contributor claiming a slice of each at the
    # end: the helpers, spared the Stream-K phase, finish it early anyway. No helpers: the
    # contributors' cooperative claims as without it.
    helper_claims: bool = False
    SK_SPLIT_N: int = 1  # column pieces (see SK_SPLIT_M)
    # aligned only: never cut the Stream-K pieces into K-chunks: the region runs as rounds of
    # whole pieces, each stored directly, with no fixup (aligned_chunks would otherwise pick
    # the chunks that balance the MAC work best, and a fixup on top)
    whole_pieces: bool = False
    # aligned + TMA only: pipeline depth of the Stream-K MAC loop (0: num_stages). A piece's
    # loop reads little a step, so it needs more steps in flight than the big tile's 3-4
    # stages allow: 64x128 pieces of 128x256 tiles took 26.5 us at 3 stages, 19-20 at 4 and
    # 16-17 with SK_STAGES 5-6 for a 4096-deep K (H200,
    # experiments/probes/tail_quarter_pieces*.json)
    SK_STAGES: int = 0
    # aligned only: where N leaves the last tile column ragged, that column's tiles come first
    # in the tile order, so they fall in the Stream-K region, and with SK_SPLIT_N their column
    # pieces that lie wholly right of N are dropped from the region instead of computing zeros.
    # A 128x256 tile over the 128 columns 2176 = 8 x 256 + 128 leaves is then one 128x128 piece:
    # the region of 2176^2 (21 tiles) holds 12.5 tiles' work instead of 21, that of 4224^2
    # (the 33 ragged tiles) 16.5 instead of 33; the data-parallel tiles are all whole
    edge_first: bool = False
    # TMA only: operands TMA cannot read are copied into 16-byte aligned buffers first, and C
    # is computed in one when TMA cannot store into it (persistent_gemm.stage_for_tma)
    staged: bool = False

    def __post_init__(self):
        check_block_config(self)
        check_staged(self)
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r}: must be one of {POLICIES}")
        for name, block, side in (("SK_SPLIT_M", "BLOCK_M", "rows"), ("SK_SPLIT_N", "BLOCK_N", "columns")):
            split, size = getattr(self, name), getattr(self, block)
            if split not in (1, 2, 4):
                raise ValueError(f"{name}={split!r}: must be 1, 2 or 4")
            if split > 1 and not self.aligned:
                raise ValueError(f"{name} cuts the aligned layout's Stream-K tiles: it needs aligned=True")
            if size // split < 16:
                raise ValueError(f"{name}={split}: pieces of {block}={size} would have {size // split} "
                                 f"{side}, under the 16 tl.dot needs")
        for name in ("deterministic", "aligned", "use_tma", "EPILOGUE_SUBTILE", "FLATTEN", "dp_first",
                     "tma_hand_in", "helper_claims", "whole_pieces", "edge_first"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name}={getattr(self, name)!r}: must be a bool")
        if self.EPILOGUE_SUBTILE and not self.use_tma:
            raise ValueError("EPILOGUE_SUBTILE splits the TMA store: it needs use_tma=True")
        if not isinstance(self.SK_STAGES, int) or not 0 <= self.SK_STAGES <= 8:
            raise ValueError(f"SK_STAGES={self.SK_STAGES!r}: must be 0 (num_stages) or 1..8")
        if self.SK_STAGES and not (self.aligned and self.use_tma):
            raise ValueError("SK_STAGES deepens the aligned layout's TMA-fed Stream-K loop: it needs "
                             "aligned=True and use_tma=True")
        if self.whole_pieces and not self.aligned:
            raise ValueError("whole_pieces runs the aligned layout's Stream-K pieces unsplit: it needs aligned=True")
        if self.edge_first and not self.aligned:
            raise ValueError("edge_first orders the aligned layout's Stream-K region: it needs aligned=True")
        if self.helper_claims and not self.aligned:
            raise ValueError("helper_claims changes the aligned layout's cooperative fixup: it needs aligned=True")
        if self.tma_hand_in and not (self.aligned and self.use_tma):
            raise ValueError("tma_hand_in hands in the aligned layout's partials through TMA: it needs "
                             "aligned=True and use_tma=True")

    def smem_bytes(self, dtype: torch.dtype) -> int:
        """Pipeline buffers, plus C's staging tile where it cannot reuse them: the TMA store's
        source, or with FLATTEN the pointer store's layout-conversion scratch (the pipeline
        buffers then stay live across tiles; see persistent_gemm)."""
        elt = dtype.itemsize
        pipe = pipeline_smem_bytes(self.BLOCK_M, self.BLOCK_N, self.BLOCK_K, self.num_stages, elt)
        if self.SK_STAGES:  # the Stream-K loop's own buffers reuse the tiles' (sm_90 compile check)
            pipe = max(pipe, pipeline_smem_bytes(self.sk_block_m, self.sk_block_n, self.BLOCK_K, self.SK_STAGES, elt))
        staged = self.use_tma or self.FLATTEN
        c_tile = self.BLOCK_M * self.BLOCK_N * elt // (2 if self.EPILOGUE_SUBTILE else 1) if staged else 0
        # the TMA hand-in's staging strip for a piece's fp32 partial comes on top (sm_90
        # compile check; with SK_SPLIT_M the pieces' smaller pipeline sometimes leaves room)
        strip = self.sk_block_m * self.sk_block_n * 4 // hand_in_strips(self, dtype) if self.tma_hand_in else 0
        return pipe + c_tile + strip

    def describe(self) -> str:
        split = f" m/{self.SK_SPLIT_M}" if self.SK_SPLIT_M > 1 else ""
        split += f" n/{self.SK_SPLIT_N}" if self.SK_SPLIT_N > 1 else ""
        return (f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K} g{self.GROUP_M} w{self.num_warps} "
                f"s{self.num_stages} {self.policy}{' aligned' if self.aligned else ''}"
                f"{'' if self.deterministic else ' atomic'}{' tma' if self.use_tma else ''}"
                f"{' subtile' if self.EPILOGUE_SUBTILE else ''}{' flat' if self.FLATTEN else ''}"
                f"{' dpfirst' if self.dp_first else ''}{split}{' tmahand' if self.tma_hand_in else ''}"
                f"{' helpers' if self.helper_claims else ''}{' whole' if self.whole_pieces else ''}"
                f"{f' sks{self.SK_STAGES}' if self.SK_STAGES else ''}{' edge' if self.edge_first else ''}"
                f"{' staged' if self.staged else ''}")

    @property
    def sk_block_m(self) -> int:
        """Rows of a Stream-K piece: a tile's rows cut SK_SPLIT_M ways."""
        return self.BLOCK_M // self.SK_SPLIT_M

    @property
    def sk_block_n(self) -> int:
        """Columns of a Stream-K piece: a tile's columns cut SK_SPLIT_N ways."""
        return self.BLOCK_N // self.SK_SPLIT_N

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    """How a launch divides the work (pure function of shape, tile, policy and SM count)."""

    tiles: int  # output tiles
    iters_per_tile: int  # MAC-loop iterations (BLOCK_K steps) per tile
    sk_tiles: int  # tiles 0 .. sk_tiles-1 (grouped order) are in the Stream-K region
    sk_programs: int  # Stream-K programs (pids 0 .. sk_programs-1)
    sk_iters_per_program: int  # contiguous: q, each gets q iterations, the first r get q + 1
    sk_extra: int  # r
    chunks: int = 0  # aligned: K-chunks a Stream-K piece is cut into (0: contiguous ranges)
    num_sms: int = 0  # programs the data-parallel tiles are spread over (persistent loop)
    split_m: int = 1  # aligned: row pieces a Stream-K tile is cut into (Config.SK_SPLIT_M)
    split_n: int = 1  # aligned: column pieces a Stream-K tile is cut into (Config.SK_SPLIT_N)
    # aligned + edge_first: ragged last-column tiles at the head of the region (0: the plain
    # grouped order), and how many of their split_n column pieces hold part of C
    edge_tiles: int = 0
    edge_cols: int = 0

    @property
    def sk_pieces(self) -> int:
        """Units of the Stream-K region before K-chunking: its tiles, each cut into split_m x
        split_n pieces (aligned; a ragged edge tile only into the edge_cols columns that hold
        part of C), or its tiles (contiguous)."""
        whole = (self.sk_tiles - self.edge_tiles) * self.split_m * self.split_n
        return whole + self.edge_tiles * self.split_m * self.edge_cols

    @property
    def dp_tiles(self) -> int:
        return self.tiles - self.sk_tiles

    @property
    def grid(self) -> int:
        """Persistent grid: the Stream-K programs, and at most one program an SM for the
        data-parallel tiles (program p takes tiles sk_tiles + p, + grid, ...)."""
        return max(1, self.sk_programs, min(self.num_sms, self.dp_tiles))

    @property
    def split_tiles(self) -> bool:
        """Some tile is shared by several programs (so the fixup state is needed)."""
        return self.sk_programs > 0 and self.chunks != 1

    @property
    def fixup_keys(self) -> int:
        """Arrival counters (and atomic sum tiles) the fixup indexes: one a Stream-K piece
        (aligned), one a program (contiguous: keyed by the program owning a tile's start)."""
        return self.sk_pieces if self.chunks else self.sk_programs

    @property
    def partial_slots(self) -> int:
        """fp32 piece slots the deterministic fixup needs: one a unit (aligned), two a program
        (contiguous: where its range starts and where it ends)."""
        return self.sk_pieces * self.chunks if self.chunks else 2 * self.sk_programs

    def sk_range(self, program: int) -> tuple[int, int]:
        """[start, end) of a Stream-K program's iterations in the Stream-K region."""
        q, r = self.sk_iters_per_program, self.sk_extra
        start = program * q + min(program, r)
        return start, start + q + (1 if program < r else 0)

    def contributors(self, tile: int) -> int:
        """Stream-K programs that work on each piece of `tile` (1 = stored directly, no
        fixup)."""
        if tile >= self.sk_tiles:
            return 1
        if self.chunks:
            return self.chunks
        return self.owner((tile + 1) * self.iters_per_tile - 1) - self.owner(tile * self.iters_per_tile) + 1

    def owner(self, it: int) -> int:
        q, r = self.sk_iters_per_program, self.sk_extra
        big = r * (q + 1)
        return it // (q + 1) if it < big else r + (it - big) // q


def sk_tile_count(policy: str, tiles: int, num_sms: int) -> int:
    if policy == "dp":
        return 0
    if policy == "sk":
        return tiles
    extra_waves = int(policy[len("hybrid"):]) - 1
    return min(tiles, tiles % num_sms + extra_waves * num_sms)


MAX_ALIGNED_CHUNKS = 8  # beyond one round of units: more chunks, more partials, little gain


def aligned_chunks(sk_tiles: int, iters: int, num_sms: int) -> int:
    """K-chunks a Stream-K tile is cut into in the aligned layout. Up to half a wave of tiles:
    SMs // sk_tiles, so the units fill one round (11 tiles on 132 SMs: 12 chunks, 132 units).
    More tiles: the chunk count (1..8) whose rounds of units finish soonest, the makespan being
    ceil(sk_tiles x chunks / SMs) / chunks tiles (78 tiles: 5 chunks, 3 rounds, 0.6 of a tile
    a program instead of 1); ties go to fewer chunks (fewer partials to reduce). Never more
    chunks than K iterations."""
    if 2 * sk_tiles <= num_sms:
        return max(1, min(iters, num_sms // sk_tiles))
    best, best_span = 1, float(cdiv(sk_tiles, num_sms))
    for chunks in range(2, min(iters, MAX_ALIGNED_CHUNKS) + 1):
        span = cdiv(sk_tiles * chunks, num_sms) / chunks
        if span < best_span - 1e-9:
            best, best_span = chunks, span
    return best


def edge_region(M: int, N: int, config: Config, sk_tiles: int) -> tuple[int, int]:
    """(edge tiles, edge piece columns) of an edge_first region: where N leaves the last tile
    column ragged, its tiles (the region's first min(tile rows, sk_tiles)) and the number of
    the SK_SPLIT_N column pieces of such a tile that reach into C. (0, 0) otherwise: the plain
    grouped order."""
    num_pid_n = cdiv(N, config.BLOCK_N)
    if not (config.edge_first and sk_tiles and N % config.BLOCK_N and num_pid_n > 1):
        return 0, 0
    ragged = N - (num_pid_n - 1) * config.BLOCK_N
    return min(cdiv(M, config.BLOCK_M), sk_tiles), cdiv(ragged, config.sk_block_n)


@functools.lru_cache(maxsize=512)  # pure in its arguments; saves host time per call
def plan_schedule(M: int, N: int, K: int, config: Config, num_sms: int) -> Plan:
    """Contiguous: the region's sk_tiles x iters iterations split evenly over min(SMs,
    iterations) programs. Aligned: each region tile cut into SK_SPLIT_M x SK_SPLIT_N pieces and
    each piece into `aligned_chunks` equal K-chunks (one with whole_pieces); unit u (chunk
    u // pieces of piece u % pieces) goes to program u mod SMs. With edge_first the region
    starts with the ragged column's tiles and counts only their pieces that reach into C
    (`edge_region`), so the chunks follow the pieces that really run."""
    tiles = cdiv(M, config.BLOCK_M) * cdiv(N, config.BLOCK_N)
    iters = cdiv(K, config.BLOCK_K)
    sk_tiles = sk_tile_count(config.policy, tiles, num_sms)
    if config.aligned:
        edge, cols = edge_region(M, N, config, sk_tiles)
        plan = Plan(tiles, iters, sk_tiles, 0, 0, 0, 0, num_sms, config.SK_SPLIT_M, config.SK_SPLIT_N, edge, cols)
        pieces = plan.sk_pieces
        chunks = (1 if config.whole_pieces else aligned_chunks(pieces, iters, num_sms)) if sk_tiles else 0
        return replace(plan, sk_programs=min(num_sms, pieces * chunks), chunks=chunks)
    total = sk_tiles * iters
    programs = min(num_sms, total)
    q, r = divmod(total, programs) if programs else (0, 0)
    return Plan(tiles, iters, sk_tiles, programs, q, r, 0, num_sms)


def hand_in_strips(config: Config, dtype: torch.dtype) -> int:
    """Column strips (1, 2, 4 or 8) the TMA hand-in stages a piece's fp32 partial in: the
    fewest, at most a 64 KB strip, whose staging buffer fits beside the pipeline and C's
    staging tile in the 227 KB of shared memory (both stay allocated: sm_90 compile check);
    strips keep at least 16 columns."""
    piece = config.sk_block_m * config.sk_block_n * 4
    others = replace(config, tma_hand_in=False).smem_bytes(dtype)
    for strips in (1, 2, 4, 8):
        if config.sk_block_n // strips <= 16 or (piece // strips <= 64 * 1024
                                              and others + piece // strips <= SMEM_PER_BLOCK_SM90):
            return strips
    return 8


MAX_HELPER_PIECES = 32  # pieces a helper may claim (the kernel keeps them in an int32 mask)


def uses_helpers(config: Config, plan: Plan) -> bool:
    """Whether a launch runs helper claims: asked for, tiles split, programs without Stream-K
    work, and at most MAX_HELPER_PIECES pieces each (else the contributors' claims)."""
    helpers = plan.grid - plan.sk_programs
    return (config.helper_claims and plan.split_tiles and helpers > 0
            and cdiv(plan.sk_pieces, helpers) <= MAX_HELPER_PIECES)


def helper_rows(config: Config) -> int:
    """Rows of a piece a helper claim reads at a time. Atomic sums: up to 128 fp32 a thread
    (the whole 128x128 piece at 4 warps, 128x256 at 8; the data-parallel accumulators are
    dead by then), so a helper has one round trip a piece, not one a 8192-value block (a
    latency chain per block that made helpers slow). Deterministic sums keep
    fixup_rows: their partial blocks stream through shared memory, several in flight."""
    if config.deterministic:
        return fixup_rows(config.sk_block_m, config.sk_block_n)
    return max(1, min(config.sk_block_m, 128 * 32 * config.num_warps // config.sk_block_n))


def fixup_rows(block_m: int, block_n: int) -> int:
    """Rows of a split tile the last arriver sums at a time: 8192 fp32 values (64 registers a
    thread at 4 warps), so the running sum and one loaded partial fit beside each other (the
    whole 128x128 tile at once spilled in the sm_90 compile check)."""
    return max(1, min(block_m, 8192 // block_n))


def slice_rows(block_m: int, block_n: int, chunks: int) -> int:
    """Rows the cooperative fixup sums at a time: a power of two covering one of the `chunks`
    row slices of a tile, at most fixup_rows (registers)."""
    want = max(1, cdiv(block_m, max(1, chunks)))
    return min(fixup_rows(block_m, block_n), 1 << (want - 1).bit_length())


def default_policy(tiles: int, num_sms: int) -> str:
    """Cost-model-free choice: no partial wave -> "dp"; fewer tiles than SMs -> "sk"; else
    the smallest hybrid whose Stream-K programs each get at least half a tile (so a tile has
    at most ~3 contributors and the fixup stays cheap)."""
    tail = tiles % num_sms
    if tail == 0:
        return "dp"
    if tiles < num_sms:
        return "sk"
    for n in (1, 2, 3, 4):
        sk = min(tiles, tail + (n - 1) * num_sms)
        if sk == tiles:
            return "sk"
        if 2 * sk >= num_sms:
            return f"hybrid{n}"
    return "hybrid4"


def aligned_policy(tiles: int, num_sms: int) -> str:
    """Policy for the aligned layout: "dp" for whole waves, "sk" under one wave, else
    "hybrid1" (the partial wave, cut into K-chunks over all SMs)."""
    if tiles % num_sms == 0:
        return "dp"
    return "sk" if tiles < num_sms else "hybrid1"


@functools.lru_cache(maxsize=512)  # pure in its arguments; saves host time per call
def default_config(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> Config:
    """128x128x64 tiles, 4 warps, 4 stages (Triton's standard Hopper tile), deterministic
    fixup. Where TMA can read the shape: the aligned layout with TMA loads and
    `aligned_policy` (the fastest Stream-K variant on every tail shape,
    docs/schedules/stream_k.md; matmul drops TMA when the tensors' strides do not allow it), and for a skinny problem
    (M or N at most 64, where a 128x128 tile would mostly compute padding) the first of the
    `skinny_points`; the same, `staged`, where the shape's rows break TMA's alignment but
    copying the misfits costs less than half the GEMM (persistent_gemm.staging_pays);
    otherwise pointer loads, contiguous ranges and `default_policy`. fp32 through dp_gemm's
    `for_dtype`."""
    base = for_dtype(Config(128, 128, 64, 8, 4, 4), dtype)
    tiles = cdiv(M, base.BLOCK_M) * cdiv(N, base.BLOCK_N)
    staged = staging_pays(M, N, K, dtype)
    if tma_shape_ok(M, N, K, dtype) or staged:
        if min(M, N) <= 64:
            # the deterministic twin, as everywhere else in this module; skinny_points has
            # none past a wave of tiles (e.g. 100000x16): then the tile narrows to the
            # short side instead, so that it does not compute mostly padding
            points = [c for c in skinny_points(M, N, K, dtype, num_sms) if c.deterministic]
            if points:
                return points[0]
            base = replace(base, BLOCK_M=min(128, max(16, _next_pow2(M))), BLOCK_N=min(128, max(16, _next_pow2(N))),
                           num_warps=4)
            tiles = cdiv(M, base.BLOCK_M) * cdiv(N, base.BLOCK_N)
        return replace(base, policy=aligned_policy(tiles, num_sms), aligned=True, use_tma=True, staged=staged)
    return replace(base, policy=default_policy(tiles, num_sms))


def skinny_points(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> list[Config]:
    """Aligned "sk" configs with TMA loads for problems with less than a wave of 128x128
    tiles (skinny or long-K): a tile that just covers M (16..128 rows) so that B streams
    once, 64 or 128 columns, BLOCK_K 128 while the tile is at most 64x64 (bigger loads per
    stage) else 64, and the deepest pipeline (up to 8 stages) within ~200 KB; the atomic
    partial sums first (a split tile's cooperative read-out moves one slice of a tile, not
    every contributor's partial), then the deterministic fixup; then 128x128 tiles on 8
    warps (two warpgroups, 5 stages), for the compute-heavier ones such as 512x512x65536.

    These points put Stream-K level with or ahead of split_k_gemm's best config on the skinny
    suite, where a search over 128x128 tiles only had left it well behind
    (docs/schedules/stream_k.md). Staged (`staged`) where staging_pays."""
    staged = staging_pays(M, N, K, dtype)
    if cdiv(M, 128) * cdiv(N, 128) >= num_sms or not (tma_shape_ok(M, N, K, dtype) or staged):
        return []
    elt = dtype.itemsize
    bm = min(128, max(16, _next_pow2(M)))
    out: list[Config] = []
    for bn in (64, 128):
        bn = min(bn, max(16, _next_pow2(N)))
        base = for_dtype(Config(bm, bn, 128 if bm * bn <= 64 * 64 else 64, 8, 4, 2), dtype)
        per_stage = (bm * base.BLOCK_K + base.BLOCK_K * bn) * elt
        stages = max(2, min(8, (200 * 1024 - bm * bn * elt) // per_stage))
        for deterministic in (False, True):
            cfg = replace(base, num_stages=stages, policy="sk", deterministic=deterministic, aligned=True,
                          use_tma=True, staged=staged)
            if cfg not in out and cfg.smem_bytes(dtype) <= SMEM_PER_BLOCK_SM90:
                out.append(cfg)
    if fits_shape(128, 128, M, N):
        cfg = for_dtype(Config(128, 128, 64, 8, 8, 5, "sk", False, aligned=True, use_tma=True, staged=staged), dtype)
        if cfg.smem_bytes(dtype) <= SMEM_PER_BLOCK_SM90:
            out.insert(0 if min(M, N) > 64 else len(out), cfg)
    return out


def plausible_policies(tiles: int, num_sms: int) -> list[str]:
    """Policies worth measuring for a tile count: only "dp" when the waves are full (every
    other policy then adds fixups to a schedule that has no tail); only "sk" when there is
    less than one wave; otherwise the hybrids that differ (enough tiles for n-1 extra waves),
    then "sk"."""
    if tiles % num_sms == 0:
        return ["dp"]
    if tiles < num_sms:
        return ["sk"]
    out = []
    for n in (1, 2, 3, 4):
        sk = sk_tile_count(f"hybrid{n}", tiles, num_sms)
        if sk < tiles:
            out.append(f"hybrid{n}")
    out.append("sk")
    return out


# TMA points of the aligned search: (BLOCK_M, BLOCK_N, warps, stages, subtiled epilogue,
# deterministic, SK_SPLIT_M, tma_hand_in, helper_claims, SK_SPLIT_N, SK_STAGES, edge_first). 128x256
# with 4 stages only fits (227 KB) when C is staged in halves. The atomic flavour of the
# fastest tiles too: with its cooperative read-out (each contributor takes 1/chunks of the
# tile's running sum) its
# claims took 2-3 us against 4-5 us for the deterministic claims, and it ran 1-4% faster on
# four of the five tail shapes in one side-by-side run (H200,
# experiments/probes/tail_atomic_fixup.json; before that read-out it lost on every tail shape).
# 128x128 with 5 stages ran 1-3% faster than with 4 on four of the five tail shapes (1%
# slower on 4224^2), and 1-5% faster in a second run (experiments/probes/tail_stages.json,
# tail_group_m.json); 6 stages, BLOCK_K 128 and GROUP_M 2-16 did not help. Not searched,
# measured slower on all five tail shapes that day: FLATTEN (within noise) and dp_first
# (1664x1408x8192: 85 us against 65 us). SK_SPLIT_M=2 on the 5-stage 128x128 tile, both
# fixups (H200, experiments/probes/tail_split_m*.json): 64-row pieces halve the
# partials, so the hand-in took 2.0 instead of 3.8 us a program on 1664x1408x8192 and the
# launch 62.9 against 65.0 us (atomic) and 63.7 against 66.5 (deterministic), faster in 8
# and 9 of 9 interleaved rounds; on 2304^2x4096 the 120 pieces need no K-chunks, hence no
# fixup (70.4 against 71.2 us for the best unsplit config). On 2176^2 and 3072^2 the pieces'
# MAC loops (smaller tiles, B read twice) cost more than the fixup saved (5-13% slower);
# 4-way row splits lost everywhere. Column pieces (an SK_SPLIT_N knob, at commit e6eb523:
# 128x128 pieces of the 128x256 winners) halved the hand-in there too but slowed the pieces'
# MAC loops as much, and won on no shape (experiments/probes/tail_split_n.json). The TMA hand-in
# (8th field, tma_hand_in) on the atomic 128x256 tile: 3-4% faster on 3072^2x4096 in two
# graph-timed runs (124.5 -> 119.9 us, 123.7 -> 118.6), 1.5-3% on 2176^2x8192, level on
# 2304^2 and 4224^2; on 128x128 tiles it was 2-5% slower (H200,
# experiments/probes/tail_tma_hand_in*.json). Helper claims (last field) on that point, only where
# each helper's pieces are at most HELPER_BYTES: the helpers read out ~14 KB/us, so 256 KB
# (3072^2x4096: 12 helpers, 2 pieces of 128 KB each) takes ~18 us, about the Stream-K phase
# they skip; there they won 2-4% in three runs (120.1 -> 118.3 us with the TMA hand-in), and
# lost 3-12% wherever the helpers had more to read (2176^2, 2304^2;
# experiments/probes/tail_helper_claims*.json). Whole quarter pieces (SK_SPLIT_N=2 with
# SK_SPLIT_M=2, whole_pieces, the 64x128 pieces' loops at SK_STAGES=5): the 128x256 tile's
# tail tiles as one round of pieces with no fixup where K <= 4096 (WHOLE_PIECES_MAX_K); they
# won 2304^2x4096 in both bench runs since (1.04-1.05x cuBLAS) and 3072^2 in one
# (experiments/probes/tail_quarter_pieces*.json). Searched 7-stage loops for the m/2 pieces too:
# 1-2% (within noise) on 2304^2 and 2176^2, slower on 1664x1408 in the bench; not kept.
# The ragged column first (last field, edge_first, with 128x128 column pieces at SK_STAGES=5),
# only where it drops pieces: on 4224^2x8192 (the 33 half-empty tiles as 33 pieces) the
# Stream-K phase took 21.0 against 24.2 us and its hand-in 3.5 against 6.0 us (phase stamps),
# 424.9 against 433.9 us graph-timed for the best other config; on 2176^2x8192 it brought the
# 128x256 tile level with the 128x128 winner (106.0 against 106.2 us span, 119.6 against 118.8
# graph-timed). At 3 stages the pieces' loop was latency-bound and lost (18.2 against 16.0 us
# for the unsplit tiles; experiments/probes/tail_edge_first*.json, H200).
TMA_POINTS = (
    (128, 256, 8, 3, False, True, 1, False, False, 1, 0, False),
    (128, 256, 8, 4, True, True, 1, False, False, 1, 0, False),
    (128, 128, 4, 5, False, True, 1, False, False, 1, 0, False),
    (128, 128, 4, 5, False, False, 1, False, False, 1, 0, False),
    (128, 256, 8, 3, False, False, 1, False, False, 1, 0, False),
    (128, 256, 8, 4, True, False, 1, False, False, 1, 0, False),
    (128, 256, 8, 3, False, False, 1, True, False, 1, 0, False),
    (128, 256, 8, 3, False, False, 1, True, True, 1, 0, False),
    (128, 256, 8, 3, False, True, 2, False, False, 2, 5, False),
    (128, 256, 8, 3, False, False, 1, False, False, 2, 5, True),
    (128, 128, 4, 5, False, False, 2, False, False, 1, 0, False),
    (128, 128, 4, 5, False, True, 2, False, False, 1, 0, False),
)
# The 4-stage 128x128 deterministic point (the default config's twin, which the bench always
# times anyway) left the list when the helper point came, to stay within 12 candidates: the
# 5-stage one has beaten it since the first runs (1 win in 6 finals against 4 in 16).
# Whole quarter pieces won or tied where K = 4096 (3072^2: 114.0 against 117.7 us for the best
# other config, 2304^2: 67.1 against 67.2) and lost 5-8% at K = 8192 (4224^2: 447.8 against
# 425.2; 2176^2: 132.3 against 123.0), 9 interleaved rounds (experiments/probes/tail_quarter_pieces_2.json)
WHOLE_PIECES_MAX_K = 4096
HELPER_BYTES = 256 * 1024  # fp32 partial bytes a helper may have to read out (TMA_POINTS)


def helper_bytes(config: Config, plan: Plan) -> int:
    """fp32 bytes the busiest helper reads out (0 without helper claims): its pieces' sums,
    or every chunk's partial of them (deterministic)."""
    if not uses_helpers(config, plan):
        return 0
    pieces = cdiv(plan.sk_pieces, plan.grid - plan.sk_programs)
    return pieces * config.sk_block_m * config.sk_block_n * 4 * (plan.chunks if config.deterministic else 1)





def tf32_swap_points(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> list[Config]:
    """fp32, M and N over 512 (measured on the tail shapes only; the skinny ones keep their
    split-K and Stream-K points): the aligned layout on pointer loads with 256x128 tiles
    (8 warps, 3 and 4 stages, atomic partial sums). With a row-major B such a config swaps the
    operands (tf32_layout: C^T = B^T A^T, B^T through registers, no copy of B) and transposes
    the tile to 128x256, so B^T is read out of shared memory once per 256 columns (as split-K's
    fp32 point). It beat the TMA configs, which copy B K-major first, on four of the five tail
    shapes and lost on 1664x1408x8192 (docs/schedules/stream_k.md)."""
    if dtype != torch.float32 or min(M, N) <= 512:
        return []
    tiles = cdiv(M, 256) * cdiv(N, 128)
    policy = aligned_policy(tiles, num_sms)
    return [Config(256, 128, 32, 8, 8, stages, policy, False, aligned=True) for stages in (3, 4)]


def search_space(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> list[Config]:
    """At most 12 candidates. First the skinny points and fp32's swap points
    (tf32_swap_points). Then, where TMA can read the shape, the aligned layout with TMA
    loads (`aligned_policy`) at the TMA points above, kept only where the plan really splits
    tiles (otherwise it is persistent_gemm's schedule) or, with SK_SPLIT_M, cuts the Stream-K
    tiles into row pieces (a split-free plan then needs one flavour only). Then pointer loads with
    contiguous ranges for 128x128 (4 warps, 4 stages) and 128x256 (8 warps, 4 stages) tiles:
    hybrid1, hybrid2 and "sk" where plausible with the deterministic fixup, and the default
    policy with atomic partial sums (its fixup reads one tile instead of one per
    contributor). 4 stages, not 3, for 128x256 pointer loads (192 KB of buffers): staggered
    programs share fewer operand panels in the L2 and the deeper pipeline hides more of that
    latency (4224x4224x8192 hybrid1: 411 us with 4 stages, 464 us with 3, same run)."""
    out: list[Config] = list(skinny_points(M, N, K, dtype, num_sms))
    out += [c for c in tf32_swap_points(M, N, K, dtype, num_sms) if c not in out]
    staged = staging_pays(M, N, K, dtype)
    if tma_shape_ok(M, N, K, dtype) or staged:
        for point in TMA_POINTS:
            (bm, bn, warps, stages, subtile, deterministic, split_m, tma_hand_in, helpers, split_n, sk_stages,
             edge_first) = point
            tiles = cdiv(M, bm) * cdiv(N, bn)
            if not fits_shape(bm, bn, M, N) or tiles % num_sms == 0:
                continue
            base = for_dtype(Config(bm, bn, 64, 8, warps, stages), dtype)
            cfg = Config(bm, bn, base.BLOCK_K, 8, base.num_warps, stages, aligned_policy(tiles, num_sms),
                         deterministic, aligned=True, use_tma=True, EPILOGUE_SUBTILE=subtile, SK_SPLIT_M=split_m,
                         tma_hand_in=tma_hand_in, helper_claims=helpers, SK_SPLIT_N=split_n,
                         whole_pieces=split_n > 1 and not edge_first, SK_STAGES=sk_stages, edge_first=edge_first,
                         staged=staged)
            plan = plan_schedule(M, N, K, cfg, num_sms)
            # row pieces only beside a data-parallel body: on skinny shapes (all Stream-K) the
            # pieces re-read B and lost 20-40% (experiments/probes/skinny_split_m.json)
            # and only where their units fill one round: on 3072^2x4096 the 96 pieces in 4
            # K-chunks (3 rounds of units a program) lost in every run, 12-16% behind the
            # 128x256 tiles (experiments/results/probe_configs/h200_2026-12-01_tail_quarter_pieces*.txt)
            wanted = plan.split_tiles if split_m == 1 else (
                plan.dp_tiles > 0 and plan.sk_tiles > 0 and (plan.split_tiles or deterministic)
                and plan.sk_pieces * plan.chunks <= num_sms)
            if split_n > 1 and not edge_first:
                # quarter pieces only as one split-free round (whole_pieces; column pieces with
                # K-chunks lost everywhere, experiments/probes/tail_split_n.json), and only where
                # that round is short: a piece runs the whole K
                wanted = plan.dp_tiles > 0 and 0 < plan.sk_pieces <= num_sms and K <= WHOLE_PIECES_MAX_K
            if helpers:  # only where the helpers have little to read
                wanted = 0 < helper_bytes(cfg, plan) <= HELPER_BYTES
            if edge_first:  # only where the ragged column's empty pieces drop out of a region
                # beside a data-parallel body (measured there only)
                wanted = plan.split_tiles and plan.dp_tiles > 0 and 0 < plan.edge_cols < split_n
            if cfg.smem_bytes(dtype) <= SMEM_PER_BLOCK_SM90 and cfg not in out and wanted:
                out.append(cfg)
    for bm, bn, warps, stages in ((128, 128, 4, 4), (128, 256, 8, 4)):
        base = for_dtype(Config(bm, bn, 64, 8, warps, stages), dtype)
        if not fits_shape(bm, bn, M, N) or base.smem_bytes(dtype) > SMEM_PER_BLOCK_SM90:
            continue
        tiles = cdiv(M, bm) * cdiv(N, bn)
        for policy in plausible_policies(tiles, num_sms):
            if policy in ("dp", "hybrid1", "hybrid2", "sk"):
                out.append(Config(bm, bn, base.BLOCK_K, 8, base.num_warps, stages, policy, True))
        first_choice = default_policy(tiles, num_sms)
        if first_choice != "dp":
            out.append(Config(bm, bn, base.BLOCK_K, 8, base.num_warps, stages, first_choice, False))
    if not out:
        out.append(default_config(M, N, K, dtype, num_sms))
    return out[:12]


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------


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
def _slot(j, tile_start, sk_q, sk_r):
    """Workspace slot of contiguous-range program j's partial of the split tile starting at
    iteration tile_start: slot 2j holds the tile where j's range starts, 2j + 1 the one where
    it ends. (The aligned layout's slot is its unit number.)"""
    return 2 * j + (_sk_start(j, sk_q, sk_r) < tile_start).to(tl.int32)


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
def _halves(x, BLOCK_M: tl.constexpr, H: tl.constexpr):
    """The left and right H columns of a BLOCK_M x 2H block."""
    return tl.split(tl.permute(tl.reshape(x, (BLOCK_M, 2, H)), (0, 2, 1)))


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
    # program hands in at once and the L2 takes the partials at ~2.4 TB/s, H200,
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
                # H200: four independent loads a step over smaller row blocks made
                # the fixup slower (a 12-way split 128x128 tile: 78 -> 86 us for the GEMM).
                for j in tl.range(j_first, j_last + 1, num_stages=4):
                    slot = _slot(j, tile_start, sk_q, sk_r)
                    total += tl.load(ws_ptr + (slot * TILE + rows), cache_modifier=".cg")
            else:
                # Take the sum out and leave zeros for the next launch in ONE atomic exchange
                # per element (as int32 bits: the interpreter has no float exchange). A load
                # then a store of zeros raced on the H200: Triton gave them different thread
                # layouts, so an element could be zeroed before the thread that reads it had
                # loaded it.
                bits = ws_ptr.to(tl.pointer_type(tl.int32)) + (key * TILE + rows)
                total = tl.atomic_xchg(bits, tl.zeros((FIXUP_ROWS, BLOCK_N), dtype=tl.int32),
                                       sem="relaxed").to(tl.float32, bitcast=True)
            store_block(c_ptr, stride_cm, stride_cn, M, N, pid_m * BLOCK_M + r0, pid_n * BLOCK_N,
                        total, FIXUP_ROWS, BLOCK_N, INT64)
        tl.store(counter_ptr + key, 0)  # ready for the next launch


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
    the H200, nor were partials stored with an L2 evict_last hint
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
            # out differently, which raced on the H200 in the last-arriver read-out).
            sums = ws_ptr + (tile_id * TILE + offs)
            total = tl.load(sums, mask=in_slice, other=0.0, cache_modifier=".cg")
            tl.debug_barrier()
            tl.store(sums, tl.zeros((ROWS, BLOCK_N), dtype=tl.float32), mask=in_slice)
        store_block(c_ptr, stride_cm, stride_cn, tl.minimum(M, pid_m * BLOCK_M + r_hi), N,
                    pid_m * BLOCK_M + r0, pid_n * BLOCK_N, total, ROWS, BLOCK_N, INT64)


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
            # Programs start at staggered K offsets: Nsight Compute on the H200
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
            # (a helper took ~5.5 us a 64 KB piece that way, H200). The host keeps
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
            # partials (a 12-way split 128x128 tile: ~18 us on one SM, H200). A
            # claim that finds partials missing leaves its slice to the final arrival, so no
            # program ever waits for another (and the interpreter, one program at a time,
            # gets the last-arriver fixup). The last claimer clears the word. The claims take
            # 4-5 us a program on the tail shapes (H200): every program claims at
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
    layouts = None
    if config is None:
        config, layouts = tma_or_pointer_loads(default_config(M, N, K, a.dtype, sms), a, b, c)
    check_smem(config, a.dtype)
    staged_out = False
    if config.staged:
        a, b, c, staged_out = stage_for_tma(a, b, c)
        layouts = None
        key = None  # the staging copies are work a replay would skip
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
