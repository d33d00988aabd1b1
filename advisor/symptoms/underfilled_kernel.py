"""underfilled_long_kernel: a long kernel of any kind whose grid fills few SMs.

What it detects: kernels that are not GEMMs, attention or communication (those have their own
rules) launched on a grid under `max_sm_fill` of the SMs while each launch runs at least
`min_launch_ns`: a one-block sort of a short row, an argmax over a vocabulary for a handful of
rows, a single-tile CUB pass. Why it matters: the rest of the GPU idles for the whole launch
(in a mixture-of-experts forward on the H200, a 1-block `radixSortKVInPlace` ran 33 us twice
while 131 SMs waited). What to do: give the kernel more independent work; the advice names the
library call to change where the kernel name says whose it is. Estimated recoverable time:
the launch time minus the larger of the perfectly spread time (launch x grid / SMs) and
`min_remaining_fraction` of the launch (nothing is known of the kernel's own floor).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from .attention import attention_backend
from ..findings import Finding
from ..rules import Rule
from . import intervals
from .context import Context, finding_for, group_launches, launch_rows
from .kernel_kinds import schedule_excluded
from .strings import factorize

SYMPTOM = "underfilled_long_kernel"
REQUIRES = (
    ("kernels", "grid_blocks", "Does the trace record each kernel's grid size?"),
    ("devices", "sm_count", "Does the trace (or --sm-count) give the GPU's SM count?"),
)

# (kernel name pattern, library, the call to change); first match wins. {grid} is the launch's blocks.
_ADVICE: list[tuple[re.Pattern, str, str]] = [
    (re.compile(r"radixSortKVInPlace|bitonicSortKVInPlace|warpMergeSortKVInPlace|sortKeyValueInplace", re.I),
     "PyTorch sort (torch.sort / argsort / topk on rows of <= 4096 elements)",
     "PyTorch sorts each such row in one block, so {grid} block(s) means {grid} row(s): sort many rows in one call "
     "(stack them into one 2-D tensor), or avoid the sort: torch.topk for the few largest, a counting sort "
     "(torch.bincount + torch.cumsum) to group tokens by expert"),
    (re.compile(r"gatherTopK|sbtopk|mbtopk|radixFindKthValues|computeBlockwiseWithinKCounts", re.I),
     "PyTorch topk", "topk over {grid} long row(s) ran on {grid} block(s): batch the rows into one call, or take "
     "topk of chunks of each row and then of the chunk winners (a two-stage topk)"),
    (re.compile(r"cub::|DeviceRadixSortSingleTile|DeviceScan|DeviceReduceSingleTile|DeviceSegmented|DeviceSelect", re.I),
     "CUB (through a library call)", "a CUB pass on {grid} block(s) (its input fits a single tile): batch the calls "
     "into one segmented launch (one call over a 2-D tensor) or fuse the step into its neighbours"),
    (re.compile(r"at::native::.*reduce_kernel|reduce_kernel<", re.I),
     "PyTorch reduction", "a reduction over a long dimension with few outputs ran on {grid} block(s): reduce in two "
     "stages (view each row as chunks, reduce the chunks, then the partial results; torch.compile splits such "
     "reductions itself) or batch more rows into the call"),
    (re.compile(r"cumsum|scan", re.I),
     "a scan (cumsum)", "a scan over few long rows ran on {grid} block(s): batch the rows into one call, or a "
     "two-pass (chunked) scan"),
    (re.compile(r"^triton_(?:red|per)_", re.I),
     "torch.compile (Inductor reduction)", "Inductor launched {grid} program(s) for this reduction: a larger batch "
     "fills the grid; torch._inductor.config.split_reductions (on by default) splits long ones when it can"),
]
_GENERIC = ("", "give the kernel more independent work: batch the calls that launch it, or split its long loop "
                "over more blocks and combine the partial results")


def advice(name: str, grid: int) -> tuple[str, str]:
    for pat, library, change in _ADVICE:
        if pat.search(name):
            return library, change.format(grid=grid)
    return _GENERIC[0], _GENERIC[1]


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    k = ctx.kernels
    codes, uniques = factorize(k["name"])
    attn = np.array([attention_backend(n) is not None for n in np.asarray(uniques, dtype=object)] + [False])[codes]
    mask = (~k["is_gemm"] & ~k["is_comm"] & ~k["is_split_k"] & ~attn & k["grid_blocks"].notna()
            & k["sm_count"].notna()).to_numpy(dtype=bool)
    mask = mask & (k["grid_blocks"] < k["sm_count"]).fillna(False).to_numpy(dtype=bool)  # idle SMs at all
    # NCHW batch norm and layout transposes on a convolving device are layout_churn's
    # (channels_last changes those kernels): one lever per kernel
    mask = mask & ~np.asarray(schedule_excluded(ctx), dtype=bool)
    g = launch_rows(k, mask, ["grid_blocks", "sm_count"])
    g = g.assign(overlap_fraction=_overlap_fraction(k, g.index))
    return group_launches(g, ["grid_blocks", "sm_count", "overlap_fraction"], k)


def _overlap_fraction(k: pd.DataFrame, rows: pd.Index) -> np.ndarray:
    """Per launch in `rows`: the fraction of its time during which kernels of other streams on
    the same device ran (then the 'idle' SMs were not idle: DeepEP's communication kernels run
    on 20 SMs on purpose beside the compute)."""
    out = np.zeros(len(rows))
    if not len(rows):
        return out
    pos = pd.Series(np.arange(len(rows)), index=rows)
    sub = k.loc[rows]
    for (rank, dev, stream), grp in sub.groupby(["rank", "device_id", "stream_id"], dropna=False, sort=False):
        others = k[(k["rank"] == rank) & ((k["device_id"] == dev) if pd.notna(dev) else k["device_id"].isna())
                   & ((k["stream_id"] != stream) if pd.notna(stream) else k["stream_id"].notna())]
        if others.empty:
            continue
        ms, me = intervals.merge(others["start_ns"].to_numpy(), others["end_ns"].to_numpy())
        covered = intervals.overlap(grp["start_ns"].to_numpy(), grp["end_ns"].to_numpy(), ms, me)
        out[pos[grp.index].to_numpy()] = covered / np.maximum(grp["dur_ns"].to_numpy(dtype=float), 1.0)
    return out


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out = []
    keep = float(rule["min_remaining_fraction"])
    for row in ev.to_dict("records"):
        sms = int(row["sm_count"])
        grid = int(round(row["grid_blocks"]))
        fill = grid / sms
        if fill > rule["max_sm_fill"] or row["median_ns"] < rule["min_launch_ns"]:
            continue
        if row["overlap_fraction"] > rule["max_overlap_fraction"]:
            continue  # other streams' kernels had the idle SMs
        total = float(row["total_ns"])
        ideal = total * max(fill, keep)
        savings = total - ideal
        share = ctx.share(row["rank"], row["device_id"], total)
        if share < rule["min_share"] or savings < rule["min_savings_ns"]:
            continue
        library, change = advice(str(row["name"]), grid)
        out.append(finding_for(
            rule, row,
            shape=None,
            total_ns=int(total),
            est_savings_ns=int(savings),
            # the spread is a guess: how parallel the kernel's work is, the trace cannot say
            confidence="medium" if library else "low",
            evidence={
                "grid_blocks": grid,
                "sm_count": sms,
                "sm_fill": round(fill, 3),
                "idle_sms": max(0, sms - grid),
                "overlap_fraction": round(float(row["overlap_fraction"]), 3),
                "median_ns": int(row["median_ns"]),
                "share_of_gpu_time": round(share, 4),
                "bound_ns": int(ideal),
                "basis": (f"launch time x max(grid / SMs = {fill:.3f}, {keep:g}): the work spread over every SM, "
                          f"keeping {keep:.0%} of it (the kernel's own floor is unknown)"),
                "library": library,
                "library_change": change,
            },
            suggestion={},
            tier=4,
            savings_unit="gpu",
        ))
    return out
