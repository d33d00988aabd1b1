"""Scale benchmark: `advisor diagnose` on big traces, side by side with HolisticTraceAnalysis.

Not a test (timing on shared machines is noisy): run it by hand, commit the numbers.

    python bench/bench_scale.py                  # synthesise inputs, 3 runs each, write results
    python bench/bench_scale.py --runs 5 --work /tmp/advisor-scale
    python bench/bench_scale.py --profile        # also cProfile one advisor run per input

What it does:
(a) synthesises, once (kept in --work and reused while the parameters match):
    - an Nsight Systems SQLite export with 1,000,000 kernel records in the 2024+ schema:
      StringIds, CUPTI_ACTIVITY_KIND_KERNEL (all 2024+ columns, NOT NULL where nsys has
      them), CUPTI_ACTIVITY_KIND_RUNTIME (one cudaLaunchKernel per kernel, same
      correlationId), NVTX_EVENTS (advisor.gemm shape ranges around GEMM launches, push/pop),
      TARGET_INFO_GPU for an H100 SXM, ENUM tables and META_DATA_EXPORT; a mix of cuBLAS,
      nvjet, CUTLASS and Triton GEMM names with elementwise/reduction/copy kernels, several
      grids and four streams; written with executemany in chunks;
    - a PyTorch profiler (Kineto) JSON trace of 200,000 events: kernels, cuda_runtime
      launches (correlation ids) and cpu_ops with Input Dims, deviceProperties and
      distributedInfo (HTA requires a rank);
(b) times `advisor diagnose FILE --json` on each, each run a separate process: wall time, and
    peak RSS of that process from os.wait4's rusage (ru_maxrss);
(c) times HTA on the same Kineto file the same way: TraceAnalysis(trace_dir=...) then
    get_gpu_kernel_breakdown() and get_temporal_breakdown() (no plots): loading plus the
    two breakdowns closest to what a diagnosis computes;
(d) writes long-format rows (bench, tool, input, metric, value, unit, runs, machine, date) to
    bench/results/scale.csv (replacing this machine's earlier rows) and the table with the
    targets into bench/SCALE.md (between its markers; the text around them is kept).

Targets (issue 9): the 1M-kernel export diagnosed in <= 10 s and <= 2 GiB peak; faster than
HTA on the same Kineto file. Issue 33: 2,000,000 Kineto events in <= 15 s and <= 1 GiB; a
2 GB Kineto JSON (plain and .gz) and a 10,000,000-kernel export in <= 3 GiB:

    python bench/bench_scale.py --kineto-only --events 2000000 --runs 1 --no-hta --block 2m
    python bench/bench_scale.py --kineto-only --events 6300000 --gz --runs 1 --no-hta --block big-kineto   # 2.0 GB
    python bench/bench_scale.py --kernels 10000000 --nsys-only --runs 1 --no-hta --block big \
        --results bench/results/scale_issue33.csv      # needs ~4.2 GB (2026-12-03, fifth pass): check free -g
    python bench/bench_scale.py --kernels 1000000 --nsys-only --runs 3 --no-hta --block nsys-1m \
        --results bench/results/scale_issue33.csv --compare /tmp/base=REV   # issue 9's 10 s / 2 GiB

(--block keeps each table in its own generated block of the markdown file, and each its own
rows in the CSV; the inputs stay in --work, several GB: delete them when done.)
"""

from __future__ import annotations

import argparse
import cProfile
import csv
import datetime as _dt
import io
import json
import os
import platform
import pstats
import random
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results" / "scale.csv"
SCALE_MD = REPO / "docs" / "scale.md"
COLUMNS = ["bench", "tool", "input", "metric", "value", "unit", "runs", "machine", "date"]
TARGET_WALL_S = 10.0
TARGET_RSS_MIB = 2048.0
# issue 33: 2M Kineto events in <= 15 s and <= 1 GiB; a 2 GB JSON and 10M kernels in <= 3 GiB
TARGET_2M_WALL_S, TARGET_2M_RSS_MIB, TARGET_BIG_RSS_MIB = 15.0, 1024.0, 3072.0

# ---------------------------------------------------------------------------------- inputs

