"""Decode attention on the H200: our split-KV kernel against torch SDPA's backends, one run.

    python3 bench/bench_split_kv.py [--batches 1,2,4,8] [--contexts 8192,32768,131072]
                                    [--tune-s 150] [--trace] [--out DIR]
    python3 bench/bench_split_kv.py --sweep [--time-limit-s 330] [--out DIR]
    python3 bench/bench_split_kv.py --apply-table DIR/split_kv_table.json   (no GPU: new defaults)
    TRITON_INTERPRET=1 python3 bench/bench_split_kv.py --device cpu --tiny [--sweep]  (smoke test)

Per shape (bf16, 32 query heads, 8 kv heads, head_dim 128, one query token): the library's
default call (`split_kv`: decode_attention without a config, which runs kernels/split_kv_gluon.py
under Triton >= 3.9 on sm_90, else the Triton kernel's default config; `split_kv_triton` is the
latter where the former ran), the best Triton config of the search space within the tuning budget
(`split_kv_tuned`), and torch SDPA pinned to its flash, cuDNN and memory-efficient backends
(the last refuses GQA: recorded as refused), and `stream_read`, a kernel that only reads K and
V (the measured floor of one launch). Each provider is first checked against SDPA's
math backend in fp32 (relative Frobenius error, bf16 tolerance 1e-2) into a NaN-poisoned
output, then timed by CUDA-graph replays: one graph holds one call on each of several K/V sets
(at least 3x the L2 in all, so the L2 does not serve them), replayed 30 times; p20/p50/p80
are over the replays, per call. The HBM floor is K and V read once at 4.27 TB/s (the H200's
measured device copy); the tables also give the best read rate any provider reached.

--sweep: the same shapes plus two hold-outs (B3 S20000; 28 query / 4 kv heads at S48000),
all resident at once, and for each a coordinate search over kernels/split_kv_tuning.py's
candidates: stage A the load path and pipeline (tile keys, stages, warps, TMA) at 2 programs
an SM with the two-kernel combine, candidate-major over the shapes (each kernel compiles
once); stage B, for each shape's 4 best structures, the combine (last arriver or second
kernel, launched plainly or behind the split kernel by programmatic dependent launch) x
programs per SM (1-8). Then
the winners of the grid shapes become a new table (split_kv_table.json, for --apply-table),
and its default config is measured on every shape (`split_kv_table`: on the hold-outs it is
the rule's generalisation). --time-limit-s bounds the whole run (stage A to 45% of it, stage
B to 85%); a cut leaves fewer candidates, never a shape without SDPA and our default.

Writes into --out (default $OUT, else bench/results/split_kv): split_kv.csv (long format:
kernel, provider, config, metric, unit, shape, p50, p20, p80, gpu, timestamp, version),
split_kv.md (the table, x the floor and the speedups against the issue's targets), and with
--trace Kineto traces of single decode steps (trace_<backend>.json.gz: SDPA flash with GQA at
32k, SDPA memory-efficient with 8 heads at 32k, cuDNN at 32k, ours at 32k) for the
decode_attention_unsplit rule. --sweep writes split_kv_sweep.csv (every config timed),
split_kv_sweep.md (per shape the best, our default, SDPA, the floor; the knobs' marginal
costs) and split_kv_table.json. The default run takes 3-4 minutes on one H200, --sweep at
most --time-limit-s plus the set-up (about a minute).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

if "--tiny" in sys.argv or ("--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1:][:1] == ["cpu"]):
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
from graph_timing import REPLAYS, quantiles, time_graph  # noqa: E402

from advisor.codegen.kernel_lib import load  # noqa: E402

kv = load("split_kv_attention")
common = load("common")

HBM_BYTES_PER_S = 4.27e12  # H200 device-to-device copy, measured (DESIGN.md)
COLUMNS = ["kernel", "provider", "config", "metric", "unit", "shape", "p50", "p20", "p80", "gpu", "timestamp", "version"]


def shape_name(B, Hq, Hkv, D, S):
    return f"B{B}_Hq{Hq}_Hkv{Hkv}_D{D}_S{S}"


def sdpa(backend):
    import torch.nn.functional as F

    def call(q, k, v):
        if backend is None:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])
        from torch.nn.attention import sdpa_kernel

        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=q.shape[1] != k.shape[1])

    return call


def providers(device):
    """name -> fn(q, k, v) -> out; SDPA's GPU backends only where there is a GPU."""
    out = {}
    if device == "cuda":
        from torch.nn.attention import SDPBackend

        for name, b in (("sdpa_flash", SDPBackend.FLASH_ATTENTION), ("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION),
                        ("sdpa_efficient", SDPBackend.EFFICIENT_ATTENTION)):
            out[name] = sdpa(b)
    else:
        out["sdpa_default"] = sdpa(None)
    return out


def reference(q, k, v, device):
    """fp32 SDPA math on the device (fp64 softmax on the CPU for the smoke test)."""
    if device == "cpu":
        return kv.reference(q, k, v)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return sdpa(None)(q.float(), k.float(), v.float()).double()


def random_inputs(B, Hq, Hkv, S, D, dtype, device, seed):
    """Normal q, k, v drawn on the device (the CPU generator would spend a minute on the 4 GB
    K and V of batch 8 at 128k keys)."""
    g = torch.Generator(device=device).manual_seed(seed)
    return tuple(torch.randn(shape, generator=g, device=device, dtype=torch.float32).to(dtype)
                 for shape in ((B, Hq, 1, D), (B, Hkv, S, D), (B, Hkv, S, D)))


def time_eager(fn, sets):
    """Fallback for a provider that cannot be captured in a CUDA graph: per-call CUDA events
    around eager calls (includes any host-side gaps the call makes on the GPU)."""
    for i in range(sets):
        fn(i)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPLAYS)]
    for j, (start, end) in enumerate(events):
        start.record()
        fn(j % sets)
        end.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) * 1e3 for s, e in events)


