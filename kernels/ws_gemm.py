"""Warp-specialized persistent GEMM for Hopper: TMA producer, wgmma consumers.

What it does
------------
C = A @ B with one CTA per SM (grid = #SMs) that walks the output tiles in grouped order
(GROUP_M rows of tiles sweep across N together, so the A and B panels a wave needs stay in
L2). A and B always move through TMA, as tensor descriptors built either on the host
(`triton.tools.tensor_descriptor.TensorDescriptor`, passed to the kernel by value) or
inside the kernel with `tl.make_tensor_descriptor` (device-side: each CTA writes its
128-byte descriptors into a small global workspace, which is why `triton.set_allocator`
must be set; the launcher installs one when the process has none). C leaves either by a
TMA store or by masked pointer stores (`tma_store`; see the epilogue caveat below).

With `warp_specialize=True` the tile loop carries `tl.range(..., warp_specialize=True)`.
On sm_90 Triton 3.6 hands that loop to its Hopper "autoWS" pass, which splits the CTA into
a producer warp group that only issues TMA loads into a ring of `num_stages` shared-memory
buffers and two consumer warp groups that each run wgmma on half of the tile (the pass
partitions the accumulator along M) and then the epilogue. Producer and consumers meet at
mbarriers, so loads for the next k-step, or the next tile, proceed while the consumers
multiply or store. That is the producer/consumer split of CUTLASS 3's warp-specialized
persistent kernels and of FlashAttention-3, done by the compiler instead of by hand.

When it wins
------------
Large, compute-bound GEMMs on Hopper (the matrix's "cc 9.x, GEMM time in kernels that are
not warp-specialized"), where a software-pipelined kernel loses issue slots to address
arithmetic and barrier waits inside the consumer warps. WS is not a sure win: it gained on
one large tile and was neutral or worse on others (docs/schedules/ws.md), so `search_space` always pairs a
WS config with its non-WS twin and the benchmark decides.

Caveats (Triton 3.6 on sm_90, read from the compiler's Hopper pass and checked by
compiling every config for sm_90 on the CPU: `python -m kernels.ws_gemm --compile-sm90`)
------------------------------------------------------------------------------------
* The Hopper pass only specializes when `num_warps == 4` (it then adds two warp groups:
  the kernel runs with 12 warps), when `num_stages > 1` and when the function has no
  runtime `if/else`; otherwise it silently drops the request. So every branch in this
  kernel is compile-time, and `Config.validate` rejects WS with 8 warps or with `flatten`
  (flattening the tile and k loops creates exactly such branches) rather than letting the
  request vanish. The pass halves the tile along M for its two consumers, so WS needs
  `block_m >= 128` (64-row tiles fail in wgmma lowering).
* Epilogue. A TMA store stages C in shared memory; for a 128x256 bf16 tile that is 64 KiB,
  which with WS leaves room for only 3 ring stages, and the WS pass can only split that
  store when the C descriptor is built on the device and C is stored in one piece (it cannot
  resize a host descriptor's block; column subtiles use reshape/split, which its data
  partitioner rejects). The WS configs therefore default to masked pointer stores
  (`tma_store=False`): no staging tile, a 4-deep ring, and the producer keeps loading the
  next tile while the consumers store. Non-WS configs use the TMA store with
  `epilogue_subtile` 1/2/4 column slices to free shared memory for the ring.
* fp32 (tf32) with WS does not compile for row-major B (wgmma wants K-major tf32
  operands), so the fp32 search space holds only the pipelined variants. matmul copies an
  fp32 operand strided in K into K-major storage first where that pays
  (kernels/tf32_layout.py); WS on such copies was not tried.
* 2-CTA clusters (`num_ctas=2`) are not a knob: on sm_90 Triton 3.6 fails to compile them
  with the TMA-store epilogue, and `tl` has no TMA multicast, so a cluster would only split
  the tile between two CTAs without sharing loads, which is not what makes CUTLASS's
  2-SM schedules fast.
* TMA needs 16-byte aligned base addresses and row strides and a unit inner stride.
  Row-major operands and transposed views (`x.t()` of a row-major tensor) are read in place:
  a transposed view gets a descriptor over its real storage, its tile is loaded in the
  stored orientation and transposed with `.T`, which only changes how wgmma reads the
  shared-memory tile (16-bit wgmma takes either major-ness; no data moves). Anything else
  (a general strided view, an odd inner dimension such as K=37 in bf16, a misaligned
  offset) is first copied into a padded, aligned buffer (`persistent_gemm.aligned_copy`: a
  copy kernel where rows are 8-byte aligned, torch's `copy_` elsewhere); `allow_copy=False` turns that
  into a ValueError. A TMA-stored output whose N * element size is not a multiple of 16
  bytes is computed into a padded buffer and copied out.
* Needs sm_90 or newer (TMA and wgmma): on older GPUs and on ROCm the launcher raises
  RuntimeError naming `persistent_gemm` (pointer loads) as the schedule to use instead. On
  sm_100 Triton uses its generic WS pass; the search space was chosen for sm_90. Under
  `TRITON_INTERPRET=1` it runs on the CPU; the interpreter ignores the WS and flatten
  flags, so CPU tests check the code paths and the math, not the specialization.
* fp32 inputs run as tf32 on tensor cores (see common.TOLERANCE).

Where the idea comes from
-------------------------
Triton tutorial 09-persistent-matmul (persistent TMA kernels, host and device descriptors,
epilogue subtiling, `warp_specialize` on the tile loop), the Triton/Meta Hopper automatic
warp specialization (PyTorch blog "Enabling advanced GPU features in PyTorch - Warp
Specialization", 2025-02), CUTLASS 3 `KernelTmaWarpSpecializedCooperative` and
FlashAttention-3's producer/consumer warp groups.

Run `python -m kernels.ws_gemm` on a Hopper GPU (or with TRITON_INTERPRET=1 on the CPU) for
the self-check; `python -m kernels.ws_gemm --compile-sm90` compiles the whole search space for
sm_90 without a GPU and prints shared memory, warps and whether WS engaged.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from .common import (
    ensure_allocator,
    aligned_empty,
    cdiv,
    gemm_launch_metadata,
    self_check,
)
from .common import num_sms as _num_sms
from .dp_gemm import tile_coords
from .gemm_call import begin, inputs_and_output
from .persistent_gemm import aligned_copy
from .runtime import Recorder
from .ws_configs import (  # the knobs and the host's choice of them, re-exported: the schedule's API
    Config,
    SMEM_LIMIT_BYTES,
    SMEM_SLACK_BYTES,
    TMA_ALIGN_BYTES,
    _C16,
    _C32,
    _first_candidate,
    default_config,
    search_space,
)

try:  # host-side TMA descriptors (Triton >= 3.3)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton
    TensorDescriptor = None


# --------------------------------------------------------------------------------------
# Knobs
# --------------------------------------------------------------------------------------


# --------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------


def _launch_metadata(grid, kernel, args):
    """common.gemm_launch_metadata, with the WS flag in the name so traces tell both apart."""
    meta = gemm_launch_metadata("ws_gemm" if args.get("WARP_SPECIALIZE") else "ws_gemm_nows")(grid, kernel, args)
    return meta


@triton.jit
def _store_tile_pointers(c_ptr, acc, off_m, off_n, M, N, stride_c,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """Write one tile with masked pointer stores (no shared-memory staging)."""
    rows = off_m + tl.arange(0, BLOCK_M)
    cols = off_n + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    ptrs = c_ptr + rows[:, None].to(tl.int64) * stride_c + cols[None, :]
    tl.store(ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _store_tile(c_desc, acc, off_m, off_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                EPILOGUE_SUBTILE: tl.constexpr):
    """Write one fp32 accumulator tile through TMA, in 1, 2 or 4 column slices. Smaller
    slices need a smaller shared-memory staging buffer, which pays for a deeper ring."""
    out_ty = c_desc.dtype
    if EPILOGUE_SUBTILE == 1:
        c_desc.store([off_m, off_n], acc.to(out_ty))
    elif EPILOGUE_SUBTILE == 2:
        halves = tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)).permute(0, 2, 1)
        left, right = tl.split(halves)
        c_desc.store([off_m, off_n], left.to(out_ty))
        c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(out_ty))
    else:
        halves = tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)).permute(0, 2, 1)
        left, right = tl.split(halves)
        q = tl.reshape(left, (BLOCK_M, 2, BLOCK_N // 4)).permute(0, 2, 1)
        q0, q1 = tl.split(q)
        c_desc.store([off_m, off_n], q0.to(out_ty))
        c_desc.store([off_m, off_n + BLOCK_N // 4], q1.to(out_ty))
        q = tl.reshape(right, (BLOCK_M, 2, BLOCK_N // 4)).permute(0, 2, 1)
        q2, q3 = tl.split(q)
        c_desc.store([off_m, off_n + BLOCK_N // 2], q2.to(out_ty))
        c_desc.store([off_m, off_n + 3 * (BLOCK_N // 4)], q3.to(out_ty))


@triton.jit(launch_metadata=_launch_metadata)
def ws_gemm_kernel(
    # operands: host TensorDescriptors when HOST_DESC, raw pointers otherwise
    a_ptr, b_ptr, c_ptr,
    # problem size: C[M, N] = A[M, K] @ B[K, N]
    M, N, K,
    # row strides (elements) of the matrices as stored; used by device-side descriptors
    stride_a, stride_b, stride_c,
    # tile shape and tile order
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    # storage: A kept as (K, M) rows, B kept as (N, K) rows (transposed views, read in place)
    A_TRANSPOSED: tl.constexpr, B_TRANSPOSED: tl.constexpr,
    # schedule: programs in the grid, WS/flatten on the tile loop, C slices (TMA store),
    # descriptors from the host or built here, C by TMA store or by pointer stores
    NUM_SMS: tl.constexpr, WARP_SPECIALIZE: tl.constexpr, FLATTEN: tl.constexpr,
    EPILOGUE_SUBTILE: tl.constexpr, HOST_DESC: tl.constexpr, C_TMA: tl.constexpr,
):
    # Descriptors. Every branch here is compile-time: the Hopper WS pass gives up on any
    # runtime if/else in the function.
    if HOST_DESC:
        a_desc = a_ptr
        b_desc = b_ptr
    else:
        if A_TRANSPOSED:
            a_desc = tl.make_tensor_descriptor(a_ptr, shape=[K, M], strides=[stride_a, 1],
                                               block_shape=[BLOCK_K, BLOCK_M])
        else:
            a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_a, 1],
                                               block_shape=[BLOCK_M, BLOCK_K])
        if B_TRANSPOSED:
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[stride_b, 1],
                                               block_shape=[BLOCK_N, BLOCK_K])
        else:
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_b, 1],
                                               block_shape=[BLOCK_K, BLOCK_N])
    if C_TMA:
        if HOST_DESC:
            c_desc = c_ptr
        else:
            c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_c, 1],
                                               block_shape=[BLOCK_M, BLOCK_N // EPILOGUE_SUBTILE])

    pid = tl.program_id(axis=0)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_tiles = tl.cdiv(K, BLOCK_K)

    # The epilogue re-derives its tile from a counter of its own rather than reusing the
    # loop variable: once the compiler flattens or partitions the loop, the epilogue of
    # tile i runs while loads for tile i+1 are in flight, and a shared value would tie
    # the two together.
    tile_id_c = pid - NUM_SMS
    for tile_id in tl.range(pid, num_tiles, NUM_SMS, flatten=FLATTEN, warp_specialize=WARP_SPECIALIZE):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N

        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for ki in range(k_tiles):
            off_k = ki * BLOCK_K
            # TMA fills out-of-bounds rows/cols with zeros: no masks for ragged M, N, K.
            if A_TRANSPOSED:
                a = a_desc.load([off_k, off_m]).T
            else:
                a = a_desc.load([off_m, off_k])
            if B_TRANSPOSED:
                b = b_desc.load([off_n, off_k]).T
            else:
                b = b_desc.load([off_k, off_n])
            acc = tl.dot(a, b, acc)

        tile_id_c += NUM_SMS
        pid_m_c, pid_n_c = tile_coords(tile_id_c, num_pid_m, num_pid_n, GROUP_M)
        if C_TMA:
            # TMA stores clip at the tensor edge: no masks either.
            _store_tile(c_desc, acc, pid_m_c * BLOCK_M, pid_n_c * BLOCK_N, BLOCK_M, BLOCK_N, EPILOGUE_SUBTILE)
        else:
            _store_tile_pointers(c_ptr, acc, pid_m_c * BLOCK_M, pid_n_c * BLOCK_N, M, N, stride_c,
                                 BLOCK_M, BLOCK_N)


# --------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def require_tma_device(device: torch.device) -> None:
    """Raise RuntimeError unless `device` can run TMA + wgmma (sm_90+) or we interpret."""
    if _interpreting():
        return
    if device.type != "cuda":
        raise RuntimeError("ws_gemm needs a CUDA device (or TRITON_INTERPRET=1 for the CPU interpreter)")
    if getattr(torch.version, "hip", None):
        raise RuntimeError("ws_gemm needs NVIDIA TMA and wgmma; on ROCm use persistent_gemm")
    major, minor = torch.cuda.get_device_capability(device)
    if major < 9:
        raise RuntimeError(
            f"ws_gemm needs sm_90+ (TMA, wgmma, warp specialization); this GPU is sm_{major}{minor}. "
            "Use persistent_gemm (pointer loads) on this device.")


def _elt(t: torch.Tensor) -> int:
    return t.element_size()


def _row_stride(x: torch.Tensor) -> int:
    """Row stride to describe `x` (unit inner stride assumed) to TMA. A single-row matrix's
    row stride is never used, so any aligned value is valid; use the padded width."""
    if x.shape[0] > 1:
        return x.stride(0)
    per = TMA_ALIGN_BYTES // _elt(x)
    return cdiv(max(x.shape[1], 1), per) * per


def tma_problem(x: torch.Tensor) -> str | None:
    """Why a row-major-described matrix `x` cannot be a TMA tensor (None if it can)."""
    if x.shape[1] > 1 and x.stride(1) != 1:
        return "inner dimension is not contiguous"
    if x.data_ptr() % TMA_ALIGN_BYTES:
        return f"base address is not {TMA_ALIGN_BYTES}-byte aligned"
    if (_row_stride(x) * _elt(x)) % TMA_ALIGN_BYTES:
        return f"row stride {x.stride(0)} x {_elt(x)} B is not a multiple of {TMA_ALIGN_BYTES} B"
    return None


def _as_tma_operand(x: torch.Tensor, name: str, allow_copy: bool) -> tuple[torch.Tensor, bool]:
    """Return (stored, transposed): `stored` is a TMA-ready row-major matrix holding `x`
    (`x` itself, its storage seen as x.t(), or an aligned copy) and `transposed` says the
    kernel must read it as the transpose of `x`."""
    if x.shape[1] == 1 or x.stride(1) == 1:
        if tma_problem(x) is None:
            return x, False
    if x.shape[0] == 1 or x.stride(0) == 1:
        xt = x.t()
        if tma_problem(xt) is None:
            return xt, True
    if not allow_copy:
        why = tma_problem(x) or "not TMA-compatible"
        raise ValueError(f"{name} {tuple(x.shape)} with strides {tuple(x.stride())} cannot be read by TMA "
                         f"({why}); pass allow_copy=True to stage it through an aligned copy")
    return aligned_copy(x), False  # persistent_gemm's staging copy: a copy kernel where it pays


def matmul(a: torch.Tensor, b: torch.Tensor, config: Config | None = None, *,
           out: torch.Tensor | None = None, allow_copy: bool = True) -> torch.Tensor:
    """C = a @ b with the warp-specialized persistent TMA schedule.

    a (M, K), b (K, N): fp16, bf16 or fp32 (tf32 math), row-major or transposed views.
    `out`, if given, must be (M, N) of the same dtype and device; it is returned.
    `allow_copy=False` makes TMA-incompatible operands an error instead of a staged copy,
    and skips the K-major copy of fp32 operands strided in K (kernels/tf32_layout.py).
    """
    # input checks; fp32 with a strided K: a K-major copy where it pays (unless allow_copy is
    # off); the tensor C goes to unless it must be staged (`out`, or a new one); a call like
    # one before (same shapes, strides, alignment, config), which staged nothing: its launch again
    call = begin("ws", matmul, a, b, config, out, registers=False, tf32=allow_copy, key_extra=(allow_copy,))
    target = call.c
    if call.done:
        return target
    M, N, K, a, b, key = call.M, call.N, call.K, call.a, call.b, call.key
    require_tma_device(a.device)
    if TensorDescriptor is None:  # pragma: no cover
        raise RuntimeError("ws_gemm needs triton.tools.tensor_descriptor (Triton >= 3.3)")
    config = config or default_config(M, N, K, a.dtype)
    config.validate(a.dtype)

    a_st, a_t = _as_tma_operand(a, "a", allow_copy)
    b_st, b_t = _as_tma_operand(b, "b", allow_copy)

    def c_problem(t: torch.Tensor) -> str | None:
        # pointer stores only need a unit inner stride; the TMA store needs all of TMA's rules
        if config.tma_store:
            return tma_problem(t)
        return None if (t.shape[1] == 1 or t.stride(1) == 1) else "inner dimension is not contiguous"

    if out is not None:
        why = c_problem(out)
        if why is not None and not allow_copy:
            raise ValueError(f"out with strides {tuple(out.stride())} cannot be written directly ({why}); "
                             "pass allow_copy=True to stage it")
        c = out if why is None else aligned_empty(M, N, a.dtype, a.device)
    else:
        c = target
        if c_problem(c) is not None:  # TMA store and N * elt not a multiple of 16 B
            c = aligned_empty(M, N, a.dtype, a.device)
    if a_st.data_ptr() != a.data_ptr() or b_st.data_ptr() != b.data_ptr() or c is not target:
        key = None  # staged through copies: work a replay would skip
    rec = Recorder(key, inputs_and_output, a, b, c)

    BM, BN, BK = config.block_m, config.block_n, config.block_k
    sub_n = BN // config.epilogue_subtile
    if config.host_descriptors:
        a_arg = TensorDescriptor(a_st, list(a_st.shape), [_row_stride(a_st), 1], [BK, BM] if a_t else [BM, BK])
        b_arg = TensorDescriptor(b_st, list(b_st.shape), [_row_stride(b_st), 1], [BN, BK] if b_t else [BK, BN])
        c_arg = TensorDescriptor(c, [M, N], [_row_stride(c), 1], [BM, sub_n]) if config.tma_store else c
    else:
        if not _interpreting():
            ensure_allocator()
        a_arg, b_arg, c_arg = a_st, b_st, c

    grid_size = min(_num_sms(a.device), cdiv(M, BM) * cdiv(N, BN))
    rec.launch(ws_gemm_kernel, (grid_size,),
        a_arg, b_arg, c_arg,
        M, N, K,
        _row_stride(a_st), _row_stride(b_st), _row_stride(c),
        BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=config.group_m,
        A_TRANSPOSED=a_t, B_TRANSPOSED=b_t,
        NUM_SMS=grid_size, WARP_SPECIALIZE=config.warp_specialize, FLATTEN=config.flatten,
        EPILOGUE_SUBTILE=config.epilogue_subtile, HOST_DESC=config.host_descriptors, C_TMA=config.tma_store,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    rec.commit()
    if out is not None:
        if c is not out:
            out.copy_(c)
        return out
    return c if c.is_contiguous() else c.contiguous()


# --------------------------------------------------------------------------------------
# Compile check for sm_90 without a GPU, and the self-check
# --------------------------------------------------------------------------------------

_TL_DTYPE = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def compile_for_sm90(config: Config, dtype: torch.dtype = torch.bfloat16, *, a_transposed=False,
                     b_transposed=False, num_programs: int = 132):
    """Compile the kernel for sm_90 on any machine (no GPU needed: Triton ships ptxas) and
    return the CompiledKernel. Its `metadata.shared` is the real shared-memory footprint,
    `metadata.num_warps` the warps after WS (12 when the Hopper pass specialized the loop),
    and `asm["ttgir"]` contains `ttg.warp_specialize` when WS engaged."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if _interpreting():
        raise RuntimeError("compile_for_sm90 needs TRITON_INTERPRET unset")
    config.validate(dtype)
    ty = _TL_DTYPE[dtype]
    BM, BN, BK = config.block_m, config.block_n, config.block_k
    sub_n = BN // config.epilogue_subtile
    if config.host_descriptors:
        a_sig = f"tensordesc<{ty}[{BK}, {BM}]>" if a_transposed else f"tensordesc<{ty}[{BM}, {BK}]>"
        b_sig = f"tensordesc<{ty}[{BN}, {BK}]>" if b_transposed else f"tensordesc<{ty}[{BK}, {BN}]>"
        c_sig = f"tensordesc<{ty}[{BM}, {sub_n}]>" if config.tma_store else f"*{ty}"
    else:
        a_sig = b_sig = c_sig = f"*{ty}"
    constexprs = dict(BLOCK_M=BM, BLOCK_N=BN, BLOCK_K=BK, GROUP_M=config.group_m,
                      A_TRANSPOSED=a_transposed, B_TRANSPOSED=b_transposed, NUM_SMS=num_programs,
                      WARP_SPECIALIZE=config.warp_specialize, FLATTEN=config.flatten,
                      EPILOGUE_SUBTILE=config.epilogue_subtile, HOST_DESC=config.host_descriptors,
                      C_TMA=config.tma_store)
    signature = {"a_ptr": a_sig, "b_ptr": b_sig, "c_ptr": c_sig, "M": "i32", "N": "i32", "K": "i32",
                 "stride_a": "i32", "stride_b": "i32", "stride_c": "i32"}
    signature.update({k: "constexpr" for k in constexprs})
    # row strides are multiples of 16 (TMA requires it): tell the compiler, as the JIT would
    pointer_args = (0, 1, 2) if not config.host_descriptors else (() if config.tma_store else (2,))
    attrs = {(i,): [["tt.divisibility", 16]] for i in pointer_args + (6, 7, 8)}
    src = ASTSource(ws_gemm_kernel, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=config.num_warps, num_stages=config.num_stages))


