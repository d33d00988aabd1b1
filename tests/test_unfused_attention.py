"""unfused_attention: attention computed op by op (matmul, softmax, matmul), found from the host
ops that launched it, and what the measured SDPA ratios let it claim (rules/measured/h200.toml
[[attention_fusion]], bench/bench_attention_fusion.py)."""

from __future__ import annotations

import json

import pytest
from synthetic import H100, kernel, launch, make_trace, nvtx

from advisor.diagnose.diagnosis import diagnose
from advisor.symptoms.calibration import attention_fusion_ratio
from advisor.traces import load_trace
from conftest import DATA

HOLD = DATA / "h200" / "holdout"
H200 = dict(H100, name="NVIDIA H200")
BF16 = '"c10::BFloat16"'
GEMM = "nvjet_sm90_tst_128x128_64x4_1x2_h_bz_TNT"
SOFTMAX = "void (anonymous namespace)::softmax_warp_forward<c10::BFloat16, c10::BFloat16, float, 10, false, false>(...)"
ADD = "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>>(...)"


def op(name, start, end, dims, thread=1, types=(BF16, BF16)):
    return {"rank": 0, "thread_id": thread, "start_ns": start, "end_ns": end, "dur_ns": end - start, "name": name,
            "input_dims": json.dumps(dims), "input_types": "[" + ", ".join(types) + "]"}


def chain_trace(B=8, H=12, L=1024, S=1024, D=64, chains=6, durs=(300_000, 200_000, 400_000, 300_000), sdpa=False,
                device=H200, extra_ns=0, order_ok=True):
    """`chains` op-by-op attentions on thread 1: matmul (q @ k^T) -> add (bias) -> softmax ->
    matmul (p @ v), each op launching one kernel of the given duration; `sdpa` wraps each in an
    aten::scaled_dot_product_attention op (its math path). `extra_ns` of other work after each."""
    ops, runtime, kernels = [], [], []
    t, gpu, corr = 0, 0, 1
    qk = [[B, H, L, D], [B, H, D, S]]
    sc = [[B, H, L, S]]
    pv = [[B, H, L, S], [B, H, S, D]]
    steps = [("aten::matmul", qk, GEMM), ("aten::add", [sc[0], [1, H, L, S]], ADD),
             ("aten::softmax", [sc[0], [], []], SOFTMAX), ("aten::matmul", pv, GEMM)]
    if not order_ok:  # the output GEMM's operands do not fit the scores
        steps[3] = ("aten::matmul", [[B, H, L, D], [B, H, D, S]], GEMM)
    for _ in range(chains):
        t0 = t
        for (name, dims, kname), dur in zip(steps, durs):
            ops.append(op(name, t, t + 20_000, dims))
            runtime.append(launch(corr, t + 5_000))
            kernels.append(kernel(max(gpu, t + 10_000), dur, name=kname, grid=(132, 1, 1), corr=corr))
            gpu = max(gpu, t + 10_000) + dur
            corr += 1
            t += 25_000
        if sdpa:
            ops.append(op("aten::scaled_dot_product_attention", t0 - 1_000, t + 1_000, [qk[0], qk[0], qk[0]]))
        if extra_ns:
            runtime.append(launch(corr, t + 5_000))
            kernels.append(kernel(max(gpu, t + 10_000), extra_ns, name=GEMM, grid=(132, 1, 1), corr=corr))
            gpu = max(gpu, t + 10_000) + extra_ns
            corr += 1
        t = max(t, gpu) + 50_000
    return make_trace(kernels, devices=(device,), runtime=runtime, cpu_ops=ops)


def by(d, symptom):
    return [f for f in d.findings if f.symptom == symptom]


def test_gpt2_sized_chain_is_a_tier3_finding_bounded_by_the_measured_ratio():
    d = diagnose(chain_trace())
    (f,) = by(d, "unfused_attention")
    assert f.strategy == "fused_attention" and f.tier == 3 and f.confidence == "high"
    assert f.evidence["chains"] == 6 and f.evidence["kernels_per_chain"] == 4
    assert f.shape == {"M": 1024, "N": 1024, "K": 64, "batch": 96, "dtype": "bf16"}
    # 6 chains of 1.2 ms; SDPA measured 5.55x this very shape (non-causal) on the H200
    ratio, _, how = attention_fusion_ratio(H200, {"L": 1024, "S": 1024, "D": 64, "dtype": "bf16"}, 2.0)
    assert how == "exact" and 5 < ratio < 6
    assert f.total_ns == 6 * 1_200_000
    assert f.est_savings_ns == pytest.approx(f.total_ns * (1 - 1 / ratio), rel=1e-3)
    assert "scaled_dot_product_attention" in f.suggestion["fix"]
    # its GEMMs get no Tier-4 schedule
    assert not [x for x in d.findings if x.tier == 4 and GEMM in x.kernel]


