"""How kernels/split_kv_attention.py picks its knobs: the split rules, the measured table its
default config comes from, and the candidates bench/bench_split_kv.py --sweep times.

Pure Python (no torch, no triton), so that the rules can be read and tested anywhere.

The default config is the nearest measured point of TABLE (by log distance in work units, the
programs one split would launch, and in KV length), its knobs carried over and its split
count re-derived for the shape from the programs per SM that point ran. TABLE is written by
`python bench/bench_split_kv.py --apply-table FILE` from a sweep's split_kv_table.json, between
the BEGIN/END markers below; edit it by hand only to drop a point.
"""

from __future__ import annotations

import math

SPLIT_ALIGN = 16  # chunk boundaries fall on multiples of this many keys (of BLOCK_N with TMA loads)
# Fewest keys a chunk keeps on average: two 64-key tiles. The first measured runs capped chunks
# at 256 keys, which held batch 1 at 8k keys to 256 programs; the sweep tries more, shorter ones.
MIN_CHUNK_KEYS = 128
SMEM_PER_SM = 232448  # sm_90: 227 KB of shared memory a block may opt into


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def rows_per_program(group: int, lq: int, block_h: int) -> int:
    """Query rows a program holds: the group's heads x Lq, at least 16, at most BLOCK_H."""
    return min(block_h, pow2(max(16, group * lq)))


