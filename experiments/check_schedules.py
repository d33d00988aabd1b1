"""GPU check of every GEMM schedule after a change to kernels/: correct everywhere, as fast as before?

    python3 experiments/check_schedules.py                       # one H200: <= ~5 min, writes $OUT
    python3 experiments/check_schedules.py --device cpu --tiny   # smoke run on the CPU interpreter

Correctness (every row verified, none timed): each schedule's default config and a few explicit
ones (split-K's three reductions, persistent on pointer loads, Stream-K's contiguous hybrids
with both fixups and its first aligned TMA points, WS, grouped), on odd shapes (masks, 2-byte
rows, M or N of 1) and aligned ones, fp16/bf16/fp32, row-major and transposed operands. The
output is NaN-poisoned first and compared with a float64 reference at the dtype's tolerance
(kernels/common.TOLERANCE); each case is called three times (the first call records, the
next two replay: kernels/runtime.py), each call checked. A generated variant of each
strategy (advisor.codegen.generate, with its model-chosen knobs) runs its own --check too.

Speed: each schedule's default config against torch.matmul on shapes that
bench/results/h200.csv.gz also has, timed with CUDA graphs (20 calls a replay, inputs rotated past
the L2, median of 15 replays) and with triton.testing.do_bench (eager: host time included).
Each row carries the median that h200.csv holds for the same shape, provider and config (its
"graph" rows) and the ratio new/old, so a change shows up as a ratio away from 1.

Writes $OUT/check_schedules.csv (one row a check or timing) and $OUT/check_schedules.md (the
failures, then the timing table); exits 1 on any wrong result.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# shapes of bench/results/h200.csv.gz (suite: shape), the strategies timed there
TIMED = {
    "1664x1408x8192": ("dp", "persistent", "stream_k", "warp_specialization"),
    "2304x2304x4096": ("dp", "persistent", "stream_k", "warp_specialization"),
    "4096x4096x8192": ("dp", "persistent", "warp_specialization"),
    "256x256x131072": ("dp", "split_k", "stream_k"),
    "64x4096x14336": ("dp", "split_k", "stream_k"),
}
MODULES = {"dp": "dp_gemm", "split_k": "split_k_gemm", "persistent": "persistent_gemm", "stream_k": "stream_k_gemm",
           "warp_specialization": "ws_gemm"}


def configs(strategy: str, mod, M: int, N: int, K: int, dtype, sms: int) -> list[tuple[str, object]]:
    """(label, config) pairs checked for one schedule: None is the default (what matmul(a, b)
    runs); the explicit ones cover the other code paths."""
    out = [("default", None)]
    base = mod.default_config(M, N, K, dtype, sms)
    if strategy == "split_k":
        out += [(f"reduction={r}", replace(base, reduction=r)) for r in mod.REDUCTIONS if r != base.reduction]
    elif strategy == "persistent":
        out.append(("pointer loads", mod.on_pointer_loads(base, dtype)))
    elif strategy == "stream_k":
        for det in (True, False):
            out.append((f"hybrid2 contiguous det={det}", mod.Config(
                base.BLOCK_M, base.BLOCK_N, base.BLOCK_K, 8, base.num_warps, base.num_stages, "hybrid2", det)))
        out += [(f"search[{i}]", c) for i, c in enumerate(mod.search_space(M, N, K, dtype, sms)[:3])]
    return out


def _sizes(text: str) -> tuple[int, int, int]:
    M, N, K = (int(x) for x in text.split("x"))
    return M, N, K


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="one small odd shape, no timing (the CPU smoke run)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ROOT / "experiments" / "results")))
    ap.add_argument("--time-limit-s", type=float, default=240.0, help="start no new check after this")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ.setdefault("ADVISOR_NUM_SMS", "4")
    import torch

    from advisor.codegen.kernel_lib import load

    common = load("common")
    common.fix_interpreter_bf16_dot()
    runtime = load("runtime")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("check_schedules: no CUDA device (use --device cpu --tiny)", file=sys.stderr)
        return 2
    dev = args.device
    sms = common.num_sms(dev)
    t0 = time.monotonic()
    rows: list[dict] = []
    bad: list[str] = []
    stopped: list[str] = []  # cases left out at the time limit

    def over() -> bool:
        return time.monotonic() - t0 > args.time_limit_s

    def check(label: str, fn, a, b, dtype) -> None:
        """Three calls (record, replay, replay), each into a NaN-poisoned output."""
        ref = (a.double() @ b.double()) if dev == "cuda" else common.reference(a, b)
        tol = common.TOLERANCE[dtype]
        for call in range(3):
            out = common.poison_(torch.empty((a.shape[0], b.shape[1]), dtype=dtype, device=dev))
            try:
                got = fn(a, b, out)
            except (ValueError, RuntimeError, TypeError) as e:  # a config this shape/layout refuses
                rows.append({"kind": "check", "case": label, "call": call, "status": "refused",
                             "error": f"{type(e).__name__}: {str(e)[:200]}"})
                return
            err = common.rel_error(got, ref)
            ok = got is out and err <= tol
            rows.append({"kind": "check", "case": label, "call": call, "status": "ok" if ok else "WRONG",
                         "rel_err": err, "tolerance": tol})
            if not ok:
                bad.append(f"{label} call {call}: rel_err {err:.3e} (tolerance {tol:.0e}), returned out: {got is out}")

    # ---- speed first (its time is fixed): default configs against torch.matmul, h200.csv's shapes
    if not args.tiny:
        rows += timings(load, common, torch, sms)

    # ---- correctness: each default config on odd shapes in every dtype and layout; the explicit
    # configs in bf16 (row-major and a transposed A); aligned shapes in bf16 (compiles dominate
    # the run's time: each shape, dtype and layout is a new specialization)
    odd = [(37, 53, 97)] if args.tiny else [(37, 53, 97), (4097, 33, 4095)]
    edge = [] if args.tiny else [(1, 4096, 1000), (130, 70, 300)]  # M of 1; both tiny tiles' masks
    aligned = [] if args.tiny else [(1664, 1408, 1024), (256, 256, 16384)]
    dtypes = (torch.bfloat16, torch.float16, torch.float32)
    layouts = ((False, False), (True, False), (False, True))
    replays_before = runtime.REPLAYS.replayed
    for strategy, modname in MODULES.items():
        mod = load(modname)
        for (M, N, K) in odd + edge + aligned:
            for dtype in dtypes if (M, N, K) in odd else (torch.bfloat16,):
                for name, cfg in configs(strategy, mod, M, N, K, dtype, sms):
                    default = cfg is None
                    if (args.tiny and name.startswith("search")) or (not default and dtype != torch.bfloat16):
                        continue
                    for ta, tb in layouts if (default and (M, N, K) in odd) else layouts[:2] if (M, N, K) in odd else layouts[:1]:
                        label = f"{strategy} {name} {M}x{N}x{K} {str(dtype)[6:]} ta={ta:d} tb={tb:d}"
                        if over():  # not reached: listed, not a failure
                            stopped.append(label)
                            continue
                        a, b = common.random_inputs(M, N, K, dtype, dev, transpose_a=ta, transpose_b=tb, seed=M + N + K)
                        check(label, lambda a, b, out, mod=mod, cfg=cfg: mod.matmul(a, b, cfg, out=out), a, b, dtype)
    # grouped: one launch over odd and aligned members
    gg = load("grouped_gemm")
    sizes = [(37, 53, 97), (64, 128, 256), (130, 70, 300)] if args.tiny else \
        [(37, 53, 97), (64, 128, 256), (130, 70, 300), (512, 384, 640), (1, 200, 129), (300, 1, 77)] * 4
    for dtype in dtypes:
        As, Bs = gg.random_group(sizes, dtype, dev, seed=3)
        plan = gg.prepare(As, Bs)
        for c in plan.outs:
            common.poison_(c)
        try:
            outs = gg.grouped_matmul(As, Bs, plan=plan)
            gg.check_outputs(As, Bs, outs)
            rows.append({"kind": "check", "case": f"grouped default {len(sizes)} GEMMs {str(dtype)[6:]}", "status": "ok"})
        except AssertionError as e:
            bad.append(f"grouped {str(dtype)[6:]}: {e}")
            rows.append({"kind": "check", "case": f"grouped {str(dtype)[6:]}", "status": "WRONG", "error": str(e)[:200]})
    rows.append({"kind": "replays", "case": "calls replayed during the checks",
                 "status": str(runtime.REPLAYS.replayed - replays_before)})

    # ---- generated variants: each strategy's file, its own --check (model-chosen knobs)
    import importlib.util
    import tempfile

    from advisor.codegen.generate import generate

    with tempfile.TemporaryDirectory() as tmp:
        for strategy in MODULES:
            M, N, K = (70, 48, 96) if args.tiny else (1664, 1408, 8192)
            path = Path(tmp) / f"v_{strategy}.py"
            generate(strategy, M, N, K, "bf16", path=path)
            spec = importlib.util.spec_from_file_location(f"v_{strategy}", path)
            v = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = v  # its dataclasses look their module up there
            spec.loader.exec_module(v)
            for shape in ((M, N, K), (37, 53, 97)):
                try:
                    res = v.run_check(*shape, "bf16")
                    rows.append({"kind": "variant", "case": f"variant {strategy} {shape}", "status": "ok",
                                 "rel_err": res["rel_err"], "lines": len(path.read_text().splitlines())})
                except (AssertionError, ValueError, RuntimeError) as e:
                    bad.append(f"variant {strategy} {shape}: {e}")
                    rows.append({"kind": "variant", "case": f"variant {strategy} {shape}", "status": "WRONG",
                                 "error": str(e)[:200]})

    args.out.mkdir(parents=True, exist_ok=True)
    keys = ["kind", "case", "call", "status", "rel_err", "tolerance", "error", "lines", "shape", "provider", "config",
            "graph_us", "do_bench_us", "h200_graph_us", "ratio_vs_h200", "vs_torch_matmul"]
    with open(args.out / "check_schedules.csv", "w", newline="") as f:
        w = csv.DictWriter(f, keys)
        w.writeheader()
        w.writerows(rows)
    md = [f"# check_schedules ({'tiny, ' if args.tiny else ''}{dev}, {time.monotonic() - t0:.0f} s)", "",
          f"{sum(r['status'] == 'ok' for r in rows if r['kind'] != 'time')} checks ok, {len(bad)} failures, "
          f"{sum(r['status'] == 'refused' for r in rows)} refused configs (listed in the CSV), "
          f"{len(stopped)} cases not reached in --time-limit-s {args.time_limit_s:.0f}"
          + (f" (from {stopped[0]})" if stopped else ""), ""]
    md += [f"- FAIL {b}" for b in bad]
    timed = [r for r in rows if r["kind"] == "time"]
    if timed:
        md += ["", "| shape | provider | graph us | do_bench us | h200.csv graph us | new/old | x torch.matmul |",
               "| --- | --- | --- | --- | --- | --- | --- |"]
        md += [f"| {r['shape']} | {r['provider']} | {r['graph_us']:.1f} | {r['do_bench_us']:.1f} | "
               f"{r['h200_graph_us'] if r['h200_graph_us'] is None else round(r['h200_graph_us'], 1)} | "
               f"{r['ratio_vs_h200'] if r['ratio_vs_h200'] is None else round(r['ratio_vs_h200'], 3)} | "
               f"{r['vs_torch_matmul']:.3f} |" for r in timed]
    (args.out / "check_schedules.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 1 if bad else 0


def timings(load, common, torch, sms) -> list[dict]:
    """Graph and do_bench medians of each default config and torch.matmul, with h200.csv's."""
    import triton.testing

    old = _h200_rows()
    out = []
    for shape, strategies in TIMED.items():
        M, N, K = _sizes(shape)
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        sets = max(2, min(8, math.ceil(3 * l2 / (2 * (M * K + K * N)))))
        inputs = [common.random_inputs(M, N, K, torch.bfloat16, "cuda", seed=i) for i in range(sets)]
        c = torch.empty((M, N), dtype=torch.bfloat16, device="cuda")
        providers = {"torch.matmul": (None, lambda a, b: torch.matmul(a, b, out=c))}
        for s in strategies:
            mod = load(MODULES[s])
            cfg = mod.default_config(M, N, K, torch.bfloat16, sms)
            providers[s] = (cfg, lambda a, b, mod=mod: mod.matmul(a, b, out=c))  # matmul(a, b): the default
        base = None
        for name, (cfg, fn) in providers.items():
            graph_us, bench_us = _graph_us(torch, fn, inputs), _do_bench_us(triton.testing, fn, inputs)
            base = graph_us if name == "torch.matmul" else base
            key = json.dumps(asdict(cfg), sort_keys=True, default=str) if cfg is not None else ""
            h = old.get((shape, name, key))
            out.append({"kind": "time", "case": f"{name} {shape}", "status": "ok", "shape": shape, "provider": name,
                        "config": key, "graph_us": graph_us, "do_bench_us": bench_us, "h200_graph_us": h,
                        "ratio_vs_h200": graph_us / h if h else None, "vs_torch_matmul": base / graph_us})
    return out


