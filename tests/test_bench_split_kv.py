"""bench/bench_split_kv.py's smoke mode on the CPU interpreter: long-format rows, the table."""

from __future__ import annotations

import csv
import importlib.util

import pytest

from conftest import REPO

pytestmark = pytest.mark.interpreter


def test_tiny_smoke_writes_rows_and_table(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_split_kv", REPO / "bench" / "bench_split_kv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--device", "cpu", "--tiny", "--tune-s", "2", "--out", str(tmp_path)]) == 0
    with open(tmp_path / "split_kv.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == mod.COLUMNS
    shapes = {r["shape"] for r in rows}
    assert shapes == {"B1_Hq8_Hkv2_D32_S300", "B2_Hq4_Hkv2_D32_S600"}
    providers = {(r["provider"], r["metric"]) for r in rows}
    assert {("hbm_floor", "time"), ("split_kv", "time"), ("split_kv", "rel_err"), ("split_kv_tuned", "time"),
            ("sdpa_default", "time")} <= providers
    errs = [float(r["p50"]) for r in rows if r["metric"] == "rel_err" and r["provider"].startswith("split_kv")]
    assert errs and max(errs) < 1e-2
    floor = next(float(r["p50"]) for r in rows if r["provider"] == "hbm_floor" and r["shape"].endswith("S300"))
    assert floor == pytest.approx(2 * 1 * 2 * 300 * 32 * 2 / 4.27e12 * 1e6)
    md = (tmp_path / "split_kv.md").read_text()
    assert "| B1_Hq8_Hkv2_D32_S300 |" in md and "HBM floor" in md and "Targets (issue 36)" in md
