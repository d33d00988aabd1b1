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

from ..basics import input_dims, input_dtypes
from ..findings import Finding
from ..rules import Rule
from .calibration import conv_fp32_speedup, measured_bandwidth, peak_flops
from .context import ELEMENT_BYTES, Context, finding_for
from .gemm import innermost_ranges
from .kernel_kinds import device_row, is_depthwise_native

SYMPTOM = "slow_convolution"
REQUIRES = (
    ("cpu_ops", "input_dims", "Does the trace record operator shapes (Kineto with record_shapes=True)?"),
    ("runtime", "correlation_id", "Does the trace link kernels to their launch calls?"),
)

_FWD, _BWD = "aten::convolution", "aten::convolution_backward"
# cuDNN's implicit/explicit/precomputed GEMM convolutions on CUDA cores, here on 16-bit data: what
# HuBERT's grouped positional convolution and SqueezeBERT's grouped 1 x 1 projections ran in bf16
_SIMT_16BIT = re.compile(r"\w*convolve(?:Nd)?_sgemm<(?:__nv_bfloat16|__half)\b")
# fewer input channels a group than a tensor-core MMA's K step (3-channel stems, depthwise): a
# CUDA-core kernel is cuDNN's reasonable choice there, not a sign of a missed fast path
_MIN_TC_CHANNELS = 8
_EV_COLS = ["rank", "device_id", "key", "dtype", "x", "w", "groups", "calls", "backward_calls", "launches",
            "span_ns", "kernel_ns", "floor_ns", "flop", "name", "top_ns", "names"]


def _ints(text) -> list[int] | None:
    """'[64]' / '1' / '[True, False]' (Kineto's Concrete Inputs) -> a list of ints, else None."""
    if not isinstance(text, str) or not text:
        return None
    try:
        v = json.loads(text.replace("True", "1").replace("False", "0"))
    except ValueError:
        return None
    v = v if isinstance(v, list) else [v]
    return [int(x) for x in v] if all(isinstance(x, (int, float)) for x in v) else None


def _per_dim(text, n: int, default: int) -> list[int] | None:
    """A recorded int list for n spatial dims: empty -> the default, one value -> each dim,
    unreadable (a symbolic size) -> None."""
    if text in ("", "[]"):
        return [default] * n
    v = _ints(text)
    if not v:
        return None
    return v * n if len(v) == 1 else (v if len(v) == n else None)


