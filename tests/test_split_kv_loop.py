"""diagnose --run for split_kv findings: the variant is generated (and, on a GPU, checked and
timed against torch SDPA's backends); a finding without a shape is skipped with its reason."""

from __future__ import annotations

import ast

from synthetic import kernel, make_trace
from test_attention_symptoms import FLASH, decode_trace

from advisor.run.attn_loop import AttnResult, decide_attn
from advisor.diagnose.diagnosis import diagnose
from advisor.run.loop import loop_findings
from advisor.report.render import render

ATTN = {"B": 1, "Hq": 32, "Hkv": 8, "D": 128, "S": 131072, "Lq": 1}


def test_a_shaped_finding_generates_its_variant(tmp_path, monkeypatch):
    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
    d = diagnose(decode_trace(131072, 600_000))
    skipped = []
    (res,) = loop_findings(d, budget_s=10, out_dir=tmp_path, skipped=skipped)
    assert not skipped and res.kind == "split_kv" and res.attn == ATTN and res.dtype == "bf16"
    assert res.observed_ns == 600_000 and "not run: no CUDA GPU" in res.verdict
    src = res.variant_path.read_text()
    ast.parse(src)
    assert 'SHAPE = {"B": 1, "HQ": 32, "HKV": 8, "D": 128, "S": 131072, "LQ": 1}' in src
    assert res.variant_knobs["NUM_SPLITS"] >= 2
    md = render("run_report.md.j2", results=[res], device=None, versions={}, rules=d.rules, images={}, skipped=[],
                date="2026-12-02")
    assert "Decode attention B=1 Hq=32 Hkv=8 D=128 S=131072 bf16: decode_attention_unsplit" in md
    assert f"python {res.variant_path.name} --check --bench" in md and "advisor bench --shape" not in md


def test_a_finding_without_a_shape_is_skipped_with_the_reason(tmp_path):
    d = diagnose(make_trace([kernel(i * 100_000, 50_000, name=FLASH, grid=(1, 16, 1)) for i in range(10)]))
    assert [f.strategy for f in d.findings] == ["split_kv"]
    skipped = []
    assert loop_findings(d, budget_s=10, out_dir=tmp_path, skipped=skipped) == []
    (s,) = skipped
    assert s.symptom == "decode_attention_unsplit" and "attention shape is unknown" in s.reason
    assert "record_shapes=True" in s.reason


def _result(bench, ok=True, observed_us=600.0):
    res = AttnResult(dict(ATTN), "bf16", observed_ns=int(observed_us * 1e3), bench=bench,
                     check={"ok": ok, "rel_err": 4e-3, "tolerance": 1e-2})
    decide_attn(res)
    return res


def test_verdicts():
    floor = {"hbm_floor": {"median_us": 125.7}}
    won = _result({**floor, "variant": {"median_us": 131.0}, "sdpa_flash": {"median_us": 152.3},
                   "sdpa_cudnn": {"median_us": 137.2}, "sdpa_efficient": {"refused": "RuntimeError: no GQA"}})
    assert won.recommended and won.verdict.startswith("split_kv wins") and "1.04x the HBM floor" in won.verdict
    assert won.baseline == {"provider": "sdpa_cudnn", "median_us": 137.2}
    rows = {t["provider"]: t for t in won.table()}
    assert rows["sdpa_efficient"]["status"].startswith("refused") and rows["variant"]["rel_err"] == 4e-3
    assert round(rows["observed in trace"]["x_floor"], 2) == round(600 / 125.7, 2)
    # cuDNN faster than ours: switch to it rather than adopt a kernel
    lost = _result({**floor, "variant": {"median_us": 140.0}, "sdpa_cudnn": {"median_us": 127.2}})
    assert not lost.recommended and "switch to it with torch.nn.attention.sdpa_kernel(SDPBackend.CUDNN_ATTENTION)" in lost.verdict
    # within the noise of cuDNN: not recommended either
    tie = _result({**floor, "variant": {"median_us": 126.0}, "sdpa_cudnn": {"median_us": 127.2}})
    assert not tie.recommended
    wrong = _result({**floor, "variant": {"median_us": 100.0}, "sdpa_cudnn": {"median_us": 127.2}}, ok=False)
    assert not wrong.recommended and wrong.winner is None and "did not pass its check" in wrong.verdict
