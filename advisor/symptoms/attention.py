"""Attention facts that need no torch: which kernels are attention (and whose), problem shapes
from the operators that launched them, the split-KV wave rule and the HBM floor of decode.

Used by the decode-attention symptom and by `advisor generate split_kv` (which must work on a
laptop without torch). kernels/split_kv_attention.py keeps its own copy of `num_splits_for`
(a kernel file stands alone); tests/test_attention_symptoms.py checks the two agree.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ..basics import input_dims, input_dtypes, op_base

# Attention kernels by library, first match wins. Each entry: (backend id, name pattern,
# "split" when the kernel already walks a chunk of the KV sequence and a combine follows).
_BACKENDS: list[tuple[str, re.Pattern, bool]] = [
    # FlashAttention 2 (flash-attn, and PyTorch's flash backend `pytorch_flash::`): the split
    # kernel and its combine step
    ("flash", re.compile(r"flash_fwd_splitkv_combine_kernel", re.I), True),
    ("flash", re.compile(r"flash_fwd_splitkv_kernel", re.I), True),
    ("flash", re.compile(r"flash_fwd_kernel|flash_fwd_sm\d+", re.I), False),
    # FlashAttention 3 (Hopper): one kernel whose scheduler may split (num_splits > 1 adds a
    # combine kernel, FlashAttnFwdCombine)
    ("flash3", re.compile(r"FlashAttnFwdCombine|flash_fwd_combine", re.I), True),
    ("flash3", re.compile(r"flash::compute_attn_ws|FlashAttnFwdSm\d+|flash::FlashAttnFwd", re.I), False),
    # cuDNN SDPA (PyTorch's cudnn backend, TransformerEngine): generated flash kernels
    ("cudnn", re.compile(r"cudnn_generated_fort_native_sdpa|(?:^|_)sm\d+_flash_fprop|cudnn.*sdpa", re.I), False),
    # FlashInfer: decode kernels with and without the KV partition, and its merge step
    ("flashinfer", re.compile(r"MergeStates|merge_state", re.I), True),
    ("flashinfer", re.compile(r"(?:Single|Batch)DecodeWith\w*Kernel|BatchPrefillWith\w*Kernel", re.I), False),
    # PyTorch's memory-efficient backend (xformers' CUTLASS kernels)
    ("efficient", re.compile(r"fmha_cutlass|fmha_?\w*_kernel|AttentionKernel<|efficient_attention", re.I), False),
    # AMD Composable Kernel (ROCm's flash attention)
    ("ck", re.compile(r"FmhaFwdSplitKV\w*Kernel", re.I), True),
    ("ck", re.compile(r"FmhaFwdKernel", re.I), False),
    # vLLM / SGLang paged attention: v2 and the Triton stage-1/2 decode are split, v1 is not
    ("paged", re.compile(r"paged_attention_v2_reduce|paged_attention\w*_reduce_kernel|_fwd_kernel_stage2", re.I), True),
    ("paged", re.compile(r"paged_attention_v2|_fwd_kernel_stage1|paged_attention_ll4mi", re.I), True),
    ("paged", re.compile(r"paged_attention", re.I), False),
    # advisor's own split-KV schedule (kernels/split_kv_attention.py)
    ("advisor", re.compile(r"split_kv_combine_kernel|split_kv_kernel|split_kv_attention|stream_kv_kernel"
                           r"|stream_kv_attention", re.I), True),
    # Triton attention kernels (tutorial `_attn_fwd`, user kernels named after attention)
    ("triton", re.compile(r"_attn_fwd|attn_fwd|attention_fwd|triton\w*attn|flash_decod", re.I), False),
]
_COMBINE = re.compile(
    r"combine|MergeStates|merge_state|_reduce_kernel|stage2", re.I
)


def attention_backend(name: Any) -> tuple[str, bool, bool] | None:
    """(backend id, already split, is the combine step) of an attention kernel name, or None
    for any other kernel."""
    if not isinstance(name, str):
        return None
    for backend, pat, split in _BACKENDS:
        if pat.search(name):
            return backend, split, bool(split and _COMBINE.search(name))
    return None


# Operators whose inputs give an attention problem, and the layout of their q/k/v dims:
# "bhld" (batch, heads, length, head_dim) or "blhd" (batch, length, heads, head_dim).
_ATTENTION_OPS = {
    "scaled_dot_product_attention": "bhld",
    "_scaled_dot_product_flash_attention": "bhld",
    "_scaled_dot_product_cudnn_attention": "bhld",
    "_cudnn_attention_forward": "bhld",
    "_scaled_dot_product_efficient_attention": "bhld",
    "_flash_attention_forward": "blhd",
    "_efficient_attention_forward": "blhd",
}
# the backend each aten operator dispatches to (the outer SDPA op does not say)
OP_BACKEND = {
    "_scaled_dot_product_flash_attention": "flash",
    "_flash_attention_forward": "flash",
    "_scaled_dot_product_cudnn_attention": "cudnn",
    "_cudnn_attention_forward": "cudnn",
    "_scaled_dot_product_efficient_attention": "efficient",
    "_efficient_attention_forward": "efficient",
}
_MAX_EXTENT = 2**31 - 1


def attention_shape_from_op(op: str, dims: list[Any]) -> dict[str, int] | None:
    """{"B", "Hq", "Hkv", "Lq", "S", "D"} from an attention operator's input dims, else None."""
    layout = _ATTENTION_OPS.get(op_base(op))
    if layout is None or not isinstance(dims, list) or len(dims) < 3:
        return None
    q, k, v = dims[:3]
    if not all(isinstance(t, list) and len(t) == 4 and all(isinstance(x, int) and not isinstance(x, bool) for x in t)
               for t in (q, k, v)):
        return None
    if layout == "bhld":
        (B, Hq, Lq, D), (Bk, Hkv, S, Dk) = q, k
    else:
        (B, Lq, Hq, D), (Bk, S, Hkv, Dk) = q, k
    if Bk != B or Dk != D or not all(1 <= x <= _MAX_EXTENT for x in (B, Hq, Hkv, Lq, S, D)) or Hq % Hkv:
        return None
    return {"B": B, "Hq": Hq, "Hkv": Hkv, "Lq": Lq, "S": S, "D": D}