def time_cpu(fn, sets, reps=2):
    times = []
    for r in range(reps):
        t0 = time.perf_counter()
        fn(r % sets)
        times.append((time.perf_counter() - t0) * 1e6)
    return sorted(times)


def prepare(B, Hq, Hkv, D, S, dtype, device):
    """One shape's problem: K/V sets (>= 3x the L2 in all on the GPU), the reference of set 0,
    the HBM floor, a shared output buffer."""
    elt = torch.empty((), dtype=dtype).element_size()
    kv_bytes = 2 * B * Hkv * S * D * elt
    sets = max(2, min(16, math.ceil(3 * (60 << 20) / kv_bytes))) if device == "cuda" else 2
    inputs = [random_inputs(B, Hq, Hkv, S, D, dtype, device, seed=11 + i) for i in range(sets)]
    return dict(name=shape_name(B, Hq, Hkv, D, S), dims=(B, Hq, Hkv, D, S), dtype=dtype, device=device, sets=sets,
                inputs=inputs, ref=reference(*inputs[0], device), kv_bytes=kv_bytes,
                floor_us=kv_bytes / HBM_BYTES_PER_S * 1e6, out=torch.empty_like(inputs[0][0]))


def ours(sh, config):
    """fn(q, k, v) running our kernel with `config` into the shape's output buffer."""
    return lambda q, k, v: kv.decode_attention(q, k, v, config, out=sh["out"])


def measure(sh, pname, fn, rows, log, config_text="", quiet=False):
    """Check fn on set 0 (into the NaN-poisoned output buffer), then time it over the sets;
    append long-format rows; return the p50 in microseconds, or None when it was refused or
    wrong (recorded as a status row)."""
    device, name = sh["device"], sh["name"]
    tol = kv.TOLERANCE[sh["dtype"]]
    base = dict(kernel="decode_attention", provider=pname, config=config_text, shape=name)
    try:
        common.poison_(sh["out"])
        got = fn(*sh["inputs"][0]).clone()
        err = kv.rel_error(got, sh["ref"])
        if not err <= tol:
            raise AssertionError(f"rel. error {err:.2e} > {tol:.0e}")
        how = "graph" if device == "cuda" else "cpu"
        timer = time_graph if device == "cuda" else time_cpu
        try:
            times = timer(lambda i: fn(*sh["inputs"][i]), sh["sets"])
        except RuntimeError as exc:  # not capturable: eager calls timed by events
            if device != "cuda":
                raise
            torch.cuda.synchronize()
            log(f"  {pname:<15} not capturable ({str(exc).splitlines()[0][:100]}): eager timing")
            times, how = time_eager(lambda i: fn(*sh["inputs"][i]), sh["sets"]), "eager"
    except Exception as exc:  # a refused backend (efficient + GQA), a failed launch, a wrong result
        if device == "cuda":
            torch.cuda.synchronize()
        common.SCRATCH.clear()  # a failed last-arriver launch may have left its counters dirty
        why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:150] if str(exc) else ''}"
        log(f"  {pname:<15} refused/failed: {why} {config_text}")
        rows.append(dict(base, metric="status", unit=why, p50=None, p20=None, p80=None))
        return None
    p50, p20, p80 = quantiles(times)
    if not quiet:
        log(f"  {pname:<15} {p50:9.1f} us  x{p50 / sh['floor_us']:.2f} floor  err {err:.1e} {config_text}")
    rows.append(dict(base, metric="time", unit="us", p50=p50, p20=p20, p80=p80))
    rows.append(dict(base, metric="rel_err", unit="", p50=err, p20=err, p80=err))
    rows.append(dict(base, metric="timer", unit=how, p50=None, p20=None, p80=None))
    return p50


