"""bench/bench_comm_overlap.py without GPUs: argument parsing, the plan, the launch checks, the
rows/CSV/table logic, and the whole measure-verify-trace path on 2 CPU ranks (gloo,
`--device cpu`)."""

from __future__ import annotations

import csv
import gzip
import importlib.util
import json
import os
import socket
import time

import pytest
import torch
import torch.multiprocessing as mp

from conftest import REPO

spec = importlib.util.spec_from_file_location("bench_comm_overlap", REPO / "bench" / "bench_comm_overlap.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_help_explains_the_run(capsys):
    with pytest.raises(SystemExit) as exc:
        bench.parse_args(["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    for needle in ("torchrun --nproc-per-node N", "ag_gemm", "gemm_rs", "comm_fraction", "NCCL_NVLS_ENABLE=0",
                   "--trace", "advisor diagnose"):
        assert needle in text, needle


def test_parse_args_defaults_and_errors(monkeypatch, tmp_path):
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    a = bench.parse_args([])
    assert a.shapes == bench.DEFAULT_SHAPES and a.chunks == [2, 4, 8] and a.out == tmp_path
    assert a.suites == ["ag_gemm", "gemm_rs"] and a.dtype == "bf16" and a.symm_mem and a.world_size == 2
    assert all(4096 <= t <= 16384 and 4096 <= h <= 8192 for t, h, _ in a.shapes)
    q = bench.parse_args(["--quick", "--no-symm-mem", "--chunks", "8,2,2"])
    assert q.shapes == bench.QUICK_SHAPES and q.chunks == [4] and q.iters == 20 and not q.symm_mem
    assert bench.parse_args(["--shapes", "64x32x128", "--chunks", "8,2,2"]).chunks == [2, 8]
    for bad in (["--shapes", "64x32"], ["--suites", "all_reduce"], ["--chunks", "0"], ["--chunks", "a"], ["--iters", "0"]):
        with pytest.raises(SystemExit) as exc:
            bench.parse_args(bad)
        assert exc.value.code == 2, bad


def test_problem_shapes():
    p = bench.problem("ag_gemm", (16384, 8192, 8192), 4)
    assert p["inputs"] == {"x": (4096, 8192), "w": (8192, 2048)} and p["out"] == (16384, 2048)
    assert (p["M"], p["N"], p["K"], p["rows"]) == (16384, 2048, 8192, 4096)
    p = bench.problem("gemm_rs", (16384, 8192, 8192), 4)
    assert p["inputs"] == {"a": (16384, 2048), "w": (2048, 8192)} and p["out"] == (4096, 8192)
    assert (p["M"], p["N"], p["K"]) == (16384, 8192, 2048)
    with pytest.raises(ValueError, match="divisible by the world size 3"):
        bench.problem("ag_gemm", (4096, 4096, 4096), 3)


def test_providers_and_plan():
    names = [(p, c.chunks if c else None) for p, c in bench.providers("ag_gemm", 6, [2, 4, 8], symm_mem=True)]
    assert names == [("plain", None), ("comm_only", None), ("gemm_only", None), ("chunked_serial", 4),
                     ("overlap", 2), ("overlap", 4), ("overlap", 4), ("overlap", 4), ("symm_mem", 2)]
    cfgs = [c for p, c in bench.providers("ag_gemm", 6, [4], symm_mem=False) if p == "overlap"]
    assert [(c.local_first, c.gemm) for c in cfgs] == [(True, "bmm"), (False, "bmm"), (True, "mm")]
    rs = bench.providers("gemm_rs", 3, [2, 4], symm_mem=False)
    assert [p for p, _ in rs] == ["plain", "comm_only", "gemm_only", "chunked_serial", "overlap", "overlap"]
    assert rs[-1][1] == bench.co.Config(chunks=3, gemm="mm")
    args = bench.parse_args(["--quick", "--no-symm-mem"])
    jobs = bench.plan(args, 8)
    assert len(jobs) == 2 * (2 * 2 * 8 - 2)  # two timers; gemm_rs has no no-local-first row
    assert len(bench.plan(bench.parse_args(["--quick", "--no-symm-mem", "--no-p2p"]), 8)) == 2 * (2 * 2 * 7 - 2)
    p2p = [c for p, c in bench.providers("ag_gemm", 64, [2, 4], symm_mem=False, p2p=True) if p == "overlap"]
    assert [(c.chunks, c.transport) for c in p2p if c.transport == "p2p"] == [(2, "p2p"), (4, "p2p")]
    assert {j["timer"] for j in jobs} == {"eager", "graph"}
    # chunks x comm_ctas; symm_mem rows are eager only
    cfgs = [c for p, c in bench.providers("gemm_rs", 64, [2, 4], symm_mem=True, ctas=[0, 16]) if p == "overlap"]
    assert [(c.chunks, c.comm_ctas) for c in cfgs] == [(2, 0), (2, 16), (4, 0), (4, 16), (4, 0)]
    jobs = bench.plan(bench.parse_args(["--quick"]), 2)
    assert not [j for j in jobs if j["timer"] == "graph" and j["provider"] == "symm_mem"]
    assert [j for j in jobs if j["timer"] == "eager" and j["provider"] == "symm_mem"]
    assert {j["shape"] for j in jobs} == {"8192x4096x4096", "16384x8192x8192"}


def test_check_launch(monkeypatch):
    assert "needs 2 or more GPUs, this machine has 1" in bench.check_launch(1, 1)
    assert "torchrun" in bench.check_launch(None, 8)
    assert "WORLD_SIZE is 1" in bench.check_launch(1, 8)
    assert "one process per GPU" in bench.check_launch(4, 2)
    assert bench.check_launch(2, 2) is None
    env = dict(bench.co.NO_MULTICAST_ENV, NCCL_NVLS_ENABLE="1")
    msg = bench.check_launch(2, 2, environ=env)
    assert msg.startswith("refusing to run with NVLink multicast allowed") and "NCCL_NVLS_ENABLE='1'" in msg


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_main_fails_clearly_without_gpus(monkeypatch, capsys):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert bench.main(["--quick"]) == 2
    err = capsys.readouterr().err
    assert "bench_comm_overlap: needs 2 or more GPUs, this machine has 0" in err


def _row(suite, shape, provider, us, config="", status="ok", timer="eager"):
    return {"suite": suite, "shape": shape, "M": 1, "N": 1, "K": 1, "dtype": "bf16", "provider": provider,
            "config": config, "timer": timer, "status": status, "error": "" if status == "ok" else "boom", "median_us": us,
            "p20_us": us, "p80_us": us, "speedup": None, "comm_fraction": None, "rel_err": 0.0, "world_size": 2,
            "device": "test", "date": "2026-11-29T00:00:00Z", "torch": "x", "run_id": "r"}


def _rows():
    c4 = json.dumps({"chunks": 4, "comm_stream": True, "local_first": True, "use_symm_mem": False})
    c2 = json.dumps({"chunks": 2, "comm_stream": True, "local_first": True, "use_symm_mem": False})
    rows = [_row("ag_gemm", "A", "plain", 1000.0), _row("ag_gemm", "A", "comm_only", 300.0),
            _row("ag_gemm", "A", "gemm_only", 700.0), _row("ag_gemm", "A", "overlap", 800.0, c4),
            _row("ag_gemm", "A", "overlap", 900.0, c2), _row("ag_gemm", "A", "chunked_serial", 1100.0, c4),
            _row("gemm_rs", "B", "plain", 1000.0), _row("gemm_rs", "B", "comm_only", 100.0),
            _row("gemm_rs", "B", "gemm_only", 900.0), _row("gemm_rs", "B", "overlap", 990.0, c4),
            _row("gemm_rs", "B", "symm_mem", None, status="error")]
    return bench.derive(rows)


def test_derive_and_summary():
    rows = _rows()
    by = {(r["suite"], r["provider"], r["median_us"]): r for r in rows}
    # comm_fraction = 300 / (300 + 700); speedup = plain / this
    assert by[("ag_gemm", "overlap", 800.0)]["comm_fraction"] == pytest.approx(0.3)
    assert by[("ag_gemm", "overlap", 800.0)]["speedup"] == pytest.approx(1.25)
    assert by[("ag_gemm", "chunked_serial", 1100.0)]["speedup"] == pytest.approx(1000 / 1100)
    assert by[("ag_gemm", "comm_only", 300.0)]["speedup"] is None
    assert by[("gemm_rs", "symm_mem", None)]["speedup"] is None
    text = bench.summary(rows)
    lines = text.splitlines()
    ag = next(line for line in lines if line.startswith("ag_gemm"))
    assert "0.30" in ag and "1.25" in ag and "chunks=4" in ag and "800.0" in ag
    # only ag_gemm has comm_fraction >= 0.25, and it reaches 1.2x
    assert "[MET ] eager: overlap >= 1.2x over plain where comm_fraction >= 0.25: 1/1 shapes" in text
    assert lines[-1].startswith("failed: gemm_rs B symm_mem error")
    rows[3]["speedup"] = 1.1
    rows[4]["speedup"] = 1.05
    assert "[MISS]" in bench.summary(rows)


def test_write_csv(tmp_path):
    path = tmp_path / "r" / "comm_overlap.csv"
    rows = _rows()
    bench.write_csv(path, rows[:4])
    bench.write_csv(path, rows[4:])
    with path.open(newline="") as f:
        got = list(csv.DictReader(f))
    assert len(got) == len(rows) and list(got[0]) == bench.COLUMNS
    assert got[3]["provider"] == "overlap" and float(got[3]["speedup"]) == pytest.approx(1.25)
    assert got[-1]["median_us"] == "" and got[-1]["status"] == "error"
    other = tmp_path / "other.csv"
    other.write_text("a,b\n1,2\n")
    with pytest.raises(SystemExit):
        bench.write_csv(other, rows)


def test_trace_picks():
    shape, timer, picks = bench.trace_picks(_rows(), "ag_gemm")
    assert (shape, timer) == ("A", "eager") and picks == [("plain", None), ("overlap", bench.co.Config(chunks=4))]
    assert bench.trace_picks(_rows(), "nope") is None
    # gemm_rs: no shape reaches comm_fraction 0.25, so its most comm-heavy shape is traced
    assert bench.trace_picks(_rows(), "gemm_rs")[:2] == ("B", "eager")
    # the eligible shape and timer where overlap won most, not the most comm-heavy shape
    c2 = json.dumps({"chunks": 2, "comm_ctas": 16})
    rows = _rows() + [_row("ag_gemm", s, p, us, c2 if p == "overlap" else "", timer="graph")
                      for s, p, us in [("A", "plain", 1000.0), ("A", "comm_only", 250.0), ("A", "gemm_only", 750.0),
                                       ("A", "overlap", 700.0),
                                       ("C", "plain", 900.0), ("C", "comm_only", 500.0), ("C", "gemm_only", 500.0),
                                       ("C", "overlap", 1200.0)]]
    shape, timer, picks = bench.trace_picks(bench.derive(rows), "ag_gemm")
    assert (shape, timer) == ("A", "graph") and picks[1] == ("overlap", bench.co.Config(chunks=2, comm_ctas=16))


# ----------------------------------------------------------------------------- end to end, CPU


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _main_worker(rank, world, port, argv):
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    torch.set_num_threads(1)
    rc = bench.main(argv)
    if rc != 0:
        raise SystemExit(rc)


def test_end_to_end_on_two_cpu_ranks(tmp_path):
    argv = ["--device", "cpu", "--dtype", "fp32", "--shapes", "64x32x32,32x16x64", "--chunks", "2,3", "--comm-ctas", "0,16", "--sm-carveout", "0",
            "--warmup", "1", "--iters", "3", "--trace", "--trace-iters", "2", "--out", str(tmp_path)]
    ctx = mp.start_processes(_main_worker, args=(2, _free_port(), argv), nprocs=2, start_method="fork", join=False)
    deadline = time.monotonic() + 60
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail("the CPU benchmark did not finish in 60 s")
    with (tmp_path / "comm_overlap.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert {r["status"] for r in rows} == {"ok"}, [(r["provider"], r["error"]) for r in rows if r["status"] != "ok"]
    for suite in ("ag_gemm", "gemm_rs"):
        for shape in ("64x32x32", "32x16x64"):
            grp = [r for r in rows if r["suite"] == suite and r["shape"] == shape]
            provs = sorted(r["provider"] for r in grp)
            # chunks 2,3 x comm_ctas 0,16 (gloo ignores the cap) + gemm=mm (+ no-local-first)
            want = ["chunked_serial", "comm_only", "gemm_only"] + ["overlap"] * 5 + ["plain"]
            want += ["overlap"] if suite == "ag_gemm" else []
            assert provs == sorted(want), (suite, shape, provs)
            frac = {float(r["comm_fraction"]) for r in grp}
            assert len(frac) == 1 and 0 < frac.pop() < 1
            for r in grp:
                assert r["world_size"] == "2" and r["device"] == "cpu" and float(r["median_us"]) > 0
                if r["provider"] not in ("comm_only", "gemm_only"):
                    assert float(r["rel_err"]) <= bench.TOLERANCE["fp32"] and float(r["speedup"]) > 0
    # traces: plain and the fastest overlap config of each suite's most comm-heavy shape
    dirs = sorted(p.name for p in (tmp_path / "traces").iterdir() if p.is_dir())
    assert len(dirs) == 4 and {d.rsplit("_", 1)[1] for d in dirs} == {"plain", "overlap"}
    for d in dirs:
        for r in (0, 1):
            with gzip.open(tmp_path / "traces" / d / f"rank{r}.json.gz", "rt") as fh:
                doc = json.load(fh)
            assert any(e.get("name", "").startswith(("ag_gemm:", "gemm_rs:")) for e in doc["traceEvents"])
    # a CPU trace has no GPU kernels: the diagnosis says so instead of crashing the run
    reports = json.loads((tmp_path / "traces" / "diagnosis.json").read_text())
    assert len(reports) == 4 and all(r["flagged"] is None and "no GPU kernel activity" in r["error"] for r in reports)
