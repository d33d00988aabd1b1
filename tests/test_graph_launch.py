"""Kernels replayed from CUDA graphs are attributed to their graph launch (issue 36,
Readers) and never read as launch-bound (a graph is what that advice would be)."""

from __future__ import annotations

import dataclasses
import gzip
import json

import pytest
from conftest import DATA

from advisor.rules import Threshold, load_rules
from advisor.symptoms.context import Context
from advisor.symptoms.launch_overhead import find_runs
from advisor.traces import load_trace
from advisor.traces.graphs import is_graph_replayed

H200 = DATA / "h200"


def test_kineto_kernels_attributed_to_their_graph_launch():
    path = H200 / "graphs.kineto.json.gz"
    ev = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    launches = {e["args"]["correlation"] for e in ev if e.get("cat") == "cuda_runtime" and e["name"] == "cudaGraphLaunch"}
    want = sorted(e["args"]["correlation"] for e in ev if e.get("cat") == "kernel" and e["args"]["correlation"] in launches)
    assert len(launches) == 20 and len(want) == 60
    k = load_trace(path).kernels
    assert sorted(int(v) for v in k["graph_launch_id"].dropna()) == want
    assert int(k["graph_launch_id"].isna().sum()) == 1  # the one kernel launched eagerly


@pytest.mark.parametrize("name,replays", [("graphs_node.sqlite.gz", 60), ("graphs_graph.sqlite.gz", 20)])
def test_nsys_graph_kernels_attributed(name, replays):
    t = load_trace(H200 / name)
    k = t.kernels
    rt = t.runtime
    calls = set(rt.loc[rt["name"].str.startswith("cudaGraphLaunch", na=False), "correlation_id"].astype(int))
    got = k["graph_launch_id"].dropna().astype(int)
    assert len(got) == replays and set(got) == calls  # node mode: 3 kernels per replay; graph mode: 1 row


def permissive(rule):
    """The launch_overhead rule with every run threshold opened up, so any stream of kernels
    forms a run: only the graph attribution can keep these kernels out."""
    th = dict(rule.thresholds)
    for name, value in (("tiny_kernel_ns", 10**9), ("min_run_kernels", 2), ("max_gap_in_run_ns", 10**9)):
        th[name] = Threshold(value=value, why="test")
    return dataclasses.replace(rule, thresholds=th)


@pytest.mark.parametrize("name", ["graphs.kineto.json.gz", "graphs_node.sqlite.gz"])
def test_graph_replayed_kernels_never_form_launch_bound_runs(name):
    rule = permissive(load_rules()["launch_overhead"])
    t = load_trace(H200 / name)
    replayed = is_graph_replayed(t.kernels)
    assert int(replayed.sum()) == 60
    runs = find_runs(Context(t), rule)
    assert runs.empty or int(runs["kernels"].sum()) <= int((~replayed).sum())
    # control: the same kernels without their graph attribution do form a run
    t.kernels["graph_launch_id"] = t.kernels["graph_launch_id"].mask(replayed)
    t.kernels["graph_node_id"] = t.kernels["graph_node_id"].mask(replayed)
    assert int(find_runs(Context(t), rule)["kernels"].sum()) >= 60


def test_summary_counts_graph_replayed_launches():
    from advisor.report.summary import summarize

    rows = summarize(load_trace(H200 / "graphs_node.sqlite.gz"), top=50)["top_kernels"]
    assert sum(r["graph_replayed"] for r in rows) == 60
    assert sum(r["count"] - r["graph_replayed"] for r in rows) == 1
