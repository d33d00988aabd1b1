"""Exposed communication names its collective and gets the remedy that fits it (issue 32,
class 8): the chunked collective + GEMM schedule (`comm_overlap`) only where the collective
feeds or follows a GEMM; an MoE all-to-all, pipeline send/recv and a collective next to no
GEMM get their own strategy ids (rules/exposed_comm.toml [strategies]); time spent waiting
for peers is not counted as recoverable."""

from __future__ import annotations

import re

import pytest
from conftest import DATA

from advisor.diagnose.diagnosis import diagnose
from advisor.rules import load_rules
from advisor.symptoms import ranks as rk
from advisor.symptoms.context import Context
from advisor.symptoms.exposed_comm import choose_strategy, evidence, with_range_collectives
from advisor.traces import load_trace

RULE = load_rules()["exposed_comm"]
WINDOW = RULE["gemm_adjacent_ns"]


def comm_findings(trace):
    return [f for f in diagnose(trace).findings if f.symptom == "exposed_comm"]


def adjacent_share_by_hand(k, comm_pat, gemm_pat):
    """Share of the matching collectives' time with a GEMM-named kernel starting within the
    window after their end or ending within it before their start (same device)."""
    comm = k[k["name"].str.contains(comm_pat)]
    gemm = k[k["name"].str.contains(gemm_pat, flags=re.I) & ~k["name"].str.contains(comm_pat)]
    near = 0
    for c in comm.itertuples():
        g = gemm[gemm["device_id"] == c.device_id]
        after = ((g["start_ns"] >= c.end_ns) & (g["start_ns"] - c.end_ns <= WINDOW)).any()
        before = ((g["end_ns"] <= c.start_ns) & (c.start_ns - g["end_ns"] <= WINDOW)).any()
        near += c.dur_ns if (after or before) else 0
    return near / comm["dur_ns"].sum()


def test_all_reduce_next_to_no_gemm_is_not_told_to_chunk_a_gemm(corpus):
    # A100 trace: 15 all-reduces, most of their time not next to any GEMM (gradient
    # reductions). Before: comm_overlap with schedule matmul_reduce_scatter.
    t = load_trace(corpus / "kineto" / "hta_a100_nccl.json.gz")
    share = adjacent_share_by_hand(t.kernels, "ncclKernel_AllReduce", r"gemm|cutlass")
    assert share < RULE["min_gemm_adjacent_fraction"]
    (f,) = comm_findings(t)
    assert f.strategy == "async_collective" and "schedule" not in f.suggestion
    assert f.title.startswith("All-reduce") and f.suggestion["collective"] == "all_reduce"
    assert f.evidence["collectives"]["all_reduce"]["gemm_adjacent_fraction"] == pytest.approx(share, abs=0.1)
    assert f.savings_unit == "wall"
    assert f.evidence["bound_ns"] == f.est_savings_ns and f.evidence["basis"]


@pytest.mark.parametrize("stem,kind,schedule", [
    ("ag_gemm_4096x4096x4096_plain", "all_gather", "all_gather_matmul"),
    ("gemm_rs_16384x4096x4096_plain", "reduce_scatter", "matmul_reduce_scatter"),
])
def test_collective_feeding_a_gemm_keeps_the_chunked_schedule(stem, kind, schedule):
    d = DATA / "h200x2"
    t = load_trace([d / f"{stem}_rank0.kineto.json.gz", d / f"{stem}_rank1.kineto.json.gz"])
    share = adjacent_share_by_hand(t.kernels, "ncclDevKernel", r"gemm|nvjet|matmul")
    assert share > 0.9
    fs = comm_findings(t)
    assert fs
    for f in fs:
        assert f.strategy == "comm_overlap" and f.suggestion["schedule"] == schedule
        assert f.evidence["collectives"][kind]["gemm_adjacent_fraction"] >= 0.9
        assert f.title.startswith({"all_gather": "All-gather", "reduce_scatter": "Reduce-scatter"}[kind])


def test_dlrm_send_recv_is_its_all_to_all_and_mostly_waiting(corpus):
    # DLRM on 8 V100s: NCCL runs the embedding all-to-all as ncclKernel_SendRecv inside
    # nccl:all_to_all ranges. Before: read as send/recv (not aligned on, waits unknown) and 8
    # comm_overlap findings of ~1 ms each. Now: all-to-all, aligned on, and what is exposed
    # is mostly ranks waiting for their peers (imbalance), which overlap does not recover.
    paths = sorted((corpus / "kineto" / "param_dlrm_v100_8rank").glob("worker*.json.gz"))
    t = load_trace(paths)
    ctx = Context(t)
    k = with_range_collectives(ctx.kernels, t)
    sr = k[k["name"].str.startswith("ncclKernel_SendRecv")]
    assert len(sr) == 40 and set(rk.collective_kinds(sr)) == {"all_to_all"}
    ev = evidence(ctx, RULE)
    assert ev.attrs["alignment"]["status"] == "aligned"
    r1 = ev.set_index("rank").loc[1]
    assert r1["exposed_wait_ns"] > 0.9 * r1["exposed_ns"]
    assert not [f for f in diagnose(t).findings if f.symptom == "exposed_comm" and f.strategy == "comm_overlap"]


@pytest.mark.parametrize("kind,adjacent,situation,strategy", [
    ("all_to_all", 1.0, "all_to_all", "expert_overlap"),
    ("send_recv", 0.0, "send_recv", "pipeline_schedule"),
    ("all_gather", 0.8, "gemm_adjacent", "comm_overlap"),
    ("all_gather", 0.1, "no_gemm", "async_collective"),
    ("broadcast", 1.0, "no_gemm", "async_collective"),
])
def test_strategy_ids_come_from_the_rule(kind, adjacent, situation, strategy):
    assert choose_strategy(kind, {"gemm_adjacent_fraction": adjacent}, RULE) == (situation, strategy)
    assert RULE.strategies[situation] == strategy
