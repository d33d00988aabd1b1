"""slow_convolution: a 16-bit convolution whose library kernels run far under its roofline, where
the same convolution in fp32 measured faster (Tier 3: precision).

What it detects: `aten::convolution` (forward) and `aten::convolution_backward` calls recorded
with their shapes and arguments (Kineto `record_shapes`), in bf16 or fp16, whose kernels on one
device take over `min_floor_multiple` times the convolution's floor: its FLOPs at the measured
tensor-core peak of its dtype, or its bytes (input, weight, output once each) at the measured
bandwidth, whichever is longer. One finding per convolution (forward and backward together).
The case that made it: wav2vec2 and HuBERT's positional convolution (768 channels in 16 groups
of 48, kernel 128) under bf16 autocast, whose forward cuDNN runs one group at a time on kernels
that do not use the tensor cores (its backward on tensor-core kernels); in fp32 cuDNN runs it on TF32 tensor cores 2.66x faster (forward +
backward on the H200, bench/probe_grouped_conv.py; HuBERT's training step measured -12.5 ms of
busy GPU time and -7.3 ms of step with that convolution in fp32).
What to do: run that convolution in fp32, outside autocast (the module's forward under
`torch.autocast(device_type, enabled=False)` on `.float()` inputs, its output cast back); the
evidence names the shape. (Or as one batched GEMM a group, unfold + bmm: measured 3.1x in bf16,
at the cost of an im2col buffer of N x C x L x kernel elements.)
Estimate: only for a convolution run forward and backward (the remedy was measured over both),
where running in fp32 was measured on a convolution of as many spatial dims, grouped alike, of
the same dtype width, with channels a group, kernel size and groups each within `near_factor`,
on an NVIDIA GPU (cuDNN's choice of kernels; rules/measured
`[[conv]]`): the convolution's kernel time (the union of its kernels' intervals: cuDNN spreads
a grouped convolution's launches over several streams, and their sum double-counts) times
(1 - 1 / the measured speedup), never below its floor. Elsewhere no finding; where the
convolution takes over `note_floor_multiple` times its floor, a note says so and that no remedy
was measured near it; so does one over `min_floor_multiple` whose main kernel is cuDNN's CUDA-core
`*convolve_sgemm` on 16-bit data with at least 8 input channels a group (SqueezeBERT's grouped
1 x 1 projections: 15-19x), naming the candidates (fp32, or a batched matmul over the groups).
PyTorch's own depthwise kernels are layout_churn's (channels_last), not this rule's. A
convolution autocast records twice (the dispatcher's call around the redispatched one) counts once.
"""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pandas as pd

from ..findings import Finding
from ..rules import Rule
from .calibration import conv_fp32_speedup
from .context import Context, finding_for
from .conv_calls import conv_calls, conv_floor_ns
from .kernel_kinds import device_row, is_depthwise_native

SYMPTOM = "slow_convolution"
REQUIRES = (
    ("cpu_ops", "input_dims", "Does the trace record operator shapes (Kineto with record_shapes=True)?"),
    ("runtime", "correlation_id", "Does the trace link kernels to their launch calls?"),
)

# cuDNN's implicit/explicit/precomputed GEMM convolutions on CUDA cores, here on 16-bit data: what
# HuBERT's grouped positional convolution and SqueezeBERT's grouped 1 x 1 projections ran in bf16
_SIMT_16BIT = re.compile(r"\w*convolve(?:Nd)?_sgemm<(?:__nv_bfloat16|__half)\b")
# fewer input channels a group than a tensor-core MMA's K step (3-channel stems, depthwise): a
# CUDA-core kernel is cuDNN's reasonable choice there, not a sign of a missed fast path
_MIN_TC_CHANNELS = 8
_EV_COLS = ["rank", "device_id", "key", "dtype", "x", "w", "groups", "calls", "backward_calls", "launches",
            "span_ns", "kernel_ns", "floor_ns", "flop", "name", "top_ns", "names"]


