"""Which SDPA backends take which calls, on this GPU and this torch: the facts behind
dtype_churn's `sdpa_backend` cause (advisor.symptoms.sdpa_eligibility), asked of torch itself.

Each case is one scaled_dot_product_attention call in 16-bit (random inputs); it is run under
each fused backend alone (torch.nn.attention.sdpa_kernel) and the verdict (runs / refused) and
torch's own reasons (the warnings it gives before refusing) are written one row a case and
backend. Where a backend runs, its output is checked against the math backend in fp32.

    python3 bench/probe_sdpa_eligibility.py --out DIR      # writes DIR/sdpa_eligibility.{csv,md}
"""

from __future__ import annotations

import argparse
import csv
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION)


def _qkv(b, hq, hkv, L, S, D, dtype, dev, g):
    def r(*shape):
        return torch.randn(*shape, generator=g, device=dev, dtype=torch.float32).to(dtype)
    return r(b, hq, L, D), r(b, hkv, S, D), r(b, hkv, S, D)


def cases(dev, dtype):
    """(name, what it varies, args, kwargs): one knob changed from a plain 2 x 8 x 256 x 256 x 64 call."""
    g = torch.Generator(device=dev).manual_seed(0)
    B, H, L, S, D = 2, 8, 256, 256, 64
    q, k, v = _qkv(B, H, H, L, S, D, dtype, dev, g)
    full = torch.randn(B, H, L, S, generator=g, device=dev).to(dtype)
    out = [("plain", "no mask", (q, k, v), {}),
           ("mask_contiguous", f"{dtype} mask [B,H,L,S], contiguous", (q, k, v), {"attn_mask": full}),
           ("mask_last_stride_H", "same mask, laid out [B,L,S,H] (stride H on its last dim)",
            (q, k, v), {"attn_mask": full.permute(0, 2, 3, 1).contiguous().permute(0, 3, 1, 2)}),
           ("mask_broadcast", "mask [1,1,L,S] expanded (stride 0 on batch and heads)",
            (q, k, v), {"attn_mask": full[:1, :1].expand(B, H, L, S)}),
           ("mask_fp32", "fp32 mask with 16-bit q, k, v", (q, k, v), {"attn_mask": full.float()}),
           ("mask_bool", "bool mask", (q, k, v), {"attn_mask": full > 0}),
           ("mask_len_unaligned", "mask [B,H,L,S] with S = 255 (row stride not a multiple of 16 bytes)",
            (q, k[:, :, :255], v[:, :, :255]), {"attn_mask": full[..., :255].contiguous()}),
           ("q_last_stride", "q with stride 2 on its last dim", (torch.cat([q, q], -1)[..., ::2], k, v), {}),
           ("causal", "is_causal=True", (q, k, v), {"is_causal": True})]
    for d in (72, 80, 96, 160, 192, 256, 320, 512, 66):
        qd, kd, vd = _qkv(B, H, H, L, S, d, dtype, dev, g)
        out.append((f"head_dim_{d}", f"head_dim {d}, no mask", (qd, kd, vd), {}))
        out.append((f"head_dim_{d}_mask", f"head_dim {d}, {dtype} mask", (qd, kd, vd), {"attn_mask": full}))
    qg, kg, vg = _qkv(B, 32, 8, L, S, D, dtype, dev, g)
    fullg = torch.randn(B, 32, L, S, generator=g, device=dev).to(dtype)
    out.append(("gqa", "32 query / 8 KV heads, enable_gqa=True", (qg, kg, vg), {"enable_gqa": True}))
    # multi-query as Falcon's decode runs it: one K/V head broadcast over 32, a bool mask [B,1,L,S]
    for lq in (256, 1):
        qm, km, vm = _qkv(B, 32, 1, lq, S, D, dtype, dev, g)
        bmask = torch.rand(B, 1, lq, S, generator=g, device=dev) > 0.1
        for gqa in (False, True):
            tag = f"mqa_L{lq}{'_gqa' if gqa else ''}"
            out.append((tag, f"32 query / 1 KV head, L={lq}, bool mask [B,1,L,S], enable_gqa={gqa}",
                        (qm, km, vm), {"attn_mask": bmask, "enable_gqa": gqa}))
        out.append((f"mqa_L{lq}_nomask", f"32 query / 1 KV head, L={lq}, no mask, enable_gqa=False",
                    (qm, km, vm), {}))
    out.append(("gqa_mask", "32 / 8 heads, enable_gqa=True, a mask", (qg, kg, vg), {"enable_gqa": True, "attn_mask": fullg}))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"))
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    dev, dtype = "cuda", getattr(torch, args.dtype)
    meta = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "date": time.strftime("%Y-%m-%d", time.gmtime())}
    rows = []
    for name, what, a, kw in cases(dev, dtype):
        with torch.no_grad(), sdpa_kernel(SDPBackend.MATH):
            ref = F.scaled_dot_product_attention(*(t.float() for t in a),
                                                 **{k_: (v_.float() if torch.is_tensor(v_) and v_.is_floating_point() else v_)
                                                    for k_, v_ in kw.items()})
        for be in BACKENDS:
            with warnings.catch_warnings(record=True) as caught, sdpa_kernel(be), torch.no_grad():
                warnings.simplefilter("always")
                err = None
                try:
                    o = F.scaled_dot_product_attention(*a, **kw)
                    torch.cuda.synchronize()
                    verdict = "runs"
                    err = ((o.float() - ref).norm() / ref.norm()).item()
                except RuntimeError:
                    verdict = "refused"
            # torch's reasons: the lines that are not its "not used because" headers
            why = [str(w.message).split(" (Triggered internally")[0] for w in caught]
            why = [w for w in why if not w.endswith("because:") and "runtime disabled" not in w]
            rows.append({"case": name, "varies": what, "backend": be.name, "verdict": verdict,
                         "rel_err_vs_fp32_math": None if err is None else f"{err:.1e}",
                         "reason": " | ".join(why), **meta})
            print(f"{name:22s} {be.name:20s} {verdict:8s} {rows[-1]['reason'][:160]}", flush=True)
    with open(args.out / "sdpa_eligibility.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    cases_seen = list(dict.fromkeys(r["case"] for r in rows))
    lines = [f"SDPA backend eligibility, {meta['device']}, torch {meta['torch']}, {args.dtype}, {meta['date']}",
             "", "| case | varies | flash | efficient | cudnn |", "|---|---|---|---|---|"]
    for c in cases_seen:
        rs = {r["backend"]: r for r in rows if r["case"] == c}
        cell = {b: rs[b]["verdict"] for b in rs}
        lines.append(f"| {c} | {rs['FLASH_ATTENTION']['varies']} | {cell['FLASH_ATTENTION']} | "
                     f"{cell['EFFICIENT_ATTENTION']} | {cell['CUDNN_ATTENTION']} |")
    (args.out / "sdpa_eligibility.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
