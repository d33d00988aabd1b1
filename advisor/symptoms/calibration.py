"""What physics and our own measurements allow an estimate to claim.

Every GEMM estimate is bounded twice:
* by physics: a launch cannot run faster than its compute floor (FLOP / the device's dense
  peak for its dtype) or its HBM floor (compulsory bytes / copy bandwidth), whichever is larger;
* by measurement: no more than the recommended schedule reached over the kind of kernel that
  ran (cuBLAS, or a hand-written/Triton kernel, against which our data-parallel baseline
  stands in) on the same or similar shapes in our committed results. A schedule that won on some
  shape classes and lost on others (the Gluon cluster GEMM) is read per class: `shape_class`
  says which class a trace's shape is, and only measured shapes of that class near it count.

Every peak is computed here: `ceiling` (the fastest run measured: what an estimate may never
exceed) and, below, `peak_flops` and `measured_bandwidth` (the median run: the rate a GEMM
usually reaches, for estimates of what a fix gains); both read the same measurements and
derate a datasheet the same way (`derating`).

The measured data live in `rules/measured/<device>.toml` (derived from the bench rows by
`bench/make_calibration.py`). For a GPU we have not measured, its datasheet peak and bandwidth
are derated by the ratio measured-to-datasheet of the H200 and the basis says so.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from ..resources import rules_dir

# The H200's datasheet figures (dense bf16 TFLOP/s, HBM bytes/s) used to derate other GPUs'
# datasheet numbers by what we measured on the H200.
_H200_DATASHEET = {"tflops": 989.0, "bytes_per_s": 4.8e12}

# Dense rates relative to bf16 on NVIDIA tensor-core parts (datasheet ratios): used only where
# no measurement of that dtype exists for the device.
_DTYPE_FACTOR = {"bf16": 1.0, "fp16": 1.0, "fp8": 2.0, "tf32": 0.5, "fp32": 67.0 / 989.0, "fp64": 67.0 / 989.0}

# Kernels from vendor libraries: measured against cuBLAS. Anything else (Triton, hand-written
# CUDA) is measured against our data-parallel Triton baseline.
_LIBRARY = re.compile(
    r"nvjet|xmma|cutlass|cublas|gemmk1|gemmSN|^(?:void )?(?:sm\d+|ampere|volta|turing|maxwell|hopper)_|cijk_|rocblas|hipblaslt",
    re.IGNORECASE,
)


def is_library_kernel(name: str | None) -> bool:
    return isinstance(name, str) and bool(_LIBRARY.search(name[:4096]))


@dataclass(frozen=True)
class Measured:
    device: str
    sm_count: int
    dense_tflops: dict[str, float]
    copy_bytes_per_s: float
    schedules: tuple[dict[str, Any], ...]
    source: str
    dense_tflops_median: dict[str, float]  # the median runs (the fastest ones where not recorded)
    attention_fusion: tuple[dict[str, Any], ...] = ()  # op-by-op attention over SDPA, per shape
    attention_bias: tuple[dict[str, Any], ...] = ()  # a materialised attention bias, built eager and compiled
    conv: tuple[dict[str, Any], ...] = ()  # a convolution in 16-bit and in fp32


@lru_cache(maxsize=None)
def _load(directory: str) -> tuple[Measured, ...]:
    out = []
    for path in sorted(Path(directory).glob("*.toml")):
        data = tomllib.loads(path.read_text(encoding="utf-8"))
        c = data.get("ceilings", {})
        out.append(Measured(
            device=str(data["device"]),
            sm_count=int(data["sm_count"]),
            dense_tflops={str(k): float(v) for k, v in c.get("dense_tflops", {}).items()},
            copy_bytes_per_s=float(c["copy_bytes_per_s"]),
            schedules=tuple(data.get("schedule", [])),
            source=f"rules/measured/{path.name}",
            dense_tflops_median={str(k): float(v) for k, v in
                                 (c.get("dense_tflops_median") or c.get("dense_tflops") or {}).items()},
            attention_fusion=tuple(data.get("attention_fusion", [])),
            attention_bias=tuple(data.get("attention_bias", [])),
            conv=tuple(data.get("conv", [])),
        ))
    return tuple(out)


def measured_devices() -> tuple[Measured, ...]:
    d = rules_dir() / "measured"
    return _load(str(d)) if d.is_dir() else ()


def _norm(name: Any) -> str:
    return re.sub(r"[^a-z0-9]+", " ", str(name).lower()).strip() if isinstance(name, str) else ""


def measured_for(device: dict | None) -> Measured | None:
    """Our measurements of this very GPU model (matched by name), else None."""
    name = _norm((device or {}).get("name"))
    for m in measured_devices():
        if name and _norm(m.device) in f" {name} ":
            return m
        if name and f" {_norm(m.device).split()[-1]} " in f" {name} ":
            return m
    return None


def _reference() -> Measured | None:
    """The measured device other GPUs' datasheet numbers are derated by (the H200)."""
    for m in measured_devices():
        if "h200" in _norm(m.device):
            return m
    return None


