"""rocprof kernel CSVs: v1 `results.csv`, rocprofv2 and rocprofv3 `*_kernel_trace.csv`, and
the counter-collection CSVs (rocprofv3 `*_counter_collection.csv`, rocprof-compute `pmc_perf.csv`).

One reader, told apart by header (checked against the tools' sources/docs):

| tool | header (kernel columns) | grid |
| --- | --- | --- |
| rocprof v1 | `Index,KernelName,gpu-id,queue-id,queue-index,pid,tid,grd,wgr,lds,scr,arch_vgpr` (older: `vgpr`)`,accum_vgpr,sgpr,wave_size,sig,obj,DispatchNs,BeginNs,EndNs,CompleteNs[,DurationNs]` | `grd`, `wgr`: totals in work-items |
| rocprofv2 | `Dispatch_ID,GPU_ID,Queue_ID,[Queue_Index,]PID,TID,GRD,WGR,LDS,SCR,Arch_VGPR,ACCUM_VGPR,SGPR,Wave_Size,SIG,OBJ,Kernel_Name,Start_Timestamp,End_Timestamp,Correlation_ID` or (file plugin v2) `...,Grid_Size,Workgroup_Size,LDS_Per_Workgroup,Scratch_Per_Workitem,Arch_VGPR,Accum_VGPR,SGPR,Wave_Size,Kernel_Name,...` | totals in work-items |
| rocprofv3 (2024-05) | `Kind,Agent_Id,Queue_Id,Kernel_Id,Kernel_Name,Correlation_Id,Start_Timestamp,End_Timestamp,Private_Segment_Size,Group_Segment_Size,Workgroup_Size_X/Y/Z,Grid_Size_X/Y/Z` | per dimension, work-items |
| rocprofv3 (2024-07..) | same plus `Thread_Id,Dispatch_Id` after `Queue_Id` (2025: plus `Stream_Id`) | per dimension, work-items |
| rocprofv3 (2025-..) | `Kind,Agent_Id,Queue_Id,Stream_Id,Thread_Id,Dispatch_Id,Kernel_Id,Kernel_Name,Correlation_Id,Start_Timestamp,End_Timestamp,LDS_Block_Size,Scratch_Size,VGPR_Count,Accum_VGPR_Count,SGPR_Count,Workgroup_Size_X/Y/Z,Grid_Size_X/Y/Z` | per dimension, work-items |

Counter-collection CSVs are read too, one kernel per dispatch:
- rocprofv3's `counter_collection.csv` (one row per dispatch and counter, scalar `Grid_Size` and
  `Workgroup_Size`, `Counter_Name`/`Counter_Value`);
- rocprof-compute's (Omniperf's) `pmc_perf.csv` (and its per-pass `pmc_perf_N.csv`), which
  `rocprof-compute profile` builds from rocprof v1/v2/v3 counter runs: told by that name, or
  by the long form its rocpd path writes (`GPU_ID,Dispatch_ID,...,Counter_Name,Counter_Value`).
  Its CSV path joins the passes per kernel and averages their `Start_Timestamp`/`End_Timestamp`
  (`join_prof` in rocprofiler-compute's analysis code), so its times may have fractions: they
  are rounded to whole ns.
In both the profiler ran one kernel at a time on each GPU while reading counters
(rocprofiler-sdk's counter-collection docs: "dispatch counting allows only a single kernel to
execute in hardware at a time"; rocprof-compute's profile-mode docs: "Kernel dispatches are
serialized across HIP streams on the same GPU during profiling"), so the gaps and overlaps of
such a timeline are the profiler's, not the program's. The trace says so in a note and lists
the rank in `meta["serialized_ranks"]`, which the GPU-idle, launch-gap and overlap judgements
skip. A rocprof v1 or rocprofv2 kernel CSV with columns beyond its kernel-record columns
(SQ_WAVES, FETCH_SIZE, ...: a `-i input.txt` counter run) is marked the same way, naming them.

Conversions to the trace model:
- Grids become workgroups. Per-dimension grids: ceil(grid / workgroup) each. The v1/v2
  totals (`grd` = x*y*z work-items, `wgr` = workgroup size) keep no shape, so the grid is
  reported 1-D: grid_x = ceil(grd / wgr), grid_y = grid_z = 1 (the block count, which is what
  waves need, is right whenever each dimension divides evenly, as HIP launches do).
- `Agent_Id` may be a number (HSA node id) or a label such as `Agent 2` / `GPU 0`
  (rocprofv3 `--agent-index`); the number is the device id. v1 `gpu-id`, v2 `GPU_ID` likewise.
- LDS (`lds`, `LDS`, `LDS_Per_Workgroup`, `Group_Segment_Size`, `LDS_Block_Size`) goes to
  `static_smem_bytes`, `dynamic_smem_bytes` stays unknown (the CSVs do not split static from
  dynamic LDS); arch VGPRs to `registers_per_thread`. `.kd` suffixes are dropped from names.
  rocprofv3's older `Group_Segment_Size` is the dispatch's value, static + dynamic
  (rocprofiler-sdk `generateCSV.cpp`, 2024: `dispatch_info.group_segment_size`), but its
  `LDS_Block_Size` is the kernel symbol's static `group_segment_size` rounded up to the LDS
  granule (later `generateCSV.cpp`: `lds_block_size_v` from `kernel_info`): LDS a kernel takes
  at launch (dynamic, as Triton's do) is in no column, and a note says so.
- Devices: one row per device id, vendor "amd"; the CSV names no GPU, so the name, gfx arch
  and CU count come from rocprofv3's companion `*agent_info.csv` when it sits beside the
  file, else stay unknown (`--sm-count` fills the CU count).

Other files of these tools (`results.stats.csv`, `*_kernel_stats.csv`, API traces, agent
info...) are recognised and refused with a one-line error saying which file to pass instead.
"""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from ..errors import TraceError
from ..model import Trace
from ._amd import gfx_name, workgroups
from ._jsonio import read_bytes, to_int
from ._names import short_names, strip_kd

