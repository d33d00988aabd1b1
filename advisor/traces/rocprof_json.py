"""rocprofv3 JSON (`rocprofv3 --output-format json`, `*_results.json`, plain or gzip).

Layout (rocprofiler-sdk `source/lib/output/generateJSON.cpp`): `{"rocprofiler-sdk-tool":
[process, ...]}`, one entry per profiled process, each with
- `agents`: HSA agents, CPUs included; GPUs have `type` 2 and carry `cu_count`,
  `wave_front_size`, `max_waves_per_cu`, `lds_size_in_kb`, `name` (gfx target) and
  `product_name`; `id` is an agent handle (`{"handle": N}`).
- `kernel_symbols`: `kernel_id` -> names (`formatted_kernel_name` is demangled without the
  `[clone .kd]` tail; `truncated_kernel_name` is the bare function name), static
  `group_segment_size` (LDS), `arch_vgpr_count`, `sgpr_count`...
- `buffer_records.kernel_dispatch`: `start_timestamp`/`end_timestamp` (ns),
  `correlation_id.internal`, `thread_id`, `stream_id` and `dispatch_info` (`agent_id`,
  `queue_id`, `kernel_id`, `workgroup_size` and `grid_size` as {x, y, z}, `group_segment_size`
  = static + dynamic LDS of the dispatch).
- `buffer_records.hip_api`, `memory_copy`, `marker_api` when those traces were on, with
  operation names in `strings.buffer_records[kind].operations[operation]` and roctx messages
  in `strings.marker_api` ([{key: correlation id, value: text}]).

Conversions: grid_size counts work-items, so grid = ceil(grid_size / workgroup_size) per
dimension (workgroups). LDS: the symbol's static size goes to `static_smem_bytes`, the rest
of the dispatch's group segment to `dynamic_smem_bytes`. A MEMORY_COPY_DEVICE_TO_DEVICE between two
different GPUs is kind PtoP (CUPTI's name for a peer copy, which nsys and Kineto traces carry). Devices are GPU agents only, one
row per GPU that ran kernels or copies (all GPUs when none did), numbered by `gpu_index`
(the HIP device ordinal); `device_id` in the other frames uses the same numbering. A file
with several processes reads them all into this rank. HIP API calls go to the runtime frame,
roctx ranges to the nvtx frame (domain "roctx").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from ..errors import TraceError
from ..model import Trace
from ._amd import agent_device_row, copy_kind, gpu_frame, workgroups
from ._jsonio import as_dict, as_list, handle, key, load_json, to_int
from ._names import short_name, strip_kd

FORMAT = "rocprofv3-json"
DESCRIPTION = "rocprofv3 JSON (results.json)"

_GPU = 2  # ROCPROFILER_AGENT_TYPE_GPU
_COPY_KINDS = {
    "MEMORY_COPY_HOST_TO_HOST": "HtoH",
    "MEMORY_COPY_HOST_TO_DEVICE": "HtoD",
    "MEMORY_COPY_DEVICE_TO_HOST": "DtoH",
    "MEMORY_COPY_DEVICE_TO_DEVICE": "DtoD",
}


def sniff(path: Path, head: bytes) -> bool:
    return head.lstrip()[:1] == b"{" and b'"rocprofiler-sdk-tool"' in head


def read(path: Path, *, rank: int, cache_dir: Path | None = None) -> Trace:
    doc = load_json(path, "rocprofv3")
    procs = doc.get("rocprofiler-sdk-tool") if isinstance(doc, dict) else None
    if not isinstance(procs, list) or not all(isinstance(p, dict) for p in procs):
        raise TraceError(f"{path.name}: JSON without a rocprofiler-sdk-tool list (not rocprofv3 JSON output)")
    notes: list[str] = []
    parts: dict[str, list[pd.DataFrame]] = {k: [] for k in ("kernels", "runtime", "memcpy", "nvtx")}
    agents: dict[Any, dict] = {}
    gpu_ids: dict[Any, int] = {}
    for proc in procs:
        a, g = _agents(proc)
        agents.update(a)
        gpu_ids.update(g)
        ops = _operation_names(proc)
        buf = as_dict(proc.get("buffer_records"))
        parts["kernels"].append(_kernels(proc, as_list(buf.get("kernel_dispatch")), gpu_ids, rank, notes))
        parts["runtime"].append(_api(as_list(buf.get("hip_api")), ops, rank))
        parts["memcpy"].append(_copies(as_list(buf.get("memory_copy")), ops, agents, gpu_ids, rank))
        parts["nvtx"].append(_markers(proc, as_list(buf.get("marker_api")), rank))
    frames = {k: pd.concat(v, ignore_index=True) if v else None for k, v in parts.items()}
    frames["devices"] = _devices(agents, gpu_ids, frames["kernels"], frames["memcpy"], rank)
    meta = {"format": FORMAT, "notes": notes, "processes": len(procs)}
    return Trace.build(meta=meta, **frames)


# ---------------------------------------------------------------------------------------------


def _agents(proc: dict) -> tuple[dict[Any, dict], dict[Any, int]]:
    """{agent handle: agent} and {GPU agent handle: device id}."""
    agents: dict[Any, dict] = {}
    gpus: list[tuple[Any, dict]] = []
    for a in as_list(proc.get("agents")):
        if not isinstance(a, dict):
            continue
        h = handle(a.get("id"))
        agents[h] = a
        if a.get("type") == _GPU:
            gpus.append((h, a))
    ids: dict[Any, int] = {}
    order = sorted(gpus, key=lambda t: (t[1].get("node_id", 0) if isinstance(t[1].get("node_id"), int) else 0))
    for i, (h, a) in enumerate(order):
        idx = a.get("gpu_index")
        if not isinstance(idx, int) or idx < 0:
            idx = a.get("logical_node_type_id")
        ids[h] = idx if isinstance(idx, int) and idx >= 0 else i
    return agents, ids


def _operation_names(proc: dict) -> list[list[str]]:
    """strings.buffer_records[kind].operations, indexed by kind id."""
    kinds = as_list(as_dict(proc.get("strings")).get("buffer_records"))
    return [as_list(k.get("operations")) if isinstance(k, dict) else [] for k in kinds]


def _op_name(ops: list[list[str]], kind: Any, op: Any) -> str | None:
    if not isinstance(kind, int) or not isinstance(op, int) or kind < 0 or op < 0:
        return None
    try:
        name = ops[kind][op]
    except IndexError:
        return None
    return name if isinstance(name, str) else None


def _symbols(proc: dict) -> dict[Any, dict]:
    out = {}
    for s in as_list(proc.get("kernel_symbols")):
        if isinstance(s, dict):
            out[key(s.get("kernel_id"))] = s
    return out


def _describe(s: dict) -> tuple[str | None, str | None]:
    """(name, short name) of a kernel symbol: the demangled name without `[clone .kd]`, and
    rocprofiler's `truncated_kernel_name` (else our own cut of the name)."""
    name = None
    for key in ("formatted_kernel_name", "demangled_kernel_name", "kernel_name"):
        v = s.get(key)
        if isinstance(v, str) and v:
            name = strip_kd(v)
            break
    t = s.get("truncated_kernel_name")
    if isinstance(t, str) and t:
        short = strip_kd(t)
    else:
        short = short_name(name) if name else None
    return name, short


