"""Device limits: what the trace says, completed from known architectures and GPUs.

Occupancy needs per-SM limits (warps, blocks, registers, shared memory) that many traces do
not carry (Kineto gives only a few, rocprof none). The tables below come from the CUDA C++
Programming Guide's "Technical Specifications per Compute Capability" and AMD's CDNA ISA
guides; SM/CU counts from the vendors' product pages.
"""

from __future__ import annotations

import re
from typing import Any

import pandas as pd

from .model import Trace, conform

# compute capability -> (max warps/SM, max blocks/SM, shared memory/SM, max shared/block opt-in)
_NVIDIA_ARCH: dict[tuple[int, int], tuple[int, int, int, int]] = {
    (6, 0): (64, 32, 64 << 10, 48 << 10),
    (6, 1): (64, 32, 96 << 10, 48 << 10),
    (7, 0): (64, 32, 96 << 10, 96 << 10),
    (7, 2): (64, 32, 96 << 10, 96 << 10),
    (7, 5): (32, 16, 64 << 10, 64 << 10),
    (8, 0): (64, 32, 164 << 10, 163 << 10),
    (8, 6): (48, 16, 100 << 10, 99 << 10),
    (8, 7): (48, 16, 164 << 10, 163 << 10),
    (8, 9): (48, 24, 100 << 10, 99 << 10),
    (9, 0): (64, 32, 228 << 10, 227 << 10),
    (10, 0): (64, 32, 228 << 10, 227 << 10),
    (12, 0): (48, 32, 128 << 10, 99 << 10),
}
_NVIDIA_REGS_PER_SM = 65536
_NVIDIA_REGS_PER_BLOCK = 65536

# AMD CDNA: wave64, up to 32 waves (8 per SIMD x 4 SIMDs) and 32 workgroups per CU;
# LDS per CU 64 KiB (160 KiB on gfx950). VGPR-limited occupancy is not modelled.
_AMD_ARCH: dict[str, tuple[int, int, int, int]] = {
    "gfx908": (32, 32, 64 << 10, 64 << 10),
    "gfx90a": (32, 32, 64 << 10, 64 << 10),
    "gfx940": (32, 32, 64 << 10, 64 << 10),
    "gfx941": (32, 32, 64 << 10, 64 << 10),
    "gfx942": (32, 32, 64 << 10, 64 << 10),
    "gfx950": (32, 32, 160 << 10, 160 << 10),
}

# Known GPUs, matched by the longest key contained in the normalised device name:
# key -> (vendor, arch, SMs or CUs, L2 bytes, memory bandwidth bytes/s, dense fp16/bf16 tensor
# TFLOP/s from the datasheet: a ceiling for the roofline gate, not a promise)
KNOWN_GPUS: dict[str, tuple[str, str, int, int, float, float]] = {
    "h200": ("nvidia", "9.0", 132, 60 << 20, 4.8e12, 989.0),
    "gh200": ("nvidia", "9.0", 132, 60 << 20, 4.0e12, 989.0),
    "h100 pcie": ("nvidia", "9.0", 114, 50 << 20, 2.0e12, 756.0),
    "h100 nvl": ("nvidia", "9.0", 132, 50 << 20, 3.9e12, 835.0),
    "h100": ("nvidia", "9.0", 132, 50 << 20, 3.35e12, 989.0),
    "h800": ("nvidia", "9.0", 132, 50 << 20, 3.35e12, 989.0),
    "h20": ("nvidia", "9.0", 78, 60 << 20, 4.0e12, 148.0),
    "b200": ("nvidia", "10.0", 148, 126 << 20, 8.0e12, 2250.0),
    "a100": ("nvidia", "8.0", 108, 40 << 20, 2.0e12, 312.0),
    "a800": ("nvidia", "8.0", 108, 40 << 20, 2.0e12, 312.0),
    "a30": ("nvidia", "8.0", 56, 24 << 20, 0.93e12, 165.0),
    "a10g": ("nvidia", "8.6", 80, 6 << 20, 0.6e12, float("nan")),
    "a10": ("nvidia", "8.6", 72, 6 << 20, 0.6e12, 125.0),
    "l40s": ("nvidia", "8.9", 142, 96 << 20, 0.86e12, 362.0),
    "l40": ("nvidia", "8.9", 142, 96 << 20, 0.86e12, 181.0),
    "l4": ("nvidia", "8.9", 58, 48 << 20, 0.3e12, 121.0),
    "rtx 6000 ada": ("nvidia", "8.9", 142, 96 << 20, 0.96e12, 364.0),
    "quadro rtx 6000": ("nvidia", "7.5", 72, 6 << 20, 0.67e12, 130.0),
    "rtx a6000": ("nvidia", "8.6", 84, 6 << 20, 0.77e12, 155.0),
    "rtx 4090": ("nvidia", "8.9", 128, 72 << 20, 1.0e12, 165.0),
    "rtx 3090": ("nvidia", "8.6", 82, 6 << 20, 0.94e12, 71.0),
    "rtx 3080 ti": ("nvidia", "8.6", 80, 6 << 20, 0.91e12, 68.0),
    "rtx 3080": ("nvidia", "8.6", 68, 5 << 20, 0.76e12, 60.0),
    "v100": ("nvidia", "7.0", 80, 6 << 20, 0.9e12, 125.0),
    "t4": ("nvidia", "7.5", 40, 4 << 20, 0.32e12, 65.0),
    "mi355x": ("amd", "gfx950", 256, 4 << 20, 8.0e12, 2500.0),
    "mi350x": ("amd", "gfx950", 256, 4 << 20, 8.0e12, 2300.0),
    "mi325x": ("amd", "gfx942", 304, 4 << 20, 6.0e12, 1307.0),
    "mi300x": ("amd", "gfx942", 304, 4 << 20, 5.3e12, 1307.0),
    "mi300a": ("amd", "gfx942", 228, 4 << 20, 5.3e12, 981.0),
    "mi250x": ("amd", "gfx90a", 110, 8 << 20, 1.6e12, 191.0),  # per GCD, as ROCm lists devices
    "mi250": ("amd", "gfx90a", 104, 8 << 20, 1.6e12, 181.0),
    "mi210": ("amd", "gfx90a", 104, 8 << 20, 1.6e12, 181.0),
    "mi100": ("amd", "gfx908", 120, 8 << 20, 1.2e12, 92.0),
}
# AMD marketing names for the gfx ids, for traces that give only the arch.
_AMD_GFX_DEFAULT = {"gfx942": "mi300x", "gfx950": "mi350x", "gfx90a": "mi250", "gfx908": "mi100"}


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", " ", name.lower()).strip()


