"""kernels/persistent_gemm.py under the Triton interpreter (ADVISOR_NUM_SMS=3, so each program
loops over several tiles): pointer and TMA paths, every dtype and layout, TMA refusals."""

from __future__ import annotations

from dataclasses import replace
from itertools import pairwise

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

from advisor.codegen.kernel_lib import load

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


# --------------------------------------------------------------------------------------------
# copy_beside: fp32 with a row-major B, its K-major copy in chunks beside the GEMM
# --------------------------------------------------------------------------------------------


def beside_cfg(copy_sms=2, chunks=3):
    return ps.Config(16, 16, 16, 2, 4, 2, use_tma=True, copy_sms=copy_sms, copy_chunks=chunks)


def model_rates(monkeypatch, M, copy_sms, programs):
    """Rates at which a tile column takes the GEMM 1.6x as long as the side copy (g = 1.6 s;
    g / s = M copy_sms rate / (4 flops)), so copy_beside_chunks makes several chunks on tiny
    problems (the H200's rates would make one): 7 tile columns become 2 + 3 + 2."""
    monkeypatch.setattr(ps, "_BESIDE_GEMM_FLOPS_PER_PROGRAM", 1.0 / programs)
    monkeypatch.setattr(ps, "_BESIDE_COPY_BYTES_PER_S", 6.4 / (copy_sms * M))


@pytest.mark.parametrize("M,N,K", [(40, 100, 72), (33, 112, 40), (48, 20, 24)])
def test_copy_beside_correct_in_chunks(M, N, K, monkeypatch):
    # ragged M, N (100 = 6.25 tiles: a narrow last chunk) and K; the interpreter runs the
    # chunks in turn, through the same chunk plan, copy kernel and per-chunk GEMMs as the GPU
    monkeypatch.setenv("ADVISOR_TF32_KMAJOR", "1")  # copy B even where copy_pays says no
    cfg = beside_cfg()
    grid = max(1, ps.num_sms(torch.device(DEVICE)) - cfg.copy_sms)
    model_rates(monkeypatch, M, 2, grid)
    chunks = ps.copy_beside_chunks(M, N, K, cfg, grid)
    assert [n1 - n0 for n0, n1 in chunks] == ([16, 4] if N == 20 else [32, 48, N - 80]), chunks
    calls = []
    real = ps.copy_beside
    monkeypatch.setattr(ps, "copy_beside", lambda *a: calls.append(1) or real(*a))
    run_checked(ps, M, N, K, torch.float32, cfg)
    assert calls == [1]


def test_copy_beside_only_where_it_applies(monkeypatch):
    monkeypatch.setenv("ADVISOR_TF32_KMAJOR", "1")
    calls = []
    real = ps.copy_beside
    monkeypatch.setattr(ps, "copy_beside", lambda *a: calls.append(1) or real(*a))
    cfg = beside_cfg()
    # not fp32, a K-major B (nothing to copy), a strided A (copied too: the plain path)
    run_checked(ps, 40, 48, 72, torch.bfloat16, cfg)
    run_checked(ps, 40, 48, 72, torch.float32, cfg, layout=(False, True))
    run_checked(ps, 40, 48, 72, torch.float32, cfg, layout=(True, False))
    # never copying (=2): the explicit config runs on the row-major B as it is
    monkeypatch.setenv("ADVISOR_TF32_KMAJOR", "2")
    run_checked(ps, 40, 48, 72, torch.float32, cfg)
    assert calls == []
    a, b = torch.randn(40, 72, device=DEVICE), torch.randn(72, 48, device=DEVICE)
    c = torch.empty(40, 48, device=DEVICE)
    monkeypatch.setenv("ADVISOR_TF32_KMAJOR", "1")
    assert ps.copy_beside_applies(a, b, c, cfg)
    assert not ps.copy_beside_applies(a, b, c.t().contiguous().t(), cfg)  # C not TMA-storable
    assert not ps.copy_beside_applies(a, b, c, replace(cfg, staged=True))
    assert not ps.copy_beside_applies(a, b, c, replace(cfg, copy_sms=0))
    monkeypatch.delenv("ADVISOR_TF32_KMAJOR")
    assert not ps.copy_beside_applies(a, b, c, cfg)  # 40 rows: copying B does not pay (copy_pays)


