"""tail_wave: a GEMM with more than one wave of tiles whose last wave is partial.

What it detects: GEMM kernels whose output tiles (from the problem shape and the tile in the
kernel name, else the grid's blocks) make `waves = tiles / SMs > 1` with a low tail
efficiency `waves / ceil(waves)` (SM-saturation model; the occupancy model is reported too).
Why it matters: in the last wave only some SMs work; measured on the H200, 143 tiles took
31% longer than 132. What to do: Stream-K (a data-parallel body plus a Stream-K tail that
spreads the leftover tiles' K iterations over all SMs). Estimated recoverable time:
`dur x (1 - waves / ceil(waves))` (perfect balance), bounded by the GEMM's roofline at the
device's measured peak and by what our Stream-K reached over the kind of kernel that ran
(advisor.symptoms.calibration): over cuBLAS it is about even, so a cuBLAS tail is a note, not a finding.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from .calibration import bound_gemm_estimate, is_library_kernel
from ..findings import Finding
from ..rules import Rule
from .context import Context, finding_for, group_launches, launch_rows, shape_of
from .kernel_kinds import schedule_excluded
from .occupancy import _tail_eff, waves_at

SYMPTOM = "tail_wave"
REQUIRES = (
    ("kernels", "grid_blocks", "Does the trace record each kernel's grid size?"),
    ("devices", "sm_count", "Does the trace (or --sm-count) give the GPU's SM count?"),
)


def work_units(k: pd.DataFrame) -> pd.DataFrame:
    """Tiles per launch: from shape and named tile when both are known, else grid blocks."""
    from_shape = k["tiles"].notna()
    units = k["tiles"].astype("Float64").fillna(k["grid_blocks"].astype("Float64")).astype("float64")
    waves = units / k["sm_count"].astype("float64")
    with np.errstate(invalid="ignore", divide="ignore"):
        eff = waves / np.ceil(waves)
    return pd.DataFrame(
        {"units": units, "units_from_shape": from_shape.astype(float), "waves_units": waves, "tail_eff_units": eff},
        index=k.index,
    )


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    k = ctx.kernels
    # kernels whose lever is a Tier 1-3 one (fp32 SIMT, misaligned) get no schedule
    g = launch_rows(k, k["is_gemm"] & ~k["is_split_k"] & k["sm_count"].notna() & k["grid_blocks"].notna() & ~schedule_excluded(ctx),
                    ["tiles", "grid_blocks", "sm_count", "blocks_per_sm", "tile_m", "tile_n"])
    if g.empty:
        return group_launches(g, [])
    g.insert(5, "waves", waves_at(k, k.index.get_indexer(g.index)))  # where launch_rows had it
    # per launch from the occupancy model's waves, for the launches read here only (a column
    # of Context.kernels was 8 bytes for every kernel)
    g["tail_efficiency"] = _tail_eff(g["waves"].to_numpy(dtype=np.float64))
    g = pd.concat([g, work_units(g)], axis=1)
    return group_launches(
        g,
        ["units", "units_from_shape", "waves_units", "tail_eff_units", "waves", "tail_efficiency", "blocks_per_sm", "sm_count", "tile_m", "tile_n"],
        k,
    )


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out = []
    for row in ev.to_dict("records"):
        waves, eff = row.get("waves_units"), row.get("tail_eff_units")
        if waves is None or pd.isna(waves) or waves <= rule["min_waves"] or eff > rule["max_tail_efficiency"]:
            continue
        share = ctx.share(row["rank"], row["device_id"], row["total_ns"])
        model = row["total_ns"] * (1.0 - eff)
        if share < rule["min_share"] or model < rule["min_savings_ns"]:
            continue
        shape = shape_of(row)
        est = bound_gemm_estimate(model, row["total_ns"], int(row["launches"]), shape,
                                  ctx.device_row(row["rank"], row["device_id"]), rule.strategy, str(row["name"]))
        savings = est.savings_ns
        if savings < rule["min_savings_ns"]:
            if est.capped_by == "measured" and is_library_kernel(str(row["name"])):
                ctx.notes.append(
                    f"tail_wave: {str(row['name'])[:60]} has a partial last wave ({units_text(row)}), but the "
                    f"library already runs it about as fast as our Stream-K reaches ({est.basis.split('; ')[-1]}): "
                    "nothing to gain from a schedule here")
            continue
        sms = int(row["sm_count"])
        units = int(round(row["units"]))
        full = math.floor(waves)
        src = ctx.device_value(row["rank"], row["device_id"], "sm_count_source")
        # high only when the SM count is the trace's and the cap was measured on this shape
        confidence = "high" if src in ("trace", "user") and est.measured_exact else "medium"
        out.append(
            finding_for(
                rule, row,
                shape=shape,
                est_savings_ns=int(savings),
                confidence=confidence,
                evidence={
                    "tiles": units,
                    "tiles_from": "shape and kernel-name tile" if row["units_from_shape"] else "grid blocks",
                    "sm_count": sms,
                    "waves_sat": round(float(waves), 3),
                    "tail_efficiency_sat": round(float(eff), 3),
                    "waves_occupancy": None if pd.isna(row["waves"]) else round(float(row["waves"]), 3),
                    "tail_efficiency_occupancy": None if pd.isna(row["tail_efficiency"]) else round(float(row["tail_efficiency"]), 3),
                    "blocks_per_sm": None if pd.isna(row["blocks_per_sm"]) else int(row["blocks_per_sm"]),
                    # why the _sat figures decide even where more blocks fit an SM (the two
                    # models disagree whenever blocks_per_sm > 1)
                    "waves_basis": "sat: one tile per SM at a time (a GEMM tile keeps an SM's tensor cores busy "
                                   "even where more fit); occupancy: as many as fit",
                    "last_wave_tiles": units - full * sms,
                    "share_of_gpu_time": round(share, 4),
                    "median_ns": int(row["median_ns"]),
                    "model_ns": int(model),
                    "bound_ns": est.bound_ns,
                    "capped_by": est.capped_by,
                    "basis": "perfect balance of the last wave (time x (1 - tail efficiency)); " + est.basis,
                },
                suggestion={
                    "full_waves": full,
                    "tail_tiles": units - full * sms,
                    "sk_programs": sms,
                    "policy": "hybrid1" if waves < 2 else "hybrid2",
                },
            )
        )
    return out


def units_text(row) -> str:
    return f"{int(round(row['units']))} tiles on {int(row['sm_count'])} SMs"