def test_chain_inside_sdpa_is_its_math_backend_not_this_finding():
    assert not by(diagnose(chain_trace(sdpa=True)), "unfused_attention")


def test_matmuls_whose_shapes_do_not_chain_are_not_attention():
    assert not by(diagnose(chain_trace(order_ok=False)), "unfused_attention")


def test_short_windows_where_sdpa_measured_slower_are_a_note_not_a_finding():
    # Swin's 7 x 7 windows: SDPA (cuDNN) measured 0.61x the op-by-op time at L = S = 49, D = 32
    d = diagnose(chain_trace(B=2048, H=3, L=49, S=49, D=32, durs=(50_000, 30_000, 40_000, 50_000)))
    assert not by(d, "unfused_attention")
    (note,) = [n for n in d.notes if "op by op" in n]
    assert "0.61x" in note and "no GPU time" in note


def test_unmeasured_gpu_reads_the_h200_ratios_at_lower_confidence():
    a100 = dict(H100, name="NVIDIA A100-SXM4-80GB", cc_major=8, arch="8.0", sm_count=108)
    (f,) = by(diagnose(chain_trace(device=a100)), "unfused_attention")
    assert f.confidence == "medium" and "not this GPU" in f.evidence["basis"]


def test_ratio_lookup_near_below_and_causal_rows_skipped():
    near = attention_fusion_ratio(H200, {"L": 900, "S": 900, "D": 64, "dtype": "bf16"}, 2.0)
    assert near[2] == "near"
    # the causal long row (17.7x) is never read: the non-causal 4096 x 4096 D128 one (6.6x) is
    long = attention_fusion_ratio(H200, {"L": 4096, "S": 4096, "D": 128, "dtype": "bf16"}, 2.0)
    assert long[2] == "exact" and 6 < long[0] < 7
    # far above every measured score matrix: the largest below it, at low confidence
    big = attention_fusion_ratio(H200, {"L": 32768, "S": 32768, "D": 64, "dtype": "bf16"}, 2.0)
    assert big[2] == "below"
    # fp32 rows are read for fp32 chains only
    fp32 = attention_fusion_ratio(H200, {"L": 256, "S": 256, "D": 64, "dtype": "fp32"}, 2.0)
    assert fp32[2] == "exact" and 1.3 < fp32[0] < 1.8
    assert attention_fusion_ratio(H200, {"L": 2, "S": 2, "D": 8, "dtype": "bf16"}, 2.0) is None


def test_emit_nvtx_ranges_find_the_chain_too():
    ranges, runtime, kernels = [], [], []
    t, corr = 0, 1
    for name, sizes, kname, dur in (("aten::matmul", [[2, 4, 512, 64], [2, 4, 64, 512]], GEMM, 200_000),
                                    ("aten::softmax", [[2, 4, 512, 512], [], []], SOFTMAX, 300_000),
                                    ("aten::matmul", [[2, 4, 512, 512], [2, 4, 512, 64]], GEMM, 200_000)):
        ranges.append(nvtx(f"{name}, seq = {corr}, op_id = {corr}, sizes = {json.dumps(sizes)}, input_op_ids = []",
                           t, t + 20_000))
        runtime.append(launch(corr, t + 5_000))
        kernels.append(kernel(t + 10_000 + corr * 400_000, dur, name=kname, grid=(132, 1, 1), corr=corr))
        corr += 1
        t += 25_000
    d = diagnose(make_trace(kernels, devices=(H200,), runtime=runtime, ranges=ranges))
    (f,) = by(d, "unfused_attention")
    assert f.evidence["chains"] == 1 and f.shape["M"] == 512 and f.shape["dtype"] is None


