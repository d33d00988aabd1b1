"""kernels/persistent_gemm.py under the Triton interpreter (ADVISOR_NUM_SMS=3, so each program
loops over several tiles): pointer and TMA paths, every dtype and layout, TMA refusals."""

from __future__ import annotations

import pytest
import torch
from gemm_checks import (
    DEVICE,
    DTYPES,
    LAYOUTS,
    check_search_space,
    check_validation,
    common,
    layout_id,
    run_checked,
)

from advisor.kernel_lib import load

ps = load("persistent_gemm")
pytestmark = pytest.mark.interpreter


def ptr_cfg(bm=32, bn=32, bk=32, pps=1, flatten=True):
    return ps.Config(bm, bn, bk, 2, 4, 2, PROGRAMS_PER_SM=pps, use_tma=False, FLATTEN=flatten)


def tma_cfg(bm=16, bn=32, bk=16, subtile=False, pps=1):
    return ps.Config(bm, bn, bk, 2, 4, 2, PROGRAMS_PER_SM=pps, use_tma=True, EPILOGUE_SUBTILE=subtile)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_pointer_path(layout, dtype):
    # 37x53x97 in 16x16 tiles: 12 tiles over 3 programs, ragged M, N and K
    run_checked(ps, 37, 53, 97, dtype, ptr_cfg(16, 16, 32), layout=layout)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_tma_path(layout, dtype):
    # TMA-legal strides (multiples of 16 bytes) but ragged tiles: 40 = 2.5 x 16 rows, K = 72 =
    # 4.5 x 16 (zero-filled boxes); column-major A/B go through the transposed descriptors
    run_checked(ps, 40, 48, 72, dtype, tma_cfg(), layout=layout)


@pytest.mark.parametrize("layout", [LAYOUTS[0], LAYOUTS[3]], ids=layout_id)
def test_tma_epilogue_subtile(layout):
    run_checked(ps, 40, 48, 72, torch.bfloat16, tma_cfg(subtile=True), layout=layout)


@pytest.mark.parametrize("use_tma", [False, True])
def test_two_programs_per_sm_and_no_flatten(use_tma):
    # grid = 6 programs over 3x3 tiles; FLATTEN=False compiles the plain nested loops
    cfg = ps.Config(16, 16, 16, 1, 4, 2, PROGRAMS_PER_SM=2, use_tma=use_tma, FLATTEN=False)
    run_checked(ps, 48, 40, 32, torch.float16, cfg)


def test_fewer_tiles_than_programs():
    run_checked(ps, 1, 1, 1, torch.float16, ptr_cfg())
    run_checked(ps, 8, 8, 8, torch.float16, tma_cfg())


def test_column_major_output_pointer_path():
    run_checked(ps, 37, 53, 97, torch.float16, ptr_cfg(), out_layout="col")


def test_int64_offsets_path(monkeypatch):
    monkeypatch.setattr(ps, "needs_int64_offsets", lambda *t: True)
    run_checked(ps, 37, 53, 97, torch.float16, ptr_cfg(), layout=(True, False))


def test_tma_refuses_unaligned_inputs():
    a, b = common.random_inputs(37, 53, 97, torch.float16, DEVICE, seed=0)
    with pytest.raises(ValueError, match="TMA"):
        ps.matmul(a, b, tma_cfg())
    # aligned shape, but A starts 2 bytes into its storage
    base = torch.randn(40, 80, dtype=torch.float16, device=DEVICE)
    a_off = base[:, 1:73]  # (40, 72) view, row stride 80 (160 bytes), start 2 bytes in
    b2 = torch.randn(72, 48, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="TMA"):
        ps.matmul(a_off, b2, tma_cfg())
    a2 = torch.randn(40, 72, dtype=torch.float16, device=DEVICE)
    with pytest.raises(ValueError, match="row-major"):
        ps.matmul(a2, b2, tma_cfg(), out=torch.empty(48, 40, dtype=torch.float16, device=DEVICE).t())


def test_default_config_falls_back_from_tma():
    # default config (TMA where the shape allows) on inputs TMA cannot read: pointer loads
    base = torch.randn(40, 80, dtype=torch.float16, device=DEVICE)
    a = base[:, 1:73]
    b = torch.randn(72, 48, dtype=torch.float16, device=DEVICE)
    assert ps.default_config(40, 48, 72, torch.float16, 3).use_tma
    c = ps.matmul(a, b)
    assert common.rel_error(c, common.reference(a, b)) <= common.TOLERANCE[torch.float16]