def derating(typical: bool = False) -> tuple[float, float, str]:
    """(peak factor, bandwidth factor, source) that turn a datasheet's dense bf16 peak and HBM
    bandwidth into what the H200's measurements say such numbers reach: its fastest runs, or
    its median ones (`typical`); (1, 1, "datasheet") without the H200's measurements."""
    ref = _reference()
    if ref is None:
        return 1.0, 1.0, "datasheet"
    rates = ref.dense_tflops_median if typical else ref.dense_tflops
    bf16 = rates.get("bf16", ref.dense_tflops.get("bf16", _H200_DATASHEET["tflops"]))
    return (bf16 / _H200_DATASHEET["tflops"], ref.copy_bytes_per_s / _H200_DATASHEET["bytes_per_s"],
            f"datasheet x {bf16 / _H200_DATASHEET['tflops']:.2f} (H200 measured/datasheet, {ref.source})")


@dataclass(frozen=True)
class Ceiling:
    tflops: float | None
    bytes_per_s: float | None
    basis: str


def ceiling(device: dict | None, dtype: str | None) -> Ceiling:
    """The dense peak for `dtype` and the bandwidth of `device`, measured where we can."""
    dtype = dtype or "bf16"
    m = measured_for(device)
    if m is not None:
        if dtype in m.dense_tflops:
            tflops, how = m.dense_tflops[dtype], "measured"
        else:
            tflops = m.dense_tflops.get("bf16", 0.0) * _DTYPE_FACTOR.get(dtype, 1.0)
            how = "scaled from the measured bf16 peak by the datasheet ratio"
        return Ceiling(tflops, m.copy_bytes_per_s, f"{how} on the {m.device}, {m.source}")
    device = device or {}
    peak = device.get("peak_tensor_tflops")
    bw = device.get("mem_bandwidth_bytes_per_s")
    peak = None if peak is None or (isinstance(peak, float) and math.isnan(peak)) else float(peak)
    bw = None if bw is None or (isinstance(bw, float) and math.isnan(bw)) else float(bw)
    ref = _reference()
    peak_factor, bw_factor, _ = derating()
    if peak:
        peak *= peak_factor
    if bw:
        bw *= bw_factor
    tflops = peak * _DTYPE_FACTOR.get(dtype, 1.0) if peak else None
    return Ceiling(tflops, bw, "datasheet peak and bandwidth derated by the H200's measured-to-datasheet ratio"
                   if ref is not None else "datasheet peak and bandwidth")


ELEMENT_BYTES = {"fp8": 1, "fp16": 2, "bf16": 2, "fp32": 4, "tf32": 4, "fp64": 8}


@dataclass(frozen=True)
class Floor:
    ns: float  # per launch
    compute_ns: float
    memory_ns: float
    basis: str


def gemm_floor(shape: dict, device: dict | None) -> Floor | None:
    """The fastest one launch of this GEMM can run on `device`, or None when unknown."""
    dtype = shape.get("dtype") or "bf16"
    c = ceiling(device, dtype)
    if not c.tflops and not c.bytes_per_s:
        return None
    b = shape.get("batch") or 1
    M, N, K = shape["M"], shape["N"], shape["K"]
    flop = 2.0 * M * N * K * b
    nbytes = float(ELEMENT_BYTES.get(dtype, 2) * b * (M * K + K * N + M * N))
    compute = flop / (c.tflops * 1e12) * 1e9 if c.tflops else 0.0
    memory = nbytes / c.bytes_per_s * 1e9 if c.bytes_per_s else 0.0
    if compute >= memory:
        text = f"compute floor at {c.tflops:.0f} TFLOP/s {dtype} ({c.basis})"
    else:
        text = f"HBM floor at {c.bytes_per_s / 1e12:.2f} TB/s ({c.basis})"
    return Floor(max(compute, memory), compute, memory, text)