KERNEL_DECLS = [
    "start INTEGER NOT NULL", "end INTEGER NOT NULL", "deviceId INTEGER NOT NULL", "contextId INTEGER NOT NULL",
    "greenContextId INTEGER", "streamId INTEGER NOT NULL", "correlationId INTEGER", "globalPid INTEGER",
    "demangledName INTEGER NOT NULL", "shortName INTEGER NOT NULL", "mangledName INTEGER", "launchType INTEGER",
    "cacheConfig INTEGER", "registersPerThread INTEGER NOT NULL", "gridX INTEGER NOT NULL", "gridY INTEGER NOT NULL",
    "gridZ INTEGER NOT NULL", "blockX INTEGER NOT NULL", "blockY INTEGER NOT NULL", "blockZ INTEGER NOT NULL",
    "staticSharedMemory INTEGER NOT NULL", "dynamicSharedMemory INTEGER NOT NULL", "localMemoryPerThread INTEGER NOT NULL",
    "localMemoryTotal INTEGER NOT NULL", "gridId INTEGER NOT NULL", "sharedMemoryExecuted INTEGER", "graphNodeId INTEGER",
    "sharedMemoryLimitConfig INTEGER",
]
RUNTIME_DECLS = ["start INTEGER NOT NULL", "end INTEGER NOT NULL", "eventClass INTEGER NOT NULL", "globalTid INTEGER",
                 "correlationId INTEGER", "nameId INTEGER NOT NULL", "returnValue INTEGER NOT NULL", "callchainId INTEGER"]
NVTX_DECLS = ["start INTEGER NOT NULL", "end INTEGER", "eventType INTEGER NOT NULL", "rangeId INTEGER", "category INTEGER",
              "color INTEGER", "text TEXT", "globalTid INTEGER", "endGlobalTid INTEGER", "textId INTEGER",
              "domainId INTEGER", "uint64Value INTEGER", "int64Value INTEGER", "doubleValue REAL", "uint32Value INTEGER",
              "int32Value INTEGER", "floatValue REAL", "jsonTextId INTEGER", "jsonText TEXT"]
GPU_DECLS = ["vmId INTEGER NOT NULL", "id INTEGER NOT NULL", "name TEXT", "busLocation TEXT", "isDiscrete INTEGER",
             "l2CacheSize INTEGER", "memoryBandwidth INTEGER", "smCount INTEGER", "cuDevice INTEGER",
             "maxRegistersPerBlock INTEGER", "maxShmemPerBlockOptin INTEGER", "maxShmemPerSm INTEGER",
             "maxRegistersPerSm INTEGER", "threadsPerWarp INTEGER", "maxWarpsPerSm INTEGER", "maxBlocksPerSm INTEGER",
             "maxThreadsPerBlock INTEGER", "computeMajor INTEGER", "computeMinor INTEGER"]
H100_GPU = (0, 0, "NVIDIA H100 80GB HBM3", "0000:1b:00.0", 1, 52428800, 3352320000000, 132, 0, 65536, 232448, 233472,
            65536, 32, 64, 32, 1024, 9, 0)

# (demangled name, short name, grid, block, registers, dynamic smem, duration ns, GEMM shape or None)
KERNEL_MIX = [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas",
     (11, 13, 1), (384, 1, 1), 168, 213_000, 61_000, (1664, 1408, 8192)),
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopB_NNT", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopB_NNT",
     (132, 1, 1), (384, 1, 1), 168, 200_000, 180_000, (4096, 4096, 4096)),
    ("void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<128x128x64_1x2x1_warpspecialized_cooperative_epi_tma> >(Params)",
     "device_kernel", (2, 2, 1), (384, 1, 1), 168, 180_000, 900_000, (256, 256, 131072)),
    ("triton_tem_fused_mm_0", "triton_tem_fused_mm_0", (256, 1, 1), (256, 1, 1), 128, 98_304, 22_000, (2048, 2048, 1024)),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3> >"
     "(int, at::native::CUDAFunctor_add<c10::BFloat16>, at::detail::Array<char*, 3>)", "vectorized_elementwise_kernel",
     (1024, 1, 1), (128, 1, 1), 32, 0, 4_000, None),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4> >"
     "(at::native::ReduceOp<float, at::native::MeanOps<float, float, float, float>, unsigned int, float, 4>)", "reduce_kernel",
     (528, 1, 1), (32, 16, 1), 40, 16, 9_000, None),
    ("triton_poi_fused_gelu_1", "triton_poi_fused_gelu_1", (8192, 1, 1), (128, 1, 1), 24, 0, 3_000, None),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda>(int)", "unrolled_elementwise_kernel",
     (65536, 1, 1), (128, 1, 1), 20, 0, 2_500, None),
]
WEIGHTS = [10, 8, 2, 10, 35, 10, 15, 10]
PUSH_POP = 59


