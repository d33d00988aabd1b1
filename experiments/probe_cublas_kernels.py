"""Probe: which kernels does torch.matmul (cuBLAS) launch for each shape, with what grid?

    python3 experiments/probe_cublas_kernels.py [--shapes 1664x1408x8192,...]

Why: our schedules are compared with torch.matmul; its kernel name tells the tile, the
cluster and whether it splits K or runs persistent (e.g. nvjet_sm90_tst_128x256_64x4_2x1_v_
bz_coopA_NTN: 128x256x64 tiles, 4 stages, 2x1 cluster), which says what its advantage is
made of. Method: bf16 inputs, a warm call, then torch.profiler (Kineto) around three calls;
prints each GPU kernel's name, grid, block and mean duration (from the exported trace).

What it showed (H200, torch 2.11, 2026-11-29, results/probe_configs/h200_2026-11-29_cublas_
kernels.txt): on the tail shapes cuBLAS runs persistent, warp-specialized kernels (132 or 126
blocks of 384 threads: one producer and two consumer warpgroups) in 2-CTA clusters, with
tiles that fill the waves: 128x160 on 1664x1408 (117 tiles), 320x128 on 2176^2 (119),
192x128 on 2304^2, 192x192 on 3072^2 and 4224^2. On the skinny shapes it splits K with a
separate reduction kernel (1.7-4.9 us of it), except 128x8192x8192: 128x64 tiles, unsplit.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from advisor.run.bench.rows import parse_shape

SHAPES = ("1664x1408x8192,2176x2176x8192,2304x2304x4096,3072x3072x4096,4224x4224x8192,"
          "16x4096x16384,64x4096x14336,256x256x131072,512x512x65536,128x8192x8192,32x32x131072")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default=SHAPES)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for shape in args.shapes.split(","):
        M, N, K = parse_shape(shape)
        a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(K, N, device="cuda", dtype=torch.bfloat16)
        torch.matmul(a, b)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(3):
                torch.matmul(a, b)
            torch.cuda.synchronize()
        # grid and block are in the exported trace's kernel events, not in prof.events()
        with tempfile.TemporaryDirectory() as tmp:
            prof.export_chrome_trace(str(Path(tmp) / "trace.json"))
            events = json.loads((Path(tmp) / "trace.json").read_text()).get("traceEvents", [])
        seen: dict[tuple, list[float]] = {}
        for ev in events:
            if ev.get("cat") not in ("kernel", "gpu_memset", "gpu_memcpy") or "dur" not in ev:
                continue
            args = ev.get("args", {})
            key = (ev.get("name", "?"), str(args.get("grid", "-")), str(args.get("block", "-")))
            seen.setdefault(key, []).append(float(ev["dur"]))
        for (name, grid, block), times in seen.items():
            print(f"{shape:>16} {sum(times) / len(times):8.1f} us x{len(times)} grid={grid} block={block} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
