"""A materialised attention bias and its remedies, timed: what the `materialised_attention_bias`
rule may claim.

    python3 bench/bench_attention_bias.py [--out DIR]
    python3 bench/bench_attention_bias.py --device cpu --tiny      (smoke test, no timing)

The case is SAM's (and ViTDet's) decomposed relative-position bias: per query position a row
bias rel_h [B, H, L, kh] and a column bias rel_w [B, H, L, kw] whose sum over the key grid
(kh x kw = S keys) is added to the scores. Hugging Face's SAM builds the [B, H, L, S] sum in
memory with PyTorch's broadcast add and passes it to SDPA as attn_mask. Providers, per shape:

- `materialised`: the sum built by an eager broadcast add into [B, H, L, S], then SDPA with it
  (the backend PyTorch picks for a float mask); its parts `build` (the add alone) and
  `sdpa_mask` (SDPA alone on a prebuilt bias);
- `build_compiled`: the same add compiled by Inductor (one fused kernel writing the bias), and
  `compiled_build_sdpa`: that build, then SDPA;
- `augmented`: no bias in memory: rel_h and rel_w (over the scale) appended to q as kh + kw more
  channels and the key grid's one-hot row and column indicators to k, so that q' k'^T x scale is
  q k^T x scale + bias; SDPA without a mask at head dim D + kh + kw for q and k;
- `flex`: torch.compile'd flex_attention with a score_mod reading rel_h and rel_w (the bias
  computed inside the kernel from two gathers a score);
- `sdpa_nobias`: SDPA without a bias (the attention's own cost, for reference).

Each attention provider is checked first on set 0 into a NaN-poisoned output against a float64
reference; then timed by CUDA-graph replays (one graph holds a call on each of several input sets,
>= 3x the L2, replayed 30 times; event timing where a provider cannot be captured).

Writes into --out (default $OUT, else bench/results/attention_bias): attention_bias.csv (long
format) and attention_bias.md (per shape: the providers, the build's rate eager and compiled,
each remedy's speed-up over `materialised`). bench/make_calibration.py --attention-bias-rows
turns the rows into rules/measured/<gpu>.toml's [[attention_bias]] entries, which the rule reads.
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from graph_timing import REPLAYS, quantiles, time_graph  # noqa: E402

COLUMNS = ["kernel", "provider", "shape", "B", "H", "L", "S", "D", "dtype", "metric", "unit", "p50", "p20", "p80",
           "gpu", "timestamp", "version"]
# (name, B, H, query grid (qh, qw), key grid (kh, kw), D, dtype): SAM ViT-B at 1024^2 (global
# layers: a 64 x 64 grid; windowed layers: 14 x 14 windows, 25 an image), SAM ViT-L / ViT-H's
# global layers (16 heads), a ViTDet-style 32 x 32 grid
SHAPES = [
    ("sam_b_global", 2, 12, (64, 64), (64, 64), 64, torch.float16),
    ("sam_b_window", 50, 12, (14, 14), (14, 14), 64, torch.float16),
    ("sam_l_global", 1, 16, (64, 64), (64, 64), 64, torch.float16),
    ("vitdet_32", 8, 12, (32, 32), (32, 32), 64, torch.bfloat16),
    ("vitdet_32_window", 128, 12, (16, 16), (16, 16), 64, torch.bfloat16),
]
TINY = [("tiny", 2, 3, (4, 5), (4, 5), 16, torch.float32)]
# relative Frobenius error against float64: fp16 keeps 11 bits (a softmax over 4096 keys and a
# 4096-term sum land near 1e-3); bf16 8 bits; fp32 on the CPU is exact to ~1e-6
TOLERANCE = {torch.float16: 2e-3, torch.bfloat16: 1e-2, torch.float32: 1e-4}


def make_inputs(shape, device, sets, seed=0):
    """Per set fresh normal q, k, v [B, H, L|S, D] and rel_h [B, H, L, kh], rel_w [B, H, L, kw]
    (scaled as SAM's einsum of q with its position tables: O(1) per score)."""
    _, B, H, (qh, qw), (kh, kw), D, dtype = shape
    g = torch.Generator(device="cpu").manual_seed(seed)
    out = []
    for _ in range(sets):
        q, k, v = (torch.randn((B, H, n, D), generator=g).to(dtype).to(device) for n in (qh * qw, kh * kw, kh * kw))
        rh = torch.randn((B, H, qh * qw, kh), generator=g).to(dtype).to(device)
        rw = torch.randn((B, H, qh * qw, kw), generator=g).to(dtype).to(device)
        out.append((q, k, v, rh, rw))
    return out


def build(rh, rw):
    """The [B, H, L, kh * kw] bias, materialised: one broadcast add, written once."""
    B, H, L, kh = rh.shape
    return (rh[..., :, None] + rw[..., None, :]).reshape(B, H, L, kh * rw.shape[-1])


def materialised(q, k, v, rh, rw):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=build(rh, rw))


