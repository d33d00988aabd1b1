"""The loop's decisions (winner, verdict, noise margin) on hand-made rows, and the whole GPU
path driven on the CPU interpreter with a fake device."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import tracefiles as T
from click.testing import CliRunner
from conftest import DATA

import advisor.loop as L
from advisor.cli import cli
from advisor.schedule_model import Device


def row(provider, us, status="ok", phase="final", rel=1e-3, config=""):
    return {"provider": provider, "median_us": us, "status": status, "phase": phase, "rel_err": rel,
            "tflops": 1.0, "config": config, "error": "" if status == "ok" else "boom"}


def result(rows, observed_ns=None):
    r = L.ShapeResult(1664, 1408, 8192, "bf16", ["stream_k"], observed_ns=observed_ns)
    r.rows = rows
    L.decide(r)
    return r


def test_winner_must_beat_every_baseline_and_the_observed_kernel():
    r = result([row("torch.matmul", 70.0), row("dp", 84.0), row("stream_k", 60.0)], observed_ns=84_000)
    assert r.recommended and r.winner["provider"] == "stream_k"
    assert "1.40x the observed kernel" in r.verdict and "1.17x torch.matmul" in r.verdict


def test_within_noise_is_not_a_win():
    r = result([row("torch.matmul", 61.0), row("dp", 84.0), row("stream_k", 60.0)], observed_ns=84_000)
    assert not r.recommended
    # cuBLAS beats the observed kernel by far: the verdict says to use it.
    assert "no generated schedule beats torch.matmul" in r.verdict and "1.38x the observed kernel: use it" in r.verdict
    r = result([row("torch.matmul", 61.0), row("dp", 84.0), row("stream_k", 60.0)], observed_ns=62_000)
    assert not r.recommended and "no variant beats torch.matmul by more than 3%: keep it" in r.verdict


def test_failed_and_search_rows_never_win():
    rows = [row("torch.matmul", 70.0), row("dp", 84.0), row("stream_k", 10.0, status="wrong"),
            row("persistent", 65.0, phase="search"), row("persistent", 66.0, phase="final")]
    r = result(rows)
    assert r.winner["provider"] == "persistent" and r.winner["median_us"] == 66.0  # the final row counts
    table = {t["provider"]: t for t in r.table()}
    assert table["stream_k"]["status"].startswith("failed") and table["stream_k"]["median_us"] is None


def test_nothing_passed():
    r = result([row("torch.matmul", 70.0), row("stream_k", 1.0, status="compile_error")])
    assert r.winner is None and "nothing to recommend" in r.verdict


@pytest.mark.interpreter
def test_gpu_path_on_the_interpreter(tmp_path, monkeypatch):
    monkeypatch.setattr(L, "gpu_present", lambda: True)
    monkeypatch.setattr(L, "device_spec", lambda: (Device(name="interpreter", sm_count=3),
                                                   {"gpu": "interpreter", "sm_count": 3, "compute_capability": None, "smem_per_block_bytes": None}))
    finding = {"symptom": "small_grid_long_k", "strategy": "split_k", "kernel": "k", "launches": 1, "total_ns": 1, "est_savings_ns": 1}
    r = L.run_shape_loop(40, 24, 512, "fp16", ["split_k"], budget_s=15, observed_ns=10_000_000, finding=finding, out_dir=tmp_path)
    providers = {x["provider"] for x in r.rows if x["status"] == "ok"}
    assert {"torch.matmul", "dp", "split_k"} <= providers
    assert all(x["rel_err"] < 2e-3 for x in r.rows if x["status"] == "ok")
    assert r.ran_on_gpu and r.winner["provider"] == "split_k" and r.model["split_k"]
    assert r.variant_path is not None and r.variant_path.is_file()
    text = Path(r.variant_path).read_text()
    assert "TUNED_FOR = {'gpu': 'interpreter'" in text and "'how': 'measured'" in text


# ------------------------------------------------------------------ batched GEMMs: skipped, said so


def finding(symptom, batch, kernel="k", M=1664, N=1408, K=8192):
    from advisor.findings import Finding

    return Finding(symptom=symptom, strategy=L.STRATEGIES_FOR[symptom][0], title="t", kernel=kernel, rank=0, device_id=0,
                   shape={"M": M, "N": N, "K": K, "batch": batch, "dtype": "bf16"}, grid=None, block=None, launches=2,
                   total_ns=2_000, est_savings_ns=100, confidence="high", watch_for="")


def test_batched_findings_are_reported_as_skipped(monkeypatch):
    ran = []
    monkeypatch.setattr(L, "run_shape_loop", lambda M, N, K, dtype, strategies, **kw: ran.append((M, N, K, dtype)) or (M, N, K))
    diagnosis = SimpleNamespace(findings=[finding("tail_wave", 12, kernel="bmm"), finding("hopper_no_ws", 12, kernel="bmm"),
                                          finding("tail_wave", 1), finding("tail_wave", 4, M=512, N=512, K=64)])
    skipped = []
    results = L.loop_findings(diagnosis, budget_s=5, out_dir=None, skipped=skipped)
    assert ran == [(1664, 1408, 8192, "bf16")] and results == [(1664, 1408, 8192)]
    # once per batched shape, with the first (highest-ranked) finding's symptom
    assert [(s.symptom, s.kernel, s.shape["batch"]) for s in skipped] == [("tail_wave", "bmm", 12), ("tail_wave", "k", 4)]
    assert skipped[1].shape == {"M": 512, "N": 512, "K": 64, "batch": 4, "dtype": "bf16"}
    assert skipped[1].reason == "batched GEMM (batch=4 of 512x512x64 bf16): advisor's schedules are 2-D GEMMs; not run"
    # without the out-parameter the call is as before
    assert L.loop_findings(diagnosis, budget_s=5, out_dir=None) == [(1664, 1408, 8192)]


def gemm_trace(path, batched_only=False):
    """A Kineto trace with a batched GEMM (aten::bmm, batch 12) and, unless batched_only, a 2-D one."""
    bmm = T.kineto_gemm_events(6, kernel_name="bmm_kernel", op="aten::bmm")
    for e in bmm:
        if e["cat"] == "cpu_op":
            e["args"]["Input Dims"] = [[12, 1664, 8192], [12, 8192, 1408]]
        if "correlation" in e["args"]:
            e["args"]["correlation"] += 100
        e["ts"] += 10_000
    return T.write_kineto(path, T.kineto_doc(bmm if batched_only else T.kineto_gemm_events(6) + bmm))


def test_all_batched_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(L, "gpu_present", lambda: False)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["diagnose", str(gemm_trace(tmp_path / "t.json", batched_only=True)), "--run",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert ("advisor: --run: skipped tail_wave: batched GEMM (batch=12 of 1664x1408x8192 bf16): "
            "advisor's schedules are 2-D GEMMs; not run") in r.stderr
    assert "nothing run here (1 finding skipped" in r.stderr and "no finding with a GEMM shape" not in r.stderr
    assert not (out / "run_report.json").exists() and not list(out.glob("variant_*.py"))


def test_small_gemm_loop_is_listed_with_its_grouped_command(tmp_path, monkeypatch):
    # the planted loop of 64 small GEMMs: no single shape to time, so --run says how to time
    # its grouped launch (the command generate accepts), instead of passing over it silently
    monkeypatch.setattr(L, "gpu_present", lambda: False)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["diagnose", str(DATA / "h200" / "small_gemms.sqlite.gz"), "--run", "--out", str(out),
                                 "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    (line,) = [x for x in r.stderr.splitlines() if x.startswith("advisor: --run: skipped launch_overhead")]
    assert "64 GEMM shapes" in line and "python grouped.py --check --bench" in line
    command = line.split("`")[1].split()[1:]
    r = CliRunner().invoke(cli, [*command[:-1], str(tmp_path / "grouped.py")])
    assert r.exit_code == 0 and (tmp_path / "grouped.py").is_file()


def test_run_report_lists_the_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr(L, "gpu_present", lambda: False)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["diagnose", str(gemm_trace(tmp_path / "t.json")), "--run", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert "advisor: --run: skipped tail_wave: batched GEMM (batch=12" in r.stderr
    report = json.loads((out / "run_report.json").read_text())
    assert [x["shape"] for x in report["results"]] == [{"M": 1664, "N": 1408, "K": 8192}]
    assert report["skipped"] == [{"symptom": "tail_wave", "kernel": "bmm_kernel",
                                  "shape": {"M": 1664, "N": 1408, "K": 8192, "batch": 12, "dtype": "bf16"},
                                  "reason": "batched GEMM (batch=12 of 1664x1408x8192 bf16): advisor's schedules are 2-D GEMMs; not run"}]
    md = (out / "run_report.md").read_text()
    section = md[md.index("## Not run"):]
    assert "tail_wave on `bmm_kernel`: batched GEMM (batch=12 of 1664x1408x8192 bf16)" in section
