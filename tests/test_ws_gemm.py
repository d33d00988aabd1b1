"""kernels/ws_gemm.py under the Triton CPU interpreter (conftest sets TRITON_INTERPRET=1 and
ADVISOR_NUM_SMS=3, so the persistent tile loop really iterates: every shape below has more
tiles than programs).

The interpreter ignores `warp_specialize`, `flatten` and `num_stages`, so these tests check
the math, the operand/descriptor plumbing and validation of every code path; whether WS
engages on sm_90 is checked by compiling for sm_90 in a subprocess (no GPU needed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from advisor.codegen.kernel_lib import load

ws = load("ws_gemm")
common = load("common")
Config = ws.Config

pytestmark = pytest.mark.interpreter
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Small tiles keep the interpreter fast; WS needs block_m >= 128 (two consumer halves).
WS_PTR = Config(128, 32, 16, 4, 4, 2, warp_specialize=True)
WS_PTR_DEV = replace(WS_PTR, host_descriptors=False)
WS_TMA_DEV = Config(128, 32, 16, 4, 4, 2, warp_specialize=True, host_descriptors=False, tma_store=True)
PIPE_TMA2 = Config(32, 32, 16, 2, 4, 2, warp_specialize=False, tma_store=True, epilogue_subtile=2, host_descriptors=True)
PIPE_TMA4_DEV = Config(16, 64, 16, 2, 4, 2, warp_specialize=False, tma_store=True, epilogue_subtile=4,
                       host_descriptors=False)
PIPE_FLAT = Config(32, 16, 16, 3, 8, 3, warp_specialize=False, flatten=True, host_descriptors=True)

LAYOUTS = [(False, False), (True, False), (False, True), (True, True)]


@pytest.fixture(autouse=True, scope="module")
def _bf16_dot():
    common.fix_interpreter_bf16_dot()


def run_checked(M, N, K, dtype, cfg, ta=False, tb=False, seed=0, **kw):
    a, b = common.random_inputs(M, N, K, dtype, DEVICE, transpose_a=ta, transpose_b=tb, seed=seed)
    out = common.poison_(torch.empty((M, N), dtype=dtype, device=DEVICE))
    got = ws.matmul(a, b, cfg, out=out, **kw)
    assert got is out
    err = common.rel_error(out, common.reference(a, b))
    assert err <= common.TOLERANCE[dtype], f"{cfg.label()} {dtype} ta={ta} tb={tb}: rel err {err:.2e}"
    return a, b, out


def test_ws_with_host_descriptors_is_refused():
    # Every such config hung on sm_90 (2026-11-29); the schedule must not offer it.
    with pytest.raises(ValueError, match="hung on sm_90"):
        replace(WS_PTR, host_descriptors=True).validate()
    assert not any(c.warp_specialize and c.host_descriptors for c in ws.search_space(4096, 4096, 4096, torch.bfloat16, 132))


def test_setup_makes_the_persistent_loop_iterate():
    if INTERPRET:
        assert common.num_sms() == 3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cfg", [WS_PTR, WS_PTR_DEV, WS_TMA_DEV], ids=lambda c: c.label())
@pytest.mark.parametrize("ta,tb", LAYOUTS)
def test_ws_configs_match_reference(cfg, dtype, ta, tb):
    # 300x70 with 128x32 tiles: 3 x 3 = 9 tiles over 3 programs; K=88 is 6 k-steps (ragged)
    run_checked(300, 70, 88, dtype, cfg, ta, tb)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("cfg", [PIPE_TMA2, PIPE_TMA4_DEV, PIPE_FLAT], ids=lambda c: c.label())
@pytest.mark.parametrize("ta,tb", LAYOUTS)
def test_pipelined_configs_match_reference(cfg, dtype, ta, tb):
    run_checked(72, 104, 40, dtype, cfg, ta, tb)


@pytest.mark.parametrize("M,N,K", [(1, 1, 1), (37, 45, 29), (5, 130, 3), (129, 17, 33)])
@pytest.mark.parametrize("cfg", [WS_PTR, PIPE_TMA2], ids=lambda c: c.label())
def test_odd_shapes_go_through_aligned_copies(M, N, K, cfg):
    run_checked(M, N, K, torch.float16, cfg, seed=M + N + K)
    run_checked(M, N, K, torch.float16, cfg, ta=True, tb=True, seed=M + N + K)


def test_operands_with_8_byte_aligned_rows_are_staged_by_the_copy_kernel(monkeypatch):
    # K=20, N=36 in fp16: 40- and 72-byte rows, TMA-illegal (not 16-byte multiples) but
    # 8-byte aligned, so persistent_gemm.aligned_copy stages them with its Triton kernel
    pgemm = load("persistent_gemm")
    launched = []
    real = pgemm.launch
    monkeypatch.setattr(pgemm, "launch", lambda kernel, *a, **k: (launched.append(kernel), real(kernel, *a, **k)))
    run_checked(44, 36, 20, torch.float16, PIPE_TMA2, seed=5)
    assert launched.count(pgemm._stage_copy_kernel) == 2


def test_fresh_output_is_contiguous_even_when_n_is_odd():
    a, b = common.random_inputs(40, 45, 24, torch.bfloat16, DEVICE, seed=3)
    c = ws.matmul(a, b, PIPE_TMA2)  # TMA store, N*2 B not a multiple of 16: padded staging
    assert c.shape == (40, 45) and c.dtype == torch.bfloat16 and c.is_contiguous()
    assert common.rel_error(c, common.reference(a, b)) <= common.TOLERANCE[torch.bfloat16]


def test_default_config_runs():
    a, b = common.random_inputs(24, 40, 16, torch.float16, DEVICE, seed=4)
    c = ws.matmul(a, b)
    assert common.rel_error(c, common.reference(a, b)) <= common.TOLERANCE[torch.float16]


@pytest.mark.parametrize("ta,tb", LAYOUTS)
def test_aligned_transposed_views_are_read_in_place(ta, tb):
    a, b = common.random_inputs(48, 40, 56, torch.bfloat16, DEVICE, transpose_a=ta, transpose_b=tb, seed=5)
    st, flipped = ws._as_tma_operand(a, "a", allow_copy=False)
    assert flipped == ta and st.data_ptr() == a.data_ptr()
    st, flipped = ws._as_tma_operand(b, "b", allow_copy=False)
    assert flipped == tb and st.data_ptr() == b.data_ptr()
    # and the whole product works with copies forbidden
    run_checked(48, 40, 56, torch.bfloat16, PIPE_TMA2, ta, tb, seed=5, allow_copy=False)


def test_misaligned_operand_is_rejected_without_copy():
    a, b = common.random_inputs(40, 48, 29, torch.bfloat16, DEVICE, seed=6)  # row stride 58 B
    with pytest.raises(ValueError, match="row stride"):
        ws.matmul(a, b, PIPE_TMA2, allow_copy=False)


def test_general_strided_view_is_copied_or_rejected():
    a_full, b = common.random_inputs(40, 32, 64, torch.float16, DEVICE, seed=7)
    a = a_full[:, ::2]  # (40, 32) with inner stride 2: TMA cannot read it
    b = b[:32]
    with pytest.raises(ValueError, match="not contiguous"):
        ws.matmul(a, b, PIPE_TMA2, allow_copy=False)
    out = common.poison_(torch.empty((40, 32), dtype=torch.float16, device=DEVICE))
    ws.matmul(a, b, PIPE_TMA2, out=out)
    assert common.rel_error(out, common.reference(a, b)) <= common.TOLERANCE[torch.float16]


def test_out_that_tma_cannot_write_is_staged():
    a, b = common.random_inputs(32, 48, 24, torch.float16, DEVICE, seed=8)
    out_t = common.poison_(torch.empty((48, 32), dtype=torch.float16, device=DEVICE)).t()  # column-major
    with pytest.raises(ValueError, match="cannot be written directly"):
        ws.matmul(a, b, PIPE_TMA2, out=out_t, allow_copy=False)
    got = ws.matmul(a, b, PIPE_TMA2, out=out_t)
    assert got is out_t
    assert common.rel_error(out_t, common.reference(a, b)) <= common.TOLERANCE[torch.float16]


def test_bad_inputs_are_rejected():
    a, b = common.random_inputs(16, 16, 16, torch.float16, DEVICE, seed=9)
    with pytest.raises(ValueError, match="inner dimensions"):
        ws.matmul(a, b[:8], PIPE_TMA2)
    with pytest.raises(TypeError):
        ws.matmul(a, b.to(torch.bfloat16), PIPE_TMA2)
    # the output checks every schedule shares (kernels/gemm_call.py, common.prepare_output)
    with pytest.raises(ValueError, match="out has shape"):
        ws.matmul(a, b, PIPE_TMA2, out=torch.empty((16, 8), dtype=torch.float16, device=DEVICE))
    with pytest.raises(TypeError, match="out has dtype"):
        ws.matmul(a, b, PIPE_TMA2, out=torch.empty((16, 16), dtype=torch.float32, device=DEVICE))


@pytest.mark.parametrize("cfg,dtype,match", [
    (replace(WS_PTR, num_warps=8), torch.float16, "num_warps=4"),
    (replace(WS_PTR, block_m=64), torch.float16, "block_m >= 128"),
    (replace(WS_PTR, flatten=True), torch.float16, "flatten"),
    (replace(WS_PTR, num_stages=1), torch.float16, "num_stages >= 2"),
    (replace(WS_PTR, tma_store=True, epilogue_subtile=2), torch.float16, "device-side descriptors"),
    (replace(WS_TMA_DEV, epilogue_subtile=2), torch.float16, "epilogue_subtile=1"),
    (WS_PTR, torch.float32, "tf32"),
    (replace(PIPE_TMA2, epilogue_subtile=3), torch.float16, "epilogue_subtile"),
    (replace(PIPE_TMA2, tma_store=False), torch.float16, "only applies to the TMA store"),
    (replace(PIPE_TMA2, block_n=48), torch.float16, "power of two"),
    (replace(PIPE_TMA2, block_k=512), torch.float16, "16..256"),
    (replace(PIPE_TMA2, block_k=16), torch.float32, None),  # fine: 64 bytes
    (Config(128, 256, 128, 8, 8, 4, warp_specialize=False, tma_store=True), torch.bfloat16, "shared memory"),
])
def test_config_validation(cfg, dtype, match):
    if match is None:
        cfg.validate(dtype)
        return
    with pytest.raises(ValueError, match=match):
        cfg.validate(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("shape", [(8192, 8192, 8192), (4096, 4096, 8192), (1664, 1408, 8192),
                                   (64, 64, 4096), (3, 5000, 7)])
def test_search_space_is_small_valid_and_shape_pruned(dtype, shape, monkeypatch):
    monkeypatch.setenv("ADVISOR_NUM_SMS", "132")
    space = ws.search_space(*shape, dtype)
    assert 1 <= len(space) <= 12
    assert len(set(space)) == len(space)
    for c in space:
        c.validate(dtype)
        assert c.smem_bytes(dtype) <= ws.SMEM_LIMIT_BYTES
    if dtype == torch.float32:
        assert not any(c.warp_specialize for c in space)
    M, N, _ = shape
    if M >= 4096 and dtype != torch.float32:
        first = space[0]
        assert first.warp_specialize and (first.block_m, first.block_n) == (128, 256)
        assert any(not c.warp_specialize and (c.block_m, c.block_n) == (128, 256) for c in space)
    if M <= 64:  # no tile more than twice the problem
        assert all(c.block_m <= 128 for c in space)
    assert ws.default_config(*shape, dtype) == space[0]


def test_needs_hopper_or_newer(monkeypatch):
    monkeypatch.setattr(ws, "_interpreting", lambda: False)
    with pytest.raises(RuntimeError, match="CUDA device"):
        ws.require_tma_device(torch.device("cpu"))
    monkeypatch.setattr(torch.version, "hip", None, raising=False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    with pytest.raises(RuntimeError, match="sm_80.*persistent_gemm"):
        ws.require_tma_device(torch.device("cuda", 0))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    ws.require_tma_device(torch.device("cuda", 0))
    monkeypatch.setattr(torch.version, "hip", "6.2", raising=False)
    with pytest.raises(RuntimeError, match="ROCm"):
        ws.require_tma_device(torch.device("cuda", 0))


def test_launch_metadata_names_schedule_and_counts_flops():
    from triton.tools.tensor_descriptor import TensorDescriptor

    a = torch.empty((64, 32), dtype=torch.float32)
    desc = TensorDescriptor.from_tensor(a, [16, 16])
    meta = ws._launch_metadata((3,), None, {"a_ptr": desc, "M": 64, "N": 48, "K": 32, "WARP_SPECIALIZE": True})
    assert meta["name"] == "ws_gemm [M=64, N=48, K=32]"
    assert meta["flops"] == 2.0 * 64 * 48 * 32
    assert meta["bytes"] == 4 * (64 * 32 + 32 * 48 + 64 * 48)
    meta = ws._launch_metadata((3,), None, {"a_ptr": desc, "M": 1, "N": 1, "K": 1, "WARP_SPECIALIZE": False})
    assert meta["name"].startswith("ws_gemm_nows ")


_SM90_PROBE = r"""
import torch
from advisor.codegen.kernel_lib import load
ws = load("ws_gemm")
for cfg, transposed in ((ws.Config(), False), (ws.Config(), True),
                        (ws.Config(128, 256, 64, 8, 8, 4, warp_specialize=False, epilogue_subtile=2,
                                   tma_store=True), False)):
    k = ws.compile_for_sm90(cfg, torch.bfloat16, b_transposed=transposed)
    engaged = "ttg.warp_specialize" in k.asm["ttgir"]
    print(cfg.warp_specialize, engaged, k.metadata.num_warps, k.metadata.shared)
"""


def test_flagship_compiles_for_sm90_and_ws_engages():
    """Compile (not run) the default config and its non-WS twin for sm_90 with ptxas from
    the Triton wheel, in a process without TRITON_INTERPRET."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _SM90_PROBE], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.strip().splitlines()]
    assert len(rows) == 3
    for requested, engaged, warps, shared in rows:
        assert requested == engaged
        assert int(warps) == (12 if requested == "True" else 8)
        assert int(shared) <= ws.SMEM_LIMIT_BYTES


def test_default_config_follows_the_sm_count(monkeypatch):
    """default_config caches per SM count, and resolves num_sms=None on every call: a cached
    answer must not outlive a change of device (or of ADVISOR_NUM_SMS)."""
    M, N, K = 4096, 4096, 4096
    for sms in ("132", "4"):
        monkeypatch.setenv("ADVISOR_NUM_SMS", sms)
        assert ws.default_config(M, N, K, torch.bfloat16) == ws.search_space(M, N, K, torch.bfloat16, int(sms))[0]
