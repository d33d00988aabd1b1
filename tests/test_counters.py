"""--counters: finding ncu, parsing its raw CSV, one line per provider, the readings, and the
whole path (loop -> ncu -> child target -> report) with a fake ncu on the CPU interpreter."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import advisor.run.counters as C
import advisor.run.loop as L
from advisor.cli import cli
from advisor.codegen.schedule_model import Device

FAKE = Path(__file__).parent / "fakes" / "fake_ncu.py"
DATA = Path(__file__).parent / "data"

RAW = '''==PROF== Connected to process 77 (/usr/bin/python3.12)
==WARNING== something to ignore
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","gpu__time_duration.sum","sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active","sm__cycles_active.avg","sm__cycles_elapsed.avg","dram__bytes_read.sum","dram__bytes_write.sum","launch__waves_per_multiprocessor","sm__warps_active.avg.pct_of_peak_sustained_active"
"","","","","","","","","","","","nsecond","%","cycle","cycle","byte","byte","","%"
"0","77","python3.12","127.0.0.1","gemm_main","1","7","(256, 1, 1)","(143, 1, 1)","0","9.0","75,000","80.0","1,500","2,000","3,000,000","1,000,000","1.08","12.5"
"1","77","python3.12","127.0.0.1","reduce","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","25,000","0","500","1,000","1,000,000","1,000,000","0.12","50"
'''


def test_parse_raw_csv_skips_chatter_and_reads_units_and_thousands():
    ks = C.parse_raw_csv(RAW)
    assert [k["kernel"] for k in ks] == ["gemm_main", "reduce"]
    assert ks[0]["grid"] == "(143, 1, 1)" and ks[0]["id"] == "0"
    assert ks[0]["metrics"]["gpu__time_duration.sum"] == (75000.0, "nsecond")
    assert ks[1]["metrics"]["dram__bytes_read.sum"] == (1e6, "byte")
    assert C.parse_raw_csv("==ERROR== nothing\n") == []


def test_summarize_weights_by_time_and_takes_waves_from_the_longest_kernel():
    s = C.summarize("split_k", C.parse_raw_csv(RAW), compulsory_bytes=3e6)
    assert s["kernels"] == 2 and s["main_kernel"] == "gemm_main"
    assert s["time_us"] == pytest.approx(100.0)
    assert s["tensor_pct"] == pytest.approx(0.75 * 80.0)  # 75 us at 80 %, 25 us at 0 %
    assert s["sm_busy_pct"] == pytest.approx(0.75 * 75.0 + 0.25 * 50.0)
    assert s["achieved_occupancy_pct"] == pytest.approx(0.75 * 12.5 + 0.25 * 50)
    assert s["waves_per_sm"] == 1.08
    assert s["dram_bytes"] == 6e6 and s["dram_x_compulsory"] == pytest.approx(2.0)
    assert s["dram_pct"] is None  # not collected: no made-up number
    assert s["l2_pct"] is None and s["l2_hit_pct"] is None


def test_explain_names_what_limits_the_kernel():
    idle = C.explain({"sm_busy_pct": 60.0, "tensor_pct": 40.0, "dram_pct": 10.0, "kernels": 1})
    assert "idle 40%" in idle and "under-fed" in idle
    mem = C.explain({"sm_busy_pct": 99.0, "tensor_pct": 20.0, "dram_pct": 85.0, "dram_x_compulsory": 3.0, "kernels": 2})
    assert "memory-bound" in mem and "under-fed" not in mem and "3.0x the compulsory" in mem and "2 kernels" in mem
    assert C.explain({"sm_busy_pct": 97.0, "tensor_pct": 90.0, "dram_pct": 20.0, "kernels": 1}) == "tensor pipe busy"
    assert "under-fed" in C.explain({"sm_busy_pct": 97.0, "tensor_pct": 71.0, "dram_pct": 20.0, "kernels": 1})
    # L2 saturated while DRAM is not: the operands are re-read from L2, not a latency problem
    l2 = C.explain({"sm_busy_pct": 97.0, "tensor_pct": 50.0, "dram_pct": 60.0, "l2_pct": 88.0, "kernels": 1})
    assert "L2-bound" in l2 and "under-fed" not in l2
    assert "L2" not in C.explain({"sm_busy_pct": 97.0, "tensor_pct": 50.0, "dram_pct": 90.0, "l2_pct": 88.0, "kernels": 1})


def test_usable_metrics_filters_by_the_query_but_keeps_launch_attributes():
    bases = {f"x__m{i}" for i in range(30)} | {"gpu__time_duration"}
    got = C.usable_metrics(C.METRICS.values(), bases)
    assert "gpu__time_duration.sum" in got and "launch__waves_per_multiprocessor" in got
    assert "dram__bytes_read.sum" not in got
    assert C.usable_metrics(["a__b.sum"], set()) == ["a__b.sum"]  # failed query: keep all, retry decides
    assert C.unknown_metrics("==ERROR== Failed to find metric a__b.sum\n", ["a__b.sum", "c__d.avg"]) == ["a__b.sum"]


def _fake_ncu(tmp_path: Path) -> Path:
    exe = tmp_path / "bin" / "ncu"
    exe.parent.mkdir(parents=True, exist_ok=True)
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return exe


def test_find_ncu(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "STANDARD_LOCATIONS", ())
    monkeypatch.delenv("NCU", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert C.find_ncu() is None
    exe = _fake_ncu(tmp_path)
    monkeypatch.setenv("PATH", str(exe.parent))
    assert C.find_ncu() == str(exe)
    monkeypatch.setenv("NCU", str(tmp_path / "nope"))
    with pytest.raises(C.CountersUnavailable, match=r"\$NCU"):
        C.find_ncu()
    nested = tmp_path / "opt" / "nsight-compute" / "2025.3.1" / "ncu"
    nested.parent.mkdir(parents=True)
    nested.write_bytes(exe.read_bytes())
    nested.chmod(0o755)
    monkeypatch.delenv("NCU")
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(C, "STANDARD_LOCATIONS", (str(tmp_path / "opt" / "nsight-compute" / "*" / "ncu"),))
    assert C.find_ncu() == str(nested)


def test_no_ncu_is_a_note_not_an_error(tmp_path, monkeypatch):
    monkeypatch.setattr(C, "find_ncu", lambda: None)
    res = C.collect(64, 64, 64, "bf16", [("torch.matmul", None)], tmp_path)
    assert res.summaries == [] and "not found" in res.notes[0] and "NCU=" in res.notes[0]
    monkeypatch.undo()
    monkeypatch.setenv("NCU", str(tmp_path / "nope"))  # after a long timing run: a note, not an exit
    res = C.collect(64, 64, 64, "bf16", [("torch.matmul", None)], tmp_path)
    assert res.summaries == [] and "$NCU" in res.notes[0]


def test_providers_for_puts_baselines_first_and_skips_the_observed_kernel():
    table = [{"provider": "observed in trace", "median_us": 9.0}, {"provider": "split_k", "median_us": 1.0, "config": '{"SPLIT_K": 4}'},
             {"provider": "dp", "median_us": 2.0, "config": "{}"}, {"provider": "torch.matmul", "median_us": 1.5, "config": ""},
             {"provider": "stream_k", "median_us": None, "config": "x"}]
    assert C.providers_for(table) == [("torch.matmul", None), ("dp", None), ("split_k", '{"SPLIT_K": 4}')]


def test_target_runs_one_checked_call_on_the_cpu():
    from advisor.run.bench import ncu_target

    assert ncu_target.main(["--shape", "17x19x23", "--dtype", "fp32", "--provider", "torch.matmul", "--device", "cpu"]) == 0
    cfg = json.dumps({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16, "GROUP_M": 2, "num_warps": 4, "num_stages": 2})
    assert ncu_target.main(["--shape", "33x17x40", "--dtype", "fp16", "--provider", "dp", "--config", cfg, "--device", "cpu"]) == 0


@pytest.mark.slow
def test_loop_with_counters_end_to_end_on_a_fake_ncu(tmp_path, monkeypatch):
    exe = _fake_ncu(tmp_path)
    monkeypatch.setenv("NCU", str(exe))
    monkeypatch.setenv("FAKE_NCU_REJECT", "sm__throughput.avg.pct_of_peak_sustained_elapsed")
    monkeypatch.setenv("FAKE_NCU_HIDE", "sm__pipe_tensor_op_hmma_cycles_active")
    monkeypatch.setattr("advisor.run.gpu.gpu_present", lambda: True)
    monkeypatch.setattr("advisor.run.gpu.device_spec", lambda: (Device(name="interpreter", sm_count=3),
                                                   {"gpu": "interpreter", "sm_count": 3, "compute_capability": None,
                                                    "smem_per_block_bytes": None}))
    logs = []
    r = L.run_shape_loop(40, 24, 512, "fp16", ["split_k"], budget_s=15, out_dir=tmp_path / "out", counters=True,
                         log=logs.append)
    c = r.counters
    assert [s["provider"] for s in c["summaries"]][:2] == ["torch.matmul", "dp"]
    assert "split_k" in [s["provider"] for s in c["summaries"]], c["notes"]
    sk = next(s for s in c["summaries"] if s["provider"] == "split_k")
    assert sk["kernels"] == 2 and sk["time_us"] == pytest.approx(100.0) and sk["config"]
    assert sk["dram_x_compulsory"] == pytest.approx(1572864 * 2 / ((40 * 512 + 512 * 24 + 40 * 24) * 2))
    assert len(logs) == len(c["summaries"]) and "ncu on torch.matmul" in logs[0]
    rows = (tmp_path / "out" / "counters.csv").read_text()
    # the refused metric was dropped and the query-filtered one never requested
    assert "sm__throughput" not in rows and "hmma" not in rows and "gmma" in rows
    assert all((tmp_path / "out" / "ncu" / f).is_file() for f in c["reports"])
    # the report escapes the kernel name ncu returned
    from advisor.report.render import render

    md = render("run_report.md.j2", results=[r], device={"gpu": "x", "sm_count": 3, "compute_capability": "9.0"},
                versions={"torch": "t", "triton": "t"}, rules={}, images={}, date="2026-11-29")
    assert "Counters (Nsight Compute" in md
    # the hostile name appears only inside a code span (HTML there is shown, not rendered)
    assert md.count("<b>") == 1 and "``<b>evil\\|kernel`</b>``" in md
    assert json.loads(json.dumps(r.to_dict(), default=str))["counters"]["summaries"]


def test_a_failing_target_becomes_a_note(tmp_path, monkeypatch):
    exe = _fake_ncu(tmp_path)
    monkeypatch.setenv("NCU", str(exe))
    res = C.collect(40, 24, 64, "fp16", [("no_such_schedule", None), ("torch.matmul", None)], tmp_path)
    assert [s["provider"] for s in res.summaries] == ["torch.matmul"]
    assert res.notes and res.notes[0].startswith("no_such_schedule: ")


def test_counters_needs_run():
    out = CliRunner().invoke(cli, ["diagnose", "--example", "--counters"])
    assert out.exit_code == 2 and "--run" in out.output


def test_parse_real_ncu_output_from_the_h200():
    """The raw page as ncu 2025.3.1 printed it on the H200 (2026-11-29) for one torch.matmul
    call on 1664x1408x8192 bf16: 288 numeric columns, units in the second row."""
    text = (DATA / "h200" / "ncu_raw_torch_matmul_1664x1408x8192.csv").read_text()
    ks = C.parse_raw_csv(text)
    assert len(ks) == 1 and ks[0]["kernel"].startswith("nvjet_sm90")
    assert ks[0]["grid"] == "(2, 66, 1)" and ks[0]["block"] == "(384, 1, 1)"
    m = ks[0]["metrics"]
    assert m["gpu__time_duration.sum"] == (54432.0, "ns")
    assert m["launch__grid_size"][0] == 132 and m["launch__waves_per_multiprocessor"][0] == 1.0
    s = C.summarize("torch.matmul", ks, compulsory_bytes=(1664 * 8192 + 8192 * 1408 + 1664 * 1408) * 2)
    assert s["tensor_pct"] == pytest.approx(92.63)  # wgmma counted on the hmma pipe by this ncu
    assert s["sm_busy_pct"] == pytest.approx(100 * 88439.53 / 92526.17)
    assert 0.9 < s["dram_x_compulsory"] < 1.0  # A and B read about once: the L2 did its job
    assert C.explain(s) == "tensor pipe busy"