FORMAT = "rocprof-csv"
DESCRIPTION = "rocprof v1 results.csv, rocprofv2 CSV, rocprofv3 *_kernel_trace.csv / *_counter_collection.csv, rocprof-compute pmc_perf.csv"

ROCPROF_COMPUTE = "rocprof-compute pmc_perf.csv"
# variants whose kernels the profiler ran one at a time per GPU (see the module docstring)
_SERIALIZED = {
    "rocprofv3 counter_collection": "rocprofv3 counter collection serializes kernel dispatches",
    ROCPROF_COMPUTE: "rocprof-compute profile serializes kernel dispatches across HIP streams and joins several counter passes",
}

# The kernel-record columns of rocprof v1's results.csv (rocprofiler v1 `tblextr.py`, with
# --timestamp on and --obj-tracking on; before ROCm 5.3 every record also had `fbar`) and of
# rocprofv2's CSVs (both file-plugin layouts).
# Anything else in such a file is a counter or derived metric (SQ_WAVES, FETCH_SIZE, VALUBusy):
# the run collected counters per dispatch, which serializes the dispatches (rocprof-compute's
# profile-mode docs: counters "with kernel dispatch association ... requires serializing kernel
# dispatches"), so the timeline is marked as _SERIALIZED variants are.
_V1_V2_RECORD_COLUMNS = frozenset({
    "Index", "KernelName", "gpu-id", "queue-id", "queue-index", "pid", "tid", "grd", "wgr", "lds", "scr",
    "arch_vgpr", "vgpr", "accum_vgpr", "sgpr", "fbar", "wave_size", "sig", "obj", "DispatchNs", "BeginNs", "EndNs",
    "CompleteNs", "DurationNs",
    "Dispatch_ID", "GPU_ID", "Queue_ID", "Queue_Index", "PID", "TID", "GRD", "WGR", "LDS", "SCR", "Arch_VGPR",
    "ACCUM_VGPR", "Accum_VGPR", "SGPR", "Wave_Size", "SIG", "OBJ", "Kernel_Name", "Start_Timestamp",
    "End_Timestamp", "Correlation_ID", "Grid_Size", "Workgroup_Size", "LDS_Per_Workgroup",
    "Scratch_Per_Workitem", "Node_Id",
})


def counter_columns(cols: list[str], variant: str) -> list[str]:
    """The counter/metric columns of a rocprof v1 or rocprofv2 kernel CSV, in header order
    (empty for a plain kernel trace, and for the other variants, which name their own kind)."""
    if variant not in ("rocprof v1", "rocprofv2"):
        return []
    return [c for c in cols if c and c not in _V1_V2_RECORD_COLUMNS]


