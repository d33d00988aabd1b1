"""Probe: which staged config should lead the grouped search space for groups with odd sizes?

    python3 experiments/probe_grouped_staged_configs.py [--rounds 3] [--csv OUT.csv]
    TRITON_INTERPRET=1 python3 experiments/probe_grouped_staged_configs.py --check   # CPU: correctness only

Question (2026-12-02). For a 16-bit group with an odd K or N, `grouped_gemm.search_space`
leads with the staged version of its aligned best guess (128x128x64, 4 warps, 2 programs
per SM). `advisor diagnose --example --run` then found 128x128x64 with 8 warps and one
program per SM 21% faster on the example trace's 64 GEMMs (63.7 against 80.9 us). Is that
one group's luck, or should the staged order change? Every config of the search space is
timed here on three odd groups: the example trace's 64 shapes and two seeded draws of 64
sizes in 128..512 (any integer, so most K and N are odd), each config verified against a
float64 reference on NaN-poisoned outputs first, eager do_bench medians, inputs rotated
past the L2, interleaved rounds.

What it showed (H200, 2026-12-02, results/probe_grouped_staged_configs/): not luck. On all
three groups the same three staged configs led, 64x128x64 (4 warps, 2 programs per SM),
128x128x64 (8 warps, 1 per SM) and 128x64x64, at 1.21-1.31x the staged 128x128x64 with 4
warps (e.g. 58.3 against 76.3 us on seed 2); the staged 128x128 TMA config ran 0.63-0.66x it,
the 64x128 TMA one 1.17-1.23x, and the unstaged configs 0.25-0.35x. The staged order in
`grouped_gemm.search_space` now leads with those three (`_STAGED_LEADERS`).
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from probe_grouped_alignment import (
    checked_launches,
    example_shapes,
    group_inputs,
    setup,
    time_rounds,
    write_csv,
)

from kernels import grouped_gemm as gg


def odd_groups(small: bool) -> dict[str, list[tuple[int, int, int]]]:
    if small:
        return {"odd": [(23, 37, 29), (9, 17, 45), (40, 33, 21)]}
    out = {"example trace": example_shapes()}
    for seed in (1, 2):
        rng = random.Random(seed)
        out[f"64 odd, seed {seed}"] = [(rng.randint(128, 512), rng.randint(128, 512), rng.randint(128, 512))
                                       for _ in range(64)]
    return out


def main() -> int:
    args, device = setup(__doc__.split("\n")[0])
    dtype = torch.bfloat16
    rows = []
    for gname, sizes in odd_groups(device == "cpu").items():
        space = gg.search_space(sizes, dtype, None if device == "cuda" else 3)
        _, flops, inputs = group_inputs(sizes, dtype, device, seed=11)
        calls = {}
        for cfg in space:
            calls[cfg.label()], err, _ = checked_launches(inputs, cfg)
            print(f"{gname:18} {cfg.label():36} ok  rel_err {err:.2e}", flush=True)
        if device == "cpu":
            continue
        times = time_rounds(calls, args.rounds)
        print(f"\n{gname}: {len(sizes)} GEMMs, {flops / 1e9:.2f} GFLOP; search-space order: "
              f"{', '.join(c.label() for c in space[:3])}, ...")
        first = statistics.median(times[space[0].label()])
        for k, ts in sorted(times.items(), key=lambda kv: statistics.median(kv[1])):
            us = statistics.median(ts)
            print(f"  {k:36} {us:8.1f} us  {flops / us / 1e6:6.1f} TFLOP/s  x{first / us:5.2f} vs the current first  "
                  f"rounds {' '.join(f'{t:.1f}' for t in ts)}")
            rows.append({"group": gname, "config": k, "median_us": round(us, 2), "rounds": " ".join(f"{t:.2f}" for t in ts),
                         "device": torch.cuda.get_device_name(), "torch": torch.__version__})
        print(flush=True)
    write_csv(args.csv, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
