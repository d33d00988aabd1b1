"""`advisor profile --use` and `advisor optimize` end to end on the CPU: a stand-in nsys runs
the real program (with the routing shim active in it) and exports a real H200 trace; where a
test needs verified variants, the GPU step (verify and time) is replaced by its result."""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner
from conftest import DATA
from test_profile import FAKE_NSYS

import advisor.run.loop as loop
from advisor.cli import cli
from advisor.findings import Finding
from advisor.codegen.generate import finding_summary
from advisor.diagnose.remedies import code_change, code_changes

VARIANT = """
import torch
SHAPE = {{"M": {M}, "N": {N}, "K": {K}}}
DTYPE = "{dtype}"
STRATEGY = "stream_k"
TUNED_FOR = {{"gpu": None}}

def variant_matmul(a, b, out=None):
    # the routing is under test here, not the arithmetic (test_use checks that)
    return torch.zeros(a.shape[0], b.shape[1], dtype=a.dtype)
"""

PROGRAM = """
import torch
a = torch.empty({M}, {K}, dtype=torch.bfloat16)
b = torch.empty({K}, {N}, dtype=torch.bfloat16)
torch.mm(a[:8], b[:, :8])        # another shape: torch
c = torch.matmul(a, b)            # the variant's shape: routed
print("ran", tuple(c.shape))
"""


