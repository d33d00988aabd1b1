"""tensor_cores_unused: a trace whose GEMM time is mostly full-fp32 kernels (Tier 3: precision).

What it detects: on one device, most GEMM time in kernels that do fp32 arithmetic without
tensor cores: cuBLAS/cuDNN SIMT kernels (`sm80_xmma_gemm_f32f32_..._ffma`, `*sgemm*`,
`volta_scudnn*`, `gemmSN<float>`), CUTLASS `simt_sgemm`, Tensile fp32 kernels without XF32
(kernel_kinds.gemm_precision). PyTorch's default fp32 matmul precision ("highest") runs them.
Why it matters: the fp32 path runs at a fraction of the tensor-core rate (about 51 against 350
TFLOP/s TF32 and 700 bf16 on the H200), so every GEMM of the model runs several times slower
than it could; no kernel schedule (Split-K, Stream-K, warp specialization) closes that gap,
and those are not offered on these kernels (kernel_kinds.schedule_excluded).
What to do: `torch.backends.cuda.matmul.allow_tf32 = True` (or
`torch.set_float32_matmul_precision("high")`), or bf16 autocast; on devices without TF32
(Volta, Turing, CDNA4) fp16/bf16 autocast. Convolutions follow cuDNN's own switch
(`torch.backends.cudnn.allow_tf32`, on by default): fp32 convolution kernels beside TF32 ones
on the same device are cuDNN's pick for their shapes (a 3-channel stem), a note, not a finding.
Estimate: per GEMM group, its time minus its floor on the TF32 path (16-bit where there is no
TF32): the larger of flops / the measured-or-derated peak (calibration.peak_flops) and bytes /
the measured bandwidth, at least a launch's latency; without a shape, its time x fp32 peak /
TF32 peak. `bound_ns` is that floor summed; `basis` says which was used.
"""

from __future__ import annotations

import pandas as pd

from ..findings import Finding
from ..rules import Rule
from .context import Context, as_int, by_device, finding_for, group_launches, launch_rows, shape_of
from .kernel_kinds import _enabled, device_row, gemm_time_by_precision, gemm_work, kinds
from .attention_chains import chain_kernels
from .launch_ops import CUDNN_OPS, launched_inside
from .calibration import has_tf32
from .roofline import gemm_estimate

SYMPTOM = "tensor_cores_unused"
REQUIRES = (("kernels", "name", "Does the trace name its kernels?"),)

FIX_TF32 = 'torch.backends.cuda.matmul.allow_tf32 = True  # or torch.set_float32_matmul_precision("high"); bf16 autocast for more'
FIX_16BIT = "with torch.autocast(\"cuda\", dtype=torch.float16): ...  # this GPU has no TF32: fp16 autocast (bf16 where supported)"


FIX_CUDNN = "torch.backends.cudnn.allow_tf32 = True  # PyTorch's default for convolutions: something turned it off"