def _span(starts: np.ndarray, ends: np.ndarray) -> int:
    """Nanoseconds covered by the union of [start, end) intervals."""
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    run_end = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    stops = np.append(idx[1:], len(s)) - 1
    return int((run_end[stops] - s[idx]).sum())


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    """Per (rank, device, convolution): calls, launches, the union and the sum of its kernels'
    time, its floor (FLOPs at the dtype's measured peak or bytes at the measured bandwidth,
    summed over the calls) and the kernel that took the most time."""
    ranges, hit, calls = conv_calls(ctx)
    inside = np.flatnonzero(hit >= 0)
    if not len(inside):
        return pd.DataFrame(columns=_EV_COLS)
    k = ctx.kernels
    starts, ends = k["start_ns"].to_numpy(np.int64), k["end_ns"].to_numpy(np.int64)
    dev = k["device_id"].fillna(-1).astype("int64").to_numpy()
    names = k["name"].astype(str).to_numpy()
    groups: dict[tuple, dict] = {}
    order = inside[np.argsort(hit[inside], kind="stable")]
    bounds = np.flatnonzero(np.diff(hit[order])) + 1
    for part in np.split(order, bounds):
        i = int(hit[part[0]])
        c = calls[i]
        if c is None:
            continue
        for d in np.unique(dev[part]):
            mine = part[dev[part] == d]
            key = (int(ranges["rank"].iloc[i]), int(d), json.dumps([c["x"], c["w"], c["groups"], c["dtype"]]))
            g = groups.setdefault(key, {"rank": key[0], "device_id": key[1], "key": key[2], "dtype": c["dtype"],
                                        "x": c["x"], "w": c["w"], "groups": c["groups"], "calls": 0, "launches": 0,
                                        "backward_calls": 0, "pos": [], "kernel_ns": 0, "flop": 0.0, "bytes": 0.0,
                                        "by_name": {}})
            g["calls"] += 1
            g["backward_calls"] += c["backward"]
            g["launches"] += len(mine)
            g["pos"].append(mine)
            g["kernel_ns"] += int((ends[mine] - starts[mine]).sum())
            g["flop"] += c["flop"]
            g["bytes"] += c["bytes"]
            for n, t in zip(names[mine], ends[mine] - starts[mine]):
                g["by_name"][n] = g["by_name"].get(n, 0) + int(t)
    rows = []
    for g in groups.values():
        pos = np.concatenate(g["pos"])
        g["span_ns"] = _span(starts[pos], ends[pos])  # once over every call: calls may overlap too
        floor = conv_floor_ns(_device(ctx, g["rank"], g["device_id"]), g["dtype"], g["flop"], g["bytes"])
        top = max(g["by_name"].items(), key=lambda kv: kv[1])
        rows.append({**{c: g[c] for c in ("rank", "device_id", "key", "dtype", "x", "w", "groups", "calls",
                                         "backward_calls", "launches", "span_ns", "kernel_ns", "flop")},
                     "floor_ns": floor, "name": top[0], "top_ns": top[1], "names": sorted(g["by_name"])})
    return pd.DataFrame(rows, columns=_EV_COLS)


def fp32_by_choice(ctx: Context, near_factor: float | None) -> np.ndarray:
    """Per kernel: launched by an fp32 convolution whose 16-bit version measured slower (the
    remedy this rule names, already applied): dtype_churn must not tell it back to 16-bit. None
    near_factor (the rule disabled): nothing."""
    if "conv_fp32_by_choice" in ctx.cache:
        return ctx.cache["conv_fp32_by_choice"]
    out = np.zeros(len(ctx.kernels), dtype=bool)
    if near_factor:
        ranges, hit, calls = conv_calls(ctx)
        dev = ctx.kernels["device_id"].fillna(-1).astype("int64").to_numpy()
        inside = np.flatnonzero(hit >= 0)
        first = dict(zip(*np.unique(hit[inside], return_index=True)))  # a call -> its first kernel
        keep = np.zeros(len(calls), dtype=bool)
        for i, c in enumerate(calls):
            if c is None or c["dtype"] != "fp32" or i not in first:
                continue
            device = _device(ctx, ranges["rank"].iloc[i], dev[inside[first[i]]])
            m = conv_fp32_speedup(device, {"dtype": "bf16", "groups": c["groups"], "channels_per_group": c["w"][1],
                                           "kernel": math.prod(c["w"][2:]), "spatial_dims": len(c["x"]) - 2},
                                  near_factor)
            keep[i] = m is not None and m[0] > 1
        if len(calls):
            out = (hit >= 0) & keep[np.maximum(hit, 0)]
    ctx.cache["conv_fp32_by_choice"] = out
    return out