def test_gpt2_eager_training_step_on_the_h200():
    # GPT-2 (6 layers) with transformers' eager attention, bf16 autocast, 8 x 1024: SDPA took the
    # step from 45.0 to 28.4 ms and its GPU time from 85.4 to 54.8 ms over the two profiled steps
    # (forward and backward); the finding claims both, each at SDPA's measured ratio
    d = diagnose(load_trace(HOLD / "holdout_gpt2_eager_train.kineto.json.gz"))
    top = d.findings[0]
    assert top.symptom == "unfused_attention" and top.confidence == "high"
    assert top.evidence["chains"] == 12 and top.evidence["backward_chains"] == 12
    # forward at the 5.6x and backward at the 3.6x measured on this shape: 25.3 of the 30.6 ms
    assert 20e6 < top.est_savings_ns < 85.42e6 - 54.79e6
    assert top.evidence["backward_ns"] > 15e6  # the 12 backward chains (softmax backward and 4 GEMMs each)
    fixed = diagnose(load_trace(HOLD / "holdout_gpt2_sdpa_train.kineto.json.gz"))
    assert not by(fixed, "unfused_attention")


def test_swin_windows_are_no_gpu_time_finding_and_no_padding_advice():
    # timm Swin-T (fused_attn off by default): 49-token windows; SDPA's GPU time was no better
    # (9.80 vs 9.60 ms), the step was (host-bound: fewer launches)
    d = diagnose(load_trace(HOLD / "holdout_swin_infer.kineto.json.gz"))
    assert not by(d, "unfused_attention") and not by(d, "misaligned_gemm")
    assert any("op by op" in n and "no GPU time" in n for n in d.notes)
    assert any("score and output matmuls" in n for n in d.notes)


@pytest.mark.parametrize("bad", [[[10**30, 4, 8, 8], [1, 4, 8, 8]], [[True, 4, 8], [1, 8, 8]], "[[", [["a"]], [[2**31, 2**31, 2**31, 64]]])
def test_hostile_input_dims_are_no_chain_and_no_crash(bad):
    t = chain_trace(chains=1)
    ops = t.cpu_ops.copy()
    ops.loc[ops["name"] == "aten::softmax", "input_dims"] = bad if isinstance(bad, str) else json.dumps(bad)
    t2 = make_trace(t.kernels.to_dict("records"), devices=(H200,), runtime=t.runtime.to_dict("records"),
                    cpu_ops=ops.to_dict("records"))
    assert not by(diagnose(t2), "unfused_attention")


def test_fp32_chain_is_claimed_once_and_read_against_fp32_ratios_without_a_dtype():
    # fp32 SIMT GEMMs inside op-by-op attention: unfused_attention owns them (tensor_cores_unused
    # leaves them, or the two claims could exceed the chains' time), and with no dtype in the
    # ops (emit_nvtx) the kernels' fp32 names pick the fp32 ratios (1.1-1.6x), not the 16-bit ones
    sg = "ampere_sgemm_128x64_nn"
    t = chain_trace(durs=(600_000, 100_000, 200_000, 600_000))
    k = t.kernels.copy()
    k.loc[k["name"] == GEMM, "name"] = sg
    ops = t.cpu_ops.copy()
    ops["input_types"] = None
    d = diagnose(make_trace(k.to_dict("records"), devices=(H200,), runtime=t.runtime.to_dict("records"),
                            cpu_ops=ops.to_dict("records")))
    (f,) = by(d, "unfused_attention")
    assert not by(d, "tensor_cores_unused")
    assert f.evidence["groups"][0]["dtype"] == "fp32" and f.evidence["groups"][0]["measured_speedup"] < 2
    assert f.est_savings_ns < f.total_ns


def test_a_squeeze_excite_conv_is_not_a_1d_conv():
    from advisor.symptoms.context import Context
    from advisor.symptoms.layout_churn import conv1d_kernels
    from advisor.rules import load_rules

    ops = [op("aten::cudnn_convolution", 0, 50_000, [[8, 64, 1, 1], [16, 64, 1, 1]]),
           op("aten::cudnn_convolution", 100_000, 150_000, [[8, 64, 1, 999], [64, 64, 1, 3]])]
    runtime = [launch(1, 10_000), launch(2, 110_000)]
    kernels = [kernel(60_000, 5_000, name="nchwToNhwcKernel", corr=1), kernel(160_000, 5_000, name="nchwToNhwcKernel", corr=2)]
    t = make_trace(kernels, devices=(H200,), runtime=runtime, cpu_ops=ops)
    assert list(conv1d_kernels(Context(t, load_rules()))) == [False, True]
