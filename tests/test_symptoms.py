"""Symptoms and rules on hand-built traces, with the expected numbers worked out here."""

from __future__ import annotations

import math
import re

import pytest
from synthetic import H100, back_to_back, kernel, launch, make_trace, nvtx

from advisor.symptoms.calibration import is_library_kernel, reached
from advisor.diagnose.diagnosis import diagnose
from advisor.rules import load_rules
from advisor.report.render import render
from advisor.symptoms import Context
from advisor.symptoms.gemm import parse_cpu_op, parse_range_text, tile_from_name
from advisor.symptoms.intervals import merge, overlap, total
from advisor.symptoms.occupancy import occupancy


def by_symptom(d, symptom):
    return [f for f in d.findings if f.symptom == symptom]


# ----------------------------------------------------------------------------- occupancy


def test_occupancy_limits_and_both_wave_models():
    # 256 threads = 8 warps; 128 regs -> 4096 regs/warp -> 16 warps by registers -> 2 blocks.
    # smem 100 KiB + 1 KiB reserved -> 233472 // 104448 = 2 blocks. warps: 64 // 8 = 8.
    t = make_trace([kernel(0, 82_000, grid=(143, 1, 1), regs=128, smem=100 * 1024)])
    occ = occupancy(t).iloc[0]
    assert occ["blocks_per_sm"] == 2
    assert occ["occupancy_limiter"] in ("registers", "shared_memory")
    assert occ["waves"] == pytest.approx(143 / (132 * 2))
    assert occ["waves_sat"] == pytest.approx(143 / 132)
    assert occ["tail_efficiency_sat"] == pytest.approx((143 / 132) / 2)


def test_occupancy_register_rounding_and_warp_limit():
    # 1024 threads = 32 warps; 40 regs -> 1280 regs/warp -> 51 warps by regs -> 1 block.
    t = make_trace([kernel(0, 1000, grid=(10, 1, 1), block=(1024, 1, 1), regs=40)])
    occ = occupancy(t).iloc[0]
    assert occ["blocks_per_sm"] == 1 and occ["occupancy_limiter"] == "registers"
    # 64 threads, 16 regs: 2 warps/block -> 32 by warps, 32 by device limit -> 32.
    t = make_trace([kernel(0, 1000, grid=(10, 1, 1), block=(64, 1, 1), regs=16)])
    assert occupancy(t).iloc[0]["blocks_per_sm"] == 32


def test_occupancy_unknown_without_sm_count():
    dev = dict(H100, name="Mystery GPU", sm_count=None, sm_count_source=None)
    t = make_trace([kernel(0, 1000, grid=(500, 1, 1))], devices=[dev])
    occ = occupancy(t).iloc[0]
    assert math.isnan(occ["waves"])
    assert any("SM count unknown" in n for n in t.meta["notes"])


# ----------------------------------------------------------------------------- GEMM facts


@pytest.mark.parametrize(
    "name, tile",
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_segment_k_off_kernel", (128, 256, 64)),
        ("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopB_NNT", (320, 128, 64)),
        ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN", (128, 256, 64)),
        ("cutlass3x_sm90_tensorop_gemm_bf16_bf16_f32_bf16_bf16_256x128x64_1x2x1_0_tnn_align8_warpspecialized_cooperative_epi_tma", (256, 128, 64)),
        ("cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_256x128_32x3_nn_align8", (256, 128, 32)),
        ("ampere_sgemm_128x64_nn", (128, 64, None)),
        ("Cijk_Ailk_Bljk_BBS_BH_MT128x128x64_MI32x32x8x1_SN_1LDSB0", (128, 128, 64)),
        ("vectorized_elementwise_kernel", None),
    ],
)
def test_tile_from_name(name, tile):
    assert tile_from_name(name) == tile


@pytest.mark.parametrize(
    "name, gemm",
    [
        # torch.compile (Inductor) template GEMMs: `triton_tem_fused_<ops>_<n>`
        ("triton_tem_fused_addmm_0", True),
        ("triton_tem_fused_addmm_relu_0", True),
        ("triton_tem_fused_addmm_native_layer_norm_view_1", True),
        ("triton_tem_fused_mm_t_view_14", True),
        ("triton_tem_fused_bmm_3", True),
        # Inductor pointwise / reduction kernels name the ops they fuse, GEMMs among them
        # (the bias add or activation after an extern cuBLAS mm): they are not GEMMs
        ("triton_poi_fused_addmm_relu_1", False),
        ("triton_per_fused_addmm_mean_relu_sub_1", False),
        ("triton_poi_fused_mm_0", False),
        ("triton_red_fused__to_copy_mm_sum_2", False),
        # flex attention is a template too, but no GEMM
        ("triton_tem_fused_0", False),
        # attention kernels run GEMMs inside, but are not GEMMs to re-schedule: cuDNN's SDPA
        # (as on the H200, wgmma in its name), FlashAttention 2/3, PyTorch's memory-efficient
        ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1_cga1x1x1_kernel0_0", False),
        ("void flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4, false, false, cutlass::bfloat16_t>>(Flash_fwd_params)",
         False),
        ("void flash::FlashAttnFwdSm90<flash::CollectiveMainloopFwdSm90<2, cute::tuple<>>>(Params)", False),
        ("fmha_cutlassB_bf16_aligned_64x64_k64_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<cutlass::arch::Sm80>)",
         False),
    ],
)
def test_inductor_kernel_names(name, gemm):
    ctx = Context(make_trace([kernel(0, 10_000, name=name, grid=(64, 1, 1))]))
    assert bool(ctx.kernels.loc[0, "is_gemm"]) is gemm


