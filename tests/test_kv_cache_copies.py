"""kv_cache_copies: a KV cache copied every decode step (torch.cat onto the cache; K/V repeated to
the query heads before attention). Hand-built decode loops with the numbers worked out here, the
shapes as Kineto cpu_ops and as emit_nvtx ranges, and the H200 traces of the ninth hold-out set
(a Mistral decode before and after the fix the finding names)."""

from __future__ import annotations

import json

import pytest
from conftest import DATA
from synthetic import H100, kernel, launch, make_trace, nvtx

from advisor.diagnose.diagnosis import diagnose
from advisor.diagnose.remedies import code_change
from advisor.rules import load_rules
from advisor.symptoms.kv_cache_copies import _score_matmul, _tensors
from advisor.traces import load_trace

CAT = ("void at::native::(anonymous namespace)::CatArrayBatchedCopy<at::native::(anonymous namespace)::OpaqueType<2u>, "
       "unsigned int, 4, 64, 64>(at::native::(anonymous namespace)::OpaqueType<2u>*, ...)")
COPY = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::native::direct_copy_kernel_cuda"
        "(at::TensorIteratorBase&)::{lambda()#3}::operator()() const::{lambda()#12}::operator()() const::"
        "{lambda(c10::BFloat16)#1}> >(int, ...)")
SDPA = "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_35_16x128x64_1x4"
GEMM = "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT"
RULE = load_rules()["kv_cache_copies"]
BW = 4.27e12  # the synthetic H100's bandwidth, derated by the H200's measured ratio (test_basics)
B, HQ, HKV, D = 4, 32, 8, 64


def by(d, strategy):
    return [f for f in d.findings if f.symptom == "kv_cache_copies" and f.strategy == strategy]


def split(d):
    """native_gqa's two findings: (on the copy kernel, on the attention kernel)."""
    fs = by(d, "native_gqa")
    return next(f for f in fs if f.kernel == COPY), next(f for f in fs if f.kernel == SDPA)


class Loop:
    """One host thread: ops (Kineto cpu_ops with Input Dims, or emit_nvtx ranges with sizes)
    each launching one kernel."""

    def __init__(self, nvtx_ranges: bool = False):
        self.nv = nvtx_ranges
        self.kernels, self.runtime, self.ops, self.ranges, self.t, self.corr = [], [], [], [], 0, 0

    def add(self, name, dur, op=None, dims=None, grid=(132, 1, 1)):
        self.corr += 1
        t = self.t
        if op is not None:
            if self.nv:  # emit_nvtx flattens a TensorList into the sizes list
                flat = [x for d in dims for x in (d if d and isinstance(d[0], list) else [d])]
                self.ranges.append(nvtx(f"{op}, seq = {self.corr}, op_id = {self.corr}, sizes = {json.dumps(flat)}", t, t + 3000))
            else:
                self.ops.append({"rank": 0, "thread_id": 1, "start_ns": t, "end_ns": t + 3000, "dur_ns": 3000, "name": op,
                                 "input_dims": json.dumps(dims), "input_types": json.dumps(["c10::BFloat16"] * len(dims))})
        self.runtime.append(launch(self.corr, t + 500, dur=1000))
        self.kernels.append(kernel(t + 5000, dur, name=name, grid=grid, corr=self.corr))
        self.t = t + 5000 + dur + 1000
        return self

    def trace(self):
        return make_trace(self.kernels, devices=(H100,), runtime=self.runtime, cpu_ops=self.ops, ranges=self.ranges)


