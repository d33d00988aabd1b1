"""What a kernel's name says about the basics (Tiers 1-3): its GEMM precision, a misaligned
operand, a layout transpose, an NCHW batch norm, a dtype cast. Evidence only, no thresholds.

Names differ by library and version, so each test is a family pattern, not one name:

* precision of a GEMM: full fp32 without tensor cores (cuBLAS/cuDNN SIMT `sgemm`, `scudnn`,
  xmma `_ffma`, CUTLASS `simt_sgemm`, `gemmSN...<float`; Tensile `Cijk_..._S*_` without XF32),
  tf32 (`tf32`, `xf32`, CUTLASS `tensorop_s1688gemm` without a 16-bit type), 16-bit (`bf16`,
  `f16`, `h884`, `h1688`, `h16816`, `s16816gemm_bf16`), fp8, fp64; else unknown, and the Kineto
  `Input type` of the GEMM decides where the name says nothing;
* a misaligned GEMM: CUTLASS `_alignN` whose N elements are fewer than 16 bytes (`align1`,
  `align2` for bf16; cuBLAS picks them when a leading dimension is not a 16-byte multiple);
* layout transposes: cuDNN `nchwToNhwc` / `nhwcToNchw` (any namespace), `nchw2nhwc`,
  `convertTensor`, MIOpen `batched_transpose`; NCHW batch norm: ATen `batch_norm_*` kernels
  without `channels_last`, cuDNN `bn_fw*` / `bn_bw*` without `nhwc`;
* dtype casts: ATen `bfloat16_copy_kernel`, `float16_copy_kernel`, copies that load or store
  with a cast, `direct_copy_kernel` outside its no-cast form.
"""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd

from ..basics import input_dims
from ..rules import Rule
from .context import Context
from .conv_calls import conv_calls, conv_floor_ns
from .gemm import _extract_sizes, innermost_ranges
from .launch_ops import CONV_OPS
from .strings import contains, factorize
from .attention_chains import chain_kernels

_FP32_SIMT = re.compile(
    r"sgemm|scudnn|_ffma|ffma_|simt_s|gemmSN\w*<float|gemv2?T?_kernel\w*<float", re.I
)
_TF32 = re.compile(r"tf32|xf32|tensorop_s1688gemm(?!_(?:bf16|f16))|_s1688gemm_tf32", re.I)
_BIT16 = re.compile(
    r"bf16|f16|fp16|half|bfloat16|h884|h1688|h16816|h161616|s884gemm|s16816gemm|s161616gemm|hgemm|_h_?gemm", re.I
)
# a kernel template's first argument, its element type: cuDNN's generic implicit_convolveNd_sgemm
# runs bf16 convolutions too (a VideoMAE Conv3d on the H200) without being fp32 ("sgemm" is the
# algorithm's name there, not the precision)
_TEMPLATE_16BIT = re.compile(
    r"^[^<(]*<\s*(?:const\s+)?(?:__nv_bfloat16|nv_bfloat16|__half|half|c10::BFloat16|c10::Half|"
    r"cutlass::half_t|cutlass::bfloat16_t|at::BFloat16|at::Half)\b")
_FP8 = re.compile(r"fp8|e4m3|e5m2|f8f8|_qgmma|i8i8", re.I)
_FP64 = re.compile(r"dgemm|f64|fp64|double|dmma", re.I)
# Tensile / hipBLASLt: Cijk_<A index>_<B index>_<types>_...: the first type letter is the input
# (S fp32, X xf32, H fp16, B bf16, D fp64, F8...).
_TENSILE_TYPES = re.compile(r"^Cijk_A[a-z]+_B[a-z]+_([A-Z0-9]+)_", re.I)
_TENSILE_PREC = {"S": "fp32", "X": "tf32", "H": "16bit", "B": "16bit", "D": "fp64", "F": "fp8", "I": "fp8"}

_ALIGN = re.compile(r"_align(\d+)(?=_|>|$|\W)", re.I)
_ELT_FROM_NAME = ((re.compile(r"bf16|f16|bfloat16|h1688|h16816|h884|half", re.I), 2),
                  (re.compile(r"tf32|s1688gemm|sgemm|f32", re.I), 4),
                  (re.compile(r"i8|s8|fp8|e4m3|e5m2", re.I), 1),
                  (re.compile(r"f64|dgemm", re.I), 8))

