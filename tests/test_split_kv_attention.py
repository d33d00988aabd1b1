"""kernels/split_kv_attention.py under the Triton interpreter: odd KV lengths, GQA ratios 1/4/8,
one and three query positions (causal), each dtype, ragged chunks and rows without a visible
key in a chunk, strided K/V, the one-split path, the split rule, validation."""

from __future__ import annotations

import math
import os

import pytest
import torch

from advisor.codegen.kernel_lib import load

kv = load("split_kv_attention")
common = load("common")
common.fix_interpreter_bf16_dot()
pytestmark = pytest.mark.interpreter

DEVICE = "cuda" if os.environ.get("ADVISOR_TEST_GPU") == "1" else "cpu"
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def small(splits=3, block_n=16, block_h=64, min_chunk=16, combine="last_arriver", tma=False, warps=4):
    return kv.Config(BLOCK_N=block_n, BLOCK_H=block_h, num_warps=warps, num_stages=2, NUM_SPLITS=splits,
                     MIN_CHUNK=min_chunk, combine=combine, tma=tma)


def assert_counters_clean():
    for (name, *_), buf in common.SCRATCH._buffers.items():
        if name.startswith("split_kv"):
            assert not buf.any(), f"{name} left dirty"


def run_checked(B, Hq, Hkv, Lq, S, D, dtype, config, *, seed=0, layout="bhsd", scale=None):
    """decode_attention into a NaN-poisoned output, checked against the float64 reference."""
    q, k, v = kv.random_inputs(B, Hq, Hkv, Lq, S, D, dtype, DEVICE, seed=seed)
    if layout == "bshd":  # the (B, S, H, D) cache layout many models keep, seen as (B, H, S, D)
        k = k.transpose(1, 2).contiguous().transpose(1, 2)
        v = v.transpose(1, 2).contiguous().transpose(1, 2)
    out = common.poison_(torch.empty_like(q))
    res = kv.decode_attention(q, k, v, config, scale=scale, out=out)
    assert res is out and res.shape == q.shape and res.dtype == dtype
    err = kv.rel_error(res, kv.reference(q, k, v, scale))
    tol = kv.TOLERANCE[dtype]
    assert err <= tol, f"{(B, Hq, Hkv, Lq, S, D)} {dtype} {config}: rel err {err:.3e} > {tol:.0e}"
    return res, (q, k, v)