def parse_attention_op(name: Any, input_dims_text: Any, input_types: Any = None) -> dict[str, Any] | None:
    """Attention shape (plus dtype, op) of a Kineto cpu_op with `Input Dims`, else None."""
    dims = input_dims(input_dims_text)
    if not isinstance(name, str) or dims is None:
        return None
    shape = attention_shape_from_op(name, dims)
    if shape is None:
        return None
    dtypes = input_dtypes(input_types)
    return dict(shape, dtype=dtypes[0] if dtypes else None, op=op_base(name))  # the query's dtype


_ADVISOR = re.compile(r"^advisor\.attention\b(.*)$")
_KV = re.compile(r"\b([A-Za-z]+)=([A-Za-z0-9]+)")


def parse_attention_range(text: Any) -> dict[str, Any] | None:
    """Attention shape from an NVTX range text: advisor's own convention (the generated
    split_kv variant's `advisor.attention B=1 Hq=32 Hkv=8 Lq=1 S=32768 D=128 dtype=bf16`) or
    emit_nvtx(record_shapes=True) (`aten::scaled_dot_product_attention, seq = 3, op_id = 7,
    sizes = [[1, 32, 1, 128], ...]`)."""
    if not isinstance(text, str):
        return None
    m = _ADVISOR.match(text)
    if m:
        kv = dict(_KV.findall(m.group(1)))
        try:
            B, Hq, Hkv, Lq, S, D = (int(kv[k]) for k in ("B", "Hq", "Hkv", "Lq", "S", "D"))
        except (KeyError, ValueError):
            return None
        shape = attention_shape_from_op("scaled_dot_product_attention", [[B, Hq, Lq, D], [B, Hkv, S, D], [B, Hkv, S, D]])
        dtype = kv.get("dtype")
        return None if shape is None else dict(shape, dtype=dtype if dtype in ELEMENT_BYTES else None, op="advisor.attention")
    if "::" not in text[:64]:
        return None
    op = text.split(",", 1)[0].strip()
    if op_base(op) not in _ATTENTION_OPS:
        return None
    i = text.find("sizes = [")
    if i < 0:
        return None
    start = text.index("[", i)
    depth = 0
    for j in range(start, min(len(text), start + 4096)):
        depth += {"[": 1, "]": -1}.get(text[j], 0)
        if depth == 0:
            try:
                sizes = json.loads(text[start : j + 1])
            except ValueError:
                return None
            shape = attention_shape_from_op(op, sizes)
            return None if shape is None else dict(shape, dtype=None, op=op_base(op))
    return None


def num_splits_for(units: int, slots: int, key_blocks: int, max_splits: int = 128, keep: float = 0.85) -> int:
    """FlashAttention's split heuristic (same rule as kernels/split_kv_attention.py): no split
    for a grid already at 80% of the slots; else the smallest split count whose wave
    efficiency n / (ceil(n / slots) x slots), n = units x split, is within `keep` of the best
    over 1..min(max_splits, slots, key_blocks), skipping split counts that give the same
    chunk length as one fewer."""
    units, slots, key_blocks = max(1, units), max(1, slots), max(1, key_blocks)
    if units >= 0.8 * slots:
        return 1
    top = max(1, min(max_splits, slots, key_blocks))

    def cdiv(a: int, b: int) -> int:
        return -(-a // b)

    eff = {s: units * s / (cdiv(units * s, slots) * slots) for s in range(1, top + 1)
           if s == 1 or cdiv(key_blocks, s) != cdiv(key_blocks, s - 1)}
    best = max(eff.values())
    return min(s for s, e in eff.items() if e >= keep * best)


ELEMENT_BYTES = {"fp8": 1, "fp16": 2, "bf16": 2, "fp32": 4}


def kv_bytes(shape: dict[str, Any], default_elt: int = 2) -> tuple[int, bool]:
    """Bytes of K and V read once (the decode floor), and whether the element size is known."""
    elt = ELEMENT_BYTES.get(shape.get("dtype") or "")
    known = elt is not None
    return int(2 * shape["B"] * shape["Hkv"] * shape["S"] * shape["D"] * (elt or default_elt)), known


def attn_arg(shape: dict[str, Any]) -> str:
    """The `--attn` argument of `advisor generate split_kv` for a shape: B:HQ:HKV:D:S[:LQ]."""
    text = f"{shape['B']}:{shape['Hq']}:{shape['Hkv']}:{shape['D']}:{shape['S']}"
    return text + (f":{shape['Lq']}" if shape.get("Lq", 1) != 1 else "")