def test_shape_parsers():
    s = parse_range_text("aten::mm, seq = 0, op_id = 1, sizes = [[4096, 1024], [1024, 512]], input_op_ids = [(0, 0)]")
    assert (s["M"], s["N"], s["K"]) == (4096, 512, 1024)
    s = parse_range_text("aten::addmm, seq = 3, sizes = [[512], [64, 1024], [1024, 512]]")
    assert (s["M"], s["N"], s["K"]) == (64, 512, 1024)
    s = parse_range_text("advisor.gemm M=256 N=128 K=131072 dtype=bf16 split_k")
    assert (s["M"], s["N"], s["K"], s["dtype"]) == (256, 128, 131072, "bf16")
    assert parse_range_text("advisor.gemm M=abc N=1 K=1") is None
    assert parse_range_text("aten::mm, sizes = [[2, 3], [4, 5]]") is None  # inner dims differ
    s = parse_cpu_op("aten::linear", "[[8, 128, 1024], [4096, 1024], [4096]]", '["c10::BFloat16", "c10::BFloat16", "c10::BFloat16"]')
    assert (s["M"], s["N"], s["K"], s["dtype"]) == (8 * 128, 4096, 1024, "bf16")
    # MI300's fp8 (torch.float8_e4m3fnuz) is fp8 too
    s = parse_cpu_op("aten::_scaled_mm", "[[4096, 8192], [8192, 1024], [], []]", '["c10::Float8_e4m3fnuz", "c10::Float8_e4m3fnuz", "float", "float"]')
    assert (s["M"], s["N"], s["K"], s["dtype"]) == (4096, 1024, 8192, "fp8")
    s = parse_cpu_op("aten::bmm", "[[12, 64, 32], [12, 32, 128]]", None)
    assert (s["M"], s["N"], s["K"], s["batch"]) == (64, 128, 32, 12)


def test_innermost_range_gives_the_shape():
    ks = [kernel(10_000, 5_000, name="kernel_0", corr=1), kernel(30_000, 5_000, name="other_kernel", corr=2)]
    rt = [launch(1, 1_000), launch(2, 20_000)]
    ranges = [
        nvtx("aten::linear, seq = 1, sizes = [[64, 1024], [512, 1024], [512]]", 0, 25_000),
        nvtx("aten::addmm, seq = 2, sizes = [[512], [64, 1024], [1024, 512]]", 500, 5_000),
    ]
    ctx = Context(make_trace(ks, runtime=rt, ranges=ranges))
    g = ctx.kernels
    assert (g.loc[0, "M"], g.loc[0, "N"], g.loc[0, "K"]) == (64, 512, 1024)
    assert g.loc[0, "op"].startswith("aten::addmm") and g.loc[0, "is_gemm"]
    # The second launch sits only in the outer linear range.
    assert g.loc[1, "op"].startswith("aten::linear")


def test_intervals():
    ms, me = merge([0, 5, 20, 22], [10, 12, 25, 30])
    assert list(ms) == [0, 20] and list(me) == [12, 30]
    assert total([0, 5, 20, 22], [10, 12, 25, 30]) == 22
    assert list(overlap([-5, 11, 25], [1, 21, 40], ms, me)) == [1, 2, 5]


# ----------------------------------------------------------------------------- rules


def test_tail_wave_on_143_tiles_and_not_on_132():
    tail = [kernel(i * 100_000, 82_000, grid=(11, 13, 1), name="matmul_kernel") for i in range(10)]
    d = diagnose(make_trace(tail))
    (f,) = by_symptom(d, "tail_wave")
    assert f.strategy == "stream_k" and f.launches == 10
    eff = (143 / 132) / 2
    assert f.evidence["tail_efficiency_sat"] == pytest.approx(eff, abs=1e-3)
    # perfect balance would give 820 us x (1 - eff); without a shape the cap is the best our
    # Stream-K reached over our dp kernel on the tail suite (1.34x: 25%), so confidence is medium
    assert f.evidence["model_ns"] == int(820_000 * (1 - eff))
    assert f.est_savings_ns == pytest.approx(820_000 * (1 - 1 / 1.34), rel=0.01)
    assert f.suggestion["tail_tiles"] == 11 and f.confidence == "medium"

    balanced = [kernel(i * 100_000, 62_000, grid=(12, 11, 1), name="matmul_kernel") for i in range(10)]
    assert by_symptom(diagnose(make_trace(balanced)), "tail_wave") == []


def test_tail_uses_tiles_from_shape_for_persistent_cublas():
    # A persistent nvjet kernel has grid = #SMs, but the shape says 3072^2 / (128x256) = 288 tiles.
    name = "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NTN"
    ks = [kernel(i * 300_000, 200_000, grid=(132, 1, 1), name=name, corr=i + 1) for i in range(5)]
    rt = [launch(i + 1, i * 300_000 - 5_000) for i in range(5)]
    rg = [nvtx("advisor.gemm M=3072 N=3072 K=4096 dtype=bf16", i * 300_000 - 6_000, i * 300_000 - 1_000) for i in range(5)]
    trace = make_trace(ks, runtime=rt, ranges=rg)
    k = Context(trace).kernels
    assert int(k["tiles"].iloc[0]) == 288
    # 2.18 waves, a tail; but it is cuBLAS, which our Stream-K does not beat on tail shapes
    # (rules/measured/h200.toml): a note that says so, not a finding
    d = diagnose(trace)
    assert by_symptom(d, "tail_wave") == []
    assert any(n.startswith("tail_wave: nvjet_hsh_128x256") and "288 tiles on 132 SMs" in n for n in d.notes)