def make_nsys(path: Path, n: int, seed: int = 1) -> None:
    """The 1M-kernel export (see the module docstring)."""
    rng = random.Random(seed)
    tmp = path.with_suffix(".partial")
    tmp.unlink(missing_ok=True)
    conn = sqlite3.connect(tmp)
    conn.execute("PRAGMA journal_mode = OFF")
    conn.execute("PRAGMA synchronous = OFF")
    conn.execute("CREATE TABLE StringIds (id INTEGER NOT NULL PRIMARY KEY, value TEXT NOT NULL)")
    strings = ["cudaLaunchKernel_v7000", "cudaStreamSynchronize_v3020"]
    for demangled, short, *_ in KERNEL_MIX:
        strings += [demangled, short]
    conn.executemany("INSERT INTO StringIds VALUES (?, ?)", list(enumerate(strings)))
    conn.execute(f'CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL ({", ".join(KERNEL_DECLS)})')
    conn.execute(f'CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME ({", ".join(RUNTIME_DECLS)})')
    conn.execute(f'CREATE TABLE NVTX_EVENTS ({", ".join(NVTX_DECLS)})')
    conn.execute(f'CREATE TABLE TARGET_INFO_GPU ({", ".join(GPU_DECLS)})')
    conn.execute("INSERT INTO TARGET_INFO_GPU VALUES (" + ", ".join("?" * len(H100_GPU)) + ")", H100_GPU)
    conn.execute("CREATE TABLE ENUM_NSYS_EVENT_TYPE (id INTEGER NOT NULL PRIMARY KEY, name TEXT NOT NULL, label TEXT)")
    conn.executemany("INSERT INTO ENUM_NSYS_EVENT_TYPE VALUES (?, ?, ?)",
                     [(34, "NvtxMark", "NVTX mark"), (59, "NvtxPushPopRange", "NVTX push/pop range"),
                      (60, "NvtxStartEndRange", "NVTX start/end range"), (75, "NvtxDomainCreate", "NVTX domain create")])
    conn.execute("CREATE TABLE META_DATA_EXPORT (name TEXT NOT NULL, value TEXT NOT NULL)")
    conn.executemany("INSERT INTO META_DATA_EXPORT VALUES (?, ?)", [("EXPORT_PRODUCT_VERSION", "2025.3.1.90"),
                                                                    ("EXPORT_SCHEMA_VERSION", "3.19.0")])
    gpid = 4242 << 24
    tids = [gpid | 4242, gpid | 4250]
    t = 1_700_000_000_000_000_000  # epoch ns, like real exports: > 2**53
    host = t
    chunk_k, chunk_r, chunk_n = [], [], []
    kernel_sql = f"INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES ({', '.join('?' * len(KERNEL_DECLS))})"
    runtime_sql = f"INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES ({', '.join('?' * len(RUNTIME_DECLS))})"
    nvtx_sql = f"INSERT INTO NVTX_EVENTS VALUES ({', '.join('?' * len(NVTX_DECLS))})"
    choices = rng.choices(range(len(KERNEL_MIX)), weights=WEIGHTS, k=n)
    for i, which in enumerate(choices):
        demangled, short, grid, block, regs, smem, dur, shape = KERNEL_MIX[which]
        dur = int(dur * rng.uniform(0.9, 1.1))
        tid = tids[i % 7 == 0]
        launch_start = host + rng.randint(1_200, 4_000)  # > 2 x 500 ns: shape ranges never overlap
        launch_end = launch_start + rng.randint(1_500, 4_000)
        host = launch_end
        start = max(t, launch_end + 3_000)
        t = start + dur + rng.randint(200, 3_000)
        corr = i + 1
        if shape is not None:
            text = f"advisor.gemm M={shape[0]} N={shape[1]} K={shape[2]} dtype=bf16"
            chunk_n.append((launch_start - 500, launch_end + 500, PUSH_POP, None, None, None, text, tid, tid, None, 0,
                            None, None, None, None, None, None, None, None))
        chunk_r.append((launch_start, launch_end, 1, tid, corr, 0, 0, None))
        d_id = 2 + 2 * which
        chunk_k.append((start, start + dur, 0, 1, None, 7 + (i % 4) * 4, corr, gpid, d_id, d_id + 1, None, 0, 0, regs,
                        grid[0], grid[1], grid[2], block[0], block[1], block[2], 0, smem, 0, 0, corr, None, None, None))
        if len(chunk_k) >= 100_000:
            conn.executemany(kernel_sql, chunk_k)
            conn.executemany(runtime_sql, chunk_r)
            conn.executemany(nvtx_sql, chunk_n)
            chunk_k, chunk_r, chunk_n = [], [], []
    conn.executemany(kernel_sql, chunk_k)
    conn.executemany(runtime_sql, chunk_r)
    conn.executemany(nvtx_sql, chunk_n)
    conn.commit()
    conn.close()
    os.replace(tmp, path)


