"""Kernels replayed from CUDA (HIP) graphs, attributed to their graph launch.

A graph replays its kernels from one host call, so the gaps between them are not per-kernel
launch overhead, and "capture a CUDA graph" is advice they have already taken. Two kinds of
evidence, whichever the trace has:
- the launching call: CUPTI gives every kernel of a replay the correlation id of the
  `cudaGraphLaunch` (driver `cuGraphLaunch`, HIP `hipGraphLaunch`) that replayed it; nsys
  and Kineto both keep it, so a kernel whose correlation id is a graph launch call's on the
  same rank belongs to that replay;
- nsys `graphNodeId` (under `--cuda-graph-trace=node`), which marks a graph kernel even
  where the runtime calls were not traced.
`graph_launch_id` is the launch call's correlation id (NA where unknown, e.g. a graph kernel
known only by its node id); `is_graph_replayed` says whether a kernel came from any graph.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..model import Trace

GRAPH_LAUNCH = re.compile(r"^(?:cuda|cu|hip)GraphLaunch", re.I)


def attribute(trace: Trace) -> None:
    """Fill trace.kernels["graph_launch_id"] in place from the runtime calls."""
    k, rt = trace.kernels, trace.runtime
    if k.empty or rt.empty or k["correlation_id"].isna().all():
        return
    # matched once per distinct name (millions of launch calls, a few dozen names)
    codes, uniques = pd.factorize(rt["name"])
    launch = np.array([GRAPH_LAUNCH.search(str(u)) is not None for u in uniques] + [False], dtype=bool)
    calls = rt[launch[codes] & rt["correlation_id"].notna().to_numpy()]
    if calls.empty:
        return
    keys = pd.MultiIndex.from_arrays([calls["rank"].to_numpy(np.int64), calls["correlation_id"].to_numpy(np.int64)])
    kc = k["correlation_id"]
    mine = pd.MultiIndex.from_arrays([k["rank"].to_numpy(np.int64), kc.fillna(-1).to_numpy(np.int64)])
    hit = mine.isin(keys) & kc.notna().to_numpy()
    if hit.any():
        out = k["graph_launch_id"].copy()
        out[hit] = kc[hit]
        k["graph_launch_id"] = out


def is_graph_replayed(kernels: pd.DataFrame) -> pd.Series:
    """True for kernels launched from a CUDA graph (launch call or node id known)."""
    out = np.zeros(len(kernels), dtype=bool)
    for c in ("graph_launch_id", "graph_node_id"):  # column by column: kernels[cols] was a copy
        if c in kernels.columns:
            out |= kernels[c].notna().to_numpy()
    return pd.Series(out, index=kernels.index)