@pytest.mark.parametrize(
    "name, grid, tiles",
    [
        # cuBLAS (column-major) runs PyTorch's C = A @ B as C^T = B^T A^T: its 128x192 tile is
        # 128 along N and 192 along M, ceil(1024/128) x ceil(3072/192) = 128 = the grid
        ("nvjet_sm90_tst_128x192_64x5_2x1_v_bz_coopB_NTN", (2, 64, 1), 128),
        # a persistent grid tells neither way: the library's convention
        ("nvjet_sm90_tst_128x192_64x5_2x1_v_bz_coopB_NTN", (132, 1, 1), 128),
        # split-K: the grid is 3 x the swapped count and no multiple of the named one (144)
        ("nvjet_sm90_tst_128x192_64x5_2x1_v_bz_splitK_NTN", (384, 1, 1), 128),
        # the grid outweighs the convention: a cuBLAS name on a grid of the named count
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize128x192x64_warpgroupsize1x1x1", (144, 1, 1), 144),
        # a kernel of no column-major library: its tile lies as named, 24 x 6 = 144
        ("my_gemm_128x192_64x3", (144, 1, 1), 144),
        ("my_gemm_128x192_64x3", (132, 1, 1), 144),
    ],
)
def test_named_tile_orientation(name, grid, tiles):
    # 120 us: 51.5 GFLOP cannot run in less than ~65 us at the H200's measured peak
    ks = [kernel(0, 120_000, grid=grid, name=name, corr=1)]
    rg = [nvtx("advisor.gemm M=3072 N=1024 K=8192 dtype=bf16", -6_000, -1_000)]
    trace = make_trace(ks, runtime=[launch(1, -5_000)], ranges=rg)
    k = Context(trace).kernels
    assert int(k["tiles"].iloc[0]) == tiles
    tm, tn = int(k["tile_m"].iloc[0]), int(k["tile_n"].iloc[0])
    assert math.ceil(3072 / tm) * math.ceil(1024 / tn) == tiles  # tile_m lies along M
    # 128 tiles are 0.97 of a wave on 132 SMs; 144 are 1.09 waves, a tail (a finding on our own
    # kind of kernel; on cuBLAS's a note: our Stream-K does not beat it on tail shapes)
    tails = by_symptom(diagnose(trace), "tail_wave")
    expected = [] if tiles == 128 or is_library_kernel(name) else [144]
    assert [f.evidence["tiles"] for f in tails] == expected


def test_small_grid_long_k_split_and_savings():
    ks = [kernel(0, 888_000, grid=(2, 2, 1), name="matmul_kernel", corr=1)]
    rt = [launch(1, -5_000)]
    rg = [nvtx("advisor.gemm M=256 N=256 K=131072 dtype=bf16", -6_000, -1_000)]
    d = diagnose(make_trace(ks, runtime=rt, ranges=rg))
    (f,) = by_symptom(d, "small_grid_long_k")
    assert f.strategy == "split_k" and f.suggestion["split_k"] == 32  # min(132 // 4, max_split 32)
    nbytes = 2 * (256 * 131072 + 131072 * 256 + 256 * 256)
    floor = nbytes / 4.8e12 * 1e9
    assert f.evidence["hbm_floor_ns"] == int(floor)
    model = int(888_000 - max(888_000 * 4 / 132, floor))
    assert f.evidence["model_ns"] == model
    # capped by what our split-K reached over our dp kernel on this very shape
    r = reached("split_k", f.shape, "matmul_kernel", {"name": "NVIDIA H100"})
    assert r.exact and f.est_savings_ns == int(min(model, 888_000 * (1 - 1 / r.ratio)))
    assert by_symptom(d, "tail_wave") == []
    assert f.evidence["hbm_gb_per_s"] == 4800.0  # the known-GPU table's figure: the trace has none


def test_small_grid_long_k_floor_says_which_bandwidth():
    """The same H200 run read from nsys (the device's own 4814 GB/s: memory clock x bus width)
    and from Kineto (no bandwidth in the trace: the spec sheet's 4800) gives floors 0.3% apart;
    the evidence shows the figure each used."""
    from pathlib import Path

    from advisor.traces import load_trace

    data = Path(__file__).parent / "data" / "h200"
    seen = {}
    for name in ("skinny.sqlite.gz", "skinny.kineto.json.gz"):
        (f,) = by_symptom(diagnose(load_trace(data / name)), "small_grid_long_k")
        e = f.evidence
        assert abs(e["hbm_floor_ns"] - e["bytes_min"] / e["hbm_gb_per_s"]) <= 1  # GB/s = bytes/ns
        seen[name] = e["hbm_gb_per_s"]
    assert seen == {"skinny.sqlite.gz": 4814.3, "skinny.kineto.json.gz": 4800.0}


def test_small_grid_short_k_is_not_flagged():
    ks = [kernel(0, 100_000, grid=(2, 2, 1), corr=1)]
    rg = [nvtx("advisor.gemm M=256 N=256 K=1024 dtype=bf16", -6_000, -1_000)]
    d = diagnose(make_trace(ks, runtime=[launch(1, -5_000)], ranges=rg))
    assert by_symptom(d, "small_grid_long_k") == []


def test_tiny_kernel_stream_is_launch_bound():
    ks = back_to_back(100, 3_000, 7_000, name="vectorized_elementwise_kernel", grid=(4, 1, 1))
    d = diagnose(make_trace(ks))
    (f,) = by_symptom(d, "launch_overhead")
    # a run of elementwise kernels: fuse them (its own strategy id, not `persistent`)
    assert f.strategy == "fusion" and f.tier == 1 and f.savings_unit == "wall"
    assert f.evidence["gap_ns"] == 99 * 7_000 and f.est_savings_ns == 99 * 7_000
    assert f.evidence["gap_fraction"] == pytest.approx(99 * 7_000 / (99 * 7_000 + 100 * 3_000), abs=1e-3)
    assert f.suggestion["schedule"] == "fusion" and "idle gaps" in f.evidence["basis"]
    # Launch-bound gaps are not counted as an idle GPU by the gate.
    assert not [g for g in d.gates if g.check == "gpu_idle"]


