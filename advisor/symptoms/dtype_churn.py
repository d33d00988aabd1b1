"""dtype_churn: fp32 GEMMs beside a 16-bit majority, and the casts they bring (Tier 2: dtype).

What it detects: on one device, GEMMs that run in fp32 (full-fp32 SIMT kernels, TF32 kernels,
or Kineto `Input type` float) while most GEMM time is in other, tensor-core kernels (bf16 or
fp16), plus the cast kernels next to them on the same stream (ATen `bfloat16_copy_kernel`,
`direct_copy_kernel` with a cast, `LoadWithCast`...). The usual cause: part of a bf16 model left
in fp32 (PEFT/LoRA adapters, which PEFT upcasts by default; a head or norm kept in fp32; a
buffer created with the default dtype).
Why it matters: those GEMMs run on the fp32 path, several times slower than bf16 tensor cores,
and each call adds casts in and out. No kernel schedule fixes either (Split-K of a SIMT GEMM
is not the fix, so Tier-4 rules skip these kernels: kernel_kinds.schedule_excluded).
What to do: cast that part to the model's dtype (`peft_model.to(torch.bfloat16)`, or
`get_peft_model(..., autocast_adapter_dtype=False)`), or run under autocast.
Estimate: the adjacent casts' time plus each fp32 GEMM group's time minus its floor at the
16-bit tensor-core rate (roofline.gemm_estimate: compute at the measured peak, HBM at the
measured bandwidth with 2-byte elements, a launch's latency); `bound_ns` is that floor.
SDPA's math backend (fp32 GEMMs inside aten::_scaled_dot_product_attention_math) is its own
cause, strategy `sdpa_backend`: sdpa_eligibility names what refused the fused backends from the
calls' recorded inputs, and where it does, the fix lets a fused backend take the calls, so the
estimate is the larger of the above and the math path's forward kernels over the speedup SDPA
measured over op-by-op attention near the shape (unfused_attention.fused_estimate).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..findings import Finding
from ..rules import Rule
from .context import Context, as_int, by_device, finding_for, group_launches, has_backward, launch_rows, shape_of
from .kernel_kinds import device_row, gemm_time_by_precision, gemm_work, kinds, row_precision
from .gemm import innermost_ranges
from .calibration import has_bf16
from .roofline import gemm_estimate
from .sdpa_eligibility import math_sdpa_calls, math_sdpa_causes, math_sdpa_groups
from .unfused_attention import fused_estimate

SYMPTOM = "dtype_churn"
REQUIRES = (("kernels", "name", "Does the trace name its kernels?"),)

FP32_CLASSES = ("fp32", "tf32", "fp32_dtype")
FIX = ("peft_model.to(torch.bfloat16)  # or get_peft_model(model, config, autocast_adapter_dtype=False), "
       "or torch.autocast(\"cuda\", dtype=torch.bfloat16)")


def _adjacent_casts(ctx: Context, fp32_gemm: np.ndarray, cast: np.ndarray, window: int) -> np.ndarray:
    """Cast kernels within `window` launches of an fp32 GEMM on the same stream (the casts in
    and out of the fp32 part, not every cast of the program: a loss upcast stays after the fix)."""
    k = ctx.kernels
    hit = np.zeros(len(k), dtype=bool)
    if not fp32_gemm.any() or not cast.any():
        return hit
    keys = ["rank", "device_id", "stream_id"]
    frame = k[keys + ["start_ns"]].assign(_pos=np.arange(len(k)))
    for _, s in frame.groupby([frame[c].fillna(-1) for c in keys], sort=False):
        s = s.sort_values("start_ns", kind="stable")
        pos = s["_pos"].to_numpy()
        g_idx = np.flatnonzero(fp32_gemm[pos])
        if not len(g_idx):
            continue
        c_idx = np.flatnonzero(cast[pos])
        if not len(c_idx):
            continue
        j = np.searchsorted(g_idx, c_idx)
        before = np.abs(c_idx - g_idx[np.clip(j - 1, 0, len(g_idx) - 1)])
        after = np.abs(g_idx[np.clip(j, 0, len(g_idx) - 1)] - c_idx)
        near = np.minimum(before, after) <= window
        hit[pos[c_idx[near]]] = True
    return hit


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    """Launch groups of fp32 GEMMs (kind="gemm") and of the casts next to them (kind="cast"),
    with the device's GEMM time by precision."""
    k = ctx.kernels
    kk = kinds(ctx)
    fp32 = kk["precision"].isin(FP32_CLASSES).to_numpy(dtype=bool)
    if fp32.any():
        # fp32 convolutions whose 16-bit version measured slower: slow_convolution's remedy
        from .slow_convolution import fp32_by_choice

        conv_rule = ctx.rules.get("slow_convolution")
        near = float(conv_rule["near_factor"]) if conv_rule is not None and conv_rule.enabled else None
        fp32 = fp32 & ~fp32_by_choice(ctx, near)
    if not fp32.any():
        return pd.DataFrame()
    casts = _adjacent_casts(ctx, fp32, kk["is_cast"].to_numpy(dtype=bool), int(rule["cast_window"]))
    parts = []
    for kind, mask in (("gemm", fp32), ("cast", casts)):
        grp = group_launches(launch_rows(k, mask, []), [], k)
        if len(grp):
            parts.append(grp.assign(kind=kind))
    out = pd.concat(parts, ignore_index=True)
    by = gemm_time_by_precision(ctx)
    key = list(zip(out["rank"].astype("int64"), out["device_id"].fillna(-1).astype("int64")))
    for col, src in (("device_gemm_ns", "gemm"), ("device_16bit_ns", "16bit"), ("device_tf32_ns", "tf32")):
        out[col] = [int(by.loc[x, src]) if x in by.index else 0 for x in key]
    out["device_fp32_class_ns"] = [int(by.loc[x, list(FP32_CLASSES)].sum()) if x in by.index else 0 for x in key]
    return out


