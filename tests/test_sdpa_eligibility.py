"""What refused SDPA's fused backends, read from a math-backend call's recorded inputs
(advisor.symptoms.sdpa_eligibility; the refusals checked on the H200 by
bench/probe_sdpa_eligibility.py, table in bench/results/sdpa_eligibility/)."""

from __future__ import annotations

import pytest

from advisor.symptoms.sdpa_eligibility import call_causes

Q = [16, 12, 512, 64]
Q_STRIDES = [393216, 64, 768, 1]


def _codes(dims, strides, dtypes=("bf16",) * 4):
    return [c for c, _ in call_causes(dims, strides, list(dtypes))]


def test_a_mask_with_the_heads_innermost_is_named():
    # UMT5's merged position-bias mask: [B, H, L, S] laid out [B, L, S, H]
    dims, strides = [Q, Q, Q, [16, 12, 512, 512]], [Q_STRIDES] * 3 + [[3145728, 1, 6144, 12]]
    ((code, why),) = call_causes(dims, strides, ["bf16"] * 4)
    assert code == "mask_last_stride" and "stride 12" in why


def test_contiguous_broadcast_and_maskless_calls_show_no_cause():
    assert _codes([Q, Q, Q, [16, 12, 512, 512]], [Q_STRIDES] * 3 + [[3145728, 262144, 512, 1]]) == []
    # broadcast over batch and heads (stride 0): the efficient and cuDNN backends take it
    assert _codes([Q, Q, Q, [16, 12, 512, 512]], [Q_STRIDES] * 3 + [[0, 0, 512, 1]]) == []
    assert _codes([Q, Q, Q, []], [Q_STRIDES] * 3 + [[]]) == []
    # a key-length-1 mask with another stride: torch checks the stride whatever the size, but
    # that refusal was not checked on the GPU, so it is not named (the call counts unexplained)
    assert _codes([Q, Q, Q, [16, 12, 512, 1]], [Q_STRIDES] * 3 + [[6144, 512, 1, 7]]) == []


def test_a_strided_query_and_an_odd_head_size_are_named():
    q66 = [2, 8, 256, 66]
    assert _codes([Q, Q, Q, []], [[393216, 64, 768, 2], Q_STRIDES, Q_STRIDES, []]) == ["q_last_stride"]
    mask = [2, 8, 256, 256]
    assert _codes([q66, q66, q66, mask], [[0, 0, 66, 1]] * 3 + [[0, 0, 256, 1]]) == ["head_dim_align"]
    # without a mask the flash backend takes head_dim 66; in fp32 no fused backend is expected
    assert _codes([q66, q66, q66, []], [[0, 0, 66, 1]] * 3 + [[]]) == []
    assert _codes([q66, q66, q66, mask], [[0, 0, 66, 1]] * 3 + [[0, 0, 256, 1]], ["fp32"] * 4) == []


def test_unreadable_inputs_show_nothing():
    assert call_causes(None, None, []) == []
    assert call_causes([Q], [Q_STRIDES], []) == []
    assert _codes([Q, Q, Q, [16, 12, 512, 512]], None) == []
    assert _codes([Q, Q, Q, [16, 12, 512, 512]], [Q_STRIDES] * 3 + [[1, 2]]) == []  # ranks disagree


def test_multi_query_kv_broadcast_without_enable_gqa_is_named():
    # Falcon's decode: q [8, 32, 1, 64], k and v [8, 1, S, 64], a bool mask, enable_gqa off
    q, kv, m = [8, 32, 1, 64], [8, 1, 1025, 64], [8, 1, 1, 1025]
    strides = [[2048, 64, 64, 1], [65600, 65600, 64, 1], [65600, 65600, 64, 1], [1025, 1025, 1025, 1]]
    (code, why), = call_causes([q, kv, kv, m], strides, ["bf16"] * 4, enable_gqa=False)
    assert code == "kv_heads_broadcast" and "1 head against q's 32" in why
    # enable_gqa on (cuDNN takes it with a mask), or not recorded: not named
    assert call_causes([q, kv, kv, m], strides, ["bf16"] * 4, enable_gqa=True) == []
    assert call_causes([q, kv, kv, m], strides, ["bf16"] * 4) == []



def test_head_causes_need_4d_calls():
    # a 3-D call (batch-broadcast K, odd D): torch refuses every fused backend for the rank, a
    # cause not named; neither the GQA nor the head-size fix would apply
    q3, k3 = [32, 512, 66], [1, 512, 66]
    assert call_causes([q3, k3, k3, [32, 512, 512]], [[0, 66, 1]] * 3 + [[0, 512, 1]], ["bf16"] * 4,
                       enable_gqa=False) == []


def _call(causes, ns=1e6, dims=(Q, Q, Q, [16, 12, 512, 512])):
    return {"dims": list(dims), "dtype": "bf16", "causes": causes, "ns": ns, "launches": 18, "names": {"k"}}


def test_groups_and_causes_over_calls():
    from advisor.symptoms.sdpa_eligibility import math_sdpa_causes, math_sdpa_groups

    cause = [("mask_last_stride", "why")]
    calls = [_call(cause), _call([]), _call(cause, dims=([8, 12, 1, 64], [8, 12, 700, 64], [8, 12, 700, 64], [])),
             _call(cause, dims=([12, 512, 64],) * 3)]  # 3-D: not grouped
    groups = math_sdpa_groups(calls)
    assert [(g["BH"], g["L"], g["S"], g["calls"]) for g in groups] == [(192, 512, 512, 2), (96, 1, 700, 1)]
    assert groups[0]["total_ns"] == 2e6 and groups[0]["launches"] == 36
    summary = math_sdpa_causes(calls)
    assert summary["calls"] == 4 and summary["unexplained"] == 1 and summary["causes"][0]["calls"] == 3
    assert math_sdpa_causes([]) == {}


def test_the_fused_claim_covers_only_explained_calls():
    # UMT5's shape (SDPA measured 4.34x over op-by-op attention there, rules/measured): one call
    # explained, one not; the fix named moves only the first
    from advisor.rules import load_rules
    from advisor.symptoms.dtype_churn import _fused_claim

    rule = load_rules()["dtype_churn"]
    one = _fused_claim([_call([("mask_last_stride", "why")]), _call([])], rule, None)
    both = _fused_claim([_call([("mask_last_stride", "why")])] * 2, rule, None)
    assert one["total"] == 1e6 and both["total"] == 2e6
    assert both["saved"] == pytest.approx(2 * one["saved"]) and 0 < one["saved"] < 1e6 * (1 - 1 / 4.34) + 1
    assert one["confidence"] in ("medium", "low")  # never high: the ratio is not this backend's
    assert _fused_claim([_call([])] * 2, rule, None) is None
