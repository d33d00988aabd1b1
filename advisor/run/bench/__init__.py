"""Benchmark runner: verify and time GEMM schedules against cuBLAS and our data-parallel baseline.

    from advisor.run.bench import run_shape, append_csv, speedup_table
    rows = run_shape(1664, 1408, 8192, "bf16",
                     {"stream_k": [cfg1, cfg2], "persistent": [cfg3]}, budget_s=30,
                     progress=lambda p: print(p.provider, p.elapsed_s))
    append_csv("bench/results/h200.csv.gz", rows)

Modules:
    rows      the long-format row schema, CSV/JSON writers (pure Python)
    tables    best-per-provider, speedups, geometric means, markdown (pure Python)
    timing    do_bench / event / CPU timers, L2-defeating input rotation
    verify    checkers: fresh random inputs, NaN-poisoned outputs, float64 truth
    runner    run_shape: baselines + ordered candidates within a budget, per-variant limits
    grouped   run_grouped: many small GEMMs; ceilings: copy bandwidth and cuBLAS rate
    isolate   the same work in child processes that are restarted past crashes and hangs
    worker    the child process (python -m advisor.run.bench.worker)

Importing this package needs neither torch nor triton; running anything does.
"""

from __future__ import annotations

from .rows import COLUMNS, STATUSES, append_csv, append_jsonl, make_row, read_csv, write_json
from .tables import (
    best_of, best_per_provider, geomean, latest_runs, markdown_table, speedup_table, suite_geomeans, summary_markdown,
)

__all__ = [
    "COLUMNS", "STATUSES", "append_csv", "append_jsonl", "best_of", "best_per_provider", "geomean",
    "latest_runs", "make_row", "markdown_table", "read_csv", "run_grouped", "run_shape", "speedup_table",
    "suite_geomeans", "summary_markdown", "write_json",
]


def __getattr__(name):  # lazy: these pull in the runner (torch imported inside its functions)
    if name == "run_shape":
        from .runner import run_shape

        return run_shape
    if name == "run_grouped":
        from .grouped import run_grouped

        return run_grouped
    raise AttributeError(name)
