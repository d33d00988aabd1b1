"""Unfused attention against torch SDPA on one GPU: what the `unfused_attention` rule may claim.

    python3 bench/bench_attention_fusion.py [--out DIR]
    python3 bench/bench_attention_fusion.py --device cpu --tiny      (smoke test, no timing)

Per shape (batch x heads, query length L, key length S, head dim D, dtype, with or without an
additive bias), forward and forward + backward (gradients of q, k and v against a fixed random
output gradient): the attention a model computes op by op (`q @ k^T * scale`, `+ bias`,
`softmax`, `@ v`, as Hugging Face's eager attention, timm's non-fused attention and Swin's
window attention do) against `torch.nn.functional.scaled_dot_product_attention` on the same
tensors with the backend PyTorch picks. No dropout. Each provider is checked against a float64
reference (forward output into a NaN-poisoned buffer; dq, dk, dv against float64 autograd), then timed by CUDA-graph replays (one
graph holds one call on each of several input sets, >= 3x the L2 in all, replayed 30 times;
p20/p50/p80 per call): GPU time, the unit of the rule's estimate.

The shapes are those of real traces the rule fires on (Swin-T windows, BERT/DeBERTa, T5,
ViT-B, GPT-2, TimeSformer's temporal attention) plus a long causal one.

Writes into --out (default $OUT, else bench/results/attention_fusion): attention_fusion.csv
(long format: provider, shape, p50, p20, p80, unit, gpu, timestamp, versions) and
attention_fusion.md (per shape: eager, SDPA, eager / SDPA forward and backward, the backend SDPA
ran). Providers eager_train and sdpa_train are forward + backward.
The rule reads the ratios from rules/measured/<gpu>.toml ([[attention_fusion]]); copy them
there with the device and date.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

REPLAYS = 30

# (name, batch x heads as (B, H), L, S, D, dtype, bias, causal)
SHAPES = [
    ("swin_stage1", (2048, 3), 49, 49, 32, torch.bfloat16, True, False),
    ("swin_stage2", (512, 6), 49, 49, 32, torch.bfloat16, True, False),
    ("bert_fp32", (16, 12), 256, 256, 64, torch.float32, True, False),
    ("bert_bf16", (16, 12), 256, 256, 64, torch.bfloat16, True, False),
    ("deberta_fp16", (32, 12), 256, 256, 64, torch.float16, True, False),
    ("t5_bias", (8, 12), 512, 512, 64, torch.bfloat16, True, False),
    ("vit_b", (64, 12), 197, 197, 64, torch.bfloat16, False, False),
    ("gpt2_causal", (8, 12), 1024, 1024, 64, torch.bfloat16, False, True),
    ("timesformer_time", (1568, 12), 8, 8, 64, torch.float32, False, False),
    ("long_causal", (4, 16), 4096, 4096, 128, torch.bfloat16, False, True),
    # non-causal twins and the lengths between (the rule reads non-causal rows only: a causal
    # fused kernel skips half the scores, which an op-by-op chain in a trace may not)
    ("seq16_bf16", (1024, 12), 16, 16, 64, torch.bfloat16, False, False),
    ("seq64_bf16", (512, 12), 64, 64, 64, torch.bfloat16, False, False),
    ("seq128_bias", (256, 12), 128, 128, 64, torch.bfloat16, True, False),
    ("timesformer_time_bf16", (3136, 12), 8, 8, 64, torch.bfloat16, False, False),
    ("gpt2_full", (8, 12), 1024, 1024, 64, torch.bfloat16, False, False),
    ("timesformer_joint", (8, 12), 3137, 3137, 64, torch.bfloat16, False, False),
    ("long_d128", (4, 16), 4096, 4096, 128, torch.bfloat16, False, False),
    ("bert_fp32_512", (8, 12), 512, 512, 64, torch.float32, True, False),
    ("vit_fp32", (32, 12), 197, 197, 64, torch.float32, False, False),
]
TINY = [
    ("tiny_bias", (2, 3), 7, 9, 16, torch.float32, True, False),
    ("tiny_causal", (1, 2), 5, 5, 8, torch.float32, False, True),
]
TOL = {torch.float32: 2e-3, torch.bfloat16: 2e-2, torch.float16: 5e-3}  # tf32 / 8-bit / 11-bit mantissas


def inputs(shape, device, sets, seed=0):
    _, (B, H), L, S, D, dtype, bias, causal = shape
    g = torch.Generator(device=device).manual_seed(seed)
    out = []
    for _ in range(sets):
        q, k, v = (torch.randn(B, H, n, D, generator=g, device=device).to(dtype) for n in (L, S, S))
        b = None
        if bias:  # a relative-position bias per head, broadcast over the batch (Swin, T5)
            b = (0.5 * torch.randn(1, H, L, S, generator=g, device=device)).to(dtype)
        if causal:
            b = torch.full((L, S), float("-inf"), device=device).triu(S - L + 1).to(dtype)
        out.append((q, k, v, b))
    return out


def eager(q, k, v, b, out):
    s = torch.matmul(q, k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if b is not None:
        s = s + b
    out.copy_(torch.matmul(torch.softmax(s, dim=-1), v))


def sdpa(q, k, v, b, out):
    if b is not None and b.dim() == 2:  # the causal mask: what a model passes as is_causal
        out.copy_(F.scaled_dot_product_attention(q, k, v, is_causal=True))
    else:
        out.copy_(F.scaled_dot_product_attention(q, k, v, attn_mask=b))


def _train(fn):
    """Forward and backward of `fn` (eager or sdpa) with a fixed output gradient: writes dq, the
    gradients of k and v go to scratch (they are checked in check_train)."""
    def step(q, k, v, b, out):
        q_, k_, v_ = (x.detach().requires_grad_(True) for x in (q, k, v))
        o = torch.empty_like(q_)
        # the forward as the model runs it, without the copy into a preallocated output
        if fn is eager:
            s = torch.matmul(q_, k_.transpose(-1, -2)) * (q_.shape[-1] ** -0.5)
            o = torch.matmul(torch.softmax(s if b is None else s + b, dim=-1), v_)
        elif b is not None and b.dim() == 2:
            o = F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)
        else:
            o = F.scaled_dot_product_attention(q_, k_, v_, attn_mask=b)
        dq, dk, dv = torch.autograd.grad(o, (q_, k_, v_), _GRAD[q.shape, q.dtype])
        out.copy_(dq)
        step.last = (dq, dk, dv)
    return step


_GRAD: dict = {}  # a fixed output gradient per (shape, dtype): random, not ones


def reference(q, k, v, b):
    q, k, v = q.double(), k.double(), v.double()
    s = q @ k.transpose(-1, -2) * (q.shape[-1] ** -0.5)
    if b is not None:
        s = s + b.double()
    return torch.softmax(s, dim=-1) @ v


def backend_of(q, k, v, b) -> str:
    """The SDPA backend PyTorch picks for these inputs, by trying each alone (first that runs,
    in PyTorch's own priority order)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if q.device.type != "cuda":
        return "math"
    causal = b is not None and b.dim() == 2
    kw = {"is_causal": True} if causal else {"attn_mask": b}
    for name in ("CUDNN_ATTENTION", "FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH"):
        be = getattr(SDPBackend, name, None)
        if be is None:
            continue
        try:
            with sdpa_kernel(be):
                F.scaled_dot_product_attention(q, k, v, **kw)
            return name.lower()
        except RuntimeError:
            continue
    return "none"


def check(fn, sets, shape) -> float:
    q, k, v, b = sets[0]
    out = torch.full_like(q, float("nan"))
    fn(q, k, v, b, out)
    ref = reference(q, k, v, b)
    err = float((out.double() - ref).norm() / ref.norm())
    if not math.isfinite(err) or err > TOL[shape[5]]:
        raise AssertionError(f"{shape[0]}: relative error {err:.2e} over {TOL[shape[5]]:g}")
    return err


def check_train(fn, sets, shape) -> float:
    """The worst relative error of dq, dk, dv against float64 autograd."""
    q, k, v, b = sets[0]
    step = _train(fn)
    step(q, k, v, b, torch.full_like(q, float("nan")))
    qd, kd, vd = (x.double().detach().requires_grad_(True) for x in (q, k, v))
    ref = torch.autograd.grad(reference(qd, kd, vd, b), (qd, kd, vd), _GRAD[q.shape, q.dtype].double())
    errs = [float((g.double() - r).norm() / r.norm()) for g, r in zip(step.last, ref)]
    worst = max(errs)
    if not math.isfinite(worst) or worst > 2 * TOL[shape[5]]:  # two products more than the forward
        raise AssertionError(f"{shape[0]}: backward relative error {worst:.2e} over {2 * TOL[shape[5]]:g}")
    return worst


def time_graph(fn, sets):
    outs = [torch.empty_like(s[0]) for s in sets]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for s, o in zip(sets, outs):
            fn(*s, o)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for s, o in zip(sets, outs):
            fn(*s, o)
    graph.replay()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPLAYS)]
    for start, end in events:
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) * 1e3 / len(sets) for s, e in events)