def _read_kernel():
    """A Triton kernel that only streams K and V (a sum per program): the time one launch needs
    to read this shape's bytes, launch, ramp and tail included. Built on first use."""
    import triton
    import triton.language as tl

    @triton.jit
    def stream_read(k_ptr, v_ptr, part_ptr, n, chunk, BLOCK: tl.constexpr):
        pid = tl.program_id(0)
        start = pid.to(tl.int64) * chunk
        end = tl.minimum(start + chunk, n)
        acc = tl.zeros([BLOCK], tl.float32)
        for off in range(start, end, BLOCK):
            idx = off + tl.arange(0, BLOCK)
            m = idx < end
            acc += tl.load(k_ptr + idx, mask=m, other=0.0).to(tl.float32)
            acc += tl.load(v_ptr + idx, mask=m, other=0.0).to(tl.float32)
        tl.store(part_ptr + pid, tl.sum(acc, 0))

    return stream_read


READ_CONFIGS = [(per_sm, block, warps) for per_sm in (2, 4, 8) for block, warps in ((4096, 8), (8192, 16))]


def measure_read_floor(sh, rows, log, sms):
    """The measured floor: the fastest of READ_CONFIGS streaming this shape's K and V once (one
    launch per call, timed like the providers), checked against torch's sum. A kernel that must
    also read Q, compute and write O cannot beat it."""
    kern = _read_kernel()
    k0, v0 = sh["inputs"][0][1:]
    n = k0.numel()
    want = (k0.double().sum() + v0.double().sum()).item()
    scale = (k0.double().abs().sum() + v0.double().abs().sum()).item()
    best = None
    for per_sm, block, warps in READ_CONFIGS:
        progs = per_sm * sms
        chunk = -(-n // progs // block) * block  # whole blocks a program, the last may be short
        progs = -(-n // chunk)
        part = torch.full((progs,), float("nan"), device="cuda", dtype=torch.float32)

        def call(i, part=part, chunk=chunk, progs=progs, block=block, warps=warps):
            _, k, v = sh["inputs"][i]
            kern[(progs,)](k, v, part, n, chunk, BLOCK=block, num_warps=warps)

        call(0)
        got = part.double().sum().item()
        if not abs(got - want) <= 1e-4 * scale:
            log(f"  stream_read     wrong sum ({got} vs {want}) at {per_sm}/SM BLOCK {block}")
            continue
        times = time_graph(call, sh["sets"])
        p50, p20, p80 = quantiles(times)
        if best is None or p50 < best[0]:
            best = (p50, p20, p80, f"{per_sm} programs/SM BLOCK={block} warps={warps}")
    if best is None:
        return None
    p50, p20, p80, cfg = best
    log(f"  {'stream_read':<15} {p50:9.1f} us  x{p50 / sh['floor_us']:.2f} floor  "
        f"({sh['kv_bytes'] / p50 / 1e6:.2f} TB/s) {cfg}")
    rows.append(dict(kernel="decode_attention", provider="stream_read", config=cfg, metric="time", unit="us",
                     shape=sh["name"], p50=p50, p20=p20, p80=p80))
    return p50


def floor_row(sh):
    f = sh["floor_us"]
    return dict(kernel="decode_attention", provider="hbm_floor", config="", metric="time", unit="us",
                shape=sh["name"], p50=f, p20=f, p80=f)


def settle(fn, sh, least=3, most=5, agree=0.02):
    """Discard CUDA-graph timings of fn, at least `least`, then until the last two agree within
    `agree` (at most `most`; GPU only); return their p50s. A shape's first graph timings ran
    up to 14% slow on every replay (1083 against 949 us at batch 8 / 128k keys, clocks at 1980 MHz
    throughout), sometimes two in a row that agreed with each other (1083.3, 1082.9; the next
    948.9), so agreement alone does not end it (bench/probe_first_timing.py, docs/split_kv.md)."""
    if sh["device"] != "cuda":
        return []
    seen = []
    try:
        fn(*sh["inputs"][0])  # a first call may compile: outside the graph
        while len(seen) < most:
            seen.append(quantiles(time_graph(lambda i: fn(*sh["inputs"][i]), sh["sets"]))[0])
            if len(seen) >= least and abs(seen[-1] - seen[-2]) <= agree * min(seen[-2:]):
                break
    except Exception:  # noqa: BLE001  (a failing call is measure()'s to record)
        try:
            torch.cuda.synchronize()
        except Exception:  # noqa: BLE001  (a sticky CUDA error: measure() reports it)
            pass
    return seen


def bench_shape(B, Hq, Hkv, D, S, dtype, device, tune_s, log, sms):
    """Rows (dicts without gpu/timestamp/version) for one shape, and the tuned config."""
    sh = prepare(B, Hq, Hkv, D, S, dtype, device)
    rows = [floor_row(sh)]
    default = kv.default_config(B, Hq, Hkv, 1, S, D, dtype, sms)
    # one untimed call each of ours and SDPA (compiles, workspaces), then one discarded graph
    # timing (settle): the first graph timing of a shape ran up to 14% slow
    for fn in (ours(sh, default), *providers(device).values()):
        try:
            fn(*sh["inputs"][0])
        except Exception:  # a refused backend is recorded by measure() below
            pass
    settled = settle(ours(sh, None), sh)
    if settled:
        log(f"  settle: {len(settled)} discarded graph timings, p50 " + ", ".join(f"{t:.1f}" for t in settled) + " us")
    # split_kv: the library's default call (config=None), which runs kernels/split_kv_gluon.py
    # where it can (Triton >= 3.9, sm_90); then the Triton kernel's default config beside it
    fast = device == "cuda" and load("split_kv_gluon").supports(*sh["inputs"][0]) is None
    p50 = measure(sh, "split_kv", ours(sh, None), rows, log, "gluon ring" if fast else default.describe())
    if fast:
        p50 = measure(sh, "split_kv_triton", ours(sh, default), rows, log, default.describe())
    best = (p50, default)
    deadline = time.monotonic() + tune_s
    space = kv.search_space(B, Hq, Hkv, 1, S, D, dtype, sms)[1:] if tune_s > 0 else []
    scratch = []
    for config in space:
        if time.monotonic() > deadline:
            break
        p50 = measure(sh, "candidate", ours(sh, config), scratch, log, config.describe(), quiet=True)
        if p50 is not None and (best[0] is None or p50 < best[0]):
            best = (p50, config)
    if tune_s > 0:
        measure(sh, "split_kv_tuned", ours(sh, best[1]), rows, log, best[1].describe())
    for pname, fn in providers(device).items():
        measure(sh, pname, fn, rows, log)
    if device == "cuda":
        measure_read_floor(sh, rows, log, sms)
        # the default once more, last: `split_kv_again` shows what the order costs
        measure(sh, "split_kv_again", ours(sh, None), rows, log, "gluon ring" if fast else default.describe())
    return rows, best[1]


def table(rows, tuned):
    """Markdown: per shape, each provider's p50, x the floor, and ours against SDPA."""
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    provs = list(dict.fromkeys(r["provider"] for r in rows if r["metric"] == "time" and r["provider"] != "hbm_floor"))
    t = {(r["shape"], r["provider"]): r["p50"] for r in rows if r["metric"] == "time"}
    head = ["shape", "HBM floor"] + provs + ["ours / floor", "ours / stream read", "best SDPA / ours", "flash / ours",
                                             "best SDPA / default", "tuned config"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    verdicts = []
    for s in shapes:
        floor = t.get((s, "hbm_floor"))
        ours = min([t[(s, p)] for p in ("split_kv", "split_kv_tuned", "split_kv_again") if (s, p) in t] or [math.nan])
        sd = [t[(s, p)] for p in provs if p.startswith("sdpa_") and (s, p) in t]
        best_sdpa = min(sd) if sd else math.nan
        flash = t.get((s, "sdpa_flash"), math.nan)
        cells = [s, f"{floor:.1f}"] + [f"{t[(s, p)]:.1f}" if (s, p) in t else "refused" for p in provs]
        read = t.get((s, "stream_read"), math.nan)
        default = t.get((s, "split_kv"), math.nan)
        cells += [f"{ours / floor:.2f}x", f"{ours / read:.2f}x", f"{best_sdpa / ours:.2f}x", f"{flash / ours:.2f}x",
                  f"{best_sdpa / default:.2f}x", tuned.get(s, "")]
        lines.append("| " + " | ".join(cells) + " |")
        verdicts.append((s, ours / floor, best_sdpa / ours, flash / ours, best_sdpa / default))
    # a shape where ours did not run (nan) fails every target: a missing number is not a pass
    ok_sdpa = bool(verdicts) and all(v[2] >= 1.0 for v in verdicts)
    ok_floor = bool(verdicts) and all(v[1] <= 1.2 for v in verdicts)
    ok_default = bool(verdicts) and all(v[4] >= 1.0 for v in verdicts)
    lines += ["", "Times are p50 microseconds per call (CUDA-graph replays, fresh K/V sets); ours = the fastest of "
              "split_kv, split_kv_tuned and split_kv_again (the default timed again after SDPA); split_kv is the "
              "library's default call (config=None: kernels/split_kv_gluon.py where Triton >= 3.9 and sm_90 allow it, "
              "else the Triton kernel's default config, which split_kv_triton times beside it), split_kv_tuned the "
              f"best Triton config found. The default alone >= 1.0x the best SDPA backend on every shape: "
              f"{'yes' if ok_default else 'no'}.",
              f"Targets (issue 36): >= 1.0x the best SDPA backend on every shape: {'met' if ok_sdpa else 'NOT met'}; "
              f"within 1.2x of the HBM floor: {'met' if ok_floor else 'NOT met'}; >= 1.4x the flash backend where its "
              "grid under-fills: see the flash / ours column.",
              "stream_read: a Triton kernel that only reads K and V once (one launch a call, same timing), the "
              "fastest of a few grids: what any single-launch kernel reading these bytes needs."]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------
# --sweep
# ---------------------------------------------------------------------------------------------

tuning = load("split_kv_tuning")
SWEEP_HOLDOUTS = [(3, 32, 8, 128, 20000), (2, 28, 4, 128, 48000)]  # not in the table: the rule's test
TOP_STRUCTURES = 4  # stage B explores this many of a shape's fastest stage-A structures
TINY_SHAPES = [(1, 8, 2, 32, 300), (2, 4, 2, 32, 600)]
TINY_SWEEP = [(1, 8, 2, 32, 800), (2, 4, 2, 32, 1040)]  # >= 3 chunks of 256 keys: the split paths run
TINY_HOLDOUTS = [(1, 7, 1, 32, 600)]


def sweep(shapes, holdouts, dtype, device, sms, time_limit_s, log, max_candidates=None, skip=frozenset()):
    """Rows of every measurement and the new table (module docstring, --sweep); `skip` names
    boolean knobs ("tma", "pdl") held False."""
    t0 = time.monotonic()

    def left():
        return time_limit_s - (time.monotonic() - t0)

    probs = [prepare(*dims, dtype, device) for dims in shapes + holdouts]
    for sh in probs:
        sh["holdout"] = sh["dims"] in holdouts
        B, Hq, Hkv, D, S = sh["dims"]
        sh["units"] = kv.work_units(B, Hq, Hkv, 1)
        sh["results"] = []  # (p50, knobs dict with programs_per_sm, Config)
    log(f"set up {len(probs)} shapes in {time.monotonic() - t0:.0f} s")
    rows = [floor_row(sh) for sh in probs]
    for sh in probs:  # the references: SDPA and our current default, whatever the budget
        log(sh["name"])
        B, Hq, Hkv, D, S = sh["dims"]
        default = kv.default_config(B, Hq, Hkv, 1, S, D, dtype, sms)
        settle(ours(sh, default), sh)
        measure(sh, "split_kv", ours(sh, default), rows, log, default.describe())
        for pname, fn in providers(device).items():
            measure(sh, pname, fn, rows, log)

    def run(sh, knobs, stage):
        B, Hq, Hkv, D, S = sh["dims"]
        cfg = kv.Config(**tuning.candidate_knobs(sh["units"], S, sms, knobs))
        if any(c == cfg for _, _, c in sh["results"]):
            return
        p50 = measure(sh, f"sweep_{stage}", ours(sh, cfg), rows, log, describe(cfg, knobs), quiet=True)
        if p50 is not None:
            sh["results"].append((p50, knobs, cfg))

    elt = torch.empty((), dtype=dtype).element_size()
    structures = [s for s in tuning.structure_candidates(probs[0]["dims"][3], elt)
                  if not any(s[k] for k in skip)][:max_candidates]
    for i, knobs in enumerate(structures):  # stage A, candidate-major: one compile per kernel
        if left() < 0.55 * time_limit_s:
            log(f"stage A cut after {i} of {len(structures)} structures (time limit)")
            break
        for sh in probs:
            run(sh, knobs, "A")
        log(f"stage A {i + 1}/{len(structures)} {describe_knobs(knobs)}: "
            + " ".join(f"{min(r[0] for r in sh['results']):.1f}" for sh in probs if sh["results"]))
    queues = {}
    for sh in probs:
        top = []
        for _, knobs, _ in sorted(sh["results"], key=lambda r: r[0]):
            base = {k: knobs[k] for k in ("BLOCK_N", "num_warps", "num_stages", "tma")}
            if base not in top:
                top.append(base)
        queues[sh["name"]] = [c for c in tuning.balance_candidates(
            [dict(t, combine="kernel", pdl=False, programs_per_sm=2) for t in top[:TOP_STRUCTURES]])
            if not any(c[k] for k in skip)][:max_candidates]
    for j in range(max(map(len, queues.values()), default=0)):  # stage B, round-robin over shapes
        if left() < 0.15 * time_limit_s:
            log(f"stage B cut at candidate {j} (time limit)")
            break
        for sh in probs:
            if j < len(queues[sh["name"]]):
                run(sh, queues[sh["name"]][j], "B")
    table = [table_point(sh, sms) for sh in probs if not sh["holdout"] and sh["results"]]
    for sh in probs:  # the new table's default on every shape: re-measures the winners, tests the hold-outs
        B, Hq, Hkv, D, S = sh["dims"]
        if not table:
            break
        knobs = tuning.table_knobs(sh["units"], S, D, elt, sms, table)
        cfg = kv.Config(**knobs)
        measure(sh, "split_kv_table", ours(sh, cfg), rows, log, cfg.describe())
    log(f"sweep done in {time.monotonic() - t0:.0f} s")
    return rows, table


def describe(cfg, knobs):
    return f"{cfg.describe()} pps{knobs['programs_per_sm']}"


def describe_knobs(knobs):
    return (f"n{knobs['BLOCK_N']} w{knobs['num_warps']} s{knobs['num_stages']}{' tma' if knobs['tma'] else ''} "
            f"{knobs['combine']}{' pdl' if knobs['pdl'] else ''} pps{knobs['programs_per_sm']}")


def table_point(sh, sms):
    """The shape's winner as a split_kv_tuning.TABLE point (units, S, knobs, programs per SM)."""
    p50, knobs, cfg = min(sh["results"], key=lambda r: r[0])
    point = {"units": sh["units"], "S": sh["dims"][4]}
    point.update(tuning.point_knobs(knobs))
    point["programs_per_sm"] = knobs["programs_per_sm"]
    point["us"] = round(p50, 2)
    return point


def marginals(rows):
    """Per knob value: the geometric mean over shapes of (best time with that value / best time),
    from the sweep's rows (how much forcing the value costs)."""
    best, by = {}, {}
    for r in rows:
        if r["metric"] != "time" or not r["provider"].startswith("sweep_"):
            continue
        best[r["shape"]] = min(best.get(r["shape"], math.inf), r["p50"])
        words = r["config"].split()
        values = {"BLOCK_N": words[0], "warps": words[2], "stages": words[3], "combine": words[5],
                  "load": "tma" if "tma" in words else "pointer", "pdl": "pdl" if "pdl" in words else "no pdl",
                  "schedule": "stream" if "stream" in words else "split",
                  "programs/SM": words[-1]}
        for knob, value in values.items():
            key = (knob, value, r["shape"])
            by[key] = min(by.get(key, math.inf), r["p50"])
    out = {}
    for (knob, value, shape), t in by.items():
        out.setdefault((knob, value), []).append(math.log(t / best[shape]))
    return {k: (math.exp(sum(v) / len(v)), len(v)) for k, v in sorted(out.items())}


def sweep_markdown(rows, table, head):
    t = {(r["shape"], r["provider"]): r["p50"] for r in rows if r["metric"] == "time" and not r["provider"].startswith("sweep_")}
    cfgs = {(r["shape"], r["provider"]): r["config"] for r in rows if r["metric"] == "time"}
    best = {}
    for r in rows:
        if r["metric"] == "time" and r["provider"].startswith("sweep_"):
            if r["p50"] < best.get(r["shape"], (math.inf, ""))[0]:
                best[r["shape"]] = (r["p50"], r["config"])
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    lines = [head, "",
             "| shape | HBM floor | best SDPA | sdpa_flash | split_kv (old default) | sweep best | split_kv_table (new default) "
             "| table / floor | best SDPA / table | flash / table | sweep best config | new default config |",
             "|" + "---|" * 12]
    verdicts = []
    for s in shapes:
        floor = t.get((s, "hbm_floor"), math.nan)
        sd = [t[(s, p)] for p in ("sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "sdpa_default") if (s, p) in t]
        bsd = min(sd) if sd else math.nan
        flash = t.get((s, "sdpa_flash"), math.nan)
        new = t.get((s, "split_kv_table"), math.nan)
        b = best.get(s, (math.nan, ""))
        lines.append(f"| {s} | {floor:.1f} | {bsd:.1f} | {flash:.1f} | {t.get((s, 'split_kv'), math.nan):.1f} | {b[0]:.1f} | "
                     f"{new:.1f} | {new / floor:.2f}x | {bsd / new:.2f}x | {flash / new:.2f}x | {b[1]} | "
                     f"{cfgs.get((s, 'split_kv_table'), '')} |")
        verdicts.append((new / floor, bsd / new))
    rate = max(((r["shape"], r["provider"], r["p50"]) for r in rows
                if r["metric"] == "time" and r["provider"] != "hbm_floor"),
               key=lambda x: t.get((x[0], "hbm_floor"), 0) / x[2], default=None)
    lines += ["", "Times: p50 us per call (CUDA-graph replays over fresh K/V sets). HBM floor: K and V at 4.27 TB/s.",
              f"Targets (issue 36) for the new default: >= 1.0x the best SDPA backend on every shape: "
              f"{'met' if verdicts and all(v[1] >= 1.0 for v in verdicts) else 'NOT met'}; within 1.2x of the floor: "
              f"{'met' if verdicts and all(v[0] <= 1.2 for v in verdicts) else 'NOT met'}."]
    if rate:
        shape, prov, us = rate
        tbps = 4.27 * t[(shape, "hbm_floor")] / us
        lines.append(f"Best K/V read rate reached: {tbps:.2f} TB/s ({prov} on {shape}, {us:.1f} us).")
    lines += ["", "## Knob marginals (geometric mean over shapes of best-with-value / best; 1.00 = free)", "",
              "| knob | value | cost | shapes |", "|---|---|---|---|"]
    lines += [f"| {k} | {v} | {c:.3f} | {n} |" for (k, v), (c, n) in marginals(rows).items()]
    lines += ["", f"## New table ({len(table)} points; apply with `python bench/bench_split_kv.py --apply-table "
              "split_kv_table.json`)", "", "```", json.dumps(table, indent=None)[:4000], "```"]
    return "\n".join(lines) + "\n"


def apply_table(path: Path, target: Path | None = None) -> Path:
    """Write a sweep's split_kv_table.json into kernels/split_kv_tuning.py between its TABLE
    markers (the default config's source)."""
    target = target or HERE.parent / "kernels" / "split_kv_tuning.py"
    data = json.loads(Path(path).read_text())
    points = data["table"]
    if not points or not all({"units", "S", "programs_per_sm", *tuning.TABLE_KNOBS} <= set(p) for p in points):
        raise ValueError(f"{path}: no table points, or points without {sorted(tuning.TABLE_KNOBS)}")
    keep = ("units", "S", *tuning.TABLE_KNOBS, "programs_per_sm")
    body = [f"TABLE_SOURCE = {data['source']!r}", "TABLE = ["]
    body += [f"    {json.dumps({k: p[k] for k in keep}).replace('true', 'True').replace('false', 'False')}," for p in points]
    body.append("]")
    text = target.read_text()
    begin, end = text.index("# BEGIN TABLE\n") + len("# BEGIN TABLE\n"), text.index("# END TABLE")
    target.write_text(text[:begin] + "\n".join(body) + "\n" + text[end:])
    return target


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes for the CPU interpreter (smoke test)")
    p.add_argument("--batches", default="1,2,4,8")
    p.add_argument("--contexts", default="8192,32768,131072")
    p.add_argument("--tune-s", type=float, default=None,
                   help="seconds to search configs, over all shapes (default 150 on the GPU, 0 with --tiny)")
    p.add_argument("--trace", action="store_true", help="also write Kineto traces of single decode steps")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--sweep", action="store_true", help="the configuration sweep (module docstring)")
    p.add_argument("--time-limit-s", type=float, default=330.0, help="--sweep: seconds for the whole sweep")
    p.add_argument("--max-candidates", type=int, default=None, help="--sweep: candidates per stage (smoke tests)")
    p.add_argument("--no-tma", action="store_true", help="--sweep: leave TMA loads out (if they failed on this GPU)")
    p.add_argument("--no-pdl", action="store_true", help="--sweep: leave programmatic dependent launch out")
    p.add_argument("--apply-table", type=Path, default=None, metavar="JSON",
                   help="write a sweep's split_kv_table.json into kernels/split_kv_tuning.py and exit")
    args = p.parse_args(argv)
    if args.apply_table:
        try:
            print(f"wrote the table into {apply_table(args.apply_table)}")
        except (OSError, ValueError, KeyError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        p.error("no CUDA GPU: use --device cpu --tiny for the smoke test")
    out_dir = args.out or Path(os.environ.get("OUT") or HERE / "results" / "split_kv")
    out_dir.mkdir(parents=True, exist_ok=True)
    dtype = torch.bfloat16
    if args.tiny:
        common.fix_interpreter_bf16_dot()
        shapes = list(TINY_SHAPES)
    else:
        shapes = [(b, 32, 8, 128, s) for b in map(int, args.batches.split(",")) for s in map(int, args.contexts.split(","))]
    sms = kv.num_sms(device if device == "cuda" else None)
    gpu = torch.cuda.get_device_name() if device == "cuda" else "cpu (interpreter)"
    import triton

    version = f"torch {torch.__version__}; triton {triton.__version__}"
    stamp = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    rows, tuned = [], {}
    t0 = time.monotonic()
    if args.sweep:
        holdouts = TINY_HOLDOUTS if args.tiny else SWEEP_HOLDOUTS
        shapes = TINY_SWEEP if args.tiny else shapes
        rows, points = sweep(shapes, holdouts, dtype, device, sms, args.time_limit_s, lambda m: print(m, flush=True),
                             args.max_candidates, skip={k for k, off in (("tma", args.no_tma), ("pdl", args.no_pdl)) if off})
        for r in rows:
            r.update(gpu=gpu, timestamp=stamp, version=version)
        with open(out_dir / "split_kv_sweep.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows(rows)
        # the table's provenance as kernels/ may carry it (no device name or date: those are in
        # the sweep's rows and docs/split_kv.md)
        source = f"bench/bench_split_kv.py --sweep on {sms} SMs: the fastest config per shape (rows: bench/results/split_kv/)"
        (out_dir / "split_kv_table.json").write_text(json.dumps({"source": source, "sms": sms, "table": points}, indent=1))
        md = sweep_markdown(rows, points, f"# Decode attention sweep, bf16, {gpu}, {stamp}\n\n{version}; {sms} SMs")
        (out_dir / "split_kv_sweep.md").write_text(md)
        print(md)
        print(f"wrote split_kv_sweep.csv, split_kv_sweep.md, split_kv_table.json to {out_dir} in {time.monotonic() - t0:.0f} s")
        return 0
    tune_s = args.tune_s if args.tune_s is not None else (0.0 if args.tiny else 150.0)
    per_shape_tune = tune_s / max(1, len(shapes))
    for B, Hq, Hkv, D, S in shapes:
        print(f"{shape_name(B, Hq, Hkv, D, S)}  (HBM floor {2 * B * Hkv * S * D * 2 / HBM_BYTES_PER_S * 1e6:.1f} us)", flush=True)
        got, cfg = bench_shape(B, Hq, Hkv, D, S, dtype, device, per_shape_tune, lambda m: print(m, flush=True), sms)
        rows += got
        tuned[shape_name(B, Hq, Hkv, D, S)] = cfg.describe()
    for r in rows:
        r.update(gpu=gpu, timestamp=stamp, version=version)
    with open(out_dir / "split_kv.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    md = f"# Decode attention, bf16, {gpu}, {stamp}\n\n{version}; {sms} SMs\n\n" + table(rows, tuned)
    (out_dir / "split_kv.md").write_text(md)
    if args.trace and device == "cuda":
        write_traces(out_dir)
    print(md)
    print(f"wrote {out_dir / 'split_kv.csv'} and split_kv.md in {time.monotonic() - t0:.0f} s")
    return 0


def write_traces(out_dir: Path) -> None:
    """Kineto traces (record_shapes) of 20 decode steps each at 32k keys: SDPA flash with GQA
    (split + combine), SDPA memory-efficient with 8 heads (no GQA: unsplit), cuDNN, ours."""
    from torch.nn.attention import SDPBackend
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(HERE.parent / "workloads"))
    from kineto_out import export_gz

    cases = {"flash": (SDPBackend.FLASH_ATTENTION, 32), "efficient": (SDPBackend.EFFICIENT_ATTENTION, 8),
             "cudnn": (SDPBackend.CUDNN_ATTENTION, 32), "ours": (None, 32)}
    for label, (backend, hq) in cases.items():
        q, k, v = random_inputs(1, hq, 8, 32768, 128, torch.bfloat16, "cuda", seed=5)
        fn = (lambda: kv.decode_attention(q, k, v)) if backend is None else (lambda b=backend: sdpa(b)(q, k, v))
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
        print(f"trace: {export_gz(prof, out_dir / f'trace_{label}.json')}")


if __name__ == "__main__":
    sys.exit(main())
