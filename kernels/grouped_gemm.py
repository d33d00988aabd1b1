"""Grouped GEMM: many independent small products C_i = A_i @ B_i in one persistent launch.

What it does
------------
A list of G unrelated GEMMs (mixed M_i, N_i, K_i, e.g. the experts of a mixture-of-experts
layer or the 64 mixed 128..512 products of issue 4) run as ONE kernel launch. The host
writes two small tables once and copies them to the device in a single transfer:

* a per-group table (int64): where A_i, B_i and C_i start, as element offsets from one
  typed base pointer (group 0's A; see the caveat on alignment for why not raw addresses),
  M_i, N_i, K_i, the element strides of A_i and B_i and the row stride of C_i;
* a per-tile schedule (int32): for every output tile of every group, which group, which
  tile row and which tile column.

The grid is one program per SM; program p takes tiles p, p + P, p + 2P, ... of the schedule
(a global tile index across groups), looks up its group's row and computes the tile with
pipelined masked loads and `tl.dot`. Because the host orders the schedule by decreasing
cost (K_i, i.e. k-steps per tile), the round-robin hand-out is a longest-processing-time-
first assignment: the long tiles start first and the short ones fill in at the end, so the
programs finish close together instead of one SM chewing a late K=512 tile alone.

`prepare(As, Bs)` does all of that host work (validation, tables, one output buffer holding
every C_i) and returns a `GroupedPlan`; `plan.launch()` (or `grouped_matmul(As, Bs, plan=plan)`)
is then a single kernel launch with no host-side tensor work at all, which is what a caller
that runs the same group repeatedly (an MoE layer every step) should time and use.
`grouped_matmul(As, Bs)` without a plan builds one and launches it.

When it wins
------------
The matrix's "streams of tiny back-to-back kernels with launch gaps" symptom: a Python loop
of small cuBLAS calls pays a launch per GEMM and leaves most SMs idle in each small kernel:
even captured in a CUDA graph, such a loop runs far below what the tensor cores could do
(docs/schedules/grouped.md has the numbers). One persistent launch removes both the launch gaps and the idle SMs. It stops paying when the group is a
handful of large GEMMs (each already fills the GPU: call them one by one) or when all
members share K and N (then `torch._grouped_mm` / a batched GEMM is the tuned library path).

Caveats
-------
* Pointer loads, not TMA, by default: mixed odd sizes (K = 129 in bf16 gives a 258-byte row)
  break TMA's 16-byte stride rule, and building per-group descriptors costs a descriptor write
  per tile. `use_tma=True` (device-side `tl.make_tensor_descriptor` per tile, needs every
  operand row-major and 16-byte aligned, and `triton.set_allocator`) is in the search space
  when the group allows it, so the benchmark can decide.
* Sizes, strides and addresses reach the kernel from memory, so the compiler knows nothing
  about them and would emit 2-byte loads without cp.async (no software pipeline). Host-
  checked promises, compiled in as constexprs, give it back what it needs: the layout
  (every A_i row-major, or every A_i a transposed view: the unit stride becomes a compile-
  time fact; a mix takes the general-stride path, correct and slower; same for B); ALIGN,
  the largest power of two (up to 16 bytes' worth) dividing every A and B offset and
  leading stride and the sizes their vectors run along (K of a row-major A, N of a
  row-major B); and ALIGN_C, the same for C's offsets, row stride and N. M joins neither,
  so a ragged M (tokens per expert) keeps the fast path (an odd M lowering the promise to 1
  made such a group several times slower). With ALIGN = 16 bytes
  the loads are 16-byte cp.async into a `num_stages` ring and the stores 16-byte vectors
  (checked in the sm_90 PTX by `--compile-sm90`); even sizes give 4-byte cp.async; an odd
  K or N (K = 129 in bf16) gives 2-byte synchronous loads and runs several times slower.
* `stage=True` is for that last case (sizes read off a trace: 237x432x261): each launch first
  copies every A_i and B_i into zero-padded, 16-byte aligned row-major slots of one buffer
  (a second kernel, `stage_copy_kernel`; K and N rounded up to 16 bytes' worth, the zeros add
  nothing to C), so the GEMMs get the full promise, and only C's stores stay narrow. The
  search space leads with staged configs for 16-bit groups with an odd K or N: staged, the
  example trace's odd GEMMs run several times faster, the copy taking about a third of the
  time (docs/schedules/grouped.md). The copy's loads are 2-byte where rows are odd, but run
  along each source's unit stride (a row-major source read down its columns is slower).
  Where the operands can stay padded (to multiples of 8, as `torch._grouped_mm` requires
  anyway), pad them once instead.
* Outputs share one allocation (each C_i is a contiguous view into it); pass `out=` to
  prepare()/grouped_matmul() to write into your own tensors (unit column stride needed).
* A plan pins its tensors: launching it reads the current contents of the same A_i/B_i and
  overwrites the same C_i. `grouped_matmul(As, Bs, plan=plan)` checks that the lists hold the
  very tensors the plan was built for.
* fp32 inputs run as tf32 on tensor cores (see common.TOLERANCE). wgmma reads tf32 only
  K-major (kernels/tf32_layout.py), so a group of row-major fp32 A_i and B_i runs swapped on
  pointer loads: C_i^T = B_i^T A_i^T, with B_i^T fed to the MMA from registers, A_i^T
  K-major and C_i^T stored column-major into C_i (the plan's `swapped`; an A strided in K
  goes through registers in place, `a_regs`): about twice as fast as transposing copies of
  B (docs/schedules/grouped.md).

Where the idea comes from
-------------------------
Triton tutorial 08-grouped-gemm (device arrays of pointers, sizes and leading dimensions;
a fixed number of programs walking a global tile index across groups; its TMA variant
with device-side descriptors), CUTLASS's grouped GEMM (`GemmGrouped`, a persistent
problem visitor with precomputed tile counts), and longest-processing-time-first list
scheduling (Graham, 1969) for the tile order.

Run `python -m kernels.grouped_gemm` on a GPU (or with TRITON_INTERPRET=1 on the CPU) for
the self-check; `python -m kernels.grouped_gemm --compile-sm90` compiles every search-space
entry for sm_90 without a GPU (shared memory, cp.async width, TMA).
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np
import torch
import triton
import triton.language as tl

from .common import (
    TOLERANCE,
    cdiv,
    check_matmul_inputs,
    ensure_allocator,
    fix_interpreter_bf16_dot,
    poison_,
    prepare_output,
    reference,
    rel_error,
)
from .common import num_sms as _num_sms
from .grouped_configs import (  # the knobs and search space, re-exported: the schedule's API
    ALIGN_BYTES,
    SMEM_LIMIT_BYTES,
    SMEM_PER_SM_BYTES,
    Config,
    default_config,
    search_space,
)
from .runtime import launch as launch_kernel
from .tf32_layout import enabled as tf32_layout_enabled

# Per-group int64 table row: offsets of A, B, C (elements from the base pointer), M, N, K,
# stride_am, stride_ak, stride_bk, stride_bn, stride_cm, N of C; padded to 16 columns = 128
# bytes, so a row is one cache line. N and K are the operands' (a staged plan's are padded
# to whole 16-byte rows, see `stage`); the last N is C's own, which the stores mask with.
# Per-tile int32 row: group, tile row, tile column, padding.
GROUP_COLS = 16
TILE_COLS = 4

# Operand layouts shared by every group of a launch (compiled in as constexprs).
ROW_MAJOR, COL_MAJOR, STRIDED = 0, 1, 2


_TL_NAME = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


# --------------------------------------------------------------------------------------
# Kernel
# --------------------------------------------------------------------------------------


def _launch_metadata(grid, kernel, args):
    """Name, flops and bytes of the whole group, so profiles of advisor's own output are
    diagnosable; the plan attaches the totals to its group table."""
    stats = getattr(args["groups_ptr"], "launch_stats", None) or {}
    return {
        "name": f"grouped_gemm [G={stats.get('groups', '?')}, tiles={args['num_tiles']}]",
        "flops": stats.get("flops", 0.0),
        "bytes": stats.get("bytes", 0.0),
    }


@triton.jit
def _load_operand_tile(base, rows, cols, stride_r, stride_c, mask, LAYOUT: tl.constexpr):
    """Masked load of a (rows x cols) tile. ROW_MAJOR promises stride_c == 1, COL_MAJOR
    promises stride_r == 1: the unit stride becomes a compile-time fact (vector loads)."""
    if LAYOUT == 0:
        ptrs = base + rows[:, None] * stride_r + cols[None, :]
    elif LAYOUT == 1:
        ptrs = base + rows[:, None] + cols[None, :] * stride_c
    else:
        ptrs = base + rows[:, None] * stride_r + cols[None, :] * stride_c
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit(launch_metadata=_launch_metadata, do_not_specialize=["num_tiles"])
def grouped_gemm_kernel(
    # every operand is addressed as base_ptr + an element offset from the group table, so
    # the compiler sees one typed, 16-byte aligned pointer (it cannot see through an integer
    # converted to a pointer, and would fall back to 2-byte loads)
    base_ptr,
    # per-group table, int64, GROUP_COLS per row: A/B/C element offsets from base_ptr, M, N, K, strides
    groups_ptr,
    # per-tile schedule, int32, TILE_COLS per tile: group, tile row, tile column
    tiles_ptr, num_tiles,
    # tile shape
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    # promises shared by all groups: operand layouts; ALIGN (a power of two) divides every
    # A and B offset and leading stride and the sizes their vectors run along (K for a
    # row-major A, M for a column-major one; N for a row-major B, K for a column-major one),
    # ALIGN_C likewise C's offsets, leading strides and N (M when C is column-major), in elements
    A_LAYOUT: tl.constexpr, B_LAYOUT: tl.constexpr, ALIGN: tl.constexpr, ALIGN_C: tl.constexpr,
    # schedule: programs in the grid, TMA descriptors instead of pointer loads
    NUM_PROGRAMS: tl.constexpr, USE_TMA: tl.constexpr,
    GROUP_COLS: tl.constexpr = 16, TILE_COLS: tl.constexpr = 4,
    # fp32 with A strided in K: A to the MMA from registers (kernels/tf32_layout.py); every C
    # column-major (a swapped group writes C^T; the table's C stride is then its column stride)
    A_REGS: tl.constexpr = False, C_COL_MAJOR: tl.constexpr = False,
):
    pid = tl.program_id(axis=0)

    for t in tl.range(pid, num_tiles, NUM_PROGRAMS):
        # which tile of which GEMM (the host ordered this table, see tile_schedule())
        g = tl.load(tiles_ptr + t * TILE_COLS).to(tl.int64)
        pid_m = tl.load(tiles_ptr + t * TILE_COLS + 1)
        pid_n = tl.load(tiles_ptr + t * TILE_COLS + 2)
        row = groups_ptr + g * GROUP_COLS
        a_off = tl.load(row + 0)
        b_off = tl.load(row + 1)
        c_off = tl.load(row + 2)
        M = tl.load(row + 3).to(tl.int32)
        N = tl.load(row + 4).to(tl.int32)
        K = tl.load(row + 5).to(tl.int32)
        s_am = tl.load(row + 6)
        s_ak = tl.load(row + 7)
        s_bk = tl.load(row + 8)
        s_bn = tl.load(row + 9)
        s_cm = tl.load(row + 10)
        N_C = tl.load(row + 11).to(tl.int32)
        M_C = M
        if ALIGN > 1:
            # Host-checked promise (see _alignments). Sizes and offsets arrive from memory,
            # so without it the compiler must assume 1-element granularity and issues 2-byte
            # loads without cp.async; with ALIGN * element size = 16 bytes the masked loads
            # become 16-byte cp.async. Only the sizes a vector runs along are promised: a
            # ragged M (an MoE layer's tokens per expert) keeps row-major loads vectorized.
            a_off = tl.multiple_of(a_off, ALIGN)
            b_off = tl.multiple_of(b_off, ALIGN)
            if A_LAYOUT == 0:
                s_am = tl.multiple_of(s_am, ALIGN)
                K = tl.multiple_of(K, ALIGN)
            if A_LAYOUT == 1:
                s_ak = tl.multiple_of(s_ak, ALIGN)
                M = tl.multiple_of(M, ALIGN)
            if B_LAYOUT == 0:
                s_bk = tl.multiple_of(s_bk, ALIGN)
                N = tl.multiple_of(N, ALIGN)
            if B_LAYOUT == 1:
                s_bn = tl.multiple_of(s_bn, ALIGN)
                K = tl.multiple_of(K, ALIGN)
        if ALIGN_C > 1:
            # the same for the stores: 16-byte vectors where C's rows (columns) allow them
            c_off = tl.multiple_of(c_off, ALIGN_C)
            s_cm = tl.multiple_of(s_cm, ALIGN_C)
            if C_COL_MAJOR:
                M_C = tl.multiple_of(M_C, ALIGN_C)
            else:
                N_C = tl.multiple_of(N_C, ALIGN_C)
        a_base = base_ptr + a_off
        b_base = base_ptr + b_off
        c_base = base_ptr + c_off

        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        rm = off_m + tl.arange(0, BLOCK_M)
        rn = off_n + tl.arange(0, BLOCK_N)
        rk = tl.arange(0, BLOCK_K)
        k_tiles = tl.cdiv(K, BLOCK_K)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)

        if USE_TMA:
            # device-side descriptors for this tile's group (row-major, aligned: host-checked);
            # TMA zero-fills out-of-bounds rows, columns and k
            a_desc = tl.make_tensor_descriptor(a_base, shape=[M, K], strides=[s_am, 1],
                                               block_shape=[BLOCK_M, BLOCK_K])
            b_desc = tl.make_tensor_descriptor(b_base, shape=[K, N], strides=[s_bk, 1],
                                               block_shape=[BLOCK_K, BLOCK_N])
            for ki in range(k_tiles):
                a = a_desc.load([off_m, ki * BLOCK_K])
                b = b_desc.load([ki * BLOCK_K, off_n])
                acc = tl.dot(a, b, acc)
        else:
            for ki in range(k_tiles):
                kk = ki * BLOCK_K + rk
                a = _load_operand_tile(a_base, rm, kk, s_am, s_ak, (rm[:, None] < M) & (kk[None, :] < K), A_LAYOUT)
                if A_REGS:
                    # a computed operand goes to the MMA from registers: no 4-byte transposing
                    # copies of a tf32 tile with M contiguous (dp_gemm.mac_loop's A_REGS)
                    a = a + 0.0
                b = _load_operand_tile(b_base, kk, rn, s_bk, s_bn, (kk[:, None] < K) & (rn[None, :] < N), B_LAYOUT)
                acc = tl.dot(a, b, acc)

        if C_COL_MAJOR:
            c_ptrs = c_base + rm[:, None] + rn[None, :] * s_cm
        else:
            c_ptrs = c_base + rm[:, None] * s_cm + rn[None, :]
        tl.store(c_ptrs, acc.to(base_ptr.dtype.element_ty), mask=(rm[:, None] < M_C) & (rn[None, :] < N_C))


# Staging table (int64, STAGE_COLS per matrix): source offset (elements from the source
# base), destination offset (elements from the staging buffer), rows, columns, source row and
# column strides, destination row stride (= padded columns). Schedule (int32, TILE_COLS per
# tile): matrix, tile row, tile column.
STAGE_COLS = 8
STAGE_BLOCK_R, STAGE_BLOCK_C = 32, 128


@triton.jit(do_not_specialize=["num_tiles"])
def stage_copy_kernel(src_ptr, dst_ptr, table_ptr, sched_ptr, num_tiles,
                      BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr, NUM_PROGRAMS: tl.constexpr,
                      ALIGN: tl.constexpr, SRC_LAYOUT: tl.constexpr = 2,
                      STAGE_COLS: tl.constexpr = 8, TILE_COLS: tl.constexpr = 4):
    """Copy every A_i / B_i of a staged plan into its zero-padded row-major slot: the source
    as it is (2-byte loads where it is odd; SRC_LAYOUT promises, as the GEMM's layouts do,
    that every source has unit column stride (0) or unit row stride (1), so that a warp's
    loads run along the source's contiguous dimension), the destination in 16-byte vectors
    (its offsets and row stride are multiples of ALIGN elements), the padding columns written
    as zeros so that the GEMM's K and N may run to the padded sizes."""
    pid = tl.program_id(axis=0)
    for t in tl.range(pid, num_tiles, NUM_PROGRAMS):
        m = tl.load(sched_ptr + t * TILE_COLS).to(tl.int64)
        tr = tl.load(sched_ptr + t * TILE_COLS + 1)
        tc = tl.load(sched_ptr + t * TILE_COLS + 2)
        row = table_ptr + m * STAGE_COLS
        src_off = tl.load(row + 0)
        dst_off = tl.multiple_of(tl.load(row + 1), ALIGN)
        rows = tl.load(row + 2).to(tl.int32)
        cols = tl.load(row + 3).to(tl.int32)
        s_r = tl.load(row + 4)
        s_c = tl.load(row + 5)
        d_r = tl.multiple_of(tl.load(row + 6).to(tl.int32), ALIGN)  # padded columns = row stride
        r = tr * BLOCK_R + tl.arange(0, BLOCK_R)
        c = tc * BLOCK_C + tl.arange(0, BLOCK_C)
        v = _load_operand_tile(src_ptr + src_off, r, c, s_r, s_c, (r[:, None] < rows) & (c[None, :] < cols),
                               SRC_LAYOUT)
        tl.store(dst_ptr + dst_off + r[:, None] * d_r + c[None, :], v, mask=(r[:, None] < rows) & (c[None, :] < d_r))


# --------------------------------------------------------------------------------------
# Host side
# --------------------------------------------------------------------------------------


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def check_group(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> list[tuple[int, int, int]]:
    """Validate every pair and return [(M, N, K)]. All pairs share dtype and device."""
    As, Bs = list(As), list(Bs)
    if len(As) != len(Bs):
        raise ValueError(f"{len(As)} A matrices but {len(Bs)} B matrices")
    if not As:
        raise ValueError("empty group: nothing to multiply")
    first = As[0]
    sizes = []
    for i, (a, b) in enumerate(zip(As, Bs)):
        M, N, K = check_matmul_inputs(a, b, where=f"group {i}: ")  # the checks every schedule makes
        if a.dtype != first.dtype:
            raise TypeError(f"group {i}: dtype {a.dtype} differs from group 0's {first.dtype}")
        if a.device != first.device:
            raise ValueError(f"group {i}: on {a.device}, group 0 on {first.device}")
        sizes.append((M, N, K))
    return sizes


def _layout(ts: Sequence[torch.Tensor], inner: int) -> int:
    """ROW_MAJOR when every tensor has unit stride along dim 1, COL_MAJOR when every one has
    unit stride along dim 0, else STRIDED. A size-1 dimension's stride is irrelevant."""
    def unit(t, d):
        return t.shape[d] == 1 or t.stride(d) == 1

    if all(unit(t, inner) for t in ts):
        return ROW_MAJOR
    if all(unit(t, 1 - inner) for t in ts):
        return COL_MAJOR
    return STRIDED


def _pow2_divisor(x: int, cap: int) -> int:
    """Largest power of two <= cap dividing x (cap itself for x == 0)."""
    x = abs(int(x))
    d = 1
    while d < cap and x % (2 * d) == 0:
        d *= 2
    return d


def _alignments(sizes, store_sizes, a_offs, b_offs, c_offs, As, Bs, outs, a_layout: int, b_layout: int, elt: int,
                c_col: bool = False) -> tuple[int, int]:
    """(ALIGN, ALIGN_C) for the kernel: the largest power of two (at most 16 bytes' worth of
    elements) dividing, for the loads, every A and B element offset and leading stride and
    the sizes their vectors run along (a row-major A's K, a column-major one's M; a row-major
    B's N, a column-major one's K); for the stores, every C offset and leading stride and C's
    N (M when `c_col`: the outputs are column-major, their leading stride is the column one).
    M of a row-major A joins neither: rows of any count keep their vectors, which is what a
    ragged-M group (tokens per expert) needs. `sizes` are the operands' (a staged plan's K
    and N padded), `store_sizes` C's own."""
    cap = ALIGN_BYTES // elt

    def gcd_pow2(vals) -> int:
        align = cap
        for v in vals:
            align = min(align, _pow2_divisor(v, cap))
            if align == 1:
                break
        return align

    load_vals = list(a_offs) + list(b_offs)
    for ts, layout, dims in ((As, a_layout, (2, 0)), (Bs, b_layout, (1, 2))):
        if layout == STRIDED:
            return 1, gcd_pow2(_store_vals(store_sizes, c_offs, outs, c_col))
        d = 0 if layout == ROW_MAJOR else 1  # the dimension whose stride is not 1
        load_vals += [t.stride(d) if t.shape[d] > 1 else 0 for t in ts]
        along = dims[0] if layout == ROW_MAJOR else dims[1]  # index into (M, N, K)
        load_vals += [s[along] for s in sizes]
    return gcd_pow2(load_vals), gcd_pow2(_store_vals(store_sizes, c_offs, outs, c_col))


def _store_vals(sizes, c_offs, outs, c_col: bool) -> list[int]:
    d = 1 if c_col else 0
    return list(c_offs) + [t.stride(d) if t.shape[d] > 1 else 0 for t in outs] + [s[0 if c_col else 1] for s in sizes]


def _round_up(x: int, m: int) -> int:
    return cdiv(x, m) * m


class _Staging:
    """A staged plan's copy step: one zero-initialised buffer holding every A_i as (M, Kp)
    and every B_i as (Kp, Np), row-major, Kp/Np rounded up to 16 bytes' worth of elements
    and every slot on a 128-byte boundary, plus the copy tables. `launch()` refreshes the
    slots from the current contents of the pinned A_i/B_i (one kernel launch)."""

    def __init__(self, As, Bs, sizes, device, num_sms: int):
        elt = As[0].element_size()
        per, line = ALIGN_BYTES // elt, 128 // elt
        self.padded = [(M, _round_up(N, per), _round_up(K, per)) for M, N, K in sizes]
        slots, total = [], 0
        for M, Np, Kp in self.padded:
            a_at = total
            total += _round_up(M * Kp, line)
            b_at = total
            total += _round_up(Kp * Np, line)
            slots.append((a_at, b_at))
        self.buffer = torch.zeros(total, dtype=As[0].dtype, device=device)
        self.As = [self.buffer[a:a + M * Kp].view(M, Kp) for (a, _), (M, _, Kp) in zip(slots, self.padded)]
        self.Bs = [self.buffer[b:b + Kp * Np].view(Kp, Np) for (_, b), (_, Np, Kp) in zip(slots, self.padded)]
        src_base = As[0].data_ptr()
        table = np.zeros((2 * len(sizes), STAGE_COLS), dtype=np.int64)
        extents = []  # (rows, padded columns) of matrix m = 2i (A_i) and 2i + 1 (B_i)
        for i, (a, b, (a_at, b_at), (M, Np, Kp)) in enumerate(zip(As, Bs, slots, self.padded)):
            for j, (src, at, rows, cols, pad_cols) in enumerate(((a, a_at, M, a.shape[1], Kp),
                                                                  (b, b_at, b.shape[0], b.shape[1], Np))):
                delta = src.data_ptr() - src_base
                if delta % elt:
                    raise ValueError(f"group {i}: address not a whole number of elements from group 0's A")
                table[2 * i + j, :7] = (delta // elt, at, rows, cols, src.stride(0), src.stride(1), pad_cols)
                extents.append((rows, pad_cols, 0))
        # the copy's tiles are laid out as the GEMMs' are: matrix, tile row, tile column
        tiles = tile_schedule(extents, STAGE_BLOCK_R, STAGE_BLOCK_C, lpt=False)
        packed = np.concatenate([table.reshape(-1), tiles.reshape(-1).view(np.int64)])
        blob = torch.from_numpy(packed).to(device)
        self.table_dev = blob[: table.size]
        self.sched_dev = blob[table.size:].view(torch.int32)
        self.num_tiles = int(tiles.shape[0])
        # one program a tile: many resident programs keep enough 2-byte loads of odd rows in
        # flight (a persistent grid of 4 per SM copied at ~1.2 TB/s on sm_90)
        self.grid = max(1, self.num_tiles)
        self.src = As[0]
        self.align = per
        # unit column strides everywhere (row-major sources) or unit row strides (transposed
        # views): the copy's loads run along that dimension; a mix takes the general path
        srcs = list(As) + list(Bs)
        self.src_layout = _layout(srcs, inner=1)

    def launch(self) -> None:
        launch_kernel(stage_copy_kernel, (self.grid,),
            self.src, self.buffer, self.table_dev, self.sched_dev, self.num_tiles,
            BLOCK_R=STAGE_BLOCK_R, BLOCK_C=STAGE_BLOCK_C, NUM_PROGRAMS=self.grid, ALIGN=self.align,
            SRC_LAYOUT=self.src_layout, num_warps=4,
        )


def _kernel_tile(config: Config, swapped: bool) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the launched problem: a swapped group computes C^T, so the
    config's tile is transposed."""
    return (config.block_n, config.block_m) if swapped else (config.block_m, config.block_n)


class GroupedPlan:
    """Everything a launch needs, built once by `prepare`: the pinned inputs and outputs,
    the device tables (one H2D copy), the compile-time promises and the grid."""

    def __init__(self, As, Bs, outs, sizes, config: Config, groups_dev, tiles_dev, num_tiles,
                 a_layout, b_layout, align, grid, *, base=None, swapped=False, a_regs=False,
                 align_c=None, staging: _Staging | None = None):
        self.As, self.Bs, self.outs, self.sizes = As, Bs, outs, sizes
        self.config = config
        self.groups_dev, self.tiles_dev, self.num_tiles = groups_dev, tiles_dev, num_tiles
        # the kernel's view: operand layouts of the launched problem (C^T = B^T A^T when
        # `swapped`, then its tile is config's transposed), its base pointer, A through registers
        self.a_layout, self.b_layout, self.align, self.grid = a_layout, b_layout, align, grid
        self.align_c = align if align_c is None else align_c
        self.base = As[0] if base is None else base
        self.swapped, self.a_regs = swapped, a_regs
        self.staging = staging  # config.stage: the copy step before every GEMM launch
        self.dtype = As[0].dtype

    def __repr__(self) -> str:
        return (f"GroupedPlan(groups={len(self.sizes)}, tiles={self.num_tiles}, grid={self.grid}, "
                f"config={self.config.label()}, a_layout={self.a_layout}, b_layout={self.b_layout}, "
                f"align={self.align}, align_c={self.align_c}{', swapped' if self.swapped else ''}"
                f"{', staged' if self.staging else ''})")

    def launch(self) -> list[torch.Tensor]:
        """One kernel launch (two when staged: the copy, then the GEMMs); returns the output
        list (the same tensors every time)."""
        c = self.config
        if c.use_tma and not _interpreting():
            ensure_allocator()
        if self.staging is not None:
            self.staging.launch()
        bm, bn = _kernel_tile(c, self.swapped)
        launch_kernel(grouped_gemm_kernel, (self.grid,),
            self.base, self.groups_dev, self.tiles_dev, self.num_tiles,
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=c.block_k,
            A_LAYOUT=self.a_layout, B_LAYOUT=self.b_layout, ALIGN=self.align, ALIGN_C=self.align_c,
            NUM_PROGRAMS=self.grid, USE_TMA=c.use_tma,
            A_REGS=self.a_regs, C_COL_MAJOR=self.swapped,
            num_warps=c.num_warps, num_stages=c.num_stages,
        )
        return self.outs


def tile_schedule(sizes: Sequence[tuple[int, int, int]], block_m: int, block_n: int, lpt: bool = True) -> np.ndarray:
    """(tiles, TILE_COLS) int32: group, tile row, tile column for every output tile. With
    `lpt`, ordered by decreasing k-steps (stable, so a group's tiles stay together and in
    row-major order): handed out round-robin, that is longest-processing-time-first."""
    parts, keys = [], []
    for g, (M, N, K) in enumerate(sizes):
        tm, tn = cdiv(M, block_m), cdiv(N, block_n)
        rows = np.empty((tm * tn, TILE_COLS), dtype=np.int32)
        rows[:, 0] = g
        rows[:, 1] = np.repeat(np.arange(tm, dtype=np.int32), tn)
        rows[:, 2] = np.tile(np.arange(tn, dtype=np.int32), tm)
        rows[:, 3] = 0
        parts.append(rows)
        keys.append(np.full(tm * tn, -K, dtype=np.int64))
    table = np.concatenate(parts)
    if lpt:
        table = table[np.argsort(np.concatenate(keys), kind="stable")]
    return table


def prepare(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor], config: Config | None = None, *,
            out: Sequence[torch.Tensor] | None = None, num_sms: int | None = None) -> GroupedPlan:
    """Validate the group, allocate the outputs (one buffer) unless `out` is given, build the
    tables and copy them to the device in one transfer. Returns a reusable GroupedPlan."""
    As, Bs = list(As), list(Bs)
    sizes = check_group(As, Bs)
    dtype, device = As[0].dtype, As[0].device
    config = config or default_config(sizes, dtype, num_sms)
    config.validate(dtype)

    elt = As[0].element_size()
    if out is None:
        # one allocation, each C_i a contiguous view starting on a 128-byte boundary
        per = 128 // elt
        starts, total = [], 0
        for M, N, _ in sizes:
            starts.append(total)
            total += cdiv(M * N, per) * per
        flat = torch.empty(total, dtype=dtype, device=device)
        outs = [flat[s:s + M * N].view(M, N) for s, (M, N, _) in zip(starts, sizes)]
    else:
        outs = list(out)
        if len(outs) != len(sizes):
            raise ValueError(f"out has {len(outs)} tensors for {len(sizes)} groups")
        for i, (c, (M, N, _)) in enumerate(zip(outs, sizes)):
            prepare_output(c, M, N, As[0], name=f"out[{i}]")
            if N > 1 and c.stride(1) != 1:
                raise ValueError(f"out[{i}] needs unit column stride, has strides {tuple(c.stride())}")

    a_layout = _layout(As, inner=1)
    b_layout = _layout(Bs, inner=1)
    # fp32 with row-major A and B: B's K is strided, and wgmma reads tf32 only K-major, so
    # the kernel computes C_i^T = B_i^T A_i^T instead: B_i^T (M contiguous) goes to the MMA
    # from registers, A_i^T is K-major, and C_i^T is stored column-major into C_i
    swapped = (dtype == torch.float32 and not config.use_tma and a_layout == ROW_MAJOR
               and b_layout == ROW_MAJOR and tf32_layout_enabled())
    sms = num_sms or _num_sms(device)
    staging = None
    kA, kB, kC, ksizes = As, Bs, outs, sizes
    load_sizes = sizes  # N and K as the operands hold them (padded when staged)
    if config.stage:
        # odd K or N (or misaligned, transposed, strided operands): copy them into padded,
        # aligned row-major slots each launch; the zero padding adds nothing to C
        staging = _Staging(As, Bs, sizes, device, sms)
        kA, kB = staging.As, staging.Bs
        load_sizes = staging.padded
        a_layout = b_layout = ROW_MAJOR
    elif swapped:
        kA, kB, kC = [b.t() for b in Bs], [a.t() for a in As], [c.t() for c in outs]
        ksizes = load_sizes = [(N, M, K) for M, N, K in sizes]
        a_layout, b_layout = _layout(kA, inner=1), _layout(kB, inner=1)
    a_regs = dtype == torch.float32 and a_layout != ROW_MAJOR and tf32_layout_enabled()
    G = len(sizes)
    groups = np.zeros((G, GROUP_COLS), dtype=np.int64)
    base = kA[0].data_ptr()
    a_offs, b_offs, c_offs = [], [], []
    for i, (a, b, c, (M, N, K), (_, Nl, Kl)) in enumerate(zip(kA, kB, kC, ksizes, load_sizes)):
        offs = []
        for t in (a, b, c):
            delta = t.data_ptr() - base
            if delta % elt:  # cannot happen for tensors of one dtype, but never guess
                raise ValueError(f"group {i}: address not a whole number of elements from group 0's A")
            offs.append(delta // elt)
        a_offs.append(offs[0])
        b_offs.append(offs[1])
        c_offs.append(offs[2])
        c_lead = c.stride(1) if swapped else c.stride(0)
        groups[i, :12] = (*offs, M, Nl, Kl, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c_lead, N)
    # the kernel's group 0 A is its base pointer; its own alignment joins both promises
    base_al = [base // elt if base % elt == 0 else 1]
    align, align_c = _alignments(load_sizes, ksizes, a_offs + base_al, b_offs, c_offs + base_al, kA, kB, kC,
                                 a_layout, b_layout, elt, c_col=swapped)
    # a TMA descriptor takes every row stride, even of a one-row operand, which the pointer
    # path's promise may skip (its only row is never strided over)
    tma_rows_ok = all(t.stride(0) * elt % ALIGN_BYTES == 0 for t in list(kA) + list(kB))
    if config.use_tma and not (a_layout == ROW_MAJOR and b_layout == ROW_MAJOR and align * elt >= ALIGN_BYTES
                               and tma_rows_ok):
        raise ValueError("use_tma needs every A_i and B_i row-major, with 16-byte aligned addresses, row "
                         "strides and sizes (K and N); use the pointer path (use_tma=False), or stage=True")
    bm, bn = _kernel_tile(config, swapped)
    tiles = tile_schedule(ksizes, bm, bn, config.lpt_order)
    num_tiles = int(tiles.shape[0])
    # one host-to-device copy: both tables in one int64 buffer, the tile table reinterpreted
    packed = np.concatenate([groups.reshape(-1), tiles.reshape(-1).view(np.int64)])
    blob = torch.from_numpy(packed).to(device)
    groups_dev = blob[: groups.size]
    tiles_dev = blob[groups.size:].view(torch.int32)
    groups_dev.launch_stats = {  # read by _launch_metadata
        "groups": G,
        "flops": float(sum(2 * M * N * K for M, N, K in sizes)),
        "bytes": float(sum(elt * (M * K + K * N + M * N) for M, N, K in sizes)),
    }
    grid = max(1, min(config.programs_per_sm * sms, num_tiles))
    return GroupedPlan(As, Bs, outs, sizes, config, groups_dev, tiles_dev, num_tiles,
                       a_layout, b_layout, align, grid, base=kA[0], swapped=swapped, a_regs=a_regs,
                       align_c=align_c, staging=staging)


def grouped_matmul(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor], config: Config | None = None, *,
                   out: Sequence[torch.Tensor] | None = None, plan: GroupedPlan | None = None) -> list[torch.Tensor]:
    """[A_i @ B_i for each i] in one persistent launch.

    With `plan` (from `prepare`), only launches: As/Bs must be the tensors the plan was
    built for, `config` must be None or the plan's, and `out` is not accepted (the plan
    owns its outputs). Without a plan, builds one (see `prepare`) and launches it."""
    if plan is None:
        return prepare(As, Bs, config, out=out).launch()
    if out is not None:
        raise ValueError("a plan owns its outputs: pass out= to prepare()")
    if config is not None and config != plan.config:
        raise ValueError(f"config {config.label()} differs from the plan's {plan.config.label()}")
    if (As is not plan.As and (len(As) != len(plan.As) or any(x is not y for x, y in zip(As, plan.As)))) or \
       (Bs is not plan.Bs and (len(Bs) != len(plan.Bs) or any(x is not y for x, y in zip(Bs, plan.Bs)))):
        raise ValueError("As/Bs are not the tensors this plan was prepared for")
    return plan.launch()


# --------------------------------------------------------------------------------------
# Self-check
# --------------------------------------------------------------------------------------


def random_group(sizes, dtype, device, seed: int = 0, transpose_a: bool = False, transpose_b: bool = False):
    """Fresh normal A_i, B_i (never zeros) for `sizes`, optionally as transposed views."""
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    As, Bs = [], []
    for M, N, K in sizes:
        a = torch.randn((K, M) if transpose_a else (M, K), generator=g).to(dtype).to(device)
        b = torch.randn((N, K) if transpose_b else (K, N), generator=g).to(dtype).to(device)
        As.append(a.t() if transpose_a else a)
        Bs.append(b.t() if transpose_b else b)
    return As, Bs


def check_outputs(As, Bs, outs) -> float:
    """Worst relative error over the group against the float64 reference; asserts it is
    under the dtype's tolerance (NaN left in any output fails)."""
    worst = 0.0
    tol = TOLERANCE[As[0].dtype]
    for i, (a, b, c) in enumerate(zip(As, Bs, outs)):
        err = rel_error(c, reference(a, b))
        assert err <= tol, f"group {i} {tuple(a.shape)}x{tuple(b.shape)}: rel err {err:.3e} > {tol:.0e}"
        worst = max(worst, err)
    return worst


def _main() -> None:
    import random

    fix_interpreter_bf16_dot()
    gpu = torch.cuda.is_available() and not _interpreting()
    device = "cuda" if gpu else "cpu"
    rng = random.Random(0)
    if gpu:
        groups = [[(rng.randint(128, 512), rng.randint(128, 512), rng.randint(128, 512)) for _ in range(64)],
                  [(rng.choice(range(128, 513, 8)),) * 3 for _ in range(16)]]
    else:
        groups = [[(rng.randint(1, 70), rng.randint(1, 70), rng.randint(1, 70)) for _ in range(7)]]
    for sizes in groups:
        for dtype in (torch.float16, torch.bfloat16, torch.float32):
            for ta, tb in ((False, False), (True, False), (False, True)):
                As, Bs = random_group(sizes, dtype, device, seed=len(sizes), transpose_a=ta, transpose_b=tb)
                cfg = None if gpu else Config(32, 32, 16, 4, 2)
                plan = prepare(As, Bs, cfg)
                for c in plan.outs:
                    poison_(c)
                outs = grouped_matmul(As, Bs, plan=plan)
                err = check_outputs(As, Bs, outs)
                print(f"ok  {len(sizes)} GEMMs  {str(dtype):<15} ta={ta:d} tb={tb:d}  {plan!r}  worst rel_err={err:.2e}")


if __name__ == "__main__":
    import sys

    if "--compile-sm90" in sys.argv:  # every search-space entry compiled for sm_90, no GPU needed
        from .grouped_tools import compile_report

        problems = compile_report()
        print("\n".join(["", f"{len(problems)} problem(s)"] + problems))
        sys.exit(1 if problems else 0)
    _main()
