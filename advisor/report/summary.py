"""`advisor summary`: what a trace holds, as a plain dict (the CLI prints it or its JSON)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from ..devices import devices_table
from ..model import Trace


def _int(v: Any) -> int | None:
    return None if v is None or pd.isna(v) else int(v)


def _dims(row: pd.Series, prefix: str) -> list[int | None]:
    return [_int(row[f"{prefix}_{a}"]) for a in "xyz"]


# One summary row per launch configuration: a kernel name launched with grids 4, 132 and 143
# is three rows, since a 4-CTA call taking 887 us and a 143-CTA call taking 84 us are
# different problems that one per-name median would hide.
_CFG = [f"grid_{a}" for a in "xyz"] + [f"block_{a}" for a in "xyz"]
_SHAPE = ["M", "N", "K", "dtype"]


def _launch_shapes(trace: Trace) -> pd.DataFrame:
    """M, N, K, dtype per kernel where a range or cpu op names the GEMM shape (else NA)."""
    from ..symptoms.gemm import assign_shapes

    s = assign_shapes(trace)
    return s.reindex(columns=_SHAPE)


def top_kernels(trace: Trace, top: int = 10) -> list[dict[str, Any]]:
    """The `top` (kernel name, grid, block, shape) groups by total time. Each row also says
    how many launch configurations its name has (`configs_of_name`)."""
    k = trace.kernels
    if k.empty:
        return []
    # Group by factorized codes, not by comparing names: string equality goes through numpy,
    # which ignores trailing NUL characters, so a name ending in "\x00" would match no row.
    codes, names = pd.factorize(k["name"], use_na_sentinel=False)
    shapes = _launch_shapes(trace)
    keys = pd.DataFrame({"_name": codes}, index=k.index)
    for c in _CFG:
        keys[c] = k[c].astype("Int64").fillna(-1).astype("int64")
    for c in ("M", "N", "K"):
        keys[c] = pd.to_numeric(shapes[c], errors="coerce").astype("Int64").fillna(-1).astype("int64")
    keys["dtype"] = shapes["dtype"].astype("object").where(shapes["dtype"].notna(), "")
    key_cols = list(keys.columns)
    group = keys.groupby(key_cols, sort=False).ngroup().to_numpy()
    stats = k["dur_ns"].groupby(group, sort=False).agg(["count", "sum", "median"])
    stats = stats.sort_values("sum", ascending=False, kind="stable")
    first_row = pd.Series(np.arange(len(k))).groupby(group, sort=False).min()
    from ..traces.graphs import is_graph_replayed

    replayed = pd.Series(is_graph_replayed(k).to_numpy(dtype=np.int64)).groupby(group, sort=False).sum()
    configs = keys.assign(_g=group).drop_duplicates("_g").groupby("_name").size()
    out = []
    for g, st in stats.head(top).iterrows():
        i = int(first_row[g])
        row = k.iloc[i]
        code = int(codes[i])
        name = names[code]
        smem, dyn = row["static_smem_bytes"], row["dynamic_smem_bytes"]
        smem_total = None if pd.isna(smem) and pd.isna(dyn) else int((0 if pd.isna(smem) else smem) + (0 if pd.isna(dyn) else dyn))
        shape = None
        if int(keys.iloc[i]["M"]) >= 0:
            shape = {c: int(keys.iloc[i][c]) for c in ("M", "N", "K")}
            if keys.iloc[i]["dtype"]:
                shape["dtype"] = str(keys.iloc[i]["dtype"])
        out.append(
            {
                "name": None if pd.isna(name) else str(name),
                "count": int(st["count"]),
                "total_ns": int(st["sum"]),
                "median_ns": int(st["median"]),
                "grid": _dims(row, "grid"),
                "block": _dims(row, "block"),
                "grid_blocks": _int(row["grid_blocks"]),
                "shape": shape,
                "configs_of_name": int(configs.get(code, 1)),
                "graph_replayed": int(replayed[g]),  # launches replayed from a CUDA graph
                "registers_per_thread": _int(row["registers_per_thread"]),
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