_TRANSPOSE = re.compile(r"nchw_?to_?nhwc|nhwc_?to_?nchw|nchw2nhwc|nhwc2nchw|convertTensor|batched_transpose", re.I)
_BN = re.compile(r"batch_?norm|(?:^|\W|_)bn_(?:fw|bw|fwd|bwd)", re.I)
_BN_CHANNELS_LAST = re.compile(r"channels_last|nhwc", re.I)
# PyTorch's own depthwise convolution kernels on bf16 data: what every NCHW depthwise conv runs
# in bf16; channels_last sends depthwise convolutions to cuDNN instead (layout_churn). fp16 NCHW
# runs them only where cuDNN's own NCHW heuristic declined, and fp32 is unmeasured: left out.
# The forward and input-gradient kernels carry the filter width (3 and 5 measured; `<0, ...>`
# and `_generic` take the others); the weight gradient's does not
_DEPTHWISE_NATIVE = re.compile(r"conv_depthwise2d_(?:forward|backward|grad_weight)_kernel(?:_generic)?<[^>]*c10::BFloat16")
_DEPTHWISE_MEASURED = re.compile(r"conv_depthwise2d_(?:forward|backward)_kernel<(?:\(int\))?[35],")  # nsys: <(int)3, ...>


def is_depthwise_native(name: str) -> bool:
    """One of PyTorch's own depthwise-convolution kernels on bf16 data."""
    return bool(_DEPTHWISE_NATIVE.search(name))


# kernels that convolve: implicit-GEMM and direct convolutions of cuDNN, CUTLASS and MIOpen
_CONV = re.compile(r"conv|fprop|dgrad|wgrad|igemm_|implicit_?gemm|winograd|scudnn|hcudnn", re.I)
_CAST = re.compile(
    r"bfloat16_copy_kernel|float16_copy_kernel|half_copy_kernel|float8_copy_kernel|LoadWithCast|StoreWithCast|"
    r"CastTensor|cast_kernel",
    re.I,
)
# direct_copy_kernel casts unless it is PyTorch's explicit no-cast form (same dtype copies)
_DIRECT = re.compile(r"direct_copy_kernel", re.I)
_NOCAST = re.compile(r"_nocast", re.I)


def gemm_precision(name: str) -> str | None:
    """"fp32" (full fp32 arithmetic, no tensor cores or fp32 MFMA), "tf32", "16bit",
    "16bit_simt" (16-bit data on a SIMT kernel: no tensor cores, but no cast or TF32 to advise), "fp8",
    "fp64", or None when the name does not say."""
    m = _TENSILE_TYPES.match(name)
    if m:
        return _TENSILE_PREC.get(m.group(1)[0].upper())
    if _FP8.search(name):
        return "fp8"
    if _TEMPLATE_16BIT.search(name):
        # 16-bit data; a SIMT algorithm name (cuDNN's implicit sgemm) means FMA, not tensor cores
        return "16bit_simt" if _FP32_SIMT.search(name) else "16bit"
    if _FP32_SIMT.search(name):
        return "fp32"
    if _TF32.search(name):
        return "tf32"
    if _BIT16.search(name):
        return "16bit"
    if _FP64.search(name):
        return "fp64"
    return None


def element_bytes_from_name(name: str) -> int | None:
    for pat, elt in _ELT_FROM_NAME:
        if pat.search(name):
            return elt
    return None


def align_bytes(name: str) -> int | None:
    """The operand alignment a CUTLASS-style `_alignN` kernel needs, in bytes (N elements x
    the element size the name shows), or None when the name has no such tag."""
    m = _ALIGN.search(name)
    if not m:
        return None
    elt = element_bytes_from_name(name) or 2
    return int(m.group(1)) * elt


