"""What refused SDPA's fused backends, read from a math-backend call's recorded inputs
(advisor.symptoms.sdpa_eligibility; the refusals checked on the H200 by
bench/probe_sdpa_eligibility.py, table in bench/results/sdpa_eligibility/)."""

from __future__ import annotations

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
    # a key-length-1 mask: its last stride is irrelevant
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
