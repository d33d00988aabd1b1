"""Small trace files of every format, written by hand for the bad-input, untouched-input and
hostile-trace tests (and the fuzzers, which mutate them).

Each builder writes one valid file whose contents the test knows: column sets follow the
real tools (nsys 2024+ `CUPTI_ACTIVITY_KIND_KERNEL`, Kineto `traceEvents` with
`deviceProperties`, rocprofv3 `kernel_trace.csv` and JSON, rocpd tables), reduced to what the
readers use. Callers pass the hostile or broken parts they are testing.
"""

from __future__ import annotations

import csv
import gzip
import json
import sqlite3
from pathlib import Path
from typing import Any, Iterable

H100_PROPS = {
    "id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0, "numSms": 132,
    "warpSize": 32, "maxThreadsPerMultiprocessor": 2048, "maxThreadsPerBlock": 1024,
    "regsPerMultiprocessor": 65536, "regsPerBlock": 65536, "sharedMemPerMultiprocessor": 233472,
    "sharedMemPerBlockOptin": 232448,
}

# A tail-heavy GEMM on 132 SMs (DESIGN.md): 1664x1408 with 128x128 tiles is 13x11 = 143 tiles,
# 1.08 waves. Used wherever a test needs findings with a shape.
TAIL = {"M": 1664, "N": 1408, "K": 8192, "grid": (11, 13, 1)}


# ------------------------------------------------------------------------------- Kineto JSON


def kineto_gemm_events(n: int = 6, kernel_name: str = "gemm_kernel", annotation: str | None = None,
                       dur_us: float = 500.0, op: str = "aten::mm") -> list[dict]:
    """`n` GEMM launches of the TAIL shape: a cpu_op with Input Dims enclosing the launch call,
    the kernel (same correlation id), and optionally a user annotation around both."""
    evs: list[dict] = []
    for i in range(n):
        t = 1000.0 * i
        if annotation is not None:
            evs.append({"ph": "X", "cat": "user_annotation", "name": annotation, "pid": 1, "tid": 1, "ts": t, "dur": 900.0})
        evs.append({"ph": "X", "cat": "cpu_op", "name": op, "pid": 1, "tid": 1, "ts": t + 1, "dur": 50.0,
                    "args": {"Input Dims": [[TAIL["M"], TAIL["K"]], [TAIL["K"], TAIL["N"]]],
                             "Input type": ["c10::BFloat16", "c10::BFloat16"]}})
        evs.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": t + 2,
                    "dur": 5.0, "args": {"correlation": i + 1}})
        evs.append({"ph": "X", "cat": "kernel", "name": kernel_name, "pid": 0, "tid": 7, "ts": t + 10, "dur": dur_us,
                    "args": {"device": 0, "stream": 7, "correlation": i + 1, "grid": list(TAIL["grid"]),
                             "block": [256, 1, 1], "registers per thread": 128, "shared memory": 65536}})
    return evs


def kineto_doc(events: list[dict] | None = None, **top: Any) -> dict:
    doc = {"schemaVersion": 1, "deviceProperties": [H100_PROPS], **top}
    doc["traceEvents"] = events if events is not None else kineto_gemm_events()
    return doc


def write_kineto(path: Path, doc: dict | None = None, gz: bool = False) -> Path:
    data = json.dumps(doc if doc is not None else kineto_doc()).encode()
    path.write_bytes(gzip.compress(data, mtime=0) if gz else data)
    return path


# ------------------------------------------------------------------------ Nsight Systems SQLite

