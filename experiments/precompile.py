"""Compile a probe's kernels in parallel worker processes before it times anything (GPU).

    python3 experiments/precompile.py VARIANTS.json [--shapes ...] [--workers 8] [--phases]

Why: Triton compiles in the calling process, one kernel at a time, and a probe of a dozen
configs on five shapes spends minutes of device time compiling before its first timing
(a lent GPU machine starts with an empty cache every call). Each worker here runs one
warm-up call of (schedule, config, shape) on that shape's real tensors, so every constexpr
the host derives from them (EVEN_K, INT64, stride hints) is the one the probe will see; the
cubins land in Triton's on-disk cache, where the probe then finds them. --phases compiles
the phase-stamped Stream-K kernels of experiments/probe_stream_k_phases.py instead.

A job that fails (a config the shape refuses, a compile error) is reported and skipped: the
probe itself reports it again where it matters.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def jobs_of(spec: dict, shapes: list[str] | None, phases: bool) -> list[tuple[str, dict, str]]:
    """(schedule, config, shape) of every variant on each of its shapes."""
    out = []
    for v in spec["variants"]:
        if phases and v["schedule"] != "stream_k_gemm":
            continue
        for shape in v.get("shapes") or shapes or spec["shapes"]:
            if shapes and shape not in shapes:
                continue
            out.append((v["schedule"], v["config"], shape))
    return out


def warm(job: tuple[str, dict, str], phases: bool, dtype: str = "bf16") -> str:
    """One warm-up call on `dtype` inputs (the variants file's; runs in a worker process)."""
    sys.path.insert(0, str(ROOT))
    import torch

    from advisor.run.bench.rows import parse_shape
    from advisor.run.bench.verify import dtype_from_name
    from advisor.codegen.kernel_lib import load

    schedule, config, shape = job
    mod = load(schedule)
    cfg = mod.Config(**config)
    M, N, K = parse_shape(shape)
    tdt = dtype_from_name(dtype)
    a = torch.randn(M, K, device="cuda", dtype=tdt)
    b = torch.randn(K, N, device="cuda", dtype=tdt)
    t0 = time.perf_counter()
    if phases:
        plan = mod.plan_schedule(M, N, K, cfg, torch.cuda.get_device_properties(0).multi_processor_count)
        stamps = torch.zeros(mod.PHASES * plan.grid, dtype=torch.int64, device="cuda")
        mod.matmul(a, b, cfg, phase_times=stamps)
    else:
        mod.matmul(a, b, cfg)
    torch.cuda.synchronize()
    return f"{time.perf_counter() - t0:5.1f} s"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("variants", type=Path)
    ap.add_argument("--shapes", default=None, help="comma list of MxNxK (default: the file's)")
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--phases", action="store_true", help="the phase-stamped Stream-K kernels")
    args = ap.parse_args()
    spec = json.loads(args.variants.read_text())
    jobs = jobs_of(spec, args.shapes.split(",") if args.shapes else None, args.phases)
    t0 = time.perf_counter()
    failed = 0
    # spawn: CUDA cannot be used in a forked child of a process that initialised it
    with ProcessPoolExecutor(args.workers, mp_context=get_context("spawn")) as pool:
        futures = {pool.submit(warm, job, args.phases, spec.get("dtype", "bf16")): job for job in jobs}
        for fut in as_completed(futures):
            schedule, config, shape = futures[fut]
            try:
                note = fut.result()
            except Exception as exc:  # noqa: BLE001 - report and go on; the probe reports it too
                failed += 1
                note = f"FAILED {type(exc).__name__}: {str(exc)[:160]}"
            print(f"precompile {shape:>16} {schedule} {json.dumps(config, sort_keys=True)}: {note}", flush=True)
    print(f"precompile: {len(jobs)} jobs, {failed} failed, {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
