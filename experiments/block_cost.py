"""What one thread block costs to schedule: a huge grid of tiny blocks against a persistent
grid-stride kernel doing the same work.

launch_overhead's big-grid estimate (rules/launch_overhead.toml `block_cost_ns`) is
blocks / SMs x this cost. Both kernels below read n floats, scale them and write them back;
the only difference is how the work is cut: `one_tile` launches n / BLOCK programs that each
do one tile, `grid_stride` launches about #SMs x programs-per-SM programs that loop over the
tiles. Per block size (BLOCK elements, num_warps) and work per block, the cost per block per
SM is (t_grid - t_persistent) x SMs / blocks. Timing: triton.testing.do_bench medians,
inputs rotated over several buffers larger than L2 together, outputs checked.

    python experiments/block_cost.py --out block_cost.csv            # on the GPU
    TRITON_INTERPRET=1 python experiments/block_cost.py --tiny --device cpu --out x.csv  # smoke

Writes long-format rows (experiment, provider, metric, unit, block, warps, blocks, n, value,
gpu, timestamp, version) and prints a table.
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import statistics
from pathlib import Path

import torch
import triton
import triton.language as tl


@triton.jit
def one_tile(src, dst, n, BLOCK: tl.constexpr):
    # one tile per program: the block scheduler hands out n / BLOCK programs
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = offs < n
    tl.store(dst + offs, tl.load(src + offs, mask=m) * 2.0 + 1.0, mask=m)


@triton.jit
def grid_stride(src, dst, n, BLOCK: tl.constexpr):
    # persistent: a few programs per SM loop over the same tiles
    tiles = tl.cdiv(n, BLOCK)
    for t in range(tl.program_id(0), tiles, tl.num_programs(0)):
        offs = t * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        tl.store(dst + offs, tl.load(src + offs, mask=m) * 2.0 + 1.0, mask=m)


def _time(fn, device: str, reps: int) -> float:
    """Median ms: do_bench on the GPU; wall-clock median of `reps` calls elsewhere (smoke)."""
    if device == "cuda":
        return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))
    import time
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def run(args) -> list[dict]:
    device = args.device
    if device == "cuda":
        sms = torch.cuda.get_device_properties(0).multi_processor_count
        gpu = torch.cuda.get_device_name(0)
    else:
        sms, gpu = args.sm_count, "cpu (TRITON_INTERPRET)"
    # sizes: elements per block (one warp = 32 threads x 1-4 elements ... 4 warps x 8)
    configs = [(64, 1), (128, 1), (256, 2), (512, 4), (1024, 4), (2048, 8)]
    n_total = [1 << 25] if not args.tiny else [1 << 12]
    if args.tiny:
        configs = configs[:2]
    stamp = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    rows = []
    for n in n_total:
        # rotate buffers so that L2 (60 MB on the H200) does not serve the input
        nbuf = 1 if args.tiny else 4
        srcs = [torch.randn(n, device=device, dtype=torch.float32) for _ in range(nbuf)]
        dst = torch.empty(n, device=device, dtype=torch.float32)
        for block, warps in configs:
            blocks = triton.cdiv(n, block)
            programs = sms * args.programs_per_sm
            state = {"i": 0}

            def grid_fn():
                state["i"] = (state["i"] + 1) % nbuf
                one_tile[(blocks,)](srcs[state["i"]], dst, n, BLOCK=block, num_warps=warps)

            def pers_fn():
                state["i"] = (state["i"] + 1) % nbuf
                grid_stride[(min(programs, blocks),)](srcs[state["i"]], dst, n, BLOCK=block, num_warps=warps)

            # check both on the last source buffer (poisoned output first)
            for fn in (grid_fn, pers_fn):
                dst.fill_(float("nan"))
                state["i"] = nbuf - 2 if nbuf > 1 else -1
                fn()
                want = srcs[state["i"]] * 2.0 + 1.0
                assert torch.allclose(dst, want), f"{fn.__name__} BLOCK={block} wrong result"
            t_grid = _time(grid_fn, device, args.reps)
            t_pers = _time(pers_fn, device, args.reps)
            per_block = (t_grid - t_pers) * 1e6 * sms / blocks  # ns per block per SM
            common = {"experiment": "block_cost", "block": block, "warps": warps, "blocks": blocks, "n": n,
                      "sms": sms, "gpu": gpu, "timestamp": stamp, "version": f"torch {torch.__version__}, triton {triton.__version__}"}
            rows.append({**common, "provider": "one_tile", "metric": "median_time", "unit": "ms", "value": t_grid})
            rows.append({**common, "provider": "grid_stride", "metric": "median_time", "unit": "ms", "value": t_pers})
            rows.append({**common, "provider": "one_tile-grid_stride", "metric": "block_cost", "unit": "ns per block per SM",
                         "value": per_block})
            rows.append({**common, "provider": "one_tile-grid_stride", "metric": "saving_share", "unit": "fraction",
                         "value": (t_grid - t_pers) / t_grid if t_grid else 0.0})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="CSV file for the long-format rows")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true", help="small sizes, for a CPU smoke run under TRITON_INTERPRET=1")
    p.add_argument("--sm-count", type=int, default=132, help="SMs assumed off the GPU (smoke runs)")
    p.add_argument("--programs-per-sm", type=int, default=4, help="programs per SM in the persistent launch")
    p.add_argument("--reps", type=int, default=3, help="timed calls per provider off the GPU")
    args = p.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("block_cost: no CUDA device (use --device cpu --tiny under TRITON_INTERPRET=1)")
    rows = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with args.out.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(f"{'BLOCK':>6} {'warps':>5} {'blocks':>9} {'grid ms':>9} {'persistent ms':>13} {'ns/block/SM':>11} {'saving':>7}")
    by = {}
    for r in rows:
        by.setdefault((r["n"], r["block"], r["warps"]), {})[(r["provider"], r["metric"])] = r
    for (n, block, warps), d in by.items():
        g, q = d[("one_tile", "median_time")], d[("grid_stride", "median_time")]
        c, s = d[("one_tile-grid_stride", "block_cost")], d[("one_tile-grid_stride", "saving_share")]
        print(f"{block:>6} {warps:>5} {g['blocks']:>9} {g['value']:>9.4f} {q['value']:>13.4f} {c['value']:>11.1f} {s['value']:>7.1%}")
    print(f"wrote {len(rows)} rows to {args.out}")


if __name__ == "__main__":
    main()