def _classify(name: str) -> dict:
    cast = bool(_CAST.search(name)) or bool(_DIRECT.search(name) and not _NOCAST.search(name))
    bn = bool(_BN.search(name))
    align = align_bytes(name)
    return {
        "precision": gemm_precision(name),
        "align_bytes": align,
        "is_transpose": bool(_TRANSPOSE.search(name)),
        "is_bn_nchw": bn and not _BN_CHANNELS_LAST.search(name),
        "is_bn": bn,
        "is_depthwise_native": bool(_DEPTHWISE_NATIVE.search(name)),
        "depthwise_width_measured": bool(_DEPTHWISE_MEASURED.search(name)),
        "is_conv": bool(_CONV.search(name)),
        "is_cast": cast,
    }


_DTYPE_PREC = {"bf16": "16bit", "fp16": "16bit", "fp32": "fp32_dtype", "fp8": "fp8", "fp64": "fp64"}


def kinds(ctx: Context) -> pd.DataFrame:
    """Per kernel (same index as ctx.kernels): precision (GEMMs only: the name's, else the
    Kineto dtype's; "fp32_dtype" where only the dtype says fp32, which may run as TF32),
    align_bytes, misaligned (a GEMM whose named alignment is under 16 bytes, not a SIMT
    kernel, which loads scalars by design), is_transpose, is_bn_nchw, is_bn, is_depthwise_native
    (and depthwise_width_measured: a 3 or 5 wide filter's forward or input gradient), is_conv, is_cast.
    Computed once per distinct name and cached."""
    if "kernel_kinds" in ctx.cache:
        return ctx.cache["kernel_kinds"]
    k = ctx.kernels
    # names were factorized once for Context.kernels (_name_code, -1 when missing): classify
    # one representative row per code
    codes = k["_name_code"].to_numpy() if "_name_code" in k else factorize(k["name"])[0]
    n_codes = int(codes.max()) + 1 if len(codes) else 0
    first = np.full(n_codes, -1, dtype=np.int64)
    valid = np.flatnonzero(codes >= 0)
    first[codes[valid][::-1]] = valid[::-1]
    names = k["name"].to_numpy(dtype=object)
    table = pd.DataFrame([_classify(str(names[i])) if i >= 0 else _classify("") for i in first] + [_classify("")])
    at = np.where(codes >= 0, codes, len(table) - 1)  # each kernel's row of the table
    gemm = k["is_gemm"].to_numpy(dtype=bool)
    dcodes, duniq = factorize(k["dtype"])
    dprec = [_DTYPE_PREC.get(str(d)) for d in duniq] + [None]
    # precision and alignment as categoricals (1 byte a kernel): a str column of the
    # precision went through pandas 3's Arrow strings, ~5x its size at the peak, and both
    # were 8 bytes a kernel in the cache
    tprec = [p if isinstance(p, str) else None for p in table["precision"]]
    cats = sorted({p for p in tprec + dprec if p is not None})
    code_of = {p: i for i, p in enumerate(cats)}
    name_pc = np.array([code_of.get(p, -1) if p is not None else -1 for p in tprec], dtype=np.int8)
    dtype_pc = np.array([code_of.get(p, -1) if p is not None else -1 for p in dprec], dtype=np.int8)
    # the name's precision, else the Kineto dtype's; GEMMs only
    pc = name_pc[at]
    pc = np.where(pc >= 0, pc, dtype_pc[np.where(dcodes >= 0, dcodes, len(dprec) - 1)])
    pc[~gemm] = -1
    del dcodes
    align = [None if a is None or pd.isna(a) else int(a) for a in table["align_bytes"]]
    acats = sorted({a for a in align if a is not None})
    acode = np.array([acats.index(a) if a is not None else -1 for a in align], dtype=np.int16)[at]
    small_align = np.array([a is not None and a < 16 for a in align], dtype=bool)[at]
    per = pd.DataFrame({
        "precision": pd.Categorical.from_codes(pc, categories=cats),
        "align_bytes": pd.Categorical.from_codes(acode, categories=acats),
        **{c: table[c].to_numpy(dtype=bool)[at]
           for c in ("is_transpose", "is_bn_nchw", "is_bn", "is_depthwise_native", "depthwise_width_measured", "is_conv",
                     "is_cast")},
    }, index=k.index)
    fp32 = code_of.get("fp32", -2)
    per["misaligned"] = gemm & small_align & (pc != fp32)
    ctx.cache["kernel_kinds"] = per
    return per


