"""cluster_gemm's configs, search space and schedule model (kernels/gluon_gemm.py runs them).

Pure Python (no torch, no Triton): the advisor generates, ranks and tests these anywhere.

The Stream-K plan (`sk_plan`, `segments`, `contributors`) is the one the Gluon kernels and the
fixup kernel compute on the GPU, written once more here so that a CPU test can replay it
(tests/test_cluster_gemm.py) and the model can price it:

- tiles 0 .. T-S-1 are data-parallel: program p takes p, p+P, ... (whole waves when S = T mod P);
- the last S tiles are the Stream-K region, S*iters BLOCK_K steps laid end to end and cut into
  SKP contiguous ranges, one a program: [p*tot//SKP, (p+1)*tot//SKP). A range covers a tail of
  one tile, whole tiles, a head of another: at most two partial tiles a program, whose fp32
  partials go to workspace slots 2p (the range's first segment) and 2p+1 (its last);
- the fixup kernel sums, for each region tile split between programs, its contributors' slots
  in program order (deterministic) and stores the tile; a tile inside one range is stored by the
  main kernel directly. No program waits for another, so no launch order can deadlock it.

S = T mod P (hybrid: whole waves, then the partial last wave spread over every SM) when T > P,
S = T (split-K along K of every tile) when T < P: either way each program gets T*iters/P steps
to within one, at the price of the partials of at most S + SKP tile pieces.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

SMEM_PER_BLOCK_SM90 = 232448  # opt-in shared memory per block on sm_90 (227 KB)
INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class Config:
    BLOCK_M: int = 128  # rows of C per CTA (the cluster tile is cluster * BLOCK_M rows)
    BLOCK_N: int = 128  # columns of C per CTA
    BLOCK_K: int = 64  # K step (one 128-byte swizzled row of a 16-bit type)
    STAGES: int = 4  # shared-memory ring depth (A and B slots)
    GROUP_M: int = 8  # cluster-tile rows per L2 group (grouped order)
    num_warps: int = 8  # consumer warps: 8 = two warpgroups, 4 = one
    ws: bool = True  # a 1-warp TMA producer partition beside the consumer warpgroups
    cluster: int = 2  # CTAs per cluster along M (1 or 2); 2 shares each B tile
    multicast: bool = True  # with cluster=2: load the shared B tile once for both CTAs
    stream_k: bool = False  # split the partial last wave (or, under one wave, every tile) along K

    def __post_init__(self):
        if self.BLOCK_M not in (64, 128, 256) or self.BLOCK_N not in (64, 128, 256):
            raise ValueError(f"BLOCK_M/BLOCK_N {self.BLOCK_M}x{self.BLOCK_N}: each must be 64, 128 or 256")
        if self.BLOCK_K not in (32, 64, 128):
            raise ValueError(f"BLOCK_K={self.BLOCK_K}: must be 32, 64 or 128")
        if not 2 <= self.STAGES <= 8:
            raise ValueError(f"STAGES={self.STAGES}: must be 2..8")
        if self.GROUP_M < 1:
            raise ValueError(f"GROUP_M={self.GROUP_M}: must be >= 1")
        if self.num_warps not in (4, 8):
            raise ValueError(f"num_warps={self.num_warps}: 4 (one consumer warpgroup) or 8 (two)")
        if self.BLOCK_M < 16 * self.num_warps:
            raise ValueError(f"BLOCK_M={self.BLOCK_M} with {self.num_warps} warps: wgmma needs 16 rows a warp")
        if self.cluster not in (1, 2):
            raise ValueError(f"cluster={self.cluster}: 1 or 2 CTAs")
        if self.multicast and self.cluster == 1:
            raise ValueError("multicast needs cluster=2")
        if self.multicast and not self.ws:
            raise ValueError("multicast needs ws=True (its cross-CTA slot release lives in the producer/consumer ring)")
        if self.stream_k and not self.ws:
            raise ValueError("stream_k needs ws=True (the split work list lives in the producer/consumer ring)")
        # accumulator registers a thread: BLOCK_M*BLOCK_N fp32 over num_warps*32 threads
        if self.BLOCK_M * self.BLOCK_N // (self.num_warps * 32) > 128:
            raise ValueError(f"{self.BLOCK_M}x{self.BLOCK_N} on {self.num_warps} warps: "
                             f"{self.BLOCK_M * self.BLOCK_N // (self.num_warps * 32)} fp32 accumulator registers "
                             f"a thread (over 128: spills)")

    def smem_bytes(self, elt: int = 2) -> int:
        """Shared memory a CTA: the A/B ring, the C staging tile, the barriers."""
        ring = self.STAGES * (self.BLOCK_M + self.BLOCK_N) * self.BLOCK_K * elt
        return ring + self.BLOCK_M * self.BLOCK_N * elt + 3 * self.STAGES * 8 + 1024

    def validate(self, dtype=None) -> None:
        """dtype: a torch dtype (its itemsize), an element size in bytes, or None (16-bit)."""
        elt = 2 if dtype is None else dtype if isinstance(dtype, int) else int(getattr(dtype, "itemsize", 0))
        if elt != 2:
            raise ValueError(f"cluster_gemm takes bf16/fp16 inputs, not {dtype}")
        if self.smem_bytes(elt) > SMEM_PER_BLOCK_SM90:
            raise ValueError(f"STAGES={self.STAGES} with {self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K}: "
                             f"{self.smem_bytes(elt):,} bytes of shared memory, over the 227 KB of an sm_90 block")

    @property
    def cluster_m(self) -> int:
        """Rows of the cluster tile (one program's tile)."""
        return self.cluster * self.BLOCK_M

    def describe(self) -> str:
        role = "ws" if self.ws else "pipe"
        mc = "+mc" if self.multicast else ""
        sk = " sk" if self.stream_k else ""
        return (f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K} s{self.STAGES} g{self.GROUP_M} w{self.num_warps} "
                f"{role} c{self.cluster}{mc}{sk}")

    def as_dict(self) -> dict:
        return asdict(self)