# ---- Staged copies for TMA (staged) ---------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_staged_misaligned_rows(layout, dtype):
    # 40x37x45: K and N rows misaligned for every 16-bit layout (74 and 90 bytes), so A, B and
    # C all go through aligned buffers (fp32: 148 and 180 bytes, the same); a staged config on
    # a shape TMA reads directly copies nothing
    staged = ps.Config(16, 32, 16, 2, 4, 2, use_tma=True, staged=True)
    run_checked(ps, 40, 37, 45, dtype, staged, layout=layout)
    run_checked(ps, 40, 48, 72, dtype, staged, layout=layout)


def test_staged_views_and_out():
    # an offset view of A (start 2 bytes in) and a column-major, then a misaligned, `out`:
    # the result lands in the caller's tensor, which is returned
    staged = ps.Config(16, 32, 16, 2, 4, 2, use_tma=True, staged=True, EPILOGUE_SUBTILE=True)
    base = torch.randn(40, 80, dtype=torch.float16, device=DEVICE)
    a, b = base[:, 1:73], torch.randn(72, 48, dtype=torch.float16, device=DEVICE)
    ref = common.reference(a, b)
    for out in (torch.empty(48, 40, dtype=torch.float16, device=DEVICE).t(),
                torch.empty(40, 49, dtype=torch.float16, device=DEVICE)[:, 1:]):
        common.poison_(out)
        assert ps.matmul(a, b, staged, out=out) is out
        assert common.rel_error(out, ref) <= common.TOLERANCE[torch.float16]
    assert torch.equal(base[:, 1:73], a)  # the inputs are read, never written


def test_aligned_copy():
    # the staging copy: row-major sources with 8-byte aligned rows (36 fp16 = 72 bytes, also
    # as a view 8 bytes in) through the copy kernel, odd widths, a 2-byte offset view and a
    # transposed view through torch; always a 16-byte aligned, padded result
    for shape, view in [((37, 36), lambda t: t), ((40, 80), lambda t: t[:, 4:76]), ((37, 45), lambda t: t),
                        ((40, 80), lambda t: t[:, 1:73]), ((45, 37), lambda t: t.t()), ((1, 5), lambda t: t)]:
        x = torch.randn(*shape, dtype=torch.float16, device=DEVICE)
        y = ps.aligned_copy(view(x))
        assert torch.equal(y, view(x)) and ps.tma_layout(y) == "row", shape


def test_staging_rules():
    bf16 = torch.bfloat16
    with pytest.raises(ValueError, match="staged.*use_tma"):
        ps.Config(use_tma=False, staged=True)
    with pytest.raises(TypeError, match="staged"):
        ps.Config(staged=1)
    assert "staged" in ps.Config(staged=True).describe()
    # copies under half the GEMM's ideal time: big GEMMs with a misaligned K or N; a skinny one
    # whose misaligned B would be copied whole does not pay; only M misaligned copies nothing
    # (row-major A, B and C are all TMA-readable); aligned shapes need no staging
    for shape, pays in [((2000, 2900, 8192), True), ((1664, 1408, 8196), True), ((3000, 2001, 4096), True),
                        ((64, 4097, 14336), False), ((16, 4096, 16381), True), ((37, 4096, 4096), True),
                        ((2176, 2176, 8192), False), ((37, 53, 97), False)]:
        assert ps.staging_pays(*shape, bf16) == pays, shape
    # fp32 copies twice the bytes, but its tf32 GEMM runs at half the rate: the same verdict
    assert ps.staging_pays(1000, 4095, 4096, torch.float32) and ps.staging_pays(1000, 4095, 4096, bf16)
    cfg = ps.default_config(2000, 2900, 8192, bf16, 132)
    assert cfg.use_tma and cfg.staged
    assert not ps.default_config(2176, 2176, 8192, bf16, 132).staged
    assert not ps.default_config(64, 4097, 14336, bf16, 132).use_tma
    space = ps.search_space(2000, 2900, 8192, bf16, 132)
    assert all(c.staged == c.use_tma for c in space) and any(c.staged for c in space)
    # the default's choice on real tensors: an offset view of a big A is copied (a 34 MB
    # copy against a ~0.2 ms GEMM), that of a small one falls back to pointer loads
    f16 = torch.float16
    cfg = ps.default_config(4096, 4096, 4096, f16, 132)
    b, c = torch.empty(4096, 4096, dtype=f16), torch.empty(4096, 4096, dtype=f16)
    readable = torch.empty(4096, 4104, dtype=f16)[:, 8:]  # 16 bytes in, 8208-byte rows
    assert ps.tma_or_pointer_loads(cfg, readable, b, c)[0] == cfg and cfg.use_tma and not cfg.staged
    off = torch.empty(4096, 4104, dtype=f16)[:, 1:4097]  # 2 bytes in
    chosen, layouts = ps.tma_or_pointer_loads(cfg, off, b, c)
    assert chosen.use_tma and chosen.staged and layouts is None
    small = torch.empty(40, 80, dtype=torch.float16)[:, 1:73]
    chosen, _ = ps.tma_or_pointer_loads(ps.default_config(40, 48, 72, torch.float16, 3), small,
                                        torch.empty(72, 48, dtype=torch.float16), torch.empty(40, 48, dtype=torch.float16))
    assert not chosen.use_tma and not chosen.staged