def lookup_gpu(name: str | None) -> tuple[str, tuple[str, str, int, int, float, float]] | None:
    """The known-GPU row whose key is the longest match inside `name` (word-aligned)."""
    if not name or pd.isna(name):
        return None
    padded = f" {_norm(str(name))} "
    best = None
    for key in KNOWN_GPUS:
        if f" {key} " in padded and (best is None or len(key) > len(best)):
            best = key
    if best is None:
        # AMD arch ids in the name ("gfx942") stand for the usual part.
        m = re.search(r"gfx9[0-9a-f]{2}", padded)
        if m and m.group(0) in _AMD_GFX_DEFAULT:
            best = _AMD_GFX_DEFAULT[m.group(0)]
    return (best, KNOWN_GPUS[best]) if best else None


def arch_limits(vendor: str, arch: str | None) -> dict[str, int] | None:
    """Per-SM limits for an architecture: dict with the devices-frame column names."""
    if vendor == "nvidia" and arch:
        try:
            major, minor = (int(x) for x in str(arch).split(".")[:2])
        except ValueError:
            return None
        row = _NVIDIA_ARCH.get((major, minor))
        if row is None:
            # Unknown minor revision: take the closest lower one of the same major.
            same = sorted(k for k in _NVIDIA_ARCH if k[0] == major and k[1] <= minor)
            row = _NVIDIA_ARCH[same[-1]] if same else None
        if row is None:
            return None
        warps, blocks, smem_sm, smem_blk = row
        return {
            "warp_size": 32,
            "max_warps_per_sm": warps,
            "max_blocks_per_sm": blocks,
            "max_threads_per_block": 1024,
            "regs_per_sm": _NVIDIA_REGS_PER_SM,
            "max_regs_per_block": _NVIDIA_REGS_PER_BLOCK,
            "smem_per_sm_bytes": smem_sm,
            "smem_per_block_optin_bytes": smem_blk,
        }
    if vendor == "amd" and arch:
        row = _AMD_ARCH.get(str(arch).split(":")[0])
        if row is None:
            return None
        waves, blocks, lds_cu, lds_blk = row
        return {
            "warp_size": 64,
            "max_warps_per_sm": waves,
            "max_blocks_per_sm": blocks,
            "max_threads_per_block": 1024,
            "smem_per_sm_bytes": lds_cu,
            "smem_per_block_optin_bytes": lds_blk,
        }
    return None


