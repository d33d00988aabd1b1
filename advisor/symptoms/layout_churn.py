"""layout_churn: NCHW tensors around convolutions: layout transposes, per-channel batch norm and
PyTorch's own depthwise kernels (Tier 2).

What it detects: on a device that runs convolutions, the kernels an NCHW (channels-first)
model adds: cuDNN/MIOpen layout transposes (`nchwToNhwc`, `nhwcToNchw`, `nchw2nhwc`,
`convertTensor`, `batched_transpose`), which run because the fast convolution kernels want
NHWC; NCHW batch-norm kernels (ATen `batch_norm_collect_statistics_kernel`,
`batch_norm_backward_kernel`, cuDNN `bn_fw*`/`bn_bw*`, not their `channels_last`/`nhwc`
variants) whose grid is one block per channel, fewer blocks than SMs; and, on NVIDIA GPUs,
PyTorch's depthwise-convolution kernels on bf16 data (`conv_depthwise2d_*_kernel`), which
an NCHW depthwise convolution runs in bf16, where channels_last hands it to cuDNN (3 and 5
wide filters, the widths measured; not inside 1-D convolutions: kernel_kinds.depthwise_counted).
Why it matters: the transposes are pure data movement on every convolution, and a grid of 64-256
channel blocks leaves SMs idle for the length of a long per-channel reduction (~1 ms a launch
on the H200); converting model and input to channels_last removes both (about 1.5x on a
ResNet-50 bf16 train step there, issue 39). No kernel schedule helps: Tier-4 rules skip these
kernels (kernel_kinds.schedule_excluded).
What to do: `model = model.to(memory_format=torch.channels_last)` and
`x = x.to(memory_format=torch.channels_last)` for the input.
Estimate: the transposes' whole time, plus each NCHW batch-norm launch's time over its floor:
the bytes it must move (its input's size from the enclosing Kineto cpu_op, times the passes the
kernel makes) at the measured bandwidth, at least a launch's latency; without the input's size,
the share of the launch the idle SMs stand for (1 - blocks/SMs); plus the depthwise kernels'
time over the least speedup cuDNN's channels_last kernels measured against them (3.84x,
rules/layout_churn.toml). Depthwise kernels whose names carry no measured width (7 x 7 and
others: `_generic`, `<0, ...>`) are sized through their recorded convolution call
(kernel_kinds.depthwise_by_shape): a filter with a measured cuDNN rate (`depthwise_7x7_cudnn_floor_multiple`,
from ConvNeXt-T's channels_last 7 x 7 kernels) is claimed down to that multiple of its floor,
forward + backward only, at low confidence; any other is a note, no claim.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from ..basics import DTYPE_ALIASES
from ..findings import Finding
from ..rules import Rule
from .context import Context, as_int, by_device, finding_for, group_launches, launch_rows
from .gemm import _launch_points
from .kernel_kinds import (conv1d_kernels, depthwise_by_shape, depthwise_counted, depthwise_shaped_excess, device_row,
                           kinds, on_conv_devices, width_key)
from .calibration import measured_bandwidth

SYMPTOM = "layout_churn"
REQUIRES = (("kernels", "name", "Does the trace name its kernels?"),)

FIX = "model = model.to(memory_format=torch.channels_last); x = x.to(memory_format=torch.channels_last)"

# Fewest passes over the input a batch-norm kernel makes (reads + writes of an input-sized
# tensor): statistics read x; forward transform reads x, writes y; backward reads x and dy and
# writes dx; a backward reduction reads x and dy. Floors, so the least.
_PASSES = ((re.compile(r"collect_statistics|reduce_statistics|welford", re.I), 1),
           (re.compile(r"backward_reduce|bw_reduce", re.I), 2),
           (re.compile(r"backward|_bw|bwd", re.I), 3),
           (re.compile(r"transform|elemt|fw|fwd|forward", re.I), 2))
_BN_OP = r"batch_norm"


def _passes(name: str) -> int:
    for pat, n in _PASSES:
        if pat.search(name):
            return n
    return 2


def _input_bytes(dims_text, types_text) -> float | None:
    try:
        dims_ = json.loads(dims_text)
    except (TypeError, ValueError):
        return None
    first = next((d for d in dims_ if isinstance(d, list) and len(d) >= 2 and all(isinstance(x, int) for x in d)), None) if isinstance(dims_, list) else None
    if first is None:
        return None
    elt = 2
    try:
        types = json.loads(types_text) if isinstance(types_text, str) else []
        dt = DTYPE_ALIASES.get(str(types[0]).lower()) if types else None
        elt = {"bf16": 2, "fp16": 2, "fp32": 4, "fp64": 8}.get(dt, 2)
    except (ValueError, IndexError):
        pass
    return float(np.prod(first, dtype=np.float64)) * elt


def bn_input_bytes(ctx: Context, mask: np.ndarray) -> np.ndarray:
    """Per kernel where `mask` holds: bytes of the input of the innermost batch-norm cpu_op
    whose range holds the kernel's launch call (NaN where unknown)."""
    out = np.full(len(mask), np.nan)
    ops = ctx.trace.cpu_ops
    if not mask.any() or ops.empty:
        return out
    bn = ops[ops["name"].astype(str).str.contains(_BN_OP, regex=True).to_numpy() & ops["input_dims"].notna().to_numpy()]
    if bn.empty:
        return out
    lp = _launch_points(ctx.trace)
    lp = lp.assign(_pos=np.arange(len(lp)))[mask]
    lp = lp.dropna(subset=["launch_ns"])
    for (rank, tid), launches in lp.groupby(["rank", "thread_id"], sort=False):
        r = bn[((bn["rank"] == rank) & (bn["thread_id"] == tid)).fillna(False).to_numpy(dtype=bool)]
        if r.empty:
            continue
        r = r.sort_values("start_ns", kind="stable")
        starts, ends = r["start_ns"].to_numpy(np.float64), r["end_ns"].to_numpy(np.float64)
        sizes = np.array([_input_bytes(d, t) or np.nan for d, t in zip(r["input_dims"], r["input_types"])])
        t = launches["launch_ns"].to_numpy(np.float64)
        idx = np.searchsorted(starts, t, side="right") - 1
        for step in range(4):  # the latest-starting range holding the launch is the innermost
            j = idx - step
            ok = (j >= 0) & np.isnan(out[launches["_pos"].to_numpy()])
            jj = np.clip(j, 0, len(starts) - 1)
            hit = ok & (ends[jj] >= t)
            out[launches["_pos"].to_numpy()[hit]] = sizes[jj[hit]]
    return out


