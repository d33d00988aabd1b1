"""Probe: Nsight Compute counters for chosen (provider, config) pairs on one shape, to see
why a schedule wins or loses (advisor's --counters profiles only each provider's best).

    python3 experiments/probe_counters.py --out DIR            # the tail-suite question below
    python3 experiments/probe_counters.py --shape 1664x1408x8192 --pair dp='{"BLOCK_M": 128, ...}'

Default question (H200, 2026-11-29): on 1664x1408x8192 bf16 our all-Stream-K schedule with
128x256 tiles (78 tiles over 132 SMs, ~76 of 128 K-iterations each) timed 90 us where the
data-parallel kernel with the same tile (78 SMs busy, 128 iterations each) took 79 us: is
the Stream-K program's MAC loop slower (tensor pipe), or the fixup, or idle SMs?
Prints one line per pair and writes counters.csv and the .ncu-rep files into --out.

What it showed (H200, 2026-11-29, ncu times of one cold call): dp 81 us, tensor pipe 95%
busy but 43% of the SMs idle; all-Stream-K 88-90 us with the SMs 86% busy but the tensor
pipe only 63-65% busy and 2.7x the compulsory DRAM traffic, with 3 or 4 stages and with the
SK loop as a while or a for loop alike; split-K 5 with 128x256 tiles (k-major units, 2.95
waves) 89-104 us (tensor pipe 50-54%: the reductions cost more than the tail); torch.matmul
54 us with a 128x160 tile that makes exactly 132 tiles. The summaries are in
experiments/results/probe_counters/h200_2026-11-29_*.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advisor.run import counters as C  # noqa: E402

T256 = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3}
T128 = {"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4}
DEFAULT_PAIRS = [
    ("torch.matmul", None),
    ("dp", json.dumps(T256)),
    ("stream_k", json.dumps(dict(T256, policy="sk", deterministic=True))),
    ("stream_k", json.dumps(dict(T256, num_stages=4, policy="sk", deterministic=True))),
    ("stream_k", json.dumps(dict(T256, policy="dp", deterministic=True))),
    ("stream_k", json.dumps(dict(T128, policy="hybrid1", deterministic=True))),
    ("persistent", None),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1664x1408x8192")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--pair", action="append", default=[], metavar="PROVIDER=CONFIG_JSON",
                    help="repeatable; CONFIG_JSON may be empty for the schedule's default")
    ap.add_argument("--out", type=Path, default=Path("probe-counters"))
    args = ap.parse_args()
    M, N, K = (int(x) for x in args.shape.lower().split("x"))
    pairs = [(p.split("=", 1)[0], p.split("=", 1)[1] or None) if "=" in p else (p, None) for p in args.pair] or DEFAULT_PAIRS
    elt = 4 if args.dtype == "fp32" else 2
    res = C.collect(M, N, K, args.dtype, pairs, args.out, element_size=elt, log=lambda m: print(m, flush=True))
    C.write_rows(args.out / "counters.csv", res.rows)
    (args.out / "summaries.json").write_text(json.dumps(res.to_dict(), indent=1, default=str))
    cols = ("time_us", "tensor_pct", "sm_busy_pct", "achieved_occupancy_pct", "waves_per_sm", "dram_pct",
            "dram_x_compulsory", "registers")
    print("provider | config | " + " | ".join(cols) + " | reading")
    for s in res.summaries:
        vals = " | ".join("-" if s.get(c) is None else f"{s[c]:.2f}" for c in cols)
        print(f"{s['provider']} | {s['config']} | {vals} | {s['reading']}")
    for n in res.notes:
        print("note:", n)
    return 0 if res.summaries else 1


if __name__ == "__main__":
    sys.exit(main())