def _enabled(ctx: Context, symptom: str) -> bool:
    rule = ctx.rules.get(symptom)
    return rule is not None and rule.enabled


def schedule_excluded(ctx: Context) -> np.ndarray:
    """Kernels no kernel schedule (Tier 4) should be prescribed for, because their lever is a
    basic one a Tier 1-3 rule names: GEMMs in full fp32 (tensor_cores_unused / dtype_churn:
    Split-K of a SIMT GEMM is not the fix), GEMMs on misaligned kernels (misaligned_gemm),
    layout transposes, NCHW batch norm and PyTorch's bf16 depthwise convolutions (layout_churn), every kernel of an op-by-op
    attention (unfused_attention), every kernel of SDPA's math backend (dtype_churn's sdpa_backend) and the kernels building a materialised attention bias
    (materialised_attention_bias). Only where that rule is enabled."""
    if "schedule_excluded" in ctx.cache:
        return ctx.cache["schedule_excluded"]
    kk = kinds(ctx)
    out = np.zeros(len(kk), dtype=bool)
    if _enabled(ctx, "tensor_cores_unused") or _enabled(ctx, "dtype_churn"):
        out |= (kk["precision"] == "fp32").to_numpy(dtype=bool)
    if _enabled(ctx, "dtype_churn"):
        from .sdpa_eligibility import math_sdpa_kernels  # (imported here, as attention_bias below)

        out |= math_sdpa_kernels(ctx)
    if _enabled(ctx, "misaligned_gemm"):
        out |= kk["misaligned"].to_numpy(dtype=bool)
    if _enabled(ctx, "layout_churn"):
        # on devices that convolve, as layout_churn requires
        out |= (kk["is_transpose"] | kk["is_bn_nchw"]).to_numpy(dtype=bool) & on_conv_devices(ctx)
        out |= depthwise_counted(ctx)
        out |= depthwise_claimed(ctx, ctx.rules["layout_churn"])
    if _enabled(ctx, "unfused_attention"):
        out |= chain_kernels(ctx) >= 0
    if _enabled(ctx, "materialised_attention_bias"):
        from .attention_bias import claimable  # (imported here: it reads attention_chains, as this module does)

        out |= claimable(ctx)
    ctx.cache["schedule_excluded"] = out
    return out


def nvidia_kernels(ctx: Context) -> np.ndarray:
    """Per kernel: whether its device is an NVIDIA GPU (by the trace's device table)."""
    k = ctx.kernels
    devices = ctx.devices
    keys = []
    if len(devices) and "vendor" in devices.columns:
        for (rank, dev), vendor in devices["vendor"].items():
            if str(vendor).lower() == "nvidia" and not pd.isna(rank):
                keys.append(int(rank) * 1_000_003 + (-1 if pd.isna(dev) else int(dev)))
    key = k["rank"].astype("int64").to_numpy() * 1_000_003 + k["device_id"].fillna(-1).astype("int64").to_numpy()
    return np.isin(key, np.array(keys, dtype=np.int64))


def depthwise_counted(ctx: Context) -> np.ndarray:
    """Per kernel: one of PyTorch's bf16 depthwise kernels that layout_churn counts: on an NVIDIA
    device that convolves, not inside a 1-D convolution (channels_last is a 4-D format), and of
    a measured filter width (3 or 5); a weight-gradient kernel, whose name has no width, only on
    a device where every such forward and input-gradient kernel has a measured width. Cached."""
    key = "depthwise_counted"
    if key in ctx.cache:
        return ctx.cache[key]
    kk = kinds(ctx)
    dw = kk["is_depthwise_native"].to_numpy(dtype=bool, copy=True)
    out = np.zeros(len(dw), dtype=bool)
    if dw.any():
        dw &= on_conv_devices(ctx) & nvidia_kernels(ctx) & ~conv1d_kernels(ctx)
        k = ctx.kernels
        measured = kk["depthwise_width_measured"].to_numpy(dtype=bool)
        wgrad = dw & k["name"].astype(str).str.contains("grad_weight", regex=False).to_numpy(dtype=bool)
        sized = dw & ~wgrad
        dev = k["rank"].astype("int64").to_numpy() * 1_000_003 + k["device_id"].fillna(-1).astype("int64").to_numpy()
        unmeasured_devices = np.unique(dev[sized & ~measured])
        out = (sized & measured) | (wgrad & ~np.isin(dev, unmeasured_devices))
    ctx.cache[key] = out
    return out


