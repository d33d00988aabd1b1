"""Floors and estimates: what a GEMM cannot beat on a precision path, and what moving it there saves.

`gemm_floor_ns` is the larger of a GEMM's compute floor, its HBM floor and a launch's latency;
`gemm_estimate` applies it to a group of launches on a target path. The rates come from
advisor.symptoms.calibration, where every peak is computed: `peak_flops(device, dtype)`, the
rate a library GEMM usually reaches (the median run) and `measured_bandwidth(device)`.
"""

from __future__ import annotations

from typing import Any, Mapping

from .calibration import measured_bandwidth, peak_flops


def gemm_floor_ns(flop: float, nbytes: float, rate: float | None, bw: float | None, latency_ns: float = 0.0) -> float:
    """The least time a GEMM of `flop` and `nbytes` (each operand moved once) can take: the
    larger of its compute floor at `rate`, its HBM floor at `bw` and a launch's latency."""
    compute = flop / rate * 1e9 if rate else 0.0
    memory = nbytes / bw * 1e9 if bw else 0.0
    return max(compute, memory, float(latency_ns))


__all__ = ["gemm_floor_ns", "gemm_estimate"]


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
