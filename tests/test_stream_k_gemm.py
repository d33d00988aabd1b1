"""kernels/stream_k_gemm.py under the Triton interpreter (ADVISOR_NUM_SMS=3 or 5): every policy,
both fixups, tiles split over 2 and 3 programs, programs spanning whole tiles, determinism,
workspace reuse, and the schedule arithmetic on the H200's 132 SMs."""

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

sk = load("stream_k_gemm")
pytestmark = pytest.mark.interpreter


def cfg(policy, deterministic=True, bm=16, bn=16, bk=16):
    return sk.Config(bm, bn, bk, 2, 4, 1, policy=policy, deterministic=deterministic)


# 70x50 in 16x16 tiles = 5 x 4 = 20 tiles, K=80 = 5 iterations a tile; on 3 SMs 20 % 3 = 2.
SHAPE = (70, 50, 80)


@pytest.mark.parametrize("deterministic", [True, False], ids=["fixup", "atomic"])
@pytest.mark.parametrize("policy", sk.POLICIES)
def test_policies(policy, deterministic):
    run_checked(sk, *SHAPE, torch.float16, cfg(policy, deterministic))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_dtypes_and_layouts(layout, dtype):
    # hybrid1 with ragged M, N and K (K=75: the last iteration is masked), 32x32 tiles: 3x2=6
    # tiles, 6 % 3 == 0 would be pure dp, so 5 SMs: 1 Stream-K tile over 3 programs
    config = sk.Config(32, 32, 32, 2, 4, 1, policy="hybrid1")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADVISOR_NUM_SMS", "5")
        plan = sk.plan_schedule(70, 50, 75, config, 5)
        assert (plan.sk_tiles, plan.sk_programs) == (1, 3)
        run_checked(sk, 70, 50, 75, dtype, config, layout=layout)


def test_plan_small():
    # the plan the policy tests above run on 3 SMs
    plans = {p: sk.plan_schedule(*SHAPE, cfg(p), 3) for p in sk.POLICIES}
    assert [plans[p].sk_tiles for p in sk.POLICIES] == [0, 20, 2, 5, 8, 11]
    h1 = plans["hybrid1"]
    assert (h1.sk_programs, h1.sk_iters_per_program, h1.sk_extra, h1.grid) == (3, 3, 1, 3)  # persistent
    assert [h1.sk_range(p) for p in range(3)] == [(0, 4), (4, 7), (7, 10)]
    assert [h1.contributors(t) for t in range(3)] == [2, 2, 1]  # tile 2 is data-parallel
    s = plans["sk"]  # 100 iterations over 3 programs: 34, 33, 33 -> whole tiles inside ranges
    assert [s.sk_range(p) for p in range(3)] == [(0, 34), (34, 67), (67, 100)]
    assert s.contributors(0) == 1 and s.contributors(6) == 2


def test_tile_split_over_three_programs():
    # 7 tiles on 3 SMs: hybrid1 puts 1 tile (5 iterations) over 3 programs (2, 2, 1)
    config = cfg("hybrid1")
    plan = sk.plan_schedule(112, 16, 80, config, 3)
    assert plan.sk_tiles == 1 and plan.contributors(0) == 3
    for deterministic in (True, False):
        run_checked(sk, 112, 16, 80, torch.bfloat16, cfg("hybrid1", deterministic))


def test_fewer_iterations_than_sms():
    # one tile, 2 iterations, 3 SMs: 2 Stream-K programs of one iteration each
    config = cfg("sk")
    assert sk.plan_schedule(10, 10, 20, config, 3).sk_programs == 2
    run_checked(sk, 10, 10, 20, torch.float32, config)
    run_checked(sk, 1, 1, 1, torch.float32, config)


def test_column_major_output():
    run_checked(sk, *SHAPE, torch.float16, cfg("hybrid2"), out_layout="col")


@pytest.mark.parametrize("deterministic", [True, False], ids=["fixup", "atomic"])
def test_int64_offsets_path(deterministic, monkeypatch):
    monkeypatch.setattr(sk, "needs_int64_offsets", lambda *t: True)
    run_checked(sk, *SHAPE, torch.float16, cfg("hybrid1", deterministic), layout=(True, True))


def test_fixup_in_row_blocks():
    # 32x64 tiles with 16 fixup rows when the row budget is tiny: the last arriver sums and
    # stores the split tile in two row blocks
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sk, "fixup_rows", lambda bm, bn: 16)
        for deterministic in (True, False):
            run_checked(sk, 70, 130, 64, torch.float16, sk.Config(32, 64, 16, 2, 4, 1, "sk", deterministic))


def test_deterministic_is_bit_identical():
    config = cfg("hybrid2", True)
    first, a, b = run_checked(sk, *SHAPE, torch.float32, config, seed=7)
    second = sk.matmul(a, b, config)
    assert torch.equal(first, second)


@pytest.mark.slow
def test_repeated_launches_reuse_clean_workspace():
    # counters and the atomic sums come back zeroed, so the next launch (same or other shape)
    # starts clean
    for deterministic in (True, False):
        config = cfg("hybrid1", deterministic)
        run_checked(sk, *SHAPE, torch.float16, config, seed=1)
        run_checked(sk, *SHAPE, torch.float16, config, seed=2)
        run_checked(sk, 40, 60, 48, torch.float16, config, seed=3)
    assert_scratch_clean("stream_k")


def test_default_config_runs():
    a, b = common.random_inputs(*SHAPE, torch.float16, DEVICE, seed=5)
    c = sk.matmul(a, b)
    assert common.rel_error(c, common.reference(a, b)) <= common.TOLERANCE[torch.float16]


@pytest.mark.parametrize("M,N", [(600, 16), (16, 704)], ids=["tall", "wide"])
def test_default_config_past_a_wave_of_a_narrow_problem(M, N):
    # more than a wave of 128x128 tiles but one side at most 64: skinny_points has no config
    # there, and default_config raised StopIteration (100000x16x16 on the H200); the tile
    # now narrows to the short side
    sms = sk.num_sms(torch.device(DEVICE))
    assert sk.skinny_points(M, N, 32, torch.bfloat16, sms) == []
    config = sk.default_config(M, N, 32, torch.bfloat16, sms)
    assert min(config.BLOCK_M, config.BLOCK_N) == 16 and max(config.BLOCK_M, config.BLOCK_N) == 128
    assert sk.default_config(100000, 16, 16, torch.bfloat16, 132).BLOCK_N == 16
    run_checked(sk, M, N, 32, torch.bfloat16, None)


