"""Split-KV decode attention with its K/V pipeline written out (kernels/split_kv_gluon.py, Gluon,
Triton >= 3.9): is it right on the inputs users pass, and which combine (a second kernel or the
last arriver) and ring depth win? (docs/split_kv.md, "Sixth round" and "Seventh round")

    PYTHONPATH=<triton 3.9> python3 bench/probe_gluon_decode.py [--out DIR]    (GPU; ~2 minutes)

Why: Nsight Compute put the last 1-2% between our Triton kernel and cuDNN in the stream rate at
equal bytes, with the warps stalled on the load scoreboard; Triton 3.6's pipeliner gives
num_stages=2 one K and one V buffer, and deeper Triton pipelines were slower (fifth round). The
Gluon kernel keeps STAGES - 1 tiles in flight in every program.

Part 1, correctness: split_kv_attention.decode_attention with its default config (which runs
the Gluon kernel where `supports` allows; the row says which ran), then the Gluon kernel with
each combine, on odd cases: Lq 1-16, ragged S, fp16 and bf16, D 64 and 128, a cache sliced to
S keys, 28 / 4 heads, strided q and out, one split and 469; each against the float64 reference
into a NaN-poisoned output, at the dtype's tolerance, twice in a row (the last arriver's
counters must come back zeroed).
Part 2, timing: per bench shape cuDNN, the flash backend, the plan with each combine and each
(stages, programs an SM) variant with the last arriver, and the plain read, with
bench_split_kv's harness (CUDA-graph replays over K/V sets 3x the L2, settled first). Writes
probe_gluon_decode.csv (long format, as split_kv.csv) and probe_gluon_decode.md.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

SHAPES = [(b, 32, 8, 128, s) for b, s in ((1, 8192), (1, 32768), (2, 8192), (4, 8192), (8, 8192), (4, 32768),
                                           (8, 32768), (1, 131072), (2, 131072), (8, 131072))]
# (stages, programs an SM) with the last arriver: one and two programs an SM
VARIANTS = [(4, 1), (3, 2)]
# (B, Hq, Hkv, Lq, S, D, dtype, cache length: a longer cache sliced to S keys, strided q/out)
CASES = [(1, 32, 8, 1, 8192, 128, "bfloat16", 8192, False), (2, 32, 8, 4, 1000, 64, "float16", 1000, False),
         (4, 64, 8, 8, 8193, 128, "bfloat16", 9000, True), (3, 28, 4, 1, 20000, 128, "float16", 20000, False),
         (1, 8, 2, 16, 300, 64, "bfloat16", 333, True), (2, 16, 16, 1, 65, 128, "float16", 65, False),
         (1, 4, 1, 3, 4097, 128, "bfloat16", 5000, True),
         (1, 8, 1, 1, 300000, 64, "bfloat16", 300000, False),  # one kv head: hundreds of splits to combine
         (64, 64, 8, 8, 2000, 128, "bfloat16", 2000, True)]  # 512 units: one split, O written directly


def check_cases(kv, g, log) -> list[dict]:
    import torch

    rows = []
    for B, Hq, Hkv, Lq, S, D, dname, cache, strided in CASES:
        dtype = getattr(torch, dname)
        gen = torch.Generator(device="cuda").manual_seed(S + Lq)
        q = torch.randn((B, Lq, Hq, D) if strided else (B, Hq, Lq, D), generator=gen, device="cuda").to(dtype)
        q = q.transpose(1, 2) if strided else q
        k, v = (torch.randn((B, Hkv, cache, D), generator=gen, device="cuda").to(dtype)[:, :, :S] for _ in range(2))
        ref = kv.reference(q, k, v)
        why = g.supports(q, k, v)
        runs = [("default", lambda o: kv.decode_attention(q, k, v, out=o))]
        if why is None:
            runs += [(f"gluon {c}", lambda o, c=c: g.decode_attention(q, k, v, out=o, combine=c)) for c in g.COMBINES]
        for label, call in runs:
            for attempt in (1, 2):  # the second call finds the counters the first handed back
                out = torch.full((B, Lq, Hq, D) if strided else (B, Hq, Lq, D), float("nan"), dtype=dtype,
                                 device="cuda")
                out = out.transpose(1, 2) if strided else out
                call(out)
                err = kv.rel_error(out, ref)
                ok = err <= kv.TOLERANCE[dtype]
                ran = label if label != "default" else ("gluon" if why is None else f"triton ({why})")
                case = f"B{B} Hq{Hq} Hkv{Hkv} Lq{Lq} S{S} D{D} {dname} cache{cache}{' strided' if strided else ''}"
                log(f"{'ok  ' if ok else 'FAIL'} {case:58s} rel_err {err:.2e} ({ran}, call {attempt})")
                rows.append(dict(kernel="decode_attention", provider=ran.split()[0], config=f"{label} call {attempt}",
                                 metric="rel_err", unit="within tolerance" if ok else "over tolerance", shape=case,
                                 p50=err, p20=err, p80=err))
    return rows


def _variant(g, out, stages, splits, combine):
    return lambda q, k, v: g.decode_attention(q, k, v, out=out, stages=stages, splits=splits, combine=combine)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    import torch
    import triton

    import bench_split_kv as bench

    out_dir = args.out or Path(os.environ.get("OUT", HERE / "results" / "split_kv" / "probe_gluon_decode"))
    out_dir.mkdir(parents=True, exist_ok=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    gpu = torch.cuda.get_device_name(0)
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    version = f"torch {torch.__version__}; triton {triton.__version__}"
    lines = [f"# Gluon split-KV probe, bf16, {gpu}, {stamp}", "", version, ""]
    rows = []

    def log(msg):
        print(msg, flush=True)

    from advisor.codegen.kernel_lib import load

    g = load("split_kv_gluon")
    rows = check_cases(bench.kv, g, log)
    failed = [r for r in rows if r["unit"] != "within tolerance"]
    summary = []
    for B, Hq, Hkv, D, S in SHAPES:
        sh = bench.prepare(B, Hq, Hkv, D, S, torch.bfloat16, "cuda")
        log(f"{sh['name']}: floor {sh['floor_us']:.1f} us, {sh['sets']} K/V sets")
        provs = bench.providers("cuda")
        got = {}
        for name in ("sdpa_cudnn", "sdpa_flash"):
            bench.settle(provs[name], sh)
            got[name] = bench.measure(sh, name, provs[name], rows, log)
        splits, _, stages = g.plan(B, Hkv, S, sms)
        tiles = math.ceil(S / g.BLOCK_N)
        picks = [(f"plan {c}", None, None, c) for c in g.COMBINES] + [
            (f"s{st} {pps}/SM last_arriver", st, max(1, min(tiles, pps * sms // (B * Hkv))), "last_arriver")
            for st, pps in VARIANTS]
        best = None
        for label, st, sp, comb in picks:
            fn = _variant(g, sh["out"], st, sp, comb)
            text = f"gluon {label}" + (f" (s{stages}, {splits} splits)" if st is None else "")
            bench.settle(fn, sh)
            t = bench.measure(sh, "gluon", fn, rows, log, text)
            if t is not None and (best is None or t < best[0]):
                best = (t, text)
        plan_t = {c: next((r["p50"] for r in reversed(rows) if r["shape"] == sh["name"] and r["metric"] == "time"
                           and r["config"].startswith(f"gluon plan {c}")), None) for c in g.COMBINES}
        bench.measure_read_floor(sh, rows, log, sms)
        rows.append(bench.floor_row(sh))
        summary.append((sh["name"], sh["floor_us"], got["sdpa_cudnn"], got["sdpa_flash"], plan_t, best))
        del sh
        torch.cuda.empty_cache()
    with open(out_dir / "probe_gluon_decode.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=bench.COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "gpu": gpu, "timestamp": stamp, "version": version})
    lines += ["| shape | floor | cuDNN | flash | plan, combine kernel | plan, last arriver | best gluon (variant) | "
              "cuDNN / kernel | cuDNN / last arriver |", "|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    nan = float("nan")
    for name, floor, cud, fl, plan_t, best in summary:
        b = f"{best[0]:.1f} ({best[1]})" if best else "failed"
        ratios = [f"{cud / plan_t[c]:.3f}x" if plan_t[c] and cud else "-" for c in ("kernel", "last_arriver")]
        lines.append(f"| {name} | {floor:.1f} | {cud or nan:.1f} | {fl or nan:.1f} | {plan_t['kernel'] or nan:.1f} | "
                     f"{plan_t['last_arriver'] or nan:.1f} | {b} | {ratios[0]} | {ratios[1]} |")
    checks = [r for r in rows if r["metric"] == "rel_err"]
    lines += ["", f"correctness: {len(checks) - len(failed)} of {len(checks)} calls ({len(CASES)} cases) within tolerance" +
              (f"; FAILED: {', '.join(r['shape'] for r in failed)}" if failed else "")]
    (out_dir / "probe_gluon_decode.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
