"""small_grid_long_k: a GEMM whose tiles fill few SMs while its K loop is long.

What it detects: GEMM kernels (not already split-K) with `tiles / SMs` well under one wave
and a long K (from the problem shape; without a shape, a long-running launch on a small grid
is weaker evidence). Why it matters: most SMs idle while a few walk a long K loop; measured
on the H200, 4 tiles with K=131072 took 888 us where cuBLAS needs 48 us. What to do:
Split-K with S splits so that tiles x S covers about one wave. Estimated recoverable time:
the launch time minus the larger of the perfectly-spread time (dur x waves) and the HBM
floor (bytes moved / bandwidth), over all launches, bounded by the roofline at the device's
measured peak and by what our Split-K reached over the kind of kernel that ran
(advisor.symptoms.calibration).
"""

from __future__ import annotations

import math

import pandas as pd

from .calibration import bound_gemm_estimate
from ..findings import Finding
from ..rules import Rule
from .context import Context, finding_for, gemm_bytes, group_launches, launch_rows, shape_of
from .kernel_kinds import kinds, schedule_excluded
from .tail_wave import work_units

SYMPTOM = "small_grid_long_k"
REQUIRES = (
    ("kernels", "grid_blocks", "Does the trace record each kernel's grid size?"),
    ("devices", "sm_count", "Does the trace (or --sm-count) give the GPU's SM count?"),
)


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    k = ctx.kernels
    # kernels whose lever is a Tier 1-3 one (fp32 SIMT, misaligned) get no schedule; nor do
    # convolutions without a GEMM shape: our split-K is a GEMM, and cuDNN's kernel choice is
    # not the user's (cudnn.benchmark left a grouped conv1d's 8-block kernel as it was, H200)
    conv = kinds(ctx)["is_conv"].to_numpy(dtype=bool) & k["M"].isna().to_numpy(dtype=bool)
    g = launch_rows(k, (k["is_gemm"] & ~k["is_split_k"] & k["sm_count"].notna() & k["grid_blocks"].notna()).to_numpy(dtype=bool)
                    & ~schedule_excluded(ctx) & ~conv,
                    ["tiles", "grid_blocks", "sm_count", "tile_k"])
    if g.empty:
        return group_launches(g, [])
    g = pd.concat([g, work_units(g)], axis=1)
    return group_launches(g, ["units", "units_from_shape", "waves_units", "sm_count", "tile_k"], k)


def suggest_split(tiles: int, sms: int, K: int, rule: Rule) -> int:
    """Splits so that tiles x S is about one wave, each split keeping min_k_per_split of K."""
    want = max(1, sms // max(tiles, 1))
    cap = min(int(rule["max_split"]), K // int(rule["min_k_per_split"]))
    return max(1, min(want, cap))


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out = []
    for row in ev.to_dict("records"):
        waves = row.get("waves_units")
        if waves is None or pd.isna(waves) or waves > rule["max_waves"]:
            continue
        shape = shape_of(row)
        sms = int(row["sm_count"])
        tiles = max(1, int(round(row["units"])))
        per_launch = float(row["total_ns"]) / row["launches"]
        if shape is not None:
            if shape["K"] < rule["min_k"]:
                continue
            split = suggest_split(tiles, sms, shape["K"], rule)
            bw = ctx.device_value(row["rank"], row["device_id"], "mem_bandwidth_bytes_per_s")
            nbytes, elt_known = gemm_bytes(shape)
            floor_ns = nbytes / bw * 1e9 if bw else 0.0
            confidence = "high" if elt_known and bw else "medium"
        else:
            if row["median_ns"] < rule["min_launch_ns_without_shape"]:
                continue
            split = max(1, min(int(rule["max_split"]), sms // tiles))
            floor_ns, nbytes, confidence, bw = 0.0, None, "low", None
        if split < 2:
            continue
        # Perfectly spread over every SM, the launch would take dur x waves, but never less
        # than the time to move its bytes once.
        ideal = max(per_launch * waves, floor_ns)
        model = max(0.0, per_launch - ideal) * row["launches"]
        est = bound_gemm_estimate(model, row["total_ns"], int(row["launches"]), shape,
                                  ctx.device_row(row["rank"], row["device_id"]), rule.strategy, str(row["name"]))
        savings = est.savings_ns
        share = ctx.share(row["rank"], row["device_id"], row["total_ns"])
        if share < rule["min_share"] or savings < rule["min_savings_ns"]:
            continue
        if confidence == "high" and not est.measured_exact:
            confidence = "medium"  # the cap comes from similar shapes, not this one
        out.append(
            finding_for(
                rule, row,
                shape=shape,
                est_savings_ns=int(savings),
                confidence=confidence,
                evidence={
                    "tiles": tiles,
                    "tiles_from": "shape and kernel-name tile" if row["units_from_shape"] else "grid blocks",
                    "sm_count": sms,
                    "waves_sat": round(float(waves), 3),
                    "idle_sm_fraction": round(1.0 - min(1.0, tiles / sms), 3),
                    "K": None if shape is None else shape["K"],
                    "hbm_floor_ns": int(floor_ns) if floor_ns else None,
                    "bytes_min": nbytes,
                    # the device's own figure where the trace has one (nsys: memory clock x bus
                    # width, 4814 GB/s on the H200), else the spec sheet's (4800): floors differ by that
                    "hbm_gb_per_s": round(float(bw) / 1e9, 1) if bw else None,
                    "median_ns": int(row["median_ns"]),
                    "share_of_gpu_time": round(share, 4),
                    "model_ns": int(model),
                    "bound_ns": est.bound_ns,
                    "capped_by": est.capped_by,
                    "basis": "the launch spread over every SM (time x waves), no faster than its HBM floor; " + est.basis,
                },
                suggestion={
                    "split_k": split,
                    "k_per_split": None if shape is None else math.ceil(shape["K"] / split),
                    "reduction": "two_phase",
                },
            )
        )
    return out
