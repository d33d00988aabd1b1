"""Stream-K GEMM: hybrid data-parallel + Stream-K, so that a partial last wave costs its share.

What
    C = A @ B with output tiles of BLOCK_M x BLOCK_N, each needing `iters` = cdiv(K, BLOCK_K)
    MAC-loop iterations. A data-parallel grid runs one program per tile; with T tiles on P
    SMs the last wave holds only T mod P tiles, and 143 tiles on 132 SMs cost two full
    tile-times for 1.08 tiles' worth of work. Stream-K instead hands out *iterations*: the
    tiles of a Stream-K region are laid end to end (sk_tiles x iters iterations) and split
    evenly over P Stream-K programs, so every SM gets the same amount of MAC work (to one
    iteration) whatever T is. A program whose range covers a whole tile stores it directly;
    a tile split between programs is reduced by a fixup:

    deterministic=True (default)
        each contributor stores its fp32 partial in its own workspace slot, then increments
        the tile's arrival counter (acq_rel, after a block barrier). The program whose
        increment completes the count ("last arriver") sums the partials of ALL contributors
        in contributor order (program id), casts and stores the tile, and resets the counter.
        Same bits on every run, whatever order the programs arrive in.
    deterministic=False
        contributors `atomic_add` their partials into one fp32 buffer per split tile; the last
        arriver reads it, stores the tile and zeroes the buffer and the counter. Less
        traffic, but fp32 additions happen in arrival order: not bit-reproducible.
        On the H200 (2026-11-29) this path first computed wrong tiles (rel. error up to 0.46;
        the interpreter, one program at a time, cannot show races): the last arriver loaded
        the sum and then stored zeros over it with a different thread layout, so some
        elements were zeroed before being read. It now takes the sum out with one atomic
        exchange per element. Needs a GPU re-check.

    No program ever waits for another (no spin-wait), so the schedule cannot deadlock
    whatever the launch order, and the CPU interpreter (programs one at a time, pid order)
    runs it unchanged.

    The `policy` knob chooses the Stream-K region, in the spirit of Stream-K++:
      "dp"          no Stream-K: one program per tile (dp_gemm's schedule);
      "sk"          every tile in the Stream-K region;
      "hybrid1..4"  data-parallel full waves, plus a Stream-K region of the last partial
                    wave's tiles (T mod P) and n-1 further full waves' worth (n-1) x P, i.e.
                    sk_tiles = min(T, T mod P + (n-1) P), the rest data-parallel.
    The Stream-K programs come first in the grid (pid < P), the data-parallel tiles after.

When it wins
    GEMMs whose tile count leaves a partial last wave (tail efficiency waves/ceil(waves) low)
    on a big GPU, e.g. on 132 SMs with 128x128 tiles: 1664x1408 (143 tiles), 2176^2 (289),
    2304^2 (324), 3072^2 (576), 4224^2 (1089). The fixup costs one partial-tile round trip per
    contributor, and the last arriver reads all of a tile's partials on one SM, so policies
    that give each Stream-K program at least half a tile (hybrid2 when T mod P < P/2: at most
    ~3 contributors a tile) keep the fixup small; hybrid1 with a nearly empty last wave
    splits each tail tile over P/(T mod P) programs. default_config applies that rule;
    advisor's cost model or the autotuner picks among `search_space`.

Caveats
    - Workspaces: per-program partial slots (2 x P x BLOCK_M x BLOCK_N fp32, allocated per
      call) for the deterministic fixup; a zeroed per-tile sum buffer (P tiles) for the
      atomic one; P int32 counters. Counters and sums come from kernels/common.py's
      ZeroedScratch pool (per device and stream) and are left zeroed by the kernel.
    - Tiny problems (fewer iterations than SMs) run fewer Stream-K programs than SMs.
    - Few tiles with long K (T << P) is Split-K's territory (split_k_gemm): "sk" there makes
      tiles with P/T contributors whose fixup reads P/T partials on one SM.

Source of the idea
    Stream-K (Osama, Merrill, Cecka, Garland, Guo: "Stream-K: Work-centric Parallel
    Decomposition for Dense Matrix-Matrix Multiplication on the GPU", PPoPP 2023, arXiv
    2301.03598), its data-parallel + Stream-K hybrids and fixup; Stream-K++ (arXiv
    2408.11417) for choosing among such policies per shape. Each tile segment runs
    dp_gemm's `mac_loop`, so the MAC loop is the data-parallel baseline's own.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch
import triton
import triton.language as tl

from .common import (
    SCRATCH,
    SMEM_PER_BLOCK_SM90,
    cdiv,
    check_matmul_inputs,
    gemm_launch_metadata,
    needs_int64_offsets,
    num_sms,
    pipeline_smem_bytes,
    prepare_output,
    self_check,
)
from .dp_gemm import (
    check_block_config,
    check_smem,
    fits_shape,
    for_dtype,
    mac_loop,
    store_block,
    store_tile,
    tile_coords,
)

POLICIES = ("dp", "sk", "hybrid1", "hybrid2", "hybrid3", "hybrid4")


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

    def __post_init__(self):
        check_block_config(self)
        if self.policy not in POLICIES:
            raise ValueError(f"policy={self.policy!r}: must be one of {POLICIES}")
        if not isinstance(self.deterministic, bool):
            raise TypeError(f"deterministic={self.deterministic!r}: must be a bool")

    def smem_bytes(self, dtype: torch.dtype) -> int:
        elt = torch.empty((), dtype=dtype).element_size()
        return pipeline_smem_bytes(self.BLOCK_M, self.BLOCK_N, self.BLOCK_K, self.num_stages, elt)

    def describe(self) -> str:
        return (f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K} g{self.GROUP_M} w{self.num_warps} "
                f"s{self.num_stages} {self.policy}{'' if self.deterministic else ' atomic'}")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Plan:
    """How a launch divides the work (pure function of shape, tile, policy and SM count)."""

    tiles: int  # output tiles
    iters_per_tile: int  # MAC-loop iterations (BLOCK_K steps) per tile
    sk_tiles: int  # tiles 0 .. sk_tiles-1 (grouped order) are in the Stream-K region
    sk_programs: int  # Stream-K programs (pids 0 .. sk_programs-1)
    sk_iters_per_program: int  # q: each gets q iterations, the first r get q + 1
    sk_extra: int  # r

    @property
    def dp_tiles(self) -> int:
        return self.tiles - self.sk_tiles

    @property
    def grid(self) -> int:
        return self.sk_programs + self.dp_tiles

    def sk_range(self, program: int) -> tuple[int, int]:
        """[start, end) of a Stream-K program's iterations in the Stream-K region."""
        q, r = self.sk_iters_per_program, self.sk_extra
        start = program * q + min(program, r)
        return start, start + q + (1 if program < r else 0)

    def contributors(self, tile: int) -> int:
        """Stream-K programs that work on `tile` (1 = stored directly, no fixup)."""
        if tile >= self.sk_tiles:
            return 1
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