def test_mixed_tiny_stream_names_its_biggest_kernel_with_its_own_counts():
    # 30 short copies, then 60 longer elementwise kernels, then 20 more copies, all tiny and
    # back to back: one run finding for the stream, named after the kernel with the most
    # time (the elementwise one), whose own launches and time the evidence gives apart from
    # the run's totals; the report's table says it is a run of kernels
    ks = back_to_back(30, 1_000, 6_000, name="copy_kernel", grid=(4, 1, 1))
    ks += back_to_back(60, 3_000, 6_000, start=30 * 7_000, name="vectorized_elementwise_kernel", grid=(4, 1, 1))
    ks += back_to_back(20, 1_000, 6_000, start=30 * 7_000 + 60 * 9_000, name="copy_kernel", grid=(4, 1, 1))
    d = diagnose(make_trace(ks))
    (f,) = by_symptom(d, "launch_overhead")
    assert f.kernel == "vectorized_elementwise_kernel"
    assert f.launches == 110 and f.total_ns == 50 * 1_000 + 60 * 3_000
    assert f.evidence["top_kernel_launches"] == 60 and f.evidence["top_kernel_ns"] == 60 * 3_000
    assert f.evidence["kernel_names"] == 2
    md = render("diagnosis.md.j2", d=d)
    assert "110 tiny kernels, most time in `vectorized_elementwise_kernel` (60)" in md
    assert "the most in `vectorized_elementwise_kernel`: 60 launches, 180.0 us" in md


@pytest.fixture
def cost_rules(tmp_path):
    """A rules copy with a per-block cost of 60 ns: the bundled value is the H200's measured 0
    (a persistent loop recovered nothing there), which turns big-grid findings off; these tests
    check the mechanics for a GPU where a measured cost is above 0."""
    import shutil

    from advisor.resources import rules_dir
    d = tmp_path / "cost_rules"
    shutil.copytree(rules_dir(), d)
    text = (d / "launch_overhead.toml").read_text()
    head, tail = text.split("[thresholds.block_cost_ns]")
    tail = re.sub(r"value = [0-9.]+\n", "value = 60\n", tail, count=1)
    (d / "launch_overhead.toml").write_text(head + "[thresholds.block_cost_ns]" + tail)
    return d


def test_library_kernels_are_named_with_what_to_change(cost_rules):
    # a user's kernel gets the plain suggestion; a library's says to change the call
    def big_grid(name):
        ks = [kernel(i * 500_000, 400_000, name=name, grid=(1_000_000, 1, 1), block=(32, 1, 1), regs=16) for i in range(3)]
        (f,) = by_symptom(diagnose(make_trace(ks), rules=cost_rules), "launch_overhead")
        return f
    assert "library" not in big_grid("tiny_block_kernel").evidence
    f = big_grid("void cudnn::ops::nchwToNhwcKernel<float, float, float, false>(cudnn::ops::nchw2nhwc_params_t<float>)")
    assert f.evidence["library"] == "cuDNN" and "channels_last" in f.evidence["library_change"]
    ks = back_to_back(100, 3_000, 7_000, name="void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>")
    (f,) = by_symptom(diagnose(make_trace(ks)), "launch_overhead")
    assert f.evidence["library"] == "PyTorch ATen" and "torch.compile" in f.evidence["library_change"]
    md = render("diagnosis.md.j2", d=diagnose(make_trace(ks)))
    assert "- Library kernel (PyTorch ATen): its code is not yours to change; change the call instead: fuse" in md


def test_small_gemm_stream_suggests_grouped():
    ks = back_to_back(64, 4_000, 6_000, name="sm90_xmma_gemm_bf16_tilesize128x128x64", grid=(4, 1, 1))
    (f,) = by_symptom(diagnose(make_trace(ks)), "launch_overhead")
    assert f.suggestion["schedule"] == "grouped" and f.strategy == "grouped" and f.tier == 4


def test_run_of_one_custom_kernel_stays_persistent():
    ks = back_to_back(100, 3_000, 7_000, name="my_tiny_kernel", grid=(4, 1, 1))
    (f,) = by_symptom(diagnose(make_trace(ks)), "launch_overhead")
    assert f.strategy == "persistent" and f.suggestion["schedule"] == "persistent"


def test_run_of_one_runtime_copy_kernel_is_graphed_not_made_persistent():
    # A real MI350X trace: 1,472 of a run's 1,907 tiny launches are the ROCm runtime's blit copy
    # (__amd_rocclr_copyBuffer). Nobody can make the runtime's copy persistent: the headline
    # names what can be done (graph the launches; fewer, larger copies), as a basic (tier 1).
    ks = back_to_back(100, 3_000, 7_000, name="__amd_rocclr_copyBuffer", grid=(4, 1, 1))
    d = diagnose(make_trace(ks))
    (f,) = by_symptom(d, "launch_overhead")
    assert f.strategy == "cuda_graph" and f.tier == 1 and f.evidence["run_kind"] == "library_run"
    assert "fewer, larger copies" in f.evidence["library_change"]
    md = render("diagnosis.md.j2", d=d)
    assert "is one kernel of the ROCm runtime: copy and fill, whose code is not yours to make persistent" in md