def _note_depthwise(ctx: Context, unmeasured: pd.DataFrame, unsized: dict) -> None:
    """A note for PyTorch's bf16 depthwise kernels that nothing measured prices: filters whose
    channels_last swap was never timed (or not at this stride and dilation, or forward only),
    and kernels no recorded call sizes."""
    total = int(ctx.kernels["dur_ns"].sum())
    ns = int(unmeasured["total_ns"].sum()) + sum(unsized.values())
    if not total or ns < 0.01 * total:
        return
    filters = sorted({_filter_text(r) + ("" if r["backward"] else " forward only")
                      + ("" if r["floor_ns"] else " on a GPU of unknown peak") for r in unmeasured.to_dict("records")})
    what = [f"for {', '.join(filters)} filters"] if filters else []
    if unsized.get("no_call"):
        what.append("launched outside any recorded convolution call")
    if unsized.get("unread"):
        what.append("whose recorded call is not a bf16 2-D depthwise convolution advisor can read")
    ctx.notes.append(
        f"layout_churn: PyTorch's own bf16 depthwise-convolution kernels (NCHW) {' and '.join(what)} take "
        f"{ns / 1e6:.2f} ms ({100 * ns / total:.1f}% of GPU time); channels_last hands depthwise convolutions to "
        "cuDNN, which was measured faster for 3 and 5 wide filters and, for 7 x 7 ones at stride 1 run forward and "
        "backward, at a known multiple of the floor; nothing was measured for these, so nothing is claimed (try "
        "channels_last and time it)")


def _filter_text(r: dict) -> str:
    """'7x7', with a stride or dilation other than 1 said."""
    text = f"{int(r['kh'])}x{int(r['kw'])}"
    if r.get("stride", 1) != 1:
        text += f" stride {r['stride']}"
    if r.get("dilation", 1) != 1:
        text += f" dilation {r['dilation']}"
    return text


