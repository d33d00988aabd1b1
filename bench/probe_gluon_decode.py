"""Split-KV decode attention with its K/V pipeline written out (kernels/split_kv_gluon.py, Gluon,
Triton >= 3.9): is it right on the inputs users pass, and which schedule (a split grid or the
stream schedule) wins where? (docs/split_kv.md, "Sixth round" to "Eighth round")

    PYTHONPATH=<triton 3.9> python3 bench/probe_gluon_decode.py [--out DIR] [--rounds N]   (GPU; ~4 minutes)

Why: the split grid runs (splits x units) programs, a whole number of splits a unit; where the
units do not divide the 2 x 132 program slots (16 units: 16 splits, 256 programs) the busiest
program walks up to 3% more tiles than an even share, and the sixth round's gaps to cuDNN sat
on those shapes. The stream schedule gives every slot the same share.

Part 1, correctness: split_kv_attention.decode_attention with its default config (which runs
the Gluon kernel where `supports` allows; the row says which ran), then the Gluon kernel with
each schedule and combine, on odd cases: Lq 1-16, ragged S, fp16 and bf16, D 64 and 128, a
cache sliced to S keys, 28 / 4 heads, strided q and out, one split and 469, a stream share
crossing several units; each against the float64 reference into a NaN-poisoned output, at the
dtype's tolerance, twice in a row (the last arriver's counters must come back zeroed).
Part 2, timing: per bench shape cuDNN, the split grid, the stream schedule and the plain read,
`--rounds` times back to back (the ratios are taken within a round, then their median), with
bench_split_kv's harness (CUDA-graph replays over K/V sets 3x the L2, settled first). Writes
probe_gluon_decode.csv (long format, as split_kv.csv) and probe_gluon_decode.md.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

SHAPES = [(b, 32, 8, 128, s) for b in (1, 2, 4, 8) for s in (8192, 32768, 131072)] + [
    (4, 32, 8, 128, 100000), (8, 32, 8, 128, 31000), (3, 32, 8, 128, 20000), (2, 28, 4, 128, 48000)]
# (B, Hq, Hkv, Lq, S, D, dtype, cache length: a longer cache sliced to S keys, strided q/out)
CASES = [(1, 32, 8, 1, 8192, 128, "bfloat16", 8192, False), (2, 32, 8, 4, 1000, 64, "float16", 1000, False),
         (4, 64, 8, 8, 8193, 128, "bfloat16", 9000, True), (3, 28, 4, 1, 20000, 128, "float16", 20000, False),
         (1, 8, 2, 16, 300, 64, "bfloat16", 333, True), (2, 16, 16, 1, 65, 128, "float16", 65, False),
         (1, 4, 1, 3, 4097, 128, "bfloat16", 5000, True),
         (1, 8, 1, 1, 300000, 64, "bfloat16", 300000, False),  # one kv head: hundreds of splits to combine
         (64, 64, 8, 8, 2000, 128, "bfloat16", 2000, True),  # 512 units: one split, O written directly
         (37, 16, 4, 2, 777, 64, "float16", 800, True)]  # 148 units of 13 tiles: stream shares span units


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
            runs += [(f"gluon split {c}", lambda o, c=c: g.decode_attention(q, k, v, out=o, combine=c, schedule="split"))
                     for c in g.COMBINES]
            runs += [("gluon stream", lambda o: g.decode_attention(q, k, v, out=o, schedule="stream"))]
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=2, help="back-to-back timings of every provider a shape")
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

    def log(msg):
        print(msg, flush=True)

    from advisor.codegen.kernel_lib import load

    g = load("split_kv_gluon")
    rows = check_cases(bench.kv, g, log)
    failed = [r for r in rows if r["unit"] != "within tolerance"]
    summary = []
    for B, Hq, Hkv, D, S in SHAPES:
        sh = bench.prepare(B, Hq, Hkv, D, S, torch.bfloat16, "cuda")
        log(f"{sh['name']}: floor {sh['floor_us']:.1f} us, {sh['sets']} K/V sets; busiest program "
            + ", ".join(f"{s} {g.longest_share(B, Hkv, S, sms, s)} tiles" for s in g.SCHEDULES)
            + f"; the rule picks {g.choose_schedule(B, Hkv, S, sms)}")
        cudnn = bench.providers("cuda")["sdpa_cudnn"]
        fns = {"cudnn": cudnn}
        for sched in g.SCHEDULES:
            fns[sched] = lambda q, k, v, s=sched, o=sh["out"]: g.decode_attention(q, k, v, out=o, schedule=s)
        for fn in fns.values():
            bench.settle(fn, sh)
        rounds = []
        for rnd in range(args.rounds):
            got = {name: bench.measure(sh, "sdpa_cudnn" if name == "cudnn" else "gluon", fn, rows, log,
                                       f"round {rnd + 1}" if name == "cudnn" else f"{name} round {rnd + 1}")
                   for name, fn in fns.items()}
            rounds.append(got)
        read = bench.measure_read_floor(sh, rows, log, sms)
        rows.append(bench.floor_row(sh))
        summary.append((sh["name"], sh["floor_us"], read, g.choose_schedule(B, Hkv, S, sms), rounds))
        del sh, fns
        torch.cuda.empty_cache()
    with open(out_dir / "probe_gluon_decode.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=bench.COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "gpu": gpu, "timestamp": stamp, "version": version})

    def med(xs):
        xs = sorted(x for x in xs if x is not None)
        return xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2 if xs else None

    def ratio(rounds, a, b):
        return med([r[a] / r[b] for r in rounds if r.get(a) and r.get(b)])

    fmt = lambda x, f="{:.1f}": f.format(x) if x is not None else "-"  # noqa: E731
    lines += [f"p50 us, median over {args.rounds} rounds; ratios taken within a round, then their median", "",
              "| shape | floor | plain read | cuDNN | split | stream | rule picks | split / stream | "
              "cuDNN / split | cuDNN / stream |", "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for name, floor, read, pick, rounds in summary:
        t = {k: med([r.get(k) for r in rounds]) for k in ("cudnn", "split", "stream")}
        lines.append(f"| {name} | {floor:.1f} | {fmt(read)} | {fmt(t['cudnn'])} | {fmt(t['split'])} | "
                     f"{fmt(t['stream'])} | {pick} | {fmt(ratio(rounds, 'split', 'stream'), '{:.3f}x')} | "
                     f"{fmt(ratio(rounds, 'cudnn', 'split'), '{:.3f}x')} | "
                     f"{fmt(ratio(rounds, 'cudnn', 'stream'), '{:.3f}x')} |")
    checks = [r for r in rows if r["metric"] == "rel_err" and r["config"].endswith(("call 1", "call 2"))]
    lines += ["", f"correctness: {len(checks) - len(failed)} of {len(checks)} calls ({len(CASES)} cases) within tolerance" +
              (f"; FAILED: {', '.join(r['shape'] for r in failed)}" if failed else "")]
    (out_dir / "probe_gluon_decode.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