KINETO_OPS = [  # (cpu op, Input Dims, kernel index in KERNEL_MIX)
    ("aten::mm", [[1664, 8192], [8192, 1408]], 0),
    ("aten::mm", [[4096, 4096], [4096, 4096]], 1),
    ("aten::addmm", [[4096], [2048, 1024], [1024, 2048]], 3),
    ("aten::add", [[4096, 4096], [4096, 4096], []], 4),
    ("aten::mean", [[4096, 4096], [], []], 5),
    ("aten::gelu", [[4096, 4096]], 6),
    ("aten::copy_", [[4096, 4096], [4096, 4096], []], 7),
]


def make_kineto(path: Path, n_events: int, seed: int = 2) -> None:
    """A Kineto trace of `n_events` events: a cpu_op, its cudaLaunchKernel and the kernel,
    repeated; timestamps in us relative to baseTimeNanoseconds as recent PyTorch writes them.
    Written event by event (a 2 GB trace must not need its events in memory here either);
    gzipped when `path` ends in .gz."""
    import gzip

    rng = random.Random(seed)
    host = 1000.0
    gpu = 1000.0
    step = 0
    head = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3", "totalGlobalMem": 84929216512, "computeMajor": 9,
                              "computeMinor": 0, "maxThreadsPerBlock": 1024, "maxThreadsPerMultiprocessor": 2048,
                              "regsPerBlock": 65536, "regsPerMultiprocessor": 65536, "warpSize": 32,
                              "sharedMemPerBlock": 49152, "sharedMemPerMultiprocessor": 233472, "numSms": 132,
                              "sharedMemPerBlockOptin": 232448}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
        "record_shapes": 1,
        "with_stack": 0,
        "trace_id": "0",
        "displayTimeUnit": "ms",
        "baseTimeNanoseconds": 1_700_000_000_000_000_000,
    }
    tmp = path.with_name(path.name + ".partial")
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(tmp, "wt") as fh:
        fh.write(json.dumps(head)[:-1] + ', "traceEvents": [')
        written = 0
        while written + 3 <= n_events:
            op, dims, which = KINETO_OPS[rng.randrange(len(KINETO_OPS))]
            name, _, grid, block, regs, smem, dur_ns, _ = KERNEL_MIX[which]
            step += 1
            op_dur = rng.uniform(8, 20)
            events = [{"ph": "X", "cat": "cpu_op", "name": op, "pid": 4242, "tid": 4242, "ts": round(host, 3), "dur": round(op_dur, 3),
                       "args": {"External id": step, "Record function id": 0, "Ev Idx": step,
                                "Input Dims": dims, "Input type": ["c10::BFloat16"] * len(dims)}}]
            launch = host + 2.0
            events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 4242, "tid": 4242,
                           "ts": round(launch, 3), "dur": 4.5, "args": {"External id": step, "cbid": 211, "correlation": step}})
            gpu = max(gpu, launch + 6.0)
            kdur = dur_ns / 1000.0 * rng.uniform(0.9, 1.1)
            events.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": round(gpu, 3), "dur": round(kdur, 3),
                           "args": {"External id": step, "queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": step,
                                    "registers per thread": regs, "shared memory": smem, "blocks per SM": 1.0,
                                    "warps per SM": 12.0, "grid": list(grid), "block": list(block),
                                    "est. achieved occupancy %": 19}})
            gpu += kdur + rng.uniform(0.5, 3.0)
            host += op_dur + rng.uniform(1.0, 4.0)
            fh.write(("" if written == 0 else ", ") + ", ".join(json.dumps(e) for e in events))
            written += 3
        fh.write('], "traceName": "rank0.json"}')
    os.replace(tmp, path)


