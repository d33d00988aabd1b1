"""hopper_no_ws: GEMM time on a Hopper GPU in kernels that are not warp-specialized.

What it detects: on devices of compute capability 9.x, GEMM kernels whose names show no warp
specialization (CUTLASS `warpspecialized`, cuBLAS `nvjet`, Triton kernels named `*_ws_*`)
holding a significant share of GPU time; convolutions without a GEMM shape are left out (no
GEMM schedule of ours replaces them). Why it matters: a TMA producer warp feeding wgmma
consumer warpgroups keeps the tensor cores busy while loads are in flight. GEMMs whose arithmetic
intensity is far under the ridge point are skipped: they wait on memory. What to do: a
warp-specialized persistent TMA kernel, then measure: it does not always win. Estimated
recoverable time: the kernel's time x `expected_gain` (a prior), bounded by the roofline at
the device's measured peak and by what our warp-specialized schedule reached over the kind of
kernel that ran (advisor.symptoms.calibration); confidence stays low.

Warp specialization is read from the launch as well as the name: a block of 3 or 5 warpgroups
(one producer, two or four consumers: how cuBLAS's and CUTLASS's sm90 kernels launch) is
warp-specialized whatever the name says, and a library kernel already near the device's peak
is a note ("already near peak"), never advice to replace it.

A library (cuBLAS/CUTLASS) kernel is not ours to warp-specialize: its one remedy is to call a
faster kernel instead, and the one schedule of ours that measured faster than cuBLAS is the
Gluon cluster GEMM (strategy `cluster_gemm`, Triton >= 3.9 on sm_90). So a library kernel gets
a `cluster_gemm` finding only where that schedule's measured ratio over cuBLAS on the shape's
class (advisor.symptoms.calibration.shape_class: this very shape if measured, else the worst
measured shape of its class near it) exceeds 1 + `cluster_margin`; the estimate is the kernel's
time x (1 - 1/ratio), capped by the roofline at the measured peak. Elsewhere it is a note that
says what the cluster GEMM measured on that class (or that nothing was measured near it).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .calibration import ShapeClasses, bound_gemm_estimate, ceiling, is_library_kernel, reached, shape_class
from ..findings import Finding
from ..rules import Rule
from .context import Context, finding_for, gemm_bytes, gemm_flop, group_launches, id_array, launch_rows, shape_of
from .kernel_kinds import kinds, schedule_excluded
from .tail_wave import work_units

SYMPTOM = "hopper_no_ws"
CLUSTER = "cluster_gemm"
REQUIRES = (("devices", "arch", "Does the trace say which GPU architecture ran the kernels?"),)


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    k = ctx.kernels
    majors = rule["arch_major"]
    majors = set(majors if isinstance(majors, list) else [majors])
    dev = ctx.trace.devices
    hopper = {(int(r), int(d)) for r, d, m in zip(dev["rank"], dev["device_id"], dev["cc_major"]) if not pd.isna(m) and int(m) in majors}
    if not hopper:
        return group_launches(k.iloc[0:0], [])
    # vectorised membership of (rank, device) in `hopper` (a Python loop took seconds at 1M kernels)
    # (over the id arrays, a (rank, device) at a time: a MultiIndex of every kernel was this
    # symptom's peak)
    rank, dev = k["rank"].to_numpy(), id_array(k["device_id"])
    on = np.zeros(len(k), dtype=bool)
    for r, d in hopper:
        on |= (rank == r) & (dev == d)
    # kernels whose lever is a Tier 1-3 one (fp32 SIMT, misaligned) get no schedule; nor do
    # convolutions without a GEMM shape (as in small_grid_long_k), library or not: our
    # warp-specialized kernel is a GEMM and replaces none of them (a VideoMAE Conv3d on cuDNN's
    # generic implicit_convolveNd_sgemm was told to use warp specialization, H200)
    on &= ~schedule_excluded(ctx)
    on &= ~(kinds(ctx)["is_conv"].to_numpy(dtype=bool) & k["M"].isna().to_numpy(dtype=bool))
    g = launch_rows(k, on & (k["is_gemm"] & ~k["is_ws"] & ~ws_launch(k) & k["sm_count"].notna() & k["grid_blocks"].notna()).to_numpy(),
                    ["tiles", "grid_blocks", "sm_count"])
    if g.empty:
        return group_launches(g, [])
    g = pd.concat([g, work_units(g)], axis=1)
    return group_launches(g, ["waves_units"], k)


def ws_launch(k: pd.DataFrame) -> pd.Series:
    """Launches whose block is 3 or 5 warpgroups (384 or 640 threads): one producer warpgroup
    feeding two or four consumers, the shape of Hopper's warp-specialized GEMM kernels (cuBLAS
    sm90_xmma_*, CUTLASS 3 cooperative/ping-pong). A data-parallel kernel uses 1, 2 or 4."""
    # in float64, as Float64 columns computed it, in chunks (three full-length Float64
    # products were this symptom's peak); NaN (no block_x) compares false
    bx, by, bz = (k[c].array for c in ("block_x", "block_y", "block_z"))
    out = np.zeros(len(k), dtype=bool)
    for lo in range(0, len(k), _CHUNK):
        sl = slice(lo, lo + _CHUNK)
        threads = (bx[sl].to_numpy(np.float64, na_value=np.nan) * by[sl].to_numpy(np.float64, na_value=1.0)
                   * bz[sl].to_numpy(np.float64, na_value=1.0))
        wg = threads / 128
        out[sl] = ((wg == 3) | (wg == 5)) & (threads % 128 == 0)
    return pd.Series(out, index=k.index)


_CHUNK = 1 << 20


def _near_peak(row: dict, ctx: Context, fraction: float) -> float | None:
    """Achieved / measured dense peak of the launch group when its shape is known."""
    shape = shape_of(row)
    if shape is None or not row.get("median_ns"):
        return None
    c = ceiling(ctx.device_row(row["rank"], row["device_id"]), shape.get("dtype"))
    if not c.tflops:
        return None
    achieved = gemm_flop(shape) / (float(row["median_ns"]) * 1e-9) / 1e12
    return achieved / c.tflops


def _bandwidth_bound(row: dict, rule: Rule, ctx: Context) -> bool:
    """True when the GEMM's arithmetic intensity is far under the device's ridge point:
    feeding tensor cores faster cannot help a GEMM that waits on memory."""
    shape = shape_of(row)
    peak = ctx.device_value(row["rank"], row["device_id"], "peak_tensor_tflops")
    bw = ctx.device_value(row["rank"], row["device_id"], "mem_bandwidth_bytes_per_s")
    if shape is None or not peak or not bw:
        return False
    intensity = gemm_flop(shape) / gemm_bytes(shape)[0]
    return intensity < rule["min_ridge_fraction"] * (peak * 1e12 / bw)


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out = []
    if ev.empty:
        return out
    # Under a wave of tiles the grid, not the pipeline, is the limit (small_grid_long_k's
    # case); tiny GEMMs are latency-bound; bandwidth-bound ones wait on memory; fp64 has no
    # wgmma (Hopper runs it on DMMA), so no TMA-fed warpgroup pipeline to specialize.
    keep = [
        r["waves_units"] >= rule["min_waves"]
        and (shape_of(r) is None or gemm_flop(shape_of(r)) >= rule["min_gemm_flop"])
        and (shape_of(r) or {}).get("dtype") != "fp64"
        and not _bandwidth_bound(r, rule, ctx)
        for r in ev.to_dict("records")
    ]
    ev = ev[keep]
    # One finding per kernel name and device: launch shapes of one kernel share the remedy.
    by_name = ev.groupby(["rank", "device_id", "name"], dropna=False, sort=False)
    for (rank, device_id, name), grp in by_name:
        total = int(grp["total_ns"].sum())
        share = ctx.share(rank, device_id, total)
        model = total * float(rule["expected_gain"])
        if share < rule["min_share"] or model < rule["min_savings_ns"]:
            continue
        top = grp.iloc[0].to_dict()
        peak_frac = _near_peak(top, ctx, rule["near_peak_fraction"])
        if is_library_kernel(str(name)):
            f = _library_finding(rule, ctx, grp, top, str(name), total, share, peak_frac)
            if f is not None:
                out.append(f)
            continue
        est = bound_gemm_estimate(model, total, int(grp["launches"].sum()), shape_of(top),
                                  ctx.device_row(rank, device_id), rule.strategy, str(name))
        savings = est.savings_ns
        if savings < rule["min_savings_ns"]:
            continue
        out.append(
            finding_for(
                rule, top,  # the kernel's first launch shape: same name, rank and device as the group
                launches=int(grp["launches"].sum()),
                total_ns=total,
                est_savings_ns=int(savings),
                confidence="low",
                evidence={
                    **_kernel_facts(ctx, grp, top, share, peak_frac, rank, device_id),
                    "model_ns": int(model),
                    "bound_ns": est.bound_ns,
                    "capped_by": est.capped_by,
                    "basis": f"prior: WS gains {rule['expected_gain']:.0%} of the kernel time; " + est.basis,
                },
                suggestion={"warp_specialize": True, "use_tma": True, "persistent": True},
            )
        )
    return out


def _kernel_facts(ctx: Context, grp: pd.DataFrame, top: dict, share: float, peak_frac, rank, device_id) -> dict:
    """The evidence every hopper_no_ws finding carries about the kernel itself."""
    block_x = top.get("block_x")
    return {
        "share_of_gpu_time": round(share, 4),
        "launch_shapes": int(len(grp)),
        "arch": ctx.device_value(rank, device_id, "arch"),
        "warp_specialized": False,
        "threads_per_block": None if block_x is None or pd.isna(block_x) else int(block_x),
        "fraction_of_peak": None if peak_frac is None else round(peak_frac, 3),
    }


def _classes(rule: Rule) -> ShapeClasses:
    return ShapeClasses(float(rule["cluster_balanced_tail_efficiency"]), float(rule["cluster_max_shape_factor"]))


def _library_finding(rule: Rule, ctx: Context, grp: pd.DataFrame, top: dict, name: str, total: int,
                     share: float, peak_frac: float | None) -> Finding | None:
    """A `cluster_gemm` finding where our cluster GEMM measurably beat cuBLAS on this shape's
    class, else None with a note saying what it measured there."""
    rank, device_id = top["rank"], top["device_id"]
    shape, dev = shape_of(top), ctx.device_row(rank, device_id)
    classes = _classes(rule)
    r = reached(CLUSTER, shape, name, dev, classes)
    need = 1.0 + float(rule["cluster_margin"])
    head = f"hopper_no_ws: {name[:60]} is not warp-specialized"
    if peak_frac is not None and peak_frac >= rule["near_peak_fraction"]:
        head += f" and already runs at {peak_frac:.0%} of the measured dense peak"
    if r is None or r.ratio <= need:
        if r is not None:
            why = f"{r.basis}: not over the {need:.2f}x a replacement needs"
        elif shape is None:
            why = "its shape is unknown, so no measurement of our cluster_gemm schedule speaks for it"
        else:
            sms = (dev or {}).get("sm_count")
            cls = shape_class(shape, int(sms), classes.balanced_tail_efficiency) if sms else "unknown-class"
            why = (f"our cluster_gemm schedule was not measured near {shape['M']}x{shape['N']}x{shape['K']} "
                   f"{shape.get('dtype') or ''} ({cls} shape): no claim from an extrapolation").replace("  ", " ")
        ctx.notes.append(f"{head}; no schedule of ours beats the library here: {why}")
        return None
    launches = int(grp["launches"].sum())
    # the estimate is the measured ratio's: total x (1 - 1/ratio), capped by the roofline
    est = bound_gemm_estimate(total, total, launches, shape, dev, CLUSTER, name, classes)
    if est.savings_ns < rule["min_savings_ns"]:
        ctx.notes.append(f"{head}; our cluster_gemm schedule beats the library on such shapes, but by "
                         f"{est.savings_ns / 1e3:.1f} us in this trace, under the {rule['min_savings_ns'] / 1e3:.0f} us "
                         f"worth a change ({est.basis})")
        return None
    return finding_for(
        rule, top,
        strategy=CLUSTER,
        launches=launches,
        total_ns=total,
        est_savings_ns=int(est.savings_ns),
        confidence="medium" if r.exact else "low",
        evidence={
            **_kernel_facts(ctx, grp, top, share, peak_frac, rank, device_id),
            "shape_class": r.shape_class,
            "measured_ratio": r.ratio,
            "measured_exact": r.exact,
            "bound_ns": est.bound_ns,
            "capped_by": est.capped_by,
            "basis": f"the kernel's time x (1 - 1/{r.ratio:.3f}); " + est.basis,
            "library": "cuBLAS" if "cutlass" not in name.lower() else "CUTLASS",
            "library_change": (f"replace this GEMM call with our Gluon cluster GEMM (advisor generate {CLUSTER}; it "
                               "needs Triton >= 3.9 on an sm_90 GPU), and keep it only where it times faster than "
                               "torch.matmul on your shape"),
        },
        suggestion={"schedule": CLUSTER, "requires": "Triton >= 3.9 on sm_90"},
    )