def test_custom_kernel_templated_on_library_types_is_not_a_library_kernel():
    # an extension kernel templated on c10::Half (as vLLM's in a real MI300 trace) is not ATen's: the run
    # is the user's kernel: no "library kernel" line, and not the library run's remedy
    ks = back_to_back(100, 3_000, 7_000, name="void myext::paged_gather_kernel<c10::Half, 8>(c10::Half*, int)",
                      grid=(4, 1, 1))
    (f,) = by_symptom(diagnose(make_trace(ks)), "launch_overhead")
    assert f.evidence["run_kind"] != "library_run" and "library" not in f.evidence


def test_busy_stream_of_small_kernels_is_not_flagged():
    ks = back_to_back(100, 3_000, 500, name="vectorized_elementwise_kernel", grid=(4, 1, 1))
    assert by_symptom(diagnose(make_trace(ks)), "launch_overhead") == []


def test_huge_grid_of_short_blocks(cost_rules):
    # 1M blocks of 32 threads, 16 regs: 32 blocks/SM -> 1e6 / 4224 = 236.7 waves in 800 us
    # -> 3.4 us per wave, under max_wave_ns.
    ks = [kernel(i * 1_000_000, 800_000, name="tiny_block_kernel", grid=(1_000_000, 1, 1), block=(32, 1, 1), regs=16) for i in range(3)]
    (f,) = by_symptom(diagnose(make_trace(ks), rules=cost_rules), "launch_overhead")
    assert f.evidence["pattern"] == "huge grid of short blocks" and f.confidence == "low"
    assert f.evidence["waves_occupancy"] == pytest.approx(1_000_000 / (132 * 32), abs=0.1)
    # the measured per-block cost (rules/launch_overhead.toml) x blocks / SMs, per launch
    cost = load_rules(cost_rules)["launch_overhead"]["block_cost_ns"]
    assert f.est_savings_ns == pytest.approx(3 * 1_000_000 / 132 * cost, abs=3)
    assert f.tier == 4 and f.savings_unit == "gpu" and f.evidence["bound_ns"] is None
    assert f.evidence["grid_blocks_min"] == f.evidence["grid_blocks_max"] == 1_000_000 and "per-block" in f.evidence["basis"]


def test_huge_grid_one_finding_per_kernel_whatever_its_grids(cost_rules):
    # a kernel whose grid follows its input (an embedding lookup's 984,709..990,913 blocks) is
    # one finding with the range of its grids, not one per grid
    grids = [984_709, 986_000, 988_123, 989_500, 990_000, 990_913]
    ks = [kernel(i * 1_000_000, 800_000, name="embedding_kernel", grid=(g, 1, 1), block=(32, 1, 1), regs=16) for i, g in enumerate(grids)]
    (f,) = by_symptom(diagnose(make_trace(ks), rules=cost_rules), "launch_overhead")
    assert f.launches == 6 and f.evidence["grid_blocks_min"] == 984_709 and f.evidence["grid_blocks_max"] == 990_913
    cost = load_rules(cost_rules)["launch_overhead"]["block_cost_ns"]
    assert f.est_savings_ns == pytest.approx(sum(grids) / 132 * cost, abs=6)


def test_huge_grid_estimate_never_claims_the_whole_kernel(cost_rules):
    # 1M blocks in 400 us: the per-block cost would claim more than the kernel's time; a
    # persistent kernel still does the work, so the estimate stops at max_saving_share
    rule = load_rules(cost_rules)["launch_overhead"]
    ks = [kernel(i * 500_000, 400_000, name="tiny_block_kernel", grid=(1_000_000, 1, 1), block=(32, 1, 1), regs=16) for i in range(3)]
    (f,) = by_symptom(diagnose(make_trace(ks), rules=cost_rules), "launch_overhead")
    assert 1_000_000 / 132 * rule["block_cost_ns"] > 400_000
    assert f.est_savings_ns == pytest.approx(3 * 400_000 * rule["max_saving_share"], abs=3)


def test_huge_grid_estimate_reads_the_rule(tmp_path, cost_rules):
    # the per-block cost is a rule threshold: halve it, halve the estimate
    import shutil

    d = tmp_path / "rules"
    shutil.copytree(cost_rules, d)
    text = (d / "launch_overhead.toml").read_text()
    head, tail = text.split("[thresholds.block_cost_ns]")
    tail = tail.replace("value = 60\n", "value = 30\n", 1)
    (d / "launch_overhead.toml").write_text(head + "[thresholds.block_cost_ns]" + tail)
    ks = [kernel(i * 1_000_000, 800_000, name="tiny_block_kernel", grid=(1_000_000, 1, 1), block=(32, 1, 1), regs=16) for i in range(3)]
    (a,) = by_symptom(diagnose(make_trace(ks), rules=cost_rules), "launch_overhead")
    (b,) = by_symptom(diagnose(make_trace(ks), rules=d), "launch_overhead")
    assert b.est_savings_ns == pytest.approx(a.est_savings_ns / 2, abs=3)
    # with the measured H200 cost (0: the persistent loop was slower) there is nothing to claim
    assert by_symptom(diagnose(make_trace(ks)), "launch_overhead") == []


