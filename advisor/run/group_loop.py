"""Close the loop for a loop of small GEMMs: one grouped launch against the loop itself.

    from advisor.run.group_loop import run_group_loop
    result = run_group_loop([(237, 432, 261), (263, 136, 417)], "bf16", budget_s=60)
    result.verdict, result.winner, result.variant_path

A launch_overhead finding on a run of small GEMM launches suggests the grouped schedule and
lists the distinct GEMM shapes the run launched. There is no single shape for
advisor.run.loop.run_shape_loop to time, so this times the group instead, in the crash-proof
child process of advisor.run.bench: a Python loop of `torch.matmul` over the shapes (what the
trace ran), that loop captured in a CUDA graph (the fix that needs no new kernel),
`torch._grouped_mm` where the group fits it (and zero-padded to fit), and our grouped
schedule's search space, every provider verified against a float64 reference before it is
timed. The grouped launch is recommended only when it beats the loop, its graph and
`torch._grouped_mm` by more than the noise margin; where the CUDA graph wins, the verdict
says to capture the loop instead. The padded `torch._grouped_mm` is timed on operands
padded once outside the call, so it is reported beside the verdict, not required to lose.
Without a GPU the variant is generated with the model's knobs and the report says how to run
it on one.

Times are eager (do_bench): launch cost is what these providers differ in, and a graph timer
would capture the loop into a graph itself (advisor.run.bench.grouped.grouped_timer).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import gpu as _gpu
from ..basics import GROUPED, NOISE_MARGIN
from .bench.tables import best_rows
from ..codegen.bundle import complexity
from ..codegen.generate import generate_grouped
from ..codegen.schedule_model import Device

LOOP, GRAPH = "torch.matmul", "cuda_graph"
PADDED = "torch._grouped_mm[padded]"
# what the grouped launch must beat; PADDED is timed on operands padded once, outside the
# timed call (advisor.run.bench.grouped), so it is a reference for callers whose operands can stay
# padded, not a like-for-like rival of a launch that takes the operands as they are
GROUP_BASELINES = (LOOP, GRAPH, "torch._grouped_mm")
GROUP_REFERENCES = (PADDED,)
# what each provider is, in words, for verdicts
_WHAT = {LOOP: "the torch.matmul loop", GRAPH: "the loop captured in a CUDA graph",
         "torch._grouped_mm": "torch._grouped_mm", "torch._grouped_mm[padded]": "torch._grouped_mm on zero-padded GEMMs",
         GROUPED: "our grouped launch"}


@dataclass
class GroupResult:
    """One group's measurements and verdict; the run report and run_report.json read it as
    they read advisor.run.loop.ShapeResult (`kind` tells them apart)."""

    sizes: list[tuple[int, int, int]]
    dtype: str
    finding: dict | None = None
    rows: list[dict] = field(default_factory=list)
    winner: dict | None = None
    baseline: dict | None = None
    recommended: bool = False
    verdict: str = ""
    variant_path: Path | None = None
    variant_knobs: dict | None = None
    ran_on_gpu: bool = False
    model: dict = field(default_factory=dict)  # no per-config model ranking for groups
    counters: dict | None = None
    kind: str = "grouped"
    strategies: list[str] = field(default_factory=lambda: [GROUPED])
    observed_ns: int | None = None  # the trace's run is not one call of the group: not compared

    @property
    def tag(self) -> str:
        """Six hex digits of the sizes: two loops of as many GEMMs get different files."""
        return hashlib.sha1(self.shapes_text.encode()).hexdigest()[:6]

    @property
    def shape(self) -> str:
        return f"{len(self.sizes)} GEMMs {self.tag}"

    @property
    def flops(self) -> float:
        return float(sum(2 * M * N * K for M, N, K in self.sizes))

    @property
    def shapes_text(self) -> str:
        return ",".join(f"{M}x{N}x{K}" for M, N, K in self.sizes)

    def table(self) -> list[dict]:
        """Each provider's best verified time (final re-timings first), then the failures;
        speedups against the loop and its CUDA graph."""
        best = best_rows(self.rows)
        out = []
        for p, r in best.items():
            lines, knobs = complexity(p)
            us = float(r["median_us"])
            out.append({"provider": p, "median_us": us, "tflops": self.flops / (us * 1e-6) / 1e12, "rel_err": r.get("rel_err"),
                        "status": "ok", "kernel_lines": lines, "knobs": knobs, "config": r.get("config", "")})
        # a provider that never ran (skipped: no CUDA graph on this device, torch._grouped_mm
        # not applicable) is listed with its reason, as is one that failed
        for p in dict.fromkeys(r["provider"] for r in self.rows):
            if p in best:
                continue
            r = next(x for x in self.rows if x["provider"] == p)
            why = r.get("error") or ""
            out.append({"provider": p, "median_us": None, "tflops": None, "rel_err": None,
                        "status": f"{r.get('status')}: {why}" if why else str(r.get("status")),
                        "kernel_lines": None, "knobs": None, "config": ""})
        loop = best.get(LOOP, {}).get("median_us")
        graph = best.get(GRAPH, {}).get("median_us")
        for row in out:
            t = row["median_us"]
            row["vs_loop"] = float(loop) / t if loop and t else None
            row["vs_graph"] = float(graph) / t if graph and t else None
            row["vs_observed"] = None
            row["vs_torch_matmul"] = row["vs_loop"]
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "shape": {"count": len(self.sizes), "sizes": [list(s) for s in self.sizes]},
            "dtype": self.dtype,
            "strategies": self.strategies,
            "finding": self.finding,
            "ran_on_gpu": self.ran_on_gpu,
            "table": [{k: v for k, v in r.items()} for r in self.table()],
            "winner": _clean(self.winner),
            "baseline": _clean(self.baseline),
            "recommended": self.recommended,
            "verdict": self.verdict,
            "variant": self.variant_path.name if self.variant_path else None,
            "variant_knobs": self.variant_knobs,
            "model": self.model,  # empty: no per-config model ranking for groups
            "counters": self.counters,
        }


def _clean(row: dict | None) -> dict | None:
    return None if row is None else {k: v for k, v in row.items() if not k.startswith("_")}


def decide_group(result: GroupResult) -> None:
    """Pick the fastest verified grouped config and say whether it beats every baseline."""
    table = {r["provider"]: r for r in result.table() if r["median_us"]}
    bases = {p: r for p, r in table.items() if p in GROUP_BASELINES}
    result.baseline = min(bases.values(), key=lambda r: r["median_us"]) if bases else None
    ours = table.get(GROUPED)
    if ours is None:
        ran = any(r.get("provider") == GROUPED for r in result.rows)
        result.verdict = ("the grouped launch did not pass its check: nothing to recommend" if ran else
                          "the grouped launch was not timed (no config ran within the budget): nothing to recommend")
        return
    result.winner = ours
    vs = [f"{r['median_us'] / ours['median_us']:.2f}x {_WHAT.get(p, p)}" for p, r in bases.items()]
    beat = bool(bases) and all(ours["median_us"] < (1 - NOISE_MARGIN) * r["median_us"] for r in bases.values())
    result.recommended = beat
    padded = table.get(PADDED)
    note = ""
    if padded and padded["median_us"] < (1 - NOISE_MARGIN) * ours["median_us"]:
        note = (f"; torch._grouped_mm on operands already padded to the group's largest K and N took "
                f"{padded['median_us']:.1f} us (the padding not timed): where the operands can stay padded, that "
                "call is faster still")
    if beat:
        result.verdict = (f"grouped wins: one launch of the {len(result.sizes)} GEMMs is {', '.join(vs)} "
                          f"(verified, rel. error {ours['rel_err']:.1e}){note}")
        return
    base = result.baseline
    if base is None:
        result.verdict = "no baseline ran to compare with: nothing to recommend"
        return
    if base["provider"] == GRAPH:
        advice = "capture the loop in a CUDA graph (torch.cuda.graphs), which needs no new kernel"
    elif base["provider"] == LOOP:
        advice = "keep the loop"
    else:
        advice = f"use {base['provider']}"
    result.verdict = (f"our grouped launch does not beat {_WHAT.get(base['provider'], base['provider'])} by more than "
                      f"{NOISE_MARGIN:.0%}: {advice} (grouped: {', '.join(vs)}){note}")


def run_group_loop(sizes: Sequence[tuple[int, int, int]], dtype: str, *, budget_s: float = 60.0,
                   finding: dict | None = None, out_dir: Path | None = None,
                   progress: Callable[[Any], None] | None = None, suite: str = "advisor",
                   sm_count: int | None = None) -> GroupResult:
    """Time and verify one grouped launch of `sizes` against the loop (GPU), or generate the
    model-chosen grouped variant (no GPU; for `sm_count` SMs when given). Writes the variant into `out_dir` when given (on a
    GPU, whenever the grouped launch passed its check, with the measured knobs)."""
    sizes = [tuple(int(x) for x in s) for s in sizes]
    res = GroupResult(sizes, dtype, finding=finding)
    stem = finding["symptom"] if finding else "grouped"
    name = f"variant_{stem}_{len(sizes)}_gemms_{res.tag}.py"
    if not _gpu.gpu_present():
        if out_dir is not None:
            path = out_dir / name
            device = Device(sm_count=sm_count) if sm_count else None
            v = generate_grouped(sizes, dtype=dtype, finding=finding, device=device, path=path)
            res.variant_path, res.variant_knobs = path, v.knobs
        res.verdict = ("not run: no CUDA GPU here; on one, run the generated file with --check --bench "
                       "(it times the loop, its CUDA graph and the grouped launch)")
        return res
    from .bench.isolate import run_group_isolated

    dev, tuned = _gpu.device_spec()
    workdir = (out_dir / f"work_grouped_{len(sizes)}_{res.tag}") if out_dir else None
    res.rows = run_group_isolated(sizes, dtype, budget_s, progress, suite=suite, label=res.shape, workdir=workdir)
    res.ran_on_gpu = True
    decide_group(res)
    if res.winner is not None and out_dir is not None:
        knobs = json.loads(res.winner["config"]) if res.winner.get("config") else {}
        chosen = {"how": "measured", "budget_s": budget_s, "median_us": round(res.winner["median_us"], 2),
                  "recommended": res.recommended, "verdict": res.verdict}
        path = out_dir / name
        v = generate_grouped(sizes, dtype=dtype, knobs=knobs, finding=finding, tuned_for=tuned, chosen_by=chosen,
                             device=dev, path=path)
        res.variant_path, res.variant_knobs = path, v.knobs
    return res