@dataclass(frozen=True)
class Reached:
    ratio: float  # speed-up the schedule reached over the reference (median of runs)
    versus: str  # "cublas" | "dp"
    exact: bool  # measured on this very shape
    basis: str
    shape_class: str | None = None  # the class the shape was mapped onto (class-measured schedules)


# Which suites of our results speak for which strategy (the shape classes they were built for).
_SUITES = {
    "stream_k": ("tail",),
    "split_k": ("skinny",),
    "persistent": ("tail", "balanced"),
    "warp_specialization": ("tail", "balanced"),
}

# Schedules measured on every suite and read per shape class: it won on some classes and lost
# on others, so the best of all suites would say nothing about the shape at hand.
_BY_CLASS = {"cluster_gemm": ("bf16", "fp16")}

# The tile our bench suites were chosen with (DESIGN.md: "128x128 tiles unless noted").
CLASS_TILE = 128


@dataclass(frozen=True)
class ShapeClasses:
    """How a trace's GEMM shape maps onto the shapes we measured (thresholds from a rule file)."""

    balanced_tail_efficiency: float  # waves / ceil(waves) from which a shape of >= 1 wave is balanced
    max_factor: float  # M, N and K each within this factor of one measured shape of the class


def shape_class(shape: dict, sm_count: int, balanced_tail_efficiency: float) -> str:
    """The suite a GEMM shape belongs to, as our bench suites were built (128x128 output tiles
    on the device's SMs): `skinny` under one wave of tiles (Split-K territory), `balanced` when
    the last wave is (nearly) full, `tail` otherwise. The one definition of a shape class."""
    tiles = math.ceil(shape["M"] / CLASS_TILE) * math.ceil(shape["N"] / CLASS_TILE) * (shape.get("batch") or 1)
    waves = tiles / sm_count
    if waves < 1.0:
        return "skinny"
    return "balanced" if waves / math.ceil(waves) >= balanced_tail_efficiency else "tail"


def _dims(key: str) -> tuple[int, ...]:
    return tuple(int(x) for x in key.split("x"))


def _near(shape: dict, measured: str, factor: float) -> bool:
    """M, N and K each within `factor` of the measured shape's (no extrapolation beyond)."""
    return all(max(a, b) <= factor * min(a, b) for a, b in zip((shape["M"], shape["N"], shape["K"]), _dims(measured)))


def _reached_by_class(strategy: str, shape: dict | None, versus: str, m: Measured, sm_count: int | None,
                      classes: ShapeClasses | None) -> Reached | None:
    """A class-measured schedule over `versus`: this very shape if measured; else the worst of
    the measured shapes of the shape's class that lie near it (conservative); else None (a shape
    far from every measured one, a batched or unknown shape, a dtype the schedule does not run)."""
    if shape is None or (shape.get("batch") or 1) != 1:
        return None
    dtype = shape.get("dtype") or "bf16"
    if dtype not in _BY_CLASS[strategy]:
        return None
    rows = [r for r in m.schedules if r["strategy"] == strategy and r["versus"] == versus]
    rows = [r for r in rows if r["dtype"] == dtype] or [r for r in rows if r["dtype"] == "bf16"]
    ref = "cuBLAS" if versus == "cublas" else "our data-parallel Triton kernel"
    key = f"{shape['M']}x{shape['N']}x{shape['K']}"
    cls = None if classes is None else shape_class(shape, sm_count or m.sm_count, classes.balanced_tail_efficiency)
    triton = {str(r.get("triton")) for r in rows if r.get("triton")}
    tail = f"Triton {', '.join(sorted(triton))}, {m.source}" if triton else m.source
    exact = [r for r in rows if r["shape"] == key]
    if exact:
        r = exact[0]
        return Reached(float(r["ratio"]), versus, True,
                       f"our {strategy} reached {r['ratio']:.2f}x {ref} on {key} {r['dtype']} "
                       f"(median of {r['runs']} runs, best {r['best']:.2f}x; {tail})", r["suite"])
    if cls is None:
        return None
    near = [r for r in rows if r["suite"] == cls and _near(shape, r["shape"], classes.max_factor)]
    if not near:
        return None
    r = min(near, key=lambda r: float(r["ratio"]))
    others = ", ".join(f"{x['shape']} {float(x['ratio']):.2f}x" for x in sorted(near, key=lambda x: x["shape"]))
    return Reached(float(r["ratio"]), versus, False,
                   f"our {strategy} reached {r['ratio']:.2f}x {ref} on the {cls} shapes we measured near {key} "
                   f"(the worst of {others}; median of runs, {r['dtype']}; {tail})", cls)