def _xyz(values: list, axis: str) -> list:
    return [v.get(axis) if isinstance(v, dict) else None for v in values]


def _kernels(proc: dict, records: list, gpu_ids: dict, rank: int, notes: list[str]) -> pd.DataFrame:
    recs = [r for r in records if isinstance(r, dict)]
    info = [r.get("dispatch_info") if isinstance(r.get("dispatch_info"), dict) else {} for r in recs]
    syms = _symbols(proc)
    sym = [syms.get(key(i.get("kernel_id"))) for i in info]
    described = {id(s): _describe(s) for s in syms.values()}
    none = (None, None)
    start = to_int([r.get("start_timestamp") for r in recs])
    end = to_int([r.get("end_timestamp") for r in recs])
    bad = (start.isna() | end.isna() | (end < start)).to_numpy(dtype=bool)
    if bad.any():
        notes.append(f"{int(bad.sum())} kernel dispatch(es) without valid timestamps were skipped")
    names, short = [], []
    for s in sym:
        n, sn = described.get(id(s), none) if s is not None else none
        names.append(n)
        short.append(sn)
    missing = sum(1 for n in names if n is None)
    if missing:
        notes.append(f"{missing} dispatch(es) name a kernel_id missing from kernel_symbols")
    wg = [to_int(_xyz([i.get("workgroup_size") for i in info], a)) for a in "xyz"]
    items = [to_int(_xyz([i.get("grid_size") for i in info], a)) for a in "xyz"]
    grid = [workgroups(g, w) for g, w in zip(items, wg)]
    static = to_int([s.get("group_segment_size") if s else None for s in sym])
    total = to_int([i.get("group_segment_size") for i in info])
    dynamic = (total - static).where(total >= static)
    streams = [handle(r.get("stream_id")) if "stream_id" in r else handle(i.get("queue_id")) for r, i in zip(recs, info)]
    df = gpu_frame(
        rank,
        to_int([gpu_ids.get(handle(i.get("agent_id"))) for i in info]),
        to_int(streams),
        to_int([_internal(r.get("correlation_id")) for r in recs]),
        start,
        end,
        grid=grid,
        block=wg,
        name=names,
        short_name=short,
        registers_per_thread=to_int([s.get("arch_vgpr_count") if s else None for s in sym]),
        static_smem_bytes=static,
        dynamic_smem_bytes=dynamic,
    )
    return df[~bad].reset_index(drop=True)


