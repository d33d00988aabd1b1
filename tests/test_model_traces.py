"""Traces of unplanted work (workloads/model_step.py on the H200): one training step and one
eager decode of a small GPT-style model, each captured with nsys and with the PyTorch
profiler. Nobody arranged a symptom in them, so these tests pin what the diagnosis must say
(eager decoding is launch-bound) and what it must not (a tail on cuBLAS GEMMs whose grids
fill the GPU)."""

from __future__ import annotations

import pytest
from conftest import DATA

from advisor.diagnose.diagnosis import diagnose
from advisor.report.render import render
from advisor.symptoms import Context
from advisor.traces import load_trace

H200 = DATA / "h200"
FORMATS = ["sqlite.gz", "kineto.json.gz"]


def _load(scenario, fmt, tmp_path):
    return load_trace(H200 / f"model_{scenario}.{fmt}", cache_dir=tmp_path)


@pytest.mark.parametrize("fmt", FORMATS)
def test_train_step_gemms_read_the_same_from_both_profilers(fmt, tmp_path):
    k = Context(_load("train", fmt, tmp_path)).kernels
    gemms = k[k["is_gemm"]]
    # 4 layers x 4 linears x 3 GEMMs (forward, two gradients) + the head's 3 = 51, each with a
    # shape from aten::mm; cuDNN's flash-attention kernels (wgmma in their names) are not GEMMs
    assert len(k) == 203 and len(gemms) == 51 and gemms["M"].notna().all()
    assert (k.loc[k["name"].str.contains("sdpa_sm90_flash"), "is_gemm"] == False).sum() == 8  # noqa: E712


@pytest.mark.parametrize("fmt", FORMATS)
def test_cublas_tiles_lie_along_pytorch_s_n_and_fill_the_gpu(fmt, tmp_path):
    # cuBLAS ran the QKV weight gradient (aten::mm 3072x1024x8192) as
    # nvjet_sm90_tst_128x192 on 128 CTAs: 128 rows of tile along N (1024 / 128 = 8) and 192
    # along M (3072 / 192 = 16), one wave on 132 SMs. Read the other way round it is 24 x 6 =
    # 144 tiles, a 1.09-wave tail that is not there.
    k = Context(_load("train", fmt, tmp_path)).kernels
    wg = k[k["name"].str.startswith("nvjet_sm90_tst_128x192") & (k["M"] == 3072)]
    assert len(wg) == 4  # one per layer
    assert set(wg["grid_blocks"]) == {128} and set(wg["tiles"]) == {128}
    assert set(wg["tile_m"]) == {192} and set(wg["tile_n"]) == {128}
    # every GEMM with a named tile and a shape: the tiles fill the grid exactly, or the grid is
    # a persistent one of 132 CTAs looping over more tiles
    named = k[k["is_gemm"] & k["tiles"].notna()]
    assert len(named) == 51
    assert ((named["tiles"] == named["grid_blocks"]) | ((named["grid_blocks"] == 132) & (named["tiles"] > 132))).all()


@pytest.mark.parametrize("fmt", FORMATS)
def test_train_step_has_no_gemm_scheduling_finding(fmt, tmp_path):
    d = diagnose(_load("train", fmt, tmp_path))
    assert not d.gates
    symptoms = {f.symptom for f in d.findings}
    assert not symptoms & {"tail_wave", "small_grid_long_k", "hopper_no_ws"}, symptoms
    # the huge elementwise passes over the 8192 x 32768 logits claim nothing (a persistent loop
    # recovered no per-block cost on the H200: bench/results/block_cost_h200.csv); layer norm's
    # gamma/beta gradient runs on 32 blocks (~39 us a launch while 100 SMs idle); under nsys
    # the GPU waits on launches in 64 short gaps, 5 ms of 23, but emit_nvtx's own cost for the
    # step's recorded ops (8 us each, docs/profiler_cost.md) is more than that: no finding
    assert [f for f in d.findings if f.evidence.get("pattern") == "huge grid of short blocks"] == []
    rest = [f for f in d.findings if f.symptom != "launch_overhead"]
    assert [(f.symptom, f.grid) for f in rest] == [("underfilled_long_kernel", [32, 1, 1])]
    assert "GammaBetaBackward" in rest[0].kernel and rest[0].confidence == "low"
    lo = [f for f in d.findings if f.symptom == "launch_overhead"]
    assert lo == []


