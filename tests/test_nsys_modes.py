"""nsys recording modes captured on the H200 by workloads/capture_nsys_modes.sh: CUDA graph
replays in the default `--cuda-graph-trace=graph` mode (one row per replay, no kernels) and
in node mode, and two processes in one capture, whose correlation and stream ids overlap."""

from __future__ import annotations

import gzip
import shutil
import sqlite3

import pytest
from conftest import DATA

from advisor.diagnose.diagnosis import diagnose
from advisor.traces import load_trace, merge

H200 = DATA / "h200"
REPLAYS = 20  # graphs scenario: 20 replays of gelu(x @ w1) @ w2, then one eager kernel


def _load(name, tmp_path):
    return load_trace(H200 / name, cache_dir=tmp_path)


def test_graph_mode_replays_count_as_gpu_work(tmp_path):
    graph, node = _load("graphs_graph.sqlite.gz", tmp_path), _load("graphs_node.sqlite.gz", tmp_path)
    k = graph.kernels
    replays = k[k["name"].str.startswith("CUDA graph ")]
    assert len(replays) == REPLAYS and len(k) == REPLAYS + 1
    assert set(replays["name"]) == {"CUDA graph 1 (whole replay)"}
    assert replays["grid_x"].isna().all() and replays["block_x"].isna().all()
    assert replays["correlation_id"].notna().all() and (replays["stream_id"] == 7).all()
    # the same workload under node mode lists every kernel: 3 a replay (two GEMMs, a GELU)
    nk = node.kernels
    assert len(nk) == 3 * REPLAYS + 1 and nk["graph_node_id"].notna().sum() == 3 * REPLAYS
    # busy time agrees between the modes (each replay spans its kernels plus their gaps)
    assert replays["dur_ns"].sum() == pytest.approx(nk.loc[nk["graph_node_id"].notna(), "dur_ns"].sum(), rel=0.02)
    notes = " ".join(graph.meta["notes"])
    assert f"{REPLAYS} CUDA graph replays were recorded whole" in notes and "--cuda-graph-trace=node" in notes
    assert "CUDA graph" not in " ".join(node.meta["notes"])


def test_graph_mode_shows_the_gpu_busy_through_the_replays(tmp_path):
    # before replays were read the trace held one 8 us kernel: no sign of the 14 ms of work
    t = _load("graphs_graph.sqlite.gz", tmp_path)
    k = t.kernels.sort_values("start_ns")
    span = int(k["end_ns"].max() - k["start_ns"].min())
    busy = int(k["dur_ns"].sum())  # the replays run back to back on one stream, no overlap
    assert span > 14_000_000 and busy / span > 0.9
    assert not [g for g in diagnose(t).gates if g.symptom == "gpu_idle"]


def test_graph_kernels_in_kineto(tmp_path):
    k = _load("graphs.kineto.json.gz", tmp_path).kernels
    assert len(k) == 3 * REPLAYS + 1


def test_two_processes_on_one_gpu_keep_their_ids_apart(tmp_path):
    t = _load("two_procs.sqlite.gz", tmp_path)
    assert t.ranks == [0]
    k = t.kernels
    gemms = k[k["name"].str.contains("dp_gemm")]
    # process 0 ran the tail GEMM (143 tiles), process 1 the skinny one (4 tiles), on
    # streams that were both stream 7 in their own process
    streams = gemms.groupby("grid_x")["stream_id"].unique()
    assert sorted(streams.index) == [4, 143]
    assert {int(s) for s in streams[143]} | {int(s) for s in streams[4]} == {7, 1_000_007}
    assert k["correlation_id"].is_unique
    assert any("2 processes ran GPU work on the same GPU" in n for n in t.meta["notes"])
    # the GEMM shapes (NVTX ranges of each process's launches) land on their own kernels:
    # with the ids mixed up the 4-tile kernels were labelled 1664x1408x8192
    d = diagnose(t)
    shapes = {(f.symptom, f.grid[0], f.shape["M"], f.shape["K"]) for f in d.findings if f.shape}
    assert ("small_grid_long_k", 4, 256, 131072) in shapes and ("tail_wave", 143, 1664, 8192) in shapes
    assert all(m != 1664 for s, g, m, _ in shapes if g == 4), shapes


def _on_two_gpus(tmp_path):
    """two_procs.sqlite with process 1's GPU work moved to a second H200 (device 1), as
    torchrun under one nsys would record it."""
    path = tmp_path / "two_gpus.sqlite"
    with gzip.open(H200 / "two_procs.sqlite.gz", "rb") as src, open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    con = sqlite3.connect(path)
    pids = [p for (p,) in con.execute("SELECT DISTINCT globalPid FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY globalPid")]
    assert len(pids) == 2
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
            con.execute(f"UPDATE {table} SET deviceId = 1 WHERE globalPid = ?", (pids[1],))
    cols = [r[1] for r in con.execute("PRAGMA table_info(TARGET_INFO_GPU)")]
    row = list(con.execute("SELECT * FROM TARGET_INFO_GPU WHERE id = 0").fetchone())
    row[cols.index("id")], row[cols.index("cuDevice")] = 1, 1
    con.execute(f"INSERT INTO TARGET_INFO_GPU VALUES ({', '.join('?' * len(row))})", row)
    con.commit()
    con.close()
    return path


def test_two_processes_on_their_own_gpus_are_two_ranks(tmp_path):
    t = load_trace(_on_two_gpus(tmp_path), cache_dir=tmp_path)
    assert t.ranks == [0, 1]
    k = t.kernels
    gemms = k[k["name"].str.contains("dp_gemm")]
    assert set(gemms.loc[gemms["rank"] == 0, "grid_x"]) == {143} and set(gemms.loc[gemms["rank"] == 1, "grid_x"]) == {4}
    assert set(k.loc[k["rank"] == 1, "device_id"]) == {1} and set(k.loc[k["rank"] == 0, "device_id"]) == {0}
    assert sorted(map(tuple, t.devices[["rank", "device_id"]].to_numpy().tolist())) == [(0, 0), (1, 1)]
    # ids stay as recorded; each rank's launches are its own process's
    assert set(k["stream_id"]) == {7}
    for rank in (0, 1):
        launches = set(t.runtime.loc[t.runtime["rank"] == rank, "correlation_id"].dropna())
        assert set(k.loc[k["rank"] == rank, "correlation_id"]) <= launches
    assert any("read as ranks 0-1" in n for n in t.meta["notes"])
    d = diagnose(t)
    by_rank = {(f.rank, f.symptom) for f in d.findings}
    assert {(0, "tail_wave"), (1, "small_grid_long_k")} <= by_rank


def test_merge_keeps_every_rank_of_a_multi_process_file(tmp_path):
    two = load_trace(_on_two_gpus(tmp_path), cache_dir=tmp_path)
    one = _load("tail.sqlite.gz", tmp_path)
    merged = merge([one, two])
    assert merged.ranks == [0, 1, 2]
    k = merged.kernels
    assert set(k.loc[k["rank"] == 2, "grid_x"].dropna()) >= {4} and 4 not in set(k.loc[k["rank"] == 1, "grid_x"])
