"""kernels/dp_gemm.py under the Triton interpreter: odd shapes, every dtype and layout."""

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

from advisor.codegen.kernel_lib import load

dp = load("dp_gemm")
pytestmark = pytest.mark.interpreter

SMALL = dp.Config(32, 32, 32, GROUP_M=2, num_warps=4, num_stages=2)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
@pytest.mark.parametrize("shape", [(37, 53, 97), (70, 40, 64)], ids=lambda s: "x".join(map(str, s)))
def test_odd_shapes_dtypes_layouts(shape, layout, dtype):
    # 37x53x97: nothing divides the tile; 70x40x64: K a multiple of BLOCK_K (mask-free loop)
    run_checked(dp, *shape, dtype, SMALL, layout=layout)


@pytest.mark.parametrize("shape", [(1, 1, 1), (5, 40, 33), (33, 3, 16)], ids=lambda s: "x".join(map(str, s)))
def test_degenerate_shapes(shape):
    # a 1x1x1 product, M < BLOCK_M, N < BLOCK_N, K < BLOCK_K
    run_checked(dp, *shape, torch.float16, SMALL)


@pytest.mark.parametrize("group_m", [1, 3])
def test_group_orders_cover_every_tile(group_m):
    # 5x4 tiles of 16x16: group bands of 1 and 3 rows (the last band is short) must map the
    # program ids onto every tile exactly once; a missed tile stays NaN
    cfg = dp.Config(16, 16, 16, GROUP_M=group_m, num_warps=4, num_stages=1)
    run_checked(dp, 70, 50, 16, torch.float16, cfg)


def test_column_major_output():
    run_checked(dp, 37, 53, 97, torch.bfloat16, SMALL, out_layout="col")


def test_int64_offsets_path(monkeypatch):
    # the int64 addressing used for tensors past 2**31 elements, forced on a small problem
    monkeypatch.setattr(dp, "needs_int64_offsets", lambda *t: True)
    run_checked(dp, 37, 53, 97, torch.float16, SMALL, layout=(True, False))


def test_default_config_and_new_output():
    a = torch.randn(40, 24, dtype=torch.float16, device=DEVICE)
    b = torch.randn(24, 30, dtype=torch.float16, device=DEVICE)
    c = dp.matmul(a, b)  # default config, freshly allocated output
    assert c.shape == (40, 30) and c.dtype == torch.float16
    ref = a.double() @ b.double()
    assert torch.linalg.norm(c.double() - ref) / torch.linalg.norm(ref) < 2e-3


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_default_config_for_skinny_and_tiny_k(dtype):
    # a 128-row, 64-column tile for N <= 64; BLOCK_K no deeper than K (the peeled masked step
    # of a 64-deep tile spilled 760 bytes on 8192x8x8, sm_90 compile check)
    cfg = dp.default_config(8192, 8, 8, dtype, 132)
    assert (cfg.BLOCK_M, cfg.BLOCK_N, cfg.BLOCK_K) == (128, 64, 16)
    assert dp.default_config(8192, 8192, 8192, dtype, 132).BLOCK_K >= 32
    run_checked(dp, 200, 8, 8, dtype, dp.default_config(200, 8, 8, dtype, 3))
    run_checked(dp, 8, 136, 5, dtype, dp.default_config(8, 136, 5, dtype, 3))


def test_search_space_configs_run():
    # every config the autotuner may try for a small shape computes the right answer here
    M, N, K = 40, 72, 130
    for cfg in dp.search_space(M, N, K, torch.float16, 3):
        run_checked(dp, M, N, K, torch.float16, cfg)


def test_search_space_shapes():
    check_search_space(dp)
    big = dp.search_space(8192, 8192, 8192, torch.bfloat16, 132)
    assert dp.Config(128, 256, 64, 8, num_warps=8, num_stages=3) in big


def test_validation():
    check_validation(dp, SMALL)
    with pytest.raises(ValueError, match="power of two"):
        dp.Config(24, 32, 32)
    with pytest.raises(ValueError, match="power of two"):
        dp.Config(32, 32, 8)
    with pytest.raises(ValueError, match="GROUP_M"):
        dp.Config(32, 32, 32, GROUP_M=0)
    with pytest.raises(ValueError, match="shared memory"):
        dp.matmul(torch.randn(8, 8, device=DEVICE), torch.randn(8, 8, device=DEVICE),
                  dp.Config(256, 256, 128, num_warps=8, num_stages=4))


def test_stride_hints_are_exact_power_of_two_factors():
    # a hint the strides do not honour would make the GPU issue misaligned vector loads, so
    # each packed value must be the largest power of two (<= 16) dividing the stride
    def unpack(h, n):
        return [(h >> (5 * i)) & 31 for i in range(n)]

    a = torch.empty(16, 8200)
    b = torch.empty(8200, 24)
    assert unpack(common.stride_hints(a, b), 4) == [8, 1, 8, 1]
    assert unpack(common.stride_hints(a.t(), torch.empty(6, 48)), 4) == [1, 8, 16, 1]
    assert unpack(common.stride_hints(torch.empty(3, 1).expand(3, 5)), 2) == [1, 1]  # 0 and 1: none
    assert unpack(common.stride_hints(torch.empty(2, 4096)[:, ::2]), 2) == [16, 2]


@pytest.mark.parametrize("K", [97, 1000], ids=["K97", "K1000"])
def test_ragged_k_slices(K):
    # the ragged last step in 16-deep slices: K % BLOCK_K of 1 and 40 (4 slices, the last partial)
    for cfg in (dp.Config(32, 32, 64, 2, 4, 1), dp.Config(16, 32, 32, 2, 4, 1)):
        run_checked(dp, 37, 45, K, torch.bfloat16, cfg)