def fp32_ops(ctx: Context, rank, dev) -> list[str]:
    """The operators (Kineto cpu_op, emit_nvtx) the device's fp32 GEMMs ran under."""
    k = ctx.kernels
    on = (k["rank"] == rank).to_numpy() & (k["device_id"].fillna(-1).astype("int64") == dev).to_numpy()
    fp32 = kinds(ctx)["precision"].isin(FP32_CLASSES).to_numpy(dtype=bool)
    return sorted({str(o) for o in k.loc[on & fp32, "op"].dropna().unique()})


MATH_SDPA = "_scaled_dot_product_attention_math"
MATH_SDPA_FIX = ("torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)  # or make a fused SDPA backend "
                 "eligible: under torch.nn.attention.sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION) the call fails "
                 "with the reason it was not")


def _fused_claim(calls: list[dict], rule: Rule, device) -> dict | None:
    """What a fused backend would save on the math backend's forward calls that a named refusal
    explains (calls no named cause explains are not claimed: the fix named does not move them):
    each shape group's kernel time inside the calls over the speedup SDPA measured over op-by-op
    16-bit attention near that shape (a math backend computing in fp32 is slower than that
    op-by-op chain, so this errs low), never under the fused kernel's roofline; groups with no
    measured ratio near them claim nothing. The backward is not claimed (a training step gains
    there too). At most medium confidence: the ratio was measured against a 16-bit op-by-op
    chain, not this backend."""
    groups = math_sdpa_groups([c for c in calls if c["causes"]])
    saved = total = floor = 0.0
    launches = 0
    conf_rank = {"high": 2, "medium": 1, "low": 0}
    worst, basis, claimed = "medium", None, 0
    for g in groups:
        fused, conf, why, ratio = fused_estimate(g, rule, device, g["dtype"])
        if ratio is None or fused >= g["total_ns"]:
            continue
        total += g["total_ns"]
        launches += g["launches"]
        saved += g["total_ns"] - fused
        floor += fused
        claimed += 1
        worst = min(worst, conf, key=conf_rank.get)
        basis = basis or (f"{g['calls']} math-backend calls of [{g['BH']}, {g['L']}, {g['S']}, {g['D']}] took "
                          f"{g['total_ns'] / 1e6:.2f} ms of kernels; fused: {why}")
    if saved <= 0:
        return None
    more = len(groups) - claimed
    return {"saved": saved, "total": total, "floor": floor, "launches": launches, "confidence": worst,
            "basis": basis + (f" (and {claimed - 1} more shape group{'s' if claimed > 2 else ''})" if claimed > 1 else "")
            + (f"; {more} shape group{'s' if more > 1 else ''} with no measured SDPA speedup near "
               f"{'them' if more > 1 else 'it'} (e.g. one query a call) claim nothing" if more else "")}


