"""The benchmark suites of issue 4 and their targets, as data.

bench_gemm.py runs them; make_tables.py and bench_gemm.py's summary judge the targets from
the rows. A target compares "ours" (the best of the suite's providers on each shape) with a
baseline provider by the geometric mean of the per-shape speedups, or, for the HBM floor,
by the geometric mean of time / floor.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from advisor.run.bench.tables import best_of, geomean, speedup_table  # noqa: E402

SUITES: dict[str, list[tuple[int, int, int]]] = {
    # 128x128 tiles on 132 SMs leave a partial last wave: 143 tiles (1.08 waves), 289
    # (2.19), 324 (2.45), 576 (4.36), 1089 (8.25).
    "tail": [(1664, 1408, 8192), (2176, 2176, 8192), (2304, 2304, 4096), (3072, 3072, 4096), (4224, 4224, 8192)],
    # few output tiles, long K: Split-K / Stream-K territory (decode-like and reduction-heavy)
    "skinny": [(16, 4096, 16384), (64, 4096, 14336), (256, 256, 131072), (512, 512, 65536),
               (128, 8192, 8192), (32, 32, 131072)],
    # full waves: controls where nothing should beat cuBLAS by much
    "balanced": [(8192, 8192, 8192), (4096, 4096, 8192)],
}

# The grouped suite: 64 GEMMs, each of M, N, K drawn from 128..512 (seeded).
GROUPED = {"count": 64, "lo": 128, "hi": 512, "seed": 0}

# Strategies timed per suite (besides the torch.matmul and dp baselines).
STRATEGIES: dict[str, list[str]] = {
    "tail": ["stream_k", "persistent", "warp_specialization"],
    "skinny": ["split_k", "stream_k"],
    "balanced": ["persistent", "warp_specialization"],
    "grouped": ["grouped"],
}

ALL_SUITES = ("tail", "skinny", "balanced", "grouped")


@dataclass(frozen=True)
class Target:
    suite: str
    ours: tuple[str, ...]  # "ours" = the fastest of these on each shape
    baseline: str  # a provider, or "hbm_floor"
    threshold: float
    text: str

    @property
    def lower_is_better(self) -> bool:
        return self.baseline == "hbm_floor"


TARGETS = [
    Target("tail", ("stream_k", "persistent", "warp_specialization"), "dp", 1.15,
           "best tail schedule >= 1.15x our data-parallel baseline (geomean)"),
    Target("tail", ("stream_k", "persistent", "warp_specialization"), "torch.matmul", 1.0,
           "best tail schedule >= 1.0x torch.matmul (geomean)"),
    Target("skinny", ("split_k", "stream_k"), "torch.matmul", 1.2,
           "split-K/Stream-K >= 1.2x torch.matmul (geomean)"),
    Target("skinny", ("split_k", "stream_k"), "hbm_floor", 1.3,
           "split-K/Stream-K within 1.3x of the HBM floor (geomean of time / floor)"),
    Target("balanced", ("persistent", "warp_specialization"), "torch.matmul", 0.95,
           "best of persistent/WS >= 0.95x torch.matmul (geomean)"),
    Target("grouped", ("grouped",), "torch.matmul", 10.0, "grouped >= 10x a Python loop of torch.matmul"),
    Target("grouped", ("grouped",), "cuda_graph", 4.0, "grouped >= 4x the loop captured in a CUDA graph"),
]


def evaluate_targets(rows: list[dict]) -> list[dict]:
    """One dict per (target, dtype) with the measured value, whether it is met, and by how
    much it is missed; shapes where ours or the baseline has no valid result are counted."""
    table = speedup_table(rows, baselines=("torch.matmul", "dp", "cuda_graph"))
    out = []
    for t in TARGETS:
        for dtype in sorted({e["dtype"] for e in table if e["suite"] == t.suite}):
            entries = [e for e in table if e["suite"] == t.suite and e["dtype"] == dtype]
            shapes = sorted({e["shape"] for e in entries})
            ours = {e["shape"]: e for e in best_of(entries, t.ours, label="ours")}
            if t.baseline == "hbm_floor":
                vals = [ours[s]["x_floor"] for s in shapes if s in ours and ours[s].get("x_floor")]
            else:
                vals = [ours[s][f"vs_{t.baseline}"] for s in shapes if s in ours and ours[s].get(f"vs_{t.baseline}")]
            value = geomean(vals)
            if value is None:
                met, note = None, "no valid measurement"
            elif t.lower_is_better:
                met = value <= t.threshold
                note = "met" if met else f"missed: {value:.2f}x the floor, {value / t.threshold - 1:.0%} over the bar"
            else:
                met = value >= t.threshold
                note = "met" if met else f"missed: {value:.2f}x, {1 - value / t.threshold:.0%} short of {t.threshold}x"
            out.append({"suite": t.suite, "dtype": dtype, "target": t.text, "threshold": t.threshold,
                        "value": value, "shapes": len(vals), "of": len(shapes), "met": met, "note": note,
                        "winners": ", ".join(sorted({ours[s]["winner"] for s in shapes if s in ours}))})
    return out
