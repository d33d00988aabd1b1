"""Cluster GEMM: a persistent Hopper GEMM in Gluon (Triton >= 3.9), with warp specialization
and 2-CTA thread-block clusters that share one operand tile through TMA multicast.

What
    C = A @ B (bf16/fp16 in, fp32 accumulate, C in the input dtype) written in Gluon
    (`triton.experimental.gluon`), where layouts, shared memory, mbarriers and warp roles are
    explicit. One program is one cluster of `cluster` CTAs (Gluon's model: a `num_ctas=2`
    program owns a tile twice as tall and its layouts say which CTA holds which half).
    Three knobs add one mechanism each, so a GPU run can price each step:

    - ws=False, cluster=1: persistent, software-pipelined: a STAGES-deep ring of shared-memory
      slots filled by TMA (one mbarrier per slot), async `warpgroup_mma` with one MMA in flight,
      a TMA-store epilogue whose store drains while the next tile's K loop runs.
    - ws=True: a 1-warp producer partition issues the TMA loads into the ring (ready/empty
      mbarrier pair per slot) while the consumer warpgroup(s) run wgmma and the epilogue; the
      producer runs ahead into the next tile during the epilogue.
    - cluster=2: two CTAs on neighbouring M tiles (the cluster tile is 2*BLOCK_M x BLOCK_N)
      read the same B tile; B's shared-memory layout is broadcast over the cluster
      (cga_layout [[0, 0]]) and loaded with `multicast=True`, so each B tile crosses L2 once
      for both SMs. A slot of B is written into both CTAs' shared memory, so it may only be
      refilled once both CTAs' consumers are done with it: the "empty" barriers are cluster
      barriers (one per slot on the lead CTA, one arrival per CTA).

    BLOCK_M x BLOCK_N per CTA: 128x128 and 128x256 on one consumer warpgroup pair (8 warps:
    wgmma m64 per warpgroup), 256x128 on 8 warps (two m64 row blocks per warpgroup). The tile
    order is grouped (GROUP_M rows of tiles share B columns in L2), over cluster tiles.

When it wins
    Expected where cuBLAS's Hopper kernels win through clusters: large and tail-wave GEMMs
    whose B traffic the multicast halves. Unmeasured as written (docs/schedules/cluster_gemm.md).

Caveats
    - Needs Triton >= 3.9 (Gluon with cga layouts and multicast) and an sm_90 GPU. The module
      imports anywhere: `available()` says why not, and `matmul` raises RuntimeError (one line)
      instead of an ImportError.
    - bf16/fp16 only; A and B row-major, contiguous in their last dimension with 16-byte
      aligned leading strides (TMA); M, N, K any size (TMA zero-fills out-of-bounds boxes and
      clips the store), K not a multiple of BLOCK_K included.
    - Stream-K / split of the last wave is not in this kernel: a partial last wave of cluster
      tiles is left as is (the tail suite measures what that costs).

Source of the idea
    CUTLASS's Hopper warp-specialized persistent GEMM (producer warp, mbarrier ring, consumer
    warpgroups, cluster multicast of the shared operand); Gluon's tutorials for the API
    (NVMMA layouts, mbarrier, `tma.async_load(..., multicast=True)`, `warp_specialize`,
    multi-CTA barrier layouts). Written here from those facts.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

MIN_TRITON = (3, 9)
SMEM_PER_BLOCK_SM90 = 232448  # opt-in shared memory per block on sm_90 (227 KB)


def _version(text: str) -> tuple[int, int]:
    parts = []
    for p in text.split(".")[:2]:
        digits = "".join(ch for ch in p if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts + [0] * (2 - len(parts)))  # type: ignore[return-value]


def triton_version() -> tuple[int, int] | None:
    """(major, minor) of the importable Triton, or None without one; never imports Gluon."""
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        import triton  # noqa: F401  (the one on sys.path wins over the installed metadata)

        return _version(triton.__version__)
    except ImportError:
        try:
            return _version(version("triton"))
        except PackageNotFoundError:
            return None


def unavailable_reason() -> str | None:
    """None when this schedule can compile here (Triton >= 3.9 with Gluon), else one line."""
    v = triton_version()
    if v is None:
        return "cluster_gemm needs Triton >= 3.9 (Gluon); Triton is not installed"
    if v < MIN_TRITON:
        return f"cluster_gemm needs Triton >= 3.9 (Gluon clusters and TMA multicast); this is Triton {v[0]}.{v[1]}"
    try:
        _gluon()
    except Exception as exc:  # noqa: BLE001  (any failure to build the kernels is the reason)
        return f"cluster_gemm: Triton {v[0]}.{v[1]}'s Gluon did not load: {type(exc).__name__}: {exc}"[:300]
    return None


def available() -> bool:
    return unavailable_reason() is None


@dataclass(frozen=True)
class Config:
    BLOCK_M: int = 128  # rows of C per CTA (the cluster tile is cluster * BLOCK_M rows)
    BLOCK_N: int = 128  # columns of C per CTA
    BLOCK_K: int = 64  # K step (one 128-byte swizzled row of a 16-bit type)
    STAGES: int = 4  # shared-memory ring depth (A and B slots)
    GROUP_M: int = 8  # cluster-tile rows per L2 group (grouped order)
    num_warps: int = 8  # consumer warps: 8 = two warpgroups
    ws: bool = True  # a 1-warp TMA producer partition beside the consumer warpgroups
    cluster: int = 2  # CTAs per cluster along M (1 or 2); 2 shares each B tile
    multicast: bool = True  # with cluster=2: load the shared B tile once for both CTAs

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
        # accumulator registers a thread: BLOCK_M*BLOCK_N fp32 over num_warps*32 threads
        if self.BLOCK_M * self.BLOCK_N // (self.num_warps * 32) > 128:
            raise ValueError(f"{self.BLOCK_M}x{self.BLOCK_N} on {self.num_warps} warps: "
                             f"{self.BLOCK_M * self.BLOCK_N // (self.num_warps * 32)} fp32 accumulator registers "
                             f"a thread (over 128: spills)")

    def smem_bytes(self, elt: int = 2) -> int:
        """Shared memory a CTA: the A/B ring, the C staging tile, the barriers."""
        ring = self.STAGES * (self.BLOCK_M + self.BLOCK_N) * self.BLOCK_K * elt
        return ring + self.BLOCK_M * self.BLOCK_N * elt + 2 * self.STAGES * 8 + 1024

    def validate(self, dtype=None) -> None:
        elt = 2 if dtype is None else _itemsize(dtype)
        if elt != 2:
            raise ValueError(f"cluster_gemm takes bf16/fp16 inputs, not {dtype}")
        if self.smem_bytes(elt) > SMEM_PER_BLOCK_SM90:
            raise ValueError(f"STAGES={self.STAGES} with {self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K}: "
                             f"{self.smem_bytes(elt):,} bytes of shared memory, over the 227 KB of an sm_90 block")

    def describe(self) -> str:
        return (f"{self.BLOCK_M}x{self.BLOCK_N}x{self.BLOCK_K} s{self.STAGES} g{self.GROUP_M} w{self.num_warps} "
                f"{'ws' if self.ws else 'pipe'} c{self.cluster}{'+mc' if self.multicast else ''}")

    def as_dict(self) -> dict:
        return asdict(self)


def _itemsize(dtype) -> int:
    size = getattr(dtype, "itemsize", None)
    if size is None:
        import torch

        size = torch.empty((), dtype=dtype).element_size()
    return int(size)


# The steps the GPU run prices one by one: pipelined -> + warp specialization -> + cluster -> + multicast.
STEPS = {
    "pipe": dict(ws=False, cluster=1, multicast=False),
    "ws": dict(ws=True, cluster=1, multicast=False),
    "ws_c2": dict(ws=True, cluster=2, multicast=False),
    "ws_c2_mc": dict(ws=True, cluster=2, multicast=True),
}
TILES = ((128, 128, 8), (128, 256, 8), (256, 128, 8))  # BLOCK_M, BLOCK_N, num_warps


def _stages_for(bm: int, bn: int, bk: int, elt: int = 2) -> int:
    """The deepest ring (<= 6) that fits an sm_90 block beside the C staging tile."""
    for s in range(6, 1, -1):
        if Config(bm, bn, bk, s, 8, 8, False, 1, False).smem_bytes(elt) <= SMEM_PER_BLOCK_SM90:
            return s
    return 2


def search_space(M: int, N: int, K: int, dtype=None, sm_count: int = 132) -> list[Config]:
    """Every step of every tile, the ring as deep as shared memory allows; cluster configs only
    where there are at least two M tiles to pair."""
    out = []
    for bm, bn, w in TILES:
        stages = _stages_for(bm, bn, 64)
        # the full design first: the analytical model cannot price WS or multicast, and ranks ties in order
        for step, knobs in reversed(list(STEPS.items())):
            if knobs["cluster"] == 2 and M <= bm:
                continue
            out.append(Config(bm, bn, 64, stages, 8, w, **knobs))
    return out


def default_config(M: int, N: int, K: int, dtype=None, sm_count: int = 132) -> Config:
    """128x256 per CTA with the full design (WS, 2-CTA cluster, multicast B) where M has two
    tile rows to pair, else 128x128 with WS alone: the shape of cuBLAS's default Hopper kernels.
    Unmeasured; the bench's measured winner replaces it."""
    if M > 128 and N > 128:
        return Config(128, 256, 64, _stages_for(128, 256, 64), 8, 8, True, 2, True)
    return Config(128, 128, 64, _stages_for(128, 128, 64), 8, 8, True, 1, False)


