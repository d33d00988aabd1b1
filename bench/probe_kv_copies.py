"""What a decode step's KV-cache copies cost, and what the fixes `kv_cache_copies` names buy.

Per decode shape (batch, 32 query / 8 KV heads, head_dim, cache length; bf16), one layer's
worth of each, CUDA-graph timed over K/V sets that do not fit the L2 together:

- `cat`: the KV cache grown by torch.cat (K and V: what transformers' DynamicCache does every
  step), against `index_copy`: the new token written into a preallocated cache (StaticCache).
- `repeat_kv`: K and V repeated from 8 to 32 heads (transformers' repeat_kv: expand + reshape,
  which copies), as transformers does whenever SDPA gets an explicit mask.
- attention on the repeated K/V with a mask (what then runs), against SDPA on the grouped K/V
  (`enable_gqa=True`) without and with the mask, and advisor's split-KV kernel; each variant's
  kernel names are recorded (which backend SDPA chose).
- `floor`: K and V read once at the measured HBM rate (DESIGN.md).

    python3 bench/probe_kv_copies.py --out OUTDIR     # on the GPU machine, < 1 minute

Writes OUTDIR/probe_kv_copies.csv (long format) and probe_kv_copies.md (one table).
"""

from __future__ import annotations

import argparse
import csv
import sys
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import bench_split_kv as bsk  # noqa: E402  (timing and the split-KV kernel, shared)

SHAPES = [(4, 32, 8, 64, 4096), (4, 32, 8, 64, 16384), (4, 32, 8, 128, 4096), (1, 32, 8, 128, 32768)]
COLUMNS = ["shape", "variant", "metric", "unit", "p50", "p20", "p80", "kernels", "gpu", "timestamp", "version"]


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """transformers' repeat_kv (expand then reshape: the reshape copies)."""
    b, h, s, d = x.shape
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def kernels_of(fn) -> str:
    """The GPU kernels one call launches, in order, deduplicated."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.name not in names:
            names.append(e.name)
    return " | ".join(n[:80] for n in names)


def probe(B, Hq, Hkv, D, S, dtype=torch.bfloat16):
    rep = Hq // Hkv
    elt = torch.tensor([], dtype=dtype).element_size()
    kv_set = 2 * B * Hkv * (S + 1) * D * elt
    sets = max(2, min(16, -(-3 * 60 * 2**20 // kv_set)))  # >= 3x the 60 MB L2 in all
    g = torch.Generator(device="cuda").manual_seed(S + D)

    def rnd(*shape):
        return torch.randn(shape, generator=g, device="cuda", dtype=torch.float32).to(dtype)

    q = [rnd(B, Hq, 1, D) for _ in range(sets)]
    k = [rnd(B, Hkv, S, D) for _ in range(sets)]
    v = [rnd(B, Hkv, S, D) for _ in range(sets)]
    kn = [rnd(B, Hkv, 1, D) for _ in range(sets)]
    vn = [rnd(B, Hkv, 1, D) for _ in range(sets)]
    kbuf = [torch.cat([a, b], 2) for a, b in zip(k, kn)]  # preallocated S + 1 slots
    vbuf = [torch.cat([a, b], 2) for a, b in zip(v, vn)]
    pos = torch.tensor([S], device="cuda")
    krep = [repeat_kv(x, rep) for x in k]
    vrep = [repeat_kv(x, rep) for x in v]
    mask = torch.ones(B, 1, 1, S, dtype=torch.bool, device="cuda")
    mask[:, :, :, : S // 64] = False  # a sliding window's edge: a mask that is not all True

    variants = {
        "cat": lambda i: (torch.cat([k[i], kn[i]], 2), torch.cat([v[i], vn[i]], 2)),
        "index_copy": lambda i: (kbuf[i].index_copy_(2, pos, kn[i]), vbuf[i].index_copy_(2, pos, vn[i])),
        "repeat_kv": lambda i: (repeat_kv(k[i], rep), repeat_kv(v[i], rep)),
        "attn_repeated_mask": lambda i: F.scaled_dot_product_attention(q[i], krep[i], vrep[i], attn_mask=mask),
        "attn_gqa_nomask": lambda i: F.scaled_dot_product_attention(q[i], k[i], v[i], enable_gqa=True),
        "attn_gqa_mask": lambda i: F.scaled_dot_product_attention(q[i], k[i], v[i], attn_mask=mask, enable_gqa=True),
        "attn_split_kv": lambda i: bsk.kv.decode_attention(q[i], k[i], v[i]),
    }
    # the attention variants agree (the masked ones with each other)
    ref = F.scaled_dot_product_attention(q[0].float(), krep[0].float(), vrep[0].float(), attn_mask=mask)
    for name in ("attn_gqa_mask",):
        err = (variants[name](0).float() - ref).norm() / ref.norm()
        assert err < 1e-2, (name, float(err))
    ref = F.scaled_dot_product_attention(q[0].float(), krep[0].float(), vrep[0].float())
    for name in ("attn_gqa_nomask", "attn_split_kv"):
        err = (variants[name](0).float() - ref).norm() / ref.norm()
        assert err < 1e-2, (name, float(err))
    rows = []
    shape = f"B{B}_Hq{Hq}_Hkv{Hkv}_D{D}_S{S}"
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    gpu = torch.cuda.get_device_name()
    for name, fn in variants.items():
        try:
            bsk.time_graph(fn, sets)  # settle
            times = bsk.time_graph(fn, sets)
        except Exception as exc:  # noqa: BLE001 (a variant that cannot be captured is timed eagerly)
            print(f"{shape} {name}: graph failed ({type(exc).__name__}); eager", flush=True)
            times = bsk.time_eager(fn, sets)
        p50, p20, p80 = bsk.quantiles(times)
        rows.append({"shape": shape, "variant": name, "metric": "time", "unit": "us", "p50": round(p50, 2),
                     "p20": round(p20, 2), "p80": round(p80, 2), "kernels": kernels_of(lambda: fn(0)),
                     "gpu": gpu, "timestamp": now, "version": f"torch {torch.__version__}"})
        print(f"{shape} {name}: {p50:.1f} us", flush=True)
    floor = 2 * B * Hkv * S * D * elt / bsk.HBM_BYTES_PER_S * 1e6
    rows.append({"shape": shape, "variant": "floor", "metric": "time", "unit": "us", "p50": round(floor, 2),
                 "p20": round(floor, 2), "p80": round(floor, 2), "kernels": "K and V read once at 4.27 TB/s",
                 "gpu": gpu, "timestamp": now, "version": f"torch {torch.__version__}"})
    return rows


def markdown(rows) -> str:
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    at = {(r["shape"], r["variant"]): r["p50"] for r in rows}
    out = ["| variant | " + " | ".join(shapes) + " |", "|---|" + "---:|" * len(shapes)]
    for v in variants:
        out.append(f"| {v} | " + " | ".join(f"{at.get((s, v), float('nan')):.1f}" for s in shapes) + " |")
    out.append("")
    out.append("Kernels (first shape):")
    for r in rows:
        if r["shape"] == shapes[0]:
            out.append(f"- {r['variant']}: {r['kernels']}")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for sh in SHAPES:
        rows += probe(*sh)
        torch.cuda.empty_cache()
    with open(args.out / "probe_kv_copies.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    head = f"# KV-cache copies on {rows[0]['gpu']}, {rows[0]['timestamp']}, {rows[0]['version']} (p50 us, one layer)\n\n"
    (args.out / "probe_kv_copies.md").write_text(head + markdown(rows))
    print(markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