def test_policy_rules_on_132_sms():
    P = 132
    # the tail-heavy suite with 128x128 tiles
    assert sk.default_policy(143, P) == "sk"  # 1664x1408: hybrid2 would already cover all 143
    assert sk.default_policy(289, P) == "hybrid2"  # 2176^2: 25-tile tail < half a wave
    assert sk.default_policy(324, P) == "hybrid2"  # 2304^2: 60-tile tail
    assert sk.default_policy(1089, P) == "hybrid2"  # 4224^2: 33-tile tail
    assert sk.default_policy(132 + 70, P) == "hybrid1"  # a tail over half a wave
    assert sk.default_policy(132, P) == "dp"  # 1536x1408: full waves
    assert sk.default_policy(4096, P) == "hybrid2"  # 8192^2
    assert sk.plausible_policies(132, P) == ["dp"]
    assert sk.plausible_policies(78, P) == ["sk"]
    assert sk.plausible_policies(1089, P) == ["hybrid1", "hybrid2", "hybrid3", "hybrid4", "sk"]
    plan = sk.plan_schedule(1664, 1408, 8192, sk.Config(policy="hybrid1"), P)
    assert (plan.tiles, plan.sk_tiles, plan.dp_tiles, plan.sk_programs) == (143, 11, 132, 132)
    assert plan.grid == 132


@pytest.mark.slow
def test_search_space_configs_run():
    M, N, K = 500, 200, 64  # 128x128: 8 tiles, 128x256: 4 tiles; neither a multiple of 3 SMs
    space = sk.search_space(M, N, K, torch.float16, 3)
    assert {c.policy for c in space} >= {"hybrid1", "sk"}
    for config in space:
        run_checked(sk, M, N, K, torch.float16, config)


def test_search_space_shapes():
    check_search_space(sk)
    for (M, N, K) in [(1664, 1408, 8192), (2176, 2176, 8192), (2304, 2304, 4096), (3072, 3072, 4096),
                      (4224, 4224, 8192)]:
        space = sk.search_space(M, N, K, torch.bfloat16, 132)
        assert len({c.policy for c in space}) >= 2
        assert any(not c.deterministic for c in space)
        # every TMA point survives the cap (the 5-stage 128x128 one was added 2026-11-29)
        tma = [(c.BLOCK_M, c.BLOCK_N, c.num_stages) for c in space if c.use_tma]
        assert (128, 128, 5) in tma and (128, 256, 3) in tma
        # fp32 adds the swap points (pointer loads, 256x128, atomic): they swap a row-major B
        # instead of copying it (tf32_swap_points); 16-bit inputs and skinny shapes do not
        swaps = [c for c in sk.search_space(M, N, K, torch.float32, 132) if (c.BLOCK_M, c.BLOCK_N) == (256, 128)]
        assert [(c.use_tma, c.aligned, c.deterministic, c.num_stages) for c in swaps] == [
            (False, True, False, 3), (False, True, False, 4)]
        assert not any((c.BLOCK_M, c.BLOCK_N) == (256, 128) for c in space)
    assert sk.tf32_swap_points(512, 512, 65536, torch.float32, 132) == []


def test_validation():
    check_validation(sk, cfg("hybrid1"))
    with pytest.raises(ValueError, match="policy"):
        sk.Config(policy="hybrid5")
    with pytest.raises(TypeError, match="deterministic"):
        sk.Config(deterministic="yes")


# ---- aligned layout (equal K-chunks a tile) and the TMA path --------------------------------


def acfg(policy="hybrid1", deterministic=True, use_tma=False, subtile=False, flatten=False, bn=16):
    return sk.Config(16, bn, 16, 2, 4, 1, policy, deterministic, aligned=True, use_tma=use_tma,
                     EPILOGUE_SUBTILE=subtile, FLATTEN=flatten)


# 72x48 in 16x16 tiles = 5 x 3 = 15 tiles, K=72: 5 iterations (the last half zero/masked);
# on 7 SMs hybrid1 leaves 15 % 7 = 1 tile, cut into min(5, 7 // 1) = 5 chunks
TMA_SHAPE = (72, 48, 72)


def test_aligned_plan_arithmetic():
    plan = sk.plan_schedule(*TMA_SHAPE, acfg(), 7)
    assert (plan.sk_tiles, plan.chunks, plan.sk_programs, plan.grid) == (1, 5, 5, 7)
    assert plan.contributors(0) == 5 and plan.contributors(1) == 1 and plan.partial_slots == 5
    # the tail suite on 132 SMs, 128x256 tiles: the K-chunks a tail tile is cut into
    big = sk.Config(128, 256, 64, 8, 8, 3, "hybrid1", aligned=True)
    for (M, N, K), (sk_tiles, chunks, programs) in {
        (4224, 4224, 8192): (33, 4, 132),  # 561 tiles: 4 waves + 33
        (2176, 2176, 8192): (21, 6, 126),  # 153 tiles: 1 wave + 21
        (2304, 2304, 4096): (30, 4, 120),  # 162 tiles: 1 wave + 30
        (3072, 3072, 4096): (24, 5, 120),  # 288 tiles: 2 waves + 24
    }.items():
        plan = sk.plan_schedule(M, N, K, big, 132)
        assert (plan.sk_tiles, plan.chunks, plan.sk_programs, plan.grid) == (sk_tiles, chunks, programs, 132)
    # more tiles than half a wave: the chunk count whose rounds of units end soonest
    # 1664x1408 in 128x256 tiles: 78 tiles x 5 chunks = 390 units, 3 rounds, 0.6 of a tile each
    plan = sk.plan_schedule(1664, 1408, 8192, sk.Config(128, 256, 64, 8, 8, 3, "sk", aligned=True), 132)
    assert (plan.sk_tiles, plan.chunks, plan.sk_programs, plan.grid, plan.partial_slots) == (78, 5, 132, 132, 390)
    assert plan.fixup_keys == 78  # a counter a tile, whatever the program count
    # hybrid2 on 4224^2: 165 tiles x 4 chunks = 660 units = 5 rounds (1.25 tiles, the ideal)
    plan = sk.plan_schedule(4224, 4224, 8192, sk.Config(128, 256, 64, 8, 8, 3, "hybrid2", aligned=True), 132)
    assert (plan.sk_tiles, plan.chunks) == (165, 4) and plan.split_tiles
    assert [sk.aligned_chunks(t, 128, 132) for t in (11, 66, 67, 131, 153)] == [12, 2, 7, 1, 6]
    # one chunk a tile: nothing split, no fixup state
    plan = sk.plan_schedule(128 * 263, 128, 8192, sk.Config(policy="hybrid1", aligned=True), 132)
    assert (plan.sk_tiles, plan.chunks, plan.split_tiles) == (131, 1, False)
    # more chunks than iterations is capped: 1 tile of 2 iterations on 7 SMs
    assert sk.plan_schedule(16, 16, 32, acfg("sk"), 7).chunks == 2
    # the multi-round plans the policy tests below run: 8 and 15 tiles of 5 iterations on 7 SMs
    assert sk.plan_schedule(*TMA_SHAPE, acfg("hybrid2"), 7).chunks == 5
    assert sk.plan_schedule(*TMA_SHAPE, acfg("sk"), 7).partial_slots == 75


