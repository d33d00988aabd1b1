"""Probe: why did split-K winners time ~2x slower in the bench's final re-timing than in its
search (H200, 2026-11-29)? Times one split-K config and torch.matmul on 16x4096x16384 bf16
several ways in one process and prints a table (run on the GPU machine from the repo root)."""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

import torch
import triton.testing

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advisor.codegen.kernel_lib import load  # noqa: E402

sk = load("split_k")
M, N, K = 16, 4096, 16384
cfg = sk.Config(16, 128, 128, 8, 4, 2, 16, "two_phase")
sets = [(torch.randn(M, K, device="cuda", dtype=torch.bfloat16), torch.randn(K, N, device="cuda", dtype=torch.bfloat16)) for _ in range(4)]
out = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)


def rot(fn):
    st = {"i": 0}

    def call():
        a, b = sets[st["i"] % len(sets)]
        st["i"] += 1
        fn(a, b)

    return call


def events(fn, n=200):
    for _ in range(10):
        fn()
    ts = []
    for _ in range(n):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)


def graph(fn, n=50):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(n):
            fn()
    g.replay()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    g.replay()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) * 1e3 / n


providers = {
    "split_k two_phase S16": lambda a, b: sk.matmul(a, b, cfg, out=out),
    "torch.matmul": lambda a, b: torch.matmul(a, b, out=out),
}
for name, f in providers.items():
    fn = rot(f)
    rows = [
        ("do_bench rep 50", triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3),
        ("do_bench rep 100", triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e3),
        ("do_bench rep 50 again", triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3),
        ("events, no flush", events(fn)),
        ("graph of 50, per call", graph(fn)),
    ]
    for how, us in rows:
        print(f"{name:>22} | {how:<22} | {us:8.1f} us")