KERNEL_DECLS = [
    "start INTEGER NOT NULL", "end INTEGER NOT NULL", "deviceId INTEGER NOT NULL", "contextId INTEGER NOT NULL",
    "greenContextId INTEGER", "streamId INTEGER NOT NULL", "correlationId INTEGER", "globalPid INTEGER",
    "demangledName INTEGER NOT NULL", "shortName INTEGER NOT NULL", "mangledName INTEGER", "launchType INTEGER",
    "cacheConfig INTEGER", "registersPerThread INTEGER NOT NULL", "gridX INTEGER NOT NULL", "gridY INTEGER NOT NULL",
    "gridZ INTEGER NOT NULL", "blockX INTEGER NOT NULL", "blockY INTEGER NOT NULL", "blockZ INTEGER NOT NULL",
    "staticSharedMemory INTEGER NOT NULL", "dynamicSharedMemory INTEGER NOT NULL", "localMemoryPerThread INTEGER NOT NULL",
    "localMemoryTotal INTEGER NOT NULL", "gridId INTEGER NOT NULL", "sharedMemoryExecuted INTEGER", "graphNodeId INTEGER",
    "sharedMemoryLimitConfig INTEGER",
]
RUNTIME_DECLS = ["start INTEGER NOT NULL", "end INTEGER NOT NULL", "eventClass INTEGER NOT NULL", "globalTid INTEGER",
                 "correlationId INTEGER", "nameId INTEGER NOT NULL", "returnValue INTEGER NOT NULL", "callchainId INTEGER"]
NVTX_DECLS = ["start INTEGER NOT NULL", "end INTEGER", "eventType INTEGER NOT NULL", "rangeId INTEGER", "category INTEGER",
              "color INTEGER", "text TEXT", "globalTid INTEGER", "endGlobalTid INTEGER", "textId INTEGER",
              "domainId INTEGER", "uint64Value INTEGER", "int64Value INTEGER", "doubleValue REAL", "uint32Value INTEGER",
              "int32Value INTEGER", "floatValue REAL", "jsonTextId INTEGER", "jsonText TEXT"]
GPU_DECLS = ["vmId INTEGER NOT NULL", "id INTEGER NOT NULL", "name TEXT", "busLocation TEXT", "isDiscrete INTEGER",
             "l2CacheSize INTEGER", "memoryBandwidth INTEGER", "smCount INTEGER", "cuDevice INTEGER",
             "maxRegistersPerBlock INTEGER", "maxShmemPerBlockOptin INTEGER", "maxShmemPerSm INTEGER",
             "maxRegistersPerSm INTEGER", "threadsPerWarp INTEGER", "maxWarpsPerSm INTEGER", "maxBlocksPerSm INTEGER",
             "maxThreadsPerBlock INTEGER", "computeMajor INTEGER", "computeMinor INTEGER"]
H100_GPU = {"vmId": 0, "id": 0, "cuDevice": 0, "name": "NVIDIA H100 80GB HBM3", "busLocation": "0000:1b:00.0",
            "smCount": 132, "computeMajor": 9, "computeMinor": 0, "maxWarpsPerSm": 64, "maxBlocksPerSm": 32,
            "maxShmemPerSm": 233472, "maxShmemPerBlockOptin": 232448, "maxRegistersPerSm": 65536,
            "maxRegistersPerBlock": 65536, "threadsPerWarp": 32, "maxThreadsPerBlock": 1024,
            "l2CacheSize": 52428800, "memoryBandwidth": 3352320000000}
GLOBAL_TID = (4242 << 24) | 4242
PUSH_POP = 59


def nsys_kernel(start: int, dur: int, name_id: int, short_id: int, corr: int, **kw: Any) -> dict:
    row = {"start": start, "end": start + dur, "deviceId": 0, "contextId": 1, "streamId": 7, "correlationId": corr,
           "globalPid": 4242 << 24, "demangledName": name_id, "shortName": short_id, "registersPerThread": 128,
           "gridX": TAIL["grid"][0], "gridY": TAIL["grid"][1], "gridZ": 1, "blockX": 256, "blockY": 1, "blockZ": 1,
           "staticSharedMemory": 0, "dynamicSharedMemory": 65536, "localMemoryPerThread": 0, "localMemoryTotal": 0,
           "gridId": corr}
    row.update(kw)
    return row