def complete_devices(trace: Trace, sm_count: int | None = None) -> Trace:
    """Fill gaps in `trace.devices` from known GPUs and arch tables; add rows for devices
    that ran kernels but were not described. `sm_count` (the user's `--sm-count`) overrides.
    Works in place and returns the trace."""
    dev = trace.devices.copy()
    # Devices that ran kernels but have no row.
    k = trace.kernels
    if len(k):
        used = k[["rank", "device_id"]].dropna().drop_duplicates()
        have = set(zip(dev["rank"].astype(int), dev["device_id"].astype(int)))
        missing = [
            {"rank": int(r), "device_id": int(d)}
            for r, d in zip(used["rank"], used["device_id"])
            if (int(r), int(d)) not in have
        ]
        if missing:
            dev = pd.concat([dev, pd.DataFrame(missing)], ignore_index=True)
    dev = conform(dev, "devices")
    rows = []
    for row in dev.to_dict("records"):
        known = lookup_gpu(row.get("name"))
        if known:
            vendor, arch, sms, l2, bw, peak = known[1]
            if pd.isna(row.get("vendor")) or row.get("vendor") in ("", "unknown"):
                row["vendor"] = vendor
            if pd.isna(row.get("arch")):
                row["arch"] = arch
            if pd.isna(row.get("sm_count")):
                row["sm_count"] = sms
                row["sm_count_source"] = "known-gpu"
            if pd.isna(row.get("l2_bytes")):
                row["l2_bytes"] = l2
            if pd.isna(row.get("mem_bandwidth_bytes_per_s")):
                row["mem_bandwidth_bytes_per_s"] = bw
            if pd.isna(row.get("peak_tensor_tflops")):
                row["peak_tensor_tflops"] = peak
        if pd.isna(row.get("vendor")):
            row["vendor"] = "unknown"
        arch = row.get("arch")
        if row["vendor"] == "nvidia" and not pd.isna(arch) and pd.isna(row.get("cc_major")):
            try:
                row["cc_major"], row["cc_minor"] = (int(x) for x in str(arch).split(".")[:2])
            except ValueError:
                pass
        if row["vendor"] == "nvidia" and pd.isna(arch) and not pd.isna(row.get("cc_major")):
            row["arch"] = f"{int(row['cc_major'])}.{int(row.get('cc_minor') or 0)}"
        limits = arch_limits(row["vendor"], None if pd.isna(row.get("arch")) else row["arch"])
        for col, val in (limits or {}).items():
            if pd.isna(row.get(col)):
                row[col] = val
        if sm_count is not None:
            had, source = row.get("sm_count"), row.get("sm_count_source")
            if not pd.isna(had) and int(had) != int(sm_count):
                # a partition (MIG, green context) can have fewer SMs than the trace says,
                # but a typo would silently skew every wave figure: say what was replaced
                where = "the trace" if pd.isna(source) or source == "trace" else "the known-GPU table"
                label = row.get("name") if not pd.isna(row.get("name")) else f"device {row['device_id']}"
                trace.note(f"--sm-count {int(sm_count)} replaces the {int(had)} SMs {where} gives for {label} (rank {row['rank']})")
            row["sm_count"] = int(sm_count)
            row["sm_count_source"] = "user"
        elif not pd.isna(row.get("sm_count")) and pd.isna(row.get("sm_count_source")):
            row["sm_count_source"] = "trace"
        elif pd.isna(row.get("sm_count")):
            row["sm_count_source"] = "unknown"
        rows.append(row)
    trace.devices = conform(pd.DataFrame(rows, columns=list(dev.columns)), "devices")
    unknown = trace.devices[trace.devices["sm_count"].isna()]
    for row in unknown.itertuples():
        label = row.name if not pd.isna(row.name) else f"device {row.device_id}"
        trace.note(
            f"SM count unknown for {label} (rank {row.rank}): wave-based findings are skipped; "
            "pass --sm-count N"
        )
    return trace


def devices_table(trace: Trace) -> list[dict[str, Any]]:
    """The devices frame as plain rows (the "devices" of `advisor summary` and of a diagnosis)."""
    out = []
    for row in trace.devices.itertuples(index=False):
        out.append(
            {
                "rank": int(row.rank),
                "device_id": int(row.device_id),
                "name": None if pd.isna(row.name) else str(row.name),
                "vendor": None if pd.isna(row.vendor) else str(row.vendor),
                "sm_count": None if pd.isna(row.sm_count) else int(row.sm_count),
                "sm_count_source": None if pd.isna(row.sm_count_source) else str(row.sm_count_source),
                "compute_capability": None if pd.isna(row.arch) else str(row.arch),
            }
        )
    return out