@pytest.mark.parametrize("fmt", FORMATS)
def test_decode_is_launch_bound_and_told_to_use_a_graph(fmt, tmp_path):
    trace = _load("decode", fmt, tmp_path)
    k = Context(trace).kernels
    # 32 forward passes (a prompt, then 31 single tokens) of 4 layers; M=4 GEMMs on nvjet
    # kernels whose 8-row tile lies along M: 48 tiles for the 4 x 3072 x 1024 QKV projection
    assert len(k) == 1789
    qkv = k[k["is_gemm"] & (k["M"] == 4) & (k["N"] == 3072)]
    assert len(qkv) == 31 * 4 and set(qkv["tiles"]) == {48} and set(qkv["grid_blocks"]) == {48}
    d = diagnose(trace)
    (f,) = [f for f in d.findings if f.evidence.get("pattern") == "tiny back-to-back kernels"]
    assert f.symptom == "launch_overhead" and f.strategy == "cuda_graph"
    # both captures record per-op shapes (emit_nvtx, record_shapes), which slows the host: the
    # gaps are real but larger than the bare program's, so medium, not high
    assert f.evidence["profiler_slowed_host"] and f.confidence == "medium"
    # beside the launch gaps: the sampler's argmax on 4 blocks (test_attention_symptoms); under
    # nsys the host is slower still: the short host-bound gaps outside the runs are one more
    # finding with the same remedy
    others = {(x.symptom, x.strategy) for x in d.findings if x is not f}
    assert others == {("underfilled_long_kernel", "more_parallelism")} | (
        {("launch_overhead", "cuda_graph")} if fmt == "sqlite.gz" else set())
    # a model's layers, not one kernel in a loop: the biggest kind (the M=4 nvjet GEMM) holds
    # under a fifth of the kernel time, so the remedy is a graph of the loop, not a persistent kernel
    assert f.suggestion == {"schedule": "cuda_graph", "cuda_graph": True}
    assert f.evidence["kernel_names"] >= 12 and f.evidence["top_kernel_share"] < 0.2
    md = render("diagnosis.md.j2", d=d)
    assert "- Mixed work: " in md and 'torch.compile(mode="reduce-overhead")' in md
    assert f.evidence["gap_fraction"] > 0.9  # the GPU waits on Python between microsecond kernels
    # nsys's emit_nvtx ranges slow the host further: gaps past the run limit read as an idle GPU
    assert [g.check for g in d.gates] == (["gpu_idle"] if fmt == "sqlite.gz" else [])


@pytest.mark.parametrize("fmt", FORMATS)
def test_compiled_train_step_reads_inductor_s_kernels(fmt, tmp_path):
    # torch.compile(mode="max-autotune-no-cudagraphs"): autotuning picked one Triton GEMM
    # template (3 launches, no aten::mm range inside a compiled graph, so no shape) and cuBLAS
    # for the other 48 GEMMs; Inductor's pointwise and reduction fusions name the ops they fuse
    trace = _load("train_compiled", fmt, tmp_path)
    k = Context(trace).kernels
    assert len(k) == 192 and int(k["is_gemm"].sum()) == 51 and int(k["M"].notna().sum()) == 48
    tem = k[k["name"].str.startswith("triton_tem_")]
    assert len(tem) == 3 and tem["is_gemm"].all() and set(tem["grid_blocks"]) == {512}
    fused = k[k["name"].str.match(r"triton_(?:poi|red|per)_")]
    assert len(fused) > 40 and not fused["is_gemm"].any()
    d = diagnose(trace)
    # no GEMM finding: the template's 512 blocks are 3.9 waves (tail efficiency 0.97), and
    # cuDNN's flash attention (wgmma in its name) is no Hopper GEMM without warp specialization
    # (an fp32 reduction on 8 blocks, ~11 us a launch, is the one long under-filled kernel)
    assert {f.symptom for f in d.findings} <= {"launch_overhead", "underfilled_long_kernel"}
    assert [f.grid for f in d.findings if f.symptom == "underfilled_long_kernel"] == [[8, 1, 1]]
    assert all(f.evidence.get("pattern") != "huge grid of short blocks" for f in d.findings) and not d.gates
