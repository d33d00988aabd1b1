"""kernels/split_kv_tuning.py: the split-count rules, the table lookup, the sweep's candidates."""

from __future__ import annotations

from advisor.codegen.kernel_lib import load

tuning = load("split_kv_tuning")


def test_fill_splits_fills_the_target_programs():
    # batch 1 x 8 kv-heads at 2 programs an SM of 132: 33 splits, 264 programs
    assert tuning.fill_splits(8, 132, 2, 131072) == 33
    # capped by 128-key chunks (4096 keys: 32) and by 128 splits
    assert tuning.fill_splits(8, 132, 2, 4096) == 32
    assert tuning.fill_splits(1, 132, 4, 10**6) == 128
    # already past the target: no split
    assert tuning.fill_splits(600, 132, 4, 131072) == 1
    # a table point's programs per SM gives back its split count (units x splits / SMs, 2 places)
    for units, splits in ((8, 29), (16, 15), (32, 7), (64, 4), (24, 11)):
        pps = round(units * splits / 132, 2)
        assert tuning.fill_splits(units, 132, pps, 131072) == splits, (units, splits, pps)


def test_nearest_point_and_knobs_carry_over():
    table = [
        {"units": 8, "S": 8192, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "combine": "kernel", "tma": False,
         "pdl": True, "stream": False, "programs_per_sm": 2},
        {"units": 64, "S": 131072, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "combine": "last_arriver",
         "tma": True, "pdl": False, "stream": False, "programs_per_sm": 1},
    ]
    # log distance: units 12 / S 20000 is nearer (8, 8192) (0.58 + 1.29) than (64, 131072) (2.4 + 2.7)
    assert tuning.nearest_point(12, 20000, table) is table[0]
    assert tuning.nearest_point(40, 65536, table) is table[1]
    k = tuning.table_knobs(12, 20000, 128, 2, 132, table)
    assert k == {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "combine": "kernel", "tma": False, "pdl": True,
                 "stream": False, "NUM_SPLITS": 22}
    # D 64 in bf16 doubles the keys of a tile (same bytes); fp32 at D 256 quarters them and
    # keeps two programs an SM (2 x (stages - 1) x 2 x BLOCK_N x 256 x 4 <= 227 KB)
    assert tuning.table_knobs(12, 20000, 64, 2, 132, table)["BLOCK_N"] == 128
    k = tuning.table_knobs(12, 20000, 256, 4, 132, table)
    assert k["BLOCK_N"] == 16 and k["num_stages"] == 3
    # a point that ran one program an SM keeps its deep pipeline at its own shape...
    deep = [dict(table[1], BLOCK_N=128, num_stages=4)]
    assert tuning.table_knobs(64, 131072, 128, 2, 132, deep)["num_stages"] == 4
    # ...and carries its bytes to D 256 in fp32 (32-key tiles, the same 192 KB pipeline)
    k = tuning.table_knobs(64, 131072, 256, 4, 132, deep)
    assert tuning.pipeline_bytes(k["BLOCK_N"], k["num_stages"], 256, 4, True) <= tuning.SMEM_PER_SM
    assert (k["BLOCK_N"], k["num_stages"]) == (32, 4)
    # the committed table is complete and every point is a valid Config's knobs
    for p in tuning.TABLE:
        assert {"units", "S", "programs_per_sm", *tuning.TABLE_KNOBS} <= set(p)


def test_sweep_candidates():
    structures = tuning.structure_candidates(128, 2)
    assert structures[0] == {"BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "combine": "kernel", "tma": False,
                             "pdl": False, "stream": False, "programs_per_sm": 2}
    assert {s["tma"] for s in structures} == {False, True}
    assert all(tuning.pipeline_bytes(s["BLOCK_N"], s["num_stages"], 128, 2, s["tma"]) <= tuning.SMEM_PER_SM
               for s in structures)
    # 128-key tiles at 4 stages in fp32 do not fit: left out
    assert not any(s["BLOCK_N"] == 128 and s["num_stages"] == 4 for s in tuning.structure_candidates(128, 4))
    balance = tuning.balance_candidates(structures[:3])
    assert len(balance) == 3 * (len(tuning.STREAM_PROGRAMS_PER_SM) + len(tuning.PROGRAMS_PER_SM) * 3)
    # PDL only where there is a second kernel to launch early; the stream schedule only with
    # the last arriver
    assert {(c["combine"], c["pdl"], c["stream"]) for c in balance} == {
        ("last_arriver", False, True), ("last_arriver", False, False), ("kernel", False, False), ("kernel", True, False)}
    # the stream candidates come first and keep whole SMs, no split count
    assert balance[0]["stream"] and tuning.candidate_knobs(8, 8192, 132, balance[0])["CTAS_PER_SM"] == 1
    assert tuning.candidate_knobs(8, 8192, 132, balance[1])["NUM_SPLITS"] == 0
    split = next(c for c in balance if not c["stream"] and c["programs_per_sm"] == 1)
    assert tuning.candidate_knobs(8, 8192, 132, split)["NUM_SPLITS"] == 17  # 1 program an SM: ceil(132 / 8)


def test_a_stream_point_carries_down_to_half_its_length():
    # the measured stream winners lose to split configs on much shorter caches: a shape nearest a
    # stream point takes it down to half that point's KV length, below that the nearest split point
    table = [
        {"units": 32, "S": 32768, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "combine": "last_arriver",
         "tma": True, "pdl": False, "stream": True, "programs_per_sm": 2},
        {"units": 8, "S": 8192, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "combine": "last_arriver",
         "tma": True, "pdl": False, "stream": False, "programs_per_sm": 2},
    ]
    longer = tuning.table_knobs(32, 40000, 128, 2, 132, table)
    assert longer["stream"] and (longer["CTAS_PER_SM"], longer["NUM_SPLITS"], longer["BLOCK_N"]) == (2, 0, 128)
    # no cliff just below the measured length: 32000 and 16384 keys keep it
    assert tuning.table_knobs(32, 32000, 128, 2, 132, table)["stream"]
    assert tuning.table_knobs(32, 16384, 128, 2, 132, table)["stream"]
    # 12000 keys: still nearest the stream point (1.45 against 2.55), but under half its length
    assert tuning.nearest_point(32, 12000, table) is table[0]
    shorter = tuning.table_knobs(32, 12000, 128, 2, 132, table)
    assert not shorter["stream"] and shorter["BLOCK_N"] == 64 and shorter["NUM_SPLITS"] == 9  # ceil(264 / 32)
    # a table of stream points only still answers
    assert tuning.table_knobs(32, 12000, 128, 2, 132, table[:1])["stream"]