@pytest.mark.slow
@pytest.mark.parametrize("deterministic", [True, False], ids=["fixup", "atomic"])
@pytest.mark.parametrize("policy", ["hybrid1", "hybrid2", "sk"])
@pytest.mark.parametrize("use_tma", [False, True], ids=["ptr", "tma"])
def test_aligned_policies(policy, deterministic, use_tma, monkeypatch):
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    run_checked(sk, *TMA_SHAPE, torch.float16, acfg(policy, deterministic, use_tma))


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_tma_dtypes_and_layouts(layout, dtype, monkeypatch):
    # TMA-legal strides, ragged tiles and K; column-major A/B through transposed descriptors;
    # both layouts of the Stream-K region
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    run_checked(sk, *TMA_SHAPE, dtype, acfg(use_tma=True), layout=layout)
    run_checked(sk, *TMA_SHAPE, dtype, sk.Config(16, 16, 16, 2, 4, 1, "hybrid1", use_tma=True), layout=layout)


def test_tma_subtile_and_flatten(monkeypatch):
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    run_checked(sk, *TMA_SHAPE, torch.bfloat16, acfg(use_tma=True, subtile=True, flatten=True, bn=32))
    run_checked(sk, *TMA_SHAPE, torch.bfloat16, acfg(flatten=True))


@pytest.mark.slow
@pytest.mark.parametrize("aligned", [True, False], ids=["aligned", "contiguous"])
@pytest.mark.parametrize("deterministic", [True, False], ids=["fixup", "atomic"])
def test_data_parallel_tiles_first(aligned, deterministic, monkeypatch):
    # the same schedules with the data-parallel tiles before the Stream-K work
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    for policy in ("hybrid1", "hybrid2"):
        cfg = sk.Config(16, 16, 16, 2, 4, 1, policy, deterministic, aligned=aligned, use_tma=aligned, dp_first=True)
        run_checked(sk, *TMA_SHAPE, torch.float16, cfg)


def test_aligned_is_bit_identical_and_leaves_scratch_clean(monkeypatch):
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    first, a, b = run_checked(sk, *TMA_SHAPE, torch.float32, acfg(), seed=11)
    assert torch.equal(first, sk.matmul(a, b, acfg()))
    run_checked(sk, *TMA_SHAPE, torch.float16, acfg(deterministic=False), seed=12)
    run_checked(sk, *TMA_SHAPE, torch.float16, acfg(deterministic=False, use_tma=True), seed=13)
    assert_scratch_clean("stream_k")


def test_tma_refuses_unaligned_inputs_and_default_falls_back():
    a, b = common.random_inputs(37, 53, 97, torch.float16, DEVICE, seed=0)
    with pytest.raises(ValueError, match="TMA"):
        sk.matmul(a, b, acfg(use_tma=True))
    with pytest.raises(ValueError, match="EPILOGUE_SUBTILE"):
        sk.Config(EPILOGUE_SUBTILE=True)
    with pytest.raises(TypeError, match="aligned"):
        sk.Config(aligned=1)
    with pytest.raises(TypeError, match="dp_first"):
        sk.Config(dp_first="yes")


def test_cooperative_fixup_both_paths(monkeypatch):
    # 3 tiles x 2 chunks over 2 programs: program 0 hands in (t0,c0), (t2,c0), (t1,c1) and
    # claims before program 1 arrives, so the final arrivals reduce the slices left to them;
    # program 1's claims then find every partial in and reduce their own slice. The atomic
    # flavour takes its slices out of the tile's sum the same way, leaving the sum zeroed.
    monkeypatch.setenv("ADVISOR_NUM_SMS", "2")
    plan = sk.plan_schedule(48, 16, 64, acfg("sk"), 2)
    assert (plan.sk_tiles, plan.chunks, plan.grid) == (3, 2, 2)
    for dtype in (torch.float32, torch.bfloat16):
        first, a, b = run_checked(sk, 48, 16, 64, dtype, acfg("sk"), seed=21)
        assert torch.equal(first, sk.matmul(a, b, acfg("sk")))
        run_checked(sk, 48, 16, 64, dtype, acfg("sk", deterministic=False), seed=22)
        run_checked(sk, 48, 16, 64, dtype, acfg("sk", deterministic=False), seed=23)  # on the cleared scratch
    assert_scratch_clean("stream_k")


def test_skinny_points_on_132_sms():
    # under a wave of 128x128 tiles and TMA-legal: a tile that covers M, deterministic default
    d = sk.default_config(16, 4096, 16384, torch.bfloat16, 132)
    assert (d.BLOCK_M, d.BLOCK_N, d.policy, d.aligned, d.use_tma, d.deterministic) == (16, 64, "sk", True, True, True)
    space = sk.search_space(64, 4096, 14336, torch.bfloat16, 132)
    assert (space[0].BLOCK_M, space[0].BLOCK_N, space[0].deterministic) == (64, 64, False)
    # the compute-heavier long-K shapes lead with 128x128 on two warpgroups
    assert sk.search_space(512, 512, 65536, torch.bfloat16, 132)[0].num_warps == 8
    # a wave or more of tiles, or strides TMA cannot read: none
    assert sk.skinny_points(1664, 1408, 8192, torch.bfloat16, 132) == []
    assert sk.skinny_points(37, 53, 97, torch.bfloat16, 132) == []
    for cfg_ in sk.skinny_points(64, 4096, 14336, torch.float32, 132):
        assert cfg_.smem_bytes(torch.float32) <= common.SMEM_PER_BLOCK_SM90


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_skinny_points_run(dtype, monkeypatch):
    # 24x80 in 32x64 or 32x128 tiles, K ragged against BLOCK_K: every point, both fixups
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    M, N, K = 24, 80, 1000
    points = sk.skinny_points(M, N, K, dtype, 7)
    assert len(points) >= 3
    for config in points:
        run_checked(sk, M, N, K, dtype, config)


# ---- Stream-K tiles cut into row pieces (SK_SPLIT_M) -----------------------------------------


def scfg(split, policy="hybrid1", deterministic=True, use_tma=False, bm=32):
    return sk.Config(bm, 16, 16, 2, 4, 1, policy, deterministic, aligned=True, use_tma=use_tma, SK_SPLIT_M=split)


def test_split_plan_arithmetic():
    # 1664x1408x8192 in 128x128 tiles on 132 SMs: the 11 tail tiles in 22 half-tiles of 64 rows,
    # each cut into 132 // 22 = 6 K-chunks (132 units, one a program), a counter and a slot a unit
    plan = sk.plan_schedule(1664, 1408, 8192, sk.Config(128, 128, 64, 8, 4, 5, "hybrid1", aligned=True,
                                                        SK_SPLIT_M=2), 132)
    assert (plan.sk_tiles, plan.sk_pieces, plan.chunks, plan.sk_programs, plan.grid) == (11, 22, 6, 132, 132)
    assert (plan.fixup_keys, plan.partial_slots, plan.dp_tiles) == (22, 132, 132)
    # without the split: 11 tiles x 12 chunks, partials twice the size
    plan = sk.plan_schedule(1664, 1408, 8192, sk.Config(128, 128, 64, 8, 4, 5, "hybrid1", aligned=True), 132)
    assert (plan.sk_pieces, plan.chunks, plan.partial_slots) == (11, 12, 132)
    assert sk.Config(128, 256, SK_SPLIT_M=4, aligned=True).sk_block_m == 32
    # the interpreter cases below: multi-round units, and pieces that need no K-chunks
    assert sk.plan_schedule(*TMA_SHAPE, scfg(2), 7).chunks == 5
    assert sk.plan_schedule(*TMA_SHAPE, scfg(4, "sk", bm=64), 7).chunks == 2
    plan = sk.plan_schedule(224, 16, 40, scfg(2, "sk"), 7)
    assert (plan.sk_pieces, plan.chunks, plan.split_tiles) == (14, 1, False)