# canonical column -> header names it appears under, in order of preference
_ALIASES: dict[str, tuple[str, ...]] = {
    "name": ("Kernel_Name", "KernelName"),
    "device": ("Agent_Id", "GPU_ID", "gpu-id", "Node_Id"),
    "queue": ("Queue_Id", "Queue_ID", "queue-id"),
    "stream": ("Stream_Id",),
    "thread": ("Thread_Id", "TID", "tid"),
    "correlation": ("Correlation_Id", "Correlation_ID"),
    "dispatch": ("Dispatch_Id", "Dispatch_ID", "Index"),
    "start": ("Start_Timestamp", "BeginNs"),
    "end": ("End_Timestamp", "EndNs"),
    "grid_total": ("Grid_Size", "GRD", "grd"),
    "wg_total": ("Workgroup_Size", "WGR", "wgr"),
    "grid_x": ("Grid_Size_X",),
    "grid_y": ("Grid_Size_Y",),
    "grid_z": ("Grid_Size_Z",),
    "wg_x": ("Workgroup_Size_X",),
    "wg_y": ("Workgroup_Size_Y",),
    "wg_z": ("Workgroup_Size_Z",),
    "lds": ("Group_Segment_Size", "LDS_Block_Size", "LDS_Per_Workgroup", "LDS", "lds"),
    "vgpr": ("VGPR_Count", "Arch_VGPR_Count", "Arch_VGPR", "arch_vgpr", "vgpr"),
    "counter": ("Counter_Name",),
}

# Files these tools write beside the kernel trace: recognised so the error can say what to pass.
_COMPANIONS: tuple[tuple[frozenset[str], str], ...] = (
    (frozenset({"Name", "Calls", "TotalDurationNs", "AverageNs", "Percentage"}), "a per-kernel summary (stats) file"),
    (frozenset({"Node_Id", "Logical_Node_Id", "Agent_Type"}), "rocprofv3's agent information"),
    (frozenset({"Domain", "Function", "Correlation_Id"}), "a rocprofv3 API trace (host calls, no kernels)"),
    (frozenset({"Domain", "Function", "Correlation_ID"}), "a rocprofv2 API trace (host calls, no kernels)"),
    (frozenset({"Direction", "Source_Agent_Id", "Destination_Agent_Id"}), "a rocprofv3 memory-copy trace"),
)
_LABELLED_ID = re.compile(r"^\s*(?:[A-Za-z]+\s*)?(-?\d+)\s*$")


def _header(head: bytes) -> list[str] | None:
    text = head.decode("utf-8", errors="replace").lstrip("\ufeff")
    for line in text.splitlines():
        if line.strip():
            try:
                return [c.strip() for c in next(csv.reader([line]))]
            except (csv.Error, StopIteration):
                return None
    return None


def _variant(cols: set[str], name: str = "") -> str | None:
    """The tool that wrote a kernel CSV with these columns (`name`: the file's name), or None."""
    if "KernelName" in cols and ("grd" in cols or "BeginNs" in cols):
        variant = "rocprof v1"
    elif "Kernel_Name" in cols and ("GPU_ID" in cols or "Dispatch_ID" in cols):
        variant = "rocprofv2"
    elif "Kernel_Name" in cols and "Start_Timestamp" in cols:
        variant = "rocprofv3 counter_collection" if "Counter_Name" in cols else "rocprofv3 kernel_trace"
    else:
        return None
    # rocprof-compute keeps the layout of the rocprof it ran, under its own file name; its
    # rocpd path writes rocprofv2's column names in rocprofv3's long form (one row per counter)
    if "pmc_perf" in name.lower() or (variant == "rocprofv2" and "Counter_Name" in cols):
        return ROCPROF_COMPUTE
    return variant


def _companion(cols: set[str]) -> str | None:
    for needed, what in _COMPANIONS:
        if needed <= cols:
            return what
    return None


def sniff(path: Path, head: bytes) -> bool:
    if head.lstrip()[:1] in (b"{", b"[") or b"\x00" in head[:4096]:
        return False
    cols = _header(head)
    if not cols:
        return False
    cols_set = set(cols)
    return _variant(cols_set) is not None or _companion(cols_set) is not None


