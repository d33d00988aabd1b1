"""cluster_gemm (kernels/gluon_gemm.py): selection and fallback, config space, generated source,
and (where Triton 3.9 is unpacked at /tmp/triton39) the sm_90a compile check in a subprocess."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.codegen.generate import generate
from advisor.codegen.kernel_lib import load
from advisor.run.loop import cluster_gemm_gate, with_cluster_gemm

ROOT = Path(__file__).resolve().parents[1]
TRITON39 = Path("/tmp/triton39")
HOPPER_39 = ((3, 9), "9.0")


def test_gate_reasons():
    assert cluster_gemm_gate("bf16", (3, 9), "9.0") is None
    assert cluster_gemm_gate("fp16", (3, 10), "9.0") is None
    assert "Triton 3.6" in cluster_gemm_gate("bf16", (3, 6), "9.0")
    assert "no CUDA GPU" in cluster_gemm_gate("bf16", (3, 9), None)
    assert "sm_100" in cluster_gemm_gate("bf16", (3, 9), "10.0")
    assert "fp32" in cluster_gemm_gate("fp32", (3, 9), "9.0")
    assert "not installed" in cluster_gemm_gate("bf16", None, "9.0")


def test_joins_where_prescribed_and_allowed():
    out, why = with_cluster_gemm(["stream_k", "persistent"], "bf16", HOPPER_39)
    assert out == ["stream_k", "persistent", "cluster_gemm"] and why is None
    out, why = with_cluster_gemm(["warp_specialization"], "bf16", HOPPER_39)
    assert out[-1] == "cluster_gemm"
    # split-K territory: not prescribed, no note
    assert with_cluster_gemm(["split_k"], "bf16", HOPPER_39) == (["split_k"], None)


def test_falls_back_with_one_line_reason_under_triton_36():
    out, why = with_cluster_gemm(["stream_k", "persistent"], "bf16", ((3, 6), "9.0"))
    assert out == ["stream_k", "persistent"]
    assert "Triton >= 3.9" in why and "\n" not in why


def test_this_environment_falls_back_and_the_module_imports():
    mod = load("cluster_gemm")  # Triton 3.6 here: must import, never ImportError
    why = mod.unavailable_reason()
    if mod.triton_version() is not None and mod.triton_version() < (3, 9):
        assert why and "3.9" in why
        out, note = with_cluster_gemm(["stream_k"], "bf16")
        assert out == ["stream_k"] and note
        import torch

        with pytest.raises(RuntimeError, match="3.9"):
            mod.matmul(torch.zeros(8, 8, dtype=torch.bfloat16), torch.zeros(8, 8, dtype=torch.bfloat16))


def test_config_space():
    mod = load("cluster_gemm")
    space = mod.search_space(4096, 4096, 8192)
    tiles = {(c.BLOCK_M, c.BLOCK_N) for c in space}
    assert tiles == {(128, 128), (128, 256), (256, 128)}
    steps = {(c.ws, c.cluster, c.multicast, c.stream_k) for c in space}
    assert (True, 2, True, False) in steps and (True, 1, False, True) in steps
    assert all(c.stream_k for c in space if c.BLOCK_M == 256)  # 256x128 only where it can fill
    for c in space:
        c.validate()  # fits 227 KB
        assert c.smem_bytes() <= mod.SMEM_PER_BLOCK_SM90
    # no pairing of M tiles when there is one tile row; one-warpgroup 64-row tiles where M <= 64
    skinny = mod.search_space(64, 4096, 14336)
    assert all(c.cluster == 1 for c in skinny)
    assert (64, 128, 4) in {(c.BLOCK_M, c.BLOCK_N, c.num_warps) for c in skinny}
    # whole waves: no Stream-K config (it would be the data-parallel schedule again)
    assert not any(c.stream_k for c in mod.search_space(128 * 132, 128, 4096) if (c.BLOCK_M, c.BLOCK_N, c.cluster) == (128, 128, 1))
    with pytest.raises(ValueError, match="multicast"):
        mod.Config(cluster=1, multicast=True)
    with pytest.raises(ValueError, match="ws=True"):
        mod.Config(ws=False, cluster=2, multicast=True)
    with pytest.raises(ValueError, match="ws=True"):
        mod.Config(ws=False, cluster=1, multicast=False, stream_k=True)
    with pytest.raises(ValueError, match="shared memory"):
        mod.Config(128, 256, 64, 6).validate()


def test_model_picks_stream_k_for_partial_waves_and_split_k_for_skinny():
    from kernels.gluon_gemm_configs import default_config, estimate_us, sk_plan

    # 143 tiles of 128x128 on 132 SMs: data-parallel costs two tile-times, Stream-K ~1.1
    d = default_config(1664, 1408, 8192)
    assert d.stream_k
    dp = estimate_us(d.__class__(**{**d.as_dict(), "stream_k": False}), 1664, 1408, 8192)
    assert estimate_us(d, 1664, 1408, 8192) < 0.8 * dp
    # 4 tiles, 2048 K steps: split-K over every SM
    d = default_config(256, 256, 131072)
    assert d.stream_k
    assert sk_plan(4, 2048, 132, True) == (4, 132)
    # whole waves need no split; hybrid: the last partial wave's tiles only
    assert sk_plan(264, 128, 132, True) == (0, 1)
    assert sk_plan(143, 128, 132, True) == (11, 132)
    assert sk_plan(143, 128, 132, False) == (0, 1)


@pytest.mark.parametrize("M,N,K,bm,bn,progs", [
    (1000, 1304, 776, 128, 128, 132),  # 88 tiles < 132: every tile split
    (200, 392, 72, 128, 128, 132),  # 2 K steps: more programs than steps
    (1664, 1408, 8192, 128, 128, 132),  # hybrid: 132 whole tiles + 11 split
    (2176, 2176, 8200, 256, 128, 66),  # cluster tiles on 66 programs, K % 64 != 0
    (96, 80, 4096, 64, 64, 7),  # few programs: ranges spanning several tiles
    (130, 70, 640, 64, 64, 5),
])
def test_stream_k_plan_replayed_on_cpu_equals_matmul(M, N, K, bm, bn, progs):
    """The work list and fixup arithmetic the Gluon kernels run, replayed with torch on CPU:
    every K step of every tile is computed exactly once, every split tile's partials are in the
    slots the fixup reads, no slot is written twice."""
    import torch

    from kernels.gluon_gemm_configs import cdiv, contributors, segments, sk_plan

    g = torch.Generator().manual_seed(0)
    a = torch.randn(M, K, generator=g, dtype=torch.float64)
    b = torch.randn(K, N, generator=g, dtype=torch.float64)
    bk = 64
    npm, npn = cdiv(M, bm), cdiv(N, bn)
    tiles, iters = npm * npn, cdiv(K, bk)
    s, skp = sk_plan(tiles, iters, progs, True)
    assert s > 0
    c = torch.full((M, N), float("nan"), dtype=torch.float64)
    slots: dict[int, torch.Tensor] = {}

    def coords(t):  # row-major here; the kernels' grouped order is a bijection of the same indices
        return (t // npn) * bm, (t % npn) * bn

    def part(t, k0, k1):
        m0, n0 = coords(t)
        return a[m0:m0 + bm, k0 * bk:k1 * bk] @ b[k0 * bk:k1 * bk, n0:n0 + bn]

    for p in range(progs):
        for t, k0, k1, slot in segments(p, tiles, s, iters, skp):
            m0, n0 = coords(t)
            if slot is None:
                assert k0 == 0 and k1 == iters
                c[m0:m0 + bm, n0:n0 + bn] = part(t, k0, k1)
            else:
                assert slot not in slots and slot // 2 == p
                slots[slot] = part(t, k0, k1)
        for t in range(p, tiles - s, progs):
            m0, n0 = coords(t)
            c[m0:m0 + bm, n0:n0 + bn] = part(t, 0, iters)
    read = []
    for t_local in range(s):
        ids = contributors(t_local, s, iters, skp)
        if ids:
            m0, n0 = coords(tiles - s + t_local)
            c[m0:m0 + bm, n0:n0 + bn] = sum(slots[i] for i in ids)
            read += ids
    assert sorted(read) == sorted(slots)  # every partial read once, none missing
    torch.testing.assert_close(c, a @ b)


def test_generated_source_parses_and_names_knobs(tmp_path):
    v = generate("cluster_gemm", 2304, 2304, 4096, path=tmp_path / "v.py")
    tree = ast.parse(v.source)
    assert "STRATEGY = 'cluster_gemm'" in v.source or 'STRATEGY = "cluster_gemm"' in v.source
    for knob in ("BLOCK_M", "BLOCK_N", "STAGES", "ws", "cluster", "multicast"):
        assert f"'{knob}'" in v.source or f'"{knob}"' in v.source
        assert knob in v.knobs
    assert any(isinstance(n, ast.FunctionDef) and n.name == "variant_matmul" for n in tree.body)
    assert "multicast=MULTICAST" in v.source  # the Gluon kernel travels with the file
    # the model cannot price clusters: the full design is what it picks among equal tiles
    assert v.knobs["ws"] and v.knobs["cluster"] == 2 and v.knobs["multicast"]
    v2 = generate("cluster_gemm", 2304, 2304, 4096, knobs={"cluster": 1, "multicast": False})
    assert v2.knobs["cluster"] == 1


@pytest.mark.slow
@pytest.mark.skipif(not (TRITON39 / "triton").is_dir(), reason="Triton 3.9 not unpacked at /tmp/triton39")
def test_sm90_compile_check_under_triton_39():
    # 2176^2 with K = 8200: hybrid Stream-K (a partial last wave), K not a multiple of BLOCK_K
    # an H100/H200's 132 SMs (the tests' 3 would leave 33x264x20000's 3 tiles one whole wave)
    env = dict(os.environ, PYTHONPATH=f"{TRITON39}:{ROOT}", TRITON_DEFAULT_FP_FUSION="1", ADVISOR_NUM_SMS="132")
    env.pop("TRITON_INTERPRET", None)
    # and 33x264x20000: split-K of 3 tiles over every SM, whose fixup is the wide one
    r = subprocess.run([sys.executable, "-m", "kernels.gluon_compile_check", "--shapes", "2176x2176x8200",
                        "33x264x20000"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("ok")]
    main = [ln for ln in lines if "_ws_kernel" in ln]
    assert len(main) >= 10 and any(" sk " in ln for ln in main)
    assert any("_sk_fixup_kernel" in ln for ln in lines)
    assert any("_sk_fixup_wide_kernel" in ln and "33x264x20000" in ln for ln in lines)
    mc = [ln for ln in main if "c2+mc" in ln]
    assert mc and all("multicast" in ln and "wgmma" in ln and "cluster" in ln for ln in mc)
    assert all("stack=0" in ln for ln in lines)


def test_bench_plan_shards_and_table():
    """bench/bench_cluster_gemm.py's CPU side: every timed shape has Stream-K configs where its
    tiles leave a partial wave, the verify shards partition the configs, and the table reads
    the rows (model pick and the Stream-K steps included)."""
    sys.path.insert(0, str(ROOT))
    import json

    from bench import bench_cluster_gemm as bcg

    for suite, (M, N, K) in bcg.plan(False):
        space = bcg.configs_for(M, N, K, False)
        assert space, (M, N, K)
        if suite != "balanced":
            assert any(c.stream_k for c in space), (M, N, K)
        shards = [bcg.hash_shard(c, 6) for c in space]
        assert all(0 <= x < 6 for x in shards)
    quick = [c for _, (M, N, K) in bcg.plan(True) for c in bcg.configs_for(M, N, K, True)]
    assert quick and any(c.BLOCK_M == 64 for c in quick)
    cfg = bcg.configs_for(1664, 1408, 8192, False)[0]
    rows = [
        {"suite": "tail", "shape": "1664x1408x8192", "provider": "torch.matmul", "step": "", "config": "{}",
         "status": "ok", "median_us": 60.0},
        {"suite": "tail", "shape": "1664x1408x8192", "provider": "cluster_gemm", "step": bcg._step_of(cfg),
         "config": json.dumps(cfg.as_dict()), "model_pick": 1, "status": "ok", "median_us": 50.0},
    ]
    md = bcg.markdown(rows)
    assert "| tail | 1664x1408x8192 | 60.0 |" in md and "1.200x" in md
    assert "ws_c2_mc_sk" in md and "model pick" in md


def test_generate_ranks_with_the_schedules_own_model():
    """advisor generate's pick for cluster_gemm is the schedule's own estimate's (its Stream-K
    plan priced), not the generic wave model's: 1664x1408 gets the split 128x128 tiles."""
    from kernels.gluon_gemm_configs import default_config

    for shape in ((1664, 1408, 8192), (256, 256, 131072), (4096, 4096, 8192)):
        v = generate("cluster_gemm", *shape)
        d = default_config(*shape)
        assert {k: v.knobs[k] for k in d.as_dict()} == d.as_dict(), shape
    assert generate("cluster_gemm", 1664, 1408, 8192).knobs["stream_k"]