def work_units(B: int, Hq: int, Hkv: int, Lq: int, block_h: int = 64) -> int:
    """Programs one split launches: batch x kv-heads x row blocks."""
    return B * Hkv * cdiv((Hq // Hkv) * Lq, rows_per_program(Hq // Hkv, Lq, block_h))


def num_splits_for(units: int, slots: int, key_blocks: int, max_splits: int = 128, keep: float = 0.85) -> int:
    """FlashAttention's split heuristic: `units` programs without a split (batch x kv-heads x
    row blocks) on `slots` program slots (SMs x programs per SM). A grid already filling 80% of
    the slots is not split; otherwise, over splits 1..min(max_splits, slots, key_blocks), the
    smallest split whose wave efficiency n / (ceil(n / slots) x slots), n = units x split, is
    at least `keep` of the best. Splits that give every program the same number of key
    blocks as one split fewer are skipped (they only add programs). advisor/symptoms/attention.py holds
    the same rule for the advice it prints about libraries' split knobs."""
    units, slots, key_blocks = max(1, units), max(1, slots), max(1, key_blocks)
    if units >= 0.8 * slots:
        return 1
    top = max(1, min(max_splits, slots, key_blocks))

    def eligible(s: int) -> bool:
        return s == 1 or cdiv(key_blocks, s) != cdiv(key_blocks, s - 1)

    eff = {s: units * s / (cdiv(units * s, slots) * slots) for s in range(1, top + 1) if eligible(s)}
    best = max(eff.values())
    return min(s for s, e in eff.items() if e >= keep * best)


def fill_splits(units: int, sms: int, programs_per_sm: float, S: int, min_chunk: int = MIN_CHUNK_KEYS,
                max_splits: int = 128) -> int:
    """The split count that launches about programs_per_sm x sms programs: ceil(target / units),
    at most S / min_chunk (chunks of >= min_chunk keys on average) and max_splits. With chunks
    cut at SPLIT_ALIGN keys (whole tiles with TMA loads, at most 128 keys) every program walks
    the same number of keys to within one group, so the programs are of about equal cost and a
    target of whole SMs fills whole waves."""
    target = max(1, round(programs_per_sm * sms))
    return max(1, min(cdiv(target, max(1, units)), max(1, S // min_chunk), max_splits))


def pipeline_bytes(block_n: int, stages: int, head_dim: int, elt: int, tma: bool) -> int:
    """Shared memory of a program's K/V pipeline: num_stages - 1 tiles of K and of V in flight,
    with pointer loads and TMA alike (the sm_90 compile check: 64 keys at D 128 in bf16 took
    38 / 70 / 102 KB at 2 / 3 / 4 stages either way)."""
    del tma  # same buffers either way (kept in the signature: the load path is a knob)
    return max(1, stages - 1) * 2 * block_n * pow2(head_dim) * elt


# ---------------------------------------------------------------------------------------------
# The measured table. Each point: the shape class it was measured on (units = B x Hkv x row
# blocks, S keys, bf16, D 128 on 132 SMs of sm_90; docs/split_kv.md) and the knobs that were fastest there;
# programs_per_sm = units x splits / SMs of the winner.
# BEGIN TABLE
TABLE_SOURCE = 'bench/bench_split_kv.py --sweep on 132 SMs: the fastest config per shape (rows: bench/results/split_kv/)'
TABLE = [
    {"units": 8, "S": 8192, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "combine": "last_arriver", "tma": True, "pdl": False, "stream": False, "programs_per_sm": 2},
    {"units": 8, "S": 32768, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "combine": "last_arriver", "tma": True, "pdl": False, "stream": False, "programs_per_sm": 2},
    {"units": 8, "S": 131072, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "combine": "last_arriver", "tma": True, "pdl": False, "stream": False, "programs_per_sm": 2},
    {"units": 16, "S": 8192, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "combine": "last_arriver", "tma": True, "pdl": False, "stream": True, "programs_per_sm": 2},
    {"units": 16, "S": 32768, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "combine": "last_arriver", "tma": True, "pdl": False, "stream": False, "programs_per_sm": 3},
    {"units": 16, "S": 131072, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "combine": "last_arriver", "tma": True, "pdl": False, "stream": True, "programs_per_sm": 3},
    {"units": 32, "S": 8192, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "combine": "last_arriver", "tma": True, "pdl": False, "stream": False, "programs_per_sm": 3},
    {"units": 32, "S": 32768, "BLOCK_N": 128, "num_warps": 4, "num_stages": 2, "combine": "last_arriver", "tma": True, "pdl": False, "stream": True, "programs_per_sm": 2},
    {"units": 32, "S": 131072, "BLOCK_N": 64, "num_warps": 4, "num_stages": 2, "combine": "last_arriver", "tma": True, "pdl": False, "stream": True, "programs_per_sm": 3},
    {"units": 64, "S": 8192, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "combine": "last_arriver", "tma": True, "pdl": False, "stream": False, "programs_per_sm": 1},
    {"units": 64, "S": 32768, "BLOCK_N": 128, "num_warps": 4, "num_stages": 3, "combine": "last_arriver", "tma": True, "pdl": False, "stream": True, "programs_per_sm": 1},
    {"units": 64, "S": 131072, "BLOCK_N": 64, "num_warps": 4, "num_stages": 3, "combine": "last_arriver", "tma": True, "pdl": False, "stream": True, "programs_per_sm": 3},
]
# END TABLE
TABLE_KNOBS = ("BLOCK_N", "num_warps", "num_stages", "combine", "tma", "pdl", "stream")


def point_knobs(point: dict) -> dict:
    """A table point's or sweep candidate's TABLE_KNOBS."""
    return {k: point[k] for k in TABLE_KNOBS}


def grid_knobs(units: int, S: int, sms: int, knobs: dict) -> dict:
    """The grid of a point's programs_per_sm for a shape: the split schedule's split count
    (fill_splits), or the stream schedule's programs per SM (CTAS_PER_SM, no split count)."""
    if knobs.get("stream"):
        return {"NUM_SPLITS": 0, "CTAS_PER_SM": max(1, round(knobs["programs_per_sm"]))}
    return {"NUM_SPLITS": fill_splits(units, sms, knobs["programs_per_sm"], S)}


def nearest_point(units: int, S: int, table: list[dict] | None = None) -> dict:
    """The table point closest to (units, S) in log2 distance (ties: the earlier point)."""
    table = TABLE if table is None else table

    def dist(p):
        return abs(math.log2(max(1, units) / p["units"])) + abs(math.log2(max(1, S) / p["S"]))

    return min(table, key=dist)


def table_knobs(units: int, S: int, head_dim: int, elt: int, sms: int, table: list[dict] | None = None) -> dict:
    """Knobs (Config field -> value, the grid resolved) for a shape from its nearest table
    point (a stream point only for a KV at least half as long as it was measured at): the tile keeps
    the point's bytes (BLOCK_N scales with 256 / (D x element bytes), the table being bf16 at D
    128; where the 16..128 clamp breaks that, stages and then the tile shrink until one program
    fits an SM), and the grid fills the point's programs per SM."""
    table = TABLE if table is None else table
    p = nearest_point(units, S, table)
    if p["stream"] and 2 * S < p["S"]:
        # the stream schedule's gain over the split one grows with the KV length and is a loss
        # at 8k keys (the stream sweep in docs/split_kv.md): it carries to caches down to half
        # the length it won at (nearer it than the next shorter measured one, a quarter), not
        # further; there the nearest split point does
        split = [q for q in table if not q["stream"]]
        p = nearest_point(units, S, split) if split else p
    knobs = point_knobs(p)
    scale = 256 / (pow2(head_dim) * elt)
    knobs["BLOCK_N"] = int(min(128, max(16, pow2(max(1, round(p["BLOCK_N"] * scale))))))
    while knobs["num_stages"] > 2 and pipeline_bytes(knobs["BLOCK_N"], knobs["num_stages"], head_dim, elt,
                                                     knobs["tma"]) > SMEM_PER_SM:
        knobs["num_stages"] -= 1
    while knobs["BLOCK_N"] > 16 and pipeline_bytes(knobs["BLOCK_N"], knobs["num_stages"], head_dim, elt,
                                                   knobs["tma"]) > SMEM_PER_SM:
        knobs["BLOCK_N"] //= 2
    knobs.update(grid_knobs(units, S, sms, p))
    return knobs


# ---------------------------------------------------------------------------------------------
# The sweep's candidates (bench/bench_split_kv.py --sweep): two stages of coordinate search.
# ---------------------------------------------------------------------------------------------

PROGRAMS_PER_SM = (1, 2, 3, 4, 6, 8)


def structure_candidates(head_dim: int, elt: int) -> list[dict]:
    """Stage A: the load path and the pipeline (tile keys, stages, warps, TMA or pointers),
    with the two-kernel combine and 2 programs an SM held fixed; only pipelines that fit one
    program an SM (64-key tiles up to 5 stages: 128 KB in flight). Ordered by the prediction (docs/split_kv.md): pointer loads with 64-key
    tiles first (the first run's winners), then TMA, then the rest."""
    out = []
    for tma in (False, True):
        for block_n in (64, 128):
            for stages in (3, 2, 4, 5):
                for warps in (4, 8):
                    if pipeline_bytes(block_n, stages, head_dim, elt, tma) > SMEM_PER_SM:
                        continue
                    out.append({"BLOCK_N": block_n, "num_warps": warps, "num_stages": stages, "combine": "kernel",
                                "tma": tma, "pdl": False, "stream": False, "programs_per_sm": 2})
    return out


COMBINE_CHOICES = (("last_arriver", False), ("kernel", False), ("kernel", True))  # (combine, pdl)
STREAM_PROGRAMS_PER_SM = (1, 2, 3, 4)  # the stream schedule: whole SMs, each an equal share


def balance_candidates(best: list[dict]) -> list[dict]:
    """Stage B: for each of the best structures, the stream schedule at 1-4 programs an SM
    (first: the newer schedule, never swept before), then the split schedule's combine (last
    arriver; second kernel, launched plainly or behind the split kernel by PDL) and programs
    per SM."""
    out = []
    for s in best:
        for pps in STREAM_PROGRAMS_PER_SM:
            c = dict(s, combine="last_arriver", pdl=False, stream=True, programs_per_sm=pps)
            if c not in out:
                out.append(c)
        for pps in PROGRAMS_PER_SM:
            for combine, pdl in COMBINE_CHOICES:
                c = dict(s, combine=combine, pdl=pdl, stream=False, programs_per_sm=pps)
                if c not in out:
                    out.append(c)
    return out


def candidate_knobs(units: int, S: int, sms: int, knobs: dict) -> dict:
    """A sweep candidate as Config fields: its grid resolved for the shape."""
    return {**point_knobs(knobs), **grid_knobs(units, S, sms, knobs)}