def reached(strategy: str, shape: dict | None, kernel: str | None, device: dict | None = None,
            classes: ShapeClasses | None = None) -> Reached | None:
    """What `strategy` reached over the kind of kernel that ran, on this shape if we measured
    it, else the best of the shape class (an upper bound for similar shapes). A schedule read
    per class (`_BY_CLASS`) takes the class from `shape_class` and, without `classes`, only
    its exactly measured shapes."""
    m = measured_for(device) or _reference()
    if m is None:
        return None
    versus = "cublas" if is_library_kernel(kernel) else "dp"
    if strategy in _BY_CLASS:
        sms = (device or {}).get("sm_count")
        return _reached_by_class(strategy, shape, versus, m, int(sms) if sms else None, classes)
    suites = _SUITES.get(strategy)
    if not suites:
        return None
    dtype = (shape or {}).get("dtype") or "bf16"
    rows = [r for r in m.schedules
            if r["strategy"] == strategy and r["versus"] == versus and r["suite"] in suites]
    same_dtype = [r for r in rows if r["dtype"] == dtype] or [r for r in rows if r["dtype"] == "bf16"]
    if not same_dtype:
        return None
    ref = "cuBLAS" if versus == "cublas" else "our data-parallel Triton kernel"
    if shape is not None:
        key = f"{shape['M']}x{shape['N']}x{shape['K']}"
        exact = [r for r in same_dtype if r["shape"] == key]
        if exact:
            r = exact[0]
            return Reached(float(r["ratio"]), versus, True,
                           f"our {strategy} reached {r['ratio']:.2f}x {ref} on {key} {r['dtype']} "
                           f"(median of {r['runs']} runs, {m.source})")
    r = max(same_dtype, key=lambda r: float(r["ratio"]))
    return Reached(float(r["ratio"]), versus, False,
                   f"our {strategy} reached at most {r['ratio']:.2f}x {ref} on the {'/'.join(suites)} shapes "
                   f"we measured (best: {r['shape']} {r['dtype']}, median of {r['runs']} runs, {m.source})")


@dataclass(frozen=True)
class Estimate:
    savings_ns: int
    bound_ns: int | None  # the physics floor of all launches
    basis: str
    measured_exact: bool
    capped_by: str  # "model" | "physics" | "measured"


def bound_gemm_estimate(model_ns: float, total_ns: float, launches: int, shape: dict | None,
                        device: dict | None, strategy: str, kernel: str | None,
                        classes: ShapeClasses | None = None) -> Estimate:
    """`model_ns` (what the symptom's model says is recoverable) bounded by physics and by
    what `strategy` reached in our measurements."""
    est, capped, parts = float(model_ns), "model", []
    bound = None
    if shape is not None:
        fl = gemm_floor(shape, device)
        if fl is not None:
            bound = fl.ns * launches
            room = max(0.0, total_ns - bound)
            parts.append(f"{fl.basis}: {fl.ns / 1e3:.1f} us a launch")
            if room < est:
                est, capped = room, "physics"
    r = reached(strategy, shape, kernel, device, classes)
    exact = False
    if r is not None:
        cap = total_ns * max(0.0, 1.0 - 1.0 / r.ratio)
        parts.append(r.basis)
        exact = r.exact
        if cap < est:
            est, capped = cap, "measured"
    return Estimate(int(max(0.0, est)), None if bound is None else int(bound), "; ".join(parts) or "model only",
                    exact, capped)


