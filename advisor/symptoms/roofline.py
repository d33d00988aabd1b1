"""Per-dtype peak rates and floors: what a kernel cannot beat, for estimates that respect physics.

`peak_flops(device, dtype)` gives the dense rate a library GEMM reaches for a precision on a
device, and where the number comes from. The numbers come from `rules/measured/<device>.toml`
(advisor.symptoms.calibration; measured here: on the H200, torch.matmul 8192^3, median of the runs:
bf16 694.5, fp16 678.6, tf32 360.2 and fp32 SIMT 51.3 TFLOP/s; device copy 4.27 TB/s), taking
the median run, not the fastest: an estimate of what a fix gains should use the rate a GEMM
usually reaches. For a GPU we have not measured, its datasheet dense fp16/bf16 tensor rate
(advisor.devices.KNOWN_GPUS or the trace) is derated by the H200's measured/datasheet ratio
(694.5 / 989) and the other precisions follow the datasheet ratios below, per architecture,
with None where the device has no such path (no TF32 before Ampere, no bf16 before Ampere).

`measured_bandwidth(device)` is the device's measured copy bandwidth, or its datasheet
bandwidth derated the same way (4.27 of 4.8 TB/s on the H200).
"""

from __future__ import annotations

import tomllib
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import pandas as pd

from .calibration import _H200_DATASHEET, _reference, measured_for
from ..resources import rules_dir

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


@lru_cache(maxsize=None)
def _median_rates(source: str) -> dict[str, float]:
    """The median dense rates (TFLOP/s) of a measured device's table, else its fastest ones."""
    data = tomllib.loads((rules_dir() / "measured" / Path(source).name).read_text(encoding="utf-8"))
    c = data.get("ceilings", {})
    return {str(k): float(v) for k, v in (c.get("dense_tflops_median") or c.get("dense_tflops") or {}).items()}


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


def _derating() -> tuple[float, float, str]:
    """(peak factor, bandwidth factor, source): the H200's measured / datasheet ratios."""
    ref = _reference()
    if ref is None:
        return 1.0, 1.0, "datasheet"
    bf16 = _median_rates(ref.source).get("bf16", ref.dense_tflops.get("bf16", _H200_DATASHEET["tflops"]))
    return (bf16 / _H200_DATASHEET["tflops"], ref.copy_bytes_per_s / _H200_DATASHEET["bytes_per_s"],
            f"datasheet x {bf16 / _H200_DATASHEET['tflops']:.2f} (H200 measured/datasheet, {ref.source})")


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
        rates = _median_rates(m.source)
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
        factor, _, src = _derating()
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
    return float(bw) * _derating()[1] if bw else None


def gemm_floor_ns(flop: float, nbytes: float, rate: float | None, bw: float | None, latency_ns: float = 0.0) -> float:
    """The least time a GEMM of `flop` and `nbytes` (each operand moved once) can take: the
    larger of its compute floor at `rate`, its HBM floor at `bw` and a launch's latency."""
    compute = flop / rate * 1e9 if rate else 0.0
    memory = nbytes / bw * 1e9 if bw else 0.0
    return max(compute, memory, float(latency_ns))


__all__ = ["peak_flops", "measured_bandwidth", "gemm_floor_ns", "gemm_estimate", "has_tf32", "has_bf16"]


def gemm_estimate(
    total_ns: float,
    launches: int,
    shape: Mapping[str, Any] | None,
    device: Mapping[str, Any],
    target: str,
    elt_bytes: int,
    latency_ns: float,
    own: str | None = None,
) -> dict[str, Any] | None:
    """What a GEMM group's launches would take on the `target` precision path, and what that saves.

    With a shape: each launch's floor at the target's measured peak and the measured bandwidth
    (operands of `elt_bytes`), never under `latency_ns`. Without one: the launch time scaled by
    own-path peak / target peak (the kernel assumed to run at its own path's peak, so the saving
    is what the faster path adds, no more). Returns floor_ns (all launches), savings_ns, basis and
    whether a shape backed it; None when the target path has no known rate on this device."""
    rate, src = peak_flops(device, target)
    if not rate:
        return None
    per_launch = float(total_ns) / max(launches, 1)
    if shape is not None and shape.get("M"):
        M, N, K, b = shape["M"], shape["N"], shape["K"], shape.get("batch") or 1
        flop = 2.0 * M * N * K * b
        nbytes = float(b * elt_bytes * (M * K + K * N + M * N))
        bw = measured_bandwidth(device)
        floor = gemm_floor_ns(flop, nbytes, rate, bw, latency_ns)
        basis = (f"roofline of the {M}x{N}x{K}{f' (x{b})' if b > 1 else ''} GEMM at {rate / 1e12:.0f} TFLOP/s {target} ({src})"
                 + (f" and {bw / 1e12:.2f} TB/s ({elt_bytes}-byte elements)" if bw else "")
                 + f", at least {latency_ns / 1e3:.0f} us a launch")
        shaped = True
    else:
        own_rate, _ = peak_flops(device, own) if own else (None, "")
        if not own_rate:
            return None
        floor = max(per_launch * min(1.0, own_rate / rate), float(latency_ns))
        basis = (f"no shape: launch time x {own} peak / {target} peak ({own_rate / 1e12:.0f} / {rate / 1e12:.0f} TFLOP/s, {src}), "
                 f"at least {latency_ns / 1e3:.0f} us a launch (an upper bound: record shapes, Kineto record_shapes=True "
                 "or emit_nvtx(record_shapes=True), to size it)")
        shaped = False
    floor = min(floor, per_launch)
    return {
        "floor_ns": int(round(floor * launches)),
        "savings_ns": int(round(max(0.0, per_launch - floor) * launches)),
        "basis": basis,
        "shaped": shaped,
        "target_tflops": round(rate / 1e12, 1),
    }
