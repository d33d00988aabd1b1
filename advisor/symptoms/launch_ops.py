"""Which host operator launched a kernel: Kineto cpu_ops and emit_nvtx ranges by name.

A kernel's name says what the library ran, not what the program asked for: cuDNN runs an NCHW
1x1 convolution as a CUTLASS GEMM (`cutlass_80_tensorop_..._align2`), which looks like a
misaligned matmul until the enclosing `aten::cudnn_convolution` is seen.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .context import Context
from .gemm import innermost_ranges
from .strings import contains

# ATen's convolution entry points (forward and backward; Kineto op names and emit_nvtx texts,
# which start with the op name)
CONV_OPS = r"^(?:aten::)?(?:cudnn_convolution|miopen_convolution|_convolution|convolution|convolution_backward|conv\dd|conv_transpose\dd|mkldnn_convolution)\b"

# cuDNN's recurrent layers (forward and backward): like its convolutions, they run on TF32
# under torch.backends.cudnn.allow_tf32 (on by default), not the matmul switch
# (only cuDNN's and MIOpen's own entry points: aten::lstm without cuDNN runs cuBLAS GEMMs, which
# follow the matmul switch)
RNN_OPS = r"^(?:aten::)?(?:_cudnn_rnn|_cudnn_rnn_backward|miopen_rnn|miopen_rnn_backward)\b"
CUDNN_OPS = f"(?:{CONV_OPS})|(?:{RNN_OPS})"


def _ranges(ctx: Context, pattern: str) -> pd.DataFrame:
    cols = ["rank", "thread_id", "start_ns", "end_ns"]
    parts = []
    ops = ctx.trace.cpu_ops
    if len(ops):
        parts.append(ops.loc[contains(ops["name"], pattern).to_numpy(), cols])
    nv = ctx.trace.nvtx
    if len(nv) and "thread_id" in nv.columns:
        parts.append(nv.loc[contains(nv["text"], pattern).to_numpy(), cols])
    parts = [p for p in parts if len(p)]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=cols)


def launched_inside(ctx: Context, pattern: str = CONV_OPS) -> np.ndarray:
    """Per kernel (by position in trace.kernels): whether its launch call ran inside a host
    range (cpu_op or NVTX) whose name matches `pattern`. All False where the trace has no
    such ranges or no launch calls to place the kernels by."""
    key = ("launched_inside", pattern)
    if key not in ctx.cache:
        rg = _ranges(ctx, pattern)
        if rg.empty:
            hit = np.zeros(len(ctx.trace.kernels), dtype=bool)
        else:
            hit = innermost_ranges(ctx.trace, rg)[1] >= 0
        ctx.cache[key] = hit
    return ctx.cache[key]