def test_split_validation():
    with pytest.raises(ValueError, match="aligned"):
        sk.Config(SK_SPLIT_M=2)
    with pytest.raises(ValueError, match="1, 2 or 4"):
        sk.Config(aligned=True, SK_SPLIT_M=3)
    with pytest.raises(ValueError, match="under the 16"):
        sk.Config(32, 16, 16, aligned=True, SK_SPLIT_M=4)
    assert "m/2" in scfg(2).describe() and "m/" not in scfg(1).describe()


@pytest.mark.slow
@pytest.mark.parametrize("deterministic", [True, False], ids=["fixup", "atomic"])
@pytest.mark.parametrize("use_tma", [False, True], ids=["ptr", "tma"])
@pytest.mark.parametrize("split,policy,bm", [(2, "hybrid1", 32), (4, "sk", 64), (2, "hybrid2", 32)])
def test_split_pieces(split, policy, bm, use_tma, deterministic, monkeypatch):
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    run_checked(sk, *TMA_SHAPE, torch.float16, scfg(split, policy, deterministic, use_tma, bm))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_split_dtypes_and_layouts(layout, dtype, monkeypatch):
    # column-major A goes through the pieces' own transposed descriptor
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    run_checked(sk, *TMA_SHAPE, dtype, scfg(2, use_tma=True), layout=layout)


def test_split_unchunked_pieces_and_clean_scratch(monkeypatch):
    # 7 tiles x 2 pieces on 7 SMs: one K-chunk a piece, stored by pointer without a fixup;
    # then split tiles in both fixups, deterministic twice bit-identical, scratch left zeroed
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    for use_tma in (False, True):
        run_checked(sk, 224, 16, 40, torch.bfloat16, scfg(2, "sk", use_tma=use_tma))
    first, a, b = run_checked(sk, *TMA_SHAPE, torch.float32, scfg(2, use_tma=True), seed=31)
    assert torch.equal(first, sk.matmul(a, b, scfg(2, use_tma=True)))
    run_checked(sk, *TMA_SHAPE, torch.float16, scfg(4, "sk", deterministic=False, bm=64), seed=32)
    assert_scratch_clean("stream_k")


def test_split_points_in_the_search():
    # tail shapes with a data-parallel body get the 64-row pieces; a split-free plan (2304^2:
    # 120 pieces, one K-chunk each) only its deterministic flavour (both would be one kernel)
    def split(shape):
        return [(c.deterministic, c.policy) for c in sk.search_space(*shape, torch.bfloat16, 132)
                if c.SK_SPLIT_M > 1 and c.SK_SPLIT_N == 1]
    assert split((1664, 1408, 8192)) == [(False, "hybrid1"), (True, "hybrid1")]
    assert split((2304, 2304, 4096)) == [(True, "hybrid1")]
    # 3072^2: 96 pieces in 4 K-chunks are 3 rounds of units a program, and lost in every run
    assert split((3072, 3072, 4096)) == []
    # all-Stream-K skinny shapes: the pieces re-read B and lost 20-40% there, so none
    for shape in [(512, 512, 65536), (256, 256, 131072), (128, 8192, 8192), (16, 4096, 16384)]:
        assert split(shape) == []
    for config in sk.search_space(1664, 1408, 8192, torch.bfloat16, 132):
        assert config.smem_bytes(torch.bfloat16) <= common.SMEM_PER_BLOCK_SM90


# ---- Column pieces (SK_SPLIT_N) and whole pieces (whole_pieces) ------------------------------


def qcfg(split_m=2, split_n=2, policy="hybrid1", deterministic=True, use_tma=False, whole=False, **kw):
    return sk.Config(32, 32, 16, 2, 4, 1, policy, deterministic, aligned=True, use_tma=use_tma,
                     SK_SPLIT_M=split_m, SK_SPLIT_N=split_n, whole_pieces=whole, **kw)


# 72x80 in 32x32 tiles: 3 x 3 tiles whose last row and column of pieces lie wholly or partly
# outside C; K=72: 5 steps of 16, the last one ragged. On 7 SMs "hybrid1" has 2 Stream-K
# tiles (8 quarter pieces), "sk" all 9 (36 pieces).
QSHAPE = (72, 80, 72)


def test_column_piece_plans():
    # 3072^2x4096 in 128x256 tiles on 132 SMs: the 24 tail tiles as 96 quarter pieces of
    # 64x128; whole, they fill one round with no K-chunk and no fixup (36 programs have no
    # Stream-K work); left to aligned_chunks, 4 K-chunks in 3 rounds of units
    t256 = sk.Config(128, 256, 64, 8, 8, 3, "hybrid1", aligned=True, use_tma=True, SK_SPLIT_M=2, SK_SPLIT_N=2)
    plan = sk.plan_schedule(3072, 3072, 4096, replace(t256, whole_pieces=True), 132)
    assert (plan.sk_tiles, plan.sk_pieces, plan.chunks, plan.sk_programs, plan.grid) == (24, 96, 1, 96, 132)
    assert not plan.split_tiles and plan.dp_tiles == 264
    assert sk.plan_schedule(3072, 3072, 4096, t256, 132).chunks == 4
    assert (t256.sk_block_m, t256.sk_block_n) == (64, 128)
    # the interpreter cases below
    assert sk.plan_schedule(*QSHAPE, qcfg(), 7).chunks == 5
    assert sk.plan_schedule(*QSHAPE, qcfg(whole=True), 7).sk_programs == 7  # 8 pieces: 2 rounds
    plan = sk.plan_schedule(*QSHAPE, qcfg(1, 2, "sk"), 7)
    assert (plan.sk_pieces, plan.split_tiles) == (18, True)


def test_column_piece_validation():
    with pytest.raises(ValueError, match="SK_SPLIT_N.*aligned"):
        sk.Config(SK_SPLIT_N=2)
    with pytest.raises(ValueError, match="SK_SPLIT_N=3.*1, 2 or 4"):
        sk.Config(aligned=True, SK_SPLIT_N=3)
    with pytest.raises(ValueError, match="8 columns, under the 16"):
        sk.Config(32, 32, 16, aligned=True, SK_SPLIT_N=4)
    with pytest.raises(ValueError, match="whole_pieces.*aligned"):
        sk.Config(whole_pieces=True)
    with pytest.raises(TypeError, match="whole_pieces"):
        sk.Config(aligned=True, whole_pieces=1)
    assert "m/2 n/2 whole" in qcfg(whole=True).describe() and "n/" not in scfg(2).describe()


