"""Shared checks for the GEMM schedule tests (tests/test_*_gemm.py).

Each check runs a schedule's host `matmul` under the Triton interpreter (tests/conftest.py
sets TRITON_INTERPRET=1 and a small ADVISOR_NUM_SMS before Triton is imported; with
ADVISOR_TEST_GPU=1 the same checks run on the GPU at the device's SM count) on fresh
random inputs, into an output poisoned with NaN, and compares with the float64 reference under
the per-dtype tolerance of kernels/common.py.
"""

from __future__ import annotations

import os

import torch

from advisor.codegen.kernel_lib import load

common = load("common")
common.fix_interpreter_bf16_dot()

# ADVISOR_TEST_GPU=1 (see conftest.py) runs the same checks on the GPU
DEVICE = "cuda" if os.environ.get("ADVISOR_TEST_GPU") == "1" else "cpu"

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# (transpose_a, transpose_b): row-major, A as a transposed view, B as a transposed view, both
LAYOUTS = ((False, False), (True, False), (False, True), (True, True))


def layout_id(layout) -> str:
    return {(False, False): "nn", (True, False): "tn", (False, True): "nt", (True, True): "tt"}[layout]


def run_checked(mod, M, N, K, dtype, config, *, layout=(False, False), seed=0, out_layout="row", **kwargs):
    """Run mod.matmul(a, b, config, out=poisoned) and assert shape, dtype, identity of the
    returned tensor and the error bound. Returns (out, a, b)."""
    ta, tb = layout
    a, b = common.random_inputs(M, N, K, dtype, DEVICE, transpose_a=ta, transpose_b=tb, seed=seed)
    if out_layout == "row":
        out = torch.empty((M, N), dtype=dtype, device=DEVICE)
    else:  # a column-major output: the kernels must honour C's strides too
        out = torch.empty((N, M), dtype=dtype, device=DEVICE).t()
    common.poison_(out)
    res = mod.matmul(a, b, config, out=out, **kwargs)
    assert res is out
    assert res.shape == (M, N) and res.dtype == dtype
    err = common.rel_error(res, common.reference(a, b))
    tol = common.TOLERANCE[dtype]
    assert err <= tol, f"{mod.__name__} {M}x{N}x{K} {dtype} {layout} {config}: rel err {err:.3e} > {tol:.0e}"
    return res, a, b


def check_validation(mod, config) -> None:
    """Input validation every schedule must share: wrong dims, mismatched inner dims, dtype
    mismatch, unsupported dtype, bad `out`."""
    import pytest

    f16 = torch.float16
    a = torch.randn(8, 16, dtype=f16, device=DEVICE)
    b = torch.randn(16, 8, dtype=f16, device=DEVICE)
    with pytest.raises(ValueError, match="2-D"):
        mod.matmul(a[0], b, config)
    with pytest.raises(ValueError, match="2-D"):
        mod.matmul(a, b.unsqueeze(0), config)
    with pytest.raises(ValueError, match="inner dimensions"):
        mod.matmul(a, torch.randn(15, 8, dtype=f16, device=DEVICE), config)
    with pytest.raises(TypeError, match="share a dtype"):
        mod.matmul(a, b.to(torch.bfloat16), config)
    with pytest.raises(TypeError, match="not supported"):
        mod.matmul(a.to(torch.float64), b.to(torch.float64), config)
    with pytest.raises(TypeError, match="not supported"):
        mod.matmul(a.to(torch.int32), b.to(torch.int32), config)
    with pytest.raises(ValueError, match="empty"):
        mod.matmul(torch.empty(0, 16, dtype=f16, device=DEVICE), b, config)
    with pytest.raises(ValueError, match="shape"):
        mod.matmul(a, b, config, out=torch.empty(8, 9, dtype=f16, device=DEVICE))
    with pytest.raises(TypeError, match="dtype"):
        mod.matmul(a, b, config, out=torch.empty(8, 8, dtype=torch.float32, device=DEVICE))
    with pytest.raises(TypeError, match="torch tensors"):
        mod.matmul(a.tolist(), b, config)


def check_search_space(mod, shapes=None) -> None:
    """Every schedule's search space: non-empty, at most 12 configs, distinct, each within the
    sm_90 shared-memory budget, and the default config valid for the shape."""
    shapes = shapes or [(8192, 8192, 8192), (4096, 4096, 8192), (1664, 1408, 8192), (4224, 4224, 8192),
                        (16, 4096, 16384), (64, 4096, 14336), (256, 256, 131072), (512, 512, 65536),
                        (128, 8192, 8192), (32, 32, 131072), (37, 53, 97), (1, 1, 1)]
    for (M, N, K) in shapes:
        for dtype in DTYPES:
            space = mod.search_space(M, N, K, dtype, 132)
            assert 1 <= len(space) <= 12, (M, N, K, dtype, len(space))
            assert len(set(space)) == len(space), "duplicate configs"
            for cfg in space + [mod.default_config(M, N, K, dtype, 132)]:
                assert cfg.smem_bytes(dtype) <= common.SMEM_PER_BLOCK_SM90, (cfg, dtype)


def assert_scratch_clean(prefix: str) -> None:
    """Every pooled reduction buffer (kernels/common.SCRATCH) whose name starts with `prefix`
    is all zeros: the kernels hand their sums and counters back cleared for the next launch."""
    for (name, *_), buf in common.SCRATCH._buffers.items():
        if name.startswith(prefix):
            assert not buf.any(), f"{name} left dirty"
