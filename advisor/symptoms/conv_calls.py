"""The recorded convolution calls of a trace: `aten::convolution` and `aten::convolution_backward`
read from Kineto's record_shapes (input, weight, stride, padding, dilation, groups, dtype), each
kernel mapped to the call it was launched from, and a convolution's floor. Read by
slow_convolution (what a convolution costs against its floor) and by kernel_kinds (PyTorch's
depthwise kernels, sized through their call for layout_churn); it imports neither.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from ..basics import input_dims, input_dtypes
from .calibration import measured_bandwidth, peak_flops
from .context import ELEMENT_BYTES, Context
from .gemm import innermost_ranges

_FWD, _BWD = "aten::convolution", "aten::convolution_backward"


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
    unreadable); computed once a trace (slow_convolution and kernel_kinds.depthwise_by_shape read it)."""
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


def conv_floor_ns(device: dict, dtype: str | None, flop: float, nbytes: float) -> float:
    """A convolution's floor: its FLOPs at the measured tensor-core peak of its 16-bit dtype, or
    its bytes at the measured bandwidth, whichever is longer (0 where neither is known)."""
    rate, _ = peak_flops(device, dtype) if dtype in ("bf16", "fp16") else (None, "")
    bw = measured_bandwidth(device)
    return max(flop / rate * 1e9 if rate else 0.0, nbytes / bw * 1e9 if bw else 0.0)