def _first_dims(dims_text) -> list | None:
    d = input_dims(dims_text)
    first = d[0] if d else None
    return first if isinstance(first, list) and all(isinstance(x, int) for x in first) else None


def conv1d_kernels(ctx: Context) -> np.ndarray:
    """Per kernel: launched inside a 1-D convolution (the innermost enclosing convolution op's
    input is [N, C, L], or [N, C, 1, L] as cuDNN's 2-D view of it). channels_last is a 4-D
    memory format: it does not apply to these tensors. Cached."""
    key = "layout_churn.conv1d"
    if key in ctx.cache:
        return ctx.cache[key]
    parts = []
    ops = ctx.trace.cpu_ops
    if len(ops) and "input_dims" in ops.columns:
        c = ops[contains(ops["name"], CONV_OPS).to_numpy() & ops["input_dims"].notna().to_numpy()]
        if len(c):
            parts.append(pd.DataFrame({"rank": c["rank"].to_numpy(), "thread_id": c["thread_id"].array,
                                       "start_ns": c["start_ns"].to_numpy(), "end_ns": c["end_ns"].to_numpy(),
                                       "first": [_first_dims(d) for d in c["input_dims"]]}))
    nv = ctx.trace.nvtx
    if len(nv) and "thread_id" in nv.columns:
        c = nv[contains(nv["text"], CONV_OPS).to_numpy()]
        if len(c):
            firsts = []
            for t in c["text"].astype(str):
                sz = _extract_sizes(t)
                firsts.append(sz[0] if sz and isinstance(sz[0], list) and all(isinstance(x, int) for x in sz[0]) else None)
            parts.append(pd.DataFrame({"rank": c["rank"].to_numpy(), "thread_id": c["thread_id"].array,
                                       "start_ns": c["start_ns"].to_numpy(), "end_ns": c["end_ns"].to_numpy(),
                                       "first": firsts}))
    out = np.zeros(len(ctx.trace.kernels), dtype=bool)
    parts = [x for x in parts if len(x)]
    if parts:
        rg = pd.concat(parts, ignore_index=True)
        # [N, C, 1, 1] is a 2-D squeeze-excite convolution, not a 1-D one
        rg["one_d"] = [f is not None and (len(f) == 3 or (len(f) == 4 and f[2] == 1 and f[3] > 1)) for f in rg["first"]]
        rg = rg.drop(columns=["first"])
        ranges, hit = innermost_ranges(ctx.trace, rg)
        if len(ranges):
            out = (hit >= 0) & ranges["one_d"].to_numpy(dtype=bool)[np.maximum(hit, 0)]
    ctx.cache[key] = out
    return out


def on_conv_devices(ctx: Context) -> np.ndarray:
    """Per kernel: whether its (rank, device) runs any convolution kernel."""
    k = ctx.kernels
    conv = kinds(ctx)["is_conv"].to_numpy(dtype=bool)
    key = k["rank"].astype("int64").to_numpy() * 1_000_003 + k["device_id"].fillna(-1).astype("int64").to_numpy()
    return np.isin(key, np.unique(key[conv]))


def device_row(ctx: Context, rank, device_id) -> dict:
    try:
        return ctx.devices.loc[(int(rank), int(device_id))].to_dict()
    except (KeyError, TypeError, ValueError):
        return {}


def device_groups(k: pd.DataFrame):
    """(rank, device_id) groups of a kernels frame, device -1 where unknown."""
    return k.groupby([k["rank"], k["device_id"].fillna(-1).astype("int64")], sort=False)


