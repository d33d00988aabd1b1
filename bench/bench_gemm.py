"""Benchmark every GEMM schedule on the suites of issue 4, in one call on the GPU machine.

    python3 bench/bench_gemm.py [--suites tail,skinny,balanced,grouped] [--dtypes bf16]
                                [--time-limit-s 420] [--budget-s 40] [--quick] [--out DIR]

What it does, in order, within --time-limit-s (compile time included):

1. compile pass: N child processes (--compile-procs) run every candidate once on its real
   shape to fill Triton's on-disk cache in parallel (at most --compile-share of the time);
   failures there (compile errors, refused configs, faulting or hanging kernels) are kept
   and not run again;
2. timed pass, in one child process restarted past crashes and hangs: the ceilings first
   (device-to-device copy bandwidth, a large cuBLAS GEMM), then per shape torch.matmul, our
   data-parallel `dp` (short search) and each strategy's candidates (default config first,
   then its search space) until the shape's budget is spent; each variant is verified
   (fresh random inputs, NaN-poisoned output, float64 reference, per-dtype tolerance)
   before it is timed, and each provider's three fastest configs are re-checked and re-timed at the end in
   interleaved rounds;
3. rows are appended to <out>/h200.csv as they arrive (long format, one header), the
   tables of make_tables.py go to <out>/h200_summary.md, child output to <out>/bench.log,
   and a short summary table is printed last.

--out defaults to $OUT when set (the device tool returns that folder), else bench/results.
The skinny suite also times torch.matmul with the rotation-only event timer (suite
"timer_check") to show what do_bench's L2 flush costs a short memory-bound kernel.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from advisor.run.bench import isolate  # noqa: E402
from advisor.run.bench.rows import append_csv, new_run_id, now_iso, parse_shape, shape_text, write_json  # noqa: E402
from advisor.run.bench.tables import best_of, speedup_table, text_table  # noqa: E402
from suites import ALL_SUITES, GROUPED, STRATEGIES, SUITES, evaluate_targets  # noqa: E402

# Defaults sized for ~8 minutes of device time in one call (see --help for each).
DEFAULT_TIME_LIMIT_S = 420
DEFAULT_BUDGET_S = 40.0
DEFAULT_MAX_CONFIGS = 12  # every schedule's search space has at most 12
DEFAULT_COMPILE_SHARE = 0.4
# Providers that are baselines, not schedules of ours (the summary's "best of ours" leaves them out).
BASELINES = {"torch.matmul", "dp", "cuda_graph", "torch._grouped_mm", "torch._grouped_mm[padded]"}
HARD_GRACE_S = 30.0  # after the time limit, the timed child gets this long before it is killed


def build_plan(args, run_id: str) -> dict:
    jobs = [{"id": "ceiling", "kind": "ceiling", "suite": "ceiling", "dtype": args.dtypes[0]}]
    for suite in args.suites:
        for dtype in args.dtypes:
            strategies = args.strategies or STRATEGIES[suite]
            if suite == "grouped":
                jobs.append({"id": f"grouped/{dtype}", "kind": "grouped", "suite": "grouped", "dtype": dtype,
                             "budget_s": args.budget_s, **args.grouped})
                continue
            for (M, N, K) in args.shapes.get(suite, SUITES[suite]):
                jobs.append({"id": f"{suite}/{shape_text(M, N, K)}/{dtype}", "kind": "gemm", "suite": suite,
                             "M": M, "N": N, "K": K, "dtype": dtype, "strategies": strategies,
                             "budget_s": args.budget_s,
                             "extra_timers": ["events"] if suite == "skinny" and args.timer != "events" else []})
    settings = {"timer": args.timer, "warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms,
                "variant_timeout_s": args.variant_timeout_s, "max_configs": 1 if args.quick else args.max_configs,
                "quick": args.quick, "dp_max_configs": 1 if args.quick else 4, "final": True,
                "order": args.order}
    return {"run_id": run_id, "deadline": None, "hbm_gbps": None, "settings": settings, "jobs": jobs}


def short_summary(rows: list[dict]) -> str:
    """Per shape: torch.matmul, dp, and the best of the suite's strategies; then targets."""
    lines = []
    data = [r for r in rows if r.get("suite") not in ("ceiling", "timer_check")]
    for c in rows:
        if c.get("suite") == "ceiling" and c.get("status") == "ok":
            what = f"{c['gbps']:.0f} GB/s copy" if c["provider"] == "copy" else f"{c['tflops']:.0f} TFLOP/s cuBLAS {c['shape']}"
            lines.append(f"ceiling: {what}")
        elif c.get("suite") == "ceiling":
            lines.append(f"ceiling {c.get('provider')}: {c.get('status')} {c.get('error')}")
    table = speedup_table(data, baselines=("torch.matmul", "dp", "cuda_graph"))
    entries = []
    for suite in [s for s in list(ALL_SUITES) + sorted({e["suite"] for e in table}) if s]:
        s_entries = [e for e in table if e["suite"] == suite]
        if not s_entries or any(x["suite"] == suite for x in entries):
            continue
        mine = sorted({x["provider"] for x in s_entries} - BASELINES)
        ours = {(e["shape"], e["dtype"]): e for e in best_of(s_entries, mine, label="ours")}
        keys = sorted({(e["shape"], e["dtype"]) for e in s_entries},
                      key=lambda k: tuple(int(x) for x in k[0].split("x")) if k[0].count("x") == 2 else (0,))
        for shape, dtype in keys:
            by = {e["provider"]: e for e in s_entries if e["shape"] == shape and e["dtype"] == dtype}
            o = ours.get((shape, dtype))
            base = "cuda_graph" if suite == "grouped" else "dp"
            entries.append({
                "suite": suite, "shape": shape, "dtype": dtype,
                "torch_us": by.get("torch.matmul", {}).get("median_us"),
                "base_us": by.get(base, {}).get("median_us"),
                "best": o["winner"] if o else "-", "best_us": o["median_us"] if o else None,
                "tflops": o["tflops"] if o else None,
                "vs_torch": o.get("vs_torch.matmul") if o else None, "vs_base": o.get(f"vs_{base}") if o else None,
                "x_floor": o.get("x_floor") if o else None,
            })
    if entries:
        lines.append("")
        lines.append(text_table(entries, [
            ("suite", "suite"), ("shape", "shape"), ("dtype", "dt"), ("torch_us", "torch us", ".1f"),
            ("base_us", "dp/graph us", ".1f"), ("best", "best of ours"), ("best_us", "us", ".1f"),
            ("tflops", "TFLOP/s", ".0f"), ("vs_torch", "vs torch", ".2f"), ("vs_base", "vs dp/graph", ".2f"),
            ("x_floor", "x floor", ".2f")]).rstrip())
    targets = evaluate_targets(data)
    if targets:
        lines.append("")
        for t in targets:
            val = "-" if t["value"] is None else f"{t['value']:.2f}"
            mark = {True: "MET ", False: "MISS", None: "n/a "}[t["met"]]
            lines.append(f"[{mark}] {t['suite']}/{t['dtype']}: {t['target']}: {val} ({t['shapes']}/{t['of']} shapes)")
    fails = {}
    for r in rows:
        if r.get("status") not in ("ok", "skipped"):
            fails[(r.get("provider"), r.get("status"))] = fails.get((r.get("provider"), r.get("status")), 0) + 1
    if fails:
        lines.append("failed variants: " + ", ".join(f"{p} {s} x{n}" for (p, s), n in sorted(fails.items())))
    return "\n".join(lines) + "\n"


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--suites", default=",".join(ALL_SUITES), help="comma list of: " + ", ".join(ALL_SUITES))
    ap.add_argument("--dtypes", default="bf16", help="comma list of bf16, fp16, fp32 (default bf16)")
    ap.add_argument("--strategies", default=None,
                    help="comma list overriding every GEMM suite's strategies (e.g. split_k,stream_k)")
    ap.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                    help="time budget per shape, compile included; shrunk to a fair share of the time left")
    ap.add_argument("--time-limit-s", type=float, default=DEFAULT_TIME_LIMIT_S,
                    help="whole run, compile pass included (a summary is printed by limit + ~40 s at worst)")
    ap.add_argument("--quick", action="store_true", help="each schedule's default config only (sanity pass)")
    ap.add_argument("--max-configs", type=int, default=DEFAULT_MAX_CONFIGS, help="candidates per strategy at most")
    ap.add_argument("--compile-procs", type=int, default=None,
                    help="parallel compile-pass processes (default: CPUs - 2, at most 12; 0 disables the pass)")
    ap.add_argument("--compile-share", type=float, default=DEFAULT_COMPILE_SHARE,
                    help="largest share of --time-limit-s the compile pass may use")
    ap.add_argument("--order", choices=("model", "space"), default="model",
                    help="candidate order: advisor.codegen.schedule_model's ranking (default config kept first) "
                         "or the schedule's own search-space order")
    ap.add_argument("--timer", choices=("do_bench", "events", "graph", "auto"), default="do_bench",
                    help="graph: GPU time per call from CUDA-graph replays (no host launch overhead)")
    ap.add_argument("--warmup-ms", type=float, default=10)
    ap.add_argument("--rep-ms", type=float, default=50)
    ap.add_argument("--variant-timeout-s", type=float, default=45.0,
                    help="limit for one variant: compile + checks + timing (SIGALRM)")
    ap.add_argument("--stall-s", type=float, default=None,
                    help="silence after which a child is killed as hung (default: variant timeout + 30)")
    ap.add_argument("--shapes", default=None,
                    help="replace suites' shapes: comma list of SUITE:MxNxK (e.g. tail:1536x1536x4096,skinny:64x64x65536)")
    ap.add_argument("--grouped", default=None, help="replace the grouped suite: COUNT:LO:HI[:SEED] (default 64:128:512:0)")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: $OUT, else bench/results)")
    ap.add_argument("--csv-name", default="h200.csv")
    ap.add_argument("--dry-run", action="store_true",
                    help="list the jobs and the candidates each would try (imports the schedules; no GPU needed)")
    args = ap.parse_args(argv)
    args.suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    bad = [s for s in args.suites if s not in ALL_SUITES]
    if bad:
        ap.error(f"unknown suite(s) {bad}; choose from {', '.join(ALL_SUITES)}")
    args.dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in args.dtypes if d not in ("bf16", "fp16", "fp32")]
    if bad:
        ap.error(f"unknown dtype(s) {bad}")
    args.strategies = [s.strip() for s in args.strategies.split(",")] if args.strategies else None
    shapes: dict[str, list] = {}
    for item in (args.shapes or "").split(","):
        if not item.strip():
            continue
        suite, _, text = item.partition(":")
        if suite not in SUITES:
            ap.error(f"--shapes: {suite!r} is not a GEMM suite ({', '.join(SUITES)})")
        try:
            shapes.setdefault(suite, []).append(parse_shape(text))
        except ValueError as exc:
            ap.error(f"--shapes: {exc}")
    args.shapes = shapes
    args.grouped_text = args.grouped
    args.grouped = dict(GROUPED)
    if args.grouped_text:
        # the same COUNT:LO:HI[:SEED] parser as `advisor generate grouped`
        from advisor.errors import AdvisorError
        from advisor.codegen.generate import parse_group

        try:
            args.grouped.update(parse_group(args.grouped_text))
        except AdvisorError as exc:
            ap.error(f"--grouped: {exc}")
    if args.out is None:
        args.out = Path(os.environ["OUT"]) if os.environ.get("OUT") else HERE / "results"
    if args.compile_procs is None:
        args.compile_procs = max(0, min(12, (os.cpu_count() or 2) - 2))
    if args.stall_s is None:
        args.stall_s = args.variant_timeout_s + 30
    return args


