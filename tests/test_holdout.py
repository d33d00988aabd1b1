"""advisor on hold-out models nobody tuned a rule on (tests/data/h200/holdout/, captured on the
H200 by workloads/holdout_models.py), and the wall-time estimates of every model trace whose
bare step time we measured, checked against that time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from synthetic import H100, kernel, launch, make_trace

from advisor.diagnose.diagnosis import diagnose
from advisor.report.render import render
from advisor.symptoms import intervals
from advisor.traces import load_trace
from conftest import DATA

HOLD = DATA / "h200" / "holdout"
HF = DATA / "h200" / "hf"


def _diag(name: str):
    return diagnose(load_trace(HOLD / f"holdout_{name}.kineto.json.gz"))


def _wall_ns(d) -> int:
    return sum(f.est_savings_ns for f in d.findings if f.savings_unit == "wall")


def test_whisper_cross_attention_split_by_cudnn_is_no_split_kv_finding():
    # 1 query over 1,500 encoder keys, 12 heads: cuDNN ran it on an 8 x 12 grid (it divides the
    # keys itself, no combine kernel after it); the greedy argmax on one block is real
    d = _diag("whisper_generate")
    assert not [f for f in d.findings if f.symptom == "decode_attention_unsplit"]
    (f,) = [f for f in d.findings if f.symptom == "underfilled_long_kernel"]
    assert "ArgMaxOps" in f.kernel and f.grid == [1, 1, 1]


def test_t5_fp32_attention_is_traced_to_the_math_sdpa_backend():
    # T5 under bf16 autocast: its relative position bias sends SDPA to the math backend, which
    # computes bf16 in fp32; casting the model is not the fix, the backend is
    d = _diag("t5_train")
    (f,) = [f for f in d.findings if f.symptom == "dtype_churn"]
    assert f.strategy == "sdpa_backend"
    assert f.evidence["math_sdpa_launches"] == 48 and "math backend" in f.evidence["cause"]
    assert "allow_fp16_bf16_reduction_math_sdp" in f.suggestion["fix"] and "peft" not in f.suggestion["fix"]
    # why the fused backends refused, read from the calls' recorded strides: the position bias
    # [1, H, L, S] is laid out [1, L, S, H] (checked on the H200 by the probe and by the fix)
    (refusal,) = f.evidence["math_sdpa_refusals"]
    assert refusal["code"] == "mask_last_stride" and refusal["calls"] == f.evidence["math_sdpa_calls"] == 24
    assert f.evidence["math_sdpa_unexplained"] == 0 and "stride 12" in f.evidence["cause"]
    assert f.suggestion["fix"].startswith("make the mask contiguous")
    md = render("diagnosis.md.j2", d=d)
    assert "- Cause: " in md and "its backward's GEMMs are fp32 too" in f.evidence["cause"]  # a training step
    # the matrix row's advice for this strategy, not the cast's (a PEFT adapter is not the problem)
    (try_line,) = [ln for ln in md.splitlines() if ln.startswith("- Try: ") and "math backend" in ln]
    assert "peft" not in try_line.lower() and not [ln for ln in md.splitlines() if "- Try: Cast the fp32 part" in ln]


def test_a_named_sdpa_refusal_claims_the_math_path_and_stays_under_the_measured_fix():
    # UMT5 with a padding mask: the merged mask has stride 12 on its last dim. Made contiguous
    # (holdout_umt5_encode_padded_contiguous_mask) a fused backend ran: 15.91 -> 6.59 ms of
    # kernels on the H200 (2026-12-04); the fp32 GEMMs and casts alone claimed 3.21 ms
    d = _diag("umt5_encode_padded")
    (f,) = [f for f in d.findings if f.symptom == "dtype_churn"]
    assert f.evidence["math_sdpa_refusals"][0]["code"] == "mask_last_stride"
    assert 3.3e6 < f.est_savings_ns <= 9.32e6 and f.est_savings_ns <= f.total_ns
    assert f.evidence["basis"].startswith("a fused backend in place of the math backend's forward")
    assert "4.34x" in f.evidence["basis"]  # the measured SDPA speedup on T5's shape, rules/measured
    # Falcon's multi-query decode: K/V broadcast over 32 heads with enable_gqa off. With it on,
    # cuDNN ran: 48.38 -> 14.81 ms; the claim is the prefill's (no decode-shaped ratio measured)
    d = _diag("falcon_decode_mqa")
    (f,) = [f for f in d.findings if f.symptom == "dtype_churn"]
    assert f.evidence["math_sdpa_refusals"][0]["code"] == "kv_heads_broadcast"
    assert f.suggestion["fix"].startswith("pass enable_gqa=True")
    assert 7.8e6 < f.est_savings_ns <= 33.57e6
    for fixed in ("umt5_encode_padded_contiguous_mask", "falcon_decode_mqa_gqa"):
        assert not [f for f in _diag(fixed).findings if f.symptom == "dtype_churn"]


def test_gemma_in_fp32_is_told_to_use_tensor_cores_first():
    d = _diag("gemma_prefill")
    top = d.findings[0]
    assert top.symptom == "tensor_cores_unused" and top.tier == 3 and top.confidence == "high"
    assert top.est_savings_ns < top.total_ns


def test_record_shapes_cost_is_taken_off_host_bound_gaps():
    # one host-bound device: 64 tiny kernels, 40 us idle before each; with 10 recorded ops a
    # launch the profiler's own 3 us an op (rules/launch_overhead.toml) is 30 us of each gap:
    # 630 ops in the device's span (the first launch's 10 come before its first kernel) against
    # 63 gaps of 40 us leave the bare program 1 - 1.89 / 2.52 = 25% of them
    def trace(ops_per_launch):
        kernels, runtime, ops = [], [], []
        t = 0
        for i in range(64):
            runtime.append(launch(i + 1, t + 35_000))
            for j in range(ops_per_launch):
                s = t + 1000 + j * 3000
                ops.append({"rank": 0, "thread_id": 1, "start_ns": s, "end_ns": s + 2500, "dur_ns": 2500,
                            "name": "aten::add", "input_dims": "[[8], [8]]", "input_types": '["float", "float"]'})
            kernels.append(kernel(t + 40_000, 5_000, name="void at::native::vectorized_elementwise_kernel<4>()",
                                  corr=i + 1))
            t += 45_000
        return make_trace(kernels, devices=(H100,), runtime=runtime, cpu_ops=ops)

    bare = [f for f in diagnose(trace(0)).findings if f.savings_unit == "wall"]
    rec = [f for f in diagnose(trace(10)).findings if f.savings_unit == "wall"]
    assert bare and rec
    raw, net = sum(f.est_savings_ns for f in bare), sum(f.est_savings_ns for f in rec)
    assert net == pytest.approx(raw * (1 - 630 * 3000 / (63 * 40_000)), rel=0.02)
    assert all("profiler's own host cost" in f.evidence["basis"] for f in rec)


def _bare_steps():
    """(trace path, bare time of the profiled steps in ms) for every capture with a timing: the
    median of every bare timing of that model (the capture's own and the time-only runs: a
    host-bound step varies 10-40% between runs on the shared GPU host)."""
    out = []
    rows = [json.loads(line) for line in (HOLD / "holdout.jsonl").read_text().splitlines()]
    times: dict = {}
    for r in rows:
        if "step_ms" in r:
            times.setdefault(r["model"], []).append(r["step_ms"])
    for r in rows:
        # captures only (time-only rows time the fixes; some captures are not committed: size)
        if "step_ms" in r and r.get("file") and (HOLD / r["file"]).exists():
            t = sorted(times[r["model"]])
            # the profiled window holds --steps steps: 2 by default, 1 where the row says so
            out.append((HOLD / r["file"], r.get("steps", 2) * t[len(t) // 2]))
    step = {}
    for line in (HF / "timings.jsonl").read_text().splitlines():
        r = json.loads(line)
        step[r["scenario"]] = r["step_ms"]["median"]
    for meta in sorted(HF.glob("hf_*.meta.json")):
        m = json.loads(meta.read_text())
        for key, cap in (m.get("captures") or {}).items():
            if m["scenario"] in step:
                out.append((HF / cap["file"], cap["steps"] * step[m["scenario"]]))
    return out


@pytest.mark.slow
def test_wall_claims_stay_near_the_bare_programs_idle_time():
    # The bare step's idle time (step time minus kernel time) is all a CUDA graph can win back.
    # Gaps under a recording profiler were up to 15x that before the profiler's own cost was
    # taken off; now 0.2-3.0x over these 62 captures against the median bare step of each
    # model: host-bound steps vary 10-40% (Swin-T 7.5-16.2 ms) between runs on the shared GPU
    # host, so the bound is 3x the median's idle (docs/profiler_cost.md)
    cases = _bare_steps()
    assert len(cases) >= 65
    worst = []
    for path, bare_ms in cases:
        t = load_trace(path)
        # the union of the kernels' times: cuDNN's LSTM runs two streams at once (summed, its
        # kernels take 42.8 ms of a 37 ms bare pair of steps)
        busy_ms = intervals.total(t.kernels["start_ns"], t.kernels["end_ns"]) / 1e6
        idle_ms = max(0.0, bare_ms - busy_ms)
        claim_ms = _wall_ns(diagnose(t)) / 1e6
        worst.append((claim_ms - 3 * idle_ms, Path(path).name, claim_ms, idle_ms))
    # the captures known to claim more, each in docs/holdout.md: SegFormer's bare step is
    # GPU-bound (21.9 ms against 21.4 of kernels) while under Kineto its host paid >= 8.4 us a
    # recorded op, not the 3 us the correction takes; nothing in the trace tells (a new one
    # here, or this one fixed, fails the test until the list is updated)
    over = {w[1]: w for w in worst if w[0] > 1.0}
    assert set(over) == {"holdout_segformer_infer_fp16.kineto.json.gz"}, over


# ------------------------------------------------------------ the second set (2026-12-03)

def _diag_file(name: str):
    return diagnose(load_trace(HOLD / name))


@pytest.mark.parametrize("name", ["holdout_resnet50_train.kineto.json.gz", "holdout_resnet50_train.sqlite.gz",
                                  "holdout_mobilenet_b8.kineto.json.gz"])
def test_align2_kernels_inside_convolutions_are_no_gemm_to_pad(name):
    # cuDNN ran NCHW 1x1 convolutions as CUTLASS align1/align2 GEMMs over 14 x 14 = 196-element
    # rows: padding a GEMM dimension is not the fix (and "no dimension is misaligned" was said
    # of a shape nobody knew); the diagnosis says what they are instead
    d = _diag_file(name)
    assert not [f for f in d.findings if f.symptom == "misaligned_gemm"]
    (note,) = [n for n in d.notes if "inside convolutions" in n]
    assert "channels_last" in note and "launches" in note


def test_an_unshaped_misaligned_gemm_does_not_claim_its_dimensions_are_aligned():
    from advisor.symptoms.misaligned_gemm import _fix

    assert "no dimension is misaligned" in _fix({}, 64, shape_known=True)
    unknown = _fix({}, 64, shape_known=False)
    assert "no dimension is misaligned" not in unknown and "shape is unknown" in unknown


def test_kernel_time_findings_on_a_host_bound_device_say_the_host_may_be_the_floor():
    # MoE forward: the GPU waits on launches for most of its span; the sort's kernel time is real,
    # but it shortens the step only as far as the host keeps ahead (ResNet-50's channels_last
    # lesson: GPU time -12.3 ms, step -0.9 ms)
    d = _diag_file("holdout_mixtral_moe.kineto.json.gz")
    (sort,) = [f for f in d.findings if f.symptom == "underfilled_long_kernel"]
    assert "radixSortKVInPlace" in sort.kernel and "torch.sort" in sort.evidence["library"]
    assert "host keeps ahead" in sort.evidence["step_time_caveat"]
    assert "- Step time: " in render("diagnosis.md.j2", d=d)
    # a GPU-bound step (BERT in fp32: 85.5 ms busy of an 88.6 ms span) carries no such caveat
    bert = _diag_file("holdout_bert_train_fp32.kineto.json.gz")
    assert bert.findings[0].symptom == "tensor_cores_unused"
    assert not [f for f in bert.findings if "step_time_caveat" in f.evidence]


def test_a_full_prefill_on_library_kernels_has_nothing_to_gain():
    assert _diag_file("holdout_qwen2_prefill.kineto.json.gz").findings == []


def test_runs_of_inductor_kernels_are_graphed_not_fused_again():
    # GPT-2 under torch.compile: the tiny-kernel runs are Inductor's triton_* kernels already;
    # advising torch.compile to a compiled model would be wrong: the launches are what is left
    d = _diag("gpt2_compile_train")
    runs = [f for f in d.findings if f.symptom == "launch_overhead" and f.evidence.get("run_kind")]
    assert runs and all(f.strategy == "cuda_graph" for f in runs)
    (f,) = [f for f in runs if f.evidence["run_kind"] == "compiled_run"]
    assert f.evidence["compiled_share"] > 0.5 and f.tier == 1
    assert "Compiled already" in render("diagnosis.md.j2", d=d)


def test_fp32_model_with_tf32_convolutions_is_told_to_enable_tf32_matmuls():
    # Wav2Vec2 in fp32 (from_config's dtype): cuDNN ran its convolutions on TF32 (PyTorch's
    # default) and cuBLAS its matmuls in full fp32 (13.1 of 39.3 ms); by work the TF32 convs
    # dominate, which once hid the finding. allow_tf32 took the GPU time to 29.8 ms (H200)
    d = _diag("wav2vec2_train_fp32")
    top = d.findings[0]
    assert top.symptom == "tensor_cores_unused" and top.evidence["tf32_in_cudnn_only"] is True
    assert 9.5e6 < top.est_savings_ns < 13.1e6  # the fix measured 9.5 ms; the claim is the roofline bound
    assert not [f for f in d.findings if f.symptom in ("layout_churn", "small_grid_long_k")]
    assert any("1-D convolutions" in n and "channels_last" in n for n in d.notes)
    assert not [f for f in _diag("wav2vec2_train_tf32").findings if f.symptom == "tensor_cores_unused"]


def test_clip_patch_embedding_transposes_go_with_channels_last():
    # CLIP's one NCHW patch-embedding convolution: 6 transposes, 0.36 ms over two steps;
    # channels_last removed them (GPU time 8.88 -> 8.58 ms)
    (f,) = [f for f in _diag("clip_infer_fp16").findings if f.symptom == "layout_churn"]
    assert f.strategy == "channels_last" and f.evidence["transpose_launches"] == 6
    assert not [f for f in _diag("clip_infer_fp16_cl").findings if f.symptom == "layout_churn"]


# ------------------------------------------------------------ the fifth set (2026-12-03)

def test_lstm_fp32_output_layer_is_told_to_enable_tf32_though_cudnn_uses_it():
    # cuDNN's LSTM runs its GEMMs on TF32 (cudnn.allow_tf32 is on by default) while the fp32
    # output layer's matmuls run on FFMA (the matmul switch is off): 16 ms, 37% of the GPU time
    d = _diag_file("holdout_lstm_lm_train.kineto.json.gz")
    top = d.findings[0]
    assert top.symptom == "tensor_cores_unused" and top.evidence["tf32_in_cudnn_only"] is True
    assert "allow_tf32" in top.suggestion["fix"]
    assert 10e6 < top.est_savings_ns < top.total_ns


def test_a_recurrent_layer_s_launch_loop_is_graphed_not_grouped():
    # a GEMM and a cell kernel per time step: each step's GEMM reads the last step's output
    d = _diag_file("holdout_lstm_lm_train.kineto.json.gz")
    runs = [f for f in d.findings if f.symptom == "launch_overhead"]
    assert runs
    assert all(f.strategy == "cuda_graph" and f.evidence["run_kind"] == "recurrent_run" for f in runs)
    assert "Recurrent layer" in render("diagnosis.md.j2", d=d)


def test_gaps_of_two_streams_waiting_at_once_count_once():
    # two streams, each a run of 40 tiny kernels whose 30 us gaps fall at the same times: the
    # GPU waited 39 x 30 us, not twice that
    kernels, runtime = [], []
    for i in range(40):
        t = i * 35_000
        for s, corr in ((7, 2 * i + 1), (8, 2 * i + 2)):
            runtime.append(launch(corr, t + 29_000))
            kernels.append(kernel(t + 30_000, 5_000, name="void at::native::vectorized_elementwise_kernel<4>()",
                                  stream=s, corr=corr))
    d = diagnose(make_trace(kernels, devices=(H100,), runtime=runtime))
    wall = sum(f.est_savings_ns for f in d.findings if f.symptom == "launch_overhead" and f.savings_unit == "wall")
    assert wall == pytest.approx(39 * 30_000, rel=0.01)


def test_a_kernel_time_finding_says_when_the_host_would_eat_it():
    # with TF32 the LSTM's GPU time fell ~13 ms over two steps and its step 0.4 ms a step: the
    # replayed launches say the window ends only a little earlier; BERT fp32's step fell 25 ms
    # a step with TF32 (43.5 -> 18.2 ms), and its replay keeps most of the estimate
    lstm = _diag_file("holdout_lstm_lm_train.kineto.json.gz").findings[0]
    lo, hi = lstm.evidence["step_effect_ns"]
    assert lstm.symptom == "tensor_cores_unused" and 0 <= lo <= hi < 0.5 * lstm.est_savings_ns
    assert "replaying" in lstm.evidence["step_time_caveat"]
    bert = _diag_file("holdout_bert_train_fp32.kineto.json.gz").findings[0]
    lo, hi = bert.evidence["step_effect_ns"]
    assert bert.symptom == "tensor_cores_unused" and lo > 0.8 * bert.est_savings_ns
    assert "step_time_caveat" not in bert.evidence


def test_a_graph_finding_counts_the_host_syncs_it_cannot_hold():
    # holdout_detr_train: DETR's Hungarian matcher copies its cost matrix to the host and runs
    # scipy (39 cudaStreamSynchronize on the forward thread, not the autograd thread that
    # launches most); a CUDA graph of the whole step is out of reach, and the finding says so
    (f,) = [f for f in diagnose(load_trace(DATA / "h200/holdout/holdout_detr_train.kineto.json.gz")).findings
            if f.suggestion.get("cuda_graph")]
    assert f.evidence["host_syncs"] == 39 and "39 times" in f.suggestion["graph_caveat"]
    # ResNet-18 at batch 1: its two synchronising calls fall outside its GPU work: nothing to say
    (g,) = [f for f in diagnose(load_trace(DATA / "h200/holdout/holdout_resnet18_b1_fp32.kineto.json.gz")).findings
            if f.suggestion.get("cuda_graph")]
    assert "host_syncs" not in g.evidence and "graph_caveat" not in g.suggestion