def test_hopper_no_ws_flags_plain_gemm_not_nvjet():
    plain = [kernel(i * 1_000_000, 900_000, grid=(64, 64, 1), name="my_tensorop_gemm_128x128x64") for i in range(5)]
    d = diagnose(make_trace(plain))
    (f,) = by_symptom(d, "hopper_no_ws")
    assert f.strategy == "warp_specialization" and f.confidence == "low"
    # the 10% prior, capped by the best our WS schedule reached over our dp kernel (~4%)
    r = reached("warp_specialization", None, "my_tensorop_gemm_128x128x64")
    assert f.est_savings_ns == int(min(5 * 900_000 * 0.10, 5 * 900_000 * (1 - 1 / r.ratio)))
    # cuBLAS's non-WS kernels: our WS does not measurably beat cuBLAS, so no advice to replace it
    lib = [kernel(i * 1_000_000, 900_000, grid=(64, 64, 1), name="sm90_xmma_gemm_bf16bf16_tilesize128x128x64") for i in range(5)]
    assert by_symptom(diagnose(make_trace(lib)), "hopper_no_ws") == []
    ws = [kernel(i * 1_000_000, 900_000, grid=(132, 1, 1), name="nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT") for i in range(5)]
    assert by_symptom(diagnose(make_trace(ws)), "hopper_no_ws") == []
    a100 = dict(H100, name="NVIDIA A100-SXM4-80GB", arch="8.0", cc_major=8, sm_count=108)
    assert by_symptom(diagnose(make_trace(plain, devices=[a100])), "hopper_no_ws") == []


def test_exposed_comm_per_rank():
    ks = [
        kernel(0, 1_000_000, name="ncclDevKernel_AllReduce_Sum_bf16_RING_LL", grid=(24, 1, 1), stream=20),
        kernel(0, 300_000, name="sm90_xmma_gemm_bf16_tilesize128x128x64", grid=(64, 8, 1), stream=7),
        kernel(1_000_000, 500_000, name="sm90_xmma_gemm_bf16_tilesize128x128x64", grid=(64, 8, 1), stream=7),
    ]
    d = diagnose(make_trace(ks))
    (f,) = by_symptom(d, "exposed_comm")
    assert f.evidence["exposed_ns"] == 700_000 and f.evidence["overlapped_ns"] == 300_000
    assert f.est_savings_ns == 700_000  # compute (800 us) can hide all of it
    assert f.evidence["exposed_fraction"] == pytest.approx(700_000 / 1_500_000, abs=1e-3)
    # nothing bounds it, so the report needs no line on why the two figures differ
    assert f.est_savings_ns == f.evidence["recoverable_ns"]
    assert "- Recoverable:" not in render("diagnosis.md.j2", d=d, images={})


def test_overlapped_comm_is_clean():
    ks = [
        kernel(0, 1_000_000, name="ncclDevKernel_AllReduce_Sum_bf16_RING_LL", grid=(24, 1, 1), stream=20),
        kernel(0, 1_000_000, name="sm90_xmma_gemm_bf16_tilesize128x128x64", grid=(64, 8, 1), stream=7),
    ]
    assert by_symptom(diagnose(make_trace(ks)), "exposed_comm") == []


def test_gate_gpu_idle_and_sync():
    # Each step: a 100 us kernel, a synchronise that returns when it ends (+2 us), then 898 us
    # of host work before the next launch: the GPU idles 898 us after each of 9 syncs.
    ks = [kernel(i * 1_000_000, 100_000, name="matmul_kernel", grid=(12, 11, 1)) for i in range(10)]
    rt = [launch(i + 1, i * 1_000_000 + 5_000, dur=97_000, name="cudaDeviceSynchronize") for i in range(10)]
    d = diagnose(make_trace(ks, runtime=rt))
    checks = {g.check for g in d.gates}
    assert {"gpu_idle", "sync_calls"} <= checks and d.premature
    (g,) = [g for g in d.gates if g.check == "sync_calls"]
    assert g.value == pytest.approx(9 * 898_000 / 9_100_000, abs=1e-3)


def test_gate_sync_calls_on_the_python_thread_of_a_training_step():
    # A training step's launches come from two threads: autograd's device thread launches the
    # backward (here 3 launches a step) and the Python thread the forward (2) and the .item()
    # that drains the GPU; the stalls after the Python thread's syncs count though another
    # thread launches more. A data loader's lone call (thread 9, under a tenth of the calls)
    # does not: the same 9 stalls of 898 us as test_gate_gpu_idle_and_sync
    ks = [kernel(i * 1_000_000, 100_000, name="matmul_kernel", grid=(12, 11, 1)) for i in range(10)]
    rt = []
    for i in range(10):
        rt += [launch(100 * i + j, i * 1_000_000 + 200 + 100 * j, dur=50, thread=2) for j in range(3)]
        rt += [launch(100 * i + 50 + j, i * 1_000_000 + 100 * j, dur=50, thread=1) for j in range(2)]
        rt.append(launch(100 * i + 99, i * 1_000_000 + 5_000, dur=97_000, name="cudaStreamSynchronize", thread=1))
    rt.append(launch(9999, 3_100_000, dur=1_000, name="cudaStreamSynchronize", thread=9))
    (g,) = [g for g in diagnose(make_trace(ks, runtime=rt)).gates if g.check == "sync_calls"]
    assert g.value == pytest.approx(9 * 898_000 / 9_100_000, abs=1e-3)


@pytest.mark.parametrize("call", ["hipMemcpyWithStream", "hipMemcpyDtoH", "hipMemcpy"])
def test_gate_sync_calls_hip_blocking_copies(call):
    # PyTorch on ROCm makes its blocking copies (.item(), .cpu()) with hipMemcpyWithStream,
    # where CUDA uses cudaMemcpyAsync + cudaStreamSynchronize; hipMemcpyDtoH is the blocking
    # driver-style copy. Same timeline as test_gate_gpu_idle_and_sync: a 100 us kernel, the
    # copy returns 2 us after it ends, 898 us of host work: 9 stalls of 898 us in 9.1 ms.
    ks = [kernel(i * 1_000_000, 100_000, name="Cijk_Alik_Bljk_MT64x16x32", grid=(12, 11, 1)) for i in range(10)]
    rt = [launch(i + 1, i * 1_000_000 + 5_000, dur=97_000, name=call) for i in range(10)]
    d = diagnose(make_trace(ks, runtime=rt))
    (g,) = [g for g in d.gates if g.check == "sync_calls"]
    assert g.value == pytest.approx(9 * 898_000 / 9_100_000, abs=1e-3)