def plan_schedule(M: int, N: int, K: int, config: Config, num_sms: int) -> Plan:
    tiles = cdiv(M, config.BLOCK_M) * cdiv(N, config.BLOCK_N)
    iters = cdiv(K, config.BLOCK_K)
    sk_tiles = sk_tile_count(config.policy, tiles, num_sms)
    total = sk_tiles * iters
    programs = min(num_sms, total)
    q, r = divmod(total, programs) if programs else (0, 0)
    return Plan(tiles, iters, sk_tiles, programs, q, r)


def fixup_rows(block_m: int, block_n: int) -> int:
    """Rows of a split tile the last arriver sums at a time: 8192 fp32 values (64 registers a
    thread at 4 warps), so the running sum and one loaded partial fit beside each other (the
    whole 128x128 tile at once spilled in the sm_90 compile check)."""
    return max(1, min(block_m, 8192 // block_n))


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


def default_config(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> Config:
    """128x128x64 tiles, 4 warps, 4 stages (Triton's standard Hopper tile: 128 KB of pipeline
    buffers), deterministic fixup, and `default_policy` for the tile count. fp32 through
    dp_gemm's `for_dtype`."""
    base = for_dtype(Config(128, 128, 64, 8, 4, 4), dtype)
    tiles = cdiv(M, base.BLOCK_M) * cdiv(N, base.BLOCK_N)
    return Config(base.BLOCK_M, base.BLOCK_N, base.BLOCK_K, 8, base.num_warps, 4,
                  default_policy(tiles, num_sms), True)


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


def search_space(M: int, N: int, K: int, dtype: torch.dtype, num_sms: int) -> list[Config]:
    """At most 12 candidates: for 128x128 (4 warps, 4 stages) and 128x256 (8 warps, 4 stages)
    tiles, every plausible policy with the deterministic fixup, plus the default policy with
    atomic partial sums (its fixup reads one tile instead of one per contributor); 128x128
    first. 4 stages, not 3, for 128x256 (192 KB of buffers): Stream-K programs start at
    staggered K offsets, so concurrent programs share fewer operand panels in the L2 than
    data-parallel tiles do (Nsight Compute on the H200, 1664x1408x8192 all Stream-K: 2.6x
    the compulsory DRAM traffic), and the deeper pipeline hides more of that latency
    (4224x4224x8192 hybrid1: 411 us with 4 stages, 464 us with 3, same run)."""
    out: list[Config] = []
    for bm, bn, warps, stages in ((128, 128, 4, 4), (128, 256, 8, 4)):
        base = for_dtype(Config(bm, bn, 64, 8, warps, stages), dtype)
        if not fits_shape(bm, bn, M, N) or base.smem_bytes(dtype) > SMEM_PER_BLOCK_SM90:
            continue
        tiles = cdiv(M, bm) * cdiv(N, bn)
        for policy in plausible_policies(tiles, num_sms):
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


@triton.jit(launch_metadata=gemm_launch_metadata("stream_k_gemm"))
def stream_k_gemm_kernel(
    # pointers: A (M, K), B (K, N), C (M, N)
    a_ptr, b_ptr, c_ptr,
    # fixup state: fp32 partials (per-program slots, or per-tile sums) and int32 counters
    ws_ptr, counter_ptr,
    # problem size
    M, N, K,
    # element strides
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    # the plan (see Plan): Stream-K programs, Stream-K tiles, iterations per program (q, r)
    sk_programs, sk_tiles, sk_q, sk_r,
    # tile shape and order
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    DETERMINISTIC: tl.constexpr,
    FIXUP_ROWS: tl.constexpr,  # rows of a split tile summed at a time by the last arriver
    # shape facts fixed by the host
    EVEN_K: tl.constexpr, INT64: tl.constexpr,
):
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    iters = tl.cdiv(K, BLOCK_K)
    if pid < sk_programs:
        # ---- Stream-K program: iterations [it, end) of the Stream-K region, tile by tile ----
        my_start = _sk_start(pid, sk_q, sk_r)
        end = _sk_start(pid + 1, sk_q, sk_r)
        # A counted loop over the tiles the range touches. Nsight Compute on the H200
        # (2026-11-29, 1664x1408x8192, all Stream-K, 128x256 tiles): the tensor pipe is busy
        # 64% of the time here against 95% in the data-parallel branch, with 2.7x the
        # compulsory DRAM traffic. Not a pipelining problem (the while loop this replaced
        # and 4 stages instead of 3 measured the same): programs start at staggered K
        # offsets, so concurrent programs rarely share an operand panel in the L2 and the
        # loads wait on HBM latency. Aligning concurrent programs in K is the open fix.
        for tile_id in range(my_start // iters, (end + iters - 1) // iters):
            tile_start = tile_id * iters
            k0 = tl.maximum(my_start, tile_start) - tile_start
            k1 = tl.minimum(end, tile_start + iters) - tile_start
            pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
            acc = mac_loop(a_ptr, b_ptr, stride_am, stride_ak, stride_bk, stride_bn, M, N, K,
                           pid_m, pid_n, k0, k1,
                           BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INT64)
            if k1 - k0 == iters:
                # the whole tile is ours
                store_tile(c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, acc, BLOCK_M, BLOCK_N, INT64)
            else:
                # Split tile: contributors are programs first..last. `first` owns the tile's
                # first iteration and is unique to this tile, so it indexes the counter (and,
                # for atomic sums, the sum buffer).
                first = _sk_owner(tile_start, sk_q, sk_r)
                last = _sk_owner(tile_start + iters - 1, sk_q, sk_r)
                TILE: tl.constexpr = BLOCK_M * BLOCK_N
                local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
                if INT64:
                    local = local.to(tl.int64)
                if DETERMINISTIC:
                    # slot 2p: the tile where program p's range starts; 2p + 1: where it ends
                    slot = 2 * pid + (my_start < tile_start).to(tl.int32)
                    tl.store(ws_ptr + (slot * TILE + local), acc)
                else:
                    tl.atomic_add(ws_ptr + (first * TILE + local), acc, sem="relaxed")
                # all threads' partials are written before the block announces itself
                tl.debug_barrier()
                arrived = tl.atomic_add(counter_ptr + first, 1, sem="acq_rel")
                if arrived == last - first:
                    # Last arriver: every contributor's partial is visible (read via L2, .cg).
                    # Summed FIXUP_ROWS rows at a time, so the sum and the loaded partial need
                    # no more registers than the main loop's accumulator.
                    for r0 in tl.static_range(0, BLOCK_M, FIXUP_ROWS):
                        rows = (r0 + tl.arange(0, FIXUP_ROWS))[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
                        if INT64:
                            rows = rows.to(tl.int64)
                        if DETERMINISTIC:
                            total = tl.zeros((FIXUP_ROWS, BLOCK_N), dtype=tl.float32)
                            # contributor order: same bits every run. num_stages makes Triton
                            # stream the partials through shared memory (cp.async, up to 3 in
                            # flight; the main loop's buffers are free by now) instead of one
                            # latency-bound load at a time.
                            for j in tl.range(first, last + 1, num_stages=4):
                                j_slot = 2 * j + (_sk_start(j, sk_q, sk_r) < tile_start).to(tl.int32)
                                total += tl.load(ws_ptr + (j_slot * TILE + rows), cache_modifier=".cg")
                        else:
                            # Take the sum out and leave zeros for the next launch in ONE atomic
                            # exchange per element (as int32 bits: the interpreter has no float
                            # exchange). A load then a store of zeros raced on the H200: Triton
                            # gave them different thread layouts, so an element could be zeroed
                            # before the thread that reads it had loaded it.
                            bits = ws_ptr.to(tl.pointer_type(tl.int32)) + (first * TILE + rows)
                            total = tl.atomic_xchg(bits, tl.zeros((FIXUP_ROWS, BLOCK_N), dtype=tl.int32),
                                                   sem="relaxed").to(tl.float32, bitcast=True)
                        store_block(c_ptr, stride_cm, stride_cn, M, N, pid_m * BLOCK_M + r0, pid_n * BLOCK_N,
                                    total, FIXUP_ROWS, BLOCK_N, INT64)
                    tl.store(counter_ptr + first, 0)  # ready for the next launch
    else:
        # ---- data-parallel program: one whole tile after the Stream-K region ----
        tile_id = sk_tiles + (pid - sk_programs)
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        acc = mac_loop(a_ptr, b_ptr, stride_am, stride_ak, stride_bk, stride_bn, M, N, K,
                       pid_m, pid_n, 0, iters,
                       BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INT64)
        store_tile(c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, acc, BLOCK_M, BLOCK_N, INT64)


# --------------------------------------------------------------------------------------------
# Host launcher
# --------------------------------------------------------------------------------------------


def matmul(a: torch.Tensor, b: torch.Tensor, config: Config | None = None, *,
           out: torch.Tensor | None = None) -> torch.Tensor:
    """C = a @ b with the Stream-K schedule. a: (M, K), b: (K, N), fp16/bf16/fp32, any strides.
    Returns `out` (filled) when given, else a new (M, N) tensor in a's dtype. Bit-reproducible
    when config.deterministic (the default)."""
    M, N, K = check_matmul_inputs(a, b)
    sms = num_sms(a.device)
    if config is None:
        config = default_config(M, N, K, a.dtype, sms)
    check_smem(config, a.dtype)
    c = prepare_output(out, M, N, a)
    plan = plan_schedule(M, N, K, config, sms)
    tile_elems = config.BLOCK_M * config.BLOCK_N

    ws = counters = c  # placeholders when there is no Stream-K region
    if plan.sk_programs:
        counters = SCRATCH.get("stream_k_counters", plan.sk_programs, torch.int32, a.device)
        if config.deterministic:
            ws = torch.empty(2 * plan.sk_programs * tile_elems, dtype=torch.float32, device=a.device)
        else:
            ws = SCRATCH.get("stream_k_sums", plan.sk_programs * tile_elems, torch.float32, a.device)
    stream_k_gemm_kernel[(plan.grid,)](
        a, b, c,
        ws, counters,
        M, N, K,
        a.stride(0), a.stride(1),
        b.stride(0), b.stride(1),
        c.stride(0), c.stride(1),
        plan.sk_programs, plan.sk_tiles, plan.sk_iters_per_program, plan.sk_extra,
        BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K, GROUP_M=config.GROUP_M,
        DETERMINISTIC=config.deterministic, FIXUP_ROWS=fixup_rows(config.BLOCK_M, config.BLOCK_N),
        EVEN_K=K % config.BLOCK_K == 0,
        INT64=needs_int64_offsets(a, b, c, ws if ws is not c else None),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return c


if __name__ == "__main__":
    import os

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
