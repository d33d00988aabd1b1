"""Occupancy and waves per kernel launch, from the launch configuration alone.

Blocks per SM is the minimum over four limits (Nsight Compute's occupancy model):
  warps      max_warps_per_sm // ceil(threads / warp_size)
  registers  warps that fit in the register file (per-warp allocation rounded up to 256
             registers) // warps per block
  shared     smem_per_sm // (static + dynamic + 1 KiB reserved per block on sm80+)
  blocks     the device's max blocks per SM
waves = grid blocks / (SMs x blocks per SM). A second model, SM saturation, assumes one block
(one GEMM tile) keeps an SM's tensor cores busy: waves_sat = blocks / SMs. Measured on the
H200 (DESIGN.md) a partial second wave costs close to a whole tile-time, so tails are judged
with the saturation model for GEMMs and both models are reported.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..model import Trace, constant_view

REG_ALLOC_UNIT = 256  # registers are allocated per warp in units of 256 (sm50+)
SMEM_RESERVED_SM80 = 1024  # bytes the runtime reserves per block on sm80 and newer

COLUMNS = [
    "blocks_per_sm",
    "occupancy_limiter",
    "sm_count",
    "waves",
    "tail_efficiency",
    "waves_sat",
    "tail_efficiency_sat",
]


def _tail_eff(waves: np.ndarray) -> np.ndarray:
    """waves / ceil(waves): 1.0 for whole waves, low when the last wave is nearly empty."""
    with np.errstate(invalid="ignore", divide="ignore"):
        ceil = np.ceil(waves)
        return np.where(ceil > 0, waves / ceil, np.nan)


_CHUNK = 1 << 18  # kernels per step of occupancy()


def waves_at(k: pd.DataFrame, rows: np.ndarray | None = None) -> np.ndarray:
    """`waves` (occupancy's column: grid blocks / (SMs x blocks per SM), NaN where unknown)
    of the kernels at positions `rows` (all when None) of `k`, a frame with grid_blocks,
    sm_count and blocks_per_sm (Context.kernels): the same float64 operations on the same
    values, so the same numbers, for the few symptoms that read it (a column of
    Context.kernels was 8 bytes for every kernel)."""
    n = len(k) if rows is None else len(rows)
    out = np.empty(n)
    grid, sms, bps = k["grid_blocks"].array, k["sm_count"].to_numpy(), k["blocks_per_sm"].to_numpy()
    for lo in range(0, n, _CHUNK):
        at = slice(lo, min(lo + _CHUNK, n)) if rows is None else rows[lo:lo + _CHUNK]
        g = grid[at].to_numpy(np.float64, na_value=np.nan) if isinstance(grid, pd.api.extensions.ExtensionArray) \
            else np.asarray(grid[at], dtype=np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            out[lo:lo + _CHUNK] = g / (sms[at] * bps[at])
    return out


def col(frame, name) -> np.ndarray:
    if isinstance(frame, dict):
        return frame[name]
    return frame[name].astype("float64").to_numpy(na_value=np.nan)


def _blocks_per_sm(k: pd.DataFrame, d: dict) -> tuple[np.ndarray, np.ndarray]:
    """Blocks per SM and the limiting resource's name (object array) for the kernels `k`,
    with their devices' limits `d` (arrays, same length)."""
    threads = col(k, "block_threads")
    warp_size = np.nan_to_num(col(d, "warp_size"), nan=32.0)
    warps_per_block = np.ceil(threads / warp_size)
    max_warps = col(d, "max_warps_per_sm")
    by_warps = np.floor(max_warps / warps_per_block)

    regs = col(k, "registers_per_thread")
    regs_per_warp = np.ceil(regs * warp_size / REG_ALLOC_UNIT) * REG_ALLOC_UNIT
    with np.errstate(invalid="ignore", divide="ignore"):
        warps_by_regs = np.floor(col(d, "regs_per_sm") / regs_per_warp)
        by_regs = np.floor(warps_by_regs / warps_per_block)
    by_regs = np.where(regs > 0, by_regs, np.inf)  # unknown or 0 registers: no limit from them

    smem = np.nan_to_num(col(k, "static_smem_bytes")) + np.nan_to_num(col(k, "dynamic_smem_bytes"))
    cc_major = col(d, "cc_major")
    reserved = np.where(cc_major >= 8, SMEM_RESERVED_SM80, 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        by_smem = np.where(smem > 0, np.floor(col(d, "smem_per_sm_bytes") / (smem + reserved)), np.inf)
    by_blocks = col(d, "max_blocks_per_sm")

    limits = np.vstack([by_warps, by_regs, by_smem, by_blocks])
    names = np.array(["warps", "registers", "shared_memory", "blocks", "unknown"], dtype=object)
    filled = np.where(np.isnan(limits), np.inf, limits)
    blocks_per_sm = filled.min(axis=0)
    limiter = names[filled.argmin(axis=0)]
    unknown = np.isinf(blocks_per_sm) | np.isnan(by_warps)
    blocks_per_sm = np.where(unknown, np.nan, blocks_per_sm)
    # A launch that cannot fit even one block would have failed; clamp to 1 if the limits say 0
    # (usually a device table that is off for this part).
    blocks_per_sm = np.where(blocks_per_sm < 1, 1, blocks_per_sm)
    limiter[unknown] = names[-1]
    return blocks_per_sm, limiter


def occupancy(trace: Trace, columns=COLUMNS) -> pd.DataFrame:
    """One row per kernel (same index as trace.kernels) with `columns` (of COLUMNS); NaN where
    unknown. Context.kernels asks only for the columns symptoms read: each is 8 bytes a
    kernel, and the limiter's strings and the saturation model's columns were read by none."""
    columns = [c for c in COLUMNS if c in columns]
    k = trace.kernels
    if k.empty:
        return pd.DataFrame(columns=columns, index=k.index, dtype="float64")
    dev = trace.devices.drop_duplicates(["rank", "device_id"]).reset_index(drop=True)
    # Each kernel's device limits by position: one int64 key per (rank, device) looked up in
    # the few device rows, then numpy takes of the columns needed (reindexing the whole
    # device frame by a million-row MultiIndex took most of this function's time).
    ranks, devs = k["rank"].to_numpy(np.int64), k["device_id"].fillna(-1).to_numpy(np.int64)
    dev_keys = dev["rank"].to_numpy(np.int64) * (1 << 32) + dev["device_id"].to_numpy(np.int64) + 1
    pos = pd.Index(dev_keys).get_indexer(ranks * (1 << 32) + devs + 1) if len(dev) else np.full(len(k), -1)
    dev_values = {name: np.append(dev[name].astype("float64").to_numpy(na_value=np.nan), np.nan)  # last: unknown device
                  for name in ("warp_size", "max_warps_per_sm", "regs_per_sm", "cc_major", "smem_per_sm_bytes",
                               "max_blocks_per_sm", "sm_count")}
    dev_at = np.where(pos >= 0, pos, len(dev))
    del pos, ranks, devs
    n = len(k)
    blocks_per_sm, sms, waves = (np.empty(n) for _ in range(3))
    # the columns no one asked for are not filled (the limiter alone is 8 bytes a kernel)
    limiter = np.empty(n, dtype=object) if "occupancy_limiter" in columns else None
    waves_sat = np.empty(n) if {"waves_sat", "tail_efficiency_sat"} & set(columns) else None
    # in chunks: each step's float64 temporaries for every kernel at once were ~1.5 GB at 10M
    for lo in range(0, n, _CHUNK):
        sl = slice(lo, min(lo + _CHUNK, n))
        d = {name: values[dev_at[sl]] for name, values in dev_values.items()}
        part = k.iloc[sl]  # a view
        blocks_per_sm[sl], lim = _blocks_per_sm(part, d)
        if limiter is not None:
            limiter[sl] = lim
        sms[sl] = d["sm_count"]
        grid = col(part, "grid_blocks")
        with np.errstate(invalid="ignore", divide="ignore"):
            waves[sl] = grid / (d["sm_count"] * blocks_per_sm[sl])
            if waves_sat is not None:
                waves_sat[sl] = grid / d["sm_count"]
    # from the few shared str objects, in the dtype a numpy string column got before (pandas'
    # default "str"); converting a numpy unicode array row by row took 0.15 s per million
    made = {
        "blocks_per_sm": lambda: blocks_per_sm,
        "occupancy_limiter": lambda: pd.array(limiter, dtype=pd.StringDtype("python", na_value=np.nan)),
        # one GPU model (the usual case): one value seen n times, 0 bytes a kernel
        "sm_count": lambda: constant_view(pd.Series(sms, copy=False)).to_numpy(),
        "waves": lambda: waves,
        "tail_efficiency": lambda: _tail_eff(waves),
        "waves_sat": lambda: waves_sat,
        "tail_efficiency_sat": lambda: _tail_eff(waves_sat),
    }
    return pd.DataFrame(
        {c: made[c]() for c in columns},
        index=k.index,
        copy=False,  # not consolidated into one block: that was a copy of the float columns
    )
