"""advisor.use: matching GEMMs go to the variants (forward and backward), the rest to torch.

Fake variant files (the generated files' API: SHAPE, DTYPE, STRATEGY, TUNED_FOR,
variant_matmul) record their calls and compute in float64, so the routing is checked
exactly; one test runs a real generated Stream-K variant under the Triton interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import pytest
import torch
import torch.nn.functional as F

import advisor
from advisor.errors import AdvisorError
from advisor.run.use import Router

FAKE = """
import torch
SHAPE = {{"M": {M}, "N": {N}, "K": {K}}}
DTYPE = "fp32"
STRATEGY = "fake"
TUNED_FOR = {{"gpu": "NVIDIA H200", "sm_count": 132}}
SEEN = []

def variant_matmul(a, b, out=None):
    assert tuple(a.shape) == ({M}, {K}) and tuple(b.shape) == ({K}, {N})
    SEEN.append((tuple(a.stride()), tuple(b.stride())))
    return (a.double() @ b.double()).float()   # `@` inside a variant must reach torch itself
"""


def fake(tmp_path, M, N, K, name=None):
    p = tmp_path / f"{name or f'variant_{M}x{N}x{K}'}.py"
    p.write_text(FAKE.format(M=M, N=N, K=K))
    return p


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    # CPU tensors are routed only where the Triton interpreter runs the variants
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def close(x, ref):
    return torch.allclose(x.double(), ref, rtol=1e-5, atol=1e-5)


def test_forward_calls_are_routed_and_others_pass(tmp_path):
    v = fake(tmp_path, 33, 47, 70)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(33, 70, generator=g), torch.randn(70, 47, generator=g)
    w, bias = torch.randn(47, 70, generator=g), torch.randn(47, generator=g)
    x3 = torch.randn(3, 11, 70, generator=g)  # 33 rows once folded
    ref = a.double() @ b.double()
    lin = torch.nn.Linear(70, 47)
    ref_lin = a.double() @ w.double().T + bias.double()
    ref_mod = x3.double() @ lin.weight.double().T + lin.bias.double()
    ref_3d = x3.double() @ b.double()
    with advisor.use(v) as r:
        assert close(torch.matmul(a, b), ref)
        assert close(torch.mm(a, b), ref)
        assert close(a @ b, ref) and close(a.mm(b), ref) and close(a.matmul(b), ref)
        assert close(torch.addmm(bias, a, b, beta=0.5, alpha=2.0), 0.5 * bias.double() + 2.0 * ref)
        assert close(F.linear(a, w, bias), ref_lin)
        y = lin(x3)
        assert y.shape == (3, 11, 47) and close(y, ref_mod)
        assert close(torch.matmul(x3, b), ref_3d)
        # not this variant's problem: other shape, other dtype, a batched right operand
        torch.mm(a[:32], b)
        torch.mm(a.double(), b.double())
        torch.matmul(x3, b.expand(3, 70, 47))
    assert r.calls == {v.stem: 9} and r.passed == 3
    assert torch.matmul is not r._matmul and torch.Tensor.__matmul__(a, b).shape == (33, 47)  # restored
    mod = sys.modules[[m for m in sys.modules if m.startswith(f"advisor_variant_{v.stem}_")][0]]
    strides = {s for s in mod.SEEN}
    assert ((70, 1), (1, 70)) in strides  # x @ W.T: the transposed weight, not a copy


def test_backward_uses_variants_where_shapes_fit(tmp_path):
    # y = x W^T (M=33, N=47, K=70); grad_x = g W (33x70x47) has a variant; grad_W = g^T x
    # (47x70x33) does not and goes to torch.
    fwd, bwd = fake(tmp_path, 33, 47, 70), fake(tmp_path, 33, 70, 47)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(33, 70, generator=g, requires_grad=True)
    lin = torch.nn.Linear(70, 47)
    up = torch.randn(33, 47, generator=g)
    with advisor.use(fwd, bwd) as r:
        (lin(x) * up).sum().backward()
    assert r.calls == {fwd.stem: 1, bwd.stem: 1}
    x64 = x.detach().double().requires_grad_()
    w64, b64 = lin.weight.detach().double().requires_grad_(), lin.bias.detach().double().requires_grad_()
    (F.linear(x64, w64, b64) * up.double()).sum().backward()
    assert close(x.grad, x64.grad) and close(lin.weight.grad, w64.grad) and close(lin.bias.grad, b64.grad)


def test_weight_gradient_routed_in_the_traces_order(tmp_path):
    # autograd asks for grad_W^T = x^T g (70x47x33); the trace, and so the variant, has the
    # weight gradient as g^T x (47x70x33): the router computes (g^T x)^T on it
    fwd, wgrad = fake(tmp_path, 33, 47, 70), fake(tmp_path, 47, 70, 33)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(33, 70, generator=g)
    lin = torch.nn.Linear(70, 47, bias=False)
    up = torch.randn(33, 47, generator=g)
    with advisor.use(fwd, wgrad) as r:
        (lin(x) * up).sum().backward()
    assert r.calls == {fwd.stem: 1, wgrad.stem: 1}
    assert close(lin.weight.grad, up.double().T @ x.double())


def _run_dir(tmp_path, results):
    d = tmp_path / "run"
    d.mkdir()
    for r in results:
        M, N, K = (r["shape"][k] for k in "MNK")
        fake(d, M, N, K, name=r["variant"][:-3])
    (d / "run_report.json").write_text(json.dumps({"device": "NVIDIA H200", "results": results}))
    return d


def _result(M, N, K, *, ran=True, status="ok", recommended=True):
    name = f"variant_tail_wave_{M}x{N}x{K}.py"
    win = {"provider": "stream_k", "median_us": 10.0, "rel_err": 1e-3, "status": "ok"}
    return {"kind": "gemm", "shape": {"M": M, "N": N, "K": K}, "dtype": "fp32", "ran_on_gpu": ran,
            "winner": win if ran else None, "recommended": recommended, "verdict": "stream_k wins",
            "table": [{"provider": "stream_k", "status": status}], "variant": name}


def test_run_dir_routes_only_verified_variants(tmp_path):
    d = _run_dir(tmp_path, [_result(33, 47, 70), _result(16, 16, 16, status="failed: rel. error 3e-1"),
                            _result(8, 8, 8, ran=False), _result(24, 24, 24, recommended=False)])
    with pytest.warns(UserWarning) as rec:
        r = advisor.use(d)
    said = " ".join(str(w.message) for w in rec)
    assert "check failed" in said and "never checked" in said and "not faster than the baseline" in said
    assert [v.name for v in r.variants] == ["variant_tail_wave_33x47x70"]
    with r:
        torch.mm(torch.randn(16, 16), torch.randn(16, 16))
        torch.mm(torch.randn(33, 70), torch.randn(70, 47))
    assert r.calls == {"variant_tail_wave_33x47x70": 1}
    with pytest.raises(AdvisorError, match="refused: its check failed"):
        advisor.use(d / "variant_tail_wave_16x16x16.py")
    other = tmp_path / "other"
    other.mkdir()
    unrun = _run_dir(other, [_result(8, 8, 8, ran=False)])
    with pytest.raises(AdvisorError, match="nothing to route"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        advisor.use(unrun)


def test_warns_on_another_gpu(tmp_path, monkeypatch):
    import advisor.run.use as mod  # the module (advisor.use is the function), for monkeypatching

    monkeypatch.setattr(mod, "_current_gpu", lambda device: "NVIDIA A100-SXM4-80GB")
    with pytest.warns(UserWarning, match="tuned on NVIDIA H200, this GPU is NVIDIA A100"):
        with advisor.use(fake(tmp_path, 4, 4, 4)):
            pass


def test_router_is_the_object_returned(tmp_path):
    r = advisor.use(fake(tmp_path, 4, 4, 4))
    assert isinstance(r, Router) and r.calls == {}


@pytest.mark.interpreter
@pytest.mark.slow
def test_real_stream_k_variant_under_the_interpreter(tmp_path):
    # A generated Stream-K file on an odd shape, forward and backward against float64.
    out = tmp_path / "variant_sk.py"
    env = dict(os.environ, TRITON_INTERPRET="1")
    subprocess.run([sys.executable, "-m", "advisor.cli", "generate", "stream_k", "--shape", "33x47x70", "--dtype", "fp32",
                    "-o", str(out)], check=True, env=env, capture_output=True)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(33, 70, generator=g, requires_grad=True)
    w = torch.randn(47, 70, generator=g)
    with advisor.use(out) as r:
        y = F.linear(x, w)
        y.sum().backward()
    assert r.calls == {"variant_sk": 1}
    ref = x.detach().double() @ w.double().T
    assert torch.allclose(y.double(), ref, rtol=1e-4, atol=1e-4)
    assert torch.allclose(x.grad.double(), torch.ones(33, 47, dtype=torch.float64) @ w.double(), rtol=1e-4, atol=1e-4)