def read(path: Path, *, rank: int, cache_dir: Path | None = None) -> Trace:
    data = read_bytes(path)  # gunzipped when gzip, whatever the name
    header = _header(data[: 64 << 10]) or []
    cols = set(header)
    variant = _variant(cols, path.name)
    if variant is None:
        what = _companion(cols) or "a CSV without rocprof kernel columns"
        hint = "results.csv" if "stats" in what else "the *_kernel_trace.csv (rocprofv3) or results.csv (rocprof v1)"
        raise TraceError(f"{path.name}: this is {what}, not a kernel trace; pass {hint} instead")
    df = _read_frame(path, data)
    notes: list[str] = []
    if len(df) and not data.rstrip(b" \t").endswith((b"\n", b"\r")):
        # The tools end every row with a newline: a last row without one was cut short, and
        # its last field may be a cut number. Drop it rather than trust it.
        df = df.iloc[:-1]
        notes.append("the file ends mid-row (truncated?): its last row was skipped")
    kernels, devices = kernel_frames(df, path=path, variant=variant, rank=rank, notes=notes)
    meta: dict[str, Any] = {"format": FORMAT, "variant": variant, "notes": notes}
    counters = counter_columns(header, variant)
    why = _SERIALIZED.get(variant)
    if counters:
        shown = ", ".join(counters[:4]) + (f" and {len(counters) - 4} more" if len(counters) > 4 else "")
        why = f"{variant} with counter columns ({shown}); per-dispatch counters serialize kernel dispatches"
    if why:
        meta["serialized_ranks"] = [rank]
        notes.append(
            f"{path.name} is a counter-collection file ({why}): the GPU ran one kernel at a time, "
            "so the gaps and stream overlaps of this timeline are the profiler's, not the program's; GPU idle, "
            "launch-gap and overlap findings are not made for it, and kernel times are those of kernels running "
            "alone. For the program's own timeline, trace without counters (rocprofv3 --kernel-trace)"
        )
    return Trace.build(meta=meta, kernels=kernels, devices=devices)