@pytest.mark.parametrize("deterministic", [True, False], ids=["fixup", "atomic"])
@pytest.mark.parametrize("use_tma", [False, True], ids=["ptr", "tma"])
@pytest.mark.parametrize("split_m,split_n,policy", [(1, 2, "hybrid1"), (2, 2, "sk"), (1, 2, "sk")])
def test_column_pieces_split(split_m, split_n, policy, use_tma, deterministic, monkeypatch):
    # K-chunked pieces: the fixup's partials, slots and claims are a piece's 16 or 32 columns
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    config = qcfg(split_m, split_n, policy, deterministic, use_tma)
    assert sk.plan_schedule(*QSHAPE, config, 7).split_tiles
    run_checked(sk, *QSHAPE, torch.float16, config)


@pytest.mark.parametrize("use_tma", [False, True], ids=["ptr", "tma"])
@pytest.mark.parametrize("split_m,split_n,policy", [(2, 2, "hybrid1"), (2, 2, "sk"), (1, 2, "hybrid2")])
def test_whole_pieces(split_m, split_n, policy, use_tma, monkeypatch):
    # no K-chunks: each piece is stored directly, several rounds of pieces a program
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    config = qcfg(split_m, split_n, policy, use_tma=use_tma, whole=True)
    plan = sk.plan_schedule(*QSHAPE, config, 7)
    assert plan.chunks == 1 and not plan.split_tiles and plan.sk_pieces > plan.sk_programs
    run_checked(sk, *QSHAPE, torch.bfloat16, config)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_column_pieces_dtypes_and_layouts(layout, dtype, monkeypatch):
    # transposed A or B go through the pieces' own transposed descriptors
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    run_checked(sk, *QSHAPE, dtype, qcfg(use_tma=True), layout=layout)
    run_checked(sk, *QSHAPE, dtype, qcfg(use_tma=True, whole=True), layout=layout)


@pytest.mark.parametrize("strips", [1, 2])
@pytest.mark.parametrize("deterministic", [True, False], ids=["fixup", "atomic"])
def test_column_pieces_tma_hand_in(strips, deterministic, monkeypatch):
    # the workspace descriptor's rows are a piece's 32 columns wide (64-column tiles halved),
    # handed in whole or in two 16-column strips
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    monkeypatch.setattr(sk, "hand_in_strips", lambda config, dtype: strips)
    config = sk.Config(32, 64, 16, 2, 4, 1, "hybrid1", deterministic, aligned=True, use_tma=True, SK_SPLIT_N=2,
                       tma_hand_in=True)
    assert sk.plan_schedule(80, 136, 72, config, 7).split_tiles
    run_checked(sk, 80, 136, 72, torch.float32, config, seed=strips)


@pytest.mark.parametrize("order", ["pid", "reversed"])
def test_column_pieces_claims_and_clean_scratch(order, request, monkeypatch):
    # helper claims and the cooperative claims on column pieces, in either launch order (the
    # reversed one sends the claims ahead of the arrivals); atomic sums left zeroed
    if order == "reversed":
        request.getfixturevalue("reversed_launch_order")
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    helper = qcfg(1, 2, deterministic=False, helper_claims=True)
    plan = sk.plan_schedule(64, 120, 72, helper, 7)  # 8 tiles: 1 in 2 pieces x 3 chunks, 1 helper
    assert sk.uses_helpers(helper, plan) and (plan.sk_pieces, plan.chunks, plan.grid - plan.sk_programs) == (2, 3, 1)
    run_checked(sk, 64, 120, 72, torch.float16, helper, seed=51)
    run_checked(sk, 64, 120, 72, torch.float16, replace(helper, deterministic=True), seed=52)
    run_checked(sk, *QSHAPE, torch.float16, qcfg(2, 2, "sk", deterministic=False), seed=53)
    assert_scratch_clean("stream_k")


def test_sk_stages(monkeypatch):
    # the Stream-K loop's own pipeline depth: the interpreter ignores it, so this runs the
    # code path; the sm_90 compile check showed the deeper buffers reuse the tiles' (208 KB
    # for 128x256 s3 with 6-stage 64x128 pieces, as without them)
    with pytest.raises(ValueError, match="SK_STAGES.*aligned=True and use_tma=True"):
        sk.Config(aligned=True, SK_STAGES=6)
    with pytest.raises(ValueError, match="SK_STAGES=9"):
        sk.Config(aligned=True, use_tma=True, SK_STAGES=9)
    q = sk.Config(128, 256, 64, 8, 8, 3, "hybrid1", aligned=True, use_tma=True, SK_SPLIT_M=2, SK_SPLIT_N=2,
                  whole_pieces=True, SK_STAGES=6)
    assert "sks6" in q.describe() and q.smem_bytes(torch.bfloat16) == replace(q, SK_STAGES=0).smem_bytes(torch.bfloat16)
    assert replace(q, SK_STAGES=8).smem_bytes(torch.bfloat16) > q.smem_bytes(torch.bfloat16)  # 192 KB of pieces
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    run_checked(sk, *QSHAPE, torch.float16, qcfg(use_tma=True, whole=True, SK_STAGES=3))
    run_checked(sk, *QSHAPE, torch.float16, qcfg(use_tma=True, deterministic=False, SK_STAGES=2))


def test_quarter_points_in_the_search():
    # quarter pieces of the 128x256 tile with 5-stage piece loops, searched only as one
    # split-free round beside a data-parallel body and with K <= 4096 (a piece runs the whole
    # K: they lost 5-8% at K = 8192 on the H200)
    def quarters(shape):
        return [(c.SK_SPLIT_M, c.SK_SPLIT_N, c.whole_pieces, c.BLOCK_N, c.SK_STAGES)
                for c in sk.search_space(*shape, torch.bfloat16, 132) if c.SK_SPLIT_N > 1 and not c.edge_first]
    for shape in [(2304, 2304, 4096), (3072, 3072, 4096)]:
        assert quarters(shape) == [(2, 2, True, 256, 5)], shape
        for c in sk.search_space(*shape, torch.bfloat16, 132):
            assert c.smem_bytes(torch.bfloat16) <= common.SMEM_PER_BLOCK_SM90
    # K = 8192 (132 and 84 pieces would fit a round); 1664x1408 in 128x256 tiles has no
    # data-parallel body; skinny shapes are all Stream-K
    for shape in [(2176, 2176, 8192), (4224, 4224, 8192), (1664, 1408, 8192), (512, 512, 65536),
                  (128, 8192, 8192)]:
        assert quarters(shape) == [], shape


# ---- The ragged column first (edge_first) ----------------------------------------------------