def test_async_hip_copy_is_not_a_sync_call():
    ks = [kernel(i * 1_000_000, 100_000, name="Cijk_Alik_Bljk_MT64x16x32", grid=(12, 11, 1)) for i in range(10)]
    rt = [launch(i + 1, i * 1_000_000 + 5_000, dur=97_000, name="hipMemcpyAsync") for i in range(10)]
    assert not [g for g in diagnose(make_trace(ks, runtime=rt)).gates if g.check == "sync_calls"]


def test_several_synchronises_in_one_gap_count_it_once():
    # test_gate_gpu_idle_and_sync's steps, with 5 synchronising calls returning one after another
    # in each gap: the GPU idles 898 us a step, not 5 x that (it read as 386% of the span)
    ks = [kernel(i * 1_000_000, 100_000, name="matmul_kernel", grid=(12, 11, 1)) for i in range(10)]
    rt = [launch(100 * i + j, i * 1_000_000 + 5_000 + 10_000 * j, dur=97_000, name="cudaDeviceSynchronize")
          for i in range(10) for j in range(5)]
    (g,) = [g for g in diagnose(make_trace(ks, runtime=rt)).gates if g.check == "sync_calls"]
    assert g.value == pytest.approx(9 * 898_000 / 9_100_000, abs=1e-3)


def test_synchronise_before_any_gpu_work_is_free():
    # A synchronise at set-up, 200 ms before the first kernel (a real H100 trace has one), drains
    # nothing: the wait that follows is start-up, not a stall inside the span. Then the usual
    # steps: 9 stalls of 898 us in 9.1 ms, as in test_gate_gpu_idle_and_sync.
    t0 = 200_000_000
    ks = [kernel(t0 + i * 1_000_000, 100_000, name="matmul_kernel", grid=(12, 11, 1)) for i in range(10)]
    rt = [launch(1, 0, dur=14_000, name="cudaDeviceSynchronize")]
    rt += [launch(i + 2, t0 + i * 1_000_000 + 5_000, dur=97_000, name="cudaDeviceSynchronize") for i in range(10)]
    (g,) = [g for g in diagnose(make_trace(ks, runtime=rt)).gates if g.check == "sync_calls"]
    assert g.value == pytest.approx(9 * 898_000 / 9_100_000, abs=1e-3)
    assert "9 synchronising calls" in g.message


def test_final_synchronise_is_free():
    # Work enqueued back to back, one synchronise at the end: no stall.
    ks = [kernel(i * 100_000, 100_000, name="matmul_kernel", grid=(12, 11, 1)) for i in range(10)]
    rt = [launch(99, 10_000, dur=990_000, name="cudaDeviceSynchronize")]
    d = diagnose(make_trace(ks, runtime=rt))
    assert not [g for g in d.gates if g.check == "sync_calls"]


def test_gate_gemm_far_below_roofline():
    # 8192^3 bf16 in whole waves (64x64 = 4096 tiles = 31.03 waves: tail efficiency 0.97)
    # at 110 ms: 10 TFLOP/s against the H100's 989 TFLOP/s datasheet peak, derated by what
    # we measured on the H200 against its own datasheet (795.9 / 989: advisor.symptoms.calibration)
    ks = [kernel(0, 110_000_000, grid=(64, 64, 1), name="matmul_kernel", corr=1)]
    rg = [nvtx("advisor.gemm M=8192 N=8192 K=8192 dtype=bf16", -6_000, -1_000)]
    d = diagnose(make_trace(ks, runtime=[launch(1, -5_000)], ranges=rg))
    (g,) = [g for g in d.gates if g.check == "gemm_below_roofline"]
    assert g.value == pytest.approx(2 * 8192**3 / 0.110 / (989e12 * 795.9 / 989), abs=1e-3)


def test_not_applicable_without_sm_count():
    dev = dict(H100, name="Mystery GPU", sm_count=None, sm_count_source=None)
    d = diagnose(make_trace([kernel(0, 82_000, grid=(143, 1, 1))], devices=[dev]))
    assert {n["symptom"] for n in d.not_applicable} >= {"tail_wave", "small_grid_long_k"}
    assert d.findings == [] or all(f.symptom not in ("tail_wave", "small_grid_long_k") for f in d.findings)


def test_findings_ranked_and_top():
    ks = [kernel(i * 100_000, 82_000, grid=(11, 13, 1)) for i in range(10)]
    ks += back_to_back(200, 3_000, 20_000, start=2_000_000, name="vectorized_elementwise_kernel", grid=(4, 1, 1), stream=9)
    d = diagnose(make_trace(ks))
    savings = [f.est_savings_ns for f in d.findings]
    assert savings == sorted(savings, reverse=True) and len(savings) >= 2
    assert len(diagnose(make_trace(ks), top=1).findings) == 1


