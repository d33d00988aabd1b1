"""Derive docs/results.md from the long-format rows in bench/results/h200.csv.gz.

    python3 bench/make_tables.py [--merge FETCHED.csv] [--csv bench/results/h200.csv.gz] [--out docs/results.md]

For each suite and dtype: every provider's best verified time per shape, TFLOP/s, speedup
over torch.matmul (cuBLAS) and over our data-parallel schedule, time over the HBM floor
where it was measured, and geometric means; then the targets of issue 4, met or missed by
how much; the ceilings; and what failed. By default only the latest run of each shape is
used (the CSV is appended to across runs).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from advisor.run.bench.rows import append_csv, read_csv  # noqa: E402
from advisor.run.bench.tables import latest_runs, markdown_table, suite_markdown  # noqa: E402
from suites import ALL_SUITES, evaluate_targets  # noqa: E402

HERE = Path(__file__).resolve().parent

def _runs_line(rows: list[dict]) -> str:
    seen = {}
    for r in rows:
        seen.setdefault(r.get("run_id"), r)
    parts = []
    for rid, r in seen.items():
        timers = sorted({x.get("timer") for x in rows if x.get("run_id") == rid and x.get("timer")})
        dtypes = sorted({x.get("dtype") for x in rows if x.get("run_id") == rid and x.get("dtype")})
        parts.append(f"{'/'.join(dtypes) or '?'}: {r.get('device') or '?'} ({r.get('sm_count') or '?'} SMs), "
                     f"torch {r.get('torch') or '?'}, Triton {r.get('triton') or '?'}, run {rid}, "
                     f"{r.get('date') or '?'}, timer {'/'.join(timers) or '?'}")
    return "; ".join(parts)


def suite_section(rows: list[dict], suite: str) -> str:
    srows = [r for r in rows if r.get("suite") == suite]
    if not srows:
        return ""
    out = [f"## {suite}\n\n", f"Measured on {_runs_line(srows)}.\n"]
    if suite == "grouped":
        out.append("\nHere `torch.matmul` is a Python loop of one torch.matmul per GEMM, `cuda_graph` that loop "
                   "captured once and replayed, `torch._grouped_mm[padded]` every GEMM zero-padded to the "
                   "group's largest K and N (its TFLOP/s count the useful work only). For fp32 the loop and "
                   "its graph run with tf32, as our kernel does, since run 20261201T180742Z-506 (earlier fp32 "
                   "runs timed them at full fp32 precision, which flattered our ratios).\n")
    out.append(suite_markdown(srows, suite))
    return "".join(out)


def targets_section(rows: list[dict]) -> str:
    res = evaluate_targets(rows)
    if not res:
        return ""
    for r in res:
        r["verdict"] = {True: "met", False: "MISSED", None: "not measured"}[r["met"]]
        r["shapes_text"] = f"{r['shapes']}/{r['of']}"
    return "## Targets (issue 4)\n\n" + markdown_table(res, [
        ("suite", "suite"), ("dtype", "dtype"), ("target", "target"), ("value", "measured", ".3f"),
        ("threshold", "bar", ".2f"), ("verdict", "verdict"), ("note", "note"), ("winners", "winners"),
        ("shapes_text", "shapes")]) + "\n"


def ceilings_section(rows: list[dict]) -> str:
    c = [r for r in rows if r.get("suite") == "ceiling"]
    if not c:
        return ""
    return ("## Ceilings\n\nA device-to-device copy (bytes read + written over time) and a large cuBLAS GEMM, "
            "measured first in the run (fp32: with tf32, the rate our schedules compete with, since run "
            "20261201T180742Z-506; before it the fp32 row was cuBLAS's full-precision rate).\n\n"
            + markdown_table(c, [
                ("provider", "provider"), ("shape", "size"), ("dtype", "dtype"), ("median_us", "median us", ".1f"),
                ("gbps", "GB/s", ".0f"), ("tflops", "TFLOP/s", ".1f"), ("status", "status"),
                ("error", "error"), ("device", "device"), ("date", "date")]) + "\n")


def timer_section(rows: list[dict]) -> str:
    tc = [r for r in rows if r.get("suite") == "timer_check" and r.get("status") == "ok"]
    if not tc:
        return ""
    base = {}
    for r in rows:
        if r.get("provider") == "torch.matmul" and r.get("suite") not in ("timer_check", "ceiling"):
            base.setdefault((r.get("shape"), r.get("dtype")), []).append(r)
    entries = []
    for r in tc:
        b = [x for x in base.get((r.get("shape"), r.get("dtype")), []) if x.get("status") == "ok"
             and x.get("median_us")]
        ref = min(b, key=lambda x: x["median_us"]) if b else None
        entries.append({"shape": r["shape"], "dtype": r["dtype"], "events_us": r["median_us"],
                        "do_bench_us": ref["median_us"] if ref else None,
                        "ratio": ref["median_us"] / r["median_us"] if ref else None,
                        "x_floor": r["median_us"] / r["hbm_floor_us"] if r.get("hbm_floor_us") else None})
    return ("## Timer check\n\ntorch.matmul timed twice: with `do_bench` (which zeroes a 256 MB buffer before "
            "each call; its dirty lines are written back during the timed kernel) and with the rotation-only "
            "event timer. The ratio shows how much of a short memory-bound kernel's time is the flush.\n\n"
            + markdown_table(entries, [("shape", "shape"), ("dtype", "dtype"), ("do_bench_us", "do_bench us", ".1f"),
                                       ("events_us", "events us", ".1f"), ("ratio", "do_bench / events", ".2f"),
                                       ("x_floor", "events x HBM floor", ".2f")]) + "\n")


def failures_section(rows: list[dict]) -> str:
    bad = [r for r in rows if r.get("status") not in ("ok", None)]
    if not bad:
        return "## Failures\n\nNone: every variant that ran compiled, launched and passed its checks.\n"
    counts = Counter((r.get("suite"), r.get("provider"), r.get("status")) for r in bad)
    entries = [{"suite": s, "provider": p, "status": st, "n": n} for (s, p, st), n in sorted(counts.items(),
                                                                                            key=lambda x: str(x))]
    errors = Counter((r.get("provider"), r.get("status"), r.get("error")) for r in bad if r.get("status") != "skipped")
    top = [{"provider": p, "status": st, "n": n, "error": e} for (p, st, e), n in errors.most_common(20)]
    text = ("## Failures\n\nVariants that did not give a verified time (never ranked). `skipped`: not applicable "
            "to the shape, or the shape's time budget ran out first.\n\n"
            + markdown_table(entries, [("suite", "suite"), ("provider", "provider"), ("status", "status"),
                                       ("n", "variants")]))
    if top:
        text += "\nMost frequent errors:\n\n" + markdown_table(top, [("provider", "provider"), ("status", "status"),
                                                                   ("n", "n"), ("error", "error")])
    return text + "\n"


def build_results(rows: list[dict], *, source: str = "bench/results/h200.csv.gz") -> str:
    parts = [
        "# Measured results: GEMM schedules\n\n",
        "Other results: compute/communication overlap on 2 GPUs in `docs/schedules/comm_overlap.md`, "
        "`advisor diagnose` on million-kernel traces in `docs/scale.md`. What each schedule tried and "
        "why the winners won: `docs/schedules/`.\n\n",
        f"Generated by `python3 bench/make_tables.py` from `{source}` (long-format rows written by "
        "`bench/bench_gemm.py`). Each table uses the latest run of its shapes; its `timer` says how it was "
        "timed: `do_bench` (median of `triton.testing.do_bench`, L2 flushed before each call) or `graph` "
        "(GPU time per call from CUDA-graph replays of 20 calls, so host launch overhead is excluded: on the "
        "H200 a split-K call whose kernels took ~37 us timed 49-121 us eagerly because its Python launcher "
        "costs ~100 us; schedules are compared on GPU time, launch cost is the launch_overhead finding's "
        "business). Inputs rotate so that no call finds its operands in the L2; every variant was checked "
        "against a float64 reference on fresh random inputs with its output poisoned first, and each "
        "provider's winner was re-checked and re-timed (the numbers below are those re-timings; since run "
        "20261129T1100 the re-timing takes each provider's three fastest search configs and times them in "
        "three interleaved rounds, keeping the median of the round medians, because back-to-back timings "
        "minutes apart drifted by up to 25% on the H200). Speedup = "
        "baseline time / provider time (> 1: faster); \"x HBM floor\" = time / (bytes moved once / measured "
        "copy bandwidth). The copy bandwidth is always an eager rate: in the graph-timed run of "
        "2026-11-29 (run 20261129T091954Z-415) the copy ceiling was captured as a copy-engine memcpy node "
        "(2721 GB/s), so that run's floors were recomputed from the median eager copy rate of the same "
        "day's runs (4267 GB/s); the harness now times ceilings eagerly.\n\n",
    ]
    parts.append(targets_section(rows))
    parts.append("Why a target is missed, with the profiles behind it (Nsight Compute counters, phase "
                 "timestamps, cuBLAS's kernels, the probes tried and dropped): `docs/schedules/stream_k.md` (tail), "
                 "`docs/schedules/split_k.md` (skinny), `docs/schedules/persistent.md` (balanced) and "
                 "`docs/schedules/grouped.md`.\n\n")
    parts.append(ceilings_section(rows))
    suites = list(ALL_SUITES) + sorted({r.get("suite") for r in rows} - set(ALL_SUITES) - {"ceiling", "timer_check"})
    for s in suites:
        parts.append(suite_section(rows, s))
    parts.append(timer_section(rows))
    parts.append(failures_section(rows))
    return "".join(p for p in parts if p)


def _ident(r: dict) -> tuple:
    return tuple(str(r.get(k) or "") for k in ("run_id", "suite", "shape", "dtype", "provider", "config", "phase",
                                                "timer"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--csv", type=Path, default=HERE / "results" / "h200.csv.gz", help="rows to read")
    ap.add_argument("--out", type=Path, default=HERE.parent / "docs" / "results.md", help="markdown file to write")
    ap.add_argument("--all-runs", action="store_true", help="use every run in the CSV, not only the latest per shape")
    ap.add_argument("--merge", type=Path, action="append", default=[],
                    help="first append the rows of this CSV (e.g. one fetched from the GPU machine) to --csv; "
                         "rows already there (same run_id, suite, shape, dtype, provider, config, phase) are not "
                         "added twice")
    args = ap.parse_args(argv)
    for extra in args.merge:
        have = {_ident(r) for r in read_csv(args.csv, convert=False)}
        new = [r for r in read_csv(extra, convert=False) if _ident(r) not in have]
        if new:
            append_csv(args.csv, new)
        print(f"merged {len(new)} new rows from {extra} into {args.csv}")
    rows = read_csv(args.csv)
    if not rows:
        print(f"make_tables: no rows in {args.csv}", file=sys.stderr)
        return 1
    if not args.all_runs:
        rows = latest_runs(rows)
    try:
        source = str(args.csv.resolve().relative_to(HERE.parent))
    except ValueError:
        source = str(args.csv)
    args.out.write_text(build_results(rows, source=source))
    print(f"wrote {args.out} from {len(rows)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
