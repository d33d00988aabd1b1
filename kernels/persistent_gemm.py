"""Persistent GEMM: a grid of about one program per SM, each looping over output tiles.

What
    C = A @ B with grid = min(#SMs x PROGRAMS_PER_SM, tiles). Program p computes tiles p,
    p + grid, p + 2 grid, ... in dp_gemm's grouped order, so at any moment the resident
    programs work on a compact band of tiles and share A rows and B columns through L2, as
    the data-parallel grid does, but without launching (and tearing down) one program per
    tile. Two ways to feed the tensor cores (`use_tma`):

    - pointer loads (use_tma=False): dp_gemm's `mac_loop`, software-pipelined `cp.async`
      copies into shared memory, masks at the K edge;
    - TMA (use_tma=True): host-built tensor descriptors for A, B and C
      (`triton.tools.tensor_descriptor.TensorDescriptor`); each K step is one bulk-tensor
      copy per operand issued by a single thread, out-of-bounds boxes come back zero-filled
      (no masks at any edge) and C goes out through a TMA store that clips at the edges.
      A or B may be row-major or column-major (a transposed view): the descriptor is built
      over the contiguous dimension and the tile transposed in registers-free fashion
      (`.T` of a shared-memory operand, which wgmma reads either way for 16-bit types).

    With `FLATTEN` the tile loop and the K loop are flattened into one loop for Triton's
    software pipeliner (`tl.range(..., flatten=True)`), so the next tile's first loads are
    issued while the current tile's epilogue runs. `EPILOGUE_SUBTILE` stores the C tile as
    two BLOCK_M x BLOCK_N/2 halves, which halves the epilogue's shared-memory buffer and
    leaves room for one more pipeline stage.

When it wins
    Large balanced GEMMs (8192^3, 4096x4096x8192) on Hopper, where TMA removes the address
    arithmetic and masks from the main loop and the persistent grid hides per-tile prologues;
    and grids of many small tiles, where launch and prologue costs dominate. It does not fix a
    partial last wave: the tiles are the same, only the programs persist (stream_k_gemm does).

Caveats
    - fp32 (tf32) operands strided in K (kernels/tf32_layout.py; wgmma reads tf32 only
      K-major): TMA configs copy them K-major first where that pays; pointer-load configs
      feed a strided A through registers and swap a strided B into A's place, as dp does.
      With `copy_sms` (the fp32 default on GPUs of 64+ SMs) a row-major B is copied in column
      chunks instead, all but the first by a few programs on a side stream while the GEMM
      computes the chunks before on the other SMs (`copy_beside`): a few percent faster than
      copying B first (docs/schedules/persistent.md). The chunk plan comes from the rates per
      SM measured on one GPU, scaled by the SMs a GPU has (`copy_beside_chunks`); on
      another GPU the rate of an SM differs too (clocks, tensor rate), and a plan that lets
      the GEMM wait for a chunk costs time, so measure before relying on it there.
    - TMA needs 16-byte aligned base pointers and leading strides, and a unit stride in the
      contiguous dimension (Hopper's tensor-map rules). An explicit `use_tma=True` config
      raises ValueError on inputs that break them, unless it is `staged`: then each such
      operand is first copied into a 16-byte aligned buffer (and C, if TMA cannot store into
      it, is computed in one and copied out), one pass over that tensor. With config=None the
      default config stages where the copies cost less than half the GEMM's ideal time
      (`staging_pays`) and falls back to pointer loads otherwise. Misaligned rows cost the
      pointer loads their vector width (several times slower than torch.matmul on such a
      shape, docs/schedules/persistent.md).
    - For fp32 (tf32) inputs a transposed operand is legal but slower (wgmma wants tf32
      operands K-major; Triton reshuffles them).
    - PROGRAMS_PER_SM=2 only helps when two programs' shared memory fits one SM (228 KB).

Source of the idea
    Triton tutorial 09-persistent-matmul (persistent tile loop with `tl.range` flattening,
    host tensor descriptors, epilogue subtiling); grouped order from tutorial
    03-matrix-multiplication. The pointer path reuses dp_gemm's inner loop unchanged.
"""

from __future__ import annotations

from dataclasses import replace

import torch
import triton
import triton.language as tl