def write_db(path: Path, tables: dict[str, tuple[list[str], Iterable]]) -> Path:
    """A SQLite file with `tables`: name -> (column declarations, rows as dicts or tuples)."""
    conn = sqlite3.connect(path)
    for name, (decls, rows) in tables.items():
        conn.execute(f'CREATE TABLE "{name}" ({", ".join(decls)})')
        names = [d.split()[0] for d in decls]
        tuples = [tuple(r.get(n) for n in names) if isinstance(r, dict) else tuple(r) for r in rows]
        if tuples:
            conn.executemany(f'INSERT INTO "{name}" VALUES ({", ".join("?" * len(names))})', tuples)
    conn.commit()
    conn.close()
    return path


def nsys_tables(n: int = 6, kernel_name: str = "void gemm_kernel<128, 128, 64>(Params)", short_name: str = "gemm_kernel",
                nvtx_text: str | None = None) -> dict[str, tuple[list[str], list]]:
    """Tables of a small nsys export: `n` TAIL GEMM launches, each inside an NVTX push/pop range
    in advisor's convention (so the shape is known) unless `nvtx_text` replaces the text."""
    strings = [(1, kernel_name), (2, short_name), (3, "cudaLaunchKernel_v7000")]
    kernels, runtime, nvtx = [], [], []
    shape = f"advisor.gemm M={TAIL['M']} N={TAIL['N']} K={TAIL['K']} dtype=bf16"
    for i in range(n):
        t = 1_000_000 * (i + 1)
        nvtx.append({"start": t, "end": t + 900_000, "eventType": PUSH_POP, "text": nvtx_text or shape,
                     "globalTid": GLOBAL_TID, "domainId": 0})
        runtime.append({"start": t + 1000, "end": t + 6000, "eventClass": 1, "globalTid": GLOBAL_TID, "correlationId": i + 1,
                        "nameId": 3, "returnValue": 0})
        kernels.append(nsys_kernel(t + 10_000, 500_000, 1, 2, i + 1))
    return {
        "StringIds": (["id INTEGER PRIMARY KEY", "value TEXT NOT NULL"], strings),
        "CUPTI_ACTIVITY_KIND_KERNEL": (KERNEL_DECLS, kernels),
        "CUPTI_ACTIVITY_KIND_RUNTIME": (RUNTIME_DECLS, runtime),
        "NVTX_EVENTS": (NVTX_DECLS, nvtx),
        "TARGET_INFO_GPU": (GPU_DECLS, [H100_GPU]),
    }


def write_nsys(path: Path, tables: dict | None = None, **kw: Any) -> Path:
    return write_db(path, tables if tables is not None else nsys_tables(**kw))


# ------------------------------------------------------------------------------ rocprof CSV

V3_HEADER = ["Kind", "Agent_Id", "Queue_Id", "Stream_Id", "Thread_Id", "Dispatch_Id", "Kernel_Id", "Kernel_Name",
             "Correlation_Id", "Start_Timestamp", "End_Timestamp", "LDS_Block_Size", "Scratch_Size", "VGPR_Count",
             "Accum_VGPR_Count", "SGPR_Count", "Workgroup_Size_X", "Workgroup_Size_Y", "Workgroup_Size_Z",
             "Grid_Size_X", "Grid_Size_Y", "Grid_Size_Z"]


def v3_row(i: int, name: str = "void gemm<float>(float*)", start: Any = None, end: Any = None, **kw: Any) -> dict:
    start = 1_000_000_000_000 + 100_000 * i if start is None else start
    row = {"Kind": "KERNEL_DISPATCH", "Agent_Id": 2, "Queue_Id": 1, "Stream_Id": 5, "Thread_Id": 4242,
           "Dispatch_Id": i + 1, "Kernel_Id": 7, "Kernel_Name": name, "Correlation_Id": 100 + i,
           "Start_Timestamp": start, "End_Timestamp": start + 50_000 if end is None else end, "LDS_Block_Size": 1024,
           "Scratch_Size": 0, "VGPR_Count": 32, "Accum_VGPR_Count": 0, "SGPR_Count": 32, "Workgroup_Size_X": 256,
           "Workgroup_Size_Y": 1, "Workgroup_Size_Z": 1, "Grid_Size_X": 1024, "Grid_Size_Y": 1, "Grid_Size_Z": 1}
    row.update(kw)
    return row


