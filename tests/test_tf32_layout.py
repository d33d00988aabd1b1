"""kernels/tf32_layout.py under the Triton interpreter: the K-major copy, the rule that decides
it, and every schedule's fp32 matmul going through it."""

from __future__ import annotations

import pytest
import torch
from gemm_checks import DEVICE, common, run_checked

from advisor.codegen.kernel_lib import load

tl32 = load("tf32_layout")
pytestmark = pytest.mark.interpreter


def _sources(R, C, dtype):
    """The same (R, C) values as a row-major tensor, a column-major view and a view with no
    unit stride at all (every other column of a wider buffer)."""
    x = torch.randn(R, C, dtype=torch.float32).to(dtype).to(DEVICE)
    col = x.t().contiguous().t()
    wide = torch.empty(R, 2 * C, dtype=dtype, device=DEVICE)
    wide[:, ::2] = x
    return x, {"row": x, "col": col, "strided": wide[:, ::2]}


@pytest.mark.parametrize("k_dim", [0, 1])
@pytest.mark.parametrize("src", ["row", "col", "strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_k_major_copy_values_and_strides(k_dim, src, dtype):
    # 37x53 / 70x65: neither fills the 64x64 block, and 53, 65 are not multiples of 4 (the
    # padded stride must still be a 16-byte multiple)
    for R, C in ((37, 53), (70, 65)):
        x, views = _sources(R, C, dtype)
        y = tl32.k_major_copy(views[src], k_dim)
        assert y.shape == (R, C) and y.dtype == dtype and y.device == x.device
        assert torch.equal(y, x)  # a copy: bit-identical values
        assert y.stride(k_dim) == 1
        assert (y.stride(1 - k_dim) * y.element_size()) % 16 == 0
        assert y.data_ptr() != views[src].data_ptr()


def test_k_major_copy_empty():
    y = tl32.k_major_copy(torch.empty(0, 5, device=DEVICE), 0)
    assert y.shape == (0, 5) and y.stride(0) == 1


def test_copy_pays_rule():
    # B (K x N) is copied once M reaches 165 (see copy_pays); A (M x K) once N does
    assert tl32.copy_pays(166, 4096, 8192, 8192 * 4096)
    assert not tl32.copy_pays(164, 4096, 8192, 8192 * 4096)
    assert tl32.copy_pays(4096, 166, 8192, 4096 * 8192)
    assert not tl32.copy_pays(4096, 164, 8192, 4096 * 8192)
    # the measured shapes (module docstring): compute-heavy ones copy, skinny ones do not
    assert tl32.copy_pays(1664, 1408, 8192, 8192 * 1408)
    assert tl32.copy_pays(512, 512, 65536, 65536 * 512)
    assert tl32.copy_pays(256, 256, 131072, 131072 * 256)
    assert not tl32.copy_pays(128, 8192, 8192, 8192 * 8192)
    assert not tl32.copy_pays(64, 4096, 14336, 14336 * 4096)
    assert not tl32.copy_pays(16, 4096, 16384, 16384 * 4096)


def _fp32(M, N, K, ta=False, tb=False):
    return common.random_inputs(M, N, K, torch.float32, DEVICE, transpose_a=ta, transpose_b=tb, seed=3)


def test_operands_untouched_where_nothing_to_gain(monkeypatch):
    monkeypatch.delenv("ADVISOR_TF32_KMAJOR", raising=False)
    # 16-bit inputs: wgmma transposes them itself
    a, b = common.random_inputs(300, 40, 50, torch.bfloat16, DEVICE, seed=1)
    assert tl32.tf32_operands(a, b) == (a, b)
    # fp32, already K-major (A row-major, B a transposed view)
    a, b = _fp32(300, 300, 50, tb=True)
    ra, rb = tl32.tf32_operands(a, b)
    assert ra is a and rb is b
    # fp32 with a row-major B but too few rows of A to pay for copying B
    a, b = _fp32(64, 40, 50)
    ra, rb = tl32.tf32_operands(a, b)
    assert ra is a and rb is b


def test_operands_copied_where_it_pays(monkeypatch):
    monkeypatch.delenv("ADVISOR_TF32_KMAJOR", raising=False)
    a, b = _fp32(300, 300, 50, ta=True)  # A's M contiguous, B's N contiguous: both strided in K
    ra, rb = tl32.tf32_operands(a, b)
    assert ra.stride(1) == 1 and rb.stride(0) == 1
    assert torch.equal(ra, a) and torch.equal(rb, b)


def test_registers_callers_copy_only_b_beside_a_strided_a(monkeypatch):
    monkeypatch.delenv("ADVISOR_TF32_KMAJOR", raising=False)
    a, b = _fp32(300, 300, 50)  # B strided, A K-major: swapped later, nothing copied
    ra, rb = tl32.tf32_operands(a, b, registers=True)
    assert ra is a and rb is b
    a, b = _fp32(300, 300, 50, ta=True)  # both strided: A through registers, B copied
    ra, rb = tl32.tf32_operands(a, b, registers=True)
    assert ra is a and rb.stride(0) == 1 and torch.equal(rb, b)
    monkeypatch.setenv("ADVISOR_TF32_KMAJOR", "2")  # never copy
    ra, rb = tl32.tf32_operands(a, b)
    assert ra is a and rb is b


def test_env_switch(monkeypatch):
    a, b = _fp32(8, 8, 50)  # the rule says no copy here
    monkeypatch.setenv("ADVISOR_TF32_KMAJOR", "1")
    ra, rb = tl32.tf32_operands(a, b)
    assert ra is a and rb.stride(0) == 1 and torch.equal(rb, b)
    a, b = _fp32(300, 300, 50)
    monkeypatch.setenv("ADVISOR_TF32_KMAJOR", "0")
    ra, rb = tl32.tf32_operands(a, b)
    assert ra is a and rb is b


SCHEDULE_CONFIGS = {
    "dp_gemm": lambda m: m.Config(32, 32, 32, GROUP_M=2, num_warps=4, num_stages=2),
    "split_k_gemm": lambda m: m.Config(32, 32, 16, GROUP_M=2, num_warps=4, num_stages=2, SPLIT_K=3,
                                       reduction="two_phase"),
    "persistent_gemm": lambda m: m.Config(32, 32, 32, GROUP_M=2, num_warps=4, num_stages=2, use_tma=False),
    "stream_k_gemm": lambda m: m.Config(32, 32, 16, GROUP_M=2, num_warps=4, num_stages=2),
}


@pytest.mark.parametrize("name", sorted(SCHEDULE_CONFIGS))
def test_pointer_configs_swap_instead_of_copying(name, monkeypatch):
    # 230 rows of A: copying the row-major B would pay (M >= 165), but every schedule's
    # pointer-load config swaps the operands instead (B^T through registers); 37 and 53 fill
    # no tile. (The TMA configs' copy: test_tma_schedules_read_the_copy.)
    monkeypatch.delenv("ADVISOR_TF32_KMAJOR", raising=False)
    mod = load(name)
    copies = []
    real = tl32.k_major_copy

    def spy(x, k_dim):
        copies.append((tuple(x.shape), k_dim))
        return real(x, k_dim)

    monkeypatch.setattr(tl32, "k_major_copy", spy)
    run_checked(mod, 230, 37, 53, torch.float32, SCHEDULE_CONFIGS[name](mod))
    # both operands strided in K: no swap can help, so B is copied where that pays
    run_checked(mod, 230, 37, 53, torch.float32, SCHEDULE_CONFIGS[name](mod), layout=(True, False))
    assert copies == [((53, 37), 0)]
    # 16-bit inputs never copy
    run_checked(mod, 230, 37, 53, torch.bfloat16, SCHEDULE_CONFIGS[name](mod))
    assert copies == [((53, 37), 0)]


@pytest.mark.parametrize("name", ["persistent_gemm", "stream_k_gemm"])
def test_tma_schedules_read_the_copy(name, monkeypatch):
    # TMA loads: the copy's padded rows meet the 16-byte rule (K = 56: 224-byte rows), and
    # the TMA path must take the K-major B as a column-major descriptor
    monkeypatch.delenv("ADVISOR_TF32_KMAJOR", raising=False)
    mod = load(name)
    cfg = mod.Config(32, 32, 16, GROUP_M=2, num_warps=4, num_stages=2, use_tma=True)
    run_checked(mod, 230, 40, 56, torch.float32, cfg)


def test_swap_and_registers_rule(monkeypatch):
    monkeypatch.delenv("ADVISOR_TF32_KMAJOR", raising=False)
    a, b = _fp32(40, 37, 53)  # B row-major, too few rows to copy it: swap
    assert tl32.swap_operands(a, b)
    assert not tl32.a_through_registers(a)  # A is K-major as it is
    # swapped, B^T is the kernel's A (K strided: through registers) and A^T its K-major B
    assert tl32.a_through_registers(b.t()) and not tl32.swap_operands(b.t(), a.t())
    a, b = _fp32(40, 37, 53, tb=True)  # B already K-major
    assert not tl32.swap_operands(a, b)
    a, b = _fp32(40, 37, 53, ta=True)  # both strided: swapping would not help
    assert not tl32.swap_operands(a, b) and tl32.a_through_registers(a)
    a, b = common.random_inputs(40, 37, 53, torch.bfloat16, DEVICE, seed=1)
    assert not tl32.swap_operands(a, b) and not tl32.a_through_registers(a.t().contiguous().t())
    monkeypatch.setenv("ADVISOR_TF32_KMAJOR", "0")
    a, b = _fp32(40, 37, 53, ta=True)
    assert not tl32.swap_operands(a, b) and not tl32.a_through_registers(a)


def test_transposed_tile():
    sk = load("split_k_gemm")
    cfg = sk.Config(16, 64, 32, GROUP_M=2, num_warps=4, num_stages=2, SPLIT_K=3, reduction="atomic")
    t = tl32.transposed_tile(cfg)
    assert (t.BLOCK_M, t.BLOCK_N) == (64, 16) and t.SPLIT_K == 3 and t.reduction == "atomic"


def test_transposed_tile_swaps_stream_k_pieces():
    sk = load("stream_k_gemm")
    cfg = sk.Config(64, 32, 16, 2, 4, 2, "hybrid1", aligned=True, SK_SPLIT_M=2)
    t = tl32.transposed_tile(cfg)
    assert (t.BLOCK_M, t.BLOCK_N, t.SK_SPLIT_M, t.SK_SPLIT_N) == (32, 64, 1, 2)
    assert (t.sk_block_m, t.sk_block_n) == (cfg.sk_block_n, cfg.sk_block_m)


def test_stream_k_swaps_only_pointer_configs(monkeypatch):
    # a pointer-load config swaps (no copy even where one would pay); a TMA config copies
    monkeypatch.delenv("ADVISOR_TF32_KMAJOR", raising=False)
    sk = load("stream_k_gemm")
    copies = []
    real = tl32.k_major_copy
    monkeypatch.setattr(tl32, "k_major_copy", lambda x, k: copies.append(k) or real(x, k))
    pointer = sk.Config(32, 32, 16, GROUP_M=2, num_warps=4, num_stages=2)
    aligned_pieces = sk.Config(64, 32, 16, 2, 4, 2, "hybrid1", aligned=True, SK_SPLIT_M=2)
    for cfg in (pointer, aligned_pieces):
        run_checked(sk, 230, 40, 56, torch.float32, cfg)
    assert copies == []
    run_checked(sk, 230, 40, 56, torch.float32, sk.Config(32, 32, 16, GROUP_M=2, num_warps=4, num_stages=2,
                                                           use_tma=True))
    assert copies == [0]


@pytest.mark.parametrize("name", ["dp_gemm", "split_k_gemm", "stream_k_gemm", "persistent_gemm"])
@pytest.mark.parametrize("layout", [(False, False), (True, False)], ids=["nn", "tn"])
def test_swapped_and_register_paths_correct(name, layout, monkeypatch):
    # nn: B row-major with 40 rows of A -> swapped (C^T = B^T A^T, B^T through registers);
    # tn: A's M contiguous -> A through registers in place. Both against float64, poisoned out,
    # and a column-major out (the swap writes C through its transpose)
    monkeypatch.delenv("ADVISOR_TF32_KMAJOR", raising=False)
    mod = load(name)
    cfg = SCHEDULE_CONFIGS[name](mod)
    for out_layout in ("row", "col"):
        run_checked(mod, 40, 37, 53, torch.float32, cfg, layout=layout, out_layout=out_layout)
        run_checked(mod, 40, 37, 53, torch.float32, None, layout=layout, out_layout=out_layout)


@pytest.mark.parametrize("name", ["dp_gemm", "split_k_gemm"])
def test_swapped_call_returns_a_new_row_major_tensor(name, monkeypatch):
    monkeypatch.delenv("ADVISOR_TF32_KMAJOR", raising=False)
    mod = load(name)
    a, b = _fp32(40, 37, 53)
    assert tl32.swap_operands(a, b)
    c = mod.matmul(a, b)
    assert c.shape == (40, 37) and c.is_contiguous() and c.dtype == torch.float32
    assert common.rel_error(c, common.reference(a, b)) <= common.TOLERANCE[torch.float32]


def test_ws_copies_unless_told_not_to(monkeypatch):
    # warp-specialized: the K-major copy of a row-major fp32 B where it pays (M >= 165), and
    # none with allow_copy=False, which promises no copies of the operands
    monkeypatch.delenv("ADVISOR_TF32_KMAJOR", raising=False)
    ws = load("ws_gemm")
    cfg = ws.Config(32, 32, 16, 2, 4, 2, warp_specialize=False, tma_store=True, epilogue_subtile=2,
                    host_descriptors=True)
    copies = []
    real = tl32.k_major_copy
    monkeypatch.setattr(tl32, "k_major_copy", lambda x, k: copies.append(k) or real(x, k))
    a, b = _fp32(230, 40, 56)
    for allow_copy, expected in ((True, [0]), (False, [])):
        copies.clear()
        out = common.poison_(torch.empty((230, 40), device=DEVICE))
        ws.matmul(a, b, cfg, out=out, allow_copy=allow_copy)
        assert copies == expected
        assert common.rel_error(out, common.reference(a, b)) <= common.TOLERANCE[torch.float32]