@pytest.mark.parametrize("combine", kv.COMBINES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dtypes_gqa4(dtype, combine):
    # 300 keys in 16-key tiles split 3 ways: chunks of 7, 7 and 5 tiles, the last one ragged
    run_checked(1, 8, 2, 1, 300, 32, dtype, small(combine=combine))
    assert_counters_clean()


@pytest.mark.parametrize("S", [1, 17, 1000])
def test_odd_lengths(S):
    run_checked(2, 4, 1, 1, S, 32, torch.float16, small(splits=4, block_n=32))


@pytest.mark.parametrize("ratio", [1, 4, 8])
@pytest.mark.parametrize("lq", [1, 3])
def test_gqa_ratios_and_query_lengths(ratio, lq):
    run_checked(1, 2 * ratio, 2, lq, 77, 16, torch.float16, small(splits=2))


def test_rows_split_over_programs():
    # 8 query heads per kv-head x Lq 3 = 24 rows in 16-row programs: two row blocks, one ragged,
    # each with its own arrival counter; then another shape and batch on the same pool
    run_checked(1, 8, 1, 3, 100, 32, torch.bfloat16, small(block_h=16))
    run_checked(3, 8, 2, 3, 70, 32, torch.float16, small(block_h=16, splits=4), seed=1)
    assert_counters_clean()


@pytest.mark.parametrize("combine", kv.COMBINES)
def test_early_queries_see_nothing_in_the_last_chunk(combine):
    # Lq 4 over 65 keys in 1-tile chunks: the last chunk (key 64) is invisible to queries 0-2,
    # whose partial there must weigh nothing (not NaN) in the combine
    config = small(splits=5, block_n=16, combine=combine)
    assert kv.split_plan(65, 5) == (5, 16)
    run_checked(1, 2, 1, 4, 65, 16, torch.float32, config)
    run_checked(1, 2, 1, 4, 4, 16, torch.float32, config)  # S == Lq: query 0 sees one key


def test_split_plan_cuts_equal_chunks_at_16_keys():
    # any split count gives that many chunks, within 16 keys of each other; tiles no longer
    # decide it (before: 8192 keys in 64-key tiles asked for 33 gave 32 chunks)
    assert kv.split_plan(8192, 33) == (33, 256)  # 512 groups of 16: 17 chunks of 240 keys, 16 of 256
    assert kv.split_plan(1000, 5) == (5, 208)
    assert kv.split_plan(65, 6) == (5, 16)  # 5 groups of 16 keys: at most 5 chunks
    assert kv.split_plan(5, 1) == (1, 16)


def test_tma_boundaries_fall_on_whole_tiles():
    # a TMA load fetches a whole BLOCK_N tile, so chunk and stream boundaries fall on tiles (a
    # boundary inside one read it twice, once from each side); pointer loads keep 16-key groups
    assert kv.key_align(small(block_n=32, tma=True), True) == 32
    assert kv.key_align(small(block_n=32, tma=True), False) == kv.SPLIT_ALIGN
    assert kv.split_plan(333, 7, 32) == (7, 64)  # 11 tiles: 4 chunks of 2 tiles, 3 of 1
    assert kv.split_plan(333, 20, 32) == (11, 32)  # at most one chunk a tile
    # more splits than tiles, the last tile 4 keys: split and stream schedules, both combines
    for config in (small(splits=8, block_n=32, tma=True), small(splits=3, block_n=32, tma=True, combine="kernel"),
                   stream(4, block_n=32, tma=True)):
        run_checked(1, 4, 2, 1, 100, 32, torch.bfloat16, config)


@pytest.mark.parametrize("combine", kv.COMBINES)
def test_chunks_that_end_mid_tile(combine):
    # 7 chunks of 48 keys (the last 45) in 32-key tiles: each chunk's second tile holds 16
    # keys of the next chunk, which must not count twice
    assert kv.split_plan(333, 7) == (7, 48)
    run_checked(1, 8, 2, 1, 333, 32, torch.float16, small(splits=7, block_n=32, combine=combine))
    assert_counters_clean()


@pytest.mark.parametrize("combine", kv.COMBINES)
@pytest.mark.parametrize("layout", ["bhsd", "bshd"])
def test_tma_loads(combine, layout):
    # K/V through tensor descriptors over (B, Hkv, S, D): zero fill past S, the next chunk's
    # keys masked inside a tile; the strided (B, S, H, D) cache too
    run_checked(2, 8, 2, 3, 333, 32, torch.bfloat16, small(splits=7, block_n=32, combine=combine, tma=True),
                layout=layout)
    q, k, v = kv.random_inputs(1, 4, 2, 1, 50, 32, torch.float16, DEVICE)
    assert kv.tma_ok(k, v, 32)
    assert not kv.tma_ok(k[..., :24], v[..., :24], 32)  # D not the box width
    assert kv.tma_ok(k[:, :, ::3], v[:, :, ::3], 32)  # every third key: 192-byte strides are fine
    kk = torch.randn(1, 2, 50, 20, dtype=torch.float16)[..., :16]  # 40-byte key stride: not 16-byte aligned
    assert not kv.tma_ok(kk, kk, 16)
    # a size-1 dim's stride counts too (the descriptor checks every stride but the last): a
    # single key sliced from a 17-wide row has a 34-byte key stride
    one = torch.randn(1, 1, 1, 17, dtype=torch.bfloat16)[..., :16]
    assert not kv.tma_ok(one, one, 16)
    q1 = torch.randn(1, 2, 1, 16, dtype=torch.bfloat16)
    res = kv.decode_attention(q1, one, one, small(splits=1, tma=True), out=common.poison_(torch.empty_like(q1)))
    assert kv.rel_error(res, kv.reference(q1, one, one)) <= kv.TOLERANCE[torch.bfloat16]
    # the pointer path runs when TMA is asked for and impossible (D 48: not a power of two)
    run_checked(1, 2, 1, 1, 40, 48, torch.bfloat16, small(splits=2, tma=True))


def test_last_arriver_combines_many_splits_in_chunks():
    # 8 rows x D 32 on 1 warp: the last arriver loads 8 splits at once (2048 / (8 x 32)), so
    # 37 splits take 5 steps with a ragged last one
    run_checked(1, 8, 1, 1, 37 * 16, 32, torch.float32, small(splits=37, warps=1))
    run_checked(1, 8, 1, 1, 37 * 16, 32, torch.float32, small(splits=37, warps=4))
    assert_counters_clean()


def test_one_split_stores_directly():
    run_checked(1, 4, 2, 2, 50, 32, torch.float16, small(splits=1))


def test_strided_cache_and_scale():
    run_checked(2, 4, 2, 1, 90, 32, torch.float16, small(), layout="bshd", scale=0.3)


@pytest.mark.parametrize("D", [64, 48])
def test_head_dims(D):
    # 48 is not a power of two: masked loads along D
    run_checked(1, 2, 1, 1, 40, D, torch.bfloat16, small(splits=2))


def test_deterministic_and_both_combines_agree():
    config = small(splits=4)
    first, (q, k, v) = run_checked(1, 4, 1, 2, 120, 16, torch.float32, config, seed=3)
    assert torch.equal(first, kv.decode_attention(q, k, v, config))
    other = kv.decode_attention(q, k, v, small(splits=4, combine="kernel"))
    assert torch.allclose(first, other, rtol=1e-5, atol=1e-6)



def stream(per_sm, block_n=16, tma=False):
    return kv.Config(BLOCK_N=block_n, num_stages=2, stream=True, CTAS_PER_SM=per_sm, tma=tma)


@pytest.mark.parametrize("dims, per_sm", [
    ((1, 8, 2, 1, 300, 32), 3),  # 2 units x 19 groups on 12 programs: every unit cut 6-7 ways
    ((2, 8, 2, 3, 1000, 32), 5),  # causal Lq 3, 4 units of 63 groups over 20 programs
    ((3, 6, 3, 1, 77, 16), 40),  # more programs than groups: one 16-key group each, 5 per unit
    ((1, 4, 2, 2, 33, 64), 1),  # 4 programs over 2 units of 3 groups: programs cross units
    ((2, 8, 1, 1, 513, 48), 7),  # D not a power of two; 28 programs over 2 units of 33 groups
    ((1, 64, 1, 2, 200, 32), 1),  # 128 rows in two row blocks (two units of one kv-head)
])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=str)
def test_stream_schedule(dims, per_sm, dtype, monkeypatch):
    # equal shares of all (unit, key) work per program, partials combined by the last arriver
    monkeypatch.setenv("ADVISOR_NUM_SMS", "4")
    run_checked(*dims, dtype, stream(per_sm))
    assert_counters_clean()