def compile_report(dtypes=(torch.bfloat16, torch.float16, torch.float32)) -> list[str]:
    """Compile every search-space candidate for sm_90 in all four operand layouts; return
    the problems found (empty when all is well) after printing one line per compile."""
    problems = []
    for dtype in dtypes:
        for c in (_C32 if dtype == torch.float32 else _C16):
            for at in (False, True):
                for bt in (False, True):
                    where = f"{str(dtype)[6:]:9} {c.label():40} aT={at:d} bT={bt:d}"
                    try:
                        k = compile_for_sm90(c, dtype, a_transposed=at, b_transposed=bt)
                    except Exception as e:  # noqa: BLE001 - report every failure, then fail
                        problems.append(f"{where} does not compile: {type(e).__name__}: {str(e)[:200]}")
                        print(problems[-1], flush=True)
                        continue
                    ws = "ttg.warp_specialize" in k.asm["ttgir"]
                    print(f"{where} shared={k.metadata.shared:6d} (est {c.smem_bytes(dtype):6d}) "
                          f"warps={k.metadata.num_warps:2d} ws_engaged={ws}", flush=True)
                    if k.metadata.shared > SMEM_LIMIT_BYTES:
                        problems.append(f"{where} needs {k.metadata.shared} B of shared memory")
                    if k.metadata.shared > c.smem_bytes(dtype):
                        problems.append(f"{where}: estimate {c.smem_bytes(dtype)} below the real {k.metadata.shared}")
                    if ws != c.warp_specialize:
                        problems.append(f"{where}: warp_specialize={c.warp_specialize} but engaged={ws}")
    return problems