def decode(loop: Loop, steps=8, layers=2, S0=4096, grow=True, repeat=True, Lq=1, cat_ns=50_000, copy_ns=70_000,
           attn_ns=46_000, new=1):
    """A decode loop: per step and layer, K and V appended by cat, repeated to the query heads
    (or not), SDPA, and a GEMM."""
    for step in range(steps):
        S = S0 + (step * new if grow else 0)
        for _ in range(layers):
            for _kv in "kv":
                loop.add(CAT, cat_ns, "aten::cat", [[[B, HKV, S, D], [B, HKV, new, D]], []], grid=(264, 2, 1))
            if repeat:
                for _kv in "kv":
                    loop.add(COPY, copy_ns, "aten::reshape", [[B, HKV, HQ // HKV, S + new, D], []], grid=(65536, 1, 1))
            kv_heads = HQ if repeat else HKV
            loop.add(SDPA, attn_ns, "aten::scaled_dot_product_attention",
                     [[B, HQ, Lq, D], [B, kv_heads, S + new, D], [B, kv_heads, S + new, D], [B, 1, Lq, S + new]],
                     grid=(1, 32, 4))
            loop.add(GEMM, 100_000, "aten::mm", [[B, 2048], [2048, 2048]])
    return loop


def test_decode_loop_with_cat_and_repeated_kv():
    d = diagnose(decode(Loop()).trace())
    (cat,), (rep, att) = by(d, "static_kv_cache"), split(d)
    assert len(by(d, "native_gqa")) == 2
    n = 8 * 2 * 2  # steps x layers x (K, V)
    assert cat.tier == rep.tier == att.tier == 2 and cat.savings_unit == rep.savings_unit == "gpu"
    # an appended token is 4 KB: the in-place write's measured launch (6.2 us) is the floor
    assert cat.est_savings_ns == pytest.approx(n * (50_000 - 6200), abs=n)
    assert cat.evidence["growing"] and cat.evidence["copy_launches"] == n and cat.launches == n
    assert "[4, 8, 4096, 64] + [4, 8, 1, 64]" in cat.evidence["example_inputs"]
    # the repeat copies go whole (a finding on the copy kernel) ...
    assert rep.kernel == COPY and rep.evidence["n_rep"] == 4 and rep.launches == n
    assert rep.est_savings_ns == rep.total_ns == n * 70_000 and rep.evidence["bound_ns"] == 0
    # ... and cuDNN's decode attention keeps 0.43 of its time (above the grouped read's floor):
    # a finding on the attention kernel, sharing its budget with any other on it
    assert att.kernel == SDPA and att.launches == 16 and att.total_ns == 16 * 46_000
    assert att.est_savings_ns == pytest.approx(16 * (46_000 - 0.43 * 46_000), abs=16)
    # its floor: the grouped K/V read once (S = 4097..4104 keys)
    assert att.evidence["bound_ns"] == pytest.approx(sum(2 * 2 * B * HKV * (4097 + i) * D * 2 / BW * 1e9 for i in range(8)),
                                                     rel=1e-6)
    assert SDPA in rep.evidence["covers_kernels"]
    assert cat.confidence == rep.confidence == "high" and att.confidence == "medium"
    assert code_change(cat).kind == "static_kv_cache" and "cache_implementation=\"static\"" in code_change(cat).code
    assert code_change(rep).kind == "native_gqa" and "enable_gqa=True" in code_change(rep).code


def test_same_loop_from_emit_nvtx_ranges():
    kineto = diagnose(decode(Loop()).trace())
    nv = diagnose(decode(Loop(nvtx_ranges=True)).trace())
    for strategy in ("static_kv_cache", "native_gqa"):
        assert [(f.est_savings_ns, f.launches) for f in by(kineto, strategy)] == \
            [(f.est_savings_ns, f.launches) for f in by(nv, strategy)] != []


def test_grouped_attention_is_not_repeated():
    d = diagnose(decode(Loop(), repeat=False).trace())
    assert by(d, "native_gqa") == []
    (cat,) = by(d, "static_kv_cache")
    # the attention reads grouped K/V: a static cache under transformers' SDPA path repeats them
    assert cat.evidence["attention_reads_grouped_kv"] and cat.confidence == "medium"


def test_other_attention_backends_claim_the_copies_only():
    # FlashAttention's kernel: grouped K/V with a mask were measured in cuDNN only
    flash = "void flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 64, 4, false, false, cutlass::bfloat16_t>>(Params)"
    loop = decode(Loop())
    for kern in loop.kernels:
        if kern["name"] == SDPA:
            kern["name"] = flash
    (rep,) = by(diagnose(loop.trace()), "native_gqa")
    assert rep.kernel == COPY and rep.evidence["attention_excess_ns"] == 0 and rep.confidence == "medium"
    assert "math fallback" in rep.evidence["basis"]


def test_eager_attention_score_matmul():
    # transformers' eager path: repeat_kv, then q @ k^T as a matmul, softmax, @ v
    loop = Loop()
    for step in range(8):
        S = 4096 + step
        for _ in range(2):
            for _kv in "kv":
                loop.add(CAT, 50_000, "aten::cat", [[[B, HKV, S, D], [B, HKV, 1, D]], []], grid=(264, 2, 1))
            for _kv in "kv":
                loop.add(COPY, 70_000, "aten::reshape", [[B, HKV, HQ // HKV, S + 1, D], []], grid=(65536, 1, 1))
            loop.add(GEMM, 30_000, "aten::matmul", [[B, HQ, 1, D], [B, HQ, D, S + 1]])
            loop.add(GEMM, 100_000, "aten::mm", [[B, 2048], [2048, 2048]])
    d = diagnose(loop.trace())
    (cat,), (rep,) = by(d, "static_kv_cache"), by(d, "native_gqa")
    assert rep.est_savings_ns == 8 * 2 * 2 * 70_000 and rep.confidence == "medium"
    assert cat.est_savings_ns == pytest.approx(32 * (50_000 - 6200), abs=32)


def test_output_matmul_is_not_a_score_matmul():
    # eager attention's q @ k^T and p @ v have one form: [B, H, 1, D] @ [B, H, D, S] and
    # [B, H, 1, S] @ [B, H, S, D]. The second read as a score matmul (Llama eager decode on the
    # H200) was a "head dim" of 4097 over a "cache" of 64 positions.
    assert _score_matmul("matmul", [[4, 32, 1, 64], [4, 32, 64, 4097]]) == (4, 32, 32, 1, 4097, 64)
    assert _score_matmul("matmul", [[4, 32, 1, 4097], [4, 32, 4097, 64]]) is None
    assert _score_matmul("baddbmm", [[4, 1, 4097], [4, 1, 256], [4, 256, 4097]]) is None  # 3-D: not this form


def test_prefill_is_not_a_decode_step():
    # a prefill-like query (512 rows) on repeated K/V
    d = diagnose(decode(Loop(), Lq=512, grow=False, steps=4).trace())
    assert by(d, "native_gqa") == []  # not a decode step: a prefill's attention is no KV cache read


def test_decode_attention_never_below_the_grouped_read():
    # a long cache: reading the grouped K/V once takes longer than 0.43 of this attention's time
    S = 131072
    d = diagnose(decode(Loop(), S0=S, steps=4, attn_ns=400_000).trace())
    _, att = split(d)
    floor = 2 * B * HKV * (S + 1) * D * 2 / BW * 1e9
    assert 0.43 * 400_000 < floor < 400_000
    assert att.est_savings_ns == pytest.approx(4 * 2 * (400_000 - floor), rel=1e-4)


def test_sliding_window_shifted_by_cat():
    # constant length (the window), read whole by the decode attention right after: a cache
    d = diagnose(decode(Loop(), S0=4095, grow=False, repeat=False).trace())
    (cat,) = by(d, "static_kv_cache")
    assert cat.evidence["growing"] is False


@pytest.mark.parametrize("case", ["few", "no_decode", "halves", "short", "eval_logits", "variable_length",
                                  "one_repeat", "no_attention"])
def test_concatenations_that_are_no_cache(case):
    loop = Loop()
    if case == "few":  # under min_steps appends at the site
        decode(loop, steps=1, layers=1, repeat=False)
    elif case == "no_decode":  # a token appended to 196 patches, then attention over all 197 rows (a ViT)
        for _ in range(20):
            loop.add(CAT, 50_000, "aten::cat", [[[64, 196, 768], [64, 1, 768]], []])
            loop.add(SDPA, 50_000, "aten::scaled_dot_product_attention",
                     [[64, 12, 197, 64], [64, 12, 197, 64], [64, 12, 197, 64]])
    elif case == "halves":  # rotary's two halves
        for _ in range(20):
            loop.add(CAT, 50_000, "aten::cat", [[[4, 32, 4096, 32], [4, 32, 4096, 32]], []])
    elif case == "short":  # a cache of 100 positions
        decode(loop, S0=100, repeat=False)
    elif case == "eval_logits":  # an evaluation loop gathering logits batch by batch (Trainer's nested_concat)
        for i in range(40):
            loop.add(GEMM, 300_000, "aten::mm", [[8 * 128, 768], [768, 1000]])
            loop.add(CAT, 60_000, "aten::cat", [[[8 * (i + 32), 128, 1000], [8, 128, 1000]], []])
    elif case == "variable_length":  # training batches of varying length with 4 tokens appended
        for i in range(20):
            L = (384, 512, 640, 768)[i % 4]
            loop.add(CAT, 40_000, "aten::cat", [[[32, L, 12, 64], [32, 4, 12, 64]], []])
            loop.add(SDPA, 300_000, "aten::scaled_dot_product_attention", [[32, 12, L + 4, 64]] * 3)
    elif case == "one_repeat":  # one [B, 1, S, D] tensor repeated to the heads of a multi-head model
        for _ in range(16):
            loop.add(COPY, 30_000, "aten::repeat", [[1, 1, 2048, 128], []])
            loop.add(SDPA, 200_000, "aten::scaled_dot_product_attention", [[1, 32, 1, 128], [1, 32, 2048, 128],
                                                                            [1, 32, 2048, 128]])
    else:  # a growing cat with no attention at all
        for i in range(20):
            loop.add(CAT, 50_000, "aten::cat", [[[4, 8, 4096 + i, 64], [4, 8, 1, 64]], []])
    assert [f for f in diagnose(loop.trace()).findings if f.symptom == "kv_cache_copies"] == []


def test_tensor_shapes_from_input_dims():
    assert _tensors([[[4, 8, 4095, 64], [4, 8, 1, 64]], []]) == [[4, 8, 4095, 64], [4, 8, 1, 64]]  # Kineto
    assert _tensors([[4, 8, 4095, 64], [4, 8, 1, 64], []]) == [[4, 8, 4095, 64], [4, 8, 1, 64]]  # emit_nvtx
    assert _tensors([[0], [4, 8, 4096, 64], []]) == [[0], [4, 8, 4096, 64]]
    assert _tensors([[True, 2], [-1, 4], [2**40, 1], "x", None]) == []
    assert _tensors(None) == [] and _tensors("[[1, 2]]") == []


# ----------------------------------------------------------------------------- real traces (H200)

HOLD = DATA / "h200" / "holdout"


def _load(name, tmp_path):
    path = HOLD / name
    if not path.exists():
        pytest.skip(f"{name} not here")
    trace = load_trace([path], cache_dir=tmp_path)
    return trace, diagnose(trace)


@pytest.mark.slow
def test_mistral_decode_estimate_against_the_fix_applied(tmp_path):
    """The native_gqa estimate on the Mistral decode against the GPU time the fix removed when
    applied (workloads/holdout_models.py mistral_decode_grouped, same sizes, H200)."""
    t0, before = _load("holdout_mistral_decode_dynamic.kineto.json.gz", tmp_path)
    t1, after = _load("holdout_mistral_decode_grouped.kineto.json.gz", tmp_path)
    est = sum(f.est_savings_ns for f in by(before, "native_gqa"))
    measured = t0.kernels["dur_ns"].sum() - t1.kernels["dur_ns"].sum()
    assert measured > 0 and abs(est - measured) < 0.1 * measured
    assert by(after, "native_gqa") == [] and len(by(after, "static_kv_cache")) == 1
    (cat,) = by(before, "static_kv_cache")
    assert cat.evidence["growing"] is False  # Mistral's sliding window: the cat keeps 4095 positions
    assert cat.est_savings_ns <= cat.evidence["copy_ns"] - cat.evidence["bound_ns"]


@pytest.mark.slow
def test_mistral_decode_nsys_reads_as_kineto(tmp_path):
    kineto = _load("holdout_mistral_decode_dynamic.kineto.json.gz", tmp_path)[1]
    nsys = _load("holdout_mistral_decode_dynamic.sqlite.gz", tmp_path)[1]
    for strategy in ("static_kv_cache", "native_gqa"):
        a, b = by(kineto, strategy), by(nsys, strategy)
        assert [f.launches for f in a] == [f.launches for f in b] != []
        assert [f.est_savings_ns for f in b] == pytest.approx([f.est_savings_ns for f in a], rel=0.02)


def test_each_strategy_gets_its_own_try_line():
    from advisor.report.render import render

    d = diagnose(decode(Loop()).trace())
    md = render("diagnosis.md.j2", d=d)
    tries = [ln.replace("\\", "") for ln in md.splitlines() if ln.startswith("- Try: ")]  # markdown escapes
    assert any("cache_implementation" in t and "enable_gqa" not in t for t in tries)
    assert any("enable_gqa=True" in t and "cache_implementation" not in t for t in tries)
    assert RULE.try_first_with("no_such_strategy") == RULE.try_first


def test_try_first_table_is_checked(tmp_path):
    from advisor.errors import AdvisorError
    from advisor.resources import rules_dir

    text = (rules_dir() / RULE.source).read_text(encoding="utf-8")
    bad = text.replace('native_gqa = "Give attention', 'native_gqa = 3\nx = "Give attention', 1)
    assert bad != text
    (tmp_path / RULE.source).write_text(bad, encoding="utf-8")
    with pytest.raises(AdvisorError, match="try_first_by_strategy"):
        load_rules(tmp_path)
