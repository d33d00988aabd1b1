"""Probe: where does a Stream-K launch spend its time? Per-program phase timestamps (H200).

    python3 experiments/probe_stream_k_phases.py [--shapes 1664x1408x8192,...] [--variants FILE]

(--variants: the stream_k_gemm configs of a experiments/probe_configs.py variants file instead of
the built-in list.)

Question (2026-11-29). The aligned Stream-K schedules of experiments/probe_stream_k_tail.py ran
15-30 us slower than "one data-parallel round + the Stream-K share of a tile" predicts,
for 2-way and 12-way splits alike. stream_k_gemm.matmul(..., phase_times=T) makes every
program record %globaltimer at its start, when its last Stream-K MAC loop ends, when its
Stream-K work (partials handed in) ends, after its data-parallel tiles, and at its end
(after the cooperative fixup's claims). For each config this prints the launch span (first
start to last end) and, over the programs, the median and max of: the start skew, the
Stream-K MAC time, the hand-in (last arrivers stand out in the max), the data-parallel
tiles, the claims, the end skew, and the claims of the programs without Stream-K work
(helper_claims; nan when every program has Stream-K work); each cell is the median over 5 recorded launches,
after 3 warm-up launches, with fresh random bf16 inputs (not rotated: the operands may sit
in the L2, unlike bench_gemm.py's timings); each output is compared with torch.matmul
first. The columns assume the Stream-K work comes first (dp_first=False).

What it showed (H200, 2026-11-29): 1664x1408x8192, 128x128 tiles, 11 tail tiles in 12
chunks: Stream-K MAC 6 us, then the last arrivers' fixup up to 21 us (12 partials read by one
SM) before their data-parallel tile, span 76 us; with the cooperative fixup the fixup is at
most 3.5 us and the span 62 us. The "dp" column then read 50 us against 43 us in a pure
data-parallel launch, but it holds the claims too (~3 us): with the last-arriver fixup (no
claims) the data-parallel tile took 47 us against 45 us in that run's pure launch. Putting
the tiles first (dp_first) made the whole launch slower (85 against 65 us in bench_gemm.py's
search, run 20261129T122820Z-447). So the hybrid's losses are the memory-bound Stream-K
phase (6 us for 3.6 us of tensor work), the hand-in (~3 us) and the claims. A fifth stamp
(after the data-parallel tiles, later that day) measured the claims apart: 4-5 us a program,
and with 5 stages the data-parallel tile took 43 us as in a pure data-parallel launch; more
partial slices in flight, an L2 evict_last hint on the partials and acquire-only claims did
not shorten them (results/probe_stream_k_phases/h200_2026-11-29_claims_*.txt). Each line is
now the median over 5 recorded launches. Running
the Stream-K work in a second program beside the data-parallel one was tried and measured
slower, since two programs an SM leave each only 3 pipeline stages
(results/probe_stream_k_coresident/). The printed tables are in
results/probe_stream_k_phases/.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advisor.run.bench.rows import parse_shape
from advisor.codegen.kernel_lib import load

SHAPES = "1664x1408x8192,2304x2304x4096,4224x4224x8192"


def configs(sk, variants: str | None = None):
    if variants:
        import json

        spec = json.loads(Path(variants).read_text())
        return [sk.Config(**v["config"]) for v in spec["variants"] if v["schedule"] == "stream_k_gemm"]
    t128 = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4}
    t256 = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
    return [
        sk.Config(**t128, policy="dp", use_tma=True),
        sk.Config(**t128, policy="hybrid1", aligned=True, use_tma=True),
        sk.Config(**t128, policy="hybrid1", aligned=True, use_tma=True, deterministic=False),
        sk.Config(**t256, policy="hybrid1", aligned=True, use_tma=True),
        sk.Config(**t128, policy="hybrid1"),
    ]


LAUNCHES = 5


def phase_columns(t, sk_programs: int) -> list[tuple[float, float]]:
    """(median, max) over the programs of each phase of one launch (t: programs x PHASES
    stamps in us), after the launch span as its first entry."""
    grid = t.shape[0]
    t0, t_end = t[:, 0].min().item(), t[:, 4].max().item()
    sk_rows = range(min(grid, sk_programs))
    phases = [
        [(t[i, 0] - t0).item() for i in range(grid)],  # start skew
        [(t[i, 1] - t[i, 0]).item() for i in sk_rows],  # Stream-K MAC
        [(t[i, 2] - t[i, 1]).item() for i in sk_rows],  # hand-in
        [(t[i, 3] - t[i, 2]).item() for i in range(grid)],  # data-parallel tiles
        [(t[i, 4] - t[i, 3]).item() for i in sk_rows],  # claims (cooperative fixup)
        [(t_end - t[i, 4]).item() for i in range(grid)],  # end skew
        [(t[i, 4] - t[i, 3]).item() for i in range(sk_programs, grid)],  # helper claims (helper_claims)
    ]
    return [(t_end - t0, t_end - t0)] + [(statistics.median(p), max(p)) if p else (float("nan"),) * 2 for p in phases]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES)
    ap.add_argument("--variants", default=None, help="a probe_configs.py variants file: its stream_k_gemm configs")
    args = ap.parse_args()
    import torch

    sk = load("stream_k_gemm")
    print(f"{'shape':>16} {'config':<44} {'span':>6} | med/max us: {'start':>15} {'sk mac':>15} "
          f"{'hand-in':>15} {'dp':>15} {'claims':>15} {'end skew':>15} {'others claims':>15} | err")
    for shape in args.shapes.split(","):
        M, N, K = parse_shape(shape)
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        ref = torch.matmul(a, b).float()
        for cfg in configs(sk, args.variants):
            plan = sk.plan_schedule(M, N, K, cfg, torch.cuda.get_device_properties(0).multi_processor_count)
            runs = [torch.zeros(sk.PHASES * plan.grid, dtype=torch.int64, device="cuda") for _ in range(LAUNCHES)]
            try:
                for i in range(3 + LAUNCHES):  # 3 warm-up launches, then LAUNCHES recorded ones
                    out = sk.matmul(a, b, cfg, phase_times=runs[max(0, i - 3)])
                torch.cuda.synchronize()
            except Exception as exc:  # noqa: BLE001 - report and go on with the next config
                print(f"{shape:>16} {cfg.describe():<44} FAILED {type(exc).__name__}: {str(exc)[:200]}", flush=True)
                continue
            err = ((out.float() - ref).norm() / ref.norm()).item()
            cols = [phase_columns(times.view(-1, sk.PHASES).cpu().double() / 1e3, plan.sk_programs) for times in runs]
            # each cell: the median over the recorded launches of that launch's (median, max)
            cells = [tuple(statistics.median(c[j][k] for c in cols) for k in (0, 1)) for j in range(len(cols[0]))]
            text = " ".join(f"{m:7.1f} {x:7.1f}" for m, x in cells[1:])
            print(f"{shape:>16} {cfg.describe():<44} {cells[0][0]:6.1f} | {text} | {err:.1e}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