# The steps a GPU run prices one by one: pipelined -> + warp specialization -> + cluster ->
# + multicast, and each WS step with the Stream-K / split-K work list.
STEPS = {
    "pipe": dict(ws=False, cluster=1, multicast=False, stream_k=False),
    "ws": dict(ws=True, cluster=1, multicast=False, stream_k=False),
    "ws_c2": dict(ws=True, cluster=2, multicast=False, stream_k=False),
    "ws_c2_mc": dict(ws=True, cluster=2, multicast=True, stream_k=False),
    "ws_sk": dict(ws=True, cluster=1, multicast=False, stream_k=True),
    "ws_c2_sk": dict(ws=True, cluster=2, multicast=False, stream_k=True),
    "ws_c2_mc_sk": dict(ws=True, cluster=2, multicast=True, stream_k=True),
}


def step_of(cfg: Config) -> str:
    for name, knobs in STEPS.items():
        if all(getattr(cfg, k) == v for k, v in knobs.items()):
            return name
    return "custom"


def stages_for(bm: int, bn: int, bk: int = 64, elt: int = 2) -> int:
    """The deepest ring (<= 8) that fits an sm_90 block beside the C staging tile."""
    for s in range(8, 1, -1):
        if Config(bm, bn, bk, s, 8, 4 if bm == 64 else 8, True, 1, False).smem_bytes(elt) <= SMEM_PER_BLOCK_SM90:
            return min(s, 6) if bm >= 128 else s
    return 2


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def programs(cfg: Config, sm_count: int) -> int:
    """Persistent programs (clusters) that fill the GPU."""
    return max(1, sm_count // cfg.cluster)


def sk_plan(tiles: int, iters: int, progs: int, stream_k: bool) -> tuple[int, int]:
    """(S, SKP): the Stream-K region's tile count and the programs that share it (S = 0: none).

    Whole waves (T a multiple of P) need none; a region whose step count times the programs
    passes int32 (the kernels' index arithmetic) is left data-parallel."""
    if not stream_k or tiles == 0 or iters == 0 or (tiles >= progs and tiles % progs == 0):
        return 0, 1
    s = tiles % progs if tiles > progs else tiles
    tot = s * iters
    if (tot + 1) * progs > INT32_MAX:
        return 0, 1
    return s, max(1, min(progs, tot))


def sk_range(p: int, tot: int, skp: int) -> tuple[int, int]:
    """Program p's steps [b, e) of the Stream-K region (empty for p >= skp)."""
    pc = min(p, skp)
    return pc * tot // skp, min(pc + 1, skp) * tot // skp


def segments(p: int, tiles: int, s: int, iters: int, skp: int) -> list[tuple[int, int, int, int | None]]:
    """Program p's Stream-K work: (tile, k0, k1, slot or None when the tile is whole)."""
    tot = s * iters
    b, e = sk_range(p, tot, skp)
    out = []
    it = b
    while it < e:
        t_local = it // iters
        k0 = it - t_local * iters
        k1 = min(iters, k0 + (e - it))
        whole = k0 == 0 and k1 == iters
        out.append((tiles - s + t_local, k0, k1, None if whole else 2 * p + (0 if it == b else 1)))
        it += k1 - k0
    return out


def contributors(t_local: int, s: int, iters: int, skp: int) -> list[int]:
    """Workspace slots holding region tile t_local's partials, in program order ([] when one
    program computed the tile whole and stored it)."""
    tot = s * iters
    first, last = t_local * iters, (t_local + 1) * iters - 1
    p_lo = ((first + 1) * skp - 1) // tot
    p_hi = ((last + 1) * skp - 1) // tot
    if p_lo == p_hi:
        return []
    return [2 * p + (1 if p * tot // skp < first else 0) for p in range(p_lo, p_hi + 1)]


# ------------------------------------------------------------------ schedule model
# Measured on sm_90 (bench/results/cluster_gemm, Triton 3.9; docs/schedules/cluster_gemm.md): microseconds one
# 64-deep K step takes per tile when every SM is busy (8192^3 and 4096^2x8192, WS, whole
# waves), and the fixup's costs (a launch in a graph; partial bytes at L2 speed).
ITER_US = {(128, 128): 0.40, (128, 256): 0.75, (256, 128): 0.80, (64, 128): 0.30, (64, 256): 0.45}
FIXUP_LAUNCH_US = 2.5
PARTIAL_BYTES_PER_US = 4.0e6  # fp32 partials written then read back, through L2
FIXUP_ROUND_TRIP_US = 1.0  # one L2 round trip of the fixup's loads (FIXUP_UNROLL partials at once)
FIXUP_UNROLL = 8  # loads in flight a thread with 16-row fixup programs (16 fp32 each: 128 registers)
FIXUP_REGS = 128  # fp32 registers a fixup thread spends on loads in flight
FIXUP_WARPS = 4


FIXUP_WIDE_WARPS = 8  # the wide fixup: one contributor a warp at a time
FIXUP_WIDE_ROWS = 2


def fixup_geometry(s: int, skp: int, bn: int) -> tuple[int, int, int]:
    """(rows a fixup program sums, loads in flight a thread, contributors summed side by side)
    for a Stream-K plan. Few contributors a split tile (the hybrid's last wave): 16-row programs
    of 4 warps, each thread walking the contributors in order with FIXUP_UNROLL loads in flight.
    Many (split-K of a few tiles over every SM: up to 133): the walk is a chain of loads a thread
    that can cost more than the split kernel itself (docs/schedules/cluster_gemm.md, round 3), so
    2-row programs of 8 warps take a contributor a warp, 8 side by side, and sum the 8 at the
    end: 8x fewer loads a thread."""
    if cdiv(skp, max(s, 1)) + 1 <= 2 * FIXUP_UNROLL:
        per_slot = max(1, 16 * bn // (FIXUP_WARPS * 32))  # fp32 elements a thread loads from one slot
        return 16, max(1, min(32, FIXUP_REGS // per_slot)), 1
    per_slot = max(1, FIXUP_WIDE_ROWS * bn // 32)  # a warp holds the program's rows of one slot
    return FIXUP_WIDE_ROWS, max(1, min(8, (FIXUP_REGS // 2) // per_slot)), FIXUP_WIDE_WARPS
HBM_BYTES_PER_US = 4.0e6  # what a streaming GEMM reads from HBM (cuBLAS's skinny rows: 3.3-3.6 TB/s)


def estimate_us(cfg: Config, M: int, N: int, K: int, sm_count: int = 132) -> float:
    """Predicted time: the busiest program's K steps at the tile's measured step time, plus
    the Stream-K fixup (launch, partial bytes). Clusters and multicast are priced as their
    CTAs (the run measured them within noise of one CTA on full waves). Never under the
    time to read A and B and write C once from HBM."""
    tm, bn = cfg.cluster_m, cfg.BLOCK_N
    tiles = cdiv(M, tm) * cdiv(N, bn)
    iters = cdiv(K, cfg.BLOCK_K)
    progs = programs(cfg, sm_count)
    step = ITER_US.get((cfg.BLOCK_M, cfg.BLOCK_N), 0.40 * cfg.BLOCK_M * cfg.BLOCK_N / 16384) * cfg.BLOCK_K / 64
    s, skp = sk_plan(tiles, iters, progs, cfg.stream_k)
    floor = 2 * (M * K + K * N + M * N) / HBM_BYTES_PER_US
    if s == 0:
        return max(floor, cdiv(tiles, progs) * iters * step)
    dp_waves = (tiles - s) // progs
    busiest = dp_waves * iters + cdiv(s * iters, skp)
    per_tile = [len(contributors(t, s, iters, skp)) for t in range(s)]
    rows, cols = min(tm, M), min(bn, N)  # skinny partials are stored masked to C's extent
    _, unroll, ways = fixup_geometry(s, skp, bn)
    fixup = (FIXUP_LAUNCH_US + 2 * sum(per_tile) * rows * cols * 4 / PARTIAL_BYTES_PER_US
             + cdiv(max(per_tile), unroll * ways) * FIXUP_ROUND_TRIP_US)
    return max(floor, busiest * step) + fixup


def tiles_for(M: int) -> tuple[tuple[int, int, int], ...]:
    """(BLOCK_M, BLOCK_N, num_warps): one-warpgroup 64-row tiles where M is that small."""
    if M <= 64:
        return ((64, 128, 4), (64, 256, 4), (128, 128, 8))
    return ((128, 128, 8), (128, 256, 8), (256, 128, 8))


def search_space(M: int, N: int, K: int, dtype=None, sm_count: int = 132) -> list[Config]:
    """WS steps of every tile (the ring as deep as shared memory allows): data-parallel and
    Stream-K (the latter only where it changes the schedule: a partial last wave), clusters
    only where M has two tile rows to pair; 256x128, never a winner data-parallel, only with
    Stream-K. Ordered by the model's estimate, fastest first."""
    out = []
    for bm, bn, w in tiles_for(M):
        stages = stages_for(bm, bn, 64)
        for step, knobs in STEPS.items():
            if not knobs["ws"]:
                continue
            if knobs["cluster"] == 2 and M <= bm:
                continue
            if bm == 256 and not knobs["stream_k"]:
                continue
            cfg = Config(bm, bn, 64, stages, 8, w, **knobs)
            if knobs["stream_k"]:
                tiles = cdiv(M, cfg.cluster_m) * cdiv(N, bn)
                if sk_plan(tiles, cdiv(K, 64), programs(cfg, sm_count), True)[0] == 0:
                    continue
            out.append(cfg)
    # stable: among equal estimates the full design (cluster + multicast) first
    order = {name: i for i, name in enumerate(["ws_c2_mc_sk", "ws_c2_sk", "ws_sk", "ws_c2_mc", "ws_c2", "ws", "pipe"])}
    out.sort(key=lambda c: (round(estimate_us(c, M, N, K, sm_count), 1), order[step_of(c)]))
    return out


def default_config(M: int, N: int, K: int, dtype=None, sm_count: int = 132) -> Config:
    """The model's pick from the search space (measured winners replace it)."""
    space = search_space(M, N, K, dtype, sm_count)
    if space:
        return space[0]
    return Config(128, 128, 64, stages_for(128, 128), 8, 8, True, 1, False)
