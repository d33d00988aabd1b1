"""bench/bench_split_kv.py's smoke mode on the CPU interpreter: long-format rows, the table."""

from __future__ import annotations

import csv
import importlib.util
import json

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


def _bench():
    spec = importlib.util.spec_from_file_location("bench_split_kv", REPO / "bench" / "bench_split_kv.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow  # ~60 s: three shapes through both sweep stages under the interpreter
def test_tiny_sweep_writes_rows_table_and_applies(tmp_path):
    mod = _bench()
    assert mod.main(["--device", "cpu", "--tiny", "--sweep", "--max-candidates", "2", "--time-limit-s", "300",
                     "--out", str(tmp_path)]) == 0
    with open(tmp_path / "split_kv_sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert list(rows[0]) == mod.COLUMNS
    timed = {(r["provider"], r["shape"]) for r in rows if r["metric"] == "time"}
    shapes = {"B1_Hq8_Hkv2_D32_S800", "B2_Hq4_Hkv2_D32_S1040", "B1_Hq7_Hkv1_D32_S600"}
    for provider in ("split_kv", "sdpa_default", "sweep_A", "sweep_B", "split_kv_table"):
        assert {s for p, s in timed if p == provider} == shapes, provider
    # every timed config was checked first
    for r in rows:
        if r["metric"] == "rel_err" and r["provider"].startswith(("sweep_", "split_kv")):
            assert float(r["p50"]) < 1e-2
    # some candidate really splits (>= 3 chunks of 256 keys in the tiny shapes)
    assert any("splits1 " not in r["config"] for r in rows if r["provider"] == "sweep_B")
    data = json.loads((tmp_path / "split_kv_table.json").read_text())
    assert len(data["table"]) == 2 and {p["S"] for p in data["table"]} == {800, 1040}  # no hold-out in the table
    md = (tmp_path / "split_kv_sweep.md").read_text()
    assert "| B1_Hq7_Hkv1_D32_S600 |" in md and "Knob marginals" in md


def test_apply_table_rewrites_only_the_table(tmp_path):
    mod = _bench()
    target = tmp_path / "split_kv_tuning.py"
    original = (REPO / "kernels" / "split_kv_tuning.py").read_text()
    target.write_text(original)
    point = {"units": 24, "S": 20000, "BLOCK_N": 128, "num_warps": 8, "num_stages": 2, "combine": "last_arriver",
             "tma": True, "pdl": True, "stream": False, "programs_per_sm": 3, "us": 50.1}
    src = tmp_path / "t.json"
    src.write_text(json.dumps({"source": "a test's sweep", "sms": 132, "table": [point]}))
    mod.apply_table(src, target)
    text = target.read_text()
    ns = {}
    exec(text[text.index("# BEGIN TABLE"):text.index("# END TABLE")], ns)
    assert ns["TABLE_SOURCE"] == "a test's sweep"
    assert ns["TABLE"] == [{k: v for k, v in point.items() if k != "us"}]
    # everything outside the markers is as it was
    head, tail = original.split("# BEGIN TABLE")[0], original.split("# END TABLE")[1]
    assert text.startswith(head) and text.endswith(tail)
    src.write_text(json.dumps({"source": "x", "table": [{"units": 1}]}))
    with pytest.raises(ValueError, match="points without"):
        mod.apply_table(src, target)
    assert mod.main(["--apply-table", str(tmp_path / "missing.json")]) == 2


def test_marginals_from_rows():
    mod = _bench()
    rows = [dict(metric="time", provider="sweep_A", shape=s, p50=t, config=c) for s, t, c in (
        ("a", 10.0, "n64 h64 w4 s3 splits8 kernel pps2"), ("a", 12.0, "n64 h64 w4 s3 splits8 kernel tma pps2"),
        ("b", 20.0, "n64 h64 w4 s3 splits4 kernel tma pps2"), ("b", 30.0, "n64 h64 w4 s3 splits4 kernel pps2"))]
    m = mod.marginals(rows)
    # pointer loads: 1.0 on a, 1.5 on b -> sqrt(1.5); TMA: 1.2 on a, 1.0 on b -> sqrt(1.2)
    assert m[("load", "pointer")][0] == pytest.approx(1.5 ** 0.5)
    assert m[("load", "tma")][0] == pytest.approx(1.2 ** 0.5)
    assert m[("BLOCK_N", "n64")] == (pytest.approx(1.0), 2)
