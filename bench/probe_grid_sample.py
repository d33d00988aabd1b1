"""grid_sample's backward in Deformable DETR's PyTorch attention path: what would a fix reach?

    python3 bench/probe_grid_sample.py [--out DIR]     (GPU; under a minute)

Why: the thirteenth hold-out set (docs/holdout.md) found `grid_sampler_2d_backward_kernel`
taking 28.6 of 91.1 ms of a Deformable DETR training step's kernels (fp32: autocast keeps
grid_sample in fp32), unsaid by any rule. Before a rule names a fix, time the candidates on the
step's own shapes, side by side in one run: the eager op, the same function under torch.compile
(Inductor's decomposition), and eager in bf16 (inputs cast; not what autocast does).

Per level of the encoder (value [32, 32, H, W], sampling grid [32, 8500, 4, 2], bilinear, zero
padding, align_corners=False): forward and backward of sum(grid_sample(value, grid) * w) with
respect to value and grid, each checked against the eager fp32 gradients (relative Frobenius
error) before it is timed. CUDA events around 10 calls on rotating input sets, p20/p50/p80 over
7 repeats, per call. Writes probe_grid_sample.csv (long format) and probe_grid_sample.md.
"""

from __future__ import annotations

import argparse
import csv
import os
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

from bench_memory_bound import _pct, _time  # beside this script: events around 10 calls on rotating sets

LEVELS = [(80, 80), (40, 40), (20, 20)]  # 640^2 through resnet50 strides 8, 16, 32
B_HEADS, HEAD_DIM, QUERIES, POINTS = 32, 32, 8500, 4


def _rel(a, b) -> float:
    a, b = a.double(), b.double()
    return float(torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30))


def _fn(value, grid, w):
    return (F.grid_sample(value, grid, mode="bilinear", padding_mode="zeros", align_corners=False) * w).sum()


def _sets(h, w, n, dtype=torch.float32):
    out = []
    for s in range(n):
        g = torch.Generator(device="cuda").manual_seed(s)
        value = torch.randn(B_HEADS, HEAD_DIM, h, w, device="cuda", generator=g).to(dtype).requires_grad_(True)
        # deformable attention's sampling locations cluster around each query's reference point
        grid = (torch.rand(B_HEADS, QUERIES, POINTS, 2, device="cuda", generator=g) * 2 - 1).to(dtype)
        grid.requires_grad_(True)
        wt = torch.randn(B_HEADS, HEAD_DIM, QUERIES, POINTS, device="cuda", generator=g).to(dtype)
        out.append((value, grid, wt))
    return out


def _step(fn, value, grid, w):
    value.grad = grid.grad = None
    fn(value, grid, w).backward()
    return value.grad, grid.grad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    out = args.out or Path(os.environ.get("OUT", Path(__file__).resolve().parent / "results" / "grid_sample"))
    out.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0)
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    version = f"torch {torch.__version__}"
    compiled = torch.compile(_fn, dynamic=False)
    rows, lines = [], [f"# grid_sample forward + backward, Deformable DETR encoder shapes, {gpu}, {stamp}", "",
                       version, "", "| level | eager fp32 us | compiled fp32 us | eager bf16 us | compiled / eager | "
                       "bf16 / eager | compiled rel err (d value, d grid) | bf16 rel err |", "|---|---:|---:|---:|---:|---:|---|---|"]
    for h, w in LEVELS:
        sets = _sets(h, w, 3)
        ref = [t.clone() for t in _step(_fn, *sets[0])]
        got = [t.clone() for t in _step(compiled, *sets[0])]
        err_c = [_rel(a, b) for a, b in zip(got, ref)]
        sets16 = [tuple(t.detach().bfloat16().requires_grad_(t.requires_grad) for t in s) for s in sets]
        g16 = _step(_fn, *sets16[0])
        err_b = [_rel(a.float(), b) for a, b in zip(g16, ref)]
        res = {}
        for name, fn, ss in (("eager_fp32", _fn, sets), ("compiled_fp32", compiled, sets), ("eager_bf16", _fn, sets16)):
            t = _time(lambda *a, fn=fn: _step(fn, *a), ss, 7)
            res[name] = [_pct(t, q) for q in (0.5, 0.2, 0.8)]
            rows.append(dict(case=f"level {h}x{w}", provider=name, metric="fwd+bwd", unit="us", p50=res[name][0],
                             p20=res[name][1], p80=res[name][2], gpu=gpu, timestamp=stamp, version=version))
        e, c, b = res["eager_fp32"][0], res["compiled_fp32"][0], res["eager_bf16"][0]
        lines.append(f"| {h}x{w} | {e:.1f} | {c:.1f} | {b:.1f} | {c / e:.2f}x | {b / e:.2f}x | "
                     f"{err_c[0]:.1e}, {err_c[1]:.1e} | {err_b[0]:.1e}, {err_b[1]:.1e} |")
        print(lines[-1], flush=True)
    with open(out / "probe_grid_sample.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    (out / "probe_grid_sample.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
