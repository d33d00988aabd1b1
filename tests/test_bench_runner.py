"""Tests of the benchmark runner (advisor/bench) on the CPU.

Real schedules run under the Triton interpreter (conftest sets TRITON_INTERPRET=1) with the
CPU timer; deliberately broken fake schedules (wrong values, NaN left in the output, partial
writes, exceptions, hangs, hard crashes) check that failures are recorded with the right
status and never win; the isolating driver is exercised with real child processes.
"""

from __future__ import annotations

import csv
import importlib.util
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import load_script  # noqa: E402
from advisor.run.bench import isolate, rows as R, tables  # noqa: E402
from advisor.run.bench.runner import (  # noqa: E402
    DeviceLost, classify, candidate_configs, load_schedule, run_shape, time_limit, VariantTimeout,
)
from advisor.run.bench.timing import quantile, rotation_count  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

FAKE_SCHEDULE = '''
"""A fake GEMM schedule whose configs misbehave on purpose (tests of advisor.run.bench)."""
import os
import signal
import time
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Config:
    mode: str = "good"
    delay_s: float = 0.0
    index: int = 0


def default_config(M, N, K, dtype, num_sms):
    return Config("good")


def search_space(M, N, K, dtype, num_sms):
    return [Config(m) for m in ("good", "wrong", "nan", "partial", "zeros", "raise_cuda", "raise_compile",
                                "value", "slow")]


def matmul(a, b, config=None, *, out=None):
    config = config or Config()
    if config.delay_s:
        time.sleep(config.delay_s)
    if out is None:
        out = torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype, device=a.device)
    m = config.mode
    if m == "good":
        return torch.matmul(a, b, out=out)
    if m == "wrong":  # 10% off everywhere: rel err 0.1
        torch.matmul(a, b, out=out)
        return out.mul_(1.1)
    if m == "nan":  # writes nothing: the poison stays (and it would be the fastest)
        return out
    if m == "partial":  # forgets the last row
        out[:-1] = a[:-1] @ b
        return out
    if m == "zeros":
        return out.zero_()
    if m == "raise_cuda":
        raise RuntimeError("CUDA error: an illegal memory access was encountered")
    if m == "raise_compile":
        raise RuntimeError("PassManager::run failed")
    if m == "value":
        raise ValueError("block_m=256 does not fit this shape")
    if m == "slow":  # interruptible: SIGALRM ends it
        time.sleep(60)
    if m == "crash":  # what a sticky CUDA fault or a segfault does to the process
        os.kill(os.getpid(), signal.SIGSEGV)
    if m == "hang":  # what a deadlocked kernel does: blocked where no Python signal handler runs
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
        time.sleep(3600)
    raise AssertionError(m)
'''

FAKE_GROUPED = '''
"""A fake grouped schedule: a plan from prepare(), outputs through out=."""
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Config:
    mode: str = "good"


def default_config(sizes, dtype, num_sms):
    return Config("good")


def search_space(sizes, dtype, num_sms):
    return [Config("good"), Config("skip_last"), Config("good2")]


def prepare(As, Bs, config=None):
    return {"n": len(As)}


def grouped_matmul(As, Bs, config=None, *, plan=None, out=None):
    assert plan is not None and plan["n"] == len(As)
    outs = out if out is not None else [torch.empty((a.shape[0], b.shape[1]), dtype=a.dtype) for a, b in zip(As, Bs)]
    n = len(As) - 1 if config.mode == "skip_last" else len(As)
    for a, b, c in list(zip(As, Bs, outs))[:n]:
        torch.matmul(a, b, out=c)
    return outs
'''


