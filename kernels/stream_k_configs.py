"""Stream-K's knobs, the plan they imply, its default config and its autotune search space.

The schedule itself (the idea, the kernel, the launcher) is kernels/stream_k_gemm.py; this
module is what the host decides before a launch: `Config` (every knob), `plan_schedule`
(a pure function of shape, tile, policy and SM count: which tiles are Stream-K's, how they
are cut and who works on what), `default_config` (a sane choice without measuring) and
`search_space` (at most 12 candidates the bench times). What each choice measured:
docs/schedules/stream_k.md.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from .common import SMEM_PER_BLOCK_SM90, cdiv, pipeline_smem_bytes
from .dp_configs import (
    TileConfig,
    _next_pow2,
    check_block_config,
    fits_shape,
    for_dtype,
)
from .persistent_gemm import check_staged, staging_pays, tma_shape_ok

POLICIES = ("dp", "sk", "hybrid1", "hybrid2", "hybrid3", "hybrid4")



@dataclass(frozen=True)
class Config(TileConfig):
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
    # 16-17 with SK_STAGES 5-6 for a 4096-deep K (sm_90,
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
        flags = [name for name, on in (
            ("aligned", self.aligned), ("atomic", not self.deterministic), ("tma", self.use_tma),
            ("subtile", self.EPILOGUE_SUBTILE), ("flat", self.FLATTEN), ("dpfirst", self.dp_first),
            (f"m/{self.SK_SPLIT_M}", self.SK_SPLIT_M > 1), (f"n/{self.SK_SPLIT_N}", self.SK_SPLIT_N > 1),
            ("tmahand", self.tma_hand_in), ("helpers", self.helper_claims), ("whole", self.whole_pieces),
            (f"sks{self.SK_STAGES}", self.SK_STAGES > 0), ("edge", self.edge_first), ("staged", self.staged),
        ) if on]
        return " ".join([f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K} g{self.GROUP_M} w{self.num_warps} "
                         f"s{self.num_stages} {self.policy}", *flags])

    @property
    def sk_block_m(self) -> int:
        """Rows of a Stream-K piece: a tile's rows cut SK_SPLIT_M ways."""
        return self.BLOCK_M // self.SK_SPLIT_M

    @property
    def sk_block_n(self) -> int:
        """Columns of a Stream-K piece: a tile's columns cut SK_SPLIT_N ways."""
        return self.BLOCK_N // self.SK_SPLIT_N


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
# four of the five tail shapes in one side-by-side run (sm_90,
# experiments/probes/tail_atomic_fixup.json; before that read-out it lost on every tail shape).
# 128x128 with 5 stages ran 1-3% faster than with 4 on four of the five tail shapes (1%
# slower on 4224^2), and 1-5% faster in a second run (experiments/probes/tail_stages.json,
# tail_group_m.json); 6 stages, BLOCK_K 128 and GROUP_M 2-16 did not help. Not searched,
# measured slower on all five tail shapes that day: FLATTEN (within noise) and dp_first
# (1664x1408x8192: 85 us against 65 us). SK_SPLIT_M=2 on the 5-stage 128x128 tile, both
# fixups (sm_90, experiments/probes/tail_split_m*.json): 64-row pieces halve the
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
# 2304^2 and 4224^2; on 128x128 tiles it was 2-5% slower (sm_90,
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
# for the unsplit tiles; experiments/probes/tail_edge_first*.json, sm_90).
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
            # 128x256 tiles (experiments/results/probe_configs/)
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