def _note_conv1d(ctx: Context, k: pd.DataFrame, mask: np.ndarray) -> None:
    ns = int(k.loc[mask, "dur_ns"].sum())
    total = int(k["dur_ns"].sum())
    if not total or ns < 0.01 * total:
        return
    ctx.notes.append(
        f"{int(mask.sum()):,} layout transposes ({ns / 1e6:.2f} ms, {100 * ns / total:.1f}% of GPU time) ran inside 1-D "
        "convolutions (conv1d: cuDNN moves [N, C, L] to NLC for its tensor-core kernels); channels_last is a 4-D "
        "memory format and does not apply to them, so they are no layout_churn finding")


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    """Launch groups of layout transposes (kind="transpose") and of NCHW batch norm with
    under-filled grids (kind="bn"; input_bytes the mean over launches, NaN when unknown), on
    devices that ran convolutions; conv_launches per device."""
    k = ctx.kernels
    kk = kinds(ctx)
    conv = kk["is_conv"].to_numpy(dtype=bool)
    if not conv.any():
        return pd.DataFrame()
    dev_key = k["rank"].astype("int64") * 1_000_003 + k["device_id"].fillna(-1).astype("int64")
    on = on_conv_devices(ctx)
    trans = on & kk["is_transpose"].to_numpy(dtype=bool)
    one_d = conv1d_kernels(ctx) if trans.any() else np.zeros(len(k), dtype=bool)
    if (trans & one_d).any():
        _note_conv1d(ctx, k, trans & one_d)
    trans = trans & ~one_d
    blocks, sms = k["grid_blocks"].astype("Float64"), k["sm_count"].astype("Float64")
    underfilled = (blocks < sms * float(rule["max_bn_waves"])).fillna(True).to_numpy(dtype=bool)
    bn = on & kk["is_bn_nchw"].to_numpy(dtype=bool) & underfilled
    sizes = bn_input_bytes(ctx, bn)
    # PyTorch's bf16 depthwise kernels, on NVIDIA devices: there channels_last hands depthwise
    # convolutions to cuDNN (measured for 3 and 5 wide filters); what MIOpen does with them is not
    depthwise = on & depthwise_counted(ctx)
    parts = []
    if trans.any():
        parts.append(group_launches(launch_rows(k, trans, []), [], k).assign(kind="transpose", input_bytes=np.nan))
    if bn.any():
        rows = launch_rows(k, bn, ["grid_blocks", "sm_count"]).assign(input_bytes=sizes[bn])
        parts.append(group_launches(rows, ["input_bytes", "grid_blocks", "sm_count"], k).assign(kind="bn"))
    if depthwise.any():
        parts.append(group_launches(launch_rows(k, depthwise, []), [], k).assign(kind="depthwise", input_bytes=np.nan))
    shaped, unsized = depthwise_by_shape(ctx)
    if len(shaped):
        excess = [depthwise_shaped_excess(r, rule) for r in shaped.to_dict("records")]
        shaped = shaped.assign(excess_ns=[np.nan if e is None else e for e in excess], kind="depthwise_shaped",
                               input_bytes=np.nan)
        _note_depthwise(ctx, shaped[shaped["excess_ns"].isna()], unsized)
        parts.append(shaped[shaped["excess_ns"].notna()])
    elif any(unsized.values()):
        _note_depthwise(ctx, shaped, unsized)
    if not parts:
        return pd.DataFrame()
    out = pd.concat(parts, ignore_index=True)
    per_dev = pd.Series(conv.astype(int), index=k.index).groupby(dev_key).sum()
    out["conv_launches"] = (out["rank"].astype("int64") * 1_000_003 + out["device_id"].fillna(-1).astype("int64")).map(per_dev).fillna(0).astype(int)
    return out


def _conv_names(ctx: Context, rank, dev) -> set[str]:
    k = ctx.kernels
    on = (k["rank"] == rank).to_numpy() & (k["device_id"].fillna(-1).astype("int64") == dev).to_numpy()
    return {str(n) for n in k.loc[on & kinds(ctx)["is_conv"].to_numpy(dtype=bool), "name"].dropna().unique()}