def _gluon():
    """The Gluon half of this file (defined only under Triton >= 3.9)."""
    if not _HAVE_GLUON:
        raise RuntimeError(_GLUON_WHY)
    return _launch


def _check_inputs(a, b):
    import torch

    if a.dim() != 2 or b.dim() != 2:
        raise ValueError(f"cluster_gemm: 2-D inputs, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"cluster_gemm: inner dimensions differ: {tuple(a.shape)} @ {tuple(b.shape)}")
    if a.dtype != b.dtype or a.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"cluster_gemm: bf16 or fp16 inputs of one dtype, got {a.dtype} and {b.dtype}")
    if a.device != b.device:
        raise ValueError(f"cluster_gemm: inputs on {a.device} and {b.device}")
    for name, t in (("A", a), ("B", b)):
        if t.stride(1) != 1 or (t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16:
            raise ValueError(f"cluster_gemm: {name} must be row-major with 16-byte aligned rows and base (TMA); "
                             f"strides {tuple(t.stride())}")
    if a.device.type != "cuda" and os.environ.get("ADVISOR_COMPILE_ONLY") != "1":
        raise ValueError(f"cluster_gemm: CUDA tensors needed, got {a.device}")
    return a.shape[0], b.shape[1], a.shape[1]


def num_sms(device=None) -> int:
    env = os.environ.get("ADVISOR_NUM_SMS")
    if env:
        return int(env)
    import torch

    return torch.cuda.get_device_properties(device or torch.cuda.current_device()).multi_processor_count


def matmul(a, b, config: Config | None = None, out=None):
    """C = A @ B on the cluster GEMM. RuntimeError (one line) without Triton >= 3.9."""
    why = unavailable_reason()
    if why is not None:
        raise RuntimeError(why)
    import torch

    M, N, K = _check_inputs(a, b)
    cfg = config or default_config(M, N, K, a.dtype)
    cfg.validate(a.dtype)
    if out is None:
        out = torch.empty((M, N), dtype=a.dtype, device=a.device)
    elif out.shape != (M, N) or out.dtype != a.dtype or out.stride(1) != 1:
        raise ValueError(f"cluster_gemm: out must be a row-major {M}x{N} {a.dtype} tensor")
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()
    _gluon()(a, b, out, cfg, num_sms(a.device))
    return out


# ---------------------------------------------------------------------------------------------
# The Gluon kernels. Defined only where Triton >= 3.9 is importable, so that this file imports
# (and the advisor generates and diagnoses) under older Triton or none.

_V = triton_version()
_HAVE_GLUON = False
_GLUON_WHY = "cluster_gemm needs Triton >= 3.9 (Gluon)"
if _V is not None and _V >= MIN_TRITON:
    try:
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.ampere.mbarrier import MBarrierLayout
        from triton.experimental.gluon.language.nvidia.hopper import (
            cluster,
            fence_async_shared,
            mbarrier,
            tma,
            warpgroup_mma,
            warpgroup_mma_wait,
        )
        from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

        _HAVE_GLUON = True
    except Exception as _exc:  # noqa: BLE001  (a partial Gluon is reported, not raised at import)
        _GLUON_WHY = f"cluster_gemm: Triton {_V[0]}.{_V[1]}'s Gluon did not import: {type(_exc).__name__}: {_exc}"

if _HAVE_GLUON:

    @gluon.jit
    def _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M: gl.constexpr):
        # grouped order: GROUP_M cluster-tile rows sweep the columns together (B stays in L2)
        per_group = GROUP_M * num_pid_n
        group = tile // per_group
        first_m = group * GROUP_M
        rows = gl.minimum(num_pid_m - first_m, GROUP_M)
        pid_m = first_m + (tile % per_group) % rows
        pid_n = (tile % per_group) // rows
        return pid_m, pid_n

    @gluon.jit
    def _epilogue(acc, c_desc, c_smem, off_m, off_n):
        # the previous tile's store must have read c_smem before it is overwritten; waiting
        # only here lets that store drain during this tile's K loop
        tma.store_wait(pendings=0)
        c_smem.store(acc.to(c_desc.dtype))
        fence_async_shared()
        tma.async_store(c_desc, [off_m, off_n], c_smem)

    @gluon.jit
    def _pipelined_kernel(a_desc, b_desc, c_desc, M, N, K,
                          STAGES: gl.constexpr, GROUP_M: gl.constexpr, ACC_LAYOUT: gl.constexpr):
        """ws=False: each program issues its own TMA loads STAGES-1 steps ahead of the wgmma."""
        TM: gl.constexpr = c_desc.block_shape[0]  # the cluster tile's rows
        BN: gl.constexpr = c_desc.block_shape[1]
        BK: gl.constexpr = a_desc.block_shape[1]
        dtype: gl.constexpr = a_desc.dtype
        a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_shape, b_desc.layout)
        c_smem = gl.allocate_shared_memory(dtype, c_desc.block_shape, c_desc.layout)
        ready = mbarrier.allocate_mbarrier(batch=STAGES)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
        nbytes: gl.constexpr = a_desc.nbytes_per_cta + b_desc.nbytes_per_cta

        num_pid_m = gl.cdiv(M, TM)
        num_pid_n = gl.cdiv(N, BN)
        k_tiles = gl.cdiv(K, BK)
        prod = 0
        cons = 0
        for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * TM
            off_n = pid_n * BN
            for i in gl.static_range(STAGES - 1):
                s = prod % STAGES
                pred = i < k_tiles
                mbarrier.expect(ready.index(s), nbytes, pred=pred)
                tma.async_load(a_desc, [off_m, i * BK], ready.index(s), a_bufs.index(s), pred=pred)
                tma.async_load(b_desc, [i * BK, off_n], ready.index(s), b_bufs.index(s), pred=pred)
                prod += gl.where(pred, 1, 0)
            acc = gl.zeros([TM, BN], gl.float32, ACC_LAYOUT)
            for k in range(k_tiles):
                s = cons % STAGES
                mbarrier.wait(ready.index(s), (cons // STAGES) & 1)
                acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
                # one wgmma in flight: the previous one is done, so its slot can be refilled
                acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
                cons += 1
                nk = k + STAGES - 1
                pred = nk < k_tiles
                ps = prod % STAGES
                mbarrier.expect(ready.index(ps), nbytes, pred=pred)
                tma.async_load(a_desc, [off_m, nk * BK], ready.index(ps), a_bufs.index(ps), pred=pred)
                tma.async_load(b_desc, [nk * BK, off_n], ready.index(ps), b_bufs.index(ps), pred=pred)
                prod += gl.where(pred, 1, 0)
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
            _epilogue(acc, c_desc, c_smem, off_m, off_n)
        tma.store_wait(pendings=0)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(ready.index(i))

    @gluon.jit
    def _ws_producer(a_desc, b_desc, a_bufs, b_bufs, ready, empty, cl_empty, M, N, K,
                     STAGES: gl.constexpr, GROUP_M: gl.constexpr, MULTICAST: gl.constexpr):
        """One warp: TMA loads into the ring, as far ahead of the consumers as the ring allows."""
        TM: gl.constexpr = a_desc.block_shape[0]
        BN: gl.constexpr = b_desc.block_shape[1]
        BK: gl.constexpr = a_desc.block_shape[1]
        nbytes: gl.constexpr = a_desc.nbytes_per_cta + b_desc.nbytes_per_cta
        num_pid_m = gl.cdiv(M, TM)
        num_pid_n = gl.cdiv(N, BN)
        k_tiles = gl.cdiv(K, BK)
        cnt = 0
        for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            off_m = pid_m * TM
            off_n = pid_n * BN
            for k in range(k_tiles):
                s = cnt % STAGES
                # parity ^ 1: the first pass over the ring finds every slot free
                ph = ((cnt // STAGES) & 1) ^ 1
                mbarrier.wait(empty.index(s), ph)
                if MULTICAST:
                    # B lands in both CTAs' slot s: both CTAs' consumers must be done with it
                    mbarrier.wait(cl_empty.index(s), ph)
                mbarrier.expect(ready.index(s), nbytes)
                tma.async_load(a_desc, [off_m, k * BK], ready.index(s), a_bufs.index(s))
                tma.async_load(b_desc, [k * BK, off_n], ready.index(s), b_bufs.index(s), multicast=MULTICAST)
                cnt += 1

    @gluon.jit
    def _ws_consumer(a_desc, c_desc, a_bufs, b_bufs, ready, empty, cl_empty, c_smem, M, N, K,
                     STAGES: gl.constexpr, GROUP_M: gl.constexpr, MULTICAST: gl.constexpr,
                     ACC_LAYOUT: gl.constexpr):
        """The consumer warpgroup(s): async wgmma over the ring, then the TMA-store epilogue."""
        TM: gl.constexpr = c_desc.block_shape[0]
        BN: gl.constexpr = c_desc.block_shape[1]
        BK: gl.constexpr = a_desc.block_shape[1]
        num_pid_m = gl.cdiv(M, TM)
        num_pid_n = gl.cdiv(N, BN)
        k_tiles = gl.cdiv(K, BK)
        cnt = 0
        for tile in range(gl.program_id(0), num_pid_m * num_pid_n, gl.num_programs(0)):
            pid_m, pid_n = _tile_coords(tile, num_pid_m, num_pid_n, GROUP_M)
            acc = gl.zeros([TM, BN], gl.float32, ACC_LAYOUT)
            for k in range(k_tiles):
                s = cnt % STAGES
                mbarrier.wait(ready.index(s), (cnt // STAGES) & 1)
                acc = warpgroup_mma(a_bufs.index(s), b_bufs.index(s), acc, is_async=True)
                acc = warpgroup_mma_wait(num_outstanding=1, deps=[acc])
                # the wgmma of step k-1 has finished reading its slot: hand it back
                prev = (cnt + STAGES - 1) % STAGES
                mbarrier.arrive(empty.index(prev), pred=k > 0)
                if MULTICAST:
                    mbarrier.arrive(cl_empty.index(prev), pred=k > 0)
                cnt += 1
            acc = warpgroup_mma_wait(num_outstanding=0, deps=[acc])
            last = (cnt + STAGES - 1) % STAGES
            mbarrier.arrive(empty.index(last), pred=k_tiles > 0)
            if MULTICAST:
                mbarrier.arrive(cl_empty.index(last), pred=k_tiles > 0)
            _epilogue(acc, c_desc, c_smem, pid_m * TM, pid_n * BN)
        tma.store_wait(pendings=0)

    @gluon.jit
    def _ws_kernel(a_desc, b_desc, c_desc, M, N, K,
                   STAGES: gl.constexpr, GROUP_M: gl.constexpr, ACC_LAYOUT: gl.constexpr,
                   MULTICAST: gl.constexpr, CL_BAR_LAYOUT: gl.constexpr):
        dtype: gl.constexpr = a_desc.dtype
        a_bufs = gl.allocate_shared_memory(dtype, [STAGES] + a_desc.block_shape, a_desc.layout)
        b_bufs = gl.allocate_shared_memory(dtype, [STAGES] + b_desc.block_shape, b_desc.layout)
        c_smem = gl.allocate_shared_memory(dtype, c_desc.block_shape, c_desc.layout)
        ready = mbarrier.allocate_mbarrier(batch=STAGES)
        empty = mbarrier.allocate_mbarrier(batch=STAGES)
        # cluster barriers: one per slot for the whole cluster (on the lead CTA), one arrival a CTA
        cl_empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], CL_BAR_LAYOUT)
        for i in gl.static_range(STAGES):
            mbarrier.init(ready.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
            if MULTICAST:
                mbarrier.init(cl_empty.index(i), count=1)
        gl.warp_specialize([
            (_ws_consumer, (a_desc, c_desc, a_bufs, b_bufs, ready, empty, cl_empty, c_smem, M, N, K,
                            STAGES, GROUP_M, MULTICAST, ACC_LAYOUT)),
            (_ws_producer, (a_desc, b_desc, a_bufs, b_bufs, ready, empty, cl_empty, M, N, K,
                            STAGES, GROUP_M, MULTICAST)),
        ], [1], [40])
        if MULTICAST:
            # a CTA must not exit while its peer may still arrive on its barriers or receive B
            cluster.barrier()

    def _gl_dtype(torch_dtype):
        import torch

        return {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}[torch_dtype]

    def _launch(a, b, c, cfg: Config, sms: int):
        M, K = a.shape
        N = b.shape[1]
        dt = _gl_dtype(a.dtype)
        TM = cfg.cluster * cfg.BLOCK_M
        # cluster=2: A and C split along M over the two CTAs; B the same tile in both
        split_m = [[1, 0]] if cfg.cluster == 2 else []
        b_cga = [[0, 0]] if cfg.cluster == 2 else []
        a_layout = gl.NVMMASharedLayout.get_default_for([TM, cfg.BLOCK_K], dt, cga_layout=split_m)
        b_layout = gl.NVMMASharedLayout.get_default_for([cfg.BLOCK_K, cfg.BLOCK_N], dt, cga_layout=b_cga)
        c_layout = gl.NVMMASharedLayout.get_default_for([TM, cfg.BLOCK_N], dt, cga_layout=split_m)
        a_desc = TensorDescriptor.from_tensor(a, [TM, cfg.BLOCK_K], a_layout)
        b_desc = TensorDescriptor.from_tensor(b, [cfg.BLOCK_K, cfg.BLOCK_N], b_layout)
        c_desc = TensorDescriptor.from_tensor(c, [TM, cfg.BLOCK_N], c_layout)
        acc_layout = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[cfg.num_warps, 1],
                                               instr_shape=[16, cfg.BLOCK_N, 16], cga_layout=split_m)
        tiles = -(-M // TM) * -(-N // cfg.BLOCK_N)
        grid = (max(1, min(tiles, sms // cfg.cluster)),)
        if cfg.ws:
            cl_layout = MBarrierLayout(cga_layout=[[0]] if cfg.cluster == 2 else [])
            return _ws_kernel[grid](a_desc, b_desc, c_desc, M, N, K, cfg.STAGES, cfg.GROUP_M, acc_layout,
                                    cfg.multicast, cl_layout, num_warps=cfg.num_warps, num_ctas=cfg.cluster)
        return _pipelined_kernel[grid](a_desc, b_desc, c_desc, M, N, K, cfg.STAGES, cfg.GROUP_M, acc_layout,
                                       num_warps=cfg.num_warps, num_ctas=cfg.cluster)


if __name__ == "__main__":
    import torch

    a = torch.randn(1000, 776, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(776, 1304, device="cuda", dtype=torch.bfloat16)
    for c in search_space(1000, 1304, 776):
        err = (matmul(a, b, c).float() - a.float() @ b.float()).abs().max().item()
        print(c.describe(), f"max abs err {err:.3g}")