from .common import (
    SMEM_PER_BLOCK_SM90,
    aligned_empty,
    cdiv,
    check_matmul_inputs,
    gemm_launch_metadata,
    needs_int64_offsets,
    num_sms,
    prepare_output,
    self_check,
    stride_hints,
)
from .dp_gemm import mac_loop, store_tile, tile_coords
from .gemm_call import begin, inputs_and_output
from .persistent_configs import (  # the knobs and the host's choice of them, re-exported: the schedule's API
    COPY_BESIDE_CHUNKS,
    COPY_BESIDE_SMS,
    TensorDescriptor,
    Config,
    _COPY_BYTES_PER_S,
    _GEMM_FLOPS_PER_S,
    _check_smem,
    _copies_pay,
    _fits_sm,
    check_staged,
    default_config,
    search_space,
    staging_pays,
    tma_layout,
    tma_shape_ok,
    with_copy_beside,
)
from .runtime import Recorder, launch
from .tf32_layout import (
    a_through_registers,
    copy_into,
    copy_wanted,
    k_major,
    k_major_empty,
)


# --------------------------------------------------------------------------------------------
# Knobs
# --------------------------------------------------------------------------------------------


@triton.jit
def _stage_copy_kernel(src, dst, rows, cols, src_row_stride, dst_row_stride,
                       BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """dst[r, c] = src[r, c] for a row-major (rows, cols) src and an aligned, padded dst."""
    r = (tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (r < rows)[:, None] & (c < cols)[None, :]
    x = tl.load(src + (r[:, None] * src_row_stride + c[None, :]), mask=mask)
    tl.store(dst + (r[:, None] * dst_row_stride + c[None, :]), x, mask=mask)


def aligned_copy(x: torch.Tensor) -> torch.Tensor:
    """`x` copied into an aligned_empty buffer. A row-major source whose rows start on 8-byte
    boundaries goes through _stage_copy_kernel, anything else through torch's copy_: the kernel
    beats copy_ on 8-byte aligned rows and loses to it on 2-byte aligned ones
    (docs/schedules/persistent.md)."""
    dst = aligned_empty(*x.shape, x.dtype, x.device)
    rows, cols = x.shape
    if x.stride(1) != 1 or x.numel() == 0 or x.data_ptr() % 8 or (x.stride(0) * x.element_size()) % 8:
        return dst.copy_(x)
    BR, BC = 16, 256
    launch(_stage_copy_kernel, (cdiv(rows, BR), cdiv(cols, BC)), x, dst, rows, cols, x.stride(0), dst.stride(0),
           BLOCK_R=BR, BLOCK_C=BC, num_warps=4)
    return dst


def stage_for_tma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor):
    """(a, b, work, staged_out): `a` and `b` as TMA can read them, themselves where tma_layout
    accepts them, else copied into aligned row-major buffers; `work`, the C the kernel writes:
    `c` when TMA can store into it (row-major, aligned), else an aligned buffer, and then
    staged_out is True and the caller copies `work` into `c` after the launch."""
    a, b = (x if tma_layout(x) else aligned_copy(x) for x in (a, b))
    if tma_layout(c) == "row":
        return a, b, c, False
    return a, b, aligned_empty(*c.shape, c.dtype, c.device), True


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------


@triton.jit
def tma_step(a_desc, b_desc, off_m, off_n, off_k, acc, A_COL_MAJOR: tl.constexpr, B_COL_MAJOR: tl.constexpr):
    """One K step of a TMA-fed MAC loop: A's and B's boxes at off_k (descriptors over A^T or
    B^T when COL_MAJOR; edges come back zero-filled), multiplied into acc."""
    if A_COL_MAJOR:
        a = a_desc.load([off_k, off_m]).T
    else:
        a = a_desc.load([off_m, off_k])
    if B_COL_MAJOR:
        b = b_desc.load([off_n, off_k]).T
    else:
        b = b_desc.load([off_k, off_n])
    return tl.dot(a, b, acc)


@triton.jit(launch_metadata=gemm_launch_metadata("persistent_gemm"))
def persistent_gemm_kernel(
    # A (M, K), B (K, N), C (M, N): element pointers, or host TensorDescriptors when USE_TMA
    a_ptr, b_ptr, c_ptr,
    # problem size
    M, N, K,
    # element strides (pointer path only)
    stride_am, stride_ak,
    stride_bk, stride_bn,
    stride_cm, stride_cn,
    # tile shape and order
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    # schedule options
    USE_TMA: tl.constexpr,
    A_COL_MAJOR: tl.constexpr,  # TMA: A's descriptor is over A^T (K, M), blocks BLOCK_K x BLOCK_M
    B_COL_MAJOR: tl.constexpr,  # TMA: B's descriptor is over B^T (N, K), blocks BLOCK_N x BLOCK_K
    EPILOGUE_SUBTILE: tl.constexpr,
    FLATTEN: tl.constexpr,
    # shape facts fixed by the host
    EVEN_K: tl.constexpr, INT64: tl.constexpr, STRIDE_HINTS: tl.constexpr,
    A_REGS: tl.constexpr,  # pointer loads: A to the MMA from registers (tf32_layout.a_through_registers)
):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_tiles = num_pid_m * num_pid_n
    k_iters = tl.cdiv(K, BLOCK_K)
    for tile_id in tl.range(tl.program_id(0), num_tiles, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n = tile_coords(tile_id, num_pid_m, num_pid_n, GROUP_M)
        if USE_TMA:
            off_m = pid_m * BLOCK_M
            off_n = pid_n * BLOCK_N
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for ki in range(k_iters):
                acc = tma_step(a_ptr, b_ptr, off_m, off_n, ki * BLOCK_K, acc, A_COL_MAJOR, B_COL_MAJOR)
            if EPILOGUE_SUBTILE:
                halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
                left, right = tl.split(halves)
                c_ptr.store([off_m, off_n], left.to(c_ptr.dtype))
                c_ptr.store([off_m, off_n + BLOCK_N // 2], right.to(c_ptr.dtype))
            else:
                c_ptr.store([off_m, off_n], acc.to(c_ptr.dtype))
        else:
            acc = mac_loop(a_ptr, b_ptr, stride_am, stride_ak, stride_bk, stride_bn, M, N, K,
                           pid_m, pid_n, 0, k_iters,
                           BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INT64, RAGGED_K=BLOCK_K,
                           HINTS=STRIDE_HINTS, A_REGS=A_REGS)
            store_tile(c_ptr, stride_cm, stride_cn, M, N, pid_m, pid_n, acc, BLOCK_M, BLOCK_N, INT64)


# --------------------------------------------------------------------------------------------
# Host launcher
# --------------------------------------------------------------------------------------------


def _descriptor_fields_known() -> bool:
    import dataclasses

    return TensorDescriptor is not None and dataclasses.is_dataclass(TensorDescriptor) and tuple(
        f.name for f in dataclasses.fields(TensorDescriptor)) == ("base", "shape", "strides", "block_shape", "padding")


_FAST_DESCRIPTORS = _descriptor_fields_known()


def _descriptor(base, shape, strides, block_shape):
    """A TensorDescriptor without its __post_init__ checks (alignment, strides, power-of-two
    blocks), which tma_layout and the Config have already made: they cost ~10 us of host
    time per descriptor, three a call. Falls back to the checked constructor where this
    Triton's TensorDescriptor has other fields."""
    if not _FAST_DESCRIPTORS:
        return TensorDescriptor(base, shape, strides, block_shape)
    d = object.__new__(TensorDescriptor)
    d.base, d.shape, d.strides, d.block_shape, d.padding = base, shape, strides, block_shape, "zero"
    return d


def tma_or_pointer_loads(config, a, b, c) -> tuple:
    """A default config's TMA choice checked against the actual tensors: (config, layouts)
    with the tma_layout of a, b and c when TMA can read and write them; else the config
    staged (config.staged) where copying the misfits costs less than half the GEMM's ideal
    time (as staging_pays, but for these tensors), else the config on pointer loads, rather
    than the ValueError an explicit unstaged TMA config raises."""
    if not config.use_tma or config.staged:
        return config, None
    layouts = (tma_layout(a), tma_layout(b), tma_layout(c))
    if layouts[0] and layouts[1] and layouts[2] == "row":
        return config, layouts
    copied = sum(2 * x.numel() * x.element_size() for x, layout in zip((a, b), layouts) if layout is None)
    copied += 2 * c.numel() * c.element_size() if layouts[2] != "row" else 0
    if _copies_pay(copied, a.shape[0], b.shape[1], a.shape[1], a.dtype):
        return replace(config, staged=True), None
    return on_pointer_loads(config, a.dtype), None


def on_pointer_loads(config, dtype: torch.dtype):
    """A TMA config (persistent's or Stream-K's) as its pointer-load twin: no TMA, none of the
    knobs that need it (the subtiled TMA store, staging, copy_beside), and no FLATTEN where
    the pointer store's scratch beside the live pipeline would not fit (fp32 128x256: 272 KB;
    without FLATTEN it reuses the pipeline's buffers)."""
    changes = {"use_tma": False, "EPILOGUE_SUBTILE": False, "staged": False}
    if getattr(config, "copy_sms", 0):
        changes["copy_sms"] = 0
    out = replace(config, **changes)
    if getattr(out, "FLATTEN", False) and out.smem_bytes(dtype) > SMEM_PER_BLOCK_SM90:
        out = replace(out, FLATTEN=False)
    return out


def resolve_tma(config, default_config, check_smem, sms: int, a, b, c, key):
    """The config a TMA-capable schedule (this one, Stream-K) runs, and its operands: with
    config=None its default, on TMA where the tensors allow it, else its pointer-load twin
    (`tma_or_pointer_loads`); checked by `check_smem`; a `staged` config then copies misfit
    operands into aligned buffers and computes C in one (`stage_for_tma`), work a replay
    would skip, so the replay key is dropped. Returns (config, layouts, a, b, c, staged_out,
    key): copy C back into the caller's tensor when staged_out."""
    layouts = None
    if config is None:
        M, K = a.shape
        config, layouts = tma_or_pointer_loads(default_config(M, b.shape[1], K, a.dtype, sms), a, b, c)
    check_smem(config, a.dtype)
    staged_out = False
    if config.staged:
        a, b, c, staged_out = stage_for_tma(a, b, c)
        layouts, key = None, None
    return config, layouts, a, b, c, staged_out, key


def tma_descriptors(a, b, c, M, N, K, cfg: Config, layouts: tuple | None = None):
    """Host tensor descriptors for A, B, C, plus the layout flags; raises ValueError naming
    the tensor that TMA cannot read. `layouts`: tma_layout of a, b and c when the caller has
    them already."""
    if TensorDescriptor is None:
        raise ValueError("use_tma needs triton.tools.tensor_descriptor (Triton >= 3.4)")
    BM, BN, BK = cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K
    la, lb, lc = layouts if layouts is not None else (tma_layout(a), tma_layout(b), tma_layout(c))
    for name, layout, t in (("a", la, a), ("b", lb, b)):
        if layout is None:
            raise ValueError(
                f"use_tma: {name} (shape {tuple(t.shape)}, strides {t.stride()}, {t.dtype}) is not "
                f"TMA-readable: it needs a unit stride in one dimension, the other stride a multiple "
                f"of 16 bytes and a 16-byte aligned start; use a use_tma=False config")
    if lc != "row":
        raise ValueError(
            f"use_tma: out (strides {c.stride()}) must be row-major with a 16-byte aligned row "
            f"stride for the TMA store; use a use_tma=False config")
    sa, sb = a.stride(), b.stride()
    if la == "row":
        a_desc = _descriptor(a, [M, K], [sa[0], 1], [BM, BK])
    else:
        a_desc = _descriptor(a, [K, M], [sa[1], 1], [BK, BM])
    if lb == "row":
        b_desc = _descriptor(b, [K, N], [sb[0], 1], [BK, BN])
    else:
        b_desc = _descriptor(b, [N, K], [sb[1], 1], [BN, BK])
    c_desc = _descriptor(c, [M, N], [c.stride(0), 1], [BM, BN // 2 if cfg.EPILOGUE_SUBTILE else BN])
    return a_desc, b_desc, c_desc, la == "col", lb == "col"


_SIDE_STREAMS: dict = {}


def _side_stream(device: torch.device):
    """One side stream per device for copy_beside, made on first use and kept."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(device=index)
    return _SIDE_STREAMS[index]


def copy_beside_applies(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: Config) -> bool:
    """Whether copy_beside runs this call: a TMA config with copy_sms, fp32, B strided in K
    beside a K-major A (the copy tf32_operands would make, where it pays), and A and C as TMA
    reads and writes them."""
    if not (config.use_tma and config.copy_sms and a.dtype == torch.float32) or config.staged:
        return False
    if k_major(b, 0) or not k_major(a, 1) or tma_layout(a) is None or tma_layout(c) != "row":
        return False
    M, K = a.shape
    N = b.shape[1]
    return copy_wanted(M, N, K, K * N)


# The chunk plan's rates (sm_90, experiments/results/probe_copy_beside/), both on the
# safe side, since a side copy that falls behind stalls the GEMM while a first chunk larger
# than needed only costs its copy at the whole GPU's rate (~4 TB/s): one copy program beside
# the GEMM moved 55 GB/s (69 alone), and the GEMM ran 128x256 fp32 tiles at up to 380
# TFLOP/s on 128 programs (isolated calls; ~340 back to back). Both are rates of one SM, so
# the plan scales with the programs a GPU has: on fewer SMs each tile column of the GEMM
# takes longer behind the same side copy.
_BESIDE_COPY_BYTES_PER_S = 4.5e10
_BESIDE_GEMM_FLOPS_PER_PROGRAM = 3.8e14 / 128


def copy_beside_chunks(M: int, N: int, K: int, config: Config, programs: int) -> list[tuple[int, int]]:
    """B's column chunks for copy_beside, as (n0, n1) in whole tile columns: the GEMM of chunk
    i must not wait for the side copy of chunk i + 1, which starts when the first chunk's copy
    ends and runs back to back with the others. A tile column takes the GEMM g = 2 M BLOCK_N K
    / (programs x flops a program) and the side copy s = 8 K BLOCK_N / (copy_sms x bytes a
    program), so chunk i + 1 may hold (g x columns before it - s x side columns before it) /
    s columns. Chunks are
    whole rounds of the grid (`programs` programs, programs // tiles-per-column columns)
    where they can be; the first chunk is the smallest that lets the rest follow without a
    stall in at most copy_chunks chunks (all of B, one chunk, where none does). E.g. with 132
    SMs and 4 copy programs, 4096x4096x8192 in 128x256 tiles gives 12 + 4 columns (the side
    copy is slower than the GEMM there), 8192^3 gives 8 + 6 + 6 + 6 + 6."""
    BN = config.BLOCK_N
    tiles_m, tiles_n = cdiv(M, config.BLOCK_M), cdiv(N, BN)
    step = max(1, programs // tiles_m)
    g = 2.0 * M * BN * K / (_BESIDE_GEMM_FLOPS_PER_PROGRAM * programs)
    s = 8.0 * K * BN / (config.copy_sms * _BESIDE_COPY_BYTES_PER_S)
    cols = [tiles_n]
    for first in range(step, tiles_n, step):
        plan, done = [first], first
        while done < tiles_n and len(plan) < config.copy_chunks:
            fits = int((g * done - s * (done - first)) / s) // step * step
            if fits < step:
                break
            plan.append(min(fits, tiles_n - done))
            done += plan[-1]
        if done == tiles_n:
            cols = plan
            break
    bounds, n0 = [], 0
    for c in cols:
        bounds.append((n0, min(N, n0 + c * BN)))
        n0 += c * BN
    return bounds


def copy_beside(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, config: Config) -> torch.Tensor:
    """c = a @ b for an fp32 B to copy K-major (copy_beside_applies), with the copy hidden
    behind the GEMM: B's columns in chunks (copy_beside_chunks); the first chunk copied with
    the whole GPU, then, on a side stream, each later chunk by config.copy_sms programs, while
    the GEMM of the chunks before runs on the other SMs (a grid of SMs - copy_sms programs;
    the last chunk's grid takes all of them). The copy moves B once either way; what this
    saves is its time, all but the first chunk's. Without CUDA (the interpreter) the chunks
    run in turn."""
    M, K = a.shape
    N = b.shape[1]
    programs = max(1, num_sms(a.device) - config.copy_sms)
    bounds = copy_beside_chunks(M, N, K, config, programs)
    b_km = k_major_empty(K, N, 0, b.dtype, b.device)
    inner = replace(config, copy_sms=0)
    copy_into(b[:, :bounds[0][1]], b_km[:, :bounds[0][1]])
    if len(bounds) == 1 or not a.is_cuda:
        for n0, n1 in bounds[1:]:
            copy_into(b[:, n0:n1], b_km[:, n0:n1], programs=config.copy_sms)
        for n0, n1 in bounds:
            matmul(a, b_km[:, n0:n1], inner, out=c[:, n0:n1])
        return c
    main, side = torch.cuda.current_stream(a.device), _side_stream(a.device)
    side.wait_stream(main)  # b written, b_km allocated
    ready = [None]
    with torch.cuda.stream(side):
        for n0, n1 in bounds[1:]:
            copy_into(b[:, n0:n1], b_km[:, n0:n1], programs=config.copy_sms)
            ready.append(torch.cuda.Event())
            ready[-1].record(side)
    for i, (n0, n1) in enumerate(bounds):
        if ready[i] is not None:
            main.wait_event(ready[i])
        last = i == len(bounds) - 1
        matmul(a, b_km[:, n0:n1], inner, out=c[:, n0:n1], programs=None if last else programs)
    # main has waited for the side stream's last copy: b and b_km are free after this call
    return c


def matmul(a: torch.Tensor, b: torch.Tensor, config: Config | None = None, *,
           out: torch.Tensor | None = None, programs: int | None = None) -> torch.Tensor:
    """C = a @ b with the persistent schedule. a: (M, K), b: (K, N), fp16/bf16/fp32. Returns
    `out` (filled) when given, else a new (M, N) tensor in a's dtype. With config=None the
    default config is used and TMA is dropped when the tensors do not allow it; an explicit
    use_tma=True config raises ValueError instead. `programs`: launch at most that many
    programs (copy_beside leaves SMs to its copy that way)."""
    M, N, K = check_matmul_inputs(a, b)
    beside = config
    if config is None and a.dtype == torch.float32 and not k_major(b, 0):
        # fp32 with a B to copy K-major: the default config may hide the copy (with_copy_beside)
        beside = default_config(M, N, K, a.dtype, num_sms(a.device))
    if beside is not None and beside.copy_sms:
        out = prepare_output(out, M, N, a)
        if copy_beside_applies(a, b, out, beside):
            return copy_beside(a, b, out, beside)
        if config is not None:  # an explicit config: the same knobs, copying B first
            config = replace(config, copy_sms=0)
    # input checks; fp32 with a strided K: a pointer-load config feeds a strided A through
    # registers and swaps a strided B into A's place (as dp), TMA configs copy it K-major where
    # that pays (tf32_layout); the output; a call like one before: its launches again
    call = begin("persistent", matmul, a, b, config, out, registers=config is not None and not config.use_tma,
                 key_extra=(programs,), sizes=(M, N, K), programs=programs)
    result = c = call.c
    if call.done:
        return result
    a, b, key = call.a, call.b, call.key
    sms = num_sms(a.device)
    config, layouts, a, b, c, staged_out, key = resolve_tma(config, default_config, _check_smem, sms, a, b, c, key)
    rec = Recorder(key, inputs_and_output, a, b, c)
    tiles = cdiv(M, config.BLOCK_M) * cdiv(N, config.BLOCK_N)
    grid = (max(1, min(sms * config.PROGRAMS_PER_SM if programs is None else programs, tiles)),)
    if config.use_tma:
        a_arg, b_arg, c_arg, a_col, b_col = tma_descriptors(a, b, c, M, N, K, config, layouts)
    else:
        a_arg, b_arg, c_arg, a_col, b_col = a, b, c, False, False
    rec.launch(persistent_gemm_kernel, grid,
        a_arg, b_arg, c_arg,
        M, N, K,
        *a.stride(), *b.stride(), *c.stride(),
        BLOCK_M=config.BLOCK_M, BLOCK_N=config.BLOCK_N, BLOCK_K=config.BLOCK_K, GROUP_M=config.GROUP_M,
        USE_TMA=config.use_tma, A_COL_MAJOR=a_col, B_COL_MAJOR=b_col,
        EPILOGUE_SUBTILE=config.EPILOGUE_SUBTILE, FLATTEN=config.FLATTEN,
        EVEN_K=K % config.BLOCK_K == 0, INT64=needs_int64_offsets(a, b, c), STRIDE_HINTS=stride_hints(a, b),
        A_REGS=not config.use_tma and a_through_registers(a),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    rec.commit()
    if staged_out:
        result.copy_(c)
    return result


if __name__ == "__main__":
    import os

    if os.environ.get("TRITON_INTERPRET") == "1":
        self_check(matmul, [(37, 53, 97)], config=Config(16, 16, 16, 2, 4, 1, use_tma=False))
        self_check(matmul, [(40, 48, 80)], config=Config(16, 32, 16, 2, 4, 1, use_tma=True, EPILOGUE_SUBTILE=True))
    else:
        self_check(matmul, [(37, 53, 97), (1536, 2048, 1024), (4096, 4096, 512)])

        def pointer_loads(a, b):
            cfg = default_config(a.shape[0], b.shape[1], a.shape[1], a.dtype, num_sms(a.device))
            return matmul(a, b, on_pointer_loads(cfg, a.dtype))

        def tma_subtiled(a, b):
            cfg = default_config(a.shape[0], b.shape[1], a.shape[1], a.dtype, num_sms(a.device))
            return matmul(a, b, replace(cfg, use_tma=True, EPILOGUE_SUBTILE=True))

        self_check(pointer_loads, [(1536, 2048, 1024)])
        self_check(tma_subtiled, [(1536, 2048, 1024)])