def dry_run(plan: dict, num_sms: int) -> None:
    """Print what the run would try, without a GPU (schedules imported here)."""
    from advisor.run.bench import worker

    schedules = worker.load_schedules(plan)
    items = worker.compile_items(plan, schedules, num_sms)
    per_job: dict[str, dict[str, int]] = {}
    for job, name, _, _ in items:
        per_job.setdefault(job["id"], {}).setdefault(name, 0)
        per_job[job["id"]][name] += 1
    for job in plan["jobs"]:
        counts = per_job.get(job["id"], {})
        missing = [s for s in job.get("strategies", []) if s not in counts]
        print(f"{job['id']:<36} " + ", ".join(f"{k} {v}" for k, v in counts.items())
              + (f"  (no candidates: {', '.join(missing)})" if missing else ""))
    print(f"{len(items)} variants, {len({(n, json_text(c)) for _, n, c, _ in items})} distinct configs "
          f"(SM count {num_sms})")


def json_text(cfg) -> str:
    from advisor.run.bench.rows import config_json

    return config_json(cfg)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        dry_run(build_plan(args, "dry-run"), int(os.environ.get("ADVISOR_NUM_SMS", "132")))
        return 0
    t0 = time.time()
    run_id = new_run_id()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    csv_path = out / args.csv_name
    log_path = out / "bench.log"
    workdir = Path(tempfile.mkdtemp(prefix=f"advisor-bench-{run_id}-"))
    plan = build_plan(args, run_id)
    n_jobs = len(plan["jobs"])
    print(f"bench_gemm {run_id}: {n_jobs} jobs ({', '.join(args.suites)}; {', '.join(args.dtypes)}), "
          f"time limit {args.time_limit_s:.0f} s, out {out}", flush=True)

    def log(msg: str) -> None:
        with open(log_path, "a") as f:
            f.write(f"{now_iso()} {msg}\n")

    # 1. compile pass
    if args.compile_procs > 0:
        cdeadline = t0 + args.compile_share * args.time_limit_s
        print(f"compile pass: {args.compile_procs} processes, until +{cdeadline - t0:.0f} s", flush=True)
        known, stats = isolate.precompile(plan, workdir, procs=args.compile_procs, deadline=cdeadline,
                                          log_dir=workdir, stall_s=args.stall_s)
        plan["known"] = known
        msg = (f"compile pass done in {time.time() - t0:.0f} s: {stats['ok']} ok, {stats['failed']} failed, "
               f"{stats['hung']} hung, {stats['crashed']} crashed")
        print(msg, flush=True)
        log(msg)

    # 2. timed pass
    deadline = t0 + args.time_limit_s
    plan["deadline"] = deadline
    rows: list[dict] = []
    job_rows: dict[str, int] = {}

    def on_row(row):
        rows.append(row)
        append_csv(csv_path, [row])

    def on_event(ev):
        t = ev.get("type")
        jid = ev.get("job")
        if t == "row":
            n_all, n_ok = job_rows.get(jid, (0, 0))
            job_rows[jid] = (n_all + 1, n_ok + (ev["row"].get("status") == "ok"))
        elif t == "job_done":
            n_all, n_ok = job_rows.get(jid, (0, 0))
            print(f"  +{time.time() - t0:4.0f} s  {jid}: {n_all} rows, {n_ok} ok", flush=True)
        elif t == "device_lost":
            print(f"  CUDA context lost ({ev.get('error', '')[:160]}); restarting the worker", flush=True)

    isolate.run_plan(plan, workdir, log_path=log_path, on_row=on_row, on_event=on_event,
                     stall_s=args.stall_s, hard_deadline=deadline + HARD_GRACE_S)
    write_json(out / f"rows-{run_id}.json", rows)

    # 3. tables
    try:
        from make_tables import build_results

        (out / "h200_summary.md").write_text(build_results(rows, source=str(csv_path)))
    except Exception as exc:  # noqa: BLE001 - the CSV is what matters; report and go on
        print(f"summary markdown failed: {type(exc).__name__}: {exc}", flush=True)
    print(f"\ndone in {time.time() - t0:.0f} s: {len(rows)} rows -> {csv_path}\n", flush=True)
    try:
        print(short_summary(rows), flush=True)
    except Exception:  # noqa: BLE001 - the rows are safe in the CSV; never end without a word
        import traceback

        traceback.print_exc()
        print(f"summary failed; rows are in {csv_path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