def kernel_frames(
    df: pd.DataFrame, *, path: Path, variant: str, rank: int, notes: list[str]
) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(kernels, devices) from rows of rocprof kernel columns as text (`df`: a kernel CSV, or
    the kernel events' args of rocprof v1's results.json, which are results.csv's columns)."""
    col = {key: _find(df, names) for key, names in _ALIASES.items()}
    if col["start"] is None or col["end"] is None:
        raise TraceError(
            f"{path.name}: {variant} kernel records without timestamps (BeginNs/EndNs or Start/End_Timestamp); "
            "re-run the profiler with timestamps on (rocprof --timestamp on, or rocprofv3 --kernel-trace)"
        )
    if col["counter"] is not None and col["dispatch"] is not None:
        # long form, one row per dispatch and counter (pass): one kernel per dispatch and GPU
        df = df.drop_duplicates(subset=[c for c in (col["dispatch"], col["device"]) if c is not None], keep="first")

    start = _int_exact(df[col["start"]])
    end = _int_exact(df[col["end"]])
    if variant == ROCPROF_COMPUTE:  # averages over counter passes may have fractions
        start, end = _rounded(df[col["start"]], start), _rounded(df[col["end"]], end)
    bad = start.isna() | end.isna() | (end < start)
    if bad.any():
        notes.append(f"{int(bad.sum())} row(s) without valid start/end timestamps were skipped (truncated file?)")
        df, start, end = df[~bad], start[~bad], end[~bad]
    kernels = _kernels(df, col, start.astype("int64"), end.astype("int64"), rank, notes)
    if col["lds"] is not None and col["lds"].lower() == "lds_block_size":
        notes.append(
            "LDS_Block_Size is each kernel's static LDS only (rocprofv3 takes it from the code object): LDS given "
            "at launch (dynamic, as Triton kernels take it) is unknown, so occupancy counts static LDS alone and may "
            "overstate workgroups per CU for such kernels; rocprofv3's JSON or rocpd output has each dispatch's total"
        )
    gpu_indexed = col["device"] is not None and df[col["device"]].str.strip().str.upper().str.startswith("GPU").any()
    devices = _devices(path, kernels, rank, gpu_indexed, notes)
    return kernels, devices


# ---------------------------------------------------------------------------------------------


def _read_frame(path: Path, data: bytes) -> pd.DataFrame:
    try:
        df = pd.read_csv(
            io.BytesIO(data), dtype=str, keep_default_na=False, skipinitialspace=True, encoding_errors="replace"
        )
    except (pd.errors.ParserError, pd.errors.EmptyDataError, csv.Error, ValueError) as exc:
        msg = " ".join(str(exc).split())
        raise TraceError(f"{path.name}: corrupt or truncated CSV ({msg})") from None
    df.columns = [c.strip() for c in df.columns]
    return df


def _find(df: pd.DataFrame, names: tuple[str, ...]) -> str | None:
    for n in names:
        if n in df.columns:
            return n
    lower = {c.lower(): c for c in df.columns}
    for n in names:
        if n.lower() in lower:
            return lower[n.lower()]
    return None


def _int_exact(s: pd.Series) -> pd.Series:
    """Int64 from text without a float detour (nanosecond timestamps exceed 2**53); cells
    that are not whole numbers within int64 become <NA>."""
    text = s.astype(str).str.strip()
    ok = text.str.fullmatch(r"-?\d{1,19}").fillna(False).to_numpy(dtype=bool, copy=True)
    # 19 digits may exceed int64 (9223372036854775807): same-length digit strings compare
    # like the numbers they spell, so such values are refused without parsing them.
    digits = text.str.lstrip("-")
    too_big = ((digits.str.len() == 19) & (digits > "9223372036854775807")).fillna(False).to_numpy(dtype=bool)
    ok &= ~too_big
    values = np.zeros(len(text), dtype="int64")
    if ok.any():
        values[ok] = text[ok].astype("int64").to_numpy()
    return pd.Series(pd.arrays.IntegerArray(values, ~ok), index=s.index)


def _rounded(text: pd.Series, exact: pd.Series) -> pd.Series:
    """`exact` (from `_int_exact`) with its gaps filled by `text` read as a number and rounded
    to whole ns ("2414192765353337.5", "2.4141927653533375e+15")."""
    gaps = exact.isna().to_numpy(dtype=bool)
    if not gaps.any():
        return exact
    out = exact.copy()
    out[gaps] = to_int(text[gaps].str.strip()).to_numpy()
    return out


def _num(df: pd.DataFrame, c: str | None) -> pd.Series:
    if c is None:
        return pd.Series(pd.NA, index=df.index, dtype="Int64")
    return to_int(df[c].str.strip().replace("", None))


def _device_ids(df: pd.DataFrame, c: str | None) -> pd.Series:
    """'2', 'Agent 2', 'GPU 0' -> 2, 2, 0."""
    if c is None:
        return pd.Series(pd.NA, index=df.index, dtype="Int64")
    return to_int(df[c].str.extract(_LABELLED_ID, expand=False))


def _kernels(df: pd.DataFrame, col: dict, start: pd.Series, end: pd.Series, rank: int, notes: list[str]) -> pd.DataFrame:
    n = len(df)
    if col["grid_x"] is not None and col["wg_x"] is not None:
        wg = [_num(df, col[k]) for k in ("wg_x", "wg_y", "wg_z")]
        items = [_num(df, col[k]) for k in ("grid_x", "grid_y", "grid_z")]
        # A missing Y/Z column means a 1-D launch.
        wg = [w if col[k] is not None else pd.Series(1, index=df.index, dtype="Int64") for w, k in zip(wg, ("wg_x", "wg_y", "wg_z"))]
        items = [g if col[k] is not None else pd.Series(1, index=df.index, dtype="Int64") for g, k in zip(items, ("grid_x", "grid_y", "grid_z"))]
        grid = [workgroups(g, w) for g, w in zip(items, wg)]
        block = wg
    elif col["grid_total"] is not None and col["wg_total"] is not None:
        wg_total = _num(df, col["wg_total"])
        one = pd.Series(1, index=df.index, dtype="Int64")
        grid = [workgroups(_num(df, col["grid_total"]), wg_total), one, one.copy()]
        block = [wg_total, one.copy(), one.copy()]
        notes.append("the trace gives grid and workgroup sizes as totals: grid reported 1-D as ceil(grid / workgroup) workgroups")
    else:
        na = pd.Series(pd.NA, index=df.index, dtype="Int64")
        grid = [na, na.copy(), na.copy()]
        block = [na.copy(), na.copy(), na.copy()]
        notes.append("the trace has no grid/workgroup sizes")
    names = [strip_kd(x) if x else None for x in df[col["name"]].tolist()]
    stream = _num(df, col["stream"]) if col["stream"] is not None else _num(df, col["queue"])
    return pd.DataFrame(
        {
            "rank": np.full(n, rank, dtype="int64"),
            "device_id": _device_ids(df, col["device"]).to_numpy(),
            "stream_id": stream.to_numpy(),
            "correlation_id": _num(df, col["correlation"]).to_numpy(),
            "start_ns": start.to_numpy(),
            "end_ns": end.to_numpy(),
            "dur_ns": (end - start).to_numpy(),
            "name": names,
            "short_name": short_names(names),
            "grid_x": grid[0].to_numpy(),
            "grid_y": grid[1].to_numpy(),
            "grid_z": grid[2].to_numpy(),
            "block_x": block[0].to_numpy(),
            "block_y": block[1].to_numpy(),
            "block_z": block[2].to_numpy(),
            "grid_blocks": (grid[0] * grid[1] * grid[2]).to_numpy(),
            "block_threads": (block[0] * block[1] * block[2]).to_numpy(),
            "registers_per_thread": _num(df, col["vgpr"]).to_numpy(),
            "static_smem_bytes": _num(df, col["lds"]).to_numpy(),
        }
    )


def _agent_info(path: Path) -> dict[tuple[str, int], dict[str, str]]:
    """rows of the companion `*agent_info.csv` keyed by ("node", Node_Id) and ("gpu", index)."""
    name = path.name
    if "kernel_trace" not in name:
        return {}
    sibling = path.with_name(name.replace("kernel_trace", "agent_info"))
    if not sibling.is_file():
        return {}
    try:
        with open(sibling, newline="", encoding="utf-8", errors="replace") as fh:
            rows = list(csv.DictReader(fh))
    except (OSError, csv.Error):
        return {}
    out: dict[tuple[str, int], dict[str, str]] = {}
    gpus = []
    for r in rows:
        m = _LABELLED_ID.match(str(r.get("Node_Id", "")))
        if not m:
            continue
        out[("node", int(m.group(1)))] = r
        if str(r.get("Agent_Type", "")).strip().upper() == "GPU":
            gpus.append((int(m.group(1)), r))
    for i, (_, r) in enumerate(sorted(gpus, key=lambda t: t[0])):
        out[("gpu", i)] = r
    return out


def _pos(value: Any) -> int | None:
    try:
        v = int(str(value).strip())
    except (TypeError, ValueError):
        return None
    return v if v > 0 else None


def _devices(path: Path, kernels: pd.DataFrame, rank: int, gpu_indexed: bool, notes: list[str]) -> pd.DataFrame | None:
    """One row per device id. `gpu_indexed`: ids count GPUs (`GPU N` labels), else they are
    HSA node ids (plain numbers, `Agent N`)."""
    ids = sorted(int(d) for d in kernels["device_id"].dropna().unique())
    if not ids:
        return None
    agents = _agent_info(path)
    rows = []
    for d in ids:
        row: dict[str, Any] = {"rank": rank, "device_id": d, "vendor": "amd"}
        a = agents.get(("gpu" if gpu_indexed else "node", d))
        if a is not None:
            gfx = (a.get("Name") or "").strip()
            row.update(
                name=(a.get("Product_Name") or "").strip() or gfx or None,
                arch=gfx if gfx.startswith("gfx") else gfx_name(a.get("Gfx_Target_Version")),
                sm_count=_pos(a.get("Cu_Count")),
                warp_size=_pos(a.get("Wave_Front_Size")),
                max_warps_per_sm=_pos(a.get("Max_Waves_Per_Cu")),
                max_threads_per_block=_pos(a.get("Workgroup_Max_Size")),
            )
            lds_kb = _pos(a.get("Lds_Size_In_Kb"))
            if lds_kb:
                row["smem_per_sm_bytes"] = lds_kb * 1024
        rows.append(row)
    if agents:
        notes.append(f"device details from {path.name.replace('kernel_trace', 'agent_info')}")
    return pd.DataFrame(rows)