def test_stream_schedule_tma_strided_and_deterministic(monkeypatch):
    monkeypatch.setenv("ADVISOR_NUM_SMS", "3")
    run_checked(2, 8, 2, 3, 333, 32, torch.bfloat16, stream(2, block_n=32, tma=True), layout="bshd")
    first, (q, k, v) = run_checked(1, 4, 1, 2, 120, 16, torch.float32, stream(2), seed=3)
    assert torch.equal(first, kv.decode_attention(q, k, v, stream(2)))
    # a unit walked by one program alone (2 programs, 2 units) is stored directly, no partials
    run_checked(2, 4, 1, 1, 64, 32, torch.float16, stream(1, block_n=32))
    assert_counters_clean()


def test_stream_segments_bound():
    # the partials' stride: the most programs any unit meets, checked against the walk itself
    for groups, units, programs in ((19, 2, 12), (63, 4, 20), (5, 9, 45), (3, 2, 4), (8192, 64, 132), (1, 7, 3)):
        total = units * groups
        programs = min(programs, total)
        owner = [max(p for p in range(programs) if p * total // programs <= x) for x in range(total)]
        most = max(len({owner[x] for x in range(u * groups, (u + 1) * groups)}) for u in range(units))
        assert most <= kv.stream_segments(groups, total, programs), (groups, units, programs)
    with pytest.raises(ValueError, match="stream=True"):
        kv.Config(stream=True, NUM_SPLITS=4)
    with pytest.raises(ValueError, match="stream=True"):
        kv.Config(stream=True, combine="kernel")
    assert "2/SM" in kv.Config(stream=True, CTAS_PER_SM=2).describe()

def test_default_config_runs():
    # the rule on the test's 3 SMs: one kv-head's program would fill a third of 6 slots -> split
    q, k, v = kv.random_inputs(1, 4, 1, 1, 700, 32, torch.float16, DEVICE, seed=5)
    config = kv.default_config(1, 4, 1, 1, 700, 32, torch.float16, kv.num_sms())
    assert config.NUM_SPLITS > 1
    out = kv.decode_attention(q, k, v)
    assert kv.rel_error(out, kv.reference(q, k, v)) <= kv.TOLERANCE[torch.float16]


def test_search_space_configs_run():
    space = kv.search_space(1, 4, 2, 1, 300, 32, torch.float16, 3)
    assert 2 <= len(space) <= 12 and space[0] == kv.default_config(1, 4, 2, 1, 300, 32, torch.float16, 3)
    assert {c.combine for c in space} == set(kv.COMBINES) and {c.tma for c in space} == {False, True}
    for config in space[:4]:
        run_checked(1, 4, 2, 1, 300, 32, torch.float16, config)


def test_num_splits_rule():
    # a grid at >= 80% of the slots is not split
    assert kv.num_splits_for(220, 264, 512) == 1
    # batch 1, 8 kv-heads, 2 slots on each of 132 SMs: 8 x 33 = 264 is one full wave (1.0), and
    # the smallest split within 85% of it is 29 (232 / 264 = 0.879; 28 gives 0.848)
    assert kv.num_splits_for(8, 264, 512) == 29
    # capped by the key blocks (S / MIN_CHUNK): 8192 keys in 256-key chunks allow 32; 17..31
    # splits would run as 16 chunks of 2 blocks (not eligible), so 32 (0.97) it is
    assert kv.num_splits_for(8, 264, 32) == 32
    assert kv.num_splits_for(8, 264, 4) == 4
    # one unit on 3 SMs (the tests' count): 3 splits fill the wave
    assert kv.num_splits_for(1, 3, 100) == 3
    # with keys to spare (every split count gives other chunk sizes) the pick fills >= 85% of
    # the best efficiency
    for units in (1, 3, 8, 16, 40, 64):
        s = kv.num_splits_for(units, 264, 10**6)
        eff = units * s / (math.ceil(units * s / 264) * 264)
        best = max(units * t / (math.ceil(units * t / 264) * 264) for t in range(1, 129))
        assert eff >= 0.85 * best - 1e-9, (units, s, eff, best)


def test_default_config_on_the_h200_suite():
    # bf16, 32 query heads, 8 kv-heads, D 128 on 132 SMs: each shape of the table gets its own
    # point's knobs and programs per SM back, and every chunk keeps >= 128 keys
    tuning = load("split_kv_tuning")
    for B in (1, 2, 4, 8):
        for S in (8192, 32768, 131072):
            c = kv.default_config(B, 32, 8, 1, S, 128, torch.bfloat16, 132)
            point = tuning.nearest_point(B * 8, S)
            assert (point["units"], point["S"]) == (B * 8, S)
            assert tuple(getattr(c, k) for k in tuning.TABLE_KNOBS) == tuple(tuning.point_knobs(point).values())
            if c.stream:  # whole SMs: the point's programs per SM, no split count
                assert (c.CTAS_PER_SM, c.NUM_SPLITS) == (point["programs_per_sm"], 0), (B, S, c)
                continue
            splits, per = kv.split_plan(S, c.NUM_SPLITS, kv.key_align(c, c.tma))
            assert per >= 128, (B, S, c)
            assert abs(B * 8 * splits - point["programs_per_sm"] * 132) <= B * 8, (B, S, c)
            assert c.smem_bytes(128, torch.bfloat16) <= common.SMEM_PER_BLOCK_SM90
    # batch 64 x 8 kv-heads = 512 programs already fill the GPU: no split
    assert kv.default_config(64, 32, 8, 1, 8192, 128, torch.bfloat16, 132).NUM_SPLITS == 1
    # other head dims and dtypes keep the tile's bytes (so they fit as the measured point did),
    # except where that would pass the 128-key cap on tiles (D 64 from a 128-key point)
    ref = kv.default_config(1, 32, 8, 1, 32768, 128, torch.bfloat16, 132)
    ref_bytes = ref.smem_bytes(128, torch.bfloat16)
    for D, dtype in ((64, torch.bfloat16), (256, torch.bfloat16), (128, torch.float32), (256, torch.float32)):
        c = kv.default_config(1, 32, 8, 1, 32768, D, dtype, 132)
        want = ref_bytes if ref.BLOCK_N * 128 * 2 // (D * dtype.itemsize) <= 128 else c.smem_bytes(D, dtype)
        assert c.smem_bytes(D, dtype) == want <= ref_bytes <= common.SMEM_PER_BLOCK_SM90, (D, dtype, c)
        assert c.BLOCK_N == min(128, ref.BLOCK_N * 128 * 2 // (D * dtype.itemsize)), (D, dtype, c)


def test_validation():
    f16 = torch.float16
    q = torch.randn(1, 4, 1, 32, dtype=f16, device=DEVICE)
    k = torch.randn(1, 2, 10, 32, dtype=f16, device=DEVICE)
    with pytest.raises(ValueError, match="multiple of kv heads"):
        kv.decode_attention(torch.randn(1, 3, 1, 32, dtype=f16, device=DEVICE), k, k)
    with pytest.raises(ValueError, match="1..16 query positions"):
        kv.decode_attention(torch.randn(1, 4, 17, 32, dtype=f16, device=DEVICE), k.repeat(1, 1, 4, 1), k.repeat(1, 1, 4, 1))
    with pytest.raises(ValueError, match="KV length 2 < query length 3"):
        kv.decode_attention(torch.randn(1, 4, 3, 32, dtype=f16, device=DEVICE), k[:, :, :2], k[:, :, :2])
    with pytest.raises(ValueError, match="head_dim 8"):
        kv.decode_attention(q[..., :8], k[..., :8], k[..., :8])
    with pytest.raises(ValueError, match="4-D"):
        kv.decode_attention(q[0], k, k)
    with pytest.raises(ValueError, match="one shape"):
        kv.decode_attention(q, k, k[:, :, :5])
    with pytest.raises(TypeError, match="share a dtype"):
        kv.decode_attention(q, k.float(), k.float())
    with pytest.raises(TypeError, match="not supported"):
        kv.decode_attention(q.double(), k.double(), k.double())
    with pytest.raises(ValueError, match="expected q's"):
        kv.decode_attention(q, k, k, out=torch.empty(1, 4, 2, 32, dtype=f16, device=DEVICE))
    with pytest.raises(ValueError, match="finite"):
        kv.decode_attention(q, k, k, small(), scale=float("nan"))
    with pytest.raises(ValueError, match="power of two"):
        kv.Config(BLOCK_N=48)
    with pytest.raises(ValueError, match="NUM_SPLITS"):
        kv.Config(NUM_SPLITS=-1)
    with pytest.raises(ValueError, match="combine"):
        kv.Config(combine="atomic")
    with pytest.raises(ValueError, match="tma"):
        kv.Config(tma=1)
