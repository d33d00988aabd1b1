"""Host-side tools around the grouped schedule: the benchmark's baselines (a Python loop
of torch.matmul, torch._grouped_mm) and the sm_90 compile check of every search-space entry
(`python -m kernels.grouped_gemm --compile-sm90`). Nothing here is needed to run a group.
"""

from __future__ import annotations

from typing import Callable

import torch
import triton

from .common import cdiv
from .grouped_configs import _C16, _C32, ALIGN_BYTES, SMEM_LIMIT_BYTES, Config
from .grouped_gemm import (
    COL_MAJOR,
    GROUP_COLS,
    ROW_MAJOR,
    STAGE_BLOCK_C,
    STAGE_BLOCK_R,
    STAGE_COLS,
    STRIDED,
    TILE_COLS,
    _interpreting,
    _TL_NAME,
    grouped_gemm_kernel,
    stage_copy_kernel,
)


# --------------------------------------------------------------------------------------
# Baselines for the benchmark (zero-argument callables; setup stays out of the timed call)
# --------------------------------------------------------------------------------------


def torch_loop(As, Bs, outs) -> Callable[[], list[torch.Tensor]]:
    """A Python loop of torch.matmul(a, b, out=c): what the trace symptom usually shows."""
    def run():
        for a, b, c in zip(As, Bs, outs):
            torch.matmul(a, b, out=c)
        return outs

    return run


def torch_grouped_mm(As, Bs) -> Callable[[], torch.Tensor] | None:
    """`torch._grouped_mm` for this group, or None where it cannot run it.

    Its constraints (PyTorch 2.8-2.11): bf16 only; the fast CUTLASS path needs sm_90 (since
    2.9 other CUDA GPUs take a loop fallback, which is no comparison, so this helper returns
    None there); one of the forms 2-D x 3-D (ragged M over `offs`, shared K and N), 3-D x 2-D,
    2-D x 2-D (ragged K) or 3-D x 3-D (a plain batch); strides multiples of 16 bytes (TMA).
    A group with mixed M, N and K
    fits none of them, so this helper zero-pads every member to the group's largest K and N
    (rounded up to 16 elements) and uses the 2-D x 3-D form over ragged M: one launch, more
    arithmetic (the extra FLOPs are counted against it, not for it). The padding copies are
    done here, outside the returned callable; the result is the stacked (sum M, N_pad)
    output, `[res[offs_i:offs_i + M_i, :N_i]]` slices it."""
    fn = getattr(torch, "_grouped_mm", None)
    if fn is None or not As or not As[0].is_cuda or As[0].dtype != torch.bfloat16:
        return None
    if torch.cuda.get_device_capability(As[0].device)[0] < 9:
        return None
    pad = 16
    kmax = cdiv(max(a.shape[1] for a in As), pad) * pad
    nmax = cdiv(max(b.shape[1] for b in Bs), pad) * pad
    dev = As[0].device
    a_cat = torch.zeros((sum(a.shape[0] for a in As), kmax), dtype=torch.bfloat16, device=dev)
    b_stack = torch.zeros((len(Bs), kmax, nmax), dtype=torch.bfloat16, device=dev)
    row = 0
    for i, (a, b) in enumerate(zip(As, Bs)):
        a_cat[row:row + a.shape[0], : a.shape[1]] = a
        b_stack[i, : b.shape[0], : b.shape[1]] = b
        row += a.shape[0]
    offs = torch.tensor([a.shape[0] for a in As], device=dev).cumsum(0).to(torch.int32)
    return lambda: fn(a_cat, b_stack, offs=offs)


# --------------------------------------------------------------------------------------
# Compile check for sm_90 without a GPU
# --------------------------------------------------------------------------------------