def test_fixup_geometry_spreads_many_way_splits():
    """Few contributors a split tile (the hybrid's last wave): 16-row fixup programs, 8 slots in
    flight; a split-K of one tile over every SM: 4-row programs with more slots in flight, so
    that 132 contributors take 5 rounds of loads, not 17. Loads in flight a thread stay within
    FIXUP_REGS registers either way."""
    from kernels.gluon_gemm_configs import (FIXUP_REGS, FIXUP_UNROLL, FIXUP_WARPS, FIXUP_WIDE_WARPS, cdiv,
                                            fixup_geometry)

    assert fixup_geometry(11, 132, 128) == (16, FIXUP_UNROLL, 1)  # 1664x1408x8192: 13 contributors at most
    rb, unroll, ways = fixup_geometry(1, 132, 128)  # 32x32x131072 on one 64x128 tile
    assert ways == FIXUP_WIDE_WARPS and cdiv(133, unroll * ways) <= 5
    for s, skp, bn in [(1, 132, 256), (2, 66, 128), (11, 132, 256), (4, 132, 64), (88, 132, 128)]:
        rb, unroll, ways = fixup_geometry(s, skp, bn)
        threads = (FIXUP_WARPS if ways == 1 else FIXUP_WIDE_WARPS) * 32
        per_slot = max(1, rb * bn * ways // threads)  # a thread's elements of one load round
        # loads in flight plus (wide) the W-way accumulator stay within the register budget
        assert per_slot * unroll + (per_slot if ways > 1 else 0) <= FIXUP_REGS
