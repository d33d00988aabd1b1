"""Close the loop: finding -> candidate configs -> run and verify on the GPU -> verdict ->
generated variant -> before/after report.

    from advisor.run.loop import run_shape_loop
    result = run_shape_loop(1664, 1408, 8192, "bf16", ["stream_k", "persistent"], budget_s=60)
    result.verdict, result.winner, result.variant_path

For each shape the analytical model (advisor.codegen.schedule_model) orders each strategy's
candidates; the bench runner (advisor.run.bench, in a crash-proof child process) times
`torch.matmul`, our data-parallel baseline and the candidates within the budget, verifying
every one before timing it. The winner is the fastest verified non-baseline provider; it is
recommended only when it beats every verified baseline and the kernel observed in the trace
by more than the noise margin. Without a GPU, the variant is generated with the model's
knobs and the report says exactly how to run it where there is one. A loop of small GEMMs
(a launch_overhead finding that lists its shapes) goes to advisor.run.group_loop instead: one
grouped launch of those shapes against the loop and its CUDA graph.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from . import gpu as _gpu
from ..basics import DTYPES, GEMM_STRATEGIES, NOISE_MARGIN, SPLIT_KV, parse_shape, torch_dtype
from .bench.tables import best_rows, final_failures  # noqa: F401  (re-exported: the loops' row picking)
from .result import RunResult, decide
from ..codegen.bundle import complexity
from ..errors import AdvisorError
from ..codegen.generate import finding_summary, generate
from ..rules import load_rules
from ..codegen.schedule_model import Device, rank


def strategies_for(rules=None) -> dict[str, list[str]]:
    """symptom -> the strategies --run times for its GEMM: each rule's `[run] candidates` from
    `rules` (a diagnosis's, e.g. a --rules copy), the bundled rule's where a rule has no [run]."""
    merged = {s: r.run_candidates for s, r in load_rules().items()}
    merged.update({s: r.run_candidates for s, r in (rules or {}).items() if r.run_candidates is not None})
    return {s: list(c) for s, c in merged.items() if c}


# Strategies whose remedy changes the program, not one kernel: --run lists them in `skipped`.
NOT_RUNNABLE = {
    "fusion": "fuse or regenerate the kernels with torch.compile (or batch them: torch._foreach_* ops) in the program",
    "segment_reduce": "sort the indices once and reduce by segments (torch.segment_reduce, torch.sparse.mm) in the program",
    "slice_not_index": "take a slice (x.narrow) where index_select picks one range of positions, in the program",
    "fused_scan": "run the recurrence a Python loop steps through as one scan kernel (the library's fused kernel, "
                  "or a parallel scan) in the program",
    "cuda_graph": "capture the loop in a CUDA graph (torch.cuda.graph, torch.compile(mode=\"reduce-overhead\")) in the program",
    "fused_attention": "call torch.nn.functional.scaled_dot_product_attention in the attention layer "
                       "(attn_implementation=\"sdpa\", nn.MultiheadAttention(need_weights=False))",
}
BASELINES = ("torch.matmul", "dp")
# The Gluon cluster GEMM (kernels/gluon_gemm.py) joins these strategies' runs where it can run.
CLUSTER_GEMM = "cluster_gemm"
CLUSTER_GEMM_JOINS = ("warp_specialization", "persistent", "stream_k")
CLUSTER_GEMM_DTYPES = ("bf16", "fp16")


@dataclass
class ShapeResult(RunResult):
    """One GEMM shape: our schedules against torch.matmul and our data-parallel baseline
    (`model`: the analytical model's ranking per strategy)."""

    M: int
    N: int
    K: int
    dtype: str
    strategies: list[str]
    schedule_note: str | None = None  # why cluster_gemm was left out, where it was prescribed
    kind: str = "gemm"  # advisor.run.group_loop.GroupResult: "grouped"

    @property
    def shape(self) -> str:
        return f"{self.M}x{self.N}x{self.K}"

    def table(self) -> list[dict]:
        """Before/after rows: observed kernel, baselines and each provider's best verified time."""
        flop = 2.0 * self.M * self.N * self.K
        out = []
        if self.observed_ns:
            us = self.observed_ns / 1e3
            out.append({"provider": "observed in trace", "median_us": us, "tflops": flop / (us * 1e-6) / 1e12,
                        "rel_err": None, "status": "ok", "kernel_lines": None, "knobs": None, "config": ""})
        best = best_rows(self.rows)
        failed = {r["provider"] for r in self.rows if r.get("status") != "ok"} - set(best)
        for p, r in best.items():
            lines, knobs = complexity(p)
            out.append({"provider": p, "median_us": float(r["median_us"]), "tflops": r.get("tflops"), "rel_err": r.get("rel_err"),
                        "status": "ok", "kernel_lines": lines, "knobs": knobs, "config": r.get("config", "")})
        for p in sorted(failed):
            why = next((r.get("error") or r.get("status") for r in self.rows if r["provider"] == p), "")
            out.append({"provider": p, "median_us": None, "tflops": None, "rel_err": None, "status": f"failed: {why}",
                        "kernel_lines": None, "knobs": None, "config": ""})
        ref = self.observed_ns / 1e3 if self.observed_ns else None
        cublas = best.get("torch.matmul", {}).get("median_us")
        for row in out:
            t = row["median_us"]
            row["vs_observed"] = ref / t if ref and t else None
            row["vs_torch_matmul"] = float(cublas) / t if cublas and t else None
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "shape": {"M": self.M, "N": self.N, "K": self.K},
            "dtype": self.dtype,
            "strategies": self.strategies,
            "finding": self.finding,
            "observed_ns": self.observed_ns,
            "ran_on_gpu": self.ran_on_gpu,
            **self.outcome(),
            "model": self.model,
            "counters": self.counters,
            "schedule_note": self.schedule_note,
        }

    def timed(self) -> dict[str, dict]:
        return {r["provider"]: r for r in self.table() if r["median_us"] and r["provider"] != "observed in trace"}

    def is_baseline(self, provider: str) -> bool:
        return provider in BASELINES

    def is_candidate(self, provider: str) -> bool:
        return provider not in BASELINES

    def nothing_to_recommend(self) -> str:
        return "no candidate passed its check: nothing to recommend"

    def verdict_text(self, win: dict, bases: dict[str, dict], timed: dict[str, dict]) -> str:
        vs = []
        if self.observed_ns:
            vs.append(f"{self.observed_ns / 1e3 / win['median_us']:.2f}x the observed kernel")
        if "torch.matmul" in timed:
            vs.append(f"{timed['torch.matmul']['median_us'] / win['median_us']:.2f}x torch.matmul")
        if "dp" in timed:
            vs.append(f"{timed['dp']['median_us'] / win['median_us']:.2f}x our data-parallel baseline")
        if self.recommended:
            return f"{win['provider']} wins: {', '.join(vs)} (verified, rel. error {win['rel_err']:.1e})"
        base = self.baseline
        observed_us = self.observed_ns / 1e3 if self.observed_ns else None
        if base and observed_us and base["median_us"] < (1 - NOISE_MARGIN) * observed_us:
            # A library (or our plain baseline) already beats the observed kernel: say so.
            return (f"no generated schedule beats {base['provider']} by more than {NOISE_MARGIN:.0%}; "
                    f"{base['provider']} is {observed_us / base['median_us']:.2f}x the observed kernel: use it "
                    f"(best candidate {win['provider']}: {', '.join(vs)})")
        best = base["provider"] if base else "the observed kernel"
        return (f"no variant beats {best} by more than {NOISE_MARGIN:.0%}: keep it "
                f"(best candidate {win['provider']}: {', '.join(vs)})")


def ordered_candidates(strategy: str, M: int, N: int, K: int, dtype: str, dev: Device) -> tuple[list, list[dict]]:
    """The schedule's candidates (default first, then its search space) in the model's order,
    plus the model's predictions for the report."""
    from .bench.runner import candidate_configs, model_order
    from ..codegen.kernel_lib import load

    mod = load(strategy)
    tdtype = torch_dtype(dtype)
    cfgs = candidate_configs(mod, M, N, K, tdtype, dev.sm_count)
    ordered = model_order(strategy, cfgs, M, N, K, tdtype, dev.sm_count)
    preds = rank(strategy, [asdict(c) for c in ordered], M, N, K, DTYPES[dtype], dev, prune_ratio=math.inf)
    return ordered, [p.row() for p in preds[:6]]


def cluster_gemm_gate(dtype: str, triton_version: tuple[int, int] | None, compute_capability: str | None) -> str | None:
    """None when the cluster GEMM can run here, else the one-line reason it is left out.
    Pure: the caller passes what it found (environment_for_cluster_gemm)."""
    if dtype not in CLUSTER_GEMM_DTYPES:
        return f"cluster_gemm not run: it takes bf16/fp16, this GEMM is {dtype}"
    if triton_version is None:
        return "cluster_gemm not run: Triton is not installed"
    if tuple(triton_version) < (3, 9):
        return (f"cluster_gemm not run: it needs Triton >= 3.9 (Gluon clusters, TMA multicast), "
                f"this is Triton {triton_version[0]}.{triton_version[1]}; today's schedules were used")
    if compute_capability is None:
        return "cluster_gemm not run: no CUDA GPU here"
    if compute_capability != "9.0":
        return f"cluster_gemm not run: it is written for sm_90 (Hopper wgmma), this GPU is sm_{compute_capability.replace('.', '')}"
    return None


def environment_for_cluster_gemm() -> tuple[tuple[int, int] | None, str | None]:
    """(Triton version, compute capability "9.0" or None without a CUDA GPU) of this process."""
    from ..codegen.kernel_lib import load

    try:
        version = load(CLUSTER_GEMM).triton_version()
    except Exception:  # noqa: BLE001  (an unloadable schedule is "no Triton" to the gate, never an error)
        version = None
    cc = None
    if _gpu.gpu_present():
        import torch

        try:
            major, minor = torch.cuda.get_device_capability()
            cc = f"{major}.{minor}"
        except (AssertionError, RuntimeError):  # no usable CUDA device after all: no cluster launch
            cc = None
    return version, cc


def with_cluster_gemm(strategies: Sequence[str], dtype: str, env: tuple | None = None) -> tuple[list[str], str | None]:
    """`strategies` plus cluster_gemm where the matrix prescribes WS, persistent or Stream-K and
    the environment allows it; else the same list and the reason (None when not prescribed)."""
    out = list(strategies)
    if CLUSTER_GEMM in out or not any(s in CLUSTER_GEMM_JOINS for s in out):
        return out, None
    why = cluster_gemm_gate(dtype, *(env or environment_for_cluster_gemm()))
    if why is None:
        out.append(CLUSTER_GEMM)
    return out, why


def run_shape_loop(
    M: int,
    N: int,
    K: int,
    dtype: str,
    strategies: Sequence[str],
    *,
    budget_s: float = 60.0,
    observed_ns: int | None = None,
    finding: dict | None = None,
    out_dir: Path | None = None,
    progress: Callable[[Any], None] | None = None,
    suite: str = "advisor",
    counters: bool = False,
    log: Callable[[str], None] | None = None,
    sm_count: int | None = None,
) -> ShapeResult:
    """Time and verify `strategies` on one shape (GPU), or generate model-chosen variants
    (no GPU; for `sm_count` SMs when given, e.g. the trace's GPU). Writes the winning variant
    into `out_dir` when it is recommended."""
    strategies = [s for s in strategies if s in GEMM_STRATEGIES and s != "dp"]
    if not strategies:
        raise AdvisorError("no GEMM strategy to run (choose from split_k, persistent, stream_k, warp_specialization)")
    strategies, note = with_cluster_gemm(strategies, dtype)
    res = ShapeResult(M, N, K, dtype, list(strategies), finding=finding, observed_ns=observed_ns, schedule_note=note)
    name = f"{finding['symptom']}_{M}x{N}x{K}" if finding else f"{strategies[0]}_{M}x{N}x{K}"
    if not _gpu.gpu_present():
        # Generate the files with the model's knobs; say how to run them where there is a GPU.
        first = strategies[0]
        if out_dir is not None:
            path = out_dir / f"variant_{name}.py"
            device = Device(sm_count=sm_count) if sm_count else None
            v = generate(first, M, N, K, dtype=dtype, finding=finding, device=device, path=path)
            res.variant_path, res.variant_knobs = path, v.knobs
            res.model[first] = v.model
        res.verdict = "not run: no CUDA GPU here; run the generated file with --check --bench on one, or `advisor bench` there"
        if note:
            res.verdict += f" ({note})"
        if counters:
            res.counters = {"summaries": [], "reports": [],
                            "notes": ["--counters: no CUDA GPU here, nothing to profile"]}
        return res
    from .bench.isolate import run_shape_isolated

    dev, tuned = _gpu.device_spec()
    plan = {}
    for s in strategies:
        cfgs, preds = ordered_candidates(s, M, N, K, dtype, dev)
        plan[s] = cfgs
        res.model[s] = preds
    # GPU time per call (CUDA-graph replays), the same quantity as the kernel durations in the
    # trace: eager timings of our launchers carried ~100 us of Python overhead on the H200.
    res.rows = run_shape_isolated(M, N, K, dtype, plan, budget_s, progress, suite=suite, timer="graph",
                                  workdir=(out_dir / f"work_{name}") if out_dir else None)
    res.ran_on_gpu = True
    decide(res)
    if note:
        res.verdict += f" ({note})"
    if res.winner is not None and out_dir is not None:
        knobs = json.loads(res.winner["config"]) if res.winner.get("config") else {}
        path = out_dir / f"variant_{name}.py"
        chosen = {"how": "measured", "budget_s": budget_s, "median_us": round(res.winner["median_us"], 2),
                  "recommended": res.recommended, "verdict": res.verdict}
        v = generate(res.winner["provider"], M, N, K, dtype=dtype, knobs=knobs, finding=finding, tuned_for=tuned,
                     chosen_by=chosen, path=path)
        res.variant_path, res.variant_knobs = path, v.knobs
    if counters:
        close = getattr(progress, "close", None)
        if close:  # the bar is done: the counters' progress lines follow it
            close()
        res.counters = collect_counters(res, out_dir, log=log)
    return res


def collect_counters(res: ShapeResult, out_dir: Path | None, *, log: Callable[[str], None] | None = None) -> dict:
    """Nsight Compute counters for every verified provider of a measured shape (baselines
    first); rows appended to out_dir/counters.csv, the .ncu-rep files kept beside it."""
    from . import counters as C

    where = out_dir if out_dir is not None else Path("advisor-run")
    got = C.collect(res.M, res.N, res.K, res.dtype, C.providers_for(res.table()), where / "ncu",
                    element_size=DTYPES[res.dtype], log=log)
    C.write_rows(where / "counters.csv", got.rows)
    return got.to_dict()


@dataclass
class SkippedFinding:
    """A finding with a GEMM shape and strategy that loop_findings did not run, and why."""

    symptom: str
    kernel: str
    shape: dict  # M, N, K, batch, dtype; a grouped suggestion: shapes (their count), dtype
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def loop_findings(diagnosis, *, budget_s: float, out_dir: Path | None, progress_for: Callable[[str], Callable] | None = None,
                  dtype_default: str = "bf16", counters: bool = False, log: Callable[[str], None] | None = None,
                  skipped: list[SkippedFinding] | None = None) -> list[ShapeResult]:
    """run_shape_loop for every finding with a GEMM shape and a GEMM strategy, once per shape
    (with the strategies of every finding on that shape), and advisor.run.group_loop.run_group_loop for every loop of small GEMMs whose shapes are known
    (a launch_overhead finding suggesting the grouped schedule), once per set of shapes.
    Findings it cannot run (batched GEMMs; a loop of one GEMM shape) are appended to
    `skipped`, once each, when given."""
    from .group_loop import run_group_loop

    # Without a GPU the variants are generated for the GPU the trace ran on, as the report's
    # "Next:" commands are.
    sm_count_of = getattr(diagnosis, "sm_count_of", lambda f: None)

    def shape_key(f) -> tuple:
        s = f.shape
        dtype = s.get("dtype") if s.get("dtype") in DTYPES else dtype_default
        return (s.get("batch") or 1, s["M"], s["N"], s["K"], dtype)

    # One run per shape, with the strategies of every finding on it (tail_wave and
    # hopper_no_ws often flag the same GEMM), the highest-ranked finding's first.
    candidates = strategies_for(getattr(diagnosis, "rules", None))
    strategies_of: dict[tuple, list[str]] = {}
    for f in diagnosis.findings:
        if f.shape is not None and f.symptom in candidates:
            chosen = strategies_of.setdefault(shape_key(f), [])
            chosen.extend(x for x in candidates[f.symptom] if x not in chosen)
    results, seen = [], set()
    for f in diagnosis.findings:
        grouped = (f.suggestion or {}).get("schedule") == "grouped" and (f.suggestion or {}).get("shapes")
        if grouped:
            shapes, dtype = list(f.suggestion["shapes"]), f.suggestion.get("dtype") or dtype_default
            dtype = dtype if dtype in DTYPES else dtype_default
            key = ("grouped", tuple(sorted(shapes)), dtype)  # the same GEMMs in another order: one group
            if key in seen:
                continue
            seen.add(key)
            if len(shapes) < 2:
                if skipped is not None:
                    skipped.append(SkippedFinding(
                        f.symptom, f.kernel, {"shapes": len(shapes), "dtype": dtype},
                        f"a loop of {f.launches} small kernels with one GEMM shape ({shapes[0]}): a grouped launch "
                        "of one GEMM gains nothing; batch the repeated calls (torch.bmm on stacked operands) or "
                        "capture the loop in a CUDA graph"))
                continue
            try:
                sizes = [parse_shape(t) for t in shapes]
                progress = progress_for(f"{len(sizes)} GEMMs") if progress_for else None
                res = run_group_loop(sizes, dtype, budget_s=budget_s, finding=finding_summary(f), out_dir=out_dir,
                                     progress=progress, sm_count=sm_count_of(f))
            except AdvisorError as exc:  # a shape no GEMM can have (0x24x32 in a damaged trace): say so, go on
                if skipped is not None:
                    skipped.append(SkippedFinding(f.symptom, f.kernel, {"shapes": len(shapes), "dtype": dtype},
                                                  f"its GEMM shapes cannot be run: {exc}"))
                continue
            if counters:
                res.counters = {"summaries": [], "reports": [],
                                "notes": ["--counters profiles single GEMM shapes; a grouped launch is not profiled"]}
            results.append(res)
            continue
        if f.strategy == SPLIT_KV:
            res = _split_kv_finding(f, seen, budget_s, out_dir, dtype_default, sm_count_of(f), skipped)
            if res is not None:
                results.append(res)
        if f.strategy in NOT_RUNNABLE:
            # the remedy is a change to the program (fuse, capture a graph), not a kernel to time
            key = ("not_runnable", f.symptom, f.strategy, f.kernel, f.rank, f.device_id)
            if key not in seen and skipped is not None:
                seen.add(key)
                skipped.append(SkippedFinding(f.symptom, f.kernel, dict(f.shape or {}),
                                              f"strategy {f.strategy}: {NOT_RUNNABLE[f.strategy]}; nothing to time"))
            continue
        if f.shape is None or f.symptom not in candidates:
            continue
        s = f.shape
        key = shape_key(f)
        batch, dtype = key[0], key[-1]
        if key in seen:
            continue
        seen.add(key)
        if s.get("dtype") and s["dtype"] not in DTYPES:
            # Timing bf16 candidates against the observed fp8 (or other) kernel would compare
            # different arithmetic: say so rather than run it.
            if skipped is not None:
                skipped.append(SkippedFinding(
                    f.symptom, f.kernel, {"M": s["M"], "N": s["N"], "K": s["K"], "batch": batch, "dtype": s["dtype"]},
                    f"{s['dtype']} GEMM ({s['M']}x{s['N']}x{s['K']}): advisor's schedules are "
                    f"{', '.join(DTYPES)}; not run"))
            continue
        if batch != 1:
            # Per-batch operands (torch.bmm) need a batched launcher; folding the batch into M
            # would time a different problem. Say so rather than drop the finding.
            if skipped is not None:
                skipped.append(SkippedFinding(
                    f.symptom, f.kernel, {"M": s["M"], "N": s["N"], "K": s["K"], "batch": batch, "dtype": dtype},
                    f"batched GEMM (batch={batch} of {s['M']}x{s['N']}x{s['K']} {dtype}): "
                    "advisor's schedules are 2-D GEMMs; not run"))
            continue
        observed = int(f.evidence.get("median_ns") or (f.total_ns / max(1, f.launches)))
        progress = progress_for(f"{s['M']}x{s['N']}x{s['K']}") if progress_for else None
        results.append(run_shape_loop(s["M"], s["N"], s["K"], dtype, strategies_of[key], budget_s=budget_s,
                                      observed_ns=observed, finding=finding_summary(f), out_dir=out_dir, progress=progress,
                                      counters=counters, log=log, sm_count=sm_count_of(f)))
    return results


def write_run_report(results: Sequence[ShapeResult], out_dir: Path, rules=None, skipped=()) -> str:
    """Write rows.csv/json (the measured rows), then the run report of `results` into
    `out_dir` (advisor.report.write.run_report: before_after.png, run_report.md/json) with
    the GPU they ran on; return the markdown."""
    from .bench import append_csv, write_json
    from ..report.write import run_report

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = [row for r in results for row in r.rows]
    device, versions = None, {}
    if _gpu.gpu_present() and any(r.ran_on_gpu for r in results):
        device = _gpu.device_spec()[1]
        first = next((row for row in rows), {})
        versions = {"torch": first.get("torch", "?"), "triton": first.get("triton", "?")}
    if rows:
        append_csv(out_dir / "rows.csv", rows)
        write_json(out_dir / "rows.json", rows)
    return run_report(results, out_dir, device=device, versions=versions, rules=rules, skipped=skipped)


def _split_kv_finding(f, seen: set, budget_s: float, out_dir: Path | None, dtype_default: str, sm_count: int | None,
                      skipped: list[SkippedFinding] | None):
    """advisor.run.attn_loop.run_split_kv_loop for a split_kv finding whose attention shape is known,
    once per shape; a finding without one (or of a dtype our kernel does not take) is skipped
    with the reason."""
    from .attn_loop import run_split_kv_loop

    s = f.shape
    if s is None:
        if skipped is not None:
            skipped.append(SkippedFinding(f.symptom, f.kernel, {}, "the attention shape is unknown (no aten attention "
                                          "operator with Input Dims or emit_nvtx sizes around the launch): profile with "
                                          "record_shapes=True, or run `advisor generate split_kv --attn B:HQ:HKV:D:S`"))
        return None
    attn = {k: s[k] for k in ("B", "Hq", "Hkv", "D", "S", "Lq")}
    if s.get("dtype") and s["dtype"] not in DTYPES:
        if skipped is not None:
            skipped.append(SkippedFinding(f.symptom, f.kernel, dict(attn, dtype=s["dtype"]),
                                          f"{s['dtype']} attention: the split-KV kernel takes {', '.join(DTYPES)}; not run"))
        return None
    dtype = s.get("dtype") or dtype_default
    key = (SPLIT_KV, tuple(attn.values()), dtype)
    if key in seen:
        return None
    seen.add(key)
    per_launch = f.total_ns / max(1, f.launches)
    try:
        return run_split_kv_loop(attn, dtype, budget_s=max(budget_s, 120.0), observed_ns=int(per_launch),
                                 finding=finding_summary(f), out_dir=out_dir, sm_count=sm_count)
    except AdvisorError as exc:  # a shape the kernel refuses (head_dim 512, Lq 64): say so, go on
        if skipped is not None:
            skipped.append(SkippedFinding(f.symptom, f.kernel, dict(attn, dtype=dtype), f"not run: {exc}"))
        return None