def _fix(tf32: bool, conv) -> str:
    """The switch for the groups judged: matmuls', convolutions' (cuDNN's own), or both."""
    if not tf32:
        return FIX_16BIT
    if conv.all():
        return FIX_CUDNN
    return FIX_TF32 + ("; for the convolutions: torch.backends.cudnn.allow_tf32 = True" if conv.any() else "")


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    """Launch groups of full-fp32 GEMMs, with the device's GEMM time and its fp32 share."""
    k = ctx.kernels
    kk = kinds(ctx)
    fp32 = (kk["precision"] == "fp32").to_numpy(dtype=bool).copy()
    if _enabled(ctx, "unfused_attention"):
        # an op-by-op attention's GEMMs are unfused_attention's: fused attention replaces them
        # (two rules claiming the same kernels could add up to more than their time)
        fp32 &= chain_kernels(ctx) < 0
    # convolutions (cuDNN's, by name or by the op that launched them) apart from matmuls: the
    # two follow different switches (cudnn.allow_tf32, on by default, and matmul.allow_tf32)
    conv = kk["is_conv"].to_numpy(dtype=bool) | launched_inside(ctx, CUDNN_OPS)
    parts = [group_launches(launch_rows(k, fp32 & (conv if c else ~conv), []), [], k).assign(conv=c)
             for c in (False, True)]
    parts = [p for p in parts if len(p)]
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True).sort_values("total_ns", ascending=False, kind="stable")
    out = out.reset_index(drop=True)
    by = gemm_time_by_precision(ctx)
    key = list(zip(out["rank"].astype("int64"), out["device_id"].fillna(-1).astype("int64")))
    out["device_gemm_ns"] = [int(by.loc[x, "gemm"]) for x in key]
    out["device_fp32_gemm_ns"] = [int(by.loc[x, "fp32"]) for x in key]
    out["device_tf32_ns"] = [int(by.loc[x, "tf32"]) for x in key]
    out["device_16bit_ns"] = [int(by.loc[x, "16bit"]) for x in key]
    # TF32 outside cuDNN (its convolutions and recurrent layers follow cudnn.allow_tf32, on by
    # default): cuBLAS GEMMs on TF32 mean the matmul switch is on already
    tf32_mm = k["is_gemm"].to_numpy(dtype=bool) & (kk["precision"] == "tf32").to_numpy(dtype=bool) & \
        ~kk["is_conv"].to_numpy(dtype=bool) & ~launched_inside(ctx, CUDNN_OPS)
    mm = pd.DataFrame({"rank": k["rank"].to_numpy()[tf32_mm].astype("int64"),
                       "dev": k["device_id"].fillna(-1).astype("int64").to_numpy()[tf32_mm],
                       "ns": k["dur_ns"].to_numpy()[tf32_mm]}).groupby(["rank", "dev"])["ns"].sum()
    out["device_tf32_matmul_ns"] = [int(mm.get(x, 0)) for x in key]
    tf32_cv = k["is_gemm"].to_numpy(dtype=bool) & (kk["precision"] == "tf32").to_numpy(dtype=bool) & conv
    cv = pd.DataFrame({"rank": k["rank"].to_numpy()[tf32_cv].astype("int64"),
                       "dev": k["device_id"].fillna(-1).astype("int64").to_numpy()[tf32_cv],
                       "ns": k["dur_ns"].to_numpy()[tf32_cv]}).groupby(["rank", "dev"])["ns"].sum()
    out["device_tf32_conv_ns"] = [int(cv.get(x, 0)) for x in key]
    return out