# Bump when the generators change, so that inputs kept in --work are made again.
INPUT_VERSION = 2


def ensure_inputs(work: Path, kernels: int, events: int) -> tuple[Path | None, Path | None]:
    work.mkdir(parents=True, exist_ok=True)
    nsys = work / f"nsys_{kernels}_kernels_v{INPUT_VERSION}.sqlite"
    kineto_dir = work / f"kineto_{events}_v{INPUT_VERSION}"  # HTA reads a directory of traces
    kineto = kineto_dir / "rank0.json"
    if not kernels:
        nsys = None
    elif not nsys.is_file():
        t0 = time.perf_counter()
        make_nsys(nsys, kernels)
        print(f"wrote {nsys} ({nsys.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.0f} s", flush=True)
    if not events:
        kineto = None
    elif not kineto.is_file():
        kineto_dir.mkdir(exist_ok=True)
        t0 = time.perf_counter()
        make_kineto(kineto, events)
        print(f"wrote {kineto} ({kineto.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - t0:.0f} s", flush=True)
    return nsys, kineto


# ----------------------------------------------------------------------------- measuring

HTA_SNIPPET = """
import sys, warnings, logging
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
kernels = a.get_gpu_kernel_breakdown(visualize=False)
temporal = a.get_temporal_breakdown(visualize=False)
print(len(kernels[1]), temporal.shape)
"""


def run_measured(cmd: list[str], cwd: Path, env_extra: dict | None = None) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds (user + system) and peak RSS (MiB) of one child process,
    from os.wait4's rusage."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", **(env_extra or {}))
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = b"", b""
    # read pipes fully before reaping so a large output cannot block the child
    out, err = proc.stdout.read(), proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {err.decode()[-2000:]}")
    rss_mib = usage.ru_maxrss / 1024.0  # Linux: kilobytes
    return wall, usage.ru_utime + usage.ru_stime, rss_mib, out.decode()[-400:]


def measure(label: str, cmd: list[str], runs: int, src: Path = REPO) -> dict:
    """`runs` runs of `cmd`, each a fresh process started in `src` with `src` first on
    PYTHONPATH (so another checkout of advisor can be timed the same way)."""
    walls, cpus, rss, loads = [], [], [], []
    for i in range(runs):
        loads.append(os.getloadavg()[0])
        # `src` first; the caller's path after it (where e.g. msgspec may live outside the venv)
        path = os.pathsep.join(p for p in (str(src), os.environ.get("PYTHONPATH", "")) if p)
        w, c, r, _ = run_measured(cmd, src, {"PYTHONPATH": path})
        walls.append(w)
        cpus.append(c)
        rss.append(r)
        print(f"  {label} run {i + 1}/{runs}: {w:.2f} s wall, {c:.2f} s CPU, {r:.0f} MiB (load before: {loads[-1]:.2f})", flush=True)
    return {"wall_s": statistics.median(walls), "wall_s_min": min(walls), "wall_s_max": max(walls),
            "cpu_s": statistics.median(cpus), "peak_rss_mib": statistics.median(rss), "load_1min": statistics.mean(loads),
            "runs": runs}


def profile_advisor(path: Path, top: int = 25) -> str:
    """cProfile of one in-process diagnosis (load + diagnose + JSON), cumulative top."""
    from advisor.diagnose.diagnosis import diagnose
    from advisor.traces import load_trace

    prof = cProfile.Profile()
    prof.enable()
    d = diagnose(load_trace(path))
    json.dumps(d.to_dict(), default=str)
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(next(x for x in Path("/proc/meminfo").read_text().splitlines() if x.startswith("MemTotal")).split()[1])
        mem = f", {kb / 2**20:.0f} GiB RAM"
    except (OSError, StopIteration, ValueError):
        pass
    return f"{os.cpu_count()}-core {cpu}{mem}, {platform.system()} {platform.machine()}"


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for mod in ("pandas", "numpy", "hta"):
        try:
            m = __import__(mod)
            out[mod] = getattr(m, "__version__", None) or _dist_version(mod)
        except ImportError:
            out[mod] = "not installed"
    return out


def _dist_version(mod: str) -> str:
    from importlib import metadata

    name = {"hta": "HolisticTraceAnalysis"}.get(mod, mod)
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "?"