# Typical rates, for estimates of what a fix gains (the ceiling above is the fastest run, what an
# estimate may never exceed).
#
# `peak_flops(device, dtype)` gives the dense rate a library GEMM reaches for a precision on a
# device, and where the number comes from. The numbers come from `rules/measured/<device>.toml`
# (measured here: on the H200, torch.matmul 8192^3, median of the runs:
# bf16 694.5, fp16 678.6, tf32 360.2 and fp32 SIMT 51.3 TFLOP/s; device copy 4.27 TB/s), taking
# the median run, not the fastest: an estimate of what a fix gains should use the rate a GEMM
# usually reaches. For a GPU we have not measured, its datasheet dense fp16/bf16 tensor rate
# (advisor.devices.KNOWN_GPUS or the trace) is derated by the H200's measured/datasheet ratio
# (694.5 / 989) and the other precisions follow the datasheet ratios below, per architecture,
# with None where the device has no such path (no TF32 before Ampere, no bf16 before Ampere).
#
# `measured_bandwidth(device)` is the device's measured copy bandwidth, or its datasheet
# bandwidth derated the same way (4.27 of 4.8 TB/s on the H200).

# Datasheet ratios to the dense fp16/bf16 tensor rate, per precision.
# tf32: A100 156/312, H100 SXM 495/989, B200 1100/2250, MI300X 653.7/1307.4: one half.
_TF32_RATIO = 0.5
# fp8: twice the 16-bit rate on Ada/Hopper/Blackwell and CDNA3+ datasheets.
_FP8_RATIO = 2.0
# fp32 without tensor cores (NVIDIA SIMT; AMD vector or fp32 MFMA), by architecture:
# V100 15.7/125, T4 8.1/65; A100 19.5/312; A10 31.2/125, L40S 91.6/362; H100 SXM 67/989;
# B200 80/2250; MI250X 47.9/383, MI300X 163.4/1307.4.
_FP32_RATIO_NVIDIA = {7: 0.126, 8: 0.0625, 9: 0.068, 10: 0.036}
_FP32_RATIO_AMPERE_CONSUMER = 0.25  # cc 8.6 / 8.9
_FP32_RATIO_AMD = 0.125


def _get(device: Mapping[str, Any], key: str):
    v = device.get(key)
    return None if v is None or (not isinstance(v, str) and pd.isna(v)) else v


def has_tf32(device: Mapping[str, Any]) -> bool:
    """Whether the device runs fp32 GEMMs on tensor cores at reduced precision (TF32 from
    NVIDIA Ampere, cc 8.0; XF32 on CDNA3 gfx942; CDNA4 gfx950 dropped it)."""
    vendor = _get(device, "vendor")
    if vendor == "nvidia":
        major = _get(device, "cc_major")
        return major is not None and int(major) >= 8
    if vendor == "amd":
        return str(_get(device, "arch") or "").startswith("gfx942")
    return False


def has_bf16(device: Mapping[str, Any]) -> bool:
    """bf16 tensor cores: NVIDIA from Ampere (cc 8.0), AMD CDNA2+."""
    if _get(device, "vendor") == "nvidia":
        major = _get(device, "cc_major")
        return major is not None and int(major) >= 8
    return _get(device, "vendor") == "amd"


def _fp32_ratio(device: Mapping[str, Any]) -> float | None:
    if _get(device, "vendor") == "amd":
        return _FP32_RATIO_AMD
    major, minor = _get(device, "cc_major"), _get(device, "cc_minor")
    if major is None:
        return None
    if int(major) == 8 and minor is not None and int(minor) > 0:
        return _FP32_RATIO_AMPERE_CONSUMER
    return _FP32_RATIO_NVIDIA.get(int(major))


