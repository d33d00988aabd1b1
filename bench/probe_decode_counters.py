"""Where our decode kernel's time goes beyond a plain read of K and V, next to cuDNN's (H200).

    ncu --profile-from-start off --clock-control none -o rep \
        --section SpeedOfLight --section LaunchStats --section Occupancy \
        --section WarpStateStats --section MemoryWorkloadAnalysis --metrics sm__cycles_active.max,... \
        python3 bench/probe_decode_counters.py [--shapes 2:8192,2:32768,4:32768]

Per shape (bf16, 32 query heads, 8 kv heads, D 128, one query token): after one untimed call
of each (compiles, cuDNN's plan), the profiler range holds one call of our default config, of
its twin in the other schedule (search_space[1]), of cuDNN and of the flash backend, and the
bench's plain read of the same bytes (`stream_read`, 8 programs an SM, the measured floor).
ncu then gives per kernel: duration, DRAM bytes and throughput, SM active cycles (avg / max:
how evenly the SMs were busy), achieved occupancy, and the warps' stall reasons. Without ncu
the script just runs the calls (a smoke test of the set-up).

    ncu -i rep.ncu-rep --page raw --csv > raw.csv
    python3 bench/probe_decode_counters.py --summarize raw.csv   (no GPU: the markdown table)
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

import bench_split_kv as b  # noqa: E402


def calls(B: int, S: int, sms: int):
    """(label, fn()) for one shape, inputs on the GPU."""
    sh = b.prepare(B, 32, 8, 128, S, torch.bfloat16, "cuda")
    q, k, v = sh["inputs"][0]
    space = b.kv.search_space(B, 32, 8, 1, S, 128, torch.bfloat16, sms)
    out = [(f"ours {c.describe()}", lambda c=c: b.kv.decode_attention(q, k, v, c, out=sh["out"])) for c in space[:2]]
    prov = b.providers("cuda")
    out += [("cudnn", lambda: prov["sdpa_cudnn"](q, k, v)), ("flash", lambda: prov["sdpa_flash"](q, k, v))]
    kern, n = b._read_kernel(), k.numel()
    chunk = -(-n // (8 * sms) // 4096) * 4096
    part = torch.empty((-(-n // chunk),), device="cuda", dtype=torch.float32)
    out.append(("stream_read", lambda: kern[(part.numel(),)](k, v, part, n, chunk, BLOCK=4096, num_warps=8)))
    return sh, out


SUMMARY = (("kernel", "Kernel Name"), ("us", "gpu__time_duration.sum"), ("DRAM MB read", "dram__bytes_read.sum"),
           ("SM active avg", "sm__cycles_active.avg"), ("SM active max", "sm__cycles_active.max"),
           ("grid", "launch__grid_size"), ("regs", "launch__registers_per_thread"))


def summarize(path: Path) -> str:
    """One markdown row per profiled kernel of ncu's raw CSV page: its NVTX range (the shape
    and provider), duration, DRAM bytes read and the rate they imply, SM active cycles."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    head, units = rows[0], rows[1]
    col = {name: head.index(metric) for name, metric in SUMMARY if metric in head}
    nvtx = next((i for i, h in enumerate(head) if "Push/Pop_Range" in h), None)
    scale = 1000.0 if units[col["DRAM MB read"]].lower() == "gbyte" else 1.0
    out = ["| range | kernel | us | DRAM MB read | TB/s | SM active avg / max | grid | regs |",
           "|---|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows[2:]:
        us = float(r[col["us"]])
        mb = float(r[col["DRAM MB read"]]) * scale
        act_avg = float(r[col["SM active avg"]].replace(",", ""))
        act_max = float(r[col["SM active max"]].replace(",", ""))
        # '<tid>  "<default domain>:B2 S32768 ours ...:none:...' -> 'B2 S32768 ours ...'
        rng = r[nvtx].split(">:", 1)[-1].split(":none")[0] if nvtx is not None else ""
        out.append(f"| {rng} | {r[col['kernel']][:40]} | {us:.1f} | {mb:.1f} | {mb / us:.2f} | "
                   f"{act_avg / act_max:.2f} | {r[col['grid']]} | {r[col['regs']]} |")
    return "\n".join(out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="2:8192,2:32768,4:32768", help="batch:keys,...")
    p.add_argument("--summarize", type=Path, default=None, metavar="RAW_CSV",
                   help="print the markdown table of an ncu raw CSV page instead of profiling")
    args = p.parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    sms = b.kv.num_sms("cuda")
    shapes = [tuple(int(x) for x in s.split(":")) for s in args.shapes.split(",")]
    prepared = []
    for B, S in shapes:
        sh, fns = calls(B, S, sms)
        for _, fn in fns:
            fn()  # compile, plan, workspaces: outside the profiled range
        torch.cuda.synchronize()
        prepared.append((B, S, sh, fns))
    torch.cuda.cudart().cudaProfilerStart()
    for B, S, _, fns in prepared:
        for label, fn in fns:
            torch.cuda.nvtx.range_push(f"B{B} S{S} {label}")
            fn()
            torch.cuda.synchronize()
            torch.cuda.nvtx.range_pop()
            print(f"B{B} S{S}: {label}", flush=True)
    torch.cuda.cudart().cudaProfilerStop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