def ecfg(split_m=1, split_n=2, policy="hybrid1", deterministic=True, use_tma=False, **kw):
    return sk.Config(32, 64, 16, 2, 4, 1, policy, deterministic, aligned=True, use_tma=use_tma,
                     SK_SPLIT_M=split_m, SK_SPLIT_N=split_n, edge_first=True, **kw)


# 80x152 in 32x64 tiles: 3 x 3 tiles, the last tile row ragged (16 of 32 rows) and the last
# column 24 of 64 columns wide, so its right-hand 32-column piece lies wholly outside C; K=72
# (the last of 5 steps ragged). On 7 SMs "hybrid1" puts 2 tiles in the region: 2 of the 3
# ragged-column tiles (the third stays data-parallel), as 2 pieces in 3 K-chunks (1 helper).
ESHAPE = (80, 152, 72)


def test_edge_first_plans():
    t256 = sk.Config(128, 256, 64, 8, 8, 3, "hybrid1", False, aligned=True, use_tma=True, SK_SPLIT_N=2,
                     SK_STAGES=5, edge_first=True)
    # 2176^2: 17 ragged tiles (128 of 256 columns) + 4 whole ones = 25 pieces of 128x128 in 5
    # K-chunks; 4224^2: the 33 ragged tiles are the region, 33 pieces in 4 K-chunks
    for shape, want in [((2176, 2176, 8192), (21, 17, 1, 25, 5, 125)), ((4224, 4224, 8192), (33, 33, 1, 33, 4, 132))]:
        plan = sk.plan_schedule(*shape, t256, 132)
        assert (plan.sk_tiles, plan.edge_tiles, plan.edge_cols, plan.sk_pieces, plan.chunks, plan.sk_programs) == want
        assert plan.dp_tiles == plan.tiles - plan.sk_tiles and plan.fixup_keys == plan.sk_pieces
        unsplit = sk.plan_schedule(*shape, replace(t256, edge_first=False), 132)
        assert (unsplit.edge_tiles, unsplit.sk_pieces) == (0, 2 * plan.sk_tiles)
    # no ragged column (3072 = 12 x 256), or one tile column: the plain order
    assert sk.edge_region(3072, 3072, t256, 24) == (0, 0) and sk.edge_region(64, 200, t256, 1) == (0, 0)
    # a ragged column more than half full keeps both pieces; unsplit, edge_first only reorders
    assert sk.edge_region(2176, 2176 + 64, t256, 21) == (17, 2)
    assert sk.edge_region(2176, 2176, replace(t256, SK_SPLIT_N=1, SK_STAGES=0), 21) == (17, 1)
    # the interpreter cases below
    plan = sk.plan_schedule(*ESHAPE, ecfg(), 7)
    assert (plan.sk_tiles, plan.edge_tiles, plan.sk_pieces, plan.chunks, plan.grid - plan.sk_programs) == (2, 2, 2, 3, 1)
    assert sk.plan_schedule(*ESHAPE, ecfg(2, 2, "sk"), 7).sk_pieces == 3 * 2 + 6 * 4


def test_edge_first_validation():
    with pytest.raises(ValueError, match="edge_first.*aligned"):
        sk.Config(edge_first=True)
    with pytest.raises(TypeError, match="edge_first"):
        sk.Config(aligned=True, edge_first=1)
    assert ecfg().describe().endswith("n/2 edge")


EDGE_CASES = [
    # (config, dtype): pieces of the ragged column dropped (hybrid1: one ragged tile left
    # data-parallel; sk: all of them) or kept (split_n 1), both fixups, pointer and TMA loads
    (ecfg(), torch.float16), (ecfg(deterministic=False, use_tma=True), torch.float16),
    (ecfg(use_tma=True), torch.bfloat16), (ecfg(deterministic=False), torch.float32),
    (ecfg(2, 2, "sk", use_tma=True), torch.float16), (ecfg(2, 2, "sk", deterministic=False), torch.float16),
    (ecfg(1, 1, "hybrid2"), torch.float16), (ecfg(whole_pieces=True, use_tma=True), torch.bfloat16),
    (ecfg(deterministic=False, use_tma=True, SK_STAGES=2, tma_hand_in=True), torch.float32),
]


@pytest.mark.parametrize("case", range(len(EDGE_CASES)))
def test_edge_first(case, monkeypatch):
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    config, dtype = EDGE_CASES[case]
    run_checked(sk, *ESHAPE, dtype, config, seed=70 + case)
    # a ragged column more than half full (168 = 2 x 64 + 40): both its pieces stay
    run_checked(sk, 80, 168, 72, dtype, config, seed=80 + case)


@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_edge_first_layouts(layout, monkeypatch):
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    run_checked(sk, *ESHAPE, torch.float16, ecfg(use_tma=True), layout=layout)


@pytest.mark.parametrize("order", ["pid", "reversed"])
def test_edge_first_claims_and_clean_scratch(order, request, monkeypatch):
    # the helper (pid 6) and the cooperative claims on the ragged column's pieces, in either
    # launch order; atomic sums left zeroed
    if order == "reversed":
        request.getfixturevalue("reversed_launch_order")
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    for deterministic in (True, False):
        helper = ecfg(deterministic=deterministic, helper_claims=True)
        assert sk.uses_helpers(helper, sk.plan_schedule(*ESHAPE, helper, 7))
        run_checked(sk, *ESHAPE, torch.float16, helper, seed=90)
        run_checked(sk, *ESHAPE, torch.float16, ecfg(2, 2, "sk", deterministic), seed=91)
    assert_scratch_clean("stream_k")


def test_edge_points_in_the_search():
    # searched only where the ragged column drops pieces beside a data-parallel body: of the
    # tail shapes 2176^2 and 4224^2 (128 of 256 columns); not 1664x1408 (1408 = 5.5 x 256, but
    # fewer 128x256 tiles than SMs), 2304^2 and 3072^2 (whole columns), nor skinny shapes
    def edges(shape):
        return [(c.BLOCK_N, c.SK_SPLIT_N, c.SK_STAGES, c.deterministic, c.whole_pieces)
                for c in sk.search_space(*shape, torch.bfloat16, 132) if c.edge_first]
    for shape in [(2176, 2176, 8192), (4224, 4224, 8192)]:
        assert edges(shape) == [(256, 2, 5, False, False)], shape
        for c in sk.search_space(*shape, torch.bfloat16, 132):
            assert c.smem_bytes(torch.bfloat16) <= common.SMEM_PER_BLOCK_SM90
    for shape in [(1664, 1408, 8192), (2304, 2304, 4096), (3072, 3072, 4096), (512, 512, 65536),
                  (128, 8192, 8192), (2176, 2176 + 64, 8192)]:
        assert edges(shape) == [], shape


# ---- Staged copies for TMA (staged) ---------------------------------------------------------

