"""Verify and time cluster_gemm (kernels/gluon_gemm.py, Gluon, Triton >= 3.9) beside cuBLAS and
our Triton schedules, on one H200.

    python3 bench/bench_cluster_gemm.py [--quick] [--out DIR] [--time-limit-s 400]

Needs Triton >= 3.9 on the path (the GPU machine: the .triton-next carry, see
docs/schedules/cluster_gemm.md for the command). Our Stream-K and persistent schedules
(written for Triton 3.6) run in the same process under 3.9, as the `triton` column records.

1. verify, in --verify-procs child processes at once, each a shard of the configs (they compile
   in parallel; a deadlocked cluster kernel would hang the GPU run, so the parent kills a child
   that stops reporting for --hang-s seconds, records the config it was running as "hang" and
   restarts the shard without it), within half of --time-limit-s: every cluster config
   (data-parallel and Stream-K / split-K) on odd shapes (M not a multiple of the cluster tile,
   K not a multiple of BLOCK_K, split tiles with ragged edges) and on each timed shape, output
   poisoned with NaN, against a float64 reference, within kernels/common.TOLERANCE;
2. time, in one more child, the configs that passed: per shape torch.matmul (cuBLAS), our
   stream_k and persistent default configs, and each passing cluster config, CUDA-graph replays
   (advisor.run.bench.timing.time_graph) rotating among input sets larger than twice the L2.

Writes <out>/cluster_gemm.csv (long format, one row per provider/config/shape) and
<out>/cluster_gemm.md (per shape: cuBLAS time, our Triton schedules' and the best cluster
config's ratio to it, the model's pick's (kernels/gluon_gemm_configs.default_config), each
step of the design's ratio; per suite the geomean). --out defaults
to $OUT when set, else bench/results. --quick: four shapes, six configs, in < 2 minutes.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.suites import SUITES  # noqa: E402

# K % 64 != 0, M % 256 != 0; split-K under one wave (1000x1304, 200x392: 2 K steps, 33x264 on
# 64-row tiles with a ragged K), the hybrid split of a partial last wave (2176^2)
ODD_SHAPES = [(1000, 1304, 776), (200, 392, 72), (33, 264, 20000), (2176, 2176, 8200)]
QUICK_SHAPES = [("tail", (1664, 1408, 8192)), ("balanced", (4096, 4096, 8192)), ("skinny", (256, 256, 131072)),
                ("skinny", (64, 4096, 14336))]
QUICK_CONFIG_STEPS = [(128, 256, "ws_c2"), (128, 128, "ws"), (128, 128, "ws_sk"), (128, 128, "ws_c2_mc_sk"),
                      (64, 128, "ws_sk"), (64, 256, "ws_sk")]
STEP_COLUMNS = ["ws", "ws_c2", "ws_c2_mc", "ws_sk", "ws_c2_sk", "ws_c2_mc_sk"]
FIELDS = ["run_id", "suite", "shape", "M", "N", "K", "dtype", "provider", "step", "config", "model_pick", "triton",
          "status", "rel_err", "median_us", "p20_us", "p80_us", "tflops", "vs_torch", "error"]


def _step_of(cfg) -> str:
    from kernels.gluon_gemm_configs import step_of

    return step_of(cfg)


def configs_for(M: int, N: int, K: int, quick: bool) -> list:
    """The search space (the model's pick first), trimmed to a few steps with --quick."""
    from kernels import gluon_gemm as g

    space = g.search_space(M, N, K)
    if quick:
        space = [c for c in space if (c.BLOCK_M, c.BLOCK_N, _step_of(c)) in QUICK_CONFIG_STEPS]
    return space


ALL_SUITES = ("tail", "balanced", "skinny")


def plan(quick: bool, suites: str | None = None) -> list[tuple[str, tuple[int, int, int]]]:
    """(suite, shape) to time: --quick's four, else every shape of the suites named (all)."""
    want = set((suites or ",".join(ALL_SUITES)).split(","))
    if quick:
        return [(suite, s) for suite, s in QUICK_SHAPES if suite in want]
    return [(suite, s) for suite in ALL_SUITES if suite in want for s in SUITES[suite]]


# ---------------------------------------------------------------- child: verify
def child_verify(args) -> int:
    import torch

    from advisor.run.bench.verify import relative_error, tolerance
    from kernels import gluon_gemm as g

    skip = set(json.loads(args.skip or "[]"))
    shapes = (ODD_SHAPES[:3] if args.quick else ODD_SHAPES) + [s for _, s in plan(args.quick, args.suites)]
    gen = torch.Generator(device="cuda").manual_seed(0)
    dtype = torch.bfloat16
    for M, N, K in shapes:
        if time.time() > args.deadline:
            print(f"verify: deadline reached before {M}x{N}x{K}", file=sys.stderr, flush=True)
            break
        a = torch.randn((M, K), device="cuda", generator=gen).to(dtype)
        b = torch.randn((K, N), device="cuda", generator=gen).to(dtype)
        ref = a.double() @ b.double()
        for cfg in configs_for(M, N, K, args.quick):
            key = json.dumps([cfg.as_dict(), [M, N, K]])
            if json.dumps(cfg.as_dict()) in skip or hash_shard(cfg, args.shards) != args.shard:
                continue
            if time.time() > args.deadline:
                break
            print("START " + key, flush=True)
            out = torch.full((M, N), float("nan"), device="cuda", dtype=dtype)
            try:
                g.matmul(a, b, cfg, out=out)
                torch.cuda.synchronize()
                err = relative_error(out, ref)
                status = "ok" if err <= tolerance(dtype) else "wrong"
                print("DONE " + json.dumps({"key": key, "status": status, "rel_err": err}), flush=True)
            except Exception as exc:  # noqa: BLE001  (a failing config is a row, not the end of the run)
                if "illegal" in str(exc).lower() or "misaligned" in str(exc).lower():
                    print(f"{key}: {exc}", file=sys.stderr)
                    return 3  # the context is gone: the parent blames this config and restarts without it
                print("DONE " + json.dumps({"key": key, "status": "error",
                                            "error": f"{type(exc).__name__}: {exc}"[:300]}), flush=True)
    print("ALLDONE", flush=True)
    return 0


def hash_shard(cfg, shards: int) -> int:
    """A config's verify shard (stable across processes: no Python hash randomisation)."""
    return sum(json.dumps(cfg.as_dict(), sort_keys=True).encode()) % max(1, shards)


def verify_all(args, log) -> dict:
    """{config json: (status, detail)} over all verify shapes, in --verify-procs children at
    once (each compiles its share of the configs: compiling dominates the verify phase)."""
    merged: dict = {}
    lock = threading.Lock()

    def run(shard):
        part = verify_shard(args, log, shard)
        with lock:
            for k, v in part.items():
                if k not in merged or merged[k][0] == "ok":
                    merged[k] = v

    threads = [threading.Thread(target=run, args=(i,)) for i in range(args.verify_procs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return merged


def verify_shard(args, log, shard: int) -> dict:
    """{config json: (status, detail)} for one shard; restarts the child past hangs and
    faults, skipping the config that caused them."""
    results: dict[str, list] = {}
    bad: dict[str, str] = {}
    for _attempt in range(6):
        cmd = [sys.executable, __file__, "--_child", "verify", "--skip", json.dumps(sorted(bad)),
               "--shard", str(shard), "--shards", str(args.verify_procs), "--deadline", str(args.deadline),
               "--suites", args.suites]
        if args.quick:
            cmd.append("--quick")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(x.rstrip("\n")) for x in proc.stdout] + [lines.put(None)],
                         daemon=True).start()
        current = None
        finished = False
        while True:
            try:
                line = lines.get(timeout=args.hang_s)
            except queue.Empty:  # silent too long: a hung kernel
                proc.kill()
                proc.wait()
                break
            if line is None:
                proc.wait()
                break
            if line.startswith("START "):
                current = line[6:]
            elif line.startswith("DONE "):
                row = json.loads(line[5:])
                results.setdefault(json.dumps(json.loads(row["key"])[0]), []).append(row)
                current = None
            elif line == "ALLDONE":
                finished = True
        if finished:
            break
        if current is None:
            break  # died between configs: nothing to blame; stop retrying
        cfg_json = json.dumps(json.loads(current)[0])
        bad[cfg_json] = "hang" if proc.returncode == -9 else f"crash (exit {proc.returncode})"
        results.setdefault(cfg_json, []).append({"key": current, "status": bad[cfg_json]})
    out = {}
    for cfg_json, rows in results.items():
        worst = next((r for r in rows if r["status"] != "ok"), None)
        err = max((r.get("rel_err", 0.0) for r in rows if r["status"] == "ok"), default=None)
        out[cfg_json] = ("ok", err, "") if worst is None else (worst["status"], worst.get("rel_err"),
                                                                worst.get("error", json.loads(worst["key"])[1]))
    return out


# ---------------------------------------------------------------- child: time
def child_time(args) -> int:
    import torch
    import triton

    from advisor.run.bench.timing import l2_bytes, rotating, rotation_count, time_graph
    from advisor.run.bench.verify import relative_error, tolerance
    from kernels import gluon_gemm as g
    from kernels import persistent_gemm, stream_k_gemm

    passed = set(json.loads(Path(args.passed).read_text()))
    # the Stream-K configs keep a workspace per device; first use is in the eager check below,
    # before any graph capture
    deadline = time.time() + args.time_budget_s
    dtype = torch.bfloat16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    l2 = l2_bytes()
    for suite, (M, N, K) in plan(args.quick, args.suites):
        sets = rotation_count((M * K + K * N + M * N) * 2, l2)
        gen = torch.Generator(device="cuda").manual_seed(1)
        ins = [(torch.randn((M, K), device="cuda", generator=gen).to(dtype),
                torch.randn((K, N), device="cuda", generator=gen).to(dtype),
                torch.empty((M, N), device="cuda", dtype=dtype)) for _ in range(sets)]
        ref = ins[0][0].double() @ ins[0][1].double()
        providers = [("torch.matmul", "", None, lambda a, b, c: torch.matmul(a, b, out=c))]
        for name, mod in (("stream_k", stream_k_gemm), ("persistent", persistent_gemm)):
            cfg = mod.default_config(M, N, K, dtype, sms)
            providers.append((name, "", cfg, lambda a, b, c, m=mod, cf=cfg: m.matmul(a, b, cf, out=c)))
        pick = g.default_config(M, N, K, dtype, sms)
        for cfg in configs_for(M, N, K, args.quick):  # the model's pick first
            if json.dumps(cfg.as_dict()) in passed:
                providers.append(("cluster_gemm", _step_of(cfg), cfg, lambda a, b, c, cf=cfg: g.matmul(a, b, cf, out=c)))
        torch_us = None
        for provider, step, cfg, call in providers:
            row = {"suite": suite, "shape": f"{M}x{N}x{K}", "M": M, "N": N, "K": K, "dtype": "bf16",
                   "provider": provider, "step": step, "config": json.dumps(cfg.as_dict() if hasattr(cfg, "as_dict")
                                                                             else (vars(cfg) if cfg else {})),
                   "model_pick": int(provider == "cluster_gemm" and cfg == pick), "triton": triton.__version__}
            if time.time() > deadline:
                print("ROW " + json.dumps(dict(row, status="skipped", error="time limit")), flush=True)
                continue
            try:
                a, b, c = ins[0]
                c.fill_(float("nan"))
                call(a, b, c)
                err = relative_error(c, ref)
                if err > tolerance(dtype):
                    print("ROW " + json.dumps(dict(row, status="wrong", rel_err=err)), flush=True)
                    continue
                t = time_graph(rotating([lambda a=a, b=b, c=c: call(a, b, c) for a, b, c in ins]), warmup_ms=5,
                               rep_ms=25 if args.quick else 40)
                us = t.median_ms * 1e3
                if provider == "torch.matmul":
                    torch_us = us
                row.update(status="ok", rel_err=err, median_us=round(us, 2), p20_us=round(t.p20_ms * 1e3, 2),
                           p80_us=round(t.p80_ms * 1e3, 2), tflops=round(2 * M * N * K / us / 1e6, 1),
                           vs_torch=round(torch_us / us, 4) if torch_us else None)
            except Exception as exc:  # noqa: BLE001
                row.update(status="error", error=f"{type(exc).__name__}: {exc}"[:300])
            print("ROW " + json.dumps(row), flush=True)
        del ins, ref
        torch.cuda.empty_cache()
    return 0


# ---------------------------------------------------------------- report
def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def markdown(rows: list[dict]) -> str:
    ok = [r for r in rows if r.get("status") == "ok"]
    shapes = []
    for r in rows:
        if (r["suite"], r["shape"]) not in shapes:
            shapes.append((r["suite"], r["shape"]))
    steps = STEP_COLUMNS
    lines = ["| suite | shape | cuBLAS us | stream_k | persistent | best cluster | its config | model pick | "
             + " | ".join(f"best {s}" for s in steps) + " |",
             "|---|---|---:|---:|---:|---:|---|---:|" + "---:|" * len(steps)]
    per_suite: dict[str, dict[str, list]] = {}
    for suite, shape in shapes:
        rs = [r for r in ok if r["shape"] == shape and r["suite"] == suite]
        t = next((r for r in rs if r["provider"] == "torch.matmul"), None)
        if t is None:
            continue

        def ratio(pred):
            cands = [r for r in rs if pred(r)]
            best = min(cands, key=lambda r: r["median_us"]) if cands else None
            return (t["median_us"] / best["median_us"], best) if best else (None, None)

        sk, _ = ratio(lambda r: r["provider"] == "stream_k")
        pe, _ = ratio(lambda r: r["provider"] == "persistent")
        cl, best = ratio(lambda r: r["provider"] == "cluster_gemm")
        mp, _ = ratio(lambda r: r["provider"] == "cluster_gemm" and str(r.get("model_pick")) == "1")
        by_step = [ratio(lambda r, s=s: r["provider"] == "cluster_gemm" and r["step"] == s)[0] for s in steps]
        d = per_suite.setdefault(suite, {})
        for k, v in [("stream_k", sk), ("persistent", pe), ("cluster", cl), ("pick", mp)] + list(zip(steps, by_step)):
            d.setdefault(k, []).append(v)
        fmt = lambda x: f"{x:.3f}x" if x else "-"  # noqa: E731
        desc = ""
        if best:
            c = json.loads(best["config"])
            desc = f"{c['BLOCK_M']}x{c['BLOCK_N']} s{c['STAGES']} {best['step']}"
        lines.append(f"| {suite} | {shape} | {t['median_us']:.1f} | {fmt(sk)} | {fmt(pe)} | {fmt(cl)} | {desc} | {fmt(mp)} | "
                     + " | ".join(fmt(x) for x in by_step) + " |")
    lines += ["", "Geomean vs cuBLAS (torch.matmul), per suite:", "",
              "| suite | stream_k | persistent | best cluster | model pick | " + " | ".join(steps) + " |",
              "|---|---:|---:|---:|---:|" + "---:|" * len(steps)]
    for suite, d in per_suite.items():
        g = [geomean(d.get(k, [])) for k in ["stream_k", "persistent", "cluster", "pick"] + steps]
        lines.append(f"| {suite} | " + " | ".join(f"{x:.3f}x" if x else "-" for x in g) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--suites", default=",".join(ALL_SUITES),
                   help="comma-separated suites to time (tail, balanced, skinny; the odd shapes are always verified)")
    p.add_argument("--out", default=os.environ.get("OUT") or str(HERE / "results"))
    p.add_argument("--time-limit-s", type=float, default=400.0)
    p.add_argument("--hang-s", type=float, default=120.0,
                   help="a verify child silent this long is killed (one compile + one run; compiles share the CPUs)")
    p.add_argument("--verify-procs", type=int, default=6, help="verify children at once (they compile in parallel)")
    p.add_argument("--shard", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--shards", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--deadline", type=float, default=float("inf"), help=argparse.SUPPRESS)
    p.add_argument("--_child", choices=["verify", "time"], help=argparse.SUPPRESS)
    p.add_argument("--skip", default=None, help=argparse.SUPPRESS)
    p.add_argument("--passed", default=None, help=argparse.SUPPRESS)
    p.add_argument("--time-budget-s", type=float, default=0.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args._child == "verify":
        return child_verify(args)
    if args._child == "time":
        return child_time(args)

    start = time.time()
    from kernels import gluon_gemm as g

    why = g.unavailable_reason()
    if why:
        print(why)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    run_id = time.strftime("%Y%m%dT%H%M%S")
    with open(out / "cluster_gemm.log", "w") as log:
        # verify gets at most half the run; a config it did not reach is not timed
        args.deadline = start + 0.5 * args.time_limit_s
        verdict = verify_all(args, log)
        for cfg_json, (status, err, detail) in verdict.items():
            print(f"verify {status:6s} rel_err={err if err is None else f'{err:.2e}'} {cfg_json} {detail}", flush=True)
        passed = [k for k, v in verdict.items() if v[0] == "ok"]
        (out / "cluster_gemm_verify.json").write_text(json.dumps(
            {k: {"status": v[0], "rel_err": v[1], "detail": str(v[2])} for k, v in verdict.items()}, indent=1))
        passed_path = out / "cluster_gemm_passed.json"
        passed_path.write_text(json.dumps(passed))
        budget = args.time_limit_s - (time.time() - start) - 15
        cmd = [sys.executable, __file__, "--_child", "time", "--passed", str(passed_path),
               "--time-budget-s", str(max(10.0, budget)), "--suites", args.suites]
        if args.quick:
            cmd.append("--quick")
        rows = []
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, bufsize=1)
        with open(out / "cluster_gemm.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=FIELDS, extrasaction="ignore")
            w.writeheader()
            try:
                for line in proc.stdout:
                    if line.startswith("ROW "):
                        row = dict(json.loads(line[4:]), run_id=run_id)
                        rows.append(row)
                        w.writerow(row)
                        f.flush()
                        print(f"{row['shape']:18s} {row['provider']:13s} {row.get('step', ''):9s} {row['status']:7s} "
                              f"{row.get('median_us', '')} us vs_torch={row.get('vs_torch')}", flush=True)
                proc.wait(timeout=max(1.0, args.time_limit_s - (time.time() - start)))
            except subprocess.TimeoutExpired:
                proc.kill()
    md = markdown(rows)
    (out / "cluster_gemm.md").write_text(f"# cluster_gemm bench {run_id} (bf16, graph-timed, H200)\n\n{md}")
    print(md)
    print(f"wrote {out}/cluster_gemm.csv, cluster_gemm.md, cluster_gemm_verify.json, cluster_gemm.log "
          f"in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