def _module_from(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def fake_path(tmp_path) -> Path:
    p = tmp_path / "fake_schedule.py"
    p.write_text(FAKE_SCHEDULE)
    return p


@pytest.fixture
def fake(fake_path):
    return _module_from(fake_path, "fake_schedule_for_tests")


def _by_mode(rows, provider="fake"):
    out = {}
    for r in rows:
        if r["provider"] == provider and r["phase"] == "search" and r["config"]:
            out[__import__("json").loads(r["config"])["mode"]] = r
    return out


# --------------------------------------------------------------------------------------
# Runner with real schedules under the interpreter
# --------------------------------------------------------------------------------------


@pytest.mark.interpreter
def test_run_shape_with_present_schedules_gives_complete_verified_rows():
    strategies, missing = {}, []
    for name in ("split_k", "persistent", "stream_k", "warp_specialization"):
        try:
            mod = load_schedule(name)
        except ImportError:
            missing.append(name)
            continue
        strategies[name] = candidate_configs(mod, 40, 24, 48, torch.float16, 3, quick=True)
    seen = []
    rows = run_shape(40, 24, 48, "fp16", strategies, budget_s=300, progress=seen.append, suite="test",
                     dp_max_configs=1, cpu_reps=1)
    assert rows
    for r in rows:
        assert set(R.COLUMNS) <= set(r), set(R.COLUMNS) - set(r)
        assert r["status"] in R.STATUSES
        assert r["shape"] == "40x24x48" and r["dtype"] == "fp16" and r["suite"] == "test"
        assert r["device"] and r["sm_count"] == 3 and r["torch"] and r["triton"] and r["date"].endswith("Z")
    providers = {r["provider"] for r in rows}
    assert {"torch.matmul", "dp"} <= providers
    assert set(strategies) <= providers
    tol = 2e-3  # kernels/common.TOLERANCE[float16]
    for r in rows:
        if r["status"] == "ok":
            assert 0 <= r["rel_err"] <= tol and r["median_us"] > 0
            assert r["tflops"] == pytest.approx(2 * 40 * 24 * 48 / (r["median_us"] * 1e-6) / 1e12)
            assert r["gbps"] == pytest.approx(2 * (40 * 48 + 48 * 24 + 40 * 24) / (r["median_us"] * 1e-6) / 1e9)
        else:
            assert r["median_us"] is None and r["error"]
    # the cuBLAS stand-in and dp are correct here, and their winners were re-timed
    finals = {r["provider"] for r in rows if r["phase"] == "final" and r["status"] == "ok"}
    assert {"torch.matmul", "dp"} <= finals
    # progress: a start and an end event per variant run
    assert any(p.row is None for p in seen) and any(p.row is not None for p in seen)


# --------------------------------------------------------------------------------------
# Broken candidates
# --------------------------------------------------------------------------------------


def test_broken_candidates_are_recorded_and_never_win(fake):
    cfgs = fake.search_space(8, 8, 8, None, 3)
    rows = run_shape(33, 17, 65, "fp32", {"fake": cfgs}, budget_s=60, suite="t", baselines=("torch.matmul",),
                     schedules={"fake": fake}, variant_timeout_s=1.0, cpu_reps=1)
    by = _by_mode(rows)
    assert by["good"]["status"] == "ok"
    expected = {"wrong": "wrong", "nan": "wrong", "partial": "wrong", "zeros": "wrong",
                "raise_cuda": "launch_error", "raise_compile": "compile_error", "value": "skipped",
                "slow": "timeout"}
    for mode, status in expected.items():
        assert by[mode]["status"] == status, (mode, by[mode]["error"])
        assert by[mode]["median_us"] is None and by[mode]["tflops"] is None
    assert "NaN" in by["nan"]["error"] and "NaN" in by["partial"]["error"]
    assert by["wrong"]["rel_err"] == pytest.approx(0.1, rel=1e-3)
    assert by["zeros"]["rel_err"] == pytest.approx(1.0)
    assert math.isinf(by["nan"]["rel_err"])
    best = tables.best_per_provider(rows)[("t", "33x17x65", "fp32")]
    assert best["fake"]["config"] == by["good"]["config"]
    # only the good config reached the final re-check
    finals = [r for r in rows if r["provider"] == "fake" and r["phase"] == "final"]
    assert [r["config"] for r in finals] == [by["good"]["config"]]


def test_a_failed_final_recheck_disqualifies_the_provider(fake):
    # the winner passes its search checks, then returns garbage on the fresh final inputs
    calls = {"n": 0}

    class Flaky:
        Config = fake.Config
        default_config = staticmethod(fake.default_config)
        search_space = staticmethod(fake.search_space)

        @staticmethod
        def matmul(a, b, config=None, *, out=None):
            calls["n"] += 1
            res = torch.matmul(a, b, out=out)
            return res.mul_(2.0) if calls["n"] > 6 else res  # checks (2) + cpu timing (1+3) pass

    rows = run_shape(16, 16, 16, "fp32", {"flaky": [fake.Config("good")]}, budget_s=30, suite="t",
                     baselines=("torch.matmul",), schedules={"flaky": Flaky}, cpu_reps=3)
    final = [r for r in rows if r["provider"] == "flaky" and r["phase"] == "final"]
    assert len(final) == 1 and final[0]["status"] == "wrong"
    assert "flaky" not in tables.best_per_provider(rows)[("t", "16x16x16", "fp32")]


def test_lost_device_raises_with_the_rows_so_far(fake, monkeypatch):
    from advisor.run.bench import runner

    monkeypatch.setattr(runner, "device_healthy", lambda: False)
    with pytest.raises(DeviceLost) as info:
        run_shape(8, 8, 8, "fp32", {"fake": [fake.Config("good"), fake.Config("raise_cuda"), fake.Config("good", index=1)]},
                  budget_s=30, suite="t", baselines=("torch.matmul",), schedules={"fake": fake}, cpu_reps=1)
    got = [(r["provider"], r["status"]) for r in info.value.rows]
    assert got == [("torch.matmul", "ok"), ("fake", "ok"), ("fake", "launch_error")]


def test_classify():
    assert classify(VariantTimeout("x")) == "timeout"
    assert classify(RuntimeError("Triton Error [CUDA]: an illegal memory access was encountered")) == "launch_error"
    assert classify(RuntimeError("PassManager::run failed")) == "compile_error"
    assert classify(ValueError("TMA needs 16-byte strides")) == "skipped"
    assert classify(KeyError("x")) == "launch_error"
    import ast

    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources

    assert classify(CompilationError("x = 1", ast.parse("x = 1").body[0], "bad")) == "compile_error"
    assert classify(OutOfResources(300000, 232448, "shared memory")) == "compile_error"
    assert classify(CompilationError.__new__(CompilationError)) == "compile_error"  # even half-built


def test_time_limit_interrupts_python_code():
    t0 = time.monotonic()
    with pytest.raises(VariantTimeout):
        with time_limit(0.3):
            time.sleep(5)
    assert time.monotonic() - t0 < 2
    with time_limit(5):  # no alarm left behind
        pass
    time.sleep(0.01)


# --------------------------------------------------------------------------------------
# Budget
# --------------------------------------------------------------------------------------


def test_budget_stops_the_loop_and_round_robin_shares_it(fake):
    slow = [fake.Config("good", delay_s=0.15, index=i) for i in range(40)]
    other = [fake.Config("good", delay_s=0.15, index=100 + i) for i in range(40)]
    t0 = time.monotonic()
    rows = run_shape(8, 8, 8, "fp32", {"a": slow, "b": other}, budget_s=2.0, suite="t", baselines=("torch.matmul",),
                     schedules={"a": fake, "b": fake}, cpu_reps=1, final=False)
    elapsed = time.monotonic() - t0
    n_a = sum(1 for r in rows if r["provider"] == "a")
    n_b = sum(1 for r in rows if r["provider"] == "b")
    # each variant costs >= 6 calls x 0.15 s: the 2 s budget fits a handful, not 80
    assert 1 <= n_a <= 4 and 1 <= n_b <= 4 and abs(n_a - n_b) <= 1
    assert elapsed < 2.0 + 5.0 + 2.0  # budget + GRACE_S for the last variant + slack


def test_zero_budget_runs_baselines_and_marks_strategies_skipped(fake):
    rows = run_shape(8, 8, 8, "fp32", {"fake": [fake.Config("good")]}, budget_s=0, suite="t",
                     baselines=("torch.matmul",), schedules={"fake": fake}, cpu_reps=1)
    assert [r["status"] for r in rows if r["provider"] == "torch.matmul"] == ["ok", "ok"]  # search + final
    skipped = [r for r in rows if r["provider"] == "fake"]
    assert len(skipped) == 1 and skipped[0]["status"] == "skipped" and "budget" in skipped[0]["error"]


def test_missing_schedule_is_a_skipped_row():
    rows = run_shape(8, 8, 8, "fp32", {"no_such_schedule_xyz": [None]}, budget_s=5, suite="t",
                     baselines=("torch.matmul",), cpu_reps=1)
    r = [r for r in rows if r["provider"] == "no_such_schedule_xyz"]
    assert len(r) == 1 and r[0]["status"] == "skipped" and "not available" in r[0]["error"]


def test_known_outcomes_and_skips_are_not_run(fake):
    from advisor.run.bench.runner import variant_key

    crash = fake.Config("crash")  # would kill this test process if it ran
    known = {variant_key("t", "search", "fake", R.config_json(crash)): ("launch_error", "(compile pass) crashed")}
    done = fake.Config("slow")
    skip = {variant_key("t", "search", "fake", R.config_json(done))}
    rows = run_shape(8, 8, 8, "fp32", {"fake": [crash, done, fake.Config("good")]}, budget_s=30, suite="t",
                     baselines=("torch.matmul",), schedules={"fake": fake}, known=known, skip=skip, cpu_reps=1)
    by = _by_mode(rows)
    assert by["crash"]["status"] == "launch_error" and "compile pass" in by["crash"]["error"]
    assert "slow" not in by and by["good"]["status"] == "ok"


# --------------------------------------------------------------------------------------
# Grouped
# --------------------------------------------------------------------------------------


def test_run_grouped_baselines_and_a_partial_writer(tmp_path):
    from advisor.run.bench.grouped import group_sizes, run_grouped

    p = tmp_path / "fake_grouped.py"
    p.write_text(FAKE_GROUPED)
    mod = _module_from(p, "fake_grouped_for_tests")
    sizes = group_sizes(5, 16, 40, seed=3)
    assert sizes == group_sizes(5, 16, 40, seed=3) and all(16 <= d <= 40 and d % 8 == 0 for s in sizes for d in s)
    rows = run_grouped(sizes, "fp32", mod.search_space(sizes, None, 3), budget_s=60, module=mod, cpu_reps=1,
                       label="5 GEMMs")
    st = {(r["provider"], r["config"], r["phase"]): r["status"] for r in rows}
    tf32 = '{"allow_tf32": true}'  # fp32: the cuBLAS loop runs tf32, as the grouped kernel does
    assert st[("torch.matmul", tf32, "search")] == "ok"
    assert st[("cuda_graph", tf32, "search")] == "skipped"  # no CUDA here
    assert st[("torch._grouped_mm", "", "search")] == "skipped"  # mixed K and N: not expressible
    modes = {__import__("json").loads(r["config"])["mode"]: r for r in rows if r["provider"] == "grouped"
             and r["phase"] == "search"}
    assert modes["good"]["status"] == "ok" and modes["good2"]["status"] == "ok"
    assert modes["skip_last"]["status"] == "wrong" and "GEMM 4" in modes["skip_last"]["error"]
    flops = sum(2.0 * m * n * k for m, n, k in sizes)
    for r in rows:
        assert set(R.COLUMNS) <= set(r)
        if r["status"] == "ok":
            assert r["flops"] == flops and r["tflops"] == pytest.approx(flops / (r["median_us"] * 1e-6) / 1e12)


# --------------------------------------------------------------------------------------
# Files and tables
# --------------------------------------------------------------------------------------


def _row(**kw):
    base = dict(suite="tail", shape="A", M=1, N=1, K=1, dtype="bf16", provider="torch.matmul", config="",
                status="ok", env={"run_id": "r1", "date": "2026-11-29T00:00:00Z", "device": "NVIDIA H200",
                                  "sm_count": 132})
    base.update(kw)
    us = base.pop("us", None)
    env = base.pop("env")
    env = dict(env, **base.pop("envx", {}))
    return R.make_row(median_ms=None if us is None else us / 1e3, p20_ms=None if us is None else us / 1e3,
                      p80_ms=None if us is None else us / 1e3, flops=2e9, bytes_moved=1e6, env=env, **base)


def test_a_gz_table_is_read_and_appended_compressed(tmp_path):
    # the committed bench/results/h200.csv.gz: appended and read as the plain CSV is, written
    # compressed and byte-for-byte the same for the same rows (no time stamp in the header)
    import gzip

    plain, packed = tmp_path / "h200.csv", tmp_path / "h200.csv.gz"
    for path in (plain, packed):
        R.append_csv(path, [_row(us=100.0), _row(provider="dp", us=200.0)])
        R.append_csv(path, [dict(_row(provider="stream_k", us=80.0), extra_col="x")])
    assert gzip.decompress(packed.read_bytes()) == plain.read_bytes()
    assert R.read_csv(packed) == R.read_csv(plain) and len(R.read_csv(packed)) == 3
    again = tmp_path / "again" / "h200.csv.gz"
    R.append_csv(again, [_row(us=100.0), _row(provider="dp", us=200.0)])
    R.append_csv(again, [dict(_row(provider="stream_k", us=80.0), extra_col="x")])
    assert again.read_bytes() == packed.read_bytes()
    with R.open_text(packed) as f:
        assert next(csv.reader(f))[:3] == ["suite", "shape", "M"]


def test_csv_append_keeps_one_header_and_merges_new_columns(tmp_path):
    path = tmp_path / "h200.csv"
    R.append_csv(path, [_row(us=100.0), _row(provider="dp", us=200.0)])
    R.append_csv(path, [_row(provider="stream_k", us=80.0, config={"b": 1, "a": 2})])
    lines = path.read_text().splitlines()
    assert lines[0].split(",")[:3] == ["suite", "shape", "M"]
    assert sum(1 for ln in lines if ln.startswith("suite,")) == 1 and len(lines) == 4
    got = R.read_csv(path)
    assert [r["provider"] for r in got] == ["torch.matmul", "dp", "stream_k"]
    assert got[2]["median_us"] == pytest.approx(80.0) and got[2]["config"] == '{"a": 2, "b": 1}'
    assert got[0]["M"] == 1 and got[0]["error"] is None
    # a row with a column the file lacks: the file is rewritten once with the union
    R.append_csv(path, [dict(_row(us=90.0), extra_col="x")])
    lines = path.read_text().splitlines()
    assert sum(1 for ln in lines if ln.startswith("suite,")) == 1 and len(lines) == 5
    got = R.read_csv(path)
    assert got[-1]["extra_col"] == "x" and got[0]["extra_col"] in ("", None)
    with path.open(newline="") as f:
        assert all(len(r) == len(lines[0].split(",")) for r in csv.reader(f))


def test_json_writers_keep_non_finite_errors(tmp_path):
    rows = [_row(status="wrong", error="NaN", rel_err=math.inf)]
    p = R.write_json(tmp_path / "rows.json", rows)
    import json

    data = json.loads(p.read_text())  # strict JSON: no bare Infinity
    assert data[0]["rel_err"] == "inf" and data[0]["median_us"] is None


def test_table_math_on_hand_made_rows():
    rows = [
        # shape A: torch 100 us, dp 200, stream_k searched at 70 but re-timed at 80 (the final counts)
        _row(shape="A", us=100.0),
        _row(shape="A", provider="dp", us=200.0),
        _row(shape="A", provider="stream_k", config={"c": 1}, us=70.0),
        _row(shape="A", provider="stream_k", config={"c": 1}, us=80.0, phase="final"),
        _row(shape="A", provider="persistent", status="wrong", error="rel err", us=10.0),  # never counts
        # persistent passes its search but fails the final re-check: no result
        _row(shape="A", provider="warp_specialization", us=50.0),
        _row(shape="A", provider="warp_specialization", us=None, status="wrong", phase="final", error="x"),
        # shape B: torch 50, dp 100, stream_k 62.5
        _row(shape="B", us=50.0),
        _row(shape="B", provider="dp", us=100.0),
        _row(shape="B", provider="stream_k", us=62.5),
    ]
    best = tables.best_per_provider(rows)
    a = best[("tail", "A", "bf16")]
    assert a["stream_k"]["median_us"] == pytest.approx(80.0)
    assert "persistent" not in a and "warp_specialization" not in a
    t = {(e["shape"], e["provider"]): e for e in tables.speedup_table(rows)}
    assert t[("A", "stream_k")]["vs_torch.matmul"] == pytest.approx(100 / 80)  # 1.25
    assert t[("A", "stream_k")]["vs_dp"] == pytest.approx(200 / 80)  # 2.5
    assert t[("B", "stream_k")]["vs_torch.matmul"] == pytest.approx(50 / 62.5)  # 0.8
    assert t[("B", "stream_k")]["vs_dp"] == pytest.approx(100 / 62.5)  # 1.6
    assert t[("A", "torch.matmul")]["vs_torch.matmul"] == pytest.approx(1.0)
    g = tables.suite_geomeans(tables.speedup_table(rows), "vs_torch.matmul")
    assert g[("tail", "bf16", "stream_k")]["geomean"] == pytest.approx(1.0)  # sqrt(1.25 x 0.8)
    assert g[("tail", "bf16", "stream_k")]["n"] == 2
    g = tables.suite_geomeans(tables.speedup_table(rows), "vs_dp")
    assert g[("tail", "bf16", "stream_k")]["geomean"] == pytest.approx(2.0)  # sqrt(2.5 x 1.6)
    assert tables.geomean([2, 8]) == pytest.approx(4.0)
    assert tables.geomean([]) is None and tables.geomean([0, -1, float("nan")]) is None
    ours = tables.best_of(tables.speedup_table(rows), ["stream_k", "warp_specialization"], label="ours")
    assert {e["shape"]: e["winner"] for e in ours} == {"A": "stream_k", "B": "stream_k"}
    summary = tables.summary_markdown(rows)
    assert "| stream_k | vs dp | 2.000 | 2 |" in summary and "| stream_k | vs torch.matmul | 1.000 | 2 |" in summary
    assert "| A | stream_k | 80.0 |" in summary and "persistent" not in summary
    md = tables.markdown_table([{"x": "a|b", "y": 1.23456}], [("x", "X"), ("y", "Y", ".2f")])
    assert md.splitlines()[2] == "| a\\|b | 1.23 |"


def test_targets_and_floor_ratio():
    suites = load_script("bench/suites.py")
    hbm = 4000.0  # GB/s: bytes_moved 1e6 -> floor 0.25 us
    rows = [
        _row(suite="tail", shape="A", us=100.0), _row(suite="tail", shape="A", provider="dp", us=150.0),
        _row(suite="tail", shape="A", provider="stream_k", us=90.0),
        _row(suite="skinny", shape="S", us=1.0, hbm_gbps=hbm),
        _row(suite="skinny", shape="S", provider="split_k", us=0.5, hbm_gbps=hbm),
    ]
    res = {(r["suite"], r["target"]): r for r in suites.evaluate_targets(rows)}
    tail_dp = next(r for r in res.values() if r["suite"] == "tail" and "data-parallel" in r["target"])
    assert tail_dp["value"] == pytest.approx(150 / 90) and tail_dp["met"] is True  # 1.67 >= 1.15
    tail_torch = next(r for r in res.values() if r["suite"] == "tail" and "torch" in r["target"])
    assert tail_torch["value"] == pytest.approx(100 / 90) and tail_torch["met"] is True
    sk = next(r for r in res.values() if r["suite"] == "skinny" and "torch" in r["target"])
    assert sk["value"] == pytest.approx(2.0) and sk["met"] is True
    floor = next(r for r in res.values() if r["suite"] == "skinny" and "floor" in r["target"])
    assert floor["value"] == pytest.approx(0.5 / 0.25) and floor["met"] is False  # 2.0x the floor > 1.3
    assert "missed" in floor["note"]


def test_latest_runs_drops_older_runs_of_a_shape():
    old = _row(shape="A", us=100.0, envx={"run_id": "r0", "date": "2026-11-01T00:00:00Z"})
    new = _row(shape="A", us=120.0, envx={"run_id": "r1", "date": "2026-11-29T00:00:00Z"})
    other = _row(shape="B", us=10.0, envx={"run_id": "r0", "date": "2026-11-01T00:00:00Z"})
    kept = tables.latest_runs([old, new, other])
    assert [(r["shape"], r["median_us"]) for r in kept] == [("A", 120.0), ("B", 10.0)]


def test_rotation_and_quantiles():
    mb = 1024 * 1024
    assert rotation_count(16 * mb, 60 * mb) == 9  # ceil(2 x 60 / 16) + 1
    assert rotation_count(400 * mb, 60 * mb, min_sets=2) == 2
    assert rotation_count(3 * 1024 * mb, 60 * mb, min_sets=2) == 1  # two would pass the 4 GiB cap
    assert rotation_count(1 * mb, 60 * mb) == 16  # capped
    vals = [5.0, 1.0, 3.0, 2.0, 4.0]
    s = sorted(vals)
    assert quantile(s, 0.5) == 3.0 and quantile(s, 0.2) == pytest.approx(1.8) and quantile(s, 0.8) == pytest.approx(4.2)


# --------------------------------------------------------------------------------------
# Process isolation: crashes and hangs end a variant, not the run
# --------------------------------------------------------------------------------------


def _plan(fake_path, suite="iso", **job):
    return {
        "run_id": "test", "deadline": None, "hbm_gbps": None,
        "settings": {"timer": "auto", "cpu_reps": 1, "variant_timeout_s": 2.0, "max_configs": None},
        "schedules": {"fake": str(fake_path)},
        "jobs": [dict({"id": "j1", "kind": "gemm", "suite": suite, "M": 8, "N": 8, "K": 8, "dtype": "fp32",
                       "strategies": ["fake"], "budget_s": 60, "baselines": ["torch.matmul"]}, **job)],
    }


@pytest.mark.slow
def test_isolated_run_survives_a_crash_and_a_hang(fake_path, fake, tmp_path):
    # a caller-ranked list, as advisor bench passes it: good, crash, hang, good again
    ranked = [fake.Config("good"), fake.Config("crash"), fake.Config("hang"), fake.Config("good", index=1)]
    seen = []
    t0 = time.monotonic()
    rows = isolate.run_shape_isolated(8, 8, 8, torch.float32, {"fake": ranked}, 60, seen.append, suite="iso",
                                      baselines=("torch.matmul",), workdir=tmp_path / "work",
                                      variant_timeout_s=2.0, stall_s=4.0, schedule_files={"fake": fake_path})
    assert time.monotonic() - t0 < 120
    by = _by_mode(rows)
    assert by["crash"]["status"] == "launch_error" and "SIGSEGV" in by["crash"]["error"]
    assert by["hang"]["status"] == "timeout" and "no progress" in by["hang"]["error"]
    assert by["good"]["status"] == "ok"
    good1 = [r for r in rows if r["provider"] == "fake" and '"index": 1' in r["config"] and r["phase"] == "search"]
    assert len(good1) == 1 and good1[0]["status"] == "ok"
    # the caller's order was kept, nothing was measured twice across the two restarts,
    # and the winners were re-timed
    search = [__import__("json").loads(r["config"]) for r in rows if r["provider"] == "fake" and r["phase"] == "search"]
    assert [(c["mode"], c["index"]) for c in search] == [("good", 0), ("crash", 0), ("hang", 0), ("good", 1)]
    keys = [(r["phase"], r["provider"], r["config"]) for r in rows]
    assert len(keys) == len(set(keys))
    assert any(k[0] == "final" and k[1] == "torch.matmul" for k in keys)
    assert (tmp_path / "work" / "worker.log").read_text().count(" start measure") == 3  # two restarts
    for r in rows:
        assert set(R.COLUMNS) <= set(r) and r["shape"] == "8x8x8"
    # progress saw each variant start (row None) and each row
    assert sum(1 for p in seen if p.row is None) >= 6 and sum(1 for p in seen if p.row is not None) == len(rows)


@pytest.mark.slow
def test_run_deadline_kills_the_worker_and_reports_what_never_ran(fake_path, tmp_path):
    plan = _plan(fake_path)
    plan["settings"]["variant_timeout_s"] = 120.0
    plan["jobs"][0]["configs"] = {"fake": [{"mode": "good", "delay_s": 60.0, "index": 0}]}
    plan["jobs"].append(dict(plan["jobs"][0], id="j2", M=16))
    t0 = time.time()
    rows = isolate.run_plan(plan, tmp_path / "work", log_path=tmp_path / "log.txt", stall_s=300.0,
                            startup_s=120.0, hard_deadline=t0 + 30)
    assert time.time() - t0 < 90
    slow = [r for r in rows if r["provider"] == "fake"]
    assert len(slow) == 1 and slow[0]["status"] == "timeout" and "deadline" in slow[0]["error"]
    j2 = [r for r in rows if r["shape"] == "16x8x8"]
    assert len(j2) == 1 and j2[0]["status"] == "skipped" and "time limit" in j2[0]["error"]


def test_precompile_pass_reports_crashes_as_known(fake_path, tmp_path):
    fake_path.write_text(fake_path.read_text() + (
        "\n\ndef search_space(M, N, K, dtype, num_sms):\n"
        "    return [Config('good'), Config('crash'), Config('raise_compile'), Config('good', index=1)]\n"))
    plan = _plan(fake_path)
    known, stats = isolate.precompile(plan, tmp_path / "work", procs=2, deadline=time.time() + 120,
                                      stall_s=10.0, startup_s=120.0)
    outcomes = {__import__("json").loads(k[3])["mode"]: s for k, s, e in known["j1"]}
    assert outcomes == {"crash": "launch_error", "raise_compile": "compile_error"}
    assert stats["crashed"] == 1 and stats["ok"] >= 2


# --------------------------------------------------------------------------------------
# The GPU script's path, end to end on the CPU
# --------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.interpreter
def test_bench_gemm_script_end_to_end(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, TRITON_INTERPRET="1", ADVISOR_NUM_SMS="3")
    env.pop("OUT", None)
    cmd = [sys.executable, str(REPO / "bench" / "bench_gemm.py"), "--suites", "tail,grouped",
           "--shapes", "tail:40x24x32", "--grouped", "3:16:32", "--quick", "--compile-procs", "1",
           "--time-limit-s", "240", "--out", str(out)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    rows = R.read_csv(out / "h200.csv")
    assert {r["suite"] for r in rows} >= {"ceiling", "tail", "grouped"}
    assert any(r["provider"] == "dp" and r["status"] == "ok" for r in rows)
    assert "best tail schedule" in res.stdout.splitlines()[-1] or "tail/" in res.stdout  # summary printed last
    assert (out / "h200_summary.md").read_text().startswith("# Measured results: GEMM schedules")
    # make_tables reads the same CSV
    md = tmp_path / "RESULTS.md"
    res2 = subprocess.run([sys.executable, str(REPO / "bench" / "make_tables.py"), "--csv", str(out / "h200.csv"),
                           "--out", str(md)], capture_output=True, text=True, timeout=120)
    assert res2.returncode == 0, res2.stderr
    text = md.read_text()
    assert "## tail" in text and "## Targets (issue 4)" in text and "| 40x24x32 |" in text


# --------------------------------------------------------------------------------------
# The final pass: finalists re-timed in interleaved rounds
# --------------------------------------------------------------------------------------


def test_final_candidates_take_each_providers_fastest_distinct_configs():
    from advisor.run.bench.runner import final_candidates

    rows = [{"provider": "a", "config": c, "status": "ok", "median_us": us}
            for c, us in (("1", 5.0), ("2", 3.0), ("1", 4.0), ("3", 9.0), ("4", 1.0))]
    rows += [{"provider": "a", "config": "5", "status": "wrong", "median_us": None},
             {"provider": "b", "config": "", "status": "ok", "median_us": 7.0}]
    got = [(r["provider"], r["config"], r["median_us"]) for r in final_candidates(rows, top=3)]
    assert got == [("a", "4", 1.0), ("a", "2", 3.0), ("a", "1", 4.0), ("b", "", 7.0)]


def test_combine_rounds_takes_the_median_and_keeps_failures():
    from advisor.run.bench.runner import combine_rounds

    base = {"status": "ok", "p20_us": 1.0, "p80_us": 2.0, "tflops": 10.0, "gbps": 100.0, "rel_err": 1e-3}
    rows = [dict(base, median_us=10.0), dict(base, median_us=30.0, p80_us=40.0, rel_err=2e-3),
            dict(base, median_us=20.0, p20_us=0.5)]
    row = combine_rounds(rows)
    assert row["median_us"] == 20.0 and row["rounds"] == 3
    assert row["tflops"] == pytest.approx(5.0) and row["gbps"] == pytest.approx(50.0)  # rescaled from round 1
    assert row["p20_us"] == 0.5 and row["p80_us"] == 40.0 and row["rel_err"] == 2e-3
    assert combine_rounds(rows + [dict(base, status="wrong", median_us=None)])["status"] == "wrong"
    assert combine_rounds([]) is None


def test_final_pass_interleaves_the_finalists(fake):
    from advisor.run.bench import runner

    cfgs = [fake.Config("good", index=i) for i in range(5)]
    order = []
    real = runner.ShapeBench.measure

    def spy(self, cand, **kw):
        if kw.get("phase") == "final":
            order.append((cand.provider, cand.config_text))
        return real(self, cand, **kw)

    runner.ShapeBench.measure = spy
    try:
        rows = run_shape(8, 8, 8, "fp32", {"fake": cfgs}, budget_s=60, suite="t", baselines=("torch.matmul",),
                         schedules={"fake": fake}, cpu_reps=1)
    finally:
        runner.ShapeBench.measure = real
    finals = [r for r in rows if r["phase"] == "final"]
    assert len([r for r in finals if r["provider"] == "fake"]) == runner.FINAL_TOP
    assert all(r["rounds"] == runner.FINAL_ROUNDS for r in finals)
    n = len(finals)
    assert len(order) == n * runner.FINAL_ROUNDS
    rounds = [order[i * n:(i + 1) * n] for i in range(runner.FINAL_ROUNDS)]
    assert all(sorted(r) == sorted(rounds[0]) for r in rounds)  # each round times every finalist once
    assert rounds[1] == rounds[0][1:] + rounds[0][:1]  # in a rotated order


def test_grouped_suite_never_uses_the_graph_timer():
    """The grouped suite's baselines measure launch cost, which the graph timer would capture
    away (and its CUDA-graph baseline cannot run inside another capture)."""
    from advisor.run.bench.grouped import grouped_timer

    assert grouped_timer("graph", "cuda") == "do_bench"
    assert grouped_timer("events", "cuda") == "events"
    assert grouped_timer("auto", "cuda") == "do_bench"
    assert grouped_timer("graph", "cpu") == "cpu"


def test_bench_gemm_grouped_option_shares_generate_parser(capsys):
    spec = importlib.util.spec_from_file_location("bench_gemm_cli", REPO / "bench" / "bench_gemm.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    args = mod.parse_args(["--grouped", "8:16:64", "--dry-run"])
    assert args.grouped == {"count": 8, "lo": 16, "hi": 64, "seed": 0}
    for bad in ("3:1:5", "x", "0:16:32"):  # no multiple of 8 in range, not integers, no GEMMs
        with pytest.raises(SystemExit) as exc:
            mod.parse_args(["--grouped", bad])
        assert exc.value.code == 2
    assert "--grouped: group" in capsys.readouterr().err