STAGED_CASES = [acfg(use_tma=True), acfg("sk", False, use_tma=True), scfg(2, "hybrid1", False, use_tma=True),
                ecfg(use_tma=True, deterministic=False), qcfg(use_tma=True, whole=True)]


@pytest.mark.parametrize("case", range(len(STAGED_CASES)))
def test_staged_misaligned_rows(case, monkeypatch):
    # 72x83x75 fp16: B's, C's and A's rows misaligned (166 and 150 bytes), so all three go
    # through aligned buffers; the fixup stores into the staged C too; transposed views as well
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    config = replace(STAGED_CASES[case], staged=True)
    run_checked(sk, 72, 83, 75, torch.float16, config, seed=100 + case)
    run_checked(sk, 72, 83, 75, torch.bfloat16, config, layout=(True, True), seed=110 + case)
    with pytest.raises(ValueError, match="TMA"):
        sk.matmul(*common.random_inputs(72, 83, 75, torch.float16, DEVICE), replace(config, staged=False))


def test_staged_search_and_default():
    bf16 = torch.bfloat16
    with pytest.raises(ValueError, match="staged.*use_tma"):
        sk.Config(staged=True)
    assert "staged" in sk.Config(aligned=True, use_tma=True, staged=True).describe()
    # 2000x2900x8192 (B and C rows of 5800 bytes): the aligned TMA layout, staged, by default
    # and in the search (H200 2026-12-01: Stream-K on pointer loads took 1010 us there,
    # torch.matmul 395); a skinny shape whose B would be copied whole keeps pointer loads
    cfg = sk.default_config(2000, 2900, 8192, bf16, 132)
    assert cfg.aligned and cfg.use_tma and cfg.staged
    space = sk.search_space(2000, 2900, 8192, bf16, 132)
    assert sum(c.staged for c in space) >= 6 and all(c.staged == c.use_tma for c in space)
    assert sk.skinny_points(16, 4096, 16381, bf16, 132)[0].staged  # only A (1 MB) is copied
    assert not sk.default_config(64, 4097, 14336, bf16, 132).use_tma
    assert not any(c.staged for c in sk.search_space(2176, 2176, 8192, bf16, 132))


# ---- The TMA hand-in (tma_hand_in) -----------------------------------------------------------


def tcfg(policy="hybrid1", deterministic=True, split=1, bm=16, bn=16):
    return sk.Config(bm, bn, 16, 2, 4, 1, policy, deterministic, aligned=True, use_tma=True, SK_SPLIT_M=split,
                     tma_hand_in=True)


@pytest.mark.parametrize("deterministic", [True, False], ids=["fixup", "atomic"])
@pytest.mark.parametrize("policy", ["hybrid1", "hybrid2", "sk"])
def test_tma_hand_in_policies(policy, deterministic, monkeypatch):
    # the partials go through the workspace's descriptor (the interpreter's reduce-add is
    # kernels/common's patch); multi-round plans (hybrid2, sk) hand in several a program
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    assert sk.plan_schedule(*TMA_SHAPE, tcfg(policy), 7).split_tiles
    run_checked(sk, *TMA_SHAPE, torch.float16, tcfg(policy, deterministic))


@pytest.mark.parametrize("strips", [2, 4, 8])
@pytest.mark.parametrize("deterministic", [True, False], ids=["fixup", "atomic"])
def test_tma_hand_in_strips(strips, deterministic, monkeypatch):
    # a partial in 2, 4 or 8 column strips (each strip's box offset and columns); at H200 sizes
    # the strips come from shared memory, so they are forced here on a 64-column tile
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    monkeypatch.setattr(sk, "hand_in_strips", lambda config, dtype: strips)
    for dtype in (torch.float32, torch.bfloat16):
        run_checked(sk, 80, 136, 72, dtype, tcfg(deterministic=deterministic, bn=64), seed=strips)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS, ids=layout_id)
def test_tma_hand_in_dtypes_layouts_and_pieces(layout, dtype, monkeypatch):
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    run_checked(sk, *TMA_SHAPE, dtype, tcfg(deterministic=False), layout=layout)
    run_checked(sk, *TMA_SHAPE, dtype, tcfg(split=2, bm=32), layout=layout)


def test_tma_hand_in_bit_identical_and_clean_scratch(monkeypatch):
    # deterministic: the bulk-stored partials are summed in chunk order, so the same bits as
    # the per-thread hand-in; atomic: the sums are handed back zeroed
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    first, a, b = run_checked(sk, *TMA_SHAPE, torch.float32, tcfg(), seed=41)
    assert torch.equal(first, sk.matmul(a, b, replace(tcfg(), tma_hand_in=False)))
    run_checked(sk, *TMA_SHAPE, torch.float16, tcfg(deterministic=False), seed=42)
    run_checked(sk, *TMA_SHAPE, torch.float16, tcfg(deterministic=False), seed=43)
    assert_scratch_clean("stream_k")


def test_tma_hand_in_validation_strips_and_search():
    with pytest.raises(ValueError, match="tma_hand_in"):
        sk.Config(aligned=True, tma_hand_in=True)
    with pytest.raises(ValueError, match="tma_hand_in"):
        sk.Config(use_tma=True, tma_hand_in=True)
    with pytest.raises(TypeError, match="tma_hand_in"):
        sk.Config(aligned=True, use_tma=True, tma_hand_in=1)
    assert "tmahand" in tcfg().describe() and "tmahand" not in acfg().describe()
    # the strips on the H200's tiles (sm_90 compile check: a 128x128 fp32 partial in 2 strips
    # took the 5-stage kernel to 224 KB, a 128x256 one in 8 strips the 3-stage kernel too)
    t128 = sk.Config(128, 128, 64, 8, 4, 5, "hybrid1", False, aligned=True, use_tma=True, tma_hand_in=True)
    t256 = sk.Config(128, 256, 64, 8, 8, 3, "hybrid1", False, aligned=True, use_tma=True, tma_hand_in=True)
    assert sk.hand_in_strips(t128, torch.bfloat16) == 2 and sk.hand_in_strips(t256, torch.bfloat16) == 8
    assert t128.smem_bytes(torch.bfloat16) == 224 * 1024 == t256.smem_bytes(torch.bfloat16)
    assert sk.hand_in_strips(replace(t128, SK_SPLIT_M=2), torch.bfloat16) == 1
    # the tail search holds the atomic 128x256 point with it, which fits
    for shape in [(2176, 2176, 8192), (3072, 3072, 4096), (4224, 4224, 8192)]:
        bulk = [c for c in sk.search_space(*shape, torch.bfloat16, 132) if c.tma_hand_in and not c.helper_claims]
        assert [(c.BLOCK_N, c.deterministic, c.policy) for c in bulk] == [(256, False, "hybrid1")]
        assert all(c.smem_bytes(torch.bfloat16) <= common.SMEM_PER_BLOCK_SM90 for c in bulk)


