"""kernels/split_k_gemm.py under the Triton interpreter: every reduction, dtype and layout,
uneven and over-asked splits, determinism, workspace reuse across launches."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from gemm_checks import (
    DEVICE,
    DTYPES,
    LAYOUTS,
    assert_scratch_clean,
    check_search_space,
    check_validation,
    common,
    layout_id,
    run_checked,
)

from advisor.codegen.kernel_lib import load

sk = load("split_k_gemm")
pytestmark = pytest.mark.interpreter


def cfg(reduction, split=3, bm=32, bn=32, bk=32, group_m=2):
    return sk.Config(bm, bn, bk, group_m, num_warps=4, num_stages=2, SPLIT_K=split, reduction=reduction,
                     REDUCE_BLOCK=64)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reduction", sk.REDUCTIONS)
def test_reductions_dtypes(reduction, dtype):
    # K=200 in 7 steps of 32, split 3 ways: chunks of 3, 3 and 1 steps, the last one ragged
    run_checked(sk, 37, 53, 200, dtype, cfg(reduction))


@pytest.mark.parametrize("layout", LAYOUTS[1:], ids=layout_id)
@pytest.mark.parametrize("reduction", sk.REDUCTIONS)
def test_reductions_transposed_views(reduction, layout):
    run_checked(sk, 37, 53, 200, torch.bfloat16, cfg(reduction), layout=layout)


@pytest.mark.parametrize("reduction", sk.REDUCTIONS)
def test_many_splits_small_tiles(reduction):
    # 16x16 tiles, 9 of them, K=100 in 7 steps of 16 asked to split 5 ways -> 4 chunks of 2
    # (the fixup program sums 4 partials with several loads in flight)
    run_checked(sk, 40, 33, 100, torch.float16, cfg(reduction, split=5, bm=16, bn=16, bk=16))


@pytest.mark.parametrize("reduction", sk.REDUCTIONS)
def test_split_larger_than_k_steps(reduction):
    # SPLIT_K=64 over 3 K-steps runs 3 one-step chunks; M < BLOCK_M and N < BLOCK_N
    assert sk.effective_split(40, 16, 64) == (3, 1)
    run_checked(sk, 5, 7, 40, torch.float16, cfg(reduction, split=64, bm=16, bn=16, bk=16))


def test_effective_split():
    assert sk.effective_split(10 * 64, 64, 6) == (5, 2)
    assert sk.effective_split(8192, 64, 4) == (4, 32)
    assert sk.effective_split(1, 64, 8) == (1, 1)
    assert sk.effective_split(131072, 128, 128) == (128, 8)


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 70, 64)], ids=lambda s: "x".join(map(str, s)))
def test_tiny_and_split_one(shape):
    # one K step or SPLIT_K=1: the direct-store path with no reduction
    run_checked(sk, *shape, torch.float32, cfg("atomic", split=4))
    run_checked(sk, *shape, torch.float32, cfg("fixup", split=4))
    run_checked(sk, *shape, torch.float32, cfg("two_phase", split=1))


@pytest.mark.parametrize("reduction", sk.REDUCTIONS)
def test_column_major_output(reduction):
    run_checked(sk, 37, 53, 200, torch.float16, cfg(reduction), out_layout="col")


@pytest.mark.parametrize("reduction", sk.REDUCTIONS)
def test_int64_offsets_path(reduction, monkeypatch):
    monkeypatch.setattr(sk, "needs_int64_offsets", lambda *t: True)
    run_checked(sk, 37, 53, 200, torch.float16, cfg(reduction), layout=(True, True))


@pytest.mark.parametrize("reduction", ["two_phase", "fixup"])
def test_deterministic_reductions_are_bit_identical(reduction):
    config = cfg(reduction, split=4, bm=16, bn=16, bk=16)
    first, a, b = run_checked(sk, 20, 24, 150, torch.float32, config, seed=3)
    second = sk.matmul(a, b, config)
    assert torch.equal(first, second)


@pytest.mark.parametrize("reduction", ["atomic", "fixup"])
def test_repeated_launches_reuse_clean_workspace(reduction):
    # The per-tile counters (and the atomic sums) live in a cached pool and must be handed back
    # zeroed: a second launch on the same and on another shape must still be right.
    config = cfg(reduction, split=3)
    run_checked(sk, 37, 53, 200, torch.float16, config, seed=1)
    run_checked(sk, 37, 53, 200, torch.float16, config, seed=2)
    run_checked(sk, 64, 20, 150, torch.float16, config, seed=4)
    assert_scratch_clean("split_k")


def test_default_config_runs():
    a, b = common.random_inputs(24, 40, 2000, torch.float16, DEVICE, seed=5)
    config = sk.default_config(24, 40, 2000, torch.float16, sk.num_sms())
    assert config.SPLIT_K > 1  # 1 tile, 16 K-steps, 3 SMs: the default must split
    c = sk.matmul(a, b)
    assert common.rel_error(c, common.reference(a, b)) <= common.TOLERANCE[torch.float16]


def test_default_config_suite():
    # the skinny suite on 132 SMs: about one wave of programs, chunks of whole K-steps
    for (M, N, K) in [(16, 4096, 16384), (64, 4096, 14336), (256, 256, 131072), (512, 512, 65536),
                      (128, 8192, 8192), (32, 32, 131072)]:
        c = sk.default_config(M, N, K, torch.bfloat16, 132)
        split, _ = sk.effective_split(K, c.BLOCK_K, c.SPLIT_K)
        programs = -(-M // c.BLOCK_M) * -(-N // c.BLOCK_N) * split
        assert 96 <= programs <= 132, (M, N, K, c, programs)
        assert c.BLOCK_M <= max(16, M)


def test_search_space_configs_run():
    M, N, K = 40, 72, 1500
    space = sk.search_space(M, N, K, torch.float16, 3)
    assert {c.reduction for c in space} == set(sk.REDUCTIONS)
    for config in space:
        run_checked(sk, M, N, K, torch.float16, config)


def test_search_space_shapes():
    check_search_space(sk)
    # Memory-bound shapes get splits for several resident programs per SM (the H200 lesson).
    space = sk.search_space(16, 4096, 16384, torch.bfloat16, 132)
    programs = [-(-16 // c.BLOCK_M) * -(-4096 // c.BLOCK_N) * sk.effective_split(16384, c.BLOCK_K, c.SPLIT_K)[0] for c in space]
    assert max(programs) >= 4 * 132 * 0.75
    assert any(c.reduction == "atomic" for c in space)
    # The default's one-wave, deep-pipeline recipe for the other tiles survives the cap of
    # 12: 128x64 tiles unsplit on 128x8192x8192 (64 of them would not fill 132 SMs with
    # 128x128; 128 do), 64x64 split in two on 64x4096x14336 (measured winners on the H200).
    space = sk.search_space(128, 8192, 8192, torch.bfloat16, 132)
    assert len(space) <= 12
    assert any((c.BLOCK_M, c.BLOCK_N, c.SPLIT_K) == (128, 64, 1) and c.num_stages >= 5 for c in space)
    space = sk.search_space(64, 4096, 14336, torch.bfloat16, 132)
    assert any((c.BLOCK_M, c.BLOCK_N, c.SPLIT_K) == (64, 64, 2) and c.num_stages >= 5 for c in space)


@pytest.mark.slow
def test_tf32_wide_point():
    # fp32 only, where a 256x128 tile fits: the swap transposes it to 128x256 (B^T read out of
    # shared memory once per 256 columns); measured winner on 512x512x65536 (H200)
    space = sk.search_space(512, 512, 65536, torch.float32, 132)
    wide = [c for c in space if (c.BLOCK_M, c.BLOCK_N) == (256, 128)]
    assert len(wide) == 1 and wide[0].SPLIT_K == 16 and wide[0].num_warps == 8
    assert not any((c.BLOCK_M, c.BLOCK_N) == (256, 128) for c in sk.search_space(512, 512, 65536, torch.bfloat16, 132))
    assert not any(c.BLOCK_M == 256 for c in sk.search_space(128, 8192, 8192, torch.float32, 132))
    # and it computes the right thing on a ragged shape, swapped (row-major B) and not
    run_checked(sk, 260, 130, 200, torch.float32, wide[0])
    run_checked(sk, 260, 130, 200, torch.float32, wide[0], layout=(False, True))


@pytest.mark.slow
def test_tf32_deep_k_point():
    # fp32 only, and only for tiles whose 16-bit BLOCK_K is 64: 128x64x64 at 4 stages (192 KB)
    # unsplit on 128x8192x8192, the measured winner there (H200), inside the cap of 12
    space = sk.search_space(128, 8192, 8192, torch.float32, 132)
    assert len(space) <= 12
    deep = [c for c in space if (c.BLOCK_M, c.BLOCK_N, c.BLOCK_K, c.SPLIT_K) == (128, 64, 64, 1)]
    assert len(deep) == 1 and deep[0].num_stages == 4 and deep[0].num_warps == 4
    assert deep[0].smem_bytes(torch.float32) <= 192 * 1024
    assert sk._tf32_deep_k_point(128, 64, 64, 1, torch.bfloat16) is None
    assert sk._tf32_deep_k_point(64, 64, 128, 2, torch.float32) is None
    assert not any(c.BLOCK_K == 64 for c in sk.search_space(128, 8192, 8192, torch.bfloat16, 132)
                   if c.num_stages == 4 and c.BLOCK_N == 64)
    # it computes the right thing on a ragged shape, swapped (row-major B) and not
    run_checked(sk, 130, 70, 300, torch.float32, replace(deep[0], SPLIT_K=3))
    run_checked(sk, 130, 70, 300, torch.float32, replace(deep[0], SPLIT_K=3), layout=(False, True))


def test_validation():
    check_validation(sk, cfg("fixup"))
    with pytest.raises(ValueError, match="SPLIT_K"):
        cfg("fixup", split=0)
    with pytest.raises(ValueError, match="reduction"):
        cfg("tree")