__all__ = ["gemm_precision", "align_bytes", "element_bytes_from_name", "kinds", "schedule_excluded", "device_row", "device_groups"]


def row_precision(row) -> str | None:
    """The precision of a grouped GEMM row (name first, then the Kineto dtype)."""
    p = gemm_precision(str(row.get("name") or ""))
    if p is None:
        d = row.get("dtype")
        p = _DTYPE_PREC.get(d) if isinstance(d, str) else None
    return p


def gemm_time_by_precision(ctx: Context) -> pd.DataFrame:
    """Per (rank, device_id): GEMM kernel time by precision class, in ns: columns fp32 (full
    fp32), tf32, fp32_dtype, 16bit, fp8, fp64, unknown, and gemm (all)."""
    k = ctx.kernels
    kk = kinds(ctx)
    g = k.loc[k["is_gemm"].to_numpy(dtype=bool), ["rank", "device_id", "dur_ns"]].copy()
    g["device_id"] = g["device_id"].fillna(-1).astype("int64")
    g["precision"] = kk.loc[g.index, "precision"].astype(object).fillna("unknown").astype(str).to_numpy()
    cols = ["fp32", "tf32", "fp32_dtype", "16bit", "16bit_simt", "fp8", "fp64", "unknown"]
    out = g.pivot_table(index=["rank", "device_id"], columns="precision", values="dur_ns", aggfunc="sum", fill_value=0)
    out = out.reindex(columns=cols, fill_value=0).astype("int64")
    out["gemm"] = out.sum(axis=1)
    return out



def gemm_work(fp32_ns: float, tf32_ns: float, bit16_ns: float, device) -> tuple[float, float, float]:
    """A device's GEMM *work* by precision, in ns of the 16-bit path: each precision's kernel
    time weighted by its rate over the 16-bit rate. Time alone misleads: full-fp32 GEMMs run
    ~14x slower on an H200 (51 vs 695 TFLOP/s), so LoRA adapters left in fp32 beside a bf16
    Llama held most of its GEMM time while doing a small part of its work: a part left behind
    (dtype_churn), not an fp32 model (tensor_cores_unused). Without rates: the times."""
    from .calibration import peak_flops

    def rate(dtype):
        return peak_flops(device, dtype)[0] if device is not None else None

    b16 = rate("bf16") or rate("fp16")
    f32, t32 = rate("fp32"), rate("tf32")
    if not b16 or not f32:
        return float(fp32_ns), float(tf32_ns), float(bit16_ns)
    return fp32_ns * f32 / b16, tf32_ns * ((t32 / b16) if t32 else 1.0), float(bit16_ns)


# ---- PyTorch's depthwise kernels that name no width, sized through their recorded call (layout_churn)

def width_key(kh: int, kw: int) -> str:
    """The threshold holding cuDNN's measured floor multiple for kh x kw depthwise filters."""
    return f"depthwise_{kh}x{kw}_cudnn_floor_multiple"