def conv_call(name: str, dims_text, types_text, concrete_text) -> dict | None:
    """One convolution call's shape: {x, w, out, groups, dtype, flop, bytes} from the recorded
    arguments of aten::convolution (input, weight, bias, stride, padding, dilation, transposed,
    output_padding, groups) or aten::convolution_backward (grad_output, input, weight,
    bias_sizes, stride, padding, dilation, transposed, output_padding, groups, output_mask);
    None for a transposed convolution or arguments it cannot read."""
    dims = input_dims(dims_text)
    try:
        concrete = json.loads(concrete_text) if isinstance(concrete_text, str) else None
    except ValueError:
        concrete = None
    if not dims or not isinstance(concrete, list):
        return None
    bwd = name.endswith("convolution_backward")
    off = 1 if bwd else 0
    if len(dims) < 2 + off or len(concrete) < 9 + off:
        return None
    x, w = dims[off], dims[off + 1]
    if not (isinstance(x, list) and isinstance(w, list) and len(x) == len(w) >= 3
            and all(isinstance(d, int) and d > 0 for d in x + w)):
        return None
    nsp = len(x) - 2
    stride, pad, dil = (_per_dim(concrete[3 + off + i], nsp, d) for i, d in ((0, 1), (1, 0), (2, 1)))
    transposed, groups = _ints(concrete[6 + off]), _ints(concrete[8 + off])
    if not (stride and pad and dil and groups and transposed) or transposed[0]:
        return None  # unreadable, or a transposed convolution
    g = groups[0]
    N, C, K, cg = x[0], x[1], w[0], w[1]
    if g <= 0 or C != cg * g or K % g:
        return None
    if bwd:
        out = dims[0][2:] if isinstance(dims[0], list) and len(dims[0]) == len(x) else None
        mask = _ints(concrete[10]) if len(concrete) > 10 else None
        passes = (mask[0] + mask[1]) if mask and len(mask) >= 2 else 2
    else:
        out = [(x[2 + i] + 2 * pad[i] - dil[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in range(nsp)]
        passes = 1
    if not out or any(o <= 0 for o in out):
        return None
    ks = math.prod(w[2:])
    flop = 2.0 * N * K * math.prod(out) * cg * ks * passes
    dts = input_dtypes(types_text)
    dtype = dts[off] if len(dts) > off else None  # the input's (the weight is cast to it)
    elt = ELEMENT_BYTES.get(dtype or "", 2)
    nbytes = float(elt) * (N * C * math.prod(x[2:]) + K * cg * ks + N * K * math.prod(out)) * (2 if bwd else 1)
    return {"x": x, "w": w, "groups": g, "dtype": dtype, "flop": flop, "bytes": nbytes, "backward": bwd,
            "stride": stride, "dilation": dil}


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


def _nested(ops: pd.DataFrame) -> np.ndarray:
    """Per op: holds an op of the same name on its thread. Under autocast PyTorch records one
    convolution twice, the dispatcher's call (it casts the inputs, and records their types before
    the cast) around the call it redispatches to: one convolution, read from the inner record
    (the outer one's cast kernels then belong to no call)."""
    out = np.zeros(len(ops), dtype=bool)
    keys = ops[["rank", "thread_id", "name"]].astype(str).agg("|".join, axis=1).to_numpy()
    starts, ends = ops["start_ns"].to_numpy(np.int64), ops["end_ns"].to_numpy(np.int64)
    for key in np.unique(keys):
        idx = np.flatnonzero(keys == key)
        idx = idx[np.lexsort((-ends[idx], starts[idx]))]  # by start, the longer first
        # one thread's ranges nest: a range the next one starts inside holds it
        out[idx[:-1]] = (starts[idx[1:]] >= starts[idx[:-1]]) & (ends[idx[1:]] <= ends[idx[:-1]])
    return out


def conv_calls(ctx: Context) -> tuple[pd.DataFrame, np.ndarray, list]:
    """The recorded aten::convolution / convolution_backward calls (innermost_ranges' frame), each
    kernel's call (its row there, or -1) and each call's conv_call reading (None where
    unreadable); computed once a trace (evidence and fp32_by_choice both read it)."""
    if "conv_calls" in ctx.cache:
        return ctx.cache["conv_calls"]
    out = (pd.DataFrame(), np.full(len(ctx.kernels), -1, dtype=np.int64), [])
    ops = ctx.trace.cpu_ops
    if len(ops) and "input_dims" in ops.columns and "concrete_inputs" in ops.columns:
        name = ops["name"].astype(str)
        sel = ((name == _FWD) | (name == _BWD)).to_numpy().copy()
        sel[sel] = ~_nested(ops.loc[sel])
        if sel.any():
            cols = ["rank", "thread_id", "start_ns", "end_ns", "name", "input_dims", "concrete_inputs"] + (
                ["input_types"] if "input_types" in ops.columns else [])
            ranges, hit = innermost_ranges(ctx.trace, ops.loc[sel, cols])
            types = ranges["input_types"] if "input_types" in ranges.columns else [None] * len(ranges)
            calls = [conv_call(str(nm), d_text, t_text, c_text) for nm, d_text, t_text, c_text in
                     zip(ranges["name"], ranges["input_dims"], types, ranges["concrete_inputs"])]
            out = (ranges, hit, calls)
    ctx.cache["conv_calls"] = out
    return out


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


def conv_floor_ns(device: dict, dtype: str | None, flop: float, nbytes: float) -> float:
    """A convolution's floor: its FLOPs at the measured tensor-core peak of its 16-bit dtype, or
    its bytes at the measured bandwidth, whichever is longer (0 where neither is known)."""
    rate, _ = peak_flops(device, dtype) if dtype in ("bf16", "fp16") else (None, "")
    bw = measured_bandwidth(device)
    return max(flop / rate * 1e9 if rate else 0.0, nbytes / bw * 1e9 if bw else 0.0)


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
