"""Grouped 1-D convolutions (by default wav2vec2 / HuBERT's positional convolution: 768 channels
in 16 groups of 48, kernel 128, 8 x 499 frames), forward and backward, three ways:
cuDNN as PyTorch calls it, cuDNN with torch.backends.cudnn.benchmark, and the same convolution
as one batched GEMM a step (unfold + bmm a group); the input contiguous, and transposed from
[B, L, C] as the models call it. Each checked against a float64 reference
(output and both gradients) before it is timed (CUDA events, median of 10 after 3 warm-ups).

    python3 bench/probe_grouped_conv.py --out DIR     # DIR/grouped_conv.{csv,md}
    python3 bench/probe_grouped_conv.py --out DIR --shape 32:768:512:768:4:1 --shape ...

A shape is B:C:L:K:G:k (batch, input channels, length, output channels, groups, kernel; padding
k // 2, stride 1), e.g. SqueezeBERT's grouped 1 x 1 projections 32:768:512:768:4:1,
32:768:512:3072:4:1 and 32:3072:512:768:4:1.
"""

from __future__ import annotations

import argparse
import csv
import time
from pathlib import Path

import torch
import torch.nn.functional as F


HUBERT = "8:768:499:768:16:128"


def parse_shape(text: str) -> tuple[int, int, int, int, int, int]:
    """'B:C:L:K:G:k' -> ints, checked: C and K divisible by G."""
    try:
        B, C, L, K, G, k = (int(v) for v in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: want B:C:L:K:G:k, six integers") from None
    if min(B, C, L, K, G, k) <= 0 or C % G or K % G:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: positive sizes, C and K divisible by G")
    return B, C, L, K, G, k


def conv_as_gemm(x, w, groups: int, pad: int):
    """F.conv1d(x, w, padding=pad, groups=groups) as im2col + one bmm over the groups."""
    B, C, L = x.shape
    K, cg, k = w.shape
    g = groups
    cols = F.pad(x, (pad, pad)).unfold(2, k, 1)  # [B, C, Lout, k] (a view)
    lout = cols.shape[2]
    a = cols.reshape(B, g, cg, lout, k).permute(1, 0, 3, 2, 4).reshape(g, B * lout, cg * k)
    wg = w.reshape(g, K // g, cg * k).transpose(1, 2)  # [g, cg*k, K/g]
    out = torch.bmm(a, wg)  # [g, B*lout, K/g]
    return out.reshape(g, B, lout, K // g).permute(1, 0, 3, 2).reshape(B, K, lout)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", type=parse_shape, action="append",
                    help=f"B:C:L:K:G:k, repeatable (default {HUBERT})")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for (B, C, L, K, G, k), dtype in [(sh, dt) for sh in (args.shape or [parse_shape(HUBERT)])
                                      for dt in (torch.bfloat16, torch.float32)]:
        x0 = torch.randn(B, C, L, device=dev, generator=g)
        w0 = torch.randn(K, C // G, k, device=dev, generator=g) / (C // G * k) ** 0.5
        xd, wd = x0.double().requires_grad_(), w0.double().requires_grad_()
        yd = F.conv1d(xd, wd, padding=k // 2, groups=G)
        dy = torch.randn(yd.shape, device=dev, generator=g)
        yd.backward(dy.double())
        ref = (yd.detach(), xd.grad, wd.grad)
        for layout, name in [(lay, n) for lay in ("contiguous", "transposed") for n in ("cudnn", "cudnn_benchmark", "gemm")]:
            torch.backends.cudnn.benchmark = name == "cudnn_benchmark"
            # transposed: the hidden states [B, L, C] viewed as [B, C, L], as wav2vec2 and HuBERT call it
            # fresh leaves each time (.to of an fp32 tensor to fp32 is the tensor itself)
            leaf = (x0 if layout == "contiguous" else x0.transpose(1, 2)).to(dtype).contiguous().clone().requires_grad_()
            x = leaf if layout == "contiguous" else leaf.transpose(1, 2)
            w = w0.to(dtype).clone().requires_grad_()

            def run():
                leaf.grad = w.grad = None
                y = conv_as_gemm(x, w, G, k // 2) if name == "gemm" else F.conv1d(x, w, padding=k // 2, groups=G)
                y.backward(dy.to(dtype))
                return y

            y = run()
            dx = leaf.grad if layout == "contiguous" else leaf.grad.transpose(1, 2)
            errs = [((a.double() - r).norm() / r.norm()).item() for a, r in zip((y.detach(), dx, w.grad), ref)]
            for _ in range(3):
                run()
            times = []
            for _ in range(10):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                run()
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e) * 1e3)
            times.sort()
            rows.append({"dtype": str(dtype).split(".")[-1], "layout": layout, "impl": name,
                         "fwd_bwd_us": round(times[5], 1),
                         "rel_err_out": f"{errs[0]:.1e}", "rel_err_dx": f"{errs[1]:.1e}", "rel_err_dw": f"{errs[2]:.1e}",
                         "shape": f"x[{B},{C},{L}] w[{K},{C // G},{k}] groups {G}",
                         "gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                         "date": time.strftime("%Y-%m-%d", time.gmtime())})
            print(rows[-1], flush=True)
    torch.backends.cudnn.benchmark = False
    with open(args.out / "grouped_conv.csv", "w", newline="") as f:
        wr = csv.DictWriter(f, fieldnames=list(rows[0]))
        wr.writeheader()
        wr.writerows(rows)
    lines = [f"Grouped conv1d, forward + backward, {rows[0]['gpu']}, torch {rows[0]['torch']}, {rows[0]['date']}", "",
             "| shape | dtype | input layout | implementation | us | rel. err out / dx / dw |", "|---|---|---|---|---:|---|"]
    lines += [f"| {r['shape']} | {r['dtype']} | {r['layout']} | {r['impl']} | {r['fwd_bwd_us']} | {r['rel_err_out']} / "
              f"{r['rel_err_dx']} / {r['rel_err_dw']} |" for r in rows]
    (args.out / "grouped_conv.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