def _graph_us(torch, fn, inputs, calls: int = 20, replays: int = 15) -> float:
    for a, b in inputs:  # compile, record the replays, warm up
        fn(a, b)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(*inputs[0])
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for i in range(calls):
            fn(*inputs[i % len(inputs)])
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(times)[len(times) // 2]


def _do_bench_us(testing, fn, inputs) -> float:
    state = {"i": 0}

    def step():
        a, b = inputs[state["i"] % len(inputs)]
        state["i"] += 1
        fn(a, b)

    return testing.do_bench(step, warmup=25, rep=100, return_mode="median") * 1e3


def _h200_rows() -> dict:
    """(shape, provider, config json) -> median of h200.csv's bf16 "graph" medians."""
    from advisor.run.bench.rows import open_text

    path = ROOT / "bench" / "results" / "h200.csv.gz"
    found: dict[tuple, list[float]] = {}
    with open_text(path) as f:
        for r in csv.DictReader(f):
            if r["dtype"] == "bf16" and r["status"] == "ok" and r["timer"] == "graph" and r["median_us"]:
                found.setdefault((r["shape"], r["provider"], r["config"]), []).append(float(r["median_us"]))
    return {k: sorted(v)[len(v) // 2] for k, v in found.items()}


if __name__ == "__main__":
    sys.exit(main())