def test_search_space_configs_run():
    M, N, K = 40, 72, 128
    space = ps.search_space(M, N, K, torch.float16, 3)
    assert any(c.use_tma for c in space) and any(not c.use_tma for c in space)
    for cfg in space:
        run_checked(ps, M, N, K, torch.float16, cfg, layout=(False, True))


def test_search_space_shapes():
    check_search_space(ps)
    space = ps.search_space(8192, 8192, 8192, torch.bfloat16, 132)
    assert ps.Config(128, 256, 64, 8, 8, 3, 1, True, False, True) in space
    # no TMA configs where contiguous strides cannot be 16-byte multiples
    assert not any(c.use_tma for c in ps.search_space(37, 53, 97, torch.bfloat16, 132))


def test_validation():
    check_validation(ps, ptr_cfg())
    with pytest.raises(ValueError, match="EPILOGUE_SUBTILE"):
        ps.Config(32, 32, 32, use_tma=False, EPILOGUE_SUBTILE=True)
    with pytest.raises(ValueError, match="PROGRAMS_PER_SM"):
        ps.Config(32, 32, 32, PROGRAMS_PER_SM=0)
    with pytest.raises(ValueError, match="shared memory"):
        ps.matmul(torch.randn(8, 8, device=DEVICE), torch.randn(8, 8, device=DEVICE),
                  ps.Config(128, 256, 64, 8, 8, 4, use_tma=False))


def test_fast_descriptors_equal_checked_ones():
    # the launchers skip TensorDescriptor's __post_init__ checks (host time); the object must
    # be the one the checked constructor builds, row-major and transposed
    from triton.tools.tensor_descriptor import TensorDescriptor

    assert ps._FAST_DESCRIPTORS  # this Triton's TensorDescriptor has the fields we set
    a = torch.randn(48, 80, dtype=torch.bfloat16)
    for t, shape, strides, block in [(a, [48, 80], [80, 1], [16, 32]), (a.t(), [48, 80], [80, 1], [32, 16])]:
        fast = ps._descriptor(t, shape, strides, block)
        assert fast == TensorDescriptor(t, shape, strides, block)
        assert type(fast) is TensorDescriptor and fast.padding == "zero"


def test_scratch_views_and_int64_bound():
    pool = common.ZeroedScratch()
    v = pool.get("t", 10, torch.float32, "cpu")
    assert pool.get("t", 10, torch.float32, "cpu") is v and v.numel() == 10 and not v.any()
    big = pool.get("t", 100, torch.float32, "cpu")  # regrows: the old views are dropped
    assert big.numel() == 100 and not big.any()
    assert pool.get("t", 10, torch.float32, "cpu").data_ptr() == big.data_ptr()
    pool.clear()
    assert pool.get("t", 10, torch.float32, "cpu") is not v
    # element offsets: (size - 1) x |stride| summed, against 2**31 - 1
    x = torch.empty(4, 8)
    assert not common.needs_int64_offsets(x, None, x.t())
    huge = torch.empty_strided((2, 2), (2**31, 1), device="meta")  # no storage needed
    assert common.needs_int64_offsets(x, huge)
    assert not common.needs_int64_offsets(torch.empty(0, 5))
