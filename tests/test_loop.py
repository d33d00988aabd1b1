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

import advisor.run.loop as L
from advisor.cli import cli
from advisor.codegen.schedule_model import Device


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
    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: True)
    monkeypatch.setattr("advisor.run.gpu.device_spec", lambda: (Device(name="interpreter", sm_count=3),
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

    return Finding(symptom=symptom, strategy=L.strategies_for()[symptom][0], title="t", kernel=kernel, rank=0, device_id=0,
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
    # 12 x 1664x1408x8192 in 1.5 ms (307 TFLOP/s): a batched GEMM an H100 can run (at the 2-D
    # twin's 500 us it would be 920 TFLOP/s, past the roofline, so nothing would be claimed)
    bmm = T.kineto_gemm_events(6, kernel_name="bmm_kernel", op="aten::bmm", dur_us=1500.0)
    for e in bmm:
        if e["cat"] == "cpu_op":
            e["args"]["Input Dims"] = [[12, 1664, 8192], [12, 8192, 1408]]
        if "correlation" in e["args"]:
            e["args"]["correlation"] += 100
        e["ts"] += 10_000
    return T.write_kineto(path, T.kineto_doc(bmm if batched_only else T.kineto_gemm_events(6) + bmm))


def test_all_batched_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["diagnose", str(gemm_trace(tmp_path / "t.json", batched_only=True)), "--run",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert ("advisor: --run: skipped tail_wave: batched GEMM (batch=12 of 1664x1408x8192 bf16): "
            "advisor's schedules are 2-D GEMMs; not run") in r.stderr
    assert "nothing run here (1 finding skipped" in r.stderr and "no finding with a GEMM shape" not in r.stderr
    assert not (out / "run_report.json").exists() and not list(out.glob("variant_*.py"))


def test_small_gemm_loop_becomes_a_grouped_result(tmp_path, monkeypatch):
    # the planted loop of 64 small GEMMs: --run times their grouped launch against the loop
    # (here, without a GPU, it writes the grouped variant with the model's knobs and says so)
    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["diagnose", str(DATA / "h200" / "small_gemms.sqlite.gz"), "--run", "--out", str(out),
                                 "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    assert "skipped launch_overhead" not in r.stderr
    report = json.loads((out / "run_report.json").read_text())
    (g,) = [x for x in report["results"] if x.get("kind") == "grouped"]
    assert g["shape"]["count"] == 64 and len(g["shape"]["sizes"]) == 64 and g["dtype"] == "bf16"
    assert g["finding"]["symptom"] == "launch_overhead" and not g["ran_on_gpu"]
    assert g["verdict"].startswith("not run: no CUDA GPU here")
    variant = out / g["variant"]
    text = variant.read_text()
    assert "[237, 432, 261]" in text and "variant_grouped_matmul" in text  # the loop's own shapes
    md = (out / "run_report.md").read_text()
    assert "## 1. 64 GEMMs in one grouped launch, bf16: launch_overhead" in md
    assert f"python {variant.name} --check --bench" in md and "advisor bench --shape" not in md


def group_finding(shapes, launches=40):
    from advisor.findings import Finding

    return Finding(symptom="launch_overhead", strategy="persistent", title="t", kernel="gemm_loop", rank=0, device_id=0,
                   shape=None, grid=None, block=None, launches=launches, total_ns=2_000, est_savings_ns=100,
                   confidence="high", watch_for="", suggestion={"schedule": "grouped", "shapes": shapes, "dtype": "fp16"})


def test_group_findings_run_once_per_set_and_one_shape_is_skipped(monkeypatch):
    import advisor.run.group_loop as G

    ran = []
    monkeypatch.setattr(G, "run_group_loop", lambda sizes, dtype, **kw: ran.append((sizes, dtype)) or G.GroupResult(sizes, dtype))
    two = ["40x24x32", "17x33x70"]
    diagnosis = SimpleNamespace(findings=[group_finding(two), group_finding(list(two)), group_finding(["64x64x64"], 50)])
    skipped = []
    results = L.loop_findings(diagnosis, budget_s=5, out_dir=None, skipped=skipped)
    assert ran == [([(40, 24, 32), (17, 33, 70)], "fp16")] and len(results) == 1
    (s,) = skipped
    assert s.shape == {"shapes": 1, "dtype": "fp16"}
    assert "one GEMM shape (64x64x64)" in s.reason and "torch.bmm" in s.reason


def test_groups_of_as_many_gemms_get_their_own_files_and_a_bad_shape_is_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
    diagnosis = SimpleNamespace(findings=[group_finding(["40x24x32", "17x33x70"]), group_finding(["64x48x16", "8x8x8"]),
                                          group_finding(["0x24x32", "17x33x70"])])
    skipped = []
    results = L.loop_findings(diagnosis, budget_s=5, out_dir=tmp_path, skipped=skipped)
    assert len(results) == 2 and len({r.variant_path for r in results}) == 2 and len({r.shape for r in results}) == 2
    for r in results:  # each file holds its own group
        text = r.variant_path.read_text()
        assert all(f"[{M}, {N}, {K}]" in text for M, N, K in r.sizes)
    (s,) = skipped
    assert s.reason.startswith("its GEMM shapes cannot be run:")


def test_a_config_that_fails_its_final_check_is_not_recommended():
    import advisor.run.group_loop as G

    cfg = '{"block_m": 64}'
    rows = group_rows(loop=600.0, graph=220.0) + [row("grouped", 50.0, phase="search", config=cfg),
                                                   row("grouped", None, status="wrong", config=cfg)]
    r = G.GroupResult([(40, 24, 32), (17, 33, 70)], "fp16", rows=rows)
    L.decide(r)
    assert not r.recommended and r.winner is None and "did not pass its check" in r.verdict
    # the same for one GEMM shape: the search row must not stand in for the failed re-check
    s = result([row("torch.matmul", 100.0), row("stream_k", 50.0, phase="search", config="{}"),
                row("stream_k", None, status="wrong", config="{}")])
    assert s.winner is None and not s.recommended


@pytest.mark.interpreter
def test_the_default_grouped_config_runs_even_without_budget():
    from advisor.run.bench.grouped import run_grouped

    rows = run_grouped([(40, 24, 32), (17, 33, 70)], "fp16", None, budget_s=0.0, final=False)
    assert [r["status"] for r in rows if r["provider"] == "grouped"] == ["ok"]


def group_rows(**us):
    names = {"loop": "torch.matmul", "graph": "cuda_graph", "gmm": "torch._grouped_mm[padded]", "grouped": "grouped"}
    return [row(names[k], v, config='{"block_m": 64}' if k == "grouped" else "") for k, v in us.items()]


def test_decide_group():
    import advisor.run.group_loop as G

    sizes = [(40, 24, 32), (17, 33, 70)]
    r = G.GroupResult(sizes, "fp16", rows=group_rows(loop=600.0, graph=220.0, gmm=150.0, grouped=60.0))
    L.decide(r)
    assert r.recommended and r.winner["provider"] == "grouped" and r.baseline["provider"] == "cuda_graph"
    assert r.verdict == ("grouped wins: one launch of the 2 GEMMs is 10.00x the torch.matmul loop, "
                         "3.67x the loop captured in a CUDA graph (verified, rel. error 1.0e-03)")
    # the padded torch._grouped_mm (its padding outside the timed call) is a reference, not a rival
    r = G.GroupResult(sizes, "fp16", rows=group_rows(loop=600.0, graph=220.0, gmm=40.0, grouped=60.0))
    L.decide(r)
    assert r.recommended and "already padded to the group's largest K and N took 40.0 us" in r.verdict
    t = {x["provider"]: x for x in r.table()}
    assert t["grouped"]["vs_loop"] == 10.0 and round(t["grouped"]["vs_graph"], 3) == 3.667
    assert t["grouped"]["tflops"] == 2 * (40 * 24 * 32 + 17 * 33 * 70) / 60e-6 / 1e12
    # the graph is the best baseline and the grouped launch is within the noise: capture the loop
    r = G.GroupResult(sizes, "fp16", rows=group_rows(loop=600.0, graph=100.0, grouped=98.5))
    L.decide(r)
    assert not r.recommended and "capture the loop in a CUDA graph" in r.verdict
    # a grouped launch that failed its check is never the winner
    r = G.GroupResult(sizes, "fp16", rows=group_rows(loop=600.0, graph=100.0) + [row("grouped", 10.0, status="wrong")])
    L.decide(r)
    assert r.winner is None and "did not pass its check" in r.verdict
    assert {x["provider"]: x["status"] for x in r.table()}["grouped"] == "wrong: boom"


@pytest.mark.slow
@pytest.mark.interpreter
def test_group_gpu_path_on_the_interpreter(tmp_path, monkeypatch):
    import advisor.run.group_loop as G

    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: True)
    monkeypatch.setattr("advisor.run.gpu.device_spec", lambda: (Device(name="interpreter", sm_count=3),
                                                   {"gpu": "interpreter", "sm_count": 3, "compute_capability": None, "smem_per_block_bytes": None}))
    finding = {"symptom": "launch_overhead", "strategy": "persistent", "kernel": "k", "launches": 3, "total_ns": 1, "est_savings_ns": 1}
    sizes = [(40, 24, 32), (17, 33, 70), (24, 16, 48)]
    r = G.run_group_loop(sizes, "fp16", budget_s=15, finding=finding, out_dir=tmp_path)
    status = {x["provider"]: x["status"] for x in r.rows}
    assert status["torch.matmul"] == "ok" and status["grouped"] == "ok"
    assert status["cuda_graph"] == "skipped"  # no CUDA graphs on the CPU
    assert all(x["rel_err"] < 2e-3 for x in r.rows if x["status"] == "ok")
    assert r.ran_on_gpu and r.winner["provider"] == "grouped" and r.verdict
    text = r.variant_path.read_text()
    assert "TUNED_FOR = {'gpu': 'interpreter'" in text and "'how': 'measured'" in text and "[24, 16, 48]" in text
    from advisor.report.render import render

    md = render("run_report.md.j2", results=[r], device={"gpu": "interpreter", "sm_count": 3, "compute_capability": None},
                versions={"torch": "t", "triton": "tr"}, rules={}, images={}, skipped=[], date="today")
    assert "| vs the torch.matmul loop | vs its CUDA graph |" in md and "| grouped |" in md


def test_run_report_lists_the_skipped(tmp_path, monkeypatch):
    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
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


def test_findings_on_one_shape_run_once_with_every_findings_strategies(monkeypatch):
    # the bundled example flags 1664x1408x8192 twice: tail_wave (stream_k) and hopper_no_ws
    # (warp_specialization); --run times the shape once, and the second finding's strategy
    # must be among its candidates, not dropped without a word
    ran = []
    monkeypatch.setattr(L, "run_shape_loop",
                        lambda M, N, K, dtype, strategies, **kw: ran.append(((M, N, K), list(strategies))) or (M, N, K))
    diagnosis = SimpleNamespace(findings=[finding("tail_wave", 1), finding("hopper_no_ws", 1),
                                          finding("small_grid_long_k", 1, M=256, N=256, K=131072)])
    skipped = []
    assert L.loop_findings(diagnosis, budget_s=5, out_dir=None, skipped=skipped) == [(1664, 1408, 8192), (256, 256, 131072)]
    assert ran == [((1664, 1408, 8192), ["stream_k", "persistent", "warp_specialization"]),
                   ((256, 256, 131072), ["split_k", "stream_k"])]
    assert skipped == []


def test_fusion_and_graph_findings_are_skipped_with_a_reason(tmp_path, monkeypatch):
    # the planted elementwise stream (fusion) has nothing to time: --run lists it in skipped
    # and says what to change, instead of dropping it without a word or crashing
    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
    out = tmp_path / "out"
    r = CliRunner().invoke(cli, ["diagnose", str(DATA / "h200" / "tiny_stream.sqlite.gz"), "--run", "--out", str(out),
                                 "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    assert "advisor: --run: skipped launch_overhead: strategy fusion: fuse or regenerate the kernels" in r.stderr
    assert "nothing run here (1 finding skipped" in r.stderr


def test_memory_bound_findings_are_skipped_with_a_reason(tmp_path, monkeypatch):
    # segment_reduce and fusion are changes to the program: listed, not dropped
    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: False)
    r = CliRunner().invoke(cli, ["diagnose", str(DATA / "h200" / "memory_bound" / "memory_bound_eager.kineto.json.gz"),
                                 "--run", "--out", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")])
    assert r.exit_code == 0, r.output
    assert "skipped slow_memory_bound_kernel: strategy segment_reduce: sort the indices once" in r.stderr
    assert "skipped slow_memory_bound_kernel: strategy fusion:" in r.stderr
