"""Per-rank traces captured on 2 H200s (tests/data/h200x2, made by workloads/capture_comm.sh and
bench/bench_comm_overlap.py --trace, 2026-11-29): advisor flags the unoverlapped
tensor-parallel step and does not flag the overlapped one, from nsys exports and Kineto
traces alike; a copy-engine transport's peer copies and barrier kernels count as
communication, so "not flagged" means hidden, not unseen."""

from __future__ import annotations

import pytest
from conftest import DATA

from advisor.diagnose.diagnosis import diagnose, evidence_frames
from advisor.traces import load_trace

X2 = DATA / "h200x2"


def _load(stem, fmt, tmp_path):
    return load_trace([X2 / f"{stem}_rank{r}.{fmt}" for r in (0, 1)], cache_dir=tmp_path)


def _exposed(trace):
    return [f for f in diagnose(trace).findings if f.symptom == "exposed_comm"]


@pytest.mark.parametrize("fmt", ["sqlite.gz", "kineto.json.gz"])
def test_mlp_block_plain_is_flagged(fmt, tmp_path):
    # all-gather -> GEMM -> GELU -> GEMM -> reduce-scatter, 8192x4096x4096 on 2 ranks, CUDA graph
    t = _load("mlp_plain", fmt, tmp_path)
    assert t.ranks == [0, 1] and len(t.devices) == 2
    fs = _exposed(t)
    assert fs, "the unoverlapped step must be flagged"
    for f in fs:
        ev = f.evidence
        assert set(ev["collectives"]) == {"all_gather", "reduce_scatter"}
        assert ev["hidden_fraction"] == 0 and ev["exposed_fraction"] >= 0.4
        assert ev["alignment"]["status"] == "aligned" and f.confidence == "medium"
        assert f.suggestion["schedule"] in ("all_gather_matmul", "matmul_reduce_scatter")


@pytest.mark.parametrize("fmt", ["sqlite.gz", "kineto.json.gz"])
def test_mlp_block_overlapped_by_copy_engine_is_hidden(fmt, tmp_path):
    # kernels/comm_overlap.py transport="p2p", 2 chunks: no NCCL kernels at all; the bytes
    # move as memcpy PtoP beside the GEMMs, ordered by symmetric-memory barrier kernels.
    t = _load("mlp_overlap", fmt, tmp_path)
    ev = evidence_frames(t)["exposed_comm"]
    assert len(ev) == 2
    for row in ev.to_dict("records"):
        assert {"peer_copy", "barrier"} <= set(row["kinds"])
        assert row["hidden_fraction"] >= 0.75  # of the transfer (not waiting for the peer)
        assert row["recoverable_fraction"] <= 0.11  # plain: 0.45-0.47
    # At most a low-confidence note that the schedule is already overlapped (the nsys export
    # of rank 0 sits at 10.0% recoverable, the threshold); never "add overlap".
    for f in _exposed(t):
        assert f.confidence == "low" and f.suggestion["pattern"].startswith("already overlapped")
    if fmt == "kineto.json.gz":
        assert _exposed(t) == []


def test_mlp_block_overlapped_by_nccl_chunks_is_told_to_trim(tmp_path):
    # The NCCL transport (4 chunks) hides 62% of its communication but its kernels slow the
    # GEMMs: 27% of the step stays exposed. Flagged, as already overlapped.
    fs = _exposed(_load("mlp_overlap_nccl", "kineto.json.gz", tmp_path))
    assert fs
    for f in fs:
        assert f.evidence["hidden_fraction"] >= 0.5 and f.confidence == "low"
        assert f.suggestion["pattern"].startswith("already overlapped")


@pytest.mark.parametrize("suite", ["ag_gemm_4096x4096x4096", "gemm_rs_16384x4096x4096"])
def test_bench_traces_plain_flagged_overlap_not(suite, tmp_path):
    # bench_comm_overlap.py --trace: 5 graph replays of the plain sequence and of the fastest
    # overlap config (p2p, 2 chunks) of the suite's shape where overlap won most.
    plain = _exposed(_load(f"{suite}_plain", "kineto.json.gz", tmp_path / "p"))
    assert plain and all(f.evidence["exposed_fraction"] >= 0.4 for f in plain)
    over = _load(f"{suite}_overlap", "kineto.json.gz", tmp_path / "o")
    assert _exposed(over) == []
    ev = evidence_frames(over)["exposed_comm"]
    assert (ev["hidden_fraction"] >= 0.7).all() and (ev["recoverable_fraction"] < 0.1).all()
    assert all("peer_copy" in k for k in ev["kinds"])


def test_one_rank_of_a_two_rank_run_says_the_other_is_missing(tmp_path):
    # rank 0 alone: its 550 ms all-gather is mostly waiting for rank 1, which one trace
    # cannot show (wait_ns is 0), so the finding drops to low confidence and a note asks
    # for the other rank's trace; with both traces the note goes away
    alone = load_trace(X2 / "mlp_plain_rank0.kineto.json.gz", cache_dir=tmp_path)
    assert alone.meta["world_size"] == 2 and alone.ranks == [0]
    assert any("part of a 2-rank run but holds 1 rank" in n for n in alone.meta["notes"])
    (f,) = _exposed(alone)
    assert f.confidence == "low" and f.evidence["world_size"] == 2
    both = _load("mlp_plain", "kineto.json.gz", tmp_path)
    assert not any("-rank run but holds" in n for n in both.meta["notes"])
    assert all("world_size" not in f.evidence for f in _exposed(both))