def test_copy_beside_chunk_plans():
    cfg = ps.Config(128, 256, 32, 8, 8, 3, 1, True, True, True, copy_sms=4, copy_chunks=6)

    def cols(M, N, K, c=cfg, programs=128):
        return [(n1 - n0) // c.BLOCK_N for n0, n1 in ps.copy_beside_chunks(M, N, K, c, programs)]

    # the H200 plans of the docstring: rounds of 4 (M = 4096) and 2 (M = 8192) tile columns
    assert cols(4096, 4096, 8192) == [12, 4]
    assert cols(8192, 8192, 8192) == [8, 6, 6, 6, 6]
    assert cols(8192, 8192, 8192, replace(cfg, copy_chunks=2)) == [18, 14]  # s > g a little: 18 first
    # nothing to hide behind (a GEMM far faster than the side copy): one chunk, copy first
    assert cols(256, 8192, 8192) == [32]
    # a GPU of 78 SMs (74 GEMM programs): a tile column takes the GEMM longer at the same
    # rate per SM, so a first chunk half as wide lets the side copy keep up
    assert cols(4096, 4096, 8192, programs=74) == [6, 4, 4, 2]
    # the plan's invariants on assorted shapes: contiguous whole-tile chunks covering N, at
    # most copy_chunks of them, and no chunk's copy outlasting the GEMM of those before it
    s_rate = ps._BESIDE_COPY_BYTES_PER_S
    for M, N, K, sms, n in [(4096, 4096, 8192, 4, 6), (8192, 8000, 1024, 4, 6), (6000, 8192, 2048, 8, 5),
                            (3000, 8192, 1024, 2, 3), (16384, 1000, 4096, 4, 8), (100, 100, 100, 4, 4)]:
        c = replace(cfg, copy_sms=sms, copy_chunks=n)
        bounds = ps.copy_beside_chunks(M, N, K, c, 132 - sms)
        assert bounds[0][0] == 0 and bounds[-1][1] == N and 1 <= len(bounds) <= n
        assert all(b0[1] == b1[0] for b0, b1 in pairwise(bounds))
        assert all(n0 % 256 == 0 for n0, _ in bounds)
        g = 2.0 * M * 256 * K / (ps._BESIDE_GEMM_FLOPS_PER_PROGRAM * (132 - sms))
        s = 8.0 * K * 256 / (sms * s_rate)
        done, side = bounds[0][1] / 256, 0.0
        for n0, n1 in bounds[1:]:
            side += (n1 - n0) / 256
            assert s * side <= g * done + 1e-9, (M, N, K, bounds)
            done += (n1 - n0) / 256


def test_copy_beside_knobs_and_default():
    with pytest.raises(ValueError, match="copy_sms"):
        ps.Config(32, 32, 32, use_tma=False, copy_sms=4)
    with pytest.raises(ValueError, match="copy_sms"):
        ps.Config(32, 32, 32, copy_sms=-1)
    with pytest.raises(ValueError, match="copy_chunks"):
        ps.Config(32, 32, 32, copy_sms=4, copy_chunks=1)
    assert "copy4x6" in ps.Config(32, 32, 32, copy_sms=4, copy_chunks=6).describe()
    # the default hides the copy for fp32 TMA configs on a GPU of 64+ SMs, nowhere else
    f32 = ps.default_config(4096, 4096, 8192, torch.float32, 132)
    assert (f32.copy_sms, f32.copy_chunks) == (ps.COPY_BESIDE_SMS, ps.COPY_BESIDE_CHUNKS)
    assert ps.default_config(4096, 4096, 8192, torch.bfloat16, 132).copy_sms == 0
    assert ps.default_config(4096, 4096, 8192, torch.float32, 32).copy_sms == 0
    assert ps.with_copy_beside(ptr_cfg(), torch.float32, 132).copy_sms == 0
    space = ps.search_space(4096, 4096, 8192, torch.float32, 132)
    assert {c.copy_chunks for c in space if c.copy_sms} == {4, 6}


def test_copy_into_beside_kernel():
    # the few-programs copy (next block's load in flight during each store) on sources that
    # fill no 64x128 block, as row-major, column-major and strided views, 1 to 5 programs
    tl32 = load("tf32_layout")
    for R, C, dtype in ((37, 53, torch.float32), (130, 300, torch.float32), (70, 65, torch.bfloat16)):
        x = torch.randn(R, C).to(dtype)
        wide = torch.empty(R, 2 * C, dtype=dtype)
        wide[:, ::2] = x
        for src in (x, x.t().contiguous().t(), wide[:, ::2]):
            for programs in (1, 2, 5):
                out = common.poison_(tl32.k_major_empty(R, C, 0, dtype, DEVICE))
                assert tl32.copy_into(src, out, programs=programs) is out
                assert torch.equal(out, x)


@pytest.mark.slow
def test_default_copy_beside_config_falls_back_to_pointer_loads(monkeypatch):
    # on a GPU of 64+ SMs the fp32 default carries copy_sms; where the tensors rule TMA out
    # and staging does not pay (C starts 4 bytes into its buffer: staging it would copy
    # 8 MB around a tiny GEMM) it must become a plain pointer-load config that fits, not a
    # refused one (copy_sms needs TMA; FLATTEN's scratch overflows shared memory). 1024x2048 makes the 64 128x256 tiles the default needs for its
    # big tile on 64 SMs.
    monkeypatch.setenv("ADVISOR_NUM_SMS", "64")
    M, N, K = 1024, 2048, 16
    cfg = ps.default_config(M, N, K, torch.float32, 64)
    assert cfg.copy_sms == ps.COPY_BESIDE_SMS and cfg.use_tma
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(M, K, generator=g), torch.randn(K, N, generator=g)
    c = torch.empty(M, N + 4)[:, 1:N + 1]
    assert ps.tma_layout(c) is None
    fallback, _ = ps.tma_or_pointer_loads(cfg, a, b, c)
    assert not fallback.use_tma and fallback.copy_sms == 0 and not fallback.EPILOGUE_SUBTILE
    # and it fits: with FLATTEN the pointer store's fp32 scratch would not (272 KB)
    assert not fallback.FLATTEN and fallback.smem_bytes(torch.float32) <= common.SMEM_PER_BLOCK_SM90
    common.poison_(c)
    assert ps.matmul(a, b, out=c) is c
    assert common.rel_error(c, common.reference(a, b)) <= common.TOLERANCE[torch.float32]