def sdpa_nobias(q, k, v, rh, rw):
    return F.scaled_dot_product_attention(q, k, v)


def augmented(q, k, v, rh, rw):
    """The decomposed bias as kh + kw more q / k channels: q' = [q, rh / scale, rw / scale],
    k' = [k, onehot(key row), onehot(key column)], so q' . k' x scale = q . k x scale + bias."""
    B, H, _, D = q.shape
    S, kh, kw = k.shape[2], rh.shape[-1], rw.shape[-1]
    scale = D ** -0.5
    keys = torch.arange(S, device=q.device)
    eh = (keys[:, None] // kw == torch.arange(kh, device=q.device)).to(q.dtype)
    ew = (keys[:, None] % kw == torch.arange(kw, device=q.device)).to(q.dtype)
    qa = torch.cat([q, rh / scale, rw / scale], dim=-1)
    ka = torch.cat([k, eh.expand(B, H, S, kh), ew.expand(B, H, S, kw)], dim=-1)
    return F.scaled_dot_product_attention(qa, ka, v, scale=scale)


def flex_fn(compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention

    attend = torch.compile(flex_attention, dynamic=False) if compiled else flex_attention

    def flex(q, k, v, rh, rw):
        kw = rw.shape[-1]

        def score_mod(score, b, h, q_idx, kv_idx):
            return score + rh[b, h, q_idx, kv_idx // kw] + rw[b, h, q_idx, kv_idx % kw]

        return attend(q, k, v, score_mod=score_mod)

    return flex


def reference(q, k, v, rh, rw):
    q64, k64, v64 = (t.double() for t in (q, k, v))
    s = q64 @ k64.transpose(-1, -2) / math.sqrt(q.shape[-1]) + build(rh.double(), rw.double())
    return torch.softmax(s, dim=-1) @ v64


def rel_error(out, ref) -> float:
    o = out.double()
    if not torch.isfinite(o).all():
        return math.inf
    return (torch.linalg.norm(o - ref) / torch.linalg.norm(ref)).item()


def time_events(call, n_sets):
    def run():
        for i in range(n_sets):
            call(i)
    run()
    torch.cuda.synchronize()
    return _replay(run, n_sets)


def _replay(run, n_sets):
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(REPLAYS)]
    for start, end in events:
        start.record()
        run()
        end.record()
    torch.cuda.synchronize()
    return sorted(s.elapsed_time(e) * 1e3 / n_sets for s, e in events)


def n_sets(shape, device) -> int:
    """Enough input sets that their q, k, v and bias terms are >= 3x the L2."""
    if device != "cuda":
        return 1
    _, B, H, (qh, qw), (kh, kw), D, dtype = shape
    L, S = qh * qw, kh * kw
    one = (B * H * (L + 2 * S) * D + B * H * L * (kh + kw)) * dtype.itemsize
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 * 2**20)
    return max(2, min(16, math.ceil(3 * l2 / one)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes, eager flex, no timing (CPU smoke test)")
    args = ap.parse_args(argv)
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run on the GPU machine, or pass --device cpu --tiny", file=sys.stderr)
        return 2
    out_dir = args.out or Path(os.environ.get("OUT", Path(__file__).resolve().parent / "results" / "attention_bias"))
    out_dir.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_name(0) if device == "cuda" else "cpu"
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    import triton

    version = f"torch {torch.__version__}; triton {triton.__version__}"
    flex = flex_fn(compiled=not args.tiny)
    build_c = build if args.tiny else torch.compile(build, dynamic=False)

    def compiled_build_sdpa(q, k, v, rh, rw):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=build_c(rh, rw))

    providers = {"materialised": materialised, "compiled_build_sdpa": compiled_build_sdpa, "augmented": augmented,
                 "flex": flex, "sdpa_nobias": sdpa_nobias}
    rows, summary, failed = [], [], []
    for shape in (TINY if args.tiny else SHAPES):
        name, B, H, (qh, qw), (kh, kw), D, dtype = shape
        L, S = qh * qw, kh * kw
        sets = make_inputs(shape, device, n_sets(shape, device))
        ref = reference(*sets[0])
        base = dict(kernel="attention", shape=name, B=B, H=H, L=L, S=S, D=D, dtype=str(dtype).replace("torch.", ""))
        got = {}
        for pname, fn in providers.items():
            poison = torch.full((B, H, L, D), float("nan"), dtype=dtype, device=device)
            try:
                out = fn(*sets[0])
                poison.copy_(out)
                err = rel_error(poison, ref) if pname != "sdpa_nobias" else 0.0
                if not err <= TOLERANCE[dtype]:
                    raise AssertionError(f"rel. error {err:.2e} > {TOLERANCE[dtype]:.0e}")
            except Exception as exc:  # noqa: BLE001  (a provider that fails is a row, not the end of the run)
                why = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''}"
                print(f"{name:18s} {pname:12s} FAILED {why}", flush=True)
                rows.append(dict(base, provider=pname, metric="status", unit=why))
                failed.append(f"{name} {pname}")
                continue
            rows.append(dict(base, provider=pname, metric="rel_err", unit="", p50=err, p20=err, p80=err))
            print(f"{name:18s} {pname:12s} ok (rel err {err:.1e})", flush=True)
        if device == "cuda":
            biases = [build(*s[3:]) for s in sets]
            calls = {
                "materialised": lambda i: materialised(*sets[i]),
                "build": lambda i: build(*sets[i][3:]),
                "sdpa_mask": lambda i: F.scaled_dot_product_attention(*sets[i][:3], attn_mask=biases[i]),
                "build_compiled": lambda i: build_c(*sets[i][3:]),
                "compiled_build_sdpa": lambda i: compiled_build_sdpa(*sets[i]),
                "augmented": lambda i: augmented(*sets[i]),
                "flex": lambda i: flex(*sets[i]),
                "sdpa_nobias": lambda i: sdpa_nobias(*sets[i]),
            }
            for pname, call in calls.items():
                if any(f == f"{name} {pname}" for f in failed):
                    continue
                try:
                    times, how = time_graph(call, len(sets)), "graph"
                except Exception as exc:  # noqa: BLE001  (not capturable: events)
                    torch.cuda.synchronize()
                    print(f"{name:18s} {pname:12s} not capturable ({str(exc).splitlines()[0][:80]}): event timing")
                    times, how = time_events(call, len(sets)), "events"
                p50, p20, p80 = quantiles(times)
                got[pname] = p50
                rows.append(dict(base, provider=pname, metric="time", unit="us", p50=p50, p20=p20, p80=p80))
                rows.append(dict(base, provider=pname, metric="timer", unit=how))
                print(f"{name:18s} {pname:12s} {p50:10.1f} us ({how})", flush=True)
            del biases
            summary.append((name, B, H, L, S, D, str(dtype).replace("torch.", ""), got))
        del sets, ref
        if device == "cuda":
            torch.cuda.empty_cache()
    with open(out_dir / "attention_bias.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for r in rows:
            w.writerow({**r, "gpu": gpu, "timestamp": stamp, "version": version})
    lines = [f"# A materialised attention bias and its remedies, {gpu}, {stamp}", "", version, "",
             "p50 us, CUDA-graph timed (one call on each of several input sets >= 3x the L2); build rates in TB/s "
             "of bias written; speed-ups over `materialised`", "",
             "| shape | B x H | L | S | D | dtype | materialised | build | sdpa_mask | build_compiled | "
             "compiled_build_sdpa | augmented | flex | sdpa_nobias | build TB/s eager / compiled | "
             "compiled_build_sdpa | augmented | flex |",
             "|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|"]

    def cell(x, f="{:.1f}"):
        return f.format(x) if x is not None else "-"

    for name, B, H, L, S, D, dt, got in summary:
        mb = B * H * L * S * getattr(torch, dt).itemsize
        rate = lambda p: mb / got[p] / 1e6 if got.get(p) else None  # noqa: E731
        speed = lambda p: got["materialised"] / got[p] if got.get(p) and got.get("materialised") else None  # noqa: E731
        lines.append(f"| {name} | {B} x {H} | {L} | {S} | {D} | {dt} | " + " | ".join(
            cell(got.get(p)) for p in ("materialised", "build", "sdpa_mask", "build_compiled", "compiled_build_sdpa",
                                       "augmented", "flex", "sdpa_nobias"))
            + f" | {cell(rate('build'), '{:.2f}')} / {cell(rate('build_compiled'), '{:.2f}')} | "
            + " | ".join(cell(speed(p), "{:.2f}x") for p in ("compiled_build_sdpa", "augmented", "flex")) + " |")
    lines += ["", f"correctness: {'all providers within tolerance' if not failed else 'FAILED: ' + ', '.join(failed)}"]
    (out_dir / "attention_bias.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