# ------------------------------------------------------------------------------- output


def write_rows(rows: list[dict], mach: str, results: Path = RESULTS) -> None:
    """Rows into `results`, replacing this machine's earlier rows for the same inputs."""
    results.parent.mkdir(parents=True, exist_ok=True)
    old = []
    inputs = {r["input"] for r in rows}
    if results.is_file():
        with open(results, newline="") as fh:
            old = [r for r in csv.DictReader(fh) if r.get("machine") != mach or r.get("input") not in inputs]
    with open(results, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in old + rows:
            w.writerow({c: r.get(c, "") for c in COLUMNS})


BEGIN = "<!-- bench_scale.py: generated from here -->"
END = "<!-- bench_scale.py: generated up to here -->"


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def write_markdown(results: dict, inputs: dict, mach: str, date: str, vers: dict, runs: int, target: Path = SCALE_MD,
                   results_path: Path = RESULTS, block: str = "") -> None:
    """The results table and targets, between the BEGIN/END markers (of `block`, when given)
    of the markdown file (the rest of the file, e.g. what profiling found, is kept as written)."""
    nsys = results.get(("advisor", "nsys"))
    kin = results.get(("advisor", "kineto"))
    hta = results.get(("hta", "kineto"))

    def verdict(ok: bool | None) -> str:
        return "n/a" if ok is None else ("met" if ok else "**missed**")

    lines = [
        *(["# Scale: `advisor diagnose` on big traces, and HolisticTraceAnalysis on the same Kineto file", ""]
          if not block else []),
        f"Machine: {mach}. Date: {date}. Python {vers['python']}, pandas {vers['pandas']}, numpy {vers['numpy']}, "
        f"HolisticTraceAnalysis {vers['hta']}.",
        f"Each number is the median of {runs} runs, each run a separate process (wall time from start to exit; "
        "CPU time and peak RSS from the process's own rusage; the 1-minute load average just before each run "
        f"shows what else the shared machine was doing). Produced by `python bench/bench_scale.py`; rows in "
        f"`{_rel(results_path)}`.",
        "",
        "Inputs (synthesised by the script, not committed):",
        "",
        *([f"- `nsys`: Nsight Systems SQLite export, 2024+ schema, {inputs['nsys_kernels']:,} kernels "
           f"({inputs['nsys_mib']:.0f} MiB), as many runtime launches and {inputs['nsys_nvtx']:,} NVTX shape ranges, H100."]
          if "nsys_kernels" in inputs else []),
        *([f"- `kineto`: PyTorch profiler JSON, {inputs['kineto_events']:,} events (kernels, cuda_runtime, cpu_op with Input "
           f"Dims; {inputs['kineto_mib']:.0f} MiB)" + (f"; `kineto.gz`: the same file gzipped ({inputs['kineto_gz_mib']:.0f} MiB)."
                                                        if "kineto_gz_mib" in inputs else ".")]
          if "kineto_events" in inputs else []),
        "",
        "| tool | input | what runs | wall (median) | min-max | CPU (median) | peak RSS | load avg before |",
        "|---|---|---|---|---|---|---|---|",
    ]
    what = {"advisor": "`advisor diagnose FILE --json` (load + all symptoms + rules + JSON)",
            "hta": "`TraceAnalysis(trace_dir)` + `get_gpu_kernel_breakdown()` + `get_temporal_breakdown()`"}
    for (tool, inp), r in results.items():
        lines.append(f"| {tool} | {inp} | {what.get(tool, what['advisor'])} | {r['wall_s']:.2f} s | {r['wall_s_min']:.2f}-{r['wall_s_max']:.2f} s | "
                     f"{r['cpu_s']:.2f} s | {r['peak_rss_mib']:.0f} MiB | {r['load_1min']:.2f} |")
    lines += ["", "Targets (issues 9 and 33):", ""]
    for (tool, inp), r in results.items():
        if tool != "advisor":
            continue
        if inp == "kineto" and inputs.get("kineto_events", 0) >= 2_000_000 and inputs.get("kineto_mib", 0) < 1800:
            lines.append(f"- 2M Kineto events in <= {TARGET_2M_WALL_S:.0f} s: {r['wall_s']:.2f} s wall ({r['cpu_s']:.2f} s CPU, "
                         f"load {r['load_1min']:.1f}), {verdict(r['wall_s'] <= TARGET_2M_WALL_S)}; <= 1 GiB: "
                         f"{r['peak_rss_mib']:.0f} MiB, {verdict(r['peak_rss_mib'] <= TARGET_2M_RSS_MIB)}.")
        big = (inp.startswith("kineto") and inputs.get("kineto_mib", 0) >= 1800) or (
            inp == "nsys" and inputs.get("nsys_kernels", 0) >= 10_000_000)
        if big:
            lines.append(f"- `{inp}` in <= 3 GiB: {r['peak_rss_mib']:.0f} MiB, {verdict(r['peak_rss_mib'] <= TARGET_BIG_RSS_MIB)} "
                         f"({r['wall_s']:.1f} s wall).")
    if nsys and inputs.get("nsys_kernels") == 1_000_000:
        lines.append(f"- 1M-kernel export diagnosed in <= {TARGET_WALL_S:.0f} s: {nsys['wall_s']:.2f} s, "
                     f"{verdict(nsys['wall_s'] <= TARGET_WALL_S)}.")
        lines.append(f"- ... in <= 2 GiB peak memory: {nsys['peak_rss_mib']:.0f} MiB, "
                     f"{verdict(nsys['peak_rss_mib'] <= TARGET_RSS_MIB)}.")
    if kin and hta:
        lines.append(f"- Faster than HTA on the same Kineto file: advisor {kin['wall_s']:.2f} s vs HTA {hta['wall_s']:.2f} s "
                     f"({hta['wall_s'] / kin['wall_s']:.1f}x), {verdict(kin['wall_s'] < hta['wall_s'])}; "
                     f"peak RSS {kin['peak_rss_mib']:.0f} vs {hta['peak_rss_mib']:.0f} MiB.")
    elif kin and not block:
        lines.append("- Faster than HTA: not measured (not run, or HolisticTraceAnalysis not installed).")
    begin, end = (BEGIN, END) if not block else (BEGIN.replace(" -->", f" ({block}) -->"), END.replace(" -->", f" ({block}) -->"))
    text = "\n".join([begin, *lines, end])
    old = target.read_text() if target.is_file() else ""
    if begin in old and end in old:  # keep the hand-written text around the generated block
        head, rest = old.split(begin, 1)
        new = head + text + rest.split(end, 1)[1]
    elif block:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    else:
        new = text + "\n" + old
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(new)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "advisor-scale",
                    help="where the synthetic inputs are written (and reused); never inside the repository")
    ap.add_argument("--kernels", type=int, default=1_000_000, help="kernel records in the nsys export")
    ap.add_argument("--events", type=int, default=200_000, help="events in the Kineto trace")
    ap.add_argument("--runs", type=int, default=3, help="runs per tool and input (the median is reported)")
    ap.add_argument("--no-hta", action="store_true", help="skip HolisticTraceAnalysis")
    ap.add_argument("--hta-python", default=sys.executable, help="interpreter with HolisticTraceAnalysis installed")
    ap.add_argument("--profile", action="store_true", help="print a cProfile of one in-process advisor run per input")
    ap.add_argument("--no-write", action="store_true", help="print only; do not touch bench/results or bench/SCALE.md")
    ap.add_argument("--kineto-only", action="store_true", help="skip the nsys export (time the Kineto inputs only)")
    ap.add_argument("--nsys-only", action="store_true", help="skip the Kineto trace (time the nsys export only)")
    ap.add_argument("--block", default="", help="name of the generated markdown block to write (several tables in one file)")
    ap.add_argument("--gz", action="store_true", help="also time advisor on the Kineto trace gzipped")
    ap.add_argument("--results", type=Path, default=RESULTS, help="CSV of long-format rows (this machine's rows replaced)")
    ap.add_argument("--markdown", type=Path, default=SCALE_MD, help="markdown file whose generated block gets the table")
    ap.add_argument("--compare", action="append", default=[], metavar="DIR=LABEL",
                    help="also time `advisor diagnose` from another source tree (e.g. `git archive REV | tar -x -C DIR`) "
                         "on both inputs, reported as tool 'advisor LABEL' (repeatable)")
    args = ap.parse_args(argv)

    nsys, kineto = ensure_inputs(args.work, 0 if args.kineto_only else args.kernels, 0 if args.nsys_only else args.events)
    kineto_gz = None
    if args.gz and kineto is not None:
        import gzip
        import shutil

        kineto_gz = kineto.parent.parent / f"{kineto.parent.name}.gz" / "rank0.json.gz"
        if not kineto_gz.is_file():
            kineto_gz.parent.mkdir(exist_ok=True)
            with open(kineto, "rb") as src, gzip.open(kineto_gz.with_suffix(".partial"), "wb", compresslevel=6) as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            os.replace(kineto_gz.with_suffix(".partial"), kineto_gz)
    inputs_timed = ([("kineto", kineto)] if kineto else []) + ([("kineto.gz", kineto_gz)] if kineto_gz else [])
    if nsys is not None:
        inputs_timed.insert(0, ("nsys", nsys))
    if args.profile:
        for _, p in inputs_timed:
            print(f"--- cProfile: {p.name}\n{profile_advisor(p)}", flush=True)

    advisor = [sys.executable, "-m", "advisor.cli", "diagnose", "--json"]
    results: dict[tuple[str, str], dict] = {}
    for inp, path in inputs_timed:
        print(f"advisor diagnose {path.name}", flush=True)
        results[("advisor", inp)] = measure(f"advisor {inp}", [*advisor, str(path)], args.runs)
    for spec in args.compare:
        src, _, label = spec.partition("=")
        src_path = Path(src).resolve()
        for inp, path in inputs_timed:
            print(f"advisor {label} diagnose {path.name}", flush=True)
            results[(f"advisor {label}", inp)] = measure(f"advisor {label} {inp}", [*advisor, str(path)], args.runs, src_path)
    hta_ok = kineto is not None and not args.no_hta and subprocess.run([args.hta_python, "-c", "import hta"], capture_output=True).returncode == 0
    if hta_ok:
        print(f"HTA on {kineto.parent}", flush=True)
        results[("hta", "kineto")] = measure("hta kineto", [args.hta_python, "-c", HTA_SNIPPET, str(kineto.parent)], args.runs)
    elif not args.no_hta:
        print("HolisticTraceAnalysis not importable: skipped (pip install HolisticTraceAnalysis)", flush=True)

    inputs = {"kineto_events": args.events, "kineto_mib": kineto.stat().st_size / 2**20} if kineto else {}
    if kineto_gz is not None:
        inputs["kineto_gz_mib"] = kineto_gz.stat().st_size / 2**20
    if nsys is not None:
        conn = sqlite3.connect(f"file:{nsys}?mode=ro", uri=True)
        n_nvtx = conn.execute("SELECT count(*) FROM NVTX_EVENTS").fetchone()[0]
        conn.close()
        inputs.update(nsys_kernels=args.kernels, nsys_mib=nsys.stat().st_size / 2**20, nsys_nvtx=n_nvtx)
    mach, date, vers = machine(), _dt.date.today().isoformat(), versions()
    if hta_ok and vers.get("hta") in (None, "not installed"):  # HTA lives in another interpreter
        probe = subprocess.run([args.hta_python, "-c", "import importlib.metadata as m; print(m.version('HolisticTraceAnalysis'))"],
                               capture_output=True, text=True)
        vers["hta"] = probe.stdout.strip() or vers.get("hta")
    rows = []
    for (tool, inp), r in results.items():
        size = {"nsys": f"{args.kernels} kernels", "kineto": f"{args.events} events", "kineto.gz": f"{args.events} events"}[inp]
        base = {"bench": "scale", "tool": tool, "input": f"{inp} ({size})", "runs": r["runs"], "machine": mach, "date": date}
        rows += [dict(base, metric="wall_median", value=round(r["wall_s"], 3), unit="s"),
                 dict(base, metric="wall_min", value=round(r["wall_s_min"], 3), unit="s"),
                 dict(base, metric="wall_max", value=round(r["wall_s_max"], 3), unit="s"),
                 dict(base, metric="cpu_median", value=round(r["cpu_s"], 3), unit="s"),
                 dict(base, metric="peak_rss_median", value=round(r["peak_rss_mib"], 1), unit="MiB"),
                 dict(base, metric="load_avg_1min_before_runs", value=round(r["load_1min"], 2), unit="")]
    for r in rows:
        print(",".join(str(r[c]) for c in COLUMNS))
    if not args.no_write:
        write_rows(rows, mach, args.results)
        write_markdown(results, inputs, mach, date, vers, args.runs, args.markdown, args.results, args.block)
        print(f"wrote {args.results} and {args.markdown}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