def depthwise_by_shape(ctx: Context) -> tuple[pd.DataFrame, dict]:
    """PyTorch's bf16 depthwise kernels that depthwise_counted leaves out (no measured width in
    their names: `_generic` forwards, `<0, ...>` input gradients, weight gradients beside them),
    read through the recorded convolution call each was launched from: one row per (rank, device,
    2-D depthwise convolution) with the kernels' time and launches, the calls' floor
    (conv_calls.conv_floor_ns: FLOPs at the peak or bytes at the bandwidth), the filter and whether
    the convolution also ran backward; plus the nanoseconds of such kernels no recorded call
    sizes ({"no_call": launched outside any call, "unread": a call it cannot read as a bf16 2-D
    depthwise convolution}). Cached."""
    key = "layout_churn.depthwise_by_shape"
    if key in ctx.cache:
        return ctx.cache[key]
    cols = ["rank", "device_id", "name", "launches", "total_ns", "floor_ns", "kh", "kw", "stride", "dilation",
            "backward", "conv", "kernels"]
    out: tuple[pd.DataFrame, dict] = (pd.DataFrame(columns=cols), {})
    kk = kinds(ctx)
    left = kk["is_depthwise_native"].to_numpy(dtype=bool, copy=True)
    if left.any():
        left &= on_conv_devices(ctx) & nvidia_kernels(ctx) & ~conv1d_kernels(ctx) & ~depthwise_counted(ctx)
    if left.any():
        ranges, hit, calls = conv_calls(ctx)
        k = ctx.kernels
        dur = (k["end_ns"] - k["start_ns"]).to_numpy(np.int64)
        dev = k["device_id"].fillna(-1).astype("int64").to_numpy()
        names = k["name"].astype(str).to_numpy()
        groups: dict[tuple, dict] = {}
        unsized = {"no_call": 0, "unread": 0}
        for i in np.flatnonzero(left):
            c = calls[hit[i]] if hit[i] >= 0 else None
            x, w = (c["x"], c["w"]) if c else (None, None)
            if not (c and len(x) == 4 and c["groups"] == x[1] == w[0] and w[1] == 1 and c["dtype"] == "bf16"):
                unsized["no_call" if hit[i] < 0 else "unread"] += int(dur[i])
                continue
            # one stride and dilation a convolution where both dims agree, else the list
            st, dl = (v[0] if len(set(v)) == 1 else tuple(v) for v in (c["stride"], c["dilation"]))
            g = groups.setdefault((int(ranges["rank"].iloc[hit[i]]), int(dev[i]), json.dumps([x, w, c["stride"], c["dilation"]])), {
                "by_name": {}, "launches": 0, "total_ns": 0, "calls": set(), "backward": False, "kh": w[2], "kw": w[3],
                "stride": st, "dilation": dl, "kernels": []})
            g["kernels"].append(int(i))
            g["by_name"][names[i]] = g["by_name"].get(names[i], 0) + int(dur[i])
            g["launches"] += 1
            g["total_ns"] += int(dur[i])
            g["calls"].add(int(hit[i]))
            g["backward"] |= bool(c["backward"])
        rows = []
        for (rank, d, conv), g in groups.items():
            device = device_row(ctx, rank, d)
            floor = sum(conv_floor_ns(device, "bf16", calls[j]["flop"], calls[j]["bytes"]) for j in g["calls"])
            rows.append({"rank": rank, "device_id": d, "name": max(g["by_name"].items(), key=lambda kv: kv[1])[0],
                         "launches": g["launches"], "total_ns": g["total_ns"], "floor_ns": floor, "kh": g["kh"],
                         "kw": g["kw"], "stride": g["stride"], "dilation": g["dilation"], "backward": g["backward"],
                         "conv": conv, "kernels": g["kernels"]})
        out = (pd.DataFrame(rows, columns=cols), unsized)
    ctx.cache[key] = out
    return out


def depthwise_shaped_excess(row: dict, rule: Rule) -> float | None:
    """What channels_last would save on one depthwise_by_shape row, or None where nothing was
    measured for its filter: 3 and 5 wide filters, the swap's least measured speedup; other
    filters with a measured cuDNN floor multiple (rules/layout_churn.toml), only for a
    convolution run forward and backward at stride 1 without dilation (what the multiple was
    measured on): its time over that multiple of its floor, never below 0."""
    total = float(row["total_ns"])
    if row["kh"] == row["kw"] and row["kw"] in (3, 5):
        return total * (1.0 - 1.0 / float(rule["depthwise_channels_last_speedup"]))
    name = width_key(int(row["kh"]), int(row["kw"]))
    if (name not in rule.thresholds or not row["backward"] or not row["floor_ns"]
            or row.get("stride", 1) != 1 or row.get("dilation", 1) != 1):
        return None
    return max(0.0, total - float(rule[name]) * float(row["floor_ns"]))


def depthwise_claimed(ctx: Context, rule: Rule) -> np.ndarray:
    """Per kernel: one of depthwise_by_shape's that this rule prices (other rules leave it:
    kernel_kinds.schedule_excluded)."""
    out = np.zeros(len(ctx.kernels), dtype=bool)
    shaped, _ = depthwise_by_shape(ctx)
    for r in shaped.to_dict("records"):
        if depthwise_shaped_excess(r, rule) is not None:
            out[r["kernels"]] = True
    return out
