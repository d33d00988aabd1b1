"""Why the first timing of a decode-attention config in bench_split_kv.py runs slow (H200).

    python3 bench/probe_first_timing.py [--batch 8] [--keys 131072]

One shape, prepared as the bench prepares it; then, with wall-clock stamps: our default config
timed 4 times in a row (each a fresh graph capture, bench_split_kv.time_graph), a 3 s busy
spell of it, 2 more timings, cuDNN SDPA timed twice, ours twice more. Prints each p50 with the
SM and memory clocks nvidia-smi reads right after it. If only the first timing is slow, the
cost is the first capture's (memory the graph's pool maps on first use); if the timings speed
up with wall time, it is a ramp (clocks); if they speed up only after SDPA, it is state SDPA
leaves (allocator, L2 or TLB).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

import bench_split_kv as b  # noqa: E402


def clocks() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--keys", type=int, default=131072)
    args = p.parse_args(argv)
    t0 = time.monotonic()
    sh = b.prepare(args.batch, 32, 8, 128, args.keys, torch.bfloat16, "cuda")
    cfg = b.kv.default_config(args.batch, 32, 8, 1, args.keys, 128, torch.bfloat16, b.kv.num_sms("cuda"))
    ours = b.ours(sh, cfg)
    cudnn = b.providers("cuda")["sdpa_cudnn"]
    ours(*sh["inputs"][0])
    cudnn(*sh["inputs"][0])
    torch.cuda.synchronize()
    print(f"prepared in {time.monotonic() - t0:.1f} s, sets={sh['sets']}, {cfg.describe()}, clocks {clocks()}")

    def timed(label, fn):
        times = b.time_graph(lambda i: fn(*sh["inputs"][i]), sh["sets"])
        p50 = b.quantiles(times)[0]
        print(f"{time.monotonic() - t0:7.2f} s  {label:<22} p50 {p50:9.1f} us  min {times[0]:9.1f}  max {times[-1]:9.1f}"
              f"  clocks {clocks()}", flush=True)

    for i in range(4):
        timed(f"ours #{i + 1}", ours)
    end = time.monotonic() + 3.0
    while time.monotonic() < end:
        for i in range(sh["sets"]):
            ours(*sh["inputs"][i])
        torch.cuda.synchronize()
    print(f"{time.monotonic() - t0:7.2f} s  3 s busy spell done, clocks {clocks()}")
    for i in range(2):
        timed(f"ours after busy #{i + 1}", ours)
    for i in range(2):
        timed(f"cudnn #{i + 1}", cudnn)
    for i in range(2):
        timed(f"ours after cudnn #{i + 1}", ours)
    return 0


if __name__ == "__main__":
    sys.exit(main())