def test_hopper_no_ws_skips_bandwidth_bound_gemm():
    # 64x4096x16384 bf16: intensity = 2*64*4096*16384 / (2*(64*16384 + 16384*4096 + 64*4096))
    # = 63 FLOP/byte, under half of the H200's ridge (989e12 / 4.8e12 = 206).
    ks = [kernel(i * 1_000_000, 900_000, grid=(32, 1, 1), name="sm90_xmma_gemm_bf16_tilesize64x128x64", corr=i + 1) for i in range(5)]
    rt = [launch(i + 1, i * 1_000_000 - 5_000) for i in range(5)]
    rg = [nvtx("advisor.gemm M=64 N=4096 K=16384 dtype=bf16", i * 1_000_000 - 6_000, i * 1_000_000 - 1_000) for i in range(5)]
    assert by_symptom(diagnose(make_trace(ks, runtime=rt, ranges=rg)), "hopper_no_ws") == []


def test_odd_shapes_of_a_grouped_suggestion():
    from advisor.symptoms.launch_overhead import _odd_shapes

    assert _odd_shapes(["64x128x256", "8x16x40"], "bf16") == {}  # M never matters
    assert _odd_shapes(["64x128x256", "8x17x40", "8x16x41", "bad"], "fp16") == {"gemm_shapes_unaligned": 2,
                                                                                 "alignment_elements": 8}
    assert _odd_shapes(["8x12x20"], "fp32") == {}  # 16 bytes are 4 fp32 elements
    assert _odd_shapes(["8x12x20"], None) == {"gemm_shapes_unaligned": 1, "alignment_elements": 8}


# ---------------------------------------------------------------- launch_overhead on real traces


def _corpus_diag(corpus, *names, rules=None):
    paths = [corpus / n for n in names]
    for p in paths:
        if not p.exists():
            pytest.skip(f"{p} not in the corpus")
    from advisor.traces import load_trace
    return diagnose(load_trace(paths), rules=rules)


def test_real_big_grid_kernel_is_one_finding(corpus, cost_rules):
    # V100 ResNet-50 (2021 Kineto): cuDNN's scalePackedTensor_kernel ran with grids of 100352
    # and 50176 blocks; that was two findings, it is one kernel
    d = _corpus_diag(corpus, "kineto/kineto_tbplugin_v100_resnet50_2021.json.gz", rules=cost_rules)
    big = [f for f in d.findings if f.evidence.get("pattern") == "huge grid of short blocks"]
    scale = [f for f in big if "scalePackedTensor_kernel" in f.kernel]
    assert len(scale) == 1
    (f,) = scale
    assert (f.evidence["grid_blocks_min"], f.evidence["grid_blocks_max"]) == (50176, 100352) and f.launches == 18
    assert f.est_savings_ns <= load_rules(cost_rules)["launch_overhead"]["max_saving_share"] * f.total_ns
    assert len({(x.rank, x.kernel) for x in big}) == len(big)  # never two findings on one kernel


def test_real_host_bound_step_is_found(corpus):
    # A100 NCCL trainer (HTA): 2700 kernels on one stream, half under 20 us, but longer GEMMs
    # and copies break every tiny-kernel run, so no run finding fired. In 1836 short gaps
    # (159 ms of a 661 ms span) the next launch call began only after the GPU went idle.
    d = _corpus_diag(corpus, "kineto/hta_a100_nccl.json.gz")
    assert not [f for f in d.findings if f.evidence.get("pattern") == "tiny back-to-back kernels"]
    (f,) = [f for f in d.findings if f.evidence.get("pattern") == "host-bound launches"]
    assert f.strategy == "cuda_graph" and f.tier == 1 and f.savings_unit == "wall"
    assert f.evidence["host_gaps"] == 1836 and 150e6 < f.est_savings_ns < 165e6
    assert f.evidence["host_api_calls"][0]["name"] == "cudaLaunchKernel"
    assert "reduce-overhead" in render("diagnosis.md.j2", d=d)


def test_real_runs_get_their_own_strategy_ids(corpus):
    # V100 all-reduce trainer: the tiny runs are 94% elementwise -> fusion; DLRM rank 0: 61
    # kinds, GEMMs and sorts among the elementwise ones (66%) -> a CUDA graph
    d = _corpus_diag(corpus, "kineto/hta_v100_2rank_allreduce.json.gz")
    (f,) = [f for f in d.findings if f.evidence.get("pattern") == "tiny back-to-back kernels"]
    assert f.strategy == "fusion" and f.evidence["run_kind"] == "elementwise_run"
    d = _corpus_diag(corpus, "kineto/param_dlrm_v100_8rank/worker0.json.gz")
    (f,) = [f for f in d.findings if f.evidence.get("pattern") == "tiny back-to-back kernels"]
    assert f.strategy == "cuda_graph" and f.evidence["run_kind"] == "mixed_run"


def test_real_startup_gap_is_named_and_not_premature(tmp_path):
    # two planted programs in one H200 nsys capture: 637 ms of module loading before the first
    # GEMM, 62 and 24 ms more loading cuBLAS/Triton modules; between them the GPU is busy. The
    # gate fired gpu_idle (1% busy) and marked every finding premature, without saying where.
    from conftest import DATA

    from advisor.traces import load_trace
    d = diagnose(load_trace(DATA / "h200" / "two_procs.sqlite.gz", cache_dir=tmp_path))
    assert [g.check for g in d.gates] == ["startup_gap"] and not d.premature
    (g,) = d.gates
    assert g.gaps[0]["gap_ns"] > 600e6 and g.gaps[0]["at_ms"] > 6000 and g.gaps[0]["waited_on"] == "host"
    assert any(c["name"] == "cuModuleLoadData" for c in g.gaps[0]["host_api_calls"])
    assert "capture-range=cudaProfilerApi" in g.message and "torch.profiler.schedule" in g.message
    assert d.findings  # the GEMM findings stand, not premature
    assert "Fix these first" not in render("diagnosis.md.j2", d=d)