def _shaped_basis(shaped: pd.DataFrame, rule: Rule) -> str:
    parts = []
    for (kh, kw), grp in shaped.groupby(["kh", "kw"], sort=True):
        if kh == kw and kw in (3, 5):
            continue
        mult = float(rule[width_key(int(kh), int(kw))])
        parts.append(f"{int(kh)}x{int(kw)}: {grp['total_ns'].sum() / 1e6:.2f} ms over {mult:g}x its floor "
                     f"({grp['floor_ns'].sum() / 1e6:.3f} ms)")
    return ("; plus, for filters whose swap was not timed (stride 1, no dilation), PyTorch's depthwise kernels' time over the multiple of "
            "the convolution's floor (FLOPs at the peak or bytes at the bandwidth, forward + backward) that cuDNN's "
            "channels_last kernels of that filter took at the worst on other shapes (" + "; ".join(parts) + ")")


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    if ev.empty:
        return out
    latency = float(rule["latency_floor_ns"])
    for (rank, dev), grp in by_device(ev):
        device = device_row(ctx, rank, dev)
        bw = measured_bandwidth(device)
        trans, bn = grp[grp["kind"] == "transpose"], grp[grp["kind"] == "bn"]
        dw = grp[grp["kind"] == "depthwise"]
        shaped = grp[grp["kind"] == "depthwise_shaped"]
        trans_ns = int(trans["total_ns"].sum())
        # PyTorch's depthwise kernels give way to cuDNN's NHWC ones: their time over the
        # smallest speedup that swap measured (rules/layout_churn.toml); filters known only
        # from the recorded call, by depthwise_shaped_excess
        dw_ns = int(dw["total_ns"].sum())
        dw_excess = dw_ns * (1.0 - 1.0 / float(rule["depthwise_channels_last_speedup"]))
        shaped_ns = int(shaped["total_ns"].sum()) if len(shaped) else 0
        shaped_excess = float(shaped["excess_ns"].sum()) if len(shaped) else 0.0
        # from cuDNN's rate on other shapes (a floor multiple), not a timed swap: not firm
        by_multiple = float(shaped.loc[~shaped["kw"].isin([3, 5]) | (shaped["kh"] != shaped["kw"]), "excess_ns"].sum()) \
            if len(shaped) else 0.0
        dw_ns += shaped_ns
        dw_excess += shaped_excess
        bn_ns, bn_excess, bn_floor, bn_sized_ns = 0, 0.0, 0.0, 0
        for row in bn.to_dict("records"):
            per = row["total_ns"] / row["launches"]
            nbytes = row.get("input_bytes")
            if nbytes is not None and not pd.isna(nbytes) and bw:
                floor = max(_passes(str(row["name"])) * float(nbytes) / bw * 1e9, latency)
                bn_sized_ns += row["total_ns"]
            elif not pd.isna(row.get("grid_blocks")) and not pd.isna(row.get("sm_count")):
                floor = max(per * min(1.0, float(row["grid_blocks"]) / float(row["sm_count"])), latency)
            else:
                continue
            floor = min(floor, per)
            bn_ns += int(row["total_ns"])
            bn_excess += (per - floor) * row["launches"]
            bn_floor += floor * row["launches"]
        savings = trans_ns + int(bn_excess) + int(dw_excess)
        share = ctx.share(rank, dev, savings)
        if savings < rule["min_savings_ns"] or share < rule["min_savings_share"]:
            continue
        top = grp.sort_values("total_ns", ascending=False).iloc[0].to_dict()
        # confidence: transposes are certain to go, the depthwise swap measured; BN excess sized
        # from bytes is firm, from the grid a guess
        firm = trans_ns + dw_excess - by_multiple + (bn_excess if bn_sized_ns >= 0.5 * max(bn_ns, 1) else 0)
        confidence = "high" if firm >= 0.5 * savings else "medium" if by_multiple < 0.5 * savings else "low"
        out.append(
            finding_for(
                rule, top,
                rank=as_int(rank),
                device_id=None if dev < 0 else int(dev),
                shape=None,
                # a convolution's row (depthwise_by_shape) spans several kernels: no one grid
                **({"grid": None, "block": None} if top.get("kind") == "depthwise_shaped" else {}),
                launches=int(trans["launches"].sum() + bn["launches"].sum() + dw["launches"].sum()
                             + (shaped["launches"].sum() if len(shaped) else 0)),
                total_ns=trans_ns + bn_ns + dw_ns,
                est_savings_ns=int(savings),
                confidence=confidence,
                tier=2,
                evidence={
                    "transpose_ns": trans_ns,
                    "transpose_launches": int(trans["launches"].sum()),
                    "bn_nchw_ns": bn_ns,
                    "bn_nchw_launches": int(bn["launches"].sum()),
                    "bn_excess_ns": int(bn_excess),
                    "bn_sized_from_bytes": round(bn_sized_ns / bn_ns, 3) if bn_ns else None,
                    "depthwise_native_ns": dw_ns,
                    "depthwise_native_launches": int(dw["launches"].sum() + (shaped["launches"].sum() if len(shaped) else 0)),
                    "depthwise_excess_ns": int(dw_excess),
                    "depthwise_by_floor_multiple_ns": int(by_multiple),
                    "depthwise_filters": sorted({f"{int(a)}x{int(b)}" for a, b in zip(shaped["kh"], shaped["kw"])})
                    if len(shaped) else [],
                    "conv_launches": int(grp["conv_launches"].iloc[0]),
                    "share_of_gpu_time": round(share, 4),
                    "bound_ns": int(bn_floor),
                    "basis": "the transposes' whole time (channels_last removes them) plus the NCHW batch-norm launches' time "
                             "over their floor (input bytes x passes at the measured bandwidth, or the busy-SM share of the "
                             "launch where the input's size is unknown)"
                             + (f" plus PyTorch's depthwise-convolution kernels' time over the "
                                f"{float(rule['depthwise_channels_last_speedup']):g}x that cuDNN's channels_last kernels "
                                f"measured at the least (EfficientNet-B0, MaxViT-T on the H200)" if dw_ns - shaped_ns else "")
                             + (_shaped_basis(shaped, rule) if by_multiple else ""),
                    # the transposes and batch norms go; the convolutions change kernels with the layout
                    "covers_kernels": sorted({str(n) for n in grp["name"]} | _conv_names(ctx, rank, dev)),
                },
                suggestion={"fix": FIX, "memory_format": "channels_last"},
            )
        )
    return out