def compile_for_sm90(config: Config, dtype: torch.dtype = torch.bfloat16, *, a_layout: int = ROW_MAJOR,
                     b_layout: int = ROW_MAJOR, align: int | None = None, num_programs: int = 132,
                     a_regs: bool = False, c_col: bool = False, align_c: int | None = None):
    """Compile the kernel for sm_90 on any machine (Triton ships ptxas) and return the
    CompiledKernel (`metadata.shared`, `asm["ptx"]`): used to check that every search-space
    entry compiles and fits, and that the aligned path really issues 16-byte cp.async."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if _interpreting():
        raise RuntimeError("compile_for_sm90 needs TRITON_INTERPRET unset")
    config.validate(dtype)
    if align is None:
        align = ALIGN_BYTES // dtype.itemsize
    constexprs = dict(BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
                      A_LAYOUT=a_layout, B_LAYOUT=b_layout, ALIGN=align, ALIGN_C=align if align_c is None else align_c,
                      NUM_PROGRAMS=num_programs, USE_TMA=config.use_tma, GROUP_COLS=GROUP_COLS, TILE_COLS=TILE_COLS,
                      A_REGS=a_regs, C_COL_MAJOR=c_col)
    signature = {"base_ptr": "*" + _TL_NAME[dtype], "groups_ptr": "*i64", "tiles_ptr": "*i32", "num_tiles": "i32"}
    signature.update({k: "constexpr" for k in constexprs})
    attrs = {(i,): [["tt.divisibility", 16]] for i in (0, 1, 2)}
    src = ASTSource(grouped_gemm_kernel, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=config.num_warps, num_stages=config.num_stages))


def compile_stage_for_sm90(dtype: torch.dtype = torch.bfloat16, num_programs: int = 528, src_layout: int = ROW_MAJOR):
    """The staged plans' copy kernel, compiled for sm_90 (see compile_for_sm90)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if _interpreting():
        raise RuntimeError("compile_stage_for_sm90 needs TRITON_INTERPRET unset")
    constexprs = dict(BLOCK_R=STAGE_BLOCK_R, BLOCK_C=STAGE_BLOCK_C, NUM_PROGRAMS=num_programs,
                      ALIGN=ALIGN_BYTES // dtype.itemsize, SRC_LAYOUT=src_layout, STAGE_COLS=STAGE_COLS,
                      TILE_COLS=TILE_COLS)
    signature = {"src_ptr": "*" + _TL_NAME[dtype], "dst_ptr": "*" + _TL_NAME[dtype], "table_ptr": "*i64",
                 "sched_ptr": "*i32", "num_tiles": "i32"}
    signature.update({k: "constexpr" for k in constexprs})
    attrs = {(i,): [["tt.divisibility", 16]] for i in (1, 2, 3)}  # the source may sit anywhere
    src = ASTSource(stage_copy_kernel, signature, constexprs, attrs)
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))


def compile_report(dtypes=(torch.bfloat16, torch.float16, torch.float32)) -> list[str]:
    """Compile every candidate for sm_90 (row-major aligned, plus the transposed and
    unaligned pointer paths for the pointer configs); return the problems found."""
    problems = []
    for dtype in dtypes:
        for c in (_C32 if dtype == torch.float32 else _C16):
            vec = ALIGN_BYTES // dtype.itemsize
            variants = [(ROW_MAJOR, ROW_MAJOR, vec, False)]
            if not c.use_tma:
                variants += [(COL_MAJOR, COL_MAJOR, vec, False), (ROW_MAJOR, COL_MAJOR, 2, False),
                             (ROW_MAJOR, ROW_MAJOR, 1, False), (STRIDED, STRIDED, 1, False)]
                if dtype == torch.float32:  # a swapped row-major group (prepare): B^T in registers
                    variants.append((COL_MAJOR, COL_MAJOR, vec, True))
            for al, bl, align, swapped in variants:
                where = f"{str(dtype)[6:]:9} {c.label():28} A={al} B={bl} align={align}{' swapped' if swapped else ''}"
                try:
                    k = compile_for_sm90(c, dtype, a_layout=al, b_layout=bl, align=align, a_regs=swapped,
                                         c_col=swapped)
                except Exception as e:  # noqa: BLE001 - report every failure, then fail
                    problems.append(f"{where} does not compile: {type(e).__name__}: {str(e)[:200]}")
                    print(problems[-1], flush=True)
                    continue
                ptx = k.asm["ptx"]
                print(f"{where} shared={k.metadata.shared:6d} (est {c.smem_bytes(dtype):6d}) "
                      f"wgmma={'wgmma' in ptx} cp.async16={'cp.async.cg.shared.global' in ptx} "
                      f"tma={'cp.async.bulk.tensor' in ptx}", flush=True)
                if k.metadata.shared > min(SMEM_LIMIT_BYTES, c.smem_bytes(dtype)):
                    problems.append(f"{where}: shared {k.metadata.shared} over estimate/limit")
                if align == vec and not c.use_tma and "cp.async.cg.shared.global" not in ptx:
                    problems.append(f"{where}: aligned path without 16-byte cp.async")
                if c.use_tma and "cp.async.bulk.tensor" not in ptx:
                    problems.append(f"{where}: use_tma without TMA loads")
        if dtype != torch.float32:
            # a staged plan's copy kernel, and the GEMM on staged operands with odd-N stores
            try:
                k = compile_stage_for_sm90(dtype)
                ptx = k.asm["ptx"]
                vec = "st.global.v4.b32" in ptx or "st.global.v4.u32" in ptx
                print(f"{str(dtype)[6:]:9} stage_copy shared={k.metadata.shared} 16-byte stores={vec}", flush=True)
                if not vec:
                    problems.append(f"{dtype}: stage_copy without 16-byte stores")
                k = compile_for_sm90(Config(stage=True), dtype, align=ALIGN_BYTES // dtype.itemsize, align_c=1)
                if "cp.async.cg.shared.global" not in k.asm["ptx"]:
                    problems.append(f"{dtype}: staged GEMM without 16-byte cp.async")
            except Exception as e:  # noqa: BLE001
                problems.append(f"{dtype}: staged kernels do not compile: {type(e).__name__}: {str(e)[:200]}")
    return problems