def _internal(corr: Any) -> Any:
    """correlation_id is {"internal": N, "external": ...} in rocprofv3 JSON."""
    if isinstance(corr, dict):
        corr = corr.get("internal")
    return key(corr)


def _api(records: list, ops: list[list[str]], rank: int) -> pd.DataFrame:
    recs = [r for r in records if isinstance(r, dict)]
    start = to_int([r.get("start_timestamp") for r in recs])
    end = to_int([r.get("end_timestamp") for r in recs])
    df = pd.DataFrame(
        {
            "rank": rank,
            "thread_id": to_int([r.get("thread_id") for r in recs]),
            "correlation_id": to_int([_internal(r.get("correlation_id")) for r in recs]),
            "start_ns": start,
            "end_ns": end,
            "dur_ns": end - start,
            "name": [_op_name(ops, r.get("kind"), r.get("operation")) for r in recs],
        }
    )
    return df[(start.notna() & end.notna()).to_numpy(dtype=bool)].reset_index(drop=True)


def _copies(records: list, ops: list[list[str]], agents: dict, gpu_ids: dict, rank: int) -> pd.DataFrame:
    recs = [r for r in records if isinstance(r, dict)]
    start = to_int([r.get("start_timestamp") for r in recs])
    end = to_int([r.get("end_timestamp") for r in recs])
    kinds, devices = [], []
    for r in recs:
        op = _op_name(ops, r.get("kind"), r.get("operation")) or ""
        dst, src = handle(r.get("dst_agent_id")), handle(r.get("src_agent_id"))
        kinds.append(copy_kind(_COPY_KINDS.get(op, "unknown"), gpu_ids.get(src), gpu_ids.get(dst)))
        devices.append(gpu_ids.get(dst, gpu_ids.get(src)))
    df = gpu_frame(
        rank,
        to_int(devices),
        to_int([handle(r.get("stream_id")) for r in recs]),
        to_int([_internal(r.get("correlation_id")) for r in recs]),
        start,
        end,
        op="memcpy",
        kind=kinds,
        bytes=to_int([r.get("bytes") for r in recs]),
    )
    return df[(start.notna() & end.notna()).to_numpy(dtype=bool)].reset_index(drop=True)


def _markers(proc: dict, records: list, rank: int) -> pd.DataFrame:
    """roctx ranges and marks: records whose correlation id has a message."""
    messages = {}
    for m in as_list(as_dict(proc.get("strings")).get("marker_api")):
        if isinstance(m, dict) and key(m.get("key")) is not None:
            value = m.get("value")
            messages[key(m["key"])] = value if isinstance(value, str) else None
    recs = [r for r in records if isinstance(r, dict) and _internal(r.get("correlation_id")) in messages]
    start = to_int([r.get("start_timestamp") for r in recs])
    end = to_int([r.get("end_timestamp") for r in recs])
    df = pd.DataFrame(
        {
            "rank": rank,
            "thread_id": to_int([r.get("thread_id") for r in recs]),
            "start_ns": start,
            "end_ns": end,
            "dur_ns": end - start,
            "text": [messages[_internal(r.get("correlation_id"))] for r in recs],
            "domain": "roctx",
        }
    )
    return df[(start.notna() & end.notna()).to_numpy(dtype=bool)].reset_index(drop=True)


def _devices(agents: dict, gpu_ids: dict, kernels: pd.DataFrame | None, memcpy: pd.DataFrame | None, rank: int):
    used: set[int] = set()
    for df in (kernels, memcpy):
        if df is not None and len(df):
            used.update(int(d) for d in df["device_id"].dropna().unique())
    rows = []
    for h, dev in sorted(gpu_ids.items(), key=lambda t: t[1]):
        if used and dev not in used:
            continue
        rows.append(agent_device_row(agents[h], dev, rank))
    return pd.DataFrame(rows) if rows else None

