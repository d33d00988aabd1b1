"""The loop's decisions (winner, verdict, noise margin) on hand-made rows, and the whole GPU
path driven on the CPU interpreter with a fake device."""

from __future__ import annotations

from pathlib import Path

import pytest

import advisor.loop as L
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
