"""`advisor compare`: two profiles of one program, aligned on steps, with a verdict.

Real H200 traces (tests/data) for the verdicts, small hand-made Kineto traces where the
per-step numbers are worked out by hand."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from markdown_it import MarkdownIt
from conftest import DATA
from tracefiles import kineto_doc, write_kineto

from advisor.cli import cli
from advisor.report.compare import compare, find_steps
from advisor.symptoms.kernel_class import classify_name, family
from advisor.traces import load_trace

H200, X2 = DATA / "h200", DATA / "h200x2"


def _load(paths, tmp_path):
    return load_trace(paths, cache_dir=tmp_path)


def _run(args, tmp_path):
    return CliRunner().invoke(cli, [*args, "--cache-dir", str(tmp_path / "cache")])


# ------------------------------------------------------------------ hand-made step traces


def _step_doc(durs_us, period_us=1000.0, host_us=900.0, queue=False, step_name="ProfilerStep#{i}"):
    """One GEMM kernel per step; step i is a host range at period*i lasting host_us. With
    `queue`, each kernel starts when the one before it ended (a GPU-bound loop)."""
    evs, gpu_free = [], 0.0
    for i, dur in enumerate(durs_us):
        t = period_us * i
        evs.append({"ph": "X", "cat": "user_annotation", "name": step_name.format(i=i), "pid": 1, "tid": 1, "ts": t,
                    "dur": host_us})
        evs.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 2,
                    "dur": 5.0, "args": {"correlation": i + 1}})
        start = max(t + 10, gpu_free) if queue else t + 10
        gpu_free = start + dur
        evs.append({"ph": "X", "cat": "kernel", "name": "gemm_kernel", "pid": 0, "tid": 7, "ts": start, "dur": dur,
                    "args": {"device": 0, "stream": 7, "correlation": i + 1, "grid": [11, 13, 1], "block": [256, 1, 1],
                             "registers per thread": 128, "shared memory": 65536}})
    return kineto_doc(evs)


def test_profiler_steps_host_bound(tmp_path):
    # 6 steps of 900 us on the host, kernels of 500 us (before) and 400 us (after) that end
    # inside their step: the step takes 900 us either way, the GPU is busy 500 -> 400 us.
    b = _load([write_kineto(tmp_path / "b.json", _step_doc([500.0] * 6))], tmp_path)
    a = _load([write_kineto(tmp_path / "a.json", _step_doc([400.0] * 6))], tmp_path)
    assert find_steps(b).method == "profiler_steps" and find_steps(b).count == 6
    c = compare(b, a)
    d = c.to_dict()
    assert d["before"]["step_ns_each"] == [900_000] * 6
    assert d["before"]["gpu_busy_ns"] == 500_000 and d["after"]["gpu_busy_ns"] == 400_000
    assert d["speedup"] == 1.0 and d["gpu_speedup"] == 1.25
    assert d["verdict"] == "same" and d["judged_on"] == "step wall time"
    assert d["alignment"] == {"method": "profiler_steps", "name": "ProfilerStep#N", "before_steps": 6, "after_steps": 6}


def test_gpu_bound_steps_take_the_gpu_time_not_the_host_range(tmp_path):
    # Kernels of 1500 us launched every 1000 us queue up behind each other: step i is done
    # when its kernel ends (10 + 1500 (i+1) us), so steps after the first take 1500 us,
    # although each host range lasts 900 us.
    b = _load([write_kineto(tmp_path / "b.json", _step_doc([1500.0] * 6, queue=True, step_name="train_step {i}"))],
              tmp_path)
    a = _load([write_kineto(tmp_path / "a.json", _step_doc([500.0] * 6, step_name="train_step {i}"))], tmp_path)
    steps = find_steps(b)
    assert steps.method == "nvtx_steps" and steps.name == "train_step N"
    d = compare(b, a).to_dict()
    assert d["before"]["step_ns_each"] == [1_510_000] + [1_500_000] * 5
    assert d["after"]["step_ns_each"] == [900_000] * 6
    assert d["speedup"] == round(1_500_000 / 900_000, 4)
    assert d["verdict"] == "faster"


def test_slower_beyond_noise_and_regression_gate(tmp_path):
    fast = write_kineto(tmp_path / "fast.json", _step_doc([500.0] * 6, queue=True, period_us=400.0, host_us=300.0))
    slow = write_kineto(tmp_path / "slow.json", _step_doc([600.0] * 6, queue=True, period_us=400.0, host_us=300.0))
    r = _run(["compare", str(fast), str(slow), "--json", "--fail-on-regression", "10"], tmp_path)
    assert r.exit_code == 1, r.output
    d = json.loads(r.stdout)
    assert d["verdict"] == "slower" and d["speedup"] == round(500 / 600, 4)
    r = _run(["compare", str(fast), str(slow), "--json", "--fail-on-regression", "25"], tmp_path)
    assert r.exit_code == 0 and json.loads(r.stdout)["verdict"] == "slower"
    r = _run(["compare", str(slow), str(fast), "--fail-on-regression", "0"], tmp_path)
    assert r.exit_code == 0 and "# advisor compare: faster" in r.stdout


def test_markdown_escapes_trace_text(tmp_path):
    doc = _step_doc([500.0] * 4)
    for e in doc["traceEvents"]:
        if e["cat"] == "kernel":
            e["name"] = "gemm_kernel|<img src=x>`[link](http://x)`"
    p = write_kineto(tmp_path / "t.json", doc)
    r = _run(["compare", str(p), str(p)], tmp_path)
    assert r.exit_code == 0, r.output
    html = MarkdownIt("commonmark").enable("table").render(r.stdout)
    assert "<img" not in html and "<a href" not in html  # the name stays text, in code spans
    assert "&lt;img src=x&gt;" in html
    assert "# advisor compare: same" in r.stdout


# ------------------------------------------------------------------ real H200 traces


def test_overlap_vs_plain_two_ranks_per_side(tmp_path):
    # The tensor-parallel MLP block on 2 H200s, 8 `step` NVTX ranges per rank: overlapped
    # through symmetric memory it is faster; the exposed reduce-scatter finding is resolved.
    before = ",".join(str(X2 / f"mlp_plain_rank{r}.sqlite.gz") for r in (0, 1))
    r = _run(["compare", before, "--after", str(X2 / "mlp_overlap_rank0.sqlite.gz"),
              "--after", str(X2 / "mlp_overlap_rank1.sqlite.gz"), "--json", "--out", str(tmp_path / "o")], tmp_path)
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert d["verdict"] == "faster" and d["alignment"]["method"] == "nvtx_steps"
    assert d["before"]["steps"] == d["after"]["steps"] == 8 and d["before"]["ranks"] == [0, 1]
    assert d["speedup"] == round(d["before"]["step_ns"] / d["after"]["step_ns"], 4)
    assert 1.3 < d["speedup"] < 1.7
    resolved = {(f["symptom"], f["kernel"].split("(")[0]) for f in d["findings"]["resolved"]}
    assert ("exposed_comm", "ncclDevKernel_ReduceScatter_Sum_bf16_RING_LL") in resolved
    gone = {k["label"].split("(")[0] for k in d["kernels"] if k["status"] == "gone"}
    assert "ncclDevKernel_AllGather_RING_LL" in gone
    assert (tmp_path / "o" / "compare.md").is_file() and json.loads((tmp_path / "o" / "compare.json").read_text())


def test_same_program_across_formats_is_same(tmp_path):
    # One training step of the model_step.py GPT-style model, once under nsys (emit_nvtx) and
    # once under the PyTorch profiler: every kernel family matches across the two demanglers,
    # and GPU busy time agrees; wall time differs by the profilers' own overhead.
    b = _load([H200 / "model_train.sqlite.gz"], tmp_path)
    a = _load([H200 / "model_train.kineto.json.gz"], tmp_path)
    c = compare(b, a)
    d = c.to_dict()
    assert d["verdict"] == "same" and d["judged_on"] == "GPU busy time"
    assert {k["status"] for k in d["kernels"]} == {"matched"}
    assert d["comparable"]["work_overlap"]["kernel families"] == 1.0
    assert d["findings"]["resolved"] == [] and d["findings"]["new"] == []
    busy_b = int(b.kernels["dur_ns"].sum())
    assert abs(d["before"]["gpu_busy_ns"] - busy_b) / busy_b < 0.01  # one stream: busy ~ sum of kernels
    assert any("different profilers" in n for n in d["notes"])


def test_tail_vs_balanced_is_not_comparable(tmp_path):
    r = _run(["compare", str(H200 / "tail.sqlite.gz"), str(H200 / "balanced.sqlite.gz"), "--json"], tmp_path)
    assert r.exit_code == 0
    d = json.loads(r.stdout)
    assert d["verdict"] == "not_comparable" and "no GEMM shape in common" in d["why"]
    r = _run(["compare", str(H200 / "tail.sqlite.gz"), str(H200 / "balanced.sqlite.gz"), "--fail-on-regression", "5"],
             tmp_path)
    assert r.exit_code == 2 and "not comparable" in r.output


def test_different_devices_from_the_corpus(corpus, tmp_path):
    b = _load([corpus / "kineto" / "hta_a100_nccl.json.gz"], tmp_path)
    a = _load([corpus / "kineto" / "tracelens_h100_bert_small.json.gz"], tmp_path)
    c = compare(b, a)
    assert c.verdict == "not_comparable" and c.why.startswith("different devices")
    assert "A100" in c.why and "H100" in c.why


def test_cli_errors_are_one_line(tmp_path):
    r = _run(["compare", str(H200 / "tail.sqlite.gz")], tmp_path)
    assert r.exit_code == 2 and "no after trace" in r.output
    r = _run(["compare", str(tmp_path / "missing.json"), str(H200 / "tail.sqlite.gz")], tmp_path)
    assert r.exit_code == 2 and "Traceback" not in r.output


# ------------------------------------------------------------------ names


def test_family_agrees_across_demanglers():
    nsys = "void at::native::<unnamed>::cunn_SoftMaxForward<(int)4, float, float, float, at::native::<unnamed>::LogSoftMaxForwardEpilogue>(T4 *, const T2 *, int)"
    kin = "void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, at::native::(anonymous namespace)::LogSoftMaxForwardEpilogue>(float*, float const*, int)"
    assert family(nsys) == family(kin)
    assert family("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") == family("nvjet_sm90_tst_320x128_64x3_1x2_h_bz_coopA_NNT")
    assert family("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT") != family("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT")


@pytest.mark.parametrize("name,kind", [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", "attention"),
    ("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "communication"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>", "copy"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>", "reduction"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::GeluCUDAKernelImpl>", "elementwise"),
    ("triton_poi_fused_add_0", "elementwise"),
    ("triton_red_fused_sum_1", "reduction"),
    ("cutlass::Kernel2<cutlass_80_wmma_tensorop_bf16_s161616gemm_bf16_16x16_128x2_tn_align8>", "gemm"),
    ("my_kernel", "other"),
])
def test_kernel_classes(name, kind):
    assert classify_name(name) == kind

