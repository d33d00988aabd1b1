"""Where the cluster GEMM's Stream-K loses time on a tail shape: its parts timed apart (H200).

    python3 bench/probe_cluster_tail.py [--shape 1664x1408x8192] [--out DIR]

Needs Triton >= 3.9 (the .triton-next carry; docs/schedules/cluster_gemm.md). For one tail
shape and a Stream-K config (--config; default the best on 1664x1408x8192: 128x128, 6 stages,
WS, one CTA), each
CUDA-graph timed beside torch.matmul in one run (graph replays rotating over input sets larger
than twice the L2):

- `sk`: the whole Stream-K call (the WS kernel, then the fixup kernel);
- `sk_no_fixup`: the WS kernel alone (its split tiles left unsummed: timed, not checked);
- `dp`: the same config data-parallel (whole tiles: 2 waves when the tiles pass the SMs);
- `dp_full_wave`: data-parallel on the largest M below the shape's with whole waves of tiles,
  same N and K: the per-step time of a full wave, the rate the Stream-K split would need;
- the model: full-wave time x (the shape's tile steps / the full-wave shape's): an even split
  at the full-wave rate with free partials and no fixup.

Every timed call except `sk_no_fixup` is first checked against a float64 reference into a
NaN-poisoned output. Writes probe_cluster_tail.csv (long format) and .md into --out ($OUT,
else bench/results/cluster_gemm).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="1664x1408x8192")
    p.add_argument("--config", default="128x128x6x8",
                   help="BLOCK_MxBLOCK_NxSTAGESxWARPS of the Stream-K config (one CTA, WS); 64x128x8x4 for M <= 64")
    p.add_argument("--out", default=os.environ.get("OUT") or str(HERE / "results" / "cluster_gemm"))
    args = p.parse_args(argv)
    M, N, K = (int(x) for x in args.shape.split("x"))

    import torch
    import triton

    from advisor.run.bench.timing import l2_bytes, rotating, rotation_count, time_graph
    from advisor.run.bench.verify import relative_error, tolerance
    from kernels import gluon_gemm as g

    if g.unavailable_reason():
        print(g.unavailable_reason(), file=sys.stderr)
        return 2
    dtype = torch.bfloat16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bm, bn, stages, warps = (int(x) for x in args.config.split("x"))
    sk = g.Config(BLOCK_M=bm, BLOCK_N=bn, STAGES=stages, num_warps=warps, ws=True, cluster=1, multicast=False,
                  stream_k=True)
    dp = g.Config(**dict(sk.as_dict(), stream_k=False))
    cdiv = g.cdiv
    tiles_n = cdiv(N, sk.BLOCK_N)
    full_m = M // sk.BLOCK_M * sk.BLOCK_M  # the largest M' <= M whose tiles fill whole waves
    while full_m > 0 and (full_m // sk.BLOCK_M) * tiles_n % sms:
        full_m -= sk.BLOCK_M
    l2 = l2_bytes()
    rows = []
    stamp = datetime.now(timezone.utc).replace(microsecond=0).isoformat()

    class NoFixup:  # the fixup launch replaced by nothing: the WS kernel's own time
        def __getitem__(self, grid):
            return lambda *a, **k: None

    def run(name, m, cfg, check=True, patch=False):
        sets = rotation_count((m * K + K * N + m * N) * 2, l2)
        gen = torch.Generator(device="cuda").manual_seed(1)
        ins = [(torch.randn((m, K), device="cuda", generator=gen).to(dtype),
                torch.randn((K, N), device="cuda", generator=gen).to(dtype),
                torch.empty((m, N), device="cuda", dtype=dtype)) for _ in range(sets)]
        if cfg is None:
            call = lambda a, b, c: torch.matmul(a, b, out=c)  # noqa: E731
        else:
            call = lambda a, b, c: g.matmul(a, b, cfg, out=c)  # noqa: E731
        saved = g._sk_fixup_kernel
        if patch:
            g._sk_fixup_kernel = NoFixup()
        try:
            a, b, c = ins[0]
            c.fill_(float("nan"))
            call(a, b, c)
            err = None
            if check:
                err = relative_error(c, a.double() @ b.double())
                if err > tolerance(dtype):
                    raise AssertionError(f"{name}: rel. error {err:.2e}")
            t = time_graph(rotating([lambda a=a, b=b, c=c: call(a, b, c) for a, b, c in ins]), warmup_ms=20, rep_ms=60)
        finally:
            g._sk_fixup_kernel = saved
        us = t.median_ms * 1e3
        rows.append({"shape": f"{m}x{N}x{K}", "provider": name, "config": cfg.describe() if cfg else "",
                     "median_us": round(us, 2), "p20_us": round(t.p20_ms * 1e3, 2), "p80_us": round(t.p80_ms * 1e3, 2),
                     "tflops": round(2 * m * N * K / us / 1e6, 1), "rel_err": err, "gpu": torch.cuda.get_device_name(),
                     "triton": triton.__version__, "timestamp": stamp})
        print(rows[-1], flush=True)
        del ins
        return us

    base = run("torch.matmul", M, None)
    t_sk = run("sk", M, sk)
    t_nofix = run("sk_no_fixup", M, sk, check=False, patch=True)
    t_dp = run("dp", M, dp)
    t_full = run("torch.matmul", full_m, None) if full_m else None
    t_full_dp = run("dp_full_wave", full_m, dp) if full_m else None
    steps = cdiv(M, sk.BLOCK_M) * tiles_n * cdiv(K, sk.BLOCK_K)
    full_steps = (full_m // sk.BLOCK_M) * tiles_n * cdiv(K, sk.BLOCK_K) if full_m else 0
    model = t_full_dp * steps / full_steps if full_m else float("nan")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "probe_cluster_tail.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [f"# Stream-K tail probe, {args.shape}, bf16, {torch.cuda.get_device_name()}, {stamp}", "",
             f"triton {triton.__version__}; config {sk.describe()}", "",
             "| what | us | vs cuBLAS on the shape |", "|---|---:|---:|",
             f"| torch.matmul (cuBLAS) | {base:.1f} | 1.00x |",
             f"| sk: WS kernel + fixup | {t_sk:.1f} | {base / t_sk:.3f}x |",
             f"| sk_no_fixup: WS kernel alone | {t_nofix:.1f} | {base / t_nofix:.3f}x |",
             f"| fixup (difference) | {t_sk - t_nofix:.1f} | |",
             f"| dp: data-parallel, same config | {t_dp:.1f} | {base / t_dp:.3f}x |"]
    if full_m:
        lines += [f"| full wave {full_m}x{N}x{K}: cuBLAS / dp | {t_full:.1f} / {t_full_dp:.1f} | "
                  f"dp at {t_full / t_full_dp:.3f}x cuBLAS |",
                  f"| model: full-wave dp rate x {steps} / {full_steps} steps | {model:.1f} | {base / model:.3f}x |",
                  f"| WS kernel alone over the model | {t_nofix / model:.3f}x | |"]
    (out / "probe_cluster_tail.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
