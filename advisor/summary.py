"""`advisor summary`: what a trace holds, as a plain dict (the CLI prints it or its JSON)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from .model import Trace


def _int(v: Any) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


def _dims(row: pd.Series, prefix: str) -> list[int | None]:
    return [_int(row[f"{prefix}_{a}"]) for a in "xyz"]


def devices_table(trace: Trace) -> list[dict[str, Any]]:
    out = []
    for row in trace.devices.itertuples(index=False):
        out.append(
            {
                "rank": int(row.rank),
                "device_id": int(row.device_id),
                "name": None if pd.isna(row.name) else str(row.name),
                "vendor": None if pd.isna(row.vendor) else str(row.vendor),
                "sm_count": _int(row.sm_count),
                "sm_count_source": None if pd.isna(row.sm_count_source) else str(row.sm_count_source),
                "compute_capability": None if pd.isna(row.arch) else str(row.arch),
            }
        )
    return out


def top_kernels(trace: Trace, top: int = 10) -> list[dict[str, Any]]:
    k = trace.kernels
    if k.empty:
        return []
    out = []
    # Group by factorized codes, not by comparing names: string equality goes through numpy,
    # which ignores trailing NUL characters, so a name ending in "\x00" would match no row.
    codes, names = pd.factorize(k["name"], use_na_sentinel=False)
    grouped = k["dur_ns"].groupby(codes, sort=False)
    stats = grouped.agg(["count", "sum", "median"]).sort_values("sum", ascending=False, kind="stable")
    for code, st in stats.head(top).iterrows():
        name = names[code]
        rows = k[codes == code]
        # The most frequent launch configuration stands for the kernel.
        cfg_cols = [f"grid_{a}" for a in "xyz"] + [f"block_{a}" for a in "xyz"]
        cfg = rows[cfg_cols].astype("object").where(rows[cfg_cols].notna(), None)
        mode = cfg.value_counts(dropna=False).index[0] if len(cfg) else (None,) * 6
        first = rows.iloc[0]
        smem = first["static_smem_bytes"]
        dyn = first["dynamic_smem_bytes"]
        smem_total = None if pd.isna(smem) and pd.isna(dyn) else int((0 if pd.isna(smem) else smem) + (0 if pd.isna(dyn) else dyn))
        out.append(
            {
                "name": None if pd.isna(name) else str(name),
                "count": int(st["count"]),
                "total_ns": int(st["sum"]),
                "median_ns": int(st["median"]),
                "grid": [_int(v) for v in mode[:3]],
                "block": [_int(v) for v in mode[3:]],
                "registers_per_thread": _int(first["registers_per_thread"]),
                "shared_mem_bytes": smem_total,
            }
        )
    return out


def summarize(trace: Trace, top: int = 10) -> dict[str, Any]:
    k = trace.kernels
    m = trace.memcpy
    fmt = trace.meta.get("format")
    span = int(k["end_ns"].max() - k["start_ns"].min()) if len(k) else 0
    memcpy = {
        "count": int(len(m)),
        "total_ns": int(m["dur_ns"].sum()) if len(m) else 0,
        "bytes": int(m["bytes"].sum()) if len(m) and m["bytes"].notna().any() else 0,
        "by_kind": {
            str(kind): {"count": int(len(g)), "total_ns": int(g["dur_ns"].sum()), "bytes": int(g["bytes"].fillna(0).sum())}
            for kind, g in m.groupby(m["kind"].fillna("unknown"))
        },
    }
    return {
        "format": fmt,
        "sources": list(trace.meta.get("sources", [])),
        "ranks": trace.ranks,
        "devices": devices_table(trace),
        "kernels": {
            "count": int(len(k)),
            "total_ns": int(k["dur_ns"].sum()) if len(k) else 0,
            "distinct": int(k["name"].nunique()) if len(k) else 0,
            "span_ns": span,
        },
        "top_kernels": top_kernels(trace, top),
        "nvtx": {"count": int(len(trace.nvtx))},
        "cpu_ops": {"count": int(len(trace.cpu_ops))},
        "runtime": {"count": int(len(trace.runtime))},
        "memcpy": memcpy,
        "notes": list(trace.meta.get("notes", [])),
    }