def peak_flops(device: Mapping[str, Any], dtype: str) -> tuple[float | None, str]:
    """(dense FLOP/s a library GEMM usually reaches for `dtype` on `device`, where it comes from).

    `device` is a devices-frame row as a mapping (name, vendor, cc_major, cc_minor, arch,
    peak_tensor_tflops). `dtype`: "bf16" | "fp16" | "tf32" | "fp32" (no tensor cores) | "fp8".
    (None, reason) where the device has no such path or no rate is known."""
    if dtype == "tf32" and not has_tf32(device):
        return None, "no TF32/XF32 tensor cores on this device"
    if dtype == "bf16" and not has_bf16(device):
        return None, "no bf16 tensor cores on this device"
    m = measured_for(dict(device))
    if m is not None:
        rates = m.dense_tflops_median
        if dtype in rates:
            return rates[dtype] * 1e12, f"measured on the {m.device} (median, {m.source})"
        if "bf16" in rates:
            base, src = rates["bf16"] * 1e12, f"measured bf16 on the {m.device} ({m.source})"
        else:
            return None, f"no measured rate on the {m.device}"
    else:
        tensor = _get(device, "peak_tensor_tflops")
        if not tensor:
            return None, "no tensor-core rate known for this device"
        factor, _, src = derating(typical=True)
        base = float(tensor) * 1e12 * factor
    if dtype in ("bf16", "fp16"):
        return base, src
    if dtype == "tf32":
        return base * _TF32_RATIO, f"{src} x {_TF32_RATIO} (datasheet tf32/bf16)"
    if dtype == "fp8":
        return base * _FP8_RATIO, f"{src} x {_FP8_RATIO} (datasheet fp8/bf16)"
    if dtype == "fp32":
        ratio = _fp32_ratio(device)
        if ratio is None:
            return None, "no fp32 rate known for this architecture"
        return base * ratio, f"{src} x {ratio} (datasheet fp32/bf16)"
    return None, f"no rate for dtype {dtype!r}"


def measured_bandwidth(device: Mapping[str, Any]) -> float | None:
    """Bytes/s a device copy reaches: measured on this GPU model, else the trace's or datasheet's
    bandwidth derated by the H200's measured/datasheet ratio."""
    m = measured_for(dict(device))
    if m is not None:
        return m.copy_bytes_per_s
    bw = _get(device, "mem_bandwidth_bytes_per_s")
    return float(bw) * derating(typical=True)[1] if bw else None


def _dtype_class(dtype: str | None) -> str:
    return "32" if dtype in ("fp32", "tf32") else "16"


def attention_fusion_ratio(device: dict | None, shape: dict, near_factor: float,
                           key: str = "ratio") -> tuple[float, str, str] | None:
    """What SDPA measured over op-by-op attention (matmul, softmax, matmul) for `shape` ({L, S,
    D, dtype}), among measured shapes of the same dtype width: (speedup, source, how). `key`:
    "ratio" (the forward) or "ratio_bwd" (the backward alone).

    how = "exact" (this very shape and dtype on this GPU: its ratio), "near" (the smallest speedup among
    shapes whose L, S and D are each within `near_factor`), or "below" (none near: the shape
    with the largest score matrix L x S not larger than this one's; fused attention gains more
    as the scores grow, measured 0.6x at 49 x 49 to 18x at 4096 x 4096, so this errs low).
    Causal rows are not read (a causal fused kernel skips half the scores: a larger ratio than
    the same chain without a mask). None where nothing measured is near or below. A GPU we have not measured reads the H200's
    ratios (a ratio of two kernels' times on one GPU transfers better than either time) and
    the source says so."""
    m = measured_for(device)
    own = m is not None and bool(m.attention_fusion)
    if not own:
        m = _reference()
    if m is None or not m.attention_fusion:
        return None
    want = _dtype_class(shape.get("dtype"))
    lim = math.log(max(near_factor, 1.0)) + 1e-9
    near, exact, below = [], [], None
    try:
        L, S, D = (int(shape[k]) for k in ("L", "S", "D"))
    except (KeyError, TypeError, ValueError):
        return None
    for e in m.attention_fusion:
        # causal rows skip half the scores fused; a chain in a trace may be causal or not, so
        # only the full (non-causal) ratios are read: the lower of the two
        if _dtype_class(str(e.get("dtype"))) != want or e.get("causal") is True:
            continue
        try:
            eL, eS, eD, ratio = int(e["L"]), int(e["S"]), int(e["D"]), float(e[key])
        except (KeyError, TypeError, ValueError):
            continue  # (rows measured before the backward was: no ratio_bwd)
        if min(L, S, D, eL, eS, eD) <= 0:
            continue
        dist = max(abs(math.log(L / eL)), abs(math.log(S / eS)), abs(math.log(D / eD)))
        if dist <= lim:
            near.append(ratio)
            if dist == 0 and str(e.get("dtype")) == str(shape.get("dtype")):
                exact.append(ratio)
        elif eL * eS <= L * S and (below is None or eL * eS > below[0]):
            below = (eL * eS, ratio)
    src = f"{m.source}, measured on the {m.device}" + ("" if own else " (not this GPU)")
    if exact and own:
        return min(exact), src, "exact"
    if near:
        return min(near), src, "near"
    if below is not None:
        return below[1], src, "below"
    return None


