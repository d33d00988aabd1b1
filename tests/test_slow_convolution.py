"""slow_convolution: a 16-bit convolution far under its roofline that cuDNN runs faster in fp32
(advisor/symptoms/slow_convolution.py; measured by bench/probe_grouped_conv.py on the H200)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from advisor.diagnose.diagnosis import diagnose
from advisor.symptoms.calibration import conv_fp32_speedup
from advisor.symptoms.context import Context
from advisor.symptoms.conv_calls import _nested, conv_call, conv_calls
from advisor.symptoms.slow_convolution import _span
from advisor.traces import load_trace
from conftest import DATA

HOLD = DATA / "h200" / "holdout"
H200 = {"name": "NVIDIA H200", "sm_count": 132}
BF16 = json.dumps(["c10::BFloat16"] * 3)


def test_forward_and_backward_calls_read_as_recorded():
    # HuBERT's positional conv as Kineto records aten::convolution (input, weight, bias, stride,
    # padding, dilation, transposed, output_padding, groups)
    fwd = conv_call("aten::convolution", "[[8, 768, 499], [768, 48, 128], [768]]", BF16,
                    '["", "", "", "[1]", "[64]", "[1]", "False", "[0]", "16"]')
    assert fwd["groups"] == 16 and fwd["dtype"] == "bf16"
    # 500 outputs (499 + 2 x 64 - 127), 48 x 128 MACs each per output channel
    assert fwd["flop"] == 2.0 * 8 * 768 * 500 * 48 * 128
    # the backward: grad_output first; its output_mask says which gradients it makes
    bwd = conv_call("aten::convolution_backward", "[[8, 768, 500], [8, 768, 499], [768, 48, 128]]",
                    json.dumps(["c10::BFloat16"] * 3),
                    '["", "", "", "[768]", "[1]", "[64]", "[1]", "False", "[0]", "16", "[True, True, True]"]')
    assert bwd["flop"] == 2 * fwd["flop"]
    first = conv_call("aten::convolution_backward", "[[8, 512, 31999], [8, 1, 160000], [512, 1, 10]]", BF16,
                      '["", "", "", "[0]", "[5]", "[0]", "[1]", "False", "[0]", "1", "[False, True, False]"]')
    assert first["flop"] == 2.0 * 8 * 512 * 31999 * 1 * 10  # weight gradient only


def test_strides_paddings_and_missing_types():
    # HuBERT's first feature conv: kernel 10, stride 5 -> (160000 - 10) // 5 + 1 = 31999 outputs
    first = conv_call("aten::convolution", "[[8, 1, 160000], [512, 1, 10], []]", BF16,
                      '["", "", "", "[5]", "[0]", "[1]", "False", "[0]", "1"]')
    assert first["flop"] == 2.0 * 8 * 512 * 31999 * 1 * 10
    # 2-D, padding and stride per dim, dilation 2 along W: H (56 + 2 - 3) // 2 + 1 = 28,
    # W (56 + 4 - 2 * 2 - 1) // 1 + 1 = 56
    two = conv_call("aten::convolution", "[[4, 64, 56, 56], [128, 64, 3, 3], []]", BF16,
                    '["", "", "", "[2, 1]", "[1, 2]", "[1, 2]", "False", "[0, 0]", "1"]')
    assert two["flop"] == 2.0 * 4 * 128 * 28 * 56 * 64 * 9
    # the input bytes at 2 bytes an element, the weight and the output once (the bandwidth floor)
    assert two["bytes"] == 2.0 * (4 * 64 * 56 * 56 + 128 * 64 * 9 + 4 * 128 * 28 * 56)
    # without "Input type": no dtype (so never a 16-bit finding), and no crash
    nod = conv_call("aten::convolution_backward", "[[8, 768, 500], [8, 768, 499], [768, 48, 128]]", None,
                    '["", "", "", "[768]", "[1]", "[64]", "[1]", "False", "[0]", "16", "[True, True, True]"]')
    assert nod["dtype"] is None


def test_unreadable_and_transposed_calls_are_skipped():
    assert conv_call("aten::convolution", "[[8, 768, 499], [768, 48, 128], []]", BF16,
                     '["", "", "", "[2]", "[0]", "[1]", "True", "[0]", "16"]') is None  # transposed
    assert conv_call("aten::convolution", "[[8, 768, 499], [768, 48, 128], []]", BF16,
                     '["", "", "", "[1]", "[0]", "[1]", "False", "[0]", "3"]') is None  # 768 != 48 x 3
    assert conv_call("aten::convolution", "[[8, 768, 499]]", BF16, '[]') is None
    # a stride it cannot read (a symbolic size) is not taken for 1
    assert conv_call("aten::convolution", "[[8, 768, 499], [768, 48, 128], []]", BF16,
                     '["", "", "", "s0", "[64]", "[1]", "False", "[0]", "16"]') is None
    assert conv_call("aten::convolution", None, BF16, None) is None


def test_span_counts_overlapping_streams_once():
    s = np.array([0, 5, 20, 22], dtype=np.int64)
    e = np.array([10, 8, 30, 25], dtype=np.int64)
    assert _span(s, e) == 10 + 10


def test_the_measured_speedup_reaches_only_convolutions_like_the_measured_one():
    conv = {"dtype": "bf16", "groups": 16, "channels_per_group": 48, "kernel": 128, "spatial_dims": 1}
    sp, _, how = conv_fp32_speedup(H200, conv, 2.0)
    assert sp == pytest.approx(2.656) and how == "exact"
    assert conv_fp32_speedup(H200, dict(conv, channels_per_group=64, kernel=96), 2.0)[2] == "near"
    assert conv_fp32_speedup(H200, dict(conv, dtype="fp16"), 2.0)[2] == "near"  # measured in bf16
    assert conv_fp32_speedup(H200, dict(conv, kernel=3), 2.0) is None  # a 3-tap conv: not measured
    assert conv_fp32_speedup(H200, dict(conv, groups=1, channels_per_group=768), 2.0) is None
    assert conv_fp32_speedup(H200, dict(conv, groups=2), 2.0) is None  # 8x fewer groups
    assert conv_fp32_speedup(H200, dict(conv, spatial_dims=2, kernel=81), 2.0) is None  # a 9 x 9 2-D kernel
    assert conv_fp32_speedup(H200, dict(conv, dtype="fp32"), 2.0) is None
    mi300 = {"name": "AMD Instinct MI300X", "vendor": "AMD"}
    assert conv_fp32_speedup(mi300, conv, 2.0) is None  # MIOpen, not cuDNN
    assert conv_fp32_speedup({"name": "NVIDIA A100", "vendor": "NVIDIA"}, conv, 2.0)[2] == "other GPU"


def test_hubert_positional_conv_claim_stays_under_the_measured_fix():
    # H200, 2026-12-04: that convolution in fp32 took the busy GPU time 38.40 -> 25.92 ms
    d = diagnose(load_trace(HOLD / "holdout_hubert_train_bf16.kineto.json.gz"))
    (f,) = [f for f in d.findings if f.symptom == "slow_convolution"]
    assert f.strategy == "conv_in_fp32" and f.tier == 3 and f.confidence == "medium"
    assert "16 groups of 48 channels" in f.evidence["convolution"]
    # the union of its kernels, not their sum over 8 streams
    assert f.total_ns == f.evidence["span_ns"] < f.evidence["kernel_ns"]
    assert 5e6 < f.est_savings_ns <= 12.5e6
    assert "autocast" in f.suggestion["fix"]
    assert "implicit_convolve_sgemm" in f.kernel and f.kernel in f.evidence["covers_kernels"]
    # the fix applied: no finding on the convolution, and dtype_churn does not undo it
    fixed = diagnose(load_trace(HOLD / "holdout_hubert_train_bf16_conv_fp32.kineto.json.gz"))
    assert not [f for f in fixed.findings if f.symptom in ("slow_convolution", "dtype_churn")]


def test_a_forward_only_or_unmeasured_convolution_gets_a_note_at_most():
    # AST's patch embedding: one input channel, 16 x 16 kernel, stride 10, fp16 inference, 61x
    # its floor: nothing measured near it, and it runs forward only: a note, no finding
    d = diagnose(load_trace(HOLD / "holdout_ast_infer_fp16.kineto.json.gz"))
    assert not [f for f in d.findings if f.symptom == "slow_convolution"]
    (note,) = [n for n in d.notes if n.startswith("slow_convolution")]
    assert "x[16, 1, 128, 1024]" in note and "nothing is claimed" in note and "forward only" in note


def test_a_convolution_recorded_twice_under_autocast_is_one_call():
    # autocast's dispatcher records aten::convolution around the call it redispatches to (the
    # outer one casts the inputs, and records their types before the cast): one convolution,
    # read from the inner record; other threads and names stay apart
    ops = pd.DataFrame({"rank": [0, 0, 0, 0, 0, 0], "thread_id": [1, 1, 1, 2, 1, 1],
                        "name": ["aten::convolution", "aten::convolution", "aten::convolution_backward",
                                 "aten::convolution", "aten::convolution", "aten::convolution"],
                        "start_ns": [0, 10, 12, 10, 200, 200], "end_ns": [100, 90, 20, 90, 300, 300]})
    assert _nested(ops).tolist() == [True, False, False, False, True, False]
    # ConvMixer under bf16 autocast: 32 depthwise 7 x 7 convolutions forward and backward
    ranges, hit, calls = conv_calls(Context(load_trace(HOLD / "holdout_convmixer_train_bf16.kineto.json.gz")))
    used = {int(i) for i in np.unique(hit[hit >= 0]) if calls[i] and calls[i]["w"] == [768, 1, 7, 7]}
    assert len(used) == 64 and sum(calls[i]["backward"] for i in used) == 32


def test_grouped_pointwise_convolutions_on_cuda_cores_get_a_note():
    # SqueezeBERT under bf16 autocast: its grouped 1 x 1 projections (4 groups of 192 and 768
    # channels) run on cuDNN's implicit_convolve_sgemm, 15-19x their floor, 41% of GPU time
    # together; no remedy was measured near them (HuBERT's is a 128-tap kernel): notes, no claim
    d = diagnose(load_trace(HOLD / "holdout_squeezebert_train_bf16.kineto.json.gz"))
    assert not [f for f in d.findings if f.symptom == "slow_convolution"]
    notes = [n for n in d.notes if n.startswith("slow_convolution") and "CUDA-core kernel" in n]
    assert len(notes) == 3 and all("implicit_convolve_sgemm" in n and "nothing is claimed" in n for n in notes)
    assert all("batched matmul over the groups" in n and "4 groups of" in n for n in notes)


def test_pytorch_depthwise_kernels_are_left_to_layout_churn():
    # ConvMixer's 7 x 7 depthwise convolutions in PyTorch's own kernels: 53x their floor, but
    # channels_last (layout_churn) is their lever, not fp32 or a GEMM
    d = diagnose(load_trace(HOLD / "holdout_convmixer_train_bf16.kineto.json.gz"))
    assert not [f for f in d.findings if f.symptom == "slow_convolution"]
    assert not [n for n in d.notes if n.startswith("slow_convolution")]
    # stems on 3 input channels stay quiet though cuDNN runs some on CUDA cores
    for name in ("holdout_convnext_train_bf16.kineto.json.gz", "holdout_maxvit_train_bf16.kineto.json.gz"):
        assert not [n for n in diagnose(load_trace(HOLD / name)).notes if "CUDA-core kernel" in n]


def test_a_forward_only_convolution_on_cuda_cores_says_why_nothing_is_claimed():
    # HuBERT's positional convolution with its backward records dropped (an inference of it):
    # its shape was measured, but forward + backward, so the note says it runs forward only
    # rather than that nothing near it was measured
    import dataclasses

    t = load_trace(HOLD / "holdout_hubert_train_bf16.kineto.json.gz")
    ops = t.cpu_ops
    d = diagnose(dataclasses.replace(t, cpu_ops=ops[ops["name"] != "aten::convolution_backward"].reset_index(drop=True)))
    assert not [f for f in d.findings if f.symptom == "slow_convolution"]
    (note,) = [n for n in d.notes if n.startswith("slow_convolution")]
    assert "w[768, 48, 128]" in note and "runs forward only" in note and "no remedy was measured" not in note