def _cudnn_picked(ctx: Context, grp: pd.DataFrame) -> pd.DataFrame:
    """The fp32 convolution groups of a device whose other convolutions run TF32: cuDNN's TF32
    switch is on there (it is by default), so these kernels are cuDNN's pick for their shapes
    (a 3-channel input layer, typically), which no precision switch changes. Said in a note;
    returns the other groups and the time of these."""
    picked = grp["conv"].to_numpy(dtype=bool) & (grp["device_tf32_conv_ns"].to_numpy() > 0)
    ns = 0
    if picked.any():
        ns = int(grp.loc[picked, "total_ns"].sum())
        ctx.notes.append(
            f"{int(grp.loc[picked, 'launches'].sum()):,} launches ({ns / 1e6:.2f} ms) of fp32 convolution kernels ran on "
            "CUDA cores while the device's other convolutions ran TF32: cuDNN's TF32 switch is on, and these are its "
            "pick for their shapes (e.g. a 3-channel input layer), not a precision switch to flip")
    return grp[~picked], ns


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    if ev.empty:
        return out
    for (rank, dev), grp in by_device(ev):
        gemm_ns, fp32_ns = int(grp["device_gemm_ns"].iloc[0]), int(grp["device_fp32_gemm_ns"].iloc[0])
        grp, picked_ns = _cudnn_picked(ctx, grp)
        if grp.empty:
            continue
        fixable_ns = fp32_ns - picked_ns  # the fp32 GEMM time a switch moves to tensor cores
        # the share of the GEMM *work* in full fp32 (time weighted by rate: kernel_kinds.gemm_work);
        # GEMMs of unknown precision count as other work
        other = gemm_ns - fp32_ns - int(grp["device_tf32_ns"].iloc[0]) - int(grp["device_16bit_ns"].iloc[0])
        w32, wt, w16 = gemm_work(fp32_ns, int(grp["device_tf32_ns"].iloc[0]), int(grp["device_16bit_ns"].iloc[0]) + max(0, other),
                                 device_row(ctx, rank, dev))
        fp32_share = w32 / (w32 + wt + w16) if (w32 + wt + w16) else 0.0
        # PyTorch's defaults let cuDNN (convolutions, RNNs) use TF32 but not matmuls: an fp32
        # model whose only TF32 work runs inside cuDNN runs its matmuls in full fp32 (the
        # matmul switch is off), so that TF32 work is the fp32 model's side of the split, not
        # a majority that has the fix already
        tf32_cudnn_only = int(grp["device_tf32_matmul_ns"].iloc[0]) == 0 and wt > 0
        model_share = (w32 + wt) / (w32 + wt + w16) if tf32_cudnn_only and (w32 + wt + w16) else fp32_share
        if model_share < rule["min_fp32_gemm_share"]:
            continue  # a 16-bit or TF32 majority of the work: dtype_churn's case
        share = ctx.share(rank, dev, fixable_ns)
        if share < rule["min_share"]:
            continue
        device = device_row(ctx, rank, dev)
        tf32 = has_tf32(device)
        target, elt = ("tf32", 4) if tf32 else ("fp16", 2)
        savings = floor = shaped_ns = 0
        rows, basis = [], None
        for row in grp.to_dict("records"):
            shape = shape_of(row)
            est = gemm_estimate(row["total_ns"], int(row["launches"]), shape, device, target, elt, rule["latency_floor_ns"], own="fp32")
            if est is None:
                continue
            savings += est["savings_ns"]
            floor += est["floor_ns"]
            shaped_ns += row["total_ns"] if est["shaped"] else 0
            basis = basis or est["basis"]
            rows.append((row, shape, est))
        if not rows or savings < rule["min_savings_ns"]:
            continue
        top, top_shape, top_est = rows[0]
        shaped = shaped_ns / fixable_ns if fixable_ns else 0.0
        # the kernels' precision is certain from their names; without shapes the size is a rate ratio
        confidence = "high" if shaped >= 0.5 else "low"
        out.append(
            finding_for(
                rule, top,
                rank=as_int(rank),
                device_id=None if dev < 0 else int(dev),
                shape=top_shape,
                launches=int(grp["launches"].sum()),
                total_ns=fixable_ns,
                est_savings_ns=int(savings),
                confidence=confidence,
                tier=3,
                evidence={
                    "fp32_gemm_ns": fixable_ns,
                    "gemm_ns": gemm_ns,
                    "fp32_gemm_share": round(fp32_share, 3),
                    "tf32_in_cudnn_only": tf32_cudnn_only,
                    "share_of_gpu_time": round(share, 4),
                    "kernel_kinds": int(grp["name"].nunique()),
                    "target_precision": target,
                    "target_tflops": top_est["target_tflops"],
                    "shaped_fraction": round(shaped, 3),
                    "bound_ns": int(floor),
                    "basis": f"sum over {len(rows)} launch groups of time minus floor on the {target} path; e.g. {basis}",
                    # the hook for ranking: the kernels this lever covers (Tier-4 rules skip them)
                    "covers_kernels": sorted({str(r["name"]) for r, _, _ in rows}),
                },
                strategy=rule.strategy if tf32 else rule.strategy_for("no_tf32"),
                suggestion={"fix": _fix(tf32, grp["conv"].to_numpy(dtype=bool)), "precision": target},
            )
        )
    return out