def _device(ctx: Context, rank, dev) -> dict:
    return device_row(ctx, rank, dev)


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out: list[Finding] = []
    if ev.empty:
        return out
    for r in ev.sort_values("span_ns", ascending=False, kind="stable").to_dict("records"):
        if r["dtype"] not in ("bf16", "fp16") or r["floor_ns"] <= 0:
            continue
        if is_depthwise_native(str(r["name"])) and len(r["x"]) == 4:
            continue  # PyTorch's own 2-D depthwise kernels: layout_churn's (channels_last hands them to cuDNN)
        span = float(r["span_ns"])
        if span < rule["min_floor_multiple"] * r["floor_ns"] or ctx.share(r["rank"], r["device_id"], span) < rule["min_share"]:
            continue
        x, w, g = r["x"], r["w"], int(r["groups"])
        what = (f"{len(x) - 2}-D convolution x{x} w{w}" + (f" in {g} groups of {w[1]} channels" if g > 1 else "")
                + f", {r['dtype']}")
        near = float(rule["near_factor"])
        # the remedy was measured over forward + backward: a convolution seen only forward
        # (inference) has no measured ratio (HuBERT's forward and backward differ 10x in speed)
        measured = conv_fp32_speedup(_device(ctx, r["rank"], r["device_id"]),
                                     {"dtype": r["dtype"], "groups": g, "channels_per_group": w[1],
                                      "kernel": math.prod(w[2:]), "spatial_dims": len(x) - 2},
                                     near) if r["backward_calls"] else None
        rate = r["flop"] / span * 1e9  # FLOP/s
        if measured is None:
            simt = _SIMT_16BIT.search(str(r["name"])) and w[1] >= _MIN_TC_CHANNELS
            if simt:
                pointwise = math.prod(w[2:]) == 1
                ctx.notes.append(
                    f"slow_convolution: a {what} on rank {r['rank']} (device {r['device_id']}) runs on cuDNN's CUDA-core "
                    f"kernel `{_SIMT_16BIT.search(str(r['name'])).group(0).split('<')[0]}` (no tensor cores): "
                    f"{span / 1e6:.2f} ms, {span / r['floor_ns']:.0f}x its floor at the measured peak "
                    f"({100 * ctx.share(r['rank'], r['device_id'], span):.0f}% of GPU time); "
                    + ("no remedy was measured on a convolution near it" if r["backward_calls"] else
                       "it runs forward only, and the remedies were measured forward + backward")
                    + ", so nothing is claimed: time it in fp32 (cuDNN's TF32 kernels) or "
                    + ("as one batched matmul over the groups (a 1-wide kernel needs no unfold: torch.einsum over "
                       "[groups, out, in] weights)" if pointwise else "as one batched GEMM a group (unfold + bmm)"))
                continue
            if span < rule["note_floor_multiple"] * r["floor_ns"]:
                continue
            ctx.notes.append(
                f"slow_convolution: a {what} on rank {r['rank']} (device {r['device_id']}) takes {span / 1e6:.2f} ms, "
                f"{span / r['floor_ns']:.0f}x its floor at the measured peak (it reaches {rate / 1e12:.1f} TFLOP/s) "
                f"in `{str(r['name'])[:80]}`; no remedy was measured on a convolution near it"
                + ("" if r["backward_calls"] else " run forward only") + ", so nothing is claimed (running it in fp32 "
                "or as a batched GEMM are the candidates to time)")
            continue
        speedup, src, how = measured
        est = min(span * (1 - 1 / speedup), span - r["floor_ns"])
        if est < rule["min_savings_ns"]:
            continue
        row = {"name": r["name"], "rank": r["rank"], "device_id": r["device_id"], "launches": r["launches"],
               "total_ns": int(span)}
        out.append(finding_for(
            rule, row, shape=None, grid=None, block=None,
            est_savings_ns=int(est),
            confidence={"exact": "medium", "near": "low", "other GPU": "low"}[how],
            tier=3,
            evidence={
                "convolution": what,
                "calls": int(r["calls"]),
                "span_ns": int(span),
                "kernel_ns": int(r["kernel_ns"]),
                "floor_ns": int(r["floor_ns"]),
                "bound_ns": int(r["floor_ns"]),
                "floor_multiple": round(span / r["floor_ns"], 1),
                "tflops": round(rate / 1e12, 2),
                "share_of_gpu_time": round(ctx.share(r["rank"], r["device_id"], span), 4),
                "measured_fp32_speedup": speedup,
                "measured": how,
                "basis": (f"the convolution's kernels cover {span / 1e6:.2f} ms (their sum, {r['kernel_ns'] / 1e6:.2f} "
                          f"ms, overlaps across streams) over the {speedup:.2f}x cuDNN measured in fp32 against 16-bit, "
                          f"forward + backward, on a convolution "
                          + ("of this shape and dtype" if how == "exact" else
                             f"grouped alike, its channels a group, kernel size and groups within {near:g}x")
                          + (" on another GPU" if how == "other GPU" else "")
                          + f" ({src}); never under its floor, {r['floor_ns'] / 1e6:.3f} ms at the measured peak"),
                "covers_kernels": r["names"],
            },
            suggestion={"fix": ("run this convolution in fp32 outside autocast: in its module's forward, "
                                "with torch.autocast(device_type, enabled=False): y = conv(x.float()).to(x.dtype)"),
                        "convolution": what},
        ))
    return out
