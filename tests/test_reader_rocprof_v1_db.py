"""rocprof v1 `results.db` (SQLite, `KERN` table), checked against the database itself read
with the standard library's sqlite3; the grid conversion (work-items -> workgroups) is
recomputed here."""

from __future__ import annotations

import sqlite3

import pytest
from tracefiles import write_db

from advisor.errors import TraceError
from advisor.traces import detect, load_trace

NAME = "rocprof_v1_mi250x_stencils_results.db"


def raw_kern(path):
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute('SELECT KernelName, grd, wgr, BeginNs, EndNs, arch_vgpr, lds, "gpu-id" FROM KERN').fetchall()
    finally:
        conn.close()


def test_corpus_results_db_reads_like_results_csv(corpus):
    path = corpus / "rocprof" / NAME
    rows = raw_kern(path)
    assert detect(path) == "rocprof-v1-db"
    t = load_trace(path, sm_count=110)  # MI250X GCD: 110 CUs (the db names no GPU)
    k = t.kernels.sort_values("start_ns", kind="stable").reset_index(drop=True)
    rows = sorted(rows, key=lambda r: r[3])
    assert len(k) == len(rows) == 1023
    # names lose the CSV quotes the db stores them with (and the .kd suffix, as in the CSV)
    want = [r[0].strip('"').removesuffix(".kd") for r in rows]
    assert list(k["name"]) == want
    assert list(k["grid_x"]) == [-(-r[1] // r[2]) for r in rows]  # grd work-items / wgr
    assert list(k["block_x"]) == [r[2] for r in rows]
    assert list(k["start_ns"]) == [r[3] for r in rows] and list(k["dur_ns"]) == [r[4] - r[3] for r in rows]
    assert list(k["registers_per_thread"]) == [r[5] for r in rows]
    assert list(k["static_smem_bytes"]) == [r[6] for r in rows]
    z = k[k["name"] == "compute_fd_z_kernel"].iloc[0]
    assert (z["grid_blocks"], z["block_threads"]) == (134217728 // 512, 512)
    d = t.devices.iloc[0]
    assert (d["vendor"], int(d["device_id"]), int(d["sm_count"])) == ("amd", rows[0][7], 110)


def test_results_db_without_kern_columns_is_not_taken(tmp_path):
    path = write_db(tmp_path / "results.db", {"KERN": (["\"Index\" INTEGER", "Name TEXT"], [(0, "x")])})
    with pytest.raises(TraceError, match="unknown trace format"):
        detect(path)


def test_results_db_api_and_copies(tmp_path):
    kern = ["\"Index\" INTEGER", "KernelName TEXT", '"gpu-id" INTEGER', "grd INTEGER", "wgr INTEGER", "BeginNs INTEGER",
            "EndNs INTEGER"]
    api = ["\"Index\" INTEGER", "Name TEXT", "pid INTEGER", "tid INTEGER", "BeginNs INTEGER", "EndNs INTEGER", "args TEXT"]
    ops = ["\"Index\" INTEGER", "Name TEXT", '"dev-id" INTEGER', '"queue-id" INTEGER', "BeginNs INTEGER", "EndNs INTEGER"]
    path = write_db(tmp_path / "results.db", {
        "KERN": (kern, [(0, '"k(int*)"', 2, 4096, 256, 1000, 3000)]),
        "HIP": (api, [(0, "hipLaunchKernel", 7, 8, 900, 950, "")]),
        "OPS": (ops, [(0, "CopyHostToDevice", 2, 0, 100, 200), (1, "KernelExecution", 2, 0, 1000, 3000)]),
    })
    t = load_trace(path)
    assert list(t.kernels["name"]) == ["k(int*)"] and int(t.kernels["grid_x"].iloc[0]) == 16
    assert list(t.runtime["name"]) == ["hipLaunchKernel"] and int(t.runtime["thread_id"].iloc[0]) == 8
    assert list(t.memcpy["kind"]) == ["HtoD"]