def test_interpreter_descriptor_reduce_patch():
    # kernels/common gives the interpreter the TMA reduce-add: clipped at the tensor's edge
    import triton
    import triton.language as tl
    from triton.tools.tensor_descriptor import TensorDescriptor

    common.fix_interpreter_descriptor_reduce()

    @triton.jit
    def add_block(desc, BM: tl.constexpr, BN: tl.constexpr):
        desc.atomic_add([8, 8], tl.full((BM, BN), 1.5, tl.float32))

    x = torch.arange(12 * 20, dtype=torch.float32).reshape(12, 20)
    want = x.clone()
    want[8:, 8:24] += 1.5
    add_block[(1,)](TensorDescriptor(x, [12, 20], [20, 1], [8, 16]), BM=8, BN=16)
    assert torch.equal(x, want)


# ---- Helper claims (helper_claims) and launch order -------------------------------------------


@pytest.fixture
def reversed_launch_order(monkeypatch):
    """Run the interpreter's programs in reverse pid order (the GPU promises no order): then the
    helpers, the highest pids, claim before any contributor has handed in, and the cooperative
    claims of the lower pids come before the arrivals of the higher ones."""
    from triton.runtime import interpreter

    original = interpreter.InterpreterBuilder.set_grid_idx

    def set_grid_idx(self, x, y, z):
        original(self, self.grid_dim[0] - 1 - x, y, z)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "set_grid_idx", set_grid_idx)


def hcfg(policy="hybrid1", deterministic=True, split=1, bm=16, use_tma=False, tma_hand_in=False):
    return sk.Config(bm, 16, 16, 2, 4, 1, policy, deterministic, aligned=True, use_tma=use_tma or tma_hand_in,
                     SK_SPLIT_M=split, tma_hand_in=tma_hand_in, helper_claims=True)


# (shape, config, helpers, pieces) on 7 SMs: 1 tile x 5 chunks (2 helpers, one piece); 3 tiles
# x 2 chunks (1 helper takes 3 pieces); 1 tile in 2 row pieces x 3 chunks (1 helper, 2 pieces)
HELPER_CASES = [((72, 48, 72), hcfg(), 2, 1), ((80, 32, 72), hcfg(), 1, 3),
                ((160, 48, 72), hcfg(split=2, bm=32), 1, 2)]


def test_helper_plans():
    for shape, config, helpers, pieces in HELPER_CASES:
        plan = sk.plan_schedule(*shape, config, 7)
        assert plan.split_tiles and (plan.grid - plan.sk_programs, plan.sk_pieces) == (helpers, pieces), shape
    # no helpers (every program has Stream-K work): the contributors' claims, as without the knob
    plan = sk.plan_schedule(1664, 1408, 8192, sk.Config(128, 128, 64, 8, 4, 5, "hybrid1", aligned=True,
                                                         helper_claims=True), 132)
    assert plan.grid == plan.sk_programs == 132
    with pytest.raises(ValueError, match="helper_claims"):
        sk.Config(helper_claims=True)
    assert "helpers" in hcfg().describe()
    # more than 32 pieces a helper (the kernel's bit mask): the contributors' claims instead
    config = hcfg("sk")
    plan = sk.plan_schedule(16 * 70, 16, 32, config, 7)  # 70 tiles x 2 chunks over 7 programs: no helpers
    assert not sk.uses_helpers(config, plan) and sk.helper_bytes(config, plan) == 0
    many = sk.Plan(tiles=300, iters_per_tile=4, sk_tiles=99, sk_programs=130, sk_iters_per_program=0, sk_extra=0,
                   chunks=2, num_sms=132, split_m=1)
    assert many.grid - many.sk_programs == 2 and not sk.uses_helpers(config, many)  # 50 pieces a helper
    assert sk.uses_helpers(config, replace(many, sk_tiles=64))


def test_helper_points_in_the_search():
    # only where a helper reads at most HELPER_BYTES: 3072^2x4096 with 128x256 tiles (12 helpers,
    # 2 pieces of 128 KB); 2176^2 (6 helpers, 4 pieces) and 2304^2 (12 helpers, 3) have more,
    # 1664x1408 and 4224^2 no helpers at all
    def helpers(shape):
        return [(c.BLOCK_N, c.tma_hand_in) for c in sk.search_space(*shape, torch.bfloat16, 132) if c.helper_claims]
    assert helpers((3072, 3072, 4096)) == [(256, True)]
    for shape in [(1664, 1408, 8192), (2176, 2176, 8192), (2304, 2304, 4096), (4224, 4224, 8192)]:
        assert helpers(shape) == [], shape
    t256 = sk.Config(128, 256, 64, 8, 8, 3, "hybrid1", False, aligned=True, use_tma=True, tma_hand_in=True,
                     helper_claims=True)
    assert sk.helper_bytes(t256, sk.plan_schedule(3072, 3072, 4096, t256, 132)) == 256 * 1024
    assert sk.helper_bytes(t256, sk.plan_schedule(2176, 2176, 8192, t256, 132)) == 512 * 1024
    det = replace(t256, deterministic=True)  # every chunk's partial: 5 chunks
    assert sk.helper_bytes(det, sk.plan_schedule(3072, 3072, 4096, det, 132)) == 5 * 256 * 1024


@pytest.mark.parametrize("order", ["pid", "reversed"])
@pytest.mark.parametrize("deterministic", [True, False], ids=["fixup", "atomic"])
@pytest.mark.parametrize("case", range(len(HELPER_CASES)))
def test_helper_claims(case, deterministic, order, request, monkeypatch):
    # in pid order the helpers claim after every arrival and sum the pieces; reversed, they
    # claim first and the final arrivals sum the pieces and clear the words
    if order == "reversed":
        request.getfixturevalue("reversed_launch_order")
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    shape, config, *_ = HELPER_CASES[case]
    config = replace(config, deterministic=deterministic)
    for tma_hand_in in (False, True):
        c = replace(config, use_tma=tma_hand_in, tma_hand_in=tma_hand_in)
        first, a, b = run_checked(sk, *shape, torch.float32, c, seed=50 + case)
        if deterministic:  # the same bits as the contributors' claims
            assert torch.equal(first, sk.matmul(a, b, replace(c, helper_claims=False)))
        run_checked(sk, *shape, torch.bfloat16, c, seed=60 + case)
    assert_scratch_clean("stream_k")


@pytest.mark.parametrize("deterministic", [True, False], ids=["fixup", "atomic"])
@pytest.mark.parametrize("policy", ["hybrid1", "hybrid2", "sk"])
def test_aligned_fixup_in_reversed_launch_order(policy, deterministic, reversed_launch_order, monkeypatch):
    # the cooperative fixup never waits on another program, so any launch order gives the
    # right answer and leaves the scratch clean (claims before arrivals go to the final arrival)
    monkeypatch.setenv("ADVISOR_NUM_SMS", "7")
    for config in (acfg(policy, deterministic, use_tma=True), scfg(2, policy, deterministic, use_tma=True)):
        run_checked(sk, *TMA_SHAPE, torch.float16, config)
    assert_scratch_clean("stream_k")