def write_csv(path: Path, rows: list[dict], header: list[str] = V3_HEADER) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, lineterminator="\n")
        w.writerow(header)
        for r in rows:
            w.writerow([r.get(h, "") for h in header])
    return path


# ---------------------------------------------------------------------------- rocprofv3 JSON


def rocprofv3_doc(n: int = 3, name: str = "gemm(float*)") -> dict:
    return {"rocprofiler-sdk-tool": [{
        "metadata": {"pid": 4242},
        "agents": [{"id": {"handle": 1}, "type": 1, "node_id": 0, "name": "EPYC"},
                   {"id": {"handle": 2}, "type": 2, "node_id": 1, "gpu_index": 0, "name": "gfx942",
                    "product_name": "AMD Instinct MI300X", "cu_count": 304, "wave_front_size": 64}],
        "kernel_symbols": [{"kernel_id": 7, "formatted_kernel_name": name, "truncated_kernel_name": "gemm",
                            "group_segment_size": 1024, "arch_vgpr_count": 64}],
        "buffer_records": {"kernel_dispatch": [
            {"start_timestamp": 1000 + 1000 * i, "end_timestamp": 1500 + 1000 * i, "thread_id": 1,
             "correlation_id": {"internal": i + 1, "external": 0},
             "dispatch_info": {"agent_id": {"handle": 2}, "queue_id": {"handle": 3}, "kernel_id": 7,
                               "workgroup_size": {"x": 256, "y": 1, "z": 1}, "grid_size": {"x": 1024, "y": 1, "z": 1},
                               "group_segment_size": 1024}}
            for i in range(n)]},
        "strings": {"buffer_records": [], "marker_api": []},
    }]}


def write_json(path: Path, doc: Any) -> Path:
    path.write_text(json.dumps(doc), encoding="utf-8")
    return path


# ----------------------------------------------------------------------------------- rocpd


def write_rocpd(path: Path, n: int = 3, kernel_name: str = "gemm(float*)") -> Path:
    """A rocpd 3.x database without region, event or copy tables (the unsuffixed names)."""
    agent_ext = json.dumps({"cu_count": 304, "wave_front_size": 64, "max_waves_per_cu": 32, "lds_size_in_kb": 64})
    sym_ext = json.dumps({"formatted_kernel_name": kernel_name, "truncated_kernel_name": "gemm"})
    return write_db(path, {
        "rocpd_info_agent": (["id INTEGER PRIMARY KEY", "type TEXT", "type_index INTEGER", "name TEXT", "product_name TEXT",
                              "extdata TEXT"],
                             [(1, "GPU", 0, "gfx942", "AMD Instinct MI300X", agent_ext)]),
        "rocpd_info_kernel_symbol": (["id INTEGER PRIMARY KEY", "kernel_name TEXT", "display_name TEXT",
                                      "group_segment_size INTEGER", "arch_vgpr_count INTEGER", "extdata TEXT"],
                                     [(7, "_Z4gemmPf.kd", kernel_name, 1024, 64, sym_ext)]),
        "rocpd_kernel_dispatch": (["id INTEGER PRIMARY KEY", "agent_id INTEGER", "kernel_id INTEGER", "queue_id INTEGER",
                                   "stream_id INTEGER", "tid INTEGER", "start INTEGER", "end INTEGER",
                                   "group_segment_size INTEGER", "workgroup_size_x INTEGER", "workgroup_size_y INTEGER",
                                   "workgroup_size_z INTEGER", "grid_size_x INTEGER", "grid_size_y INTEGER",
                                   "grid_size_z INTEGER"],
                                  [(i + 1, 1, 7, 3, 5, 1, 1000 + 1000 * i, 1500 + 1000 * i, 1024, 256, 1, 1, 1024, 1, 1)
                                   for i in range(n)]),
    })
