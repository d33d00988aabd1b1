"""Why FlexAttention's score_mod lost to the materialised bias (bench_attention_bias.py, H200,
2026-12-04: 4x slower on SAM's global attention), and what the cheaper remedies cost.

    python3 bench/probe_attention_bias.py [--out DIR]      (GPU, ~1 minute)

On SAM ViT-B's global shape (B 2, H 12, 4096 x 4096, D 64, fp16) and ViTDet's 32 x 32 grid:
flex_attention compiled with no score_mod, with the row term alone, with both terms, and with
both terms read from a [B, H, L, kh + kw] table; the bias built by PyTorch's broadcast add
against the same add compiled by Inductor; SDPA on a prebuilt bias; and the kernels one compiled
flex call runs (torch.profiler). Each output checked against float64 first. Writes
probe_attention_bias.{csv,md}.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_attention_bias as ab  # noqa: E402

SHAPES = [s for s in ab.SHAPES if s[0] in ("sam_b_global", "vitdet_32")]


def main(argv=None) -> int:
    from torch.nn.attention.flex_attention import flex_attention

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out_dir = args.out or Path(os.environ.get("OUT", HERE / "results" / "attention_bias"))
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu, stamp = torch.cuda.get_device_name(0), datetime.now(timezone.utc).isoformat(timespec="seconds")
    flex = torch.compile(flex_attention, dynamic=False)
    build_c = torch.compile(ab.build, dynamic=False)
    rows, lines = [], [f"# Attention-bias probe, {gpu}, {stamp}", "", f"torch {torch.__version__}", ""]

    def plain(q, k, v, rh, rw):
        return flex(q, k, v)

    def row_only(q, k, v, rh, rw):
        kw = rw.shape[-1]
        return flex(q, k, v, score_mod=lambda s, b, h, qi, ki: s + rh[b, h, qi, ki // kw])

    def both(q, k, v, rh, rw):
        kw = rw.shape[-1]
        return flex(q, k, v, score_mod=lambda s, b, h, qi, ki: s + rh[b, h, qi, ki // kw] + rw[b, h, qi, ki % kw])

    for shape in SHAPES:
        name = shape[0]
        sets = ab.make_inputs(shape, "cuda", ab.n_sets(shape, "cuda"))
        ref = ab.reference(*sets[0])
        biases = [build_c(*s[3:]) for s in sets]
        assert torch.equal(biases[0], ab.build(*sets[0][3:])), "compiled build differs"
        calls = {
            "flex_no_bias": (lambda i: plain(*sets[i]), False),
            "flex_row_term": (lambda i: row_only(*sets[i]), False),
            "flex_both_terms": (lambda i: both(*sets[i]), True),
            "build_eager": (lambda i: ab.build(*sets[i][3:]), False),
            "build_compiled": (lambda i: build_c(*sets[i][3:]), False),
            "sdpa_mask": (lambda i: F.scaled_dot_product_attention(*sets[i][:3], attn_mask=biases[i]), True),
            "compiled_build_then_sdpa": (lambda i: F.scaled_dot_product_attention(
                *sets[i][:3], attn_mask=build_c(*sets[i][3:])), True),
        }
        got = {}
        for pname, (call, check) in calls.items():
            out = call(0)
            if check:
                err = ab.rel_error(out, ref)
                assert err <= ab.TOLERANCE[shape[-1]], f"{name} {pname}: {err}"
            try:
                times, how = ab.time_graph(call, len(sets)), "graph"
            except Exception:  # noqa: BLE001
                torch.cuda.synchronize()
                times, how = ab.time_events(call, len(sets)), "events"
            p50, p20, p80 = ab.quantiles(times)
            got[pname] = p50
            rows.append(dict(shape=name, provider=pname, metric="time", unit="us", p50=p50, p20=p20, p80=p80, timer=how))
            print(f"{name:14s} {pname:26s} {p50:9.1f} us ({how})", flush=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            both(*sets[0])
            torch.cuda.synchronize()
        for e in prof.key_averages():
            if e.device_time_total > 0:
                rows.append(dict(shape=name, provider="flex_both_terms kernel: " + e.key[:120], metric="kernel_us",
                                 unit="us", p50=e.device_time_total, timer=f"{e.count} launches"))
                print(f"  kernel {e.key[:100]} {e.device_time_total:.1f} us x{e.count}", flush=True)
        lines += [f"## {name}", "", "| provider | p50 us |", "|---|---:|"] + [f"| {k} | {v:.1f} |" for k, v in got.items()] + [""]
        del sets, biases, ref
        torch.cuda.empty_cache()
    with open(out_dir / "probe_attention_bias.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["shape", "provider", "metric", "unit", "p50", "p20", "p80", "timer", "gpu",
                                          "timestamp"])
        w.writeheader()
        for r in rows:
            w.writerow({**r, "gpu": gpu, "timestamp": stamp})
    (out_dir / "probe_attention_bias.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
