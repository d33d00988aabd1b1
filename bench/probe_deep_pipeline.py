"""Deep K/V pipelines at one or two programs an SM: does fewer, deeper streams per SM beat the
sweep's winners? (docs/split_kv.md, "Fifth round")

    python3 bench/probe_deep_pipeline.py [--out DIR]          (GPU; about 2 minutes)
    python3 bench/probe_deep_pipeline.py --compile-only       (no GPU: every config built for sm_90)

Why: the sweep's stage A judged every pipeline (tile keys x stages) at 2 programs an SM, where
a 64-key tile with 5 stages or a 128-key tile with 3-4 (128-192 KB of shared memory) does not
fit twice, so those never reached stage B's 1-program-an-SM grids. The sweep's rows also hint
that fewer, deeper streams read faster at equal bytes in flight (batch 2 / 32k keys, stream
schedule: 64-key tiles, 3 stages, 2 programs an SM 72.5 us; 2 stages, 4 programs an SM 84.3).

Per bench shape (bf16, 32 query / 8 kv heads, D 128, one query): our default, SDPA's cuDNN
and flash backends, and each DEEP config in both schedules (stream: CTAS_PER_SM programs an
SM; split: the split count that fills that many), checked against the fp32 reference into a
poisoned output, CUDA-graph timed over K/V sets 3x the L2 (bench_split_kv's harness), the
default settled first and timed again last. Writes probe_deep_pipeline.csv (long format, as
split_kv.csv) and probe_deep_pipeline.md (per shape: default, cuDNN, the best deep config).
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

# (BLOCK_N, num_stages, programs an SM): 1 program an SM with 3-6 tiles in flight, and the
# sweep's own winners' pipelines as controls
DEEP = [(64, 4, 1), (64, 5, 1), (64, 6, 1), (64, 7, 1), (64, 4, 2), (128, 3, 1), (128, 4, 1), (64, 3, 2), (128, 2, 2)]
SHAPES = [(b, 32, 8, 128, s) for b in (1, 2, 4, 8) for s in (8192, 32768, 131072)]


def configs(kv, tuning, B, Hq, Hkv, S, sms):
    units = kv.work_units(B, Hq, Hkv, 1)
    out = []
    for block_n, stages, pps in DEEP:
        base = dict(BLOCK_N=block_n, num_warps=4, num_stages=stages, tma=True, combine="last_arriver")
        out.append(kv.Config(**base, stream=True, CTAS_PER_SM=pps))
        out.append(kv.Config(**base, NUM_SPLITS=tuning.fill_splits(units, sms, pps, S), CTAS_PER_SM=pps))
    return out


def compile_only() -> int:
    """Build every config for sm_90 on the CPU (tools/sm90_compile_check's stand-in driver)."""
    import torch

    from tools import sm90_compile_check as cc
    from advisor.codegen.kernel_lib import load

    kv, tuning = load("split_kv_attention"), load("split_kv_tuning")
    calls = []
    for B, Hq, Hkv, D, S in ((1, 32, 8, 128, 8192), (8, 32, 8, 128, 8192)):
        for cfg in configs(kv, tuning, B, Hq, Hkv, S, 132):
            def call(B=B, Hq=Hq, Hkv=Hkv, D=D, S=S, cfg=cfg):
                q = torch.empty((B, Hq, 1, D), dtype=torch.bfloat16)
                k = torch.empty((B, Hkv, S, D), dtype=torch.bfloat16)  # TMA needs real strides
                kv.decode_attention(q, k, k, cfg)
            calls.append(("split_kv_attention", f"{B}x{Hq}x{Hkv}x1x{S}x{D}", "bf16", cfg, call))
    return cc._compile_calls(calls)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--compile-only", action="store_true")
    args = p.parse_args(argv)
    if args.compile_only:
        return compile_only()
    import torch
    import triton

    import bench_split_kv as bs

    kv, tuning = bs.kv, bs.tuning
    out_dir = args.out or Path(os.environ.get("OUT") or HERE / "results" / "split_kv")
    out_dir.mkdir(parents=True, exist_ok=True)
    sms = kv.num_sms("cuda")
    gpu = torch.cuda.get_device_name()
    stamp = datetime.now(timezone.utc).replace(microsecond=0).isoformat()
    version = f"torch {torch.__version__}; triton {triton.__version__}"
    rows, summary = [], []
    for B, Hq, Hkv, D, S in SHAPES:
        sh = bs.prepare(B, Hq, Hkv, D, S, torch.bfloat16, "cuda")
        print(sh["name"], flush=True)
        rows.append(bs.floor_row(sh))
        default = kv.default_config(B, Hq, Hkv, 1, S, D, torch.bfloat16, sms)
        prov = bs.providers("cuda")
        for fn in (bs.ours(sh, default), prov["sdpa_cudnn"], prov["sdpa_flash"]):
            fn(*sh["inputs"][0])
        bs.settle(bs.ours(sh, default), sh)
        t_def = bs.measure(sh, "split_kv", bs.ours(sh, default), rows, print, default.describe())
        t_cudnn = bs.measure(sh, "sdpa_cudnn", prov["sdpa_cudnn"], rows, print)
        bs.measure(sh, "sdpa_flash", prov["sdpa_flash"], rows, print)
        best = None
        for cfg in configs(kv, tuning, B, Hq, Hkv, S, sms):
            t = bs.measure(sh, "deep", bs.ours(sh, cfg), rows, print, cfg.describe())
            if t is not None and (best is None or t < best[0]):
                best = (t, cfg.describe())
        t_again = bs.measure(sh, "split_kv_again", bs.ours(sh, default), rows, print, default.describe())
        summary.append((sh["name"], sh["floor_us"], t_def, t_again, t_cudnn, best))
        del sh
        torch.cuda.empty_cache()
    for r in rows:
        r.update(gpu=gpu, timestamp=stamp, version=version)
    with open(out_dir / "probe_deep_pipeline.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=bs.COLUMNS)
        w.writeheader()
        w.writerows(rows)

    def us(x):
        return f"{x:.1f}" if x is not None else "-"

    lines = [f"# Deep pipelines, bf16, {gpu}, {stamp}", "", f"{version}; {sms} SMs", "",
             "| shape | floor | default | default again | cuDNN | best deep | best deep config | cuDNN / best deep | default / best deep |",
             "|---|---:|---:|---:|---:|---:|---|---:|---:|"]
    for name, floor, t_def, t_again, t_cudnn, best in summary:
        ours_default = min(t for t in (t_def, t_again) if t is not None) if (t_def or t_again) else None
        b = best[0] if best else None
        lines.append(f"| {name} | {floor:.1f} | {us(t_def)} | {us(t_again)} | {us(t_cudnn)} | {us(b)} | "
                     f"{best[1] if best else '-'} | {t_cudnn / b:.3f}x | {ours_default / b:.3f}x |"
                     if b and t_cudnn and ours_default else f"| {name} | {floor:.1f} | {us(t_def)} | {us(t_again)} | "
                     f"{us(t_cudnn)} | {us(b)} | - | - | - |")
    (out_dir / "probe_deep_pipeline.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
