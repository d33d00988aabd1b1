"""Overlapped all-gather + GEMM and GEMM + reduce-scatter against the unoverlapped sequence, on 2+ GPUs.

    torchrun --nproc-per-node N bench/bench_comm_overlap.py [--shapes TxHxF,...] [--dtype bf16]
        [--chunks 2,4,8] [--comm-ctas 0,16] [--sm-carveout 0,24] [--timers eager,graph] [--warmup 10] [--iters 50]
        [--trace] [--no-symm-mem] [--quick] [--out DIR]

One process per GPU (N >= 2), NCCL backend, NVLink multicast off (NCCL_NVLS_ENABLE=0,
TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 are set before the process group
exists; the script refuses to run if they hold other values: on the shared multi-GPU machines,
multicast can take every GPU of the host out of service).

Shapes TxHxF are a tensor-parallel MLP/attention block over N ranks: T tokens, hidden H, inner
width F (F = H: an attention projection, comm-heavy; F = 4H: an MLP, compute-heavy).
  ag_gemm  (column-parallel, sequence-parallel input): x (T/N, H) per rank, w (H, F/N);
           y = all_gather(x) @ w, (T, F/N).            GEMM per rank: M=T, N=F/N, K=H.
  gemm_rs  (row-parallel): a (T, F/N), w (F/N, H); y = reduce_scatter(a @ w), (T/N, H).
                                                         GEMM per rank: M=T, N=H, K=F/N.
Providers per suite and shape:
  plain           the unoverlapped sequence (collective, then GEMM; or GEMM, then collective)
  chunked_serial  the same chunks on one stream: the decomposition's cost without overlap
  overlap         kernels/comm_overlap.py, one row per --chunks x --comm-ctas x --sm-carveout
                  value (batched GEMM per chunk; comm_ctas caps the CTAs of the chunked NCCL
                  collectives, 0 = NCCL's choice; sm_carveout leaves that many SMs free of the
                  GEMMs for the collective, 0 = none), the same chunks with transport=p2p
                  (copy-engine copies from the peers' symmetric memory: no SMs; CUDA only), plus chunks=4 without local-first (ag_gemm: what hiding chunk 0 behind
                  the own shard gives) and chunks=4 with one contiguous GEMM per rank block (gemm=mm)
  symm_mem        torch.ops.symm_mem fused op (when this torch has it; --no-symm-mem skips)
  comm_only, gemm_only   the two halves alone: comm_fraction = comm / (comm + gemm)

Timers (--timers, both by default; every provider is measured under each):
  eager   the schedule called from Python each iteration, as most code runs it
  graph   the schedule captured once into a CUDA graph (kernels/comm_overlap.capture_graph)
          and replayed: no per-op host cost. A chunked schedule issues several ops and
          collectives per chunk; where the host is slower than the GPU, eager timing measures
          the host, and nothing overlaps. (symm_mem is not captured: eager only.)
  Speedups compare providers under the same timer.

Every provider is verified before it is timed: fresh random inputs (never zeros), a NaN-poisoned
output buffer, relative Frobenius error against the plain sequence under the dtype's tolerance
(both round the same fp32 sums to the output dtype). Timing: CUDA events around each of --iters
iterations after --warmup, median (and p20/p80) per rank, then the maximum over ranks (the step
is as slow as the slowest rank). Inputs are tens to hundreds of MB, beyond the 60 MB L2.

Output (rank 0): long-format rows appended to <out>/comm_overlap.csv (suite, shape, M, N, K,
dtype, provider, config, timer, status, error, median_us, p20_us, p80_us, speedup = plain / this,
comm_fraction, rel_err, world_size, device, date, torch, run_id), and a short table printed last
with the target per timer: speedup >= 1.2 where comm_fraction >= 0.25.

--trace: for each suite, the shape where the best overlap config beat plain by the largest
factor among shapes with comm_fraction >= 0.25 (else the most comm-heavy shape) is run again
under torch.profiler, with that row's timer, for the plain sequence and that overlap config;
each rank writes
<out>/traces/<suite>_<shape>_<provider>/rank<r>.json.gz, and rank 0 runs advisor's diagnosis on
each set (as `advisor diagnose <dir>/rank*.json.gz` would) and prints whether exposed_comm fired.

--out defaults to $OUT when set, else bench/results. --dry-run lists the plan (no GPU needed).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import gzip
import json
import math
import os
import shutil
import statistics
import sys
import zlib
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from advisor.run.bench.rows import config_json, new_run_id, now_iso, short_error  # noqa: E402
from advisor.run.bench.tables import text_table  # noqa: E402
from advisor.codegen.kernel_lib import load  # noqa: E402

co = load("comm_overlap")  # sets the no-multicast environment (before any process group)

SUITES = ("ag_gemm", "gemm_rs")
# tokens x hidden x inner width; tokens 4096..16384, hidden 4096..8192, bf16 by default
DEFAULT_SHAPES = [
    (4096, 4096, 4096), (8192, 4096, 4096), (16384, 4096, 4096),
    (4096, 8192, 8192), (8192, 8192, 8192), (16384, 8192, 8192),
    (8192, 4096, 16384), (8192, 8192, 32768),
]
QUICK_SHAPES = [(8192, 4096, 4096), (16384, 8192, 8192)]
DTYPES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
# Provider vs plain, relative Frobenius error. Both schedules sum the same fp32 products and
# round once to the output dtype, so they differ by output rounding (bf16 rms ~2.3e-3, fp16
# ~2.8e-4) and fp32 summation order; these are kernels/common.TOLERANCE's values (4x margin).
# fp32 inputs may run as TF32 on the GPU in one schedule and not the other: 2e-3 covers it.
TOLERANCE = {"bf16": 1e-2, "fp16": 2e-3, "fp32": 2e-3}
TARGET_SPEEDUP = 1.2
TARGET_COMM_FRACTION = 0.25

TIMERS = ("eager", "graph")
COLUMNS = ["suite", "shape", "M", "N", "K", "dtype", "provider", "config", "timer", "status", "error",
           "median_us", "p20_us", "p80_us", "speedup", "comm_fraction", "rel_err", "world_size",
           "device", "date", "torch", "run_id"]


# ------------------------------------------------------------------------------------ plan


def parse_shape(text: str) -> tuple[int, int, int]:
    parts = str(text).lower().split("x")
    if len(parts) != 3:
        raise ValueError(f"shape {text!r} is not TxHxF")
    try:
        t, h, f = (int(p) for p in parts)
    except ValueError:
        raise ValueError(f"shape {text!r} is not TxHxF with integers") from None
    if min(t, h, f) < 1:
        raise ValueError(f"shape {text!r} has an empty dimension")
    return t, h, f


def shape_text(shape) -> str:
    return "x".join(str(v) for v in shape)


def problem(suite: str, shape, world: int) -> dict:
    """Per-rank tensor shapes and GEMM dims of a suite's shape over `world` ranks."""
    t, h, f = shape
    if t % world or f % world:
        raise ValueError(f"{shape_text(shape)}: tokens and inner width must be divisible by the world size {world}")
    fl = f // world
    if suite == "ag_gemm":
        return {"inputs": {"x": (t // world, h), "w": (h, fl)}, "out": (t, fl), "M": t, "N": fl, "K": h,
                "rows": t // world}
    if suite == "gemm_rs":
        return {"inputs": {"a": (t, fl), "w": (fl, h)}, "out": (t // world, h), "M": t, "N": h, "K": fl,
                "rows": t // world}
    raise ValueError(f"unknown suite {suite!r}")


def providers(suite: str, rows: int, chunks: list[int], symm_mem: bool, ctas=(0,), carveout=(0,),
              p2p: bool = False) -> list[tuple[str, object]]:
    """(provider, Config or None) in the order they run; plain first (the baseline)."""
    out: list[tuple[str, object]] = [("plain", None), ("comm_only", None), ("gemm_only", None),
                                     ("chunked_serial", co.Config(chunks=min(4, rows), comm_stream=False))]
    for c in chunks:
        if c <= rows:
            for n in ctas:
                for sms in carveout:
                    out.append(("overlap", co.Config(chunks=c, comm_ctas=n, sm_carveout=sms)))
            if p2p:  # copy-engine transfers through symmetric memory: no SMs, so no CTA cap
                for sms in carveout:
                    out.append(("overlap", co.Config(chunks=c, transport="p2p", sm_carveout=sms)))
    if suite == "ag_gemm":
        out.append(("overlap", co.Config(chunks=min(4, rows), local_first=False)))
    out.append(("overlap", co.Config(chunks=min(4, rows), gemm="mm")))
    if symm_mem:
        out.append(("symm_mem", co.Config(use_symm_mem=True)))
    return out


def plan(args, world: int) -> list[dict]:
    jobs = []
    for suite in args.suites:
        for shape in args.shapes:
            p = problem(suite, shape, world)
            for timer in args.timers:
                for provider, cfg in providers(suite, p["rows"], args.chunks, args.symm_mem, args.comm_ctas,
                                                              args.sm_carveout, args.p2p):
                    if timer == "graph" and provider == "symm_mem":
                        continue
                    jobs.append({"suite": suite, "shape": shape_text(shape), "provider": provider,
                                 "config": config_json(cfg), "timer": timer, **{k: p[k] for k in ("M", "N", "K")}})
    return jobs


def check_launch(world_size: int | None, gpus: int, environ=None) -> str | None:
    """None when the launch can run; else the one-line reason it cannot."""
    env = os.environ if environ is None else environ
    if gpus < 2:
        return (f"needs 2 or more GPUs, this machine has {gpus}: run it on a multi-GPU machine with `torchrun --nproc-per-node N bench/bench_comm_overlap.py` (N >= 2), or "
                "run the CPU check `python -m kernels.comm_overlap`")
    if world_size is None:
        return f"launch with torchrun: `torchrun --nproc-per-node {gpus} bench/bench_comm_overlap.py ...`"
    if world_size < 2:
        return f"WORLD_SIZE is {world_size}: launch with `torchrun --nproc-per-node N` and N >= 2"
    if world_size > gpus:
        return f"WORLD_SIZE {world_size} > {gpus} GPUs: one process per GPU"
    unsafe = {k: env.get(k) for k, v in co.NO_MULTICAST_ENV.items() if env.get(k) != v}
    if unsafe:
        return ("refusing to run with NVLink multicast allowed (" + ", ".join(f"{k}={v!r}" for k, v in unsafe.items())
                + "): unset them or set " + " ".join(f"{k}={v}" for k, v in co.NO_MULTICAST_ENV.items()))
    return None


# ------------------------------------------------------------------------------------ rows


def make_row(job: dict, *, status: str, median_us=None, p20_us=None, p80_us=None, rel_err=None,
             error: str = "", env: dict) -> dict:
    ok = status == "ok"
    return {**{k: job[k] for k in ("suite", "shape", "M", "N", "K", "provider", "config", "timer")},
            "dtype": env["dtype"], "status": status, "error": short_error(error),
            "median_us": median_us if ok else None, "p20_us": p20_us if ok else None,
            "p80_us": p80_us if ok else None, "speedup": None, "comm_fraction": None, "rel_err": rel_err,
            "world_size": env["world_size"], "device": env["device"], "date": env.get("date") or now_iso(),
            "torch": env.get("torch", ""), "run_id": env.get("run_id", "")}


def derive(rows: list[dict]) -> list[dict]:
    """Fill speedup (plain median / this median) and comm_fraction (comm_only / (comm_only +
    gemm_only)) per (suite, shape, dtype, timer); the halves themselves get no speedup."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(_key(r), []).append(r)
    for grp in groups.values():
        t = {r["provider"]: r["median_us"] for r in grp if r["status"] == "ok" and r["provider"] in ("plain", "comm_only", "gemm_only")}
        frac = None
        if t.get("comm_only") and t.get("gemm_only"):
            frac = t["comm_only"] / (t["comm_only"] + t["gemm_only"])
        for r in grp:
            r["comm_fraction"] = frac
            if r["provider"] not in ("comm_only", "gemm_only") and r["status"] == "ok" and t.get("plain") and r["median_us"]:
                r["speedup"] = t["plain"] / r["median_us"]
    return rows


def write_csv(path: Path, rows: list[dict]) -> Path:
    """Append rows (one header per file; a file with another header is refused, not mixed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists() or path.stat().st_size == 0
    if not new:
        with path.open(newline="") as f:
            header = next(csv.reader(f), [])
        if header != COLUMNS:
            raise SystemExit(f"{path}: has other columns ({header[:4]}...): choose another --out")
    with path.open("a", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS, extrasaction="ignore")
        if new:
            w.writeheader()
        for r in rows:
            w.writerow({k: ("" if r.get(k) is None else r[k]) for k in COLUMNS})
    return path


def _key(r: dict) -> tuple:
    return r["suite"], r["shape"], r["dtype"], r.get("timer") or "eager"


def summary(rows: list[dict]) -> str:
    """Per suite, shape and timer: plain, best overlap (config), symm_mem, comm_fraction; then
    the target, per timer."""
    entries = []
    hits: dict[str, list[int]] = {}
    keys = []
    for r in rows:
        k = _key(r)
        if k not in keys:
            keys.append(k)
    symm = {(r["suite"], r["shape"], r["dtype"]): r["speedup"] for r in rows
            if r["provider"] == "symm_mem" and r["status"] == "ok"}
    for k in keys:
        grp = [r for r in rows if _key(r) == k and r["status"] == "ok"]
        by = {}
        for r in grp:
            if r["provider"] not in by or r["median_us"] < by[r["provider"]]["median_us"]:
                by[r["provider"]] = r
        best = by.get("overlap")
        frac = next((r["comm_fraction"] for r in grp if r["comm_fraction"] is not None), None)
        e = {"suite": k[0], "shape": k[1], "dtype": k[2], "timer": k[3], "comm_fraction": frac,
             "plain_us": by.get("plain", {}).get("median_us"),
             "overlap_us": best["median_us"] if best else None,
             "best": _short_config(best["config"]) if best else "-",
             "speedup": best["speedup"] if best else None,
             "serial_x": by.get("chunked_serial", {}).get("speedup"),
             "symm_x": symm.get(k[:3]) if k[3] == "eager" else None}
        entries.append(e)
        if frac is not None and frac >= TARGET_COMM_FRACTION:
            h = hits.setdefault(k[3], [0, 0])
            h[1] += 1
            h[0] += bool(e["speedup"] and e["speedup"] >= TARGET_SPEEDUP)
    lines = [text_table(entries, [("suite", "suite"), ("shape", "TxHxF"), ("dtype", "dt"), ("timer", "timer"),
                                  ("comm_fraction", "comm frac", ".2f"), ("plain_us", "plain us", ".1f"),
                                  ("overlap_us", "overlap us", ".1f"), ("best", "best config"),
                                  ("speedup", "speedup", ".2f"), ("serial_x", "serial chunks x", ".2f"),
                                  ("symm_x", "symm_mem x", ".2f")]).rstrip()]
    if not hits:
        lines.append(f"[n/a ] overlap >= {TARGET_SPEEDUP}x over plain where comm_fraction >= {TARGET_COMM_FRACTION}: "
                     "no such shape")
    for timer, (hit, eligible) in hits.items():
        mark = "MET " if hit == eligible else "MISS"
        lines.append(f"[{mark}] {timer}: overlap >= {TARGET_SPEEDUP}x over plain where comm_fraction >= "
                     f"{TARGET_COMM_FRACTION}: {hit}/{eligible} shapes")
    bad = [r for r in rows if r["status"] != "ok"]
    if bad:
        lines.append("failed: " + "; ".join(f"{r['suite']} {r['shape']} {r['provider']} {r['status']}: {r['error'][:80]}" for r in bad[:6]))
    return "\n".join(lines) + "\n"


def _short_config(text: str) -> str:
    try:
        c = json.loads(text)
    except (TypeError, ValueError):
        return str(text)
    if c.get("use_symm_mem"):
        return "symm_mem"
    return (("p2p " if c.get("transport") == "p2p" else "") + f"chunks={c.get('chunks')}"
            + ("" if c.get("local_first", True) else " no-local-first")
            + (" mm" if c.get("gemm", "bmm") == "mm" else "")
            + (f" ctas={c['comm_ctas']}" if c.get("comm_ctas") else "")
            + (f" carve={c['sm_carveout']}" if c.get("sm_carveout") else ""))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--shapes", default=None, help="comma list of TxHxF (tokens x hidden x inner width); default: 8 shapes, "
                    "tokens 4096..16384, hidden 4096..8192, F = H and 4H")
    ap.add_argument("--suites", default=",".join(SUITES), help="comma list of: " + ", ".join(SUITES))
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="input/output dtype (default bf16)")
    ap.add_argument("--chunks", default="2,4,8", help="chunk counts of the overlap provider (default 2,4,8)")
    ap.add_argument("--comm-ctas", default="0,16", help="CTA caps of the overlap's NCCL collectives, 0 = NCCL's "
                    "choice (default 0,16); crossed with --chunks")
    ap.add_argument("--sm-carveout", default="0", help="SMs the overlap's GEMMs leave to the collective (cuBLAS SM "
                    "count target), 0 = none (default 0; NCCL's ring takes 24 CTAs on 2 H200s: try 0,24); crossed with --chunks")
    ap.add_argument("--no-p2p", dest="p2p", action="store_false",
                    help="skip the overlap's copy-engine transport (transport=p2p, symmetric memory; on by default where "
                    "symmetric memory may be used)")
    ap.add_argument("--timers", default=None, help="comma list of: eager, graph (default both on cuda; eager on cpu)")
    ap.add_argument("--warmup", type=int, default=10, help="untimed iterations first (default 10)")
    ap.add_argument("--iters", type=int, default=50, help="timed iterations; the median is reported (default 50)")
    ap.add_argument("--trace", action="store_true", help="capture per-rank Kineto traces of plain and best overlap, and diagnose them")
    ap.add_argument("--trace-iters", type=int, default=5, help="iterations per captured trace (default 5)")
    ap.add_argument("--no-symm-mem", dest="symm_mem", action="store_false",
                    help="skip torch's symmetric-memory fused ops (they never use multicast here)")
    ap.add_argument("--quick", action="store_true", help="2 shapes, chunks 4, 20 iterations: a sanity pass")
    ap.add_argument("--out", type=Path, default=None, help="output folder (default: $OUT, else bench/results)")
    ap.add_argument("--csv-name", default="comm_overlap.csv")
    ap.add_argument("--dry-run", action="store_true", help="print the plan for --world-size ranks and exit (no GPU)")
    ap.add_argument("--summarize", type=Path, default=None, metavar="CSV",
                    help="print the summary table of a results CSV (its last run, or --run-id) and exit (no GPU)")
    ap.add_argument("--run-id", default=None, help="with --summarize: the run to summarize")
    ap.add_argument("--world-size", type=int, default=None, help="ranks assumed by --dry-run (default $WORLD_SIZE or 2)")
    ap.add_argument("--pg-timeout-s", type=float, default=180.0,
                    help="process-group timeout: a hung collective fails after this long (default 180)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                    help="cpu: gloo and wall-clock timing, to test this script without GPUs (numbers mean nothing)")
    args = ap.parse_args(argv)
    try:
        args.shapes = [parse_shape(s) for s in args.shapes.split(",") if s.strip()] if args.shapes else None
    except ValueError as exc:
        ap.error(f"--shapes: {exc}")
    args.suites = [s.strip() for s in args.suites.split(",") if s.strip()]
    bad = [s for s in args.suites if s not in SUITES]
    if bad or not args.suites:
        ap.error(f"--suites: unknown {bad}; choose from {', '.join(SUITES)}")
    try:
        args.chunks = sorted({int(c) for c in args.chunks.split(",") if c.strip()})
    except ValueError:
        ap.error("--chunks wants a comma list of integers")
    if not args.chunks or min(args.chunks) < 1:
        ap.error("--chunks wants positive integers")
    try:
        args.comm_ctas = sorted({int(c) for c in args.comm_ctas.split(",") if c.strip()})
    except ValueError:
        ap.error("--comm-ctas wants a comma list of integers")
    if not args.comm_ctas or min(args.comm_ctas) < 0:
        ap.error("--comm-ctas wants integers >= 0")
    try:
        args.sm_carveout = sorted({int(c) for c in args.sm_carveout.split(",") if c.strip()})
    except ValueError:
        ap.error("--sm-carveout wants a comma list of integers")
    if not args.sm_carveout or min(args.sm_carveout) < 0:
        ap.error("--sm-carveout wants integers >= 0")
    default_timers = TIMERS if args.device == "cuda" else ("eager",)
    args.timers = [t.strip() for t in args.timers.split(",") if t.strip()] if args.timers else list(default_timers)
    if not args.timers or any(t not in TIMERS for t in args.timers):
        ap.error(f"--timers: choose from {', '.join(TIMERS)}")
    if args.device == "cpu" and "graph" in args.timers:
        ap.error("--timers graph needs --device cuda (CUDA graphs)")
    if args.warmup < 0 or args.iters < 1 or args.trace_iters < 1:
        ap.error("--warmup >= 0, --iters >= 1 and --trace-iters >= 1")
    if args.quick:
        args.shapes = args.shapes or QUICK_SHAPES
        args.chunks, args.comm_ctas, args.sm_carveout = [4], args.comm_ctas[:1], args.sm_carveout[:1]
        args.iters, args.warmup = min(args.iters, 20), min(args.warmup, 5)
    args.shapes = args.shapes or DEFAULT_SHAPES
    if args.out is None:
        args.out = Path(os.environ["OUT"]) if os.environ.get("OUT") else HERE / "results"
    if args.world_size is None:
        args.world_size = int(os.environ.get("WORLD_SIZE", 2))
    return args


# ------------------------------------------------------------------------------------ GPU side
# (also runs on the CPU with gloo and wall-clock timing, `--device cpu`, so that the tests run
# this whole path; CPU numbers mean nothing)


def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _inputs(p, dtype, device, seed):
    import torch

    g = torch.Generator(device=device).manual_seed(seed)  # generated where used: no host copies
    out = {}
    for name, shape in p["inputs"].items():
        t = torch.randn(shape, generator=g, dtype=torch.float32, device=device)
        if name == "w":
            t = t / math.sqrt(shape[0])  # unit-variance outputs
        out[name] = t.to(dtype)
    return out


def _callable(suite, provider, cfg, t, group):
    """A callable running one provider (setup done here, outside the timed region); the
    schedules accept `out` (a caller's buffer) for the poisoned-output check."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size(group)
    if suite == "ag_gemm":
        x, w = t["x"], t["w"]
        if provider == "plain":
            return lambda out=None: co.all_gather_matmul_reference(x, w, group=group)
        if provider == "comm_only":
            full = torch.empty((x.shape[0] * world, x.shape[1]), dtype=x.dtype, device=x.device)
            return lambda out=None: co._all_gather(full, x, group=group)
        if provider == "gemm_only":
            full = torch.randn((x.shape[0] * world, x.shape[1]), device=x.device).to(x.dtype)
            return lambda out=None: torch.mm(full, w)
        return lambda out=None: co.all_gather_matmul(x, w, cfg, group=group, out=out)
    a, w = t["a"], t["w"]
    if provider == "plain":
        return lambda out=None: co.matmul_reduce_scatter_reference(a, w, group=group)
    if provider == "comm_only":
        part = torch.randn((a.shape[0], w.shape[1]), device=a.device).to(a.dtype)
        y = torch.empty((a.shape[0] // world, w.shape[1]), dtype=a.dtype, device=a.device)
        return lambda out=None: co._reduce_scatter(y, part, group=group)
    if provider == "gemm_only":
        return lambda out=None: torch.mm(a, w)
    return lambda out=None: co.matmul_reduce_scatter(a, w, cfg, group=group, out=out)


def _timed_and_checked(fn, timer):
    """(timed, checked) callables of one provider under a timer. eager: fn itself (checked
    writes into a caller's poisoned buffer). graph: fn captured once into a CUDA graph;
    timed replays it, checked poisons the graph's own output, replays, and returns it."""
    import torch

    if timer == "eager":
        return fn, fn
    replay, static = co.capture_graph(lambda: fn())

    def checked(_out=None):
        if isinstance(static, torch.Tensor):
            static.fill_(float("nan"))
        replay()
        return static

    return (lambda out=None: replay()), checked


def _time(fn, warmup, iters, group, device):
    """(median, p20, p80) in us over iterations, each the max over ranks of this rank's
    median etc. CUDA events around every iteration on the GPU (no host sync inside the
    loop); wall clock per iteration on the CPU."""
    import time

    import torch
    import torch.distributed as dist

    for _ in range(warmup):
        fn()
    _sync(device)
    dist.barrier(group=group)
    if device.type == "cuda":
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for a, b in ev:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize(device)
        us = [a.elapsed_time(b) * 1e3 for a, b in ev]
    else:
        us = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            us.append((time.perf_counter() - t0) * 1e6)
    us.sort()
    q = statistics.quantiles(us, n=5, method="inclusive") if len(us) >= 2 else [us[0]] * 4
    return tuple(_max_over_ranks(v, group, device) for v in (statistics.median(us), q[0], q[3]))


def _rel_err(out, ref) -> float:
    import torch

    o, r = out.double(), ref.double()
    if not torch.isfinite(o).all():
        return math.inf
    return (torch.linalg.norm(o - r) / max(torch.linalg.norm(r).item(), 1e-30)).item()


def _max_over_ranks(value: float, group, device) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], device=device, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def run_shape(args, suite, shape, env, group, log) -> list[dict]:
    """Verify and time every provider of one suite and shape (same control flow on every
    rank: errors and times are reduced over ranks before anything branches on them)."""
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = env["dev"]
    p = problem(suite, shape, world)
    dtype = getattr(torch, DTYPES[args.dtype])
    t = _inputs(p, dtype, device, seed=1000 * rank + zlib.crc32(f"{suite}/{shape_text(shape)}".encode()) % 997)
    ref = _callable(suite, "plain", None, t, group)()
    # the plain sequence itself against the same sequence in fp32 (torch's matmul default: no
    # TF32): catches a broken collective before anything is compared with it
    t32 = {k: v.float() for k, v in t.items()}
    plain_err = _max_over_ranks(_rel_err(ref, _callable(suite, "plain", None, t32, group)()), group, device)
    del t32
    rows = []
    for timer in args.timers:
        for provider, cfg in providers(suite, p["rows"], args.chunks, args.symm_mem and env["symm_mem_ok"],
                                       args.comm_ctas, args.sm_carveout, args.p2p and env["symm_mem_ok"]):
            if timer == "graph" and provider == "symm_mem":
                continue  # torch's fused op is not captured here: eager rows only
            job = {"suite": suite, "shape": shape_text(shape), "provider": provider, "config": config_json(cfg),
                   "timer": timer, **{k: p[k] for k in ("M", "N", "K")}}
            label = f"{suite} {job['shape']} [{timer}] {provider} {_short_config(job['config']) if cfg else ''}"
            try:
                fn, checked = _timed_and_checked(_callable(suite, provider, cfg, t, group), timer)
                err = None
                if provider == "plain" and timer == "eager":
                    err = plain_err
                elif provider not in ("comm_only", "gemm_only"):
                    out = torch.full(p["out"], float("nan"), dtype=dtype, device=device)  # poisoned
                    res = checked(out)
                    _sync(device)
                    err = _max_over_ranks(_rel_err(res, ref), group, device)
                    del out, res
                if err is not None and not err <= TOLERANCE[args.dtype]:
                    rows.append(make_row(job, status="wrong", rel_err=err,
                                         error=f"rel err {err:.2e} > {TOLERANCE[args.dtype]:.0e}", env=env))
                    log(f"{label}: WRONG (rel err {err:.2e})")
                    continue
                med, p20, p80 = _time(fn, args.warmup, args.iters, group, device)
                rows.append(make_row(job, status="ok", median_us=med, p20_us=p20, p80_us=p80, rel_err=err, env=env))
                log(f"{label}: {med:.1f} us")
            except Exception as exc:  # keep going: one failing provider must not lose the others' rows
                rows.append(make_row(job, status="error", error=f"{type(exc).__name__}: {exc}", env=env))
                log(f"{label}: {type(exc).__name__}: {exc}")
                _sync(device)
                dist.barrier(group=group)
            finally:
                fn = checked = None  # a captured graph's memory goes back before the next provider
    return derive(rows)


def trace_picks(rows: list[dict], suite: str) -> tuple[str, str, list[tuple[str, object]]] | None:
    """Where to trace a suite: (shape, timer, [plain, the fastest overlap config there]).

    The shape and timer where an overlap config beat plain by the largest factor among
    shapes with comm_fraction >= TARGET_COMM_FRACTION (the case the schedule is for); when
    no shape qualifies, the most comm-heavy shape under the first timer measured."""
    ok = [r for r in rows if r["suite"] == suite and r["status"] == "ok" and r["comm_fraction"] is not None]
    if not ok:
        return None
    won = [r for r in ok if r["provider"] == "overlap" and r["speedup"] and r["comm_fraction"] >= TARGET_COMM_FRACTION]
    if won:
        top = max(won, key=lambda r: (r["speedup"], r["shape"]))
        shape, timer = top["shape"], top.get("timer") or "eager"
    else:
        top = max(ok, key=lambda r: (r["comm_fraction"], r["shape"]))
        shape, timer = top["shape"], ok[0].get("timer") or "eager"
    picks: list[tuple[str, object]] = [("plain", None)]
    cands = [r for r in ok if r["shape"] == shape and (r.get("timer") or "eager") == timer and r["provider"] == "overlap"]
    if cands:
        best = min(cands, key=lambda r: r["median_us"])
        picks.append(("overlap", co.Config(**json.loads(best["config"]))))
    return shape, timer, picks


def capture_traces(args, rows, env, group, log) -> list[dict]:
    """Kineto traces (one file per rank) of trace_picks(); rank 0 diagnoses each set."""
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, record_function

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = env["dev"]
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    reports = []
    for suite in args.suites:
        pick = trace_picks(rows, suite)
        if pick is None:
            continue
        shape_t, timer, picks = pick
        p = problem(suite, parse_shape(shape_t), world)
        t = _inputs(p, getattr(torch, DTYPES[args.dtype]), device, seed=7 + rank)
        for provider, cfg in picks:
            fn, _ = _timed_and_checked(_callable(suite, provider, cfg, t, group), timer)
            for _ in range(3):
                fn()
            _sync(device)
            dist.barrier(group=group)
            d = args.out / "traces" / f"{suite}_{shape_t}_{timer}_{provider}"
            d.mkdir(parents=True, exist_ok=True)
            with profile(activities=activities, record_shapes=True) as prof:
                for _ in range(args.trace_iters):
                    with record_function(f"{suite}:{provider}"):
                        fn()
                _sync(device)
            raw = d / f"rank{rank}.json"
            prof.export_chrome_trace(str(raw))
            with open(raw, "rb") as src, gzip.open(d / f"rank{rank}.json.gz", "wb") as dst:
                shutil.copyfileobj(src, dst)
            raw.unlink()
            dist.barrier(group=group)
            if rank == 0:
                reports.append(diagnose_dir(d, suite, shape_t, provider, cfg, log) | {"timer": timer})
    return reports


def diagnose_dir(d: Path, suite: str, shape: str, provider: str, cfg, log) -> dict:
    """advisor's diagnosis of one captured set: did exposed_comm fire, on which ranks."""
    rec = {"suite": suite, "shape": shape, "provider": provider, "config": config_json(cfg), "dir": str(d)}
    try:
        from advisor.diagnose.diagnosis import diagnose
        from advisor.traces import load_trace

        files = sorted(d.glob("rank*.json.gz"), key=lambda f: int(f.name[4:].split(".")[0]))
        res = diagnose(load_trace(files))
        fs = [f for f in res.findings if f.symptom == "exposed_comm"]
        rec.update(flagged=bool(fs), ranks_flagged=sorted(f.rank for f in fs),
                   exposed_fraction={str(f.rank): f.evidence.get("exposed_fraction") for f in fs})
        log(f"diagnose {d.name}: exposed_comm {'FLAGGED on ranks ' + str(rec['ranks_flagged']) if fs else 'not flagged'}"
            f"  (advisor diagnose {d}/rank*.json.gz)")
    except Exception as exc:  # the traces are still on disk for a manual run
        rec.update(flagged=None, error=f"{type(exc).__name__}: {exc}")
        log(f"diagnose {d.name}: failed ({type(exc).__name__}: {exc})")
    return rec


def read_rows(path: Path, run_id: str | None = None) -> list[dict]:
    """Rows of one run of a results CSV (the last run when run_id is None), numbers parsed."""
    with Path(path).open(newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise SystemExit(f"{path}: no rows")
    run_id = run_id or rows[-1]["run_id"]
    rows = [r for r in rows if r["run_id"] == run_id]
    if not rows:
        raise SystemExit(f"{path}: no rows of run {run_id!r}")
    for r in rows:
        for k in ("median_us", "p20_us", "p80_us", "speedup", "comm_fraction", "rel_err"):
            r[k] = float(r[k]) if r.get(k) not in (None, "") else None
        r["timer"] = r.get("timer") or "eager"
    return rows


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.summarize:
        rows = read_rows(args.summarize, args.run_id)
        r0 = rows[0]
        print(f"run {r0['run_id']}: {r0['world_size']} x {r0['device']}, torch {r0['torch']}, {r0['date']}")
        print(summary(rows), end="")
        return 0
    if args.dry_run:
        jobs = plan(args, args.world_size)
        for j in jobs:
            print(f"{j['suite']:8} {j['shape']:18} M={j['M']:<6} N={j['N']:<6} K={j['K']:<6} {j['provider']:15} {j['config']}")
        print(f"{len(jobs)} measurements over {args.world_size} ranks")
        return 0
    import torch

    cuda = args.device == "cuda"
    gpus = (torch.cuda.device_count() if torch.cuda.is_available() else 0) if cuda else 1 << 30
    ws = int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else None
    reason = check_launch(ws, gpus)
    if reason:
        print(f"bench_comm_overlap: {reason}", file=sys.stderr)
        return 2
    import torch.distributed as dist

    local = int(os.environ.get("LOCAL_RANK", 0))
    # A collective that never completes (a rank failed elsewhere) raises after this long
    # instead of holding the GPUs until the launcher's limit.
    timeout = datetime.timedelta(seconds=args.pg_timeout_s)
    if cuda:
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
        try:
            dist.init_process_group("nccl", device_id=dev, timeout=timeout)
        except TypeError:  # torch without device_id
            dist.init_process_group("nccl", timeout=timeout)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    group = dist.group.WORLD
    rank, world = dist.get_rank(), dist.get_world_size()
    ok, why = co.symm_mem_status(dev, group)
    env = {"dtype": args.dtype, "world_size": world, "dev": dev,
           "device": torch.cuda.get_device_name(local) if cuda else "cpu", "date": now_iso(),
           "torch": torch.__version__, "run_id": new_run_id(), "symm_mem_ok": ok}

    def log(msg):
        if rank == 0:
            print(msg, flush=True)

    log(f"{world} x {env['device']}, torch {env['torch']}, symm_mem: {why}")
    rows = []
    path = args.out / args.csv_name
    try:
        for suite in args.suites:
            for shape in args.shapes:
                try:
                    new = run_shape(args, suite, shape, env, group, log)
                except ValueError as exc:  # a shape that does not divide over the ranks
                    log(f"{suite} {shape_text(shape)}: skipped ({exc})")
                    continue
                rows += new
                if rank == 0:
                    write_csv(path, new)
        reports = capture_traces(args, rows, env, group, log) if args.trace else []
        if rank == 0:
            if reports:
                (args.out / "traces" / "diagnosis.json").write_text(json.dumps(reports, indent=1))
            print(f"\nrows: {path}")
            print(summary(rows), end="")
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