@pytest.fixture
def fake_nsys(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "nsys"
    script.write_text(FAKE_NSYS)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{__import__('os').environ['PATH']}")
    monkeypatch.setenv("NSYS", str(script))
    monkeypatch.setenv("FAKE_NSYS_LOG", str(tmp_path / "nsys.log"))
    monkeypatch.setenv("FAKE_NSYS_SQLITE", str(DATA / "h200" / "tail.sqlite.gz"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # CPU tensors are routed only under the interpreter
    monkeypatch.chdir(tmp_path)
    return tmp_path / "nsys.log"


def _verified(M, N, K, out_dir, symptom="tail_wave", dtype="bf16"):
    """What loop.run_shape_loop returns on a GPU where stream_k won: a verified, recommended
    result with its variant file written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"variant_{symptom}_{M}x{N}x{K}.py"
    path.write_text(VARIANT.format(M=M, N=N, K=K, dtype=dtype))
    finding = finding_summary(_finding(symptom, shape={"M": M, "N": N, "K": K, "dtype": dtype}))
    res = loop.ShapeResult(M, N, K, dtype, ["stream_k"], finding=finding, observed_ns=84_000)
    res.rows = [{"provider": "stream_k", "status": "ok", "median_us": 62.0, "rel_err": 1e-3, "tflops": 600.0,
                 "config": "", "phase": "final"},
                {"provider": "torch.matmul", "status": "ok", "median_us": 80.0, "rel_err": 1e-3, "tflops": 480.0,
                 "config": "", "phase": "final"}]
    res.ran_on_gpu = True
    loop.decide(res)
    res.variant_path = path
    return res


@pytest.mark.slow  # child Python processes import torch; minutes on a loaded 2-core machine
def test_profile_use_routes_the_programs_gemms(fake_nsys, tmp_path):
    run = tmp_path / "run"
    r = _verified(1664, 1408, 8192, run)
    loop.write_run_report([r], run)
    (tmp_path / "prog.py").write_text(PROGRAM.format(M=1664, N=1408, K=8192))
    res = CliRunner().invoke(cli, ["profile", "--use", str(run), "--out", "after", "--", sys.executable, "prog.py"])
    assert res.exit_code == 0, res.output
    assert "routed: variant_tail_wave_1664x1408x8192 1 call(s)" in res.output


def test_profile_use_refuses_unverified(fake_nsys, tmp_path):
    run = tmp_path / "run"
    r = _verified(1664, 1408, 8192, run)
    r.ran_on_gpu = False
    loop.write_run_report([r], run)
    res = CliRunner().invoke(cli, ["profile", "--use", str(run), "--", sys.executable, "-c", "pass"])
    assert res.exit_code == 2 and "never checked" in res.output
    assert not fake_nsys.exists()  # refused before anything ran


@pytest.mark.slow  # child Python processes import torch; minutes on a loaded 2-core machine
def test_optimize_whole_loop(fake_nsys, tmp_path, monkeypatch):
    def fake_loop(diagnosis, *, budget_s, out_dir, skipped=None, **kw):
        shapes = {(f.shape["M"], f.shape["N"], f.shape["K"]) for f in diagnosis.findings if f.shape}
        return [_verified(M, N, K, out_dir) for M, N, K in sorted(shapes)]

    monkeypatch.setattr(loop, "loop_findings", fake_loop)
    (tmp_path / "prog.py").write_text(PROGRAM.format(M=1664, N=1408, K=8192))
    res = CliRunner().invoke(cli, ["optimize", "--out", "opt", "--budget-s", "5", "--", sys.executable, "prog.py"])
    assert res.exit_code == 0, res.output
    assert fake_nsys.read_text().count("profile ") == 2  # before and after, the same profiler
    opt = tmp_path / "opt"
    for f in ("report.md", "report.json", "compare.md", "compare.json", "before/report.md", "after/report.md",
              "run/run_report.json"):
        assert (opt / f).is_file(), f
    d = json.loads((opt / "report.json").read_text())
    assert d["calls"] == {"variant_tail_wave_1664x1408x8192": 1}
    assert d["applied"][0]["strategy"] == "stream_k" and d["applied"][0]["calls"] == 1
    # the stand-in exports the same trace twice: the same step, inside the noise
    assert d["verdict"] == "same" and d["compare"]["findings"]["remaining"]
    assert d["estimate"]["estimated_ns_per_step"] > 0 and d["estimate"]["within_tolerance"] is False
    md = (opt / "report.md").read_text()
    assert "## Applied" in md and "variant_tail_wave_1664x1408x8192" in md and "End to end: same" in md
    assert "## Estimated against measured" in md and "# advisor compare" not in md.replace("## advisor compare", "")


@pytest.mark.slow  # child Python processes import torch; minutes on a loaded 2-core machine
def test_optimize_without_a_gpu_reports_and_runs_once(fake_nsys, tmp_path):
    (tmp_path / "prog.py").write_text("print('hello')\n")
    res = CliRunner().invoke(cli, ["optimize", "--out", "opt", "--", sys.executable, "prog.py"])
    assert res.exit_code == 0, res.output
    assert fake_nsys.read_text().count("profile ") == 1
    d = json.loads((tmp_path / "opt" / "report.json").read_text())
    assert d["verdict"] is None and d["applied"] == []
    assert any("never checked" in n for n in d["notes"])
    assert "Nothing applied" in (tmp_path / "opt" / "report.md").read_text()


def _finding(symptom="tail_wave", strategy="stream_k", shape=None, suggestion=None):
    return Finding(symptom=symptom, strategy=strategy, title="t", kernel="k", rank=0, device_id=0, shape=shape,
                   grid=None, block=None, launches=10, total_ns=10_000, est_savings_ns=4_000, confidence="high",
                   watch_for="", suggestion=suggestion or {})


def test_code_changes_are_concrete():
    pad = code_change(_finding(shape={"M": 8192, "N": 50257, "K": 768}))
    assert pad.kind == "pad_dimension" and "torch.nn.Linear(d_model, 50304" in pad.code and "[..., :50257]" in pad.code
    assert code_change(_finding(shape={"M": 8192, "N": 50304, "K": 768})) is None  # aligned: the swap is the remedy
    kpad = code_change(_finding(shape={"M": 64, "N": 64, "K": 1000}))
    assert kpad.kind == "pad_dimension" and "(0, 24)" in kpad.code
    graph = code_change(_finding("launch_overhead", "persistent", suggestion={"schedule": "cuda_graph"}))
    assert graph.kind == "cuda_graph" and "torch.cuda.graph(g)" in graph.code
    grouped = code_change(_finding("launch_overhead", "persistent",
                                   suggestion={"schedule": "grouped", "shapes": ["237x432x261", "1x2x3;rm"]}))
    assert "--shapes 237x432x261 " in grouped.code and "rm" not in grouped.code  # only validated shapes
    comm = code_change(_finding("exposed_comm", "comm_overlap", shape={"M": 8192, "N": 4096, "K": 4096}))
    assert "--pattern all_gather_matmul --shape 8192x4096x4096" in comm.code
    assert len(code_changes([pad, None] and [_finding(shape={"M": 8, "N": 50257, "K": 64})] * 2)) == 1
    attn = code_change(_finding("unfused_attention", "fused_attention", shape={"M": 1024, "N": 1024, "K": 64}))
    assert attn.kind == "fused_attention" and "scaled_dot_product_attention(q, k, v" in attn.code
    assert 'attn_implementation="sdpa"' in attn.code


def test_an_odd_gemm_gets_its_padding_change(tmp_path):
    # The TAIL GEMM of tests/tracefiles with N = 1401: the finding on it carries the padding
    # change (1401 -> 1408), and unaligned_gemms leaves it to the finding.
    from tracefiles import kineto_doc, kineto_gemm_events, write_kineto

    from advisor.diagnose.diagnosis import diagnose
    from advisor.run.optimize import unaligned_gemms
    from advisor.traces import load_trace

    evs = kineto_gemm_events()
    for e in evs:
        if e["cat"] == "cpu_op":
            e["args"]["Input Dims"] = [[1664, 8192], [8192, 1401]]
    t = load_trace([write_kineto(tmp_path / "odd.json", kineto_doc(evs))])
    d = diagnose(t)
    assert any(f.shape and f.shape["N"] == 1401 for f in d.findings)
    pads = [c for c in code_changes(d.findings) if c.kind == "pad_dimension"]
    assert pads and "torch.nn.Linear(d_model, 1408" in pads[0].code
    assert unaligned_gemms(t, d) == []


def test_an_odd_vocabulary_head_is_found_when_no_finding_names_it(tmp_path):
    # 8192x50257x768 in whole waves (393x64 tiles of 128x128): no scheduling finding; since the
    # Tier 1-3 rules, misaligned_gemm names it (pad N to 50304), and optimize's own scan for
    # GEMMs with an odd dimension finds it too (what it runs where no finding names a GEMM).
    from tracefiles import kineto_doc, kineto_gemm_events, write_kineto

    from advisor.diagnose.diagnosis import diagnose
    from advisor.run.optimize import unaligned_gemms
    from advisor.traces import load_trace

    evs = kineto_gemm_events(n=4, dur_us=5000.0, kernel_name="nvjet_sm90_tst_128x128_64x4_1x2_h_bz_coopA_NNT")
    for e in evs:
        if e["cat"] == "cpu_op":
            e["args"]["Input Dims"] = [[8192, 768], [768, 50257]]
        if e["cat"] == "kernel":
            e["args"]["grid"] = [393, 64, 1]
    t = load_trace([write_kineto(tmp_path / "head.json", kineto_doc(evs))])
    d = diagnose(t)
    named = [f for f in d.findings if f.shape and f.shape.get("N") == 50257]
    assert [(f.symptom, f.strategy) for f in named] == [("misaligned_gemm", "pad_dimension")]
    assert unaligned_gemms(t, d) == []  # the finding's fallback runs it: no second run
    # with the misaligned_gemm rule switched off, optimize's own scan still finds the GEMM
    import dataclasses

    from advisor.rules import load_rules
    rules = load_rules()
    rules["misaligned_gemm"] = dataclasses.replace(rules["misaligned_gemm"], enabled=False)
    d = diagnose(t, rules=rules)
    (u,) = unaligned_gemms(t, d)
    assert (u["M"], u["N"], u["K"], u["launches"], u["median_ns"]) == (8192, 50257, 768, 4, 5_000_000)
    assert u["share"] == 1.0


# ---- misaligned_gemm: the staged fallback, verified, then routed ----------------------------

# A tiny odd vocabulary head under the interpreter: tokens 32, d_model 16, vocab 37 (74-byte bf16
# rows): forward 32x37x16, grad_x 32x16x37, grad_W as the trace records it 37x16x32.
HEAD = [(32, 37, 16), (32, 16, 37), (37, 16, 32)]


def _misaligned(M, N, K):
    return Finding(symptom="misaligned_gemm", strategy="pad_dimension", title="t", kernel="cutlass_75_align1", rank=0,
                   device_id=0, shape={"M": M, "N": N, "K": K, "dtype": "bf16"}, grid=None, block=None, launches=10,
                   total_ns=2_000_000, est_savings_ns=1_500_000, confidence="high", watch_for="",
                   suggestion={"fix": "pad", "fallback": "staged"})


def _fake_gpu(monkeypatch, check_fails=False):
    """Stand in for the GPU: the staged persistent config is really checked (under the
    interpreter, against float64); only its timing, and torch.matmul's, is invented."""
    import dataclasses

    import torch

    from advisor.codegen.kernel_lib import load
    from advisor.codegen.schedule_model import Device
    import advisor.run.bench.isolate as isolate

    ps = load("persistent")
    common = load("common")
    ran = []

    def fake_isolated(M, N, K, dtype, plan, budget_s, progress=None, **kw):
        ran.append(((M, N, K), sorted(plan)))
        cfg = ps.Config(16, 32, 16, 2, 4, 2, use_tma=True, staged=True)
        g = torch.Generator().manual_seed(M * N + K)
        a, b = torch.randn(M, K, generator=g).bfloat16(), torch.randn(K, N, generator=g).bfloat16()
        err = common.rel_error(ps.matmul(a, b, cfg), common.reference(a, b))
        if check_fails:
            err = 0.3  # what a wrong kernel would give
        ok = err <= common.TOLERANCE[torch.bfloat16]
        return [{"provider": "torch.matmul", "status": "ok", "median_us": 180.0, "rel_err": 1e-3, "tflops": 1.0,
                 "config": "", "phase": "final"},
                {"provider": "persistent", "status": "ok" if ok else f"failed: rel. error {err:.1e}",
                 "median_us": 60.0 if ok else None, "rel_err": err, "tflops": 3.0,
                 "config": json.dumps(dataclasses.asdict(cfg)), "phase": "final"}]

    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: True)
    tuned = {"gpu": None, "sm_count": 3, "compute_capability": "9.0", "smem_per_block_bytes": None}
    monkeypatch.setattr("advisor.run.gpu.device_spec", lambda: (Device(sm_count=3), tuned))
    monkeypatch.setattr(isolate, "run_shape_isolated", fake_isolated)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("ADVISOR_NUM_SMS", "3")
    common.fix_interpreter_bf16_dot()  # Triton 3.6's interpreter multiplies bf16 bit patterns otherwise
    return ran


@pytest.mark.interpreter
def test_misaligned_gemm_runs_its_staged_fallback_and_use_routes_it(tmp_path, monkeypatch):
    import types

    import torch

    import advisor

    ran = _fake_gpu(monkeypatch)
    diag = types.SimpleNamespace(findings=[_misaligned(*s) for s in HEAD])
    run = tmp_path / "run"
    results = loop.loop_findings(diag, budget_s=5, out_dir=run)
    assert [r for r, _ in ran] == HEAD and all(p == ["persistent", "stream_k"] for _, p in ran)
    assert all(r.recommended and r.variant_knobs["staged"] for r in results)
    loop.write_run_report(results, run)
    torch.manual_seed(0)
    head = torch.nn.Linear(16, 37, bias=False).bfloat16()
    x = torch.randn(32, 16).bfloat16().requires_grad_()
    up = torch.randn(32, 37)
    with advisor.use(run) as routed:
        y = head(x)
        (y.float() * up).sum().backward()
    # forward and both backward GEMMs on the staged variants, computed right
    assert routed.calls == {f"variant_misaligned_gemm_{M}x{N}x{K}": 1 for M, N, K in HEAD}
    w, x64, g = head.weight.double(), x.detach().double(), up.double()
    for got, ref in ((y, x64 @ w.T), (x.grad, g @ w), (head.weight.grad, g.T @ x64)):
        assert torch.allclose(got.double(), ref, rtol=2e-2, atol=2e-2)


@pytest.mark.interpreter
def test_misaligned_gemm_fallback_refused_when_its_check_fails(tmp_path, monkeypatch):
    import types

    import advisor
    from advisor.errors import AdvisorError

    _fake_gpu(monkeypatch, check_fails=True)
    diag = types.SimpleNamespace(findings=[_misaligned(*HEAD[0])])
    run = tmp_path / "run"
    (r,) = loop.loop_findings(diag, budget_s=5, out_dir=run)
    assert r.winner is None and r.variant_path is None and "no candidate passed its check" in r.verdict
    loop.write_run_report([r], run)
    with pytest.raises(AdvisorError, match="nothing to route"):
        advisor.use(run)


def test_a_fallbacks_estimate_is_its_timing_not_the_paddings():
    # the padding's 1.5 ms is for the code change; the routed staged variant saved 60 us a call
    # in isolation, one launch a step (the trace's 10 launches include warm-up steps)
    from types import SimpleNamespace

    from advisor.run.optimize import estimate_vs_measured

    comp = SimpleNamespace(before=SimpleNamespace(n=5), kernels=[
        {"shape": True, "key": "gemm 32x37x16", "delta_ns_per_step": -50_000, "before": {"launches_per_step": 1.0},
         "status": "matched", "class": "gemm", "label": "cutlass_75_align1"}])
    applied = [{"shape": {"M": 32, "N": 37, "K": 16}, "calls": 7, "saved_ns_per_call": 60_000, "launches": 10}]
    est = estimate_vs_measured(SimpleNamespace(findings=[_misaligned(32, 37, 16)]), comp, applied)
    assert est["estimated_ns_per_step"] == 60_000 and est["measured_ns_per_step"] == 50_000
    assert est["within_tolerance"]


def test_measured_counts_what_the_swap_costs():
    # the H200 GPT-2 proof: counting only the cuBLAS GEMMs that went away (6.66 + 4.51 ms a step)
    # read 11.2 ms measured; the routed kernels (no aten op around them, so no shape) and the
    # staging copies they add count against it, as the GPU busy time (-7.2 ms) says
    from types import SimpleNamespace

    from advisor.run.optimize import estimate_vs_measured

    comp = SimpleNamespace(before=SimpleNamespace(n=5), kernels=[
        {"shape": True, "key": "gemm 32x37x16", "delta_ns_per_step": -6_660_000, "status": "gone", "class": "gemm",
         "label": "cutlass_75_align1", "before": {"launches_per_step": 1.0}},
        {"shape": None, "key": "persistent_gemm_kernel", "delta_ns_per_step": 943_000, "status": "new", "class": "gemm",
         "label": "persistent_gemm_kernel", "before": None},
        {"shape": None, "key": "copy", "delta_ns_per_step": 2_100_000, "status": "matched", "class": "copy",
         "label": "elementwise_kernel", "before": {"launches_per_step": 10.0}},
        {"shape": None, "key": "softmax", "delta_ns_per_step": 50_000, "status": "new", "class": "reduction",
         "label": "softmax_kernel", "before": None},
    ])
    applied = [{"shape": {"M": 32, "N": 37, "K": 16}, "calls": 7, "saved_ns_per_call": 3_600_000, "launches": 5,
                "staged": True}]
    est = estimate_vs_measured(SimpleNamespace(findings=[_misaligned(32, 37, 16)]), comp, applied)
    assert est["measured_ns_per_step"] == 6_660_000 - 943_000 - 2_100_000