def _main() -> None:
    """Self-check. On the CPU interpreter: two small configs (WS and not, pointer and TMA
    store) on odd shapes. On a GPU: the default config per dtype on odd and real shapes,
    and with --all-configs every search-space entry on one odd mid-size shape."""
    import sys

    if "--compile-sm90" in sys.argv:
        problems = compile_report()
        print("\n".join(["", f"{len(problems)} problem(s)"] + problems))
        sys.exit(1 if problems else 0)
    half = (torch.float16, torch.bfloat16)
    shapes = [(1, 1, 1), (37, 45, 29), (130, 250, 70), (200, 136, 512)]
    if _interpreting():
        runs = [(Config(128, 64, 32, 4, 4, 3, warp_specialize=True), shapes, half),
                (Config(32, 32, 16, 4, 4, 2, warp_specialize=False, tma_store=True, epilogue_subtile=2),
                 shapes, half + (torch.float32,))]
    else:
        runs = [(None, shapes + [(1664, 1408, 1024), (4096, 4096, 4096)], half + (torch.float32,))]
        if "--all-configs" in sys.argv:
            M, N, K = 1000, 1096, 520
            runs += [(c, [(M, N, K)], half) for c in search_space(M, N, K, torch.bfloat16)]
            runs += [(c, [(M, N, K)], (torch.float32,)) for c in search_space(M, N, K, torch.float32)]
    for cfg, shp, dtypes in runs:
        print(f"-- {cfg.label() if cfg else 'default config'}")
        self_check(lambda x, y, cfg=cfg: matmul(x, y, cfg), shp, dtypes=dtypes)


if __name__ == "__main__":
    _main()
