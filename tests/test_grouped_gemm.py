"""kernels/grouped_gemm.py under the Triton CPU interpreter (conftest sets TRITON_INTERPRET=1
and ADVISOR_NUM_SMS=3: three programs walk every group's tiles, so the persistent loop and
the cross-group tile index really iterate).

Every output is NaN-poisoned before the launch and compared with a float64 reference at
the dtype's tolerance; validation errors are checked by message. Whether the aligned path
really becomes 16-byte cp.async (and TMA) on sm_90 is checked by compiling for sm_90 in a
subprocess (no GPU needed).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest
import torch

from advisor.codegen.kernel_lib import load

gg = load("grouped_gemm")
ggt = load("grouped_tools")  # the bench baselines and the sm_90 compile check
common = load("common")
Config = gg.Config

pytestmark = pytest.mark.interpreter
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cpu" if INTERPRET else "cuda"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# one program per "SM" (3 programs) so that even small groups loop; the group-order config
# runs two per SM (6 programs) to cover the programs_per_sm grid
SMALL = Config(32, 32, 16, 4, 2, programs_per_sm=1)
SMALL_GROUP_ORDER = Config(16, 32, 16, 4, 2, lpt_order=False, programs_per_sm=2)
SMALL_TMA = Config(32, 32, 16, 4, 2, use_tma=True, programs_per_sm=1)


@pytest.fixture(autouse=True, scope="module")
def _bf16_dot():
    common.fix_interpreter_bf16_dot()


def odd_sizes(count, lo=1, hi=70, seed=0):
    rng = random.Random(seed)
    return [(rng.randint(lo, hi), rng.randint(lo, hi), rng.randint(lo, hi)) for _ in range(count)]


def poisoned_outs(sizes, dtype):
    return [common.poison_(torch.empty((M, N), dtype=dtype, device=DEVICE)) for M, N, _ in sizes]


def run_and_check(As, Bs, cfg, **kw):
    sizes = [(a.shape[0], b.shape[1], a.shape[1]) for a, b in zip(As, Bs)]
    outs = poisoned_outs(sizes, As[0].dtype)
    got = gg.grouped_matmul(As, Bs, cfg, out=outs, **kw)
    assert len(got) == len(outs) and all(g is o for g, o in zip(got, outs))
    return gg.check_outputs(As, Bs, outs)


def test_setup_makes_the_persistent_loop_iterate():
    if INTERPRET:
        assert common.num_sms() == 3
        As, Bs = gg.random_group([(45, 37, 29)], torch.float16, DEVICE, seed=1)
        assert gg.prepare(As, Bs, SMALL).grid == 3  # 4 tiles over 3 programs
        assert gg.prepare(As, Bs, SMALL_GROUP_ORDER).grid == 6  # 3 x 2 tiles, 6 programs
        assert gg.prepare(As, Bs, Config(64, 64, 16, programs_per_sm=2)).grid == 1  # 1 tile


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_one_group(dtype):
    As, Bs = gg.random_group([(45, 37, 29)], dtype, DEVICE, seed=1)
    run_and_check(As, Bs, SMALL)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("cfg", [SMALL, SMALL_GROUP_ORDER], ids=lambda c: c.label())
def test_many_groups_of_mixed_odd_sizes(dtype, cfg):
    sizes = odd_sizes(8, hi=50, seed=2) + [(1, 1, 1), (1, 50, 1), (50, 1, 33)]
    As, Bs = gg.random_group(sizes, dtype, DEVICE, seed=2)
    run_and_check(As, Bs, cfg)


@pytest.mark.parametrize("ta,tb,layouts", [
    (True, False, (gg.COL_MAJOR, gg.ROW_MAJOR)),
    (False, True, (gg.ROW_MAJOR, gg.COL_MAJOR)),
    (True, True, (gg.COL_MAJOR, gg.COL_MAJOR)),
])
def test_transposed_views_are_read_in_place(ta, tb, layouts):
    sizes = odd_sizes(6, seed=3)
    As, Bs = gg.random_group(sizes, torch.float16, DEVICE, seed=3, transpose_a=ta, transpose_b=tb)
    plan = gg.prepare(As, Bs, SMALL)
    assert (plan.a_layout, plan.b_layout) == layouts
    for c in plan.outs:
        common.poison_(c)
    gg.check_outputs(As, Bs, plan.launch())


def test_fp32_row_major_group_is_swapped(monkeypatch):
    # fp32 with row-major A and B: the kernel computes C_i^T = B_i^T A_i^T (B_i^T through
    # registers, A_i^T K-major, C_i^T stored column-major into the row-major C_i), on odd
    # sizes, with caller outputs of padded rows too; 16-bit, TMA and the switch leave it alone
    monkeypatch.delenv("ADVISOR_TF32_KMAJOR", raising=False)
    sizes = odd_sizes(7, hi=50, seed=7) + [(1, 33, 5), (40, 1, 9)]
    As, Bs = gg.random_group(sizes, torch.float32, DEVICE, seed=7)
    plan = gg.prepare(As, Bs, SMALL)
    assert plan.swapped and plan.a_regs and (plan.a_layout, plan.b_layout) == (gg.COL_MAJOR, gg.COL_MAJOR)
    assert plan.base.data_ptr() == Bs[0].data_ptr()  # B_0^T is the kernel's first A
    for c in plan.outs:
        common.poison_(c)
    gg.check_outputs(As, Bs, plan.launch())
    padded = [common.poison_(torch.empty((M, N + 3), device=DEVICE))[:, :N] for M, N, _ in sizes]
    gg.grouped_matmul(As, Bs, Config(16, 32, 16, 4, 2, programs_per_sm=1), out=padded)
    gg.check_outputs(As, Bs, padded)
    assert not gg.prepare(*gg.random_group(sizes, torch.bfloat16, DEVICE, seed=7), SMALL).swapped
    tA, tB = gg.random_group(sizes, torch.float32, DEVICE, seed=7, transpose_a=True)
    plan = gg.prepare(tA, tB, SMALL)  # A strided in K: through registers in place, no swap
    assert not plan.swapped and plan.a_regs
    for c in plan.outs:
        common.poison_(c)
    gg.check_outputs(tA, tB, plan.launch())
    monkeypatch.setenv("ADVISOR_TF32_KMAJOR", "0")
    plan = gg.prepare(As, Bs, SMALL)
    assert not plan.swapped and not plan.a_regs


def test_mixed_and_strided_layouts_take_the_general_path():
    sizes = odd_sizes(5, lo=2, seed=4)
    As, Bs = gg.random_group(sizes, torch.bfloat16, DEVICE, seed=4)
    As[1] = As[1].t().contiguous().t()  # one transposed A among row-major ones
    wide = torch.randn((sizes[2][2], 2 * sizes[2][1]), dtype=torch.bfloat16, device=DEVICE)
    Bs[2] = wide[:, ::2]  # inner stride 2
    plan = gg.prepare(As, Bs, SMALL)
    assert (plan.a_layout, plan.b_layout) == (gg.STRIDED, gg.STRIDED) and plan.align == 1
    for c in plan.outs:
        common.poison_(c)
    gg.check_outputs(As, Bs, plan.launch())


@pytest.mark.parametrize("dtype,expected", [(torch.float16, 8), (torch.float32, 4)])
def test_aligned_group_gets_the_16_byte_promise(dtype, expected):
    sizes = [(8 * m, 8 * n, 8 * k) for m, n, k in [(3, 5, 2), (1, 1, 1), (4, 2, 7), (6, 3, 3)]]
    As, Bs = gg.random_group(sizes, dtype, DEVICE, seed=5)
    plan = gg.prepare(As, Bs, SMALL)
    assert plan.align == expected
    for c in plan.outs:
        common.poison_(c)
    gg.check_outputs(As, Bs, plan.launch())
    # one even-but-not-aligned K lowers the promise to what still holds
    sizes[2] = (32, 16, 6)
    As, Bs = gg.random_group(sizes, dtype, DEVICE, seed=5)
    assert gg.prepare(As, Bs, SMALL).align == 2


def test_ragged_m_keeps_the_promise():
    # M is no part of a row-major operand's vectors: an MoE-like group (tokens per expert
    # odd, K and N model widths) keeps 16-byte loads and, with N aligned, 16-byte stores
    sizes = [(37, 48, 64), (1, 48, 64), (113, 48, 64), (64, 48, 64)]
    As, Bs = gg.random_group(sizes, torch.bfloat16, DEVICE, seed=21)
    plan = gg.prepare(As, Bs, SMALL)
    assert (plan.align, plan.align_c) == (8, 8)
    for c in plan.outs:
        common.poison_(c)
    gg.check_outputs(As, Bs, plan.launch())
    # an odd N costs the stores and the B loads their vectors; A's K still promises 8
    As, Bs = gg.random_group([(37, 45, 64), (16, 48, 64)], torch.bfloat16, DEVICE, seed=22)
    plan = gg.prepare(As, Bs, SMALL)
    assert (plan.align, plan.align_c) == (1, 1)
    gg.check_outputs(As, Bs, plan.launch())


STAGED = Config(32, 32, 16, 4, 2, programs_per_sm=1, stage=True)
STAGED_TMA = Config(32, 32, 16, 4, 2, use_tma=True, programs_per_sm=1, stage=True)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("cfg", [STAGED, STAGED_TMA], ids=["pointer", "tma"])
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True)])
def test_staged_group_of_odd_sizes(dtype, cfg, ta, tb):
    # odd K and N everywhere (sizes as a trace reports them), row-major or transposed views:
    # the copies are padded, aligned and row-major, so the GEMM gets the full promise
    sizes = odd_sizes(6, lo=1, hi=70, seed=23) + [(5, 131, 77)]
    As, Bs = gg.random_group(sizes, dtype, DEVICE, seed=23, transpose_a=ta, transpose_b=tb)
    plan = gg.prepare(As, Bs, cfg)
    assert plan.staging is not None and plan.align == 8 and (plan.a_layout, plan.b_layout) == (gg.ROW_MAJOR,) * 2
    assert all(a.shape[1] % 8 == 0 and b.shape[1] % 8 == 0 for a, b in zip(plan.staging.As, plan.staging.Bs))
    for c in plan.outs:
        common.poison_(c)
    gg.check_outputs(As, Bs, plan.launch())


def test_staged_plan_promises_the_stores_only_what_c_holds():
    # caller outputs with 16-byte rows but an odd N: the staged operands are padded to N = 48,
    # C is not, so the store promise must stay at C's own N (the interpreter ignores hints:
    # the promise itself is what is checked)
    sizes = [(20, 45, 30), (9, 45, 17)]
    As, Bs = gg.random_group(sizes, torch.bfloat16, DEVICE, seed=26)
    rows = [torch.empty((M, 48), dtype=torch.bfloat16, device=DEVICE) for M, _, _ in sizes]
    outs = [common.poison_(r[:, :N]) for r, (_, N, _) in zip(rows, sizes)]
    plan = gg.prepare(As, Bs, STAGED, out=outs)
    assert plan.align == 8 and plan.align_c == 1
    gg.check_outputs(As, Bs, plan.launch())
    # with N itself a multiple of 8 the same outputs keep 16-byte stores
    sizes = [(20, 48, 30), (9, 40, 17)]
    As, Bs = gg.random_group(sizes, torch.bfloat16, DEVICE, seed=27)
    outs = [r[:, :N] for r, (_, N, _) in zip(rows, sizes)]
    assert gg.prepare(As, Bs, STAGED, out=outs).align_c == 8


def test_staged_plan_copies_the_current_inputs_every_launch():
    sizes = odd_sizes(4, seed=24)
    As, Bs = gg.random_group(sizes, torch.bfloat16, DEVICE, seed=24)
    plan = gg.prepare(As, Bs, STAGED)
    gg.check_outputs(As, Bs, plan.launch())
    new_As, new_Bs = gg.random_group(sizes, torch.bfloat16, DEVICE, seed=25)
    for x, y in zip(As + Bs, new_As + new_Bs):
        x.copy_(y)
    for c in plan.outs:
        common.poison_(c)
    gg.check_outputs(As, Bs, plan.launch())
    # the padding stays zero: K beyond each A's own columns adds nothing
    for a, st in zip(As, plan.staging.As):
        assert torch.equal(st[:, a.shape[1]:], torch.zeros_like(st[:, a.shape[1]:]))


def test_stage_is_for_16_bit_groups():
    with pytest.raises(ValueError, match="16-bit"):
        STAGED.validate(torch.float32)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_tma_path_on_an_aligned_group(dtype):
    sizes = [(40, 48, 24), (8, 16, 64), (72, 32, 8), (16, 80, 40)]
    As, Bs = gg.random_group(sizes, dtype, DEVICE, seed=6)
    run_and_check(As, Bs, SMALL_TMA)


def test_tma_is_refused_when_the_group_breaks_its_rules():
    As, Bs = gg.random_group([(40, 48, 24), (8, 16, 63)], torch.float16, DEVICE, seed=7)  # K=63: 126 B rows
    with pytest.raises(ValueError, match="use_tma"):
        gg.prepare(As, Bs, SMALL_TMA)
    As, Bs = gg.random_group([(40, 48, 24)], torch.float16, DEVICE, seed=7, transpose_a=True)
    with pytest.raises(ValueError, match="use_tma"):
        gg.prepare(As, Bs, SMALL_TMA)
    # a one-row A cut from a wider tensor: its 18-byte row stride still goes into the descriptor
    As, Bs = gg.random_group([(1, 16, 8), (16, 16, 8)], torch.bfloat16, DEVICE, seed=7)
    As[0] = torch.randn(2, 9, device=DEVICE).to(torch.bfloat16)[:1, :8]
    assert gg.prepare(As, Bs, SMALL).align == 8  # the pointer path never strides over its one row
    with pytest.raises(ValueError, match="use_tma"):
        gg.prepare(As, Bs, SMALL_TMA)
    gg.check_outputs(As, Bs, gg.prepare(As, Bs, replace(SMALL_TMA, stage=True)).launch())  # staged: fine


def test_plan_is_reusable_and_sees_new_input_contents():
    sizes = odd_sizes(5, seed=8)
    As, Bs = gg.random_group(sizes, torch.float16, DEVICE, seed=8)
    plan = gg.prepare(As, Bs, SMALL)
    outs = gg.grouped_matmul(As, Bs, plan=plan)
    gg.check_outputs(As, Bs, outs)
    new_As, _ = gg.random_group(sizes, torch.float16, DEVICE, seed=9)
    for a, n in zip(As, new_As):
        a.copy_(n)
    for c in outs:
        common.poison_(c)
    again = gg.grouped_matmul(As, Bs, plan=plan)
    assert all(x is y for x, y in zip(again, outs))
    gg.check_outputs(As, Bs, again)


def test_plan_guards():
    sizes = odd_sizes(3, seed=10)
    As, Bs = gg.random_group(sizes, torch.float16, DEVICE, seed=10)
    plan = gg.prepare(As, Bs, SMALL)
    other_As, _ = gg.random_group(sizes, torch.float16, DEVICE, seed=11)
    with pytest.raises(ValueError, match="not the tensors"):
        gg.grouped_matmul(other_As, Bs, plan=plan)
    with pytest.raises(ValueError, match="not the tensors"):
        gg.grouped_matmul(As[:2], Bs[:2], plan=plan)
    with pytest.raises(ValueError, match="differs from the plan"):
        gg.grouped_matmul(As, Bs, SMALL_GROUP_ORDER, plan=plan)
    with pytest.raises(ValueError, match="owns its outputs"):
        gg.grouped_matmul(As, Bs, plan=plan, out=plan.outs)
    # a copy of the lists holding the same tensors is fine
    gg.check_outputs(As, Bs, gg.grouped_matmul(list(As), list(Bs), SMALL, plan=plan))


def test_caller_outputs_with_padded_rows():
    sizes = odd_sizes(4, seed=16)
    As, Bs = gg.random_group(sizes, torch.float16, DEVICE, seed=16)
    wide = [common.poison_(torch.empty((M, N + 5), dtype=torch.float16, device=DEVICE)) for M, N, _ in sizes]
    outs = [w[:, :N] for w, (_, N, _) in zip(wide, sizes)]
    gg.grouped_matmul(As, Bs, SMALL, out=outs)
    gg.check_outputs(As, Bs, outs)
    for w, (_, N, _) in zip(wide, sizes):  # the padding columns stay untouched
        assert torch.isnan(w[:, N:]).all()


def test_default_outputs_are_disjoint_contiguous_views():
    sizes = odd_sizes(6, seed=12)
    As, Bs = gg.random_group(sizes, torch.float32, DEVICE, seed=12)
    plan = gg.prepare(As, Bs, SMALL)
    spans = []
    start = plan.outs[0].data_ptr()
    for c, (M, N, _) in zip(plan.outs, sizes):
        assert c.shape == (M, N) and c.is_contiguous() and (c.data_ptr() - start) % 128 == 0
        spans.append((c.data_ptr(), c.data_ptr() + M * N * 4))
    spans.sort()
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))
    for c in plan.outs:
        common.poison_(c)
    gg.check_outputs(As, Bs, plan.launch())


def test_tile_schedule_covers_every_tile_once_longest_k_first():
    sizes = [(100, 40, 16), (33, 65, 300), (1, 1, 77), (64, 64, 300)]
    table = gg.tile_schedule(sizes, 32, 32, lpt=True)
    expected = {(g, i, j) for g, (M, N, _) in enumerate(sizes)
                for i in range(-(-M // 32)) for j in range(-(-N // 32))}
    got = [tuple(int(x) for x in row[:3]) for row in table]
    assert len(got) == len(expected) and set(got) == expected
    ks = [sizes[g][2] for g, _, _ in got]
    assert ks == sorted(ks, reverse=True)
    assert [g for g, _, _ in got[:3]] == [1, 1, 1]  # stable: group 1 (K=300) before group 3
    plain = gg.tile_schedule(sizes, 32, 32, lpt=False)
    assert [int(g) for g in plain[:, 0]] == sorted(int(g) for g in plain[:, 0])
    assert table.dtype == np.int32 and table.shape[1] == gg.TILE_COLS


def test_bad_groups_are_rejected():
    As, Bs = gg.random_group([(8, 8, 8), (8, 8, 8)], torch.float16, DEVICE, seed=13)
    with pytest.raises(ValueError, match="2 A matrices but 1 B"):
        gg.prepare(As, Bs[:1])
    with pytest.raises(ValueError, match="empty group"):
        gg.prepare([], [])
    with pytest.raises(ValueError, match="group 1: inner dimensions"):
        gg.prepare(As, [Bs[0], Bs[1][:4]])
    with pytest.raises(ValueError, match="group 1: a and b must be 2-D"):
        gg.prepare(As, [Bs[0], Bs[1][None]])
    with pytest.raises(TypeError, match="group 1: a and b must share a dtype"):
        gg.prepare(As, [Bs[0], Bs[1].to(torch.bfloat16)])
    with pytest.raises(TypeError, match="not supported"):
        gg.prepare([a.to(torch.int32) for a in As], [b.to(torch.int32) for b in Bs])
    with pytest.raises(TypeError, match="group 0"):
        gg.prepare([None], [Bs[0]])
    with pytest.raises(ValueError, match="group 1: empty problem"):
        gg.prepare(As, [Bs[0], torch.empty((8, 0), dtype=torch.float16, device=DEVICE)])
    with pytest.raises(ValueError, match=r"out\[1\] has shape"):
        gg.prepare(As, Bs, out=[torch.empty((8, 8), dtype=torch.float16, device=DEVICE),
                                torch.empty((8, 9), dtype=torch.float16, device=DEVICE)])
    with pytest.raises(ValueError, match=r"out\[0\] needs unit column stride"):
        gg.prepare(As, Bs, out=[torch.empty((8, 8), dtype=torch.float16, device=DEVICE).t(),
                                torch.empty((8, 8), dtype=torch.float16, device=DEVICE)])
    with pytest.raises(ValueError, match="2 groups"):
        gg.prepare(As, Bs, out=[torch.empty((8, 8), dtype=torch.float16, device=DEVICE)])


@pytest.mark.parametrize("cfg,dtype,match", [
    (Config(48, 32, 16), torch.float16, "power of two"),
    (Config(32, 32, 8), torch.float16, "power of two"),
    (Config(32, 32, 16, num_warps=3), torch.float16, "num_warps"),
    (Config(32, 32, 16, num_stages=0), torch.float16, "num_stages"),
    (Config(256, 256, 128, 8, 4), torch.float16, "shared memory"),
    (Config(128, 128, 64, 4, 3, programs_per_sm=3), torch.float16, "programs per SM"),
    (Config(32, 32, 16, programs_per_sm=0), torch.float16, "programs_per_sm"),
])
def test_config_validation(cfg, dtype, match):
    with pytest.raises(ValueError, match=match):
        cfg.validate(dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_search_space(dtype, monkeypatch):
    monkeypatch.setenv("ADVISOR_NUM_SMS", "132")
    rng = random.Random(0)
    mixed = [(rng.randint(128, 512), rng.randint(128, 512), rng.randint(128, 512)) for _ in range(64)]
    aligned = [(rng.choice(range(128, 513, 8)),) * 3 for _ in range(64)]
    for sizes in (mixed, aligned, [(16, 24, 4000)]):
        space = gg.search_space(sizes, dtype)
        assert 1 <= len(space) <= 12 and len(set(space)) == len(space)
        for c in space:
            c.validate(dtype)
        if sizes is mixed:
            assert not any(c.use_tma and not c.stage for c in space)  # odd sizes: TMA only on staged copies
            first = space[0]
            tiles = sum(-(-M // first.block_m) * -(-N // first.block_n) for M, N, _ in sizes)
            assert tiles >= first.programs_per_sm * 132 and not first.use_tma
            # 16-bit: staged first (2-byte loads otherwise), the unstaged best guess kept to compare
            assert first.stage == (dtype != torch.float32)
            assert any(not c.stage for c in space)
            assert any(c.stage and c.use_tma for c in space) == (dtype != torch.float32)
        if sizes is aligned:
            assert any(c.use_tma for c in space) and not any(c.stage for c in space)
        if sizes == [(16, 24, 4000)]:
            assert all(c.block_m <= 64 and c.block_n <= 64 for c in space)
        assert gg.default_config(sizes, dtype, 132) == space[0]


def test_launch_metadata_describes_the_whole_group():
    sizes = [(8, 16, 24), (5, 7, 9)]
    As, Bs = gg.random_group(sizes, torch.float16, DEVICE, seed=14)
    plan = gg.prepare(As, Bs, SMALL)
    meta = gg._launch_metadata((3,), None, {"groups_ptr": plan.groups_dev, "num_tiles": plan.num_tiles})
    assert meta["name"] == f"grouped_gemm [G=2, tiles={plan.num_tiles}]"
    assert meta["flops"] == 2.0 * (8 * 16 * 24 + 5 * 7 * 9)
    assert meta["bytes"] == 2.0 * (8 * 24 + 24 * 16 + 8 * 16 + 5 * 9 + 9 * 7 + 5 * 7)


def test_baseline_helpers():
    sizes = odd_sizes(3, seed=15)
    As, Bs = gg.random_group(sizes, torch.float32, DEVICE, seed=15)
    outs = poisoned_outs(sizes, torch.float32)
    gg.check_outputs(As, Bs, ggt.torch_loop(As, Bs, outs)())
    if not torch.cuda.is_available():
        assert ggt.torch_grouped_mm(As, Bs) is None  # CPU tensors: not available


_SM90_PROBE = r"""
import torch
from advisor.codegen.kernel_lib import load
gg = load("grouped_gemm")
ggt = load("grouped_tools")
for cfg, align in ((gg.Config(), 8), (gg.Config(), 1), (gg.Config(128, 128, 64, 4, 3, use_tma=True), 8)):
    k = ggt.compile_for_sm90(cfg, torch.bfloat16, align=align)
    ptx = k.asm["ptx"]
    print(cfg.use_tma, align, k.metadata.shared, "cp.async.cg.shared.global" in ptx, "cp.async.bulk.tensor" in ptx)
"""


def test_compiles_for_sm90_with_vector_loads_when_aligned():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    proc = subprocess.run([sys.executable, "-c", _SM90_PROBE], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.strip().splitlines()]
    assert [r[0] for r in rows] == ["False", "False", "True"]
    (_, _, sh_al, cp_al, _), (_, _, _, cp_un, _), (_, _, sh_tma, _, tma) = rows
    assert cp_al == "True" and cp_un == "False" and tma == "True"
    assert int(sh_al) <= gg.SMEM_LIMIT_BYTES and int(sh_tma) <= gg.SMEM_LIMIT_BYTES
