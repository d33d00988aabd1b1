"""CUDA-graph timing shared by the benches that time one call on each of several input sets
(bench_split_kv.py, bench_attention_bias.py): per-call microseconds and their quantiles."""

from __future__ import annotations

import torch

REPLAYS = 30


def time_graph(fn, sets):
    """Per-call microseconds over REPLAYS replays of a graph holding fn(i) for each of the `sets`
    input sets (captured after one warm-up pass on a side stream), sorted."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(sets):
            fn(i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(sets):
            fn(i)
    graph.replay()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPLAYS)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    times = sorted(s.elapsed_time(e) * 1e3 / sets for s, e in events)
    del graph
    return times


def quantiles(times):
    """(p50, p20, p80) of sorted times."""
    def q(p):
        return times[min(len(times) - 1, int(p * len(times)))]

    return q(0.5), q(0.2), q(0.8)