def bias_build_rate(device: dict | None, nbytes: float, near_factor: float) -> tuple[float, str, str] | None:
    """The rate (bytes written a second) at which Inductor's compiled build wrote a materialised
    attention bias of about `nbytes` (bench/bench_attention_bias.py): the slowest of the measured
    biases within `near_factor` of it in bytes, as (rate, source, how); how = "exact" (this GPU,
    these bytes), "near" (this GPU) or "other GPU" (the H200's rate as a fraction of its copy
    bandwidth, times this device's measured bandwidth). None where nothing was measured near:
    a small bias's build is launch-bound, a rate measured on large ones would overstate it."""
    m = measured_for(device)
    own = m is not None and bool(m.attention_bias)
    if not own:
        m = _reference()
    if m is None or not m.attention_bias or not nbytes or nbytes <= 0:
        return None
    lim = math.log(max(near_factor, 1.0)) + 1e-9
    near = []
    for e in m.attention_bias:
        try:
            eb, rate, frac = float(e["bias_bytes"]), float(e["build_rate"]), float(e["build_fraction"])
        except (KeyError, TypeError, ValueError):
            continue
        if eb > 0 and abs(math.log(nbytes / eb)) <= lim:
            near.append((rate, frac, eb == nbytes))
    if not near:
        return None
    rate, frac, exact = min(near)
    src = f"{m.source}, measured on the {m.device}" + ("" if own else " (not this GPU)")
    if own:
        return rate, src, "exact" if exact else "near"
    bw = measured_bandwidth(device or {})
    return (frac * bw, src, "other GPU") if bw else None



def conv_fp32_speedup(device: dict | None, conv: dict, near_factor: float) -> tuple[float, str, str] | None:
    """What running a 16-bit convolution in fp32 measured (cuDNN's 16-bit time over its fp32
    time, forward + backward; bench/probe_grouped_conv.py) on a convolution like `conv`
    ({dtype, groups, channels_per_group, kernel: the kernel's size, all its dims multiplied,
    spatial_dims}): the smallest speedup among measured convolutions of the same dtype width and
    spatial dims, grouped alike, whose channels a group, kernel size and groups are each within
    `near_factor`, as (speedup, source, how); how = "exact" (this GPU, this shape and dtype),
    "near" or "other GPU" (the H200's ratio on another NVIDIA GPU: a ratio of two kernels on one
    GPU transfers better than either time). None where nothing was measured near: cuDNN's choice
    of kernels changes with the shape."""
    m = measured_for(device)
    own = m is not None and bool(m.conv)
    if not own:
        # another GPU: the H200's ratio, for cuDNN on NVIDIA only (MIOpen chooses otherwise)
        vendor = str((device or {}).get("vendor") or "").lower()
        if vendor and "nvidia" not in vendor:
            return None
        m = _reference()
    if m is None or not m.conv:
        return None
    want = _dtype_class(conv.get("dtype"))
    lim = math.log(max(near_factor, 1.0)) + 1e-9
    near = []
    try:
        cpg, k, g = int(conv["channels_per_group"]), int(conv["kernel"]), int(conv["groups"])
        nsp = int(conv["spatial_dims"])
    except (KeyError, TypeError, ValueError):
        return None
    for e in m.conv:
        try:
            ecpg, ek, eg, sp = int(e["channels_per_group"]), int(e["kernel"]), int(e["groups"]), float(e["fp32_speedup"])
            ensp = int(e["spatial_dims"])
        except (KeyError, TypeError, ValueError):
            continue
        if (_dtype_class(str(e.get("dtype"))) != want or ensp != nsp or (eg > 1) != (g > 1)
                or min(cpg, k, g, ecpg, ek, eg) <= 0):
            continue
        if max(abs(math.log(cpg / ecpg)), abs(math.log(k / ek)), abs(math.log(g / eg))) <= lim:
            near.append((sp, cpg == ecpg and k == ek and g == eg and e.get("dtype") == conv.get("dtype")))
    if not near:
        return None
    sp, exact = min(near)
    src = f"{m.source}, measured on the {m.device}" + ("" if own else " (not this GPU)")
    return sp, src, ("exact" if exact else "near") if own else "other GPU"