def _refusal_fix(causes: list[dict]) -> str:
    """The fix for what refused the fused backends (the most calls' cause first), with the
    math backend's 16-bit reduction as the fallback."""
    return ("; ".join(c["fix"] for c in causes) + "  # a fused backend then takes the call; failing that, "
            "torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)")


def math_sdpa_launches(ctx: Context, rank, dev) -> int:
    """fp32 GEMM launches of the device made inside SDPA's math backend (a Kineto cpu_op or an
    emit_nvtx range named `_scaled_dot_product_attention_math`). PyTorch's math backend computes
    bf16/fp16 inputs in fp32 unless told otherwise, so these GEMMs are fp32 in a model that is
    16-bit (even under autocast): the fix is the SDPA backend, not the model's dtype."""
    trace = ctx.trace
    parts = []
    if len(trace.cpu_ops):
        o = trace.cpu_ops
        parts.append(o.loc[o["name"].astype(str).str.endswith(MATH_SDPA), ["rank", "thread_id", "start_ns", "end_ns"]])
    if len(trace.nvtx):
        nv = trace.nvtx
        hit = nv["text"].astype(str).str.contains(MATH_SDPA + r"\b", regex=True)
        parts.append(nv.loc[hit, ["rank", "thread_id", "start_ns", "end_ns"]])
    ranges = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    if not len(ranges):
        return 0
    _, hit = innermost_ranges(trace, ranges)
    k = ctx.kernels
    on = (k["rank"] == rank).to_numpy() & (k["device_id"].fillna(-1).astype("int64") == dev).to_numpy()
    fp32 = kinds(ctx)["precision"].isin(FP32_CLASSES).to_numpy(dtype=bool)
    return int((on & fp32 & (hit >= 0)).sum())


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    if ev.empty:
        return out
    for (rank, dev), grp in by_device(ev):
        gemms, casts = grp[grp["kind"] == "gemm"], grp[grp["kind"] == "cast"]
        if gemms.empty:
            continue
        fp32_ns = int(grp["device_fp32_class_ns"].iloc[0])
        bit16_ns = int(grp["device_16bit_ns"].iloc[0])
        cast_ns = int(casts["total_ns"].sum())
        device = device_row(ctx, rank, dev)
        # a 16-bit majority of the GEMM work (time weighted by rate: fp32 GEMMs are slow), and
        # evidence that it is 16-bit
        tf32_ns = int(grp["device_tf32_ns"].iloc[0])
        w32, wt, w16 = gemm_work(fp32_ns - tf32_ns, tf32_ns, bit16_ns, device)
        fp32_share = (w32 + wt) / (w32 + wt + w16) if (w32 + wt + w16) else 1.0
        if fp32_share >= rule["max_fp32_gemm_share"] or (bit16_ns == 0 and cast_ns == 0):
            continue
        target = "bf16" if has_bf16(device) else "fp16"
        savings, floor, shaped_ns, basis, rows = cast_ns, 0, 0, None, []
        for row in gemms.to_dict("records"):
            shape = shape_of(row)
            own = {"fp32": "fp32", "tf32": "tf32"}.get(row_precision(row), "fp32")
            est = gemm_estimate(row["total_ns"], int(row["launches"]), shape, device, target, 2, rule["latency_floor_ns"], own=own)
            if est is None:
                continue
            savings += est["savings_ns"]
            floor += est["floor_ns"]
            shaped_ns += row["total_ns"] if est["shaped"] else 0
            basis = basis or est["basis"]
            rows.append((row, shape))
        gemm_fp32_ns = int(gemms["total_ns"].sum())
        if not rows:
            continue
        in_math_sdpa = math_sdpa_launches(ctx, rank, dev)
        # the math backend's forward GEMMs are a third of its fp32 launches (two per backward)
        by_sdpa = in_math_sdpa >= rule["math_sdpa_min_share"] * int(gemms["launches"].sum())
        calls = math_sdpa_calls(ctx, rank, dev) if in_math_sdpa else []
        refusals = math_sdpa_causes(calls)
        causes = refusals.get("causes", [])
        total_ns = gemm_fp32_ns + cast_ns
        launches = int(gemms["launches"].sum() + casts["launches"].sum())
        # without shapes the GEMMs' part is a rate ratio (a guess); the casts' time is measured
        confidence = "high" if shaped_ns >= 0.5 * gemm_fp32_ns else ("medium" if cast_ns >= 0.5 * savings else "low")
        basis_text = f"the adjacent casts' time plus each fp32 GEMM group's time minus its floor on the {target} path; e.g. {basis}"
        fused = _fused_claim(calls, rule, device) if by_sdpa and causes else None
        if fused and fused["saved"] > savings:
            # the named fix lets a fused backend take the calls: the whole math path goes, not
            # only its fp32 GEMMs (UMT5 on the H200: 3.2 ms claimed that way, 9.3 ms measured).
            # total: the larger of the two sets of kernels; bound: what the estimate leaves of it
            savings, confidence = fused["saved"], fused["confidence"]
            basis_text = f"a fused backend in place of the math backend's forward: {fused['basis']}"
            if fused["total"] > total_ns:
                total_ns, launches = int(fused["total"]), fused["launches"]
            floor = total_ns - savings
        share = ctx.share(rank, dev, savings)
        if savings < rule["min_savings_ns"] or share < rule["min_savings_share"]:
            continue
        top, top_shape = rows[0]
        ops = fp32_ops(ctx, rank, dev)
        shapes = [f"{s['M']}x{s['N']}x{s['K']}" for _, s in rows if s][:8]
        out.append(
            finding_for(
                rule, top,
                rank=as_int(rank),
                device_id=None if dev < 0 else int(dev),
                shape=top_shape,
                launches=launches,
                total_ns=total_ns,
                est_savings_ns=int(savings),
                confidence=confidence,
                tier=2,
                evidence={
                    "fp32_gemm_ns": gemm_fp32_ns,
                    "fp32_gemm_launches": int(gemms["launches"].sum()),
                    "fp32_gemm_share": round(fp32_share, 3),
                    "bf16_gemm_ns": bit16_ns,
                    "cast_ns": cast_ns,
                    "cast_launches": int(casts["launches"].sum()),
                    "fp32_ops": ops,
                    "fp32_shapes": shapes,
                    "share_of_gpu_time": round(share, 4),
                    "target_precision": target,
                    "bound_ns": int(floor),
                    "basis": basis_text,
                    # the GEMMs and casts only: the math path's other kernels (softmax,
                    # elementwise) share names with kernels elsewhere in the program
                    "covers_kernels": sorted({str(r["name"]) for r, _ in rows} | {str(n) for n in casts["name"]}),
                    "math_sdpa_launches": in_math_sdpa,
                    **({"cause": f"{in_math_sdpa} of the fp32 GEMM launches run inside SDPA's math backend "
                                 f"(aten::{MATH_SDPA}), which computes {target} inputs in fp32 by default"
                                 + (f"; {outside} more run outside its range"
                                    + (" (its backward's GEMMs are fp32 too)" if has_backward(ctx) else "")
                                    if (outside := int(gemms["launches"].sum()) - in_math_sdpa) > 0
                                    else "")
                                 + "".join(f"; the fused backends refused {c['calls']} of its {refusals['calls']} "
                                           f"calls because {c['why']}" for c in causes)} if in_math_sdpa else {}),
                    **({"math_sdpa_refusals": [{k: c[k] for k in ("code", "calls", "why")} for c in causes],
                        "math_sdpa_calls": refusals["calls"], "math_sdpa_unexplained": refusals["unexplained"]}
                       if refusals else {}),
                },
                suggestion={"fix": (_refusal_fix(causes) if causes else MATH_SDPA_FIX) if by_sdpa else FIX,
                            "precision": target},
                strategy=rule.strategy_for("math_sdpa" if by_sdpa else "cast"),
            )
        )
    return out