def time_events(fn, sets):
    """Per-call microseconds from CUDA events around eager calls (includes host gaps)."""
    outs = [torch.empty_like(x[0]) for x in sets]
    for x, o in zip(sets, outs):
        fn(*x, o)
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPLAYS)]
    for j, (start, end) in enumerate(events):
        start.record()
        fn(*sets[j % len(sets)], outs[j % len(sets)])
        end.record()
    torch.cuda.synchronize()
    return sorted(a.elapsed_time(b) * 1e3 for a, b in events)


def n_sets(shape, device) -> int:
    if device != "cuda":
        return 1
    _, (B, H), L, S, D, dtype, bias, _ = shape
    elt = torch.finfo(dtype).bits // 8
    per = elt * B * H * (2 * L * D + 2 * S * D + L * S) + (elt * H * L * S if bias else 0)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(2, min(16, math.ceil(3 * l2 / per)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "bench/results/attention_fusion"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="small shapes, check only (CPU smoke test)")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    shapes = TINY if args.tiny else SHAPES
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    versions = f"torch {torch.__version__}"
    rows, table = [], []
    for shape in shapes:
        name, (B, H), L, S, D, dtype, bias, causal = shape
        sets = inputs(shape, args.device, n_sets(shape, args.device))
        g = torch.Generator(device=args.device).manual_seed(1)
        _GRAD[sets[0][0].shape, dtype] = torch.randn(sets[0][0].shape, generator=g, device=args.device).to(dtype)
        errs = {p: check(fn, sets, shape) for p, fn in (("eager", eager), ("sdpa", sdpa))}
        errs.update({f"{p}_train": check_train(fn, sets, shape) for p, fn in (("eager", eager), ("sdpa", sdpa))})
        be = backend_of(*sets[0])
        res = {}
        if args.device == "cuda":
            for p, fn in (("eager", eager), ("sdpa", sdpa), ("eager_train", _train(eager)), ("sdpa_train", _train(sdpa))):
                try:
                    t = time_graph(fn, sets)
                except RuntimeError as exc:  # a backward that cannot be captured: events around eager calls
                    print(f"{name} {p}: graph capture failed ({str(exc)[:120]}); timing eager calls", flush=True)
                    torch.cuda.synchronize()
                    t = time_events(fn, sets)
                res[p] = t
                q = lambda f: t[min(len(t) - 1, int(f * len(t)))]  # noqa: E731
                rows.append({"provider": p, "shape": name, "BH": B * H, "L": L, "S": S, "D": D,
                             "dtype": str(dtype).removeprefix("torch."), "bias": bias, "causal": causal,
                             "backend": be if p.startswith("sdpa") else "eager", "p50": round(q(0.5), 3),
                             "p20": round(q(0.2), 3), "p80": round(q(0.8), 3), "unit": "us",
                             "rel_err": f"{errs[p]:.2e}", "gpu": gpu, "timestamp": stamp, "versions": versions})
        med = {p: (t[len(t) // 2] if t else float("nan")) for p, t in res.items()} or \
            dict.fromkeys(("eager", "sdpa", "eager_train", "sdpa_train"), float("nan"))
        e50, s50 = med["eager"], med["sdpa"]
        eb, sb = med["eager_train"] - e50, med["sdpa_train"] - s50  # the backward alone
        table.append((name, B * H, L, S, D, str(dtype).removeprefix("torch."), bias, causal, be, e50, s50, eb, sb))
        print(json.dumps({"shape": name, "backend": be, "eager_us": round(e50, 2), "sdpa_us": round(s50, 2),
                          "eager_bwd_us": round(eb, 2), "sdpa_bwd_us": round(sb, 2),
                          "errors": {p: f"{e:.1e}" for p, e in errs.items()}}), flush=True)
    if rows:
        with open(args.out / "attention_fusion.csv", "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(rows[0]))
            w.writeheader()
            w.writerows(rows)
    lines = [f"# Unfused attention vs SDPA ({gpu}, {stamp}, {versions})", "",
             "CUDA-graph timed, median us per call; SDPA with the backend PyTorch picked. Backward = "
             "(forward + backward) - forward of the same provider.", "",
             "| shape | B x H | L | S | D | dtype | bias | causal | SDPA backend | eager fwd us | SDPA fwd us | fwd ratio "
             "| eager bwd us | SDPA bwd us | bwd ratio |",
             "|---|---:|---:|---:|---:|---|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, bh, L, S, D, dt, bias, causal, be, e, s, eb, sb in table:
        lines.append(f"| {name} | {bh} | {L} | {S} | {D} | {dt} | {bias} | {causal} | {be} | {e:.1f} | {s:.1f} | "
                     f"{e / s:.2f}x | {eb:.1f} | {sb:.1f} | {eb / sb:.2f}x |")
    (args.out / "attention_fusion.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
