"""Nsight Systems readers: SQLite exports (every corpus file plus synthetic schemas) and
.nsys-rep conversion through a fake `nsys` on PATH.

Expected values come from raw SQL written here against the files themselves (joins to
StringIds, sums of end - start, grid products), never from the reader's helpers. Synthetic
exports copy the column sets of real ones (2021: no mangledName, no ENUM tables; 2024-2026:
mangledName, greenContextId, ENUM_* tables) and drop what a given test is about.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from functools import partial
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import DATA

from advisor.cli import cli
from advisor.errors import NoKernelsError, TraceError
from advisor.traces import _sqlite, detect, load_trace, nsys_rep, nsys_sqlite

CORPUS = Path(os.environ.get("ADVISOR_CORPUS") or Path(__file__).resolve().parents[1].parent / "shared" / "corpus")
NSYS_CORPUS = CORPUS / "nsys"
CORPUS_FILES = sorted(p.name for p in NSYS_CORPUS.glob("*.sqlite")) if NSYS_CORPUS.is_dir() else []
# Kernel counts stated by the corpus README (None: the capture has no kernel table).
README_KERNELS = {
    "nvfuser_h100_nvjet.sqlite": 19,
    "nsystui_rtx3080_two_kernels.sqlite": 2,
    "sgemm_no_kernel_table.sqlite": None,
}


def corpus_file(name: str) -> Path:
    path = NSYS_CORPUS / name
    if not path.is_file():
        pytest.skip(f"corpus file {path} not found")
    return path


def raw(path: Path, sql: str, params=()) -> list[tuple]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.close()


def raw_tables(path: Path) -> set[str]:
    return {r[0] for r in raw(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------
# Synthetic exports

KERNEL_2024 = [
    "start INTEGER NOT NULL", "end INTEGER NOT NULL", "deviceId INTEGER NOT NULL",
    "contextId INTEGER NOT NULL", "greenContextId INTEGER", "streamId INTEGER NOT NULL",
    "correlationId INTEGER", "globalPid INTEGER", "demangledName INTEGER NOT NULL",
    "shortName INTEGER NOT NULL", "mangledName INTEGER", "launchType INTEGER",
    "cacheConfig INTEGER", "registersPerThread INTEGER NOT NULL", "gridX INTEGER NOT NULL",
    "gridY INTEGER NOT NULL", "gridZ INTEGER NOT NULL", "blockX INTEGER NOT NULL",
    "blockY INTEGER NOT NULL", "blockZ INTEGER NOT NULL", "staticSharedMemory INTEGER NOT NULL",
    "dynamicSharedMemory INTEGER NOT NULL", "localMemoryPerThread INTEGER NOT NULL",
    "localMemoryTotal INTEGER NOT NULL", "gridId INTEGER NOT NULL",
    "sharedMemoryExecuted INTEGER", "graphNodeId INTEGER", "sharedMemoryLimitConfig INTEGER",
]
GPU_COLS = [
    "vmId", "id", "name", "busLocation", "l2CacheSize", "memoryBandwidth", "smCount", "cuDevice",
    "maxRegistersPerBlock", "maxShmemPerBlockOptin", "maxShmemPerSm", "maxRegistersPerSm",
    "threadsPerWarp", "maxWarpsPerSm", "maxBlocksPerSm", "maxThreadsPerBlock", "computeMajor",
    "computeMinor",
]


def colname(decl: str) -> str:
    return decl.split()[0]


def write_db(path: Path, tables: dict[str, tuple[list[str], list]]) -> Path:
    """A SQLite file with `tables`: name -> (column declarations, rows as dicts or tuples)."""
    conn = sqlite3.connect(path)
    for name, (decls, rows) in tables.items():
        conn.execute(f'CREATE TABLE "{name}" ({", ".join(decls)})')
        names = [colname(d) for d in decls]
        tuples = [tuple(r.get(n) for n in names) if isinstance(r, dict) else tuple(r) for r in rows]
        if tuples:
            conn.executemany(f'INSERT INTO "{name}" VALUES ({", ".join("?" * len(names))})', tuples)
    conn.commit()
    conn.close()
    return path


def kernel(start, dur, name_id, short_id, **kw) -> dict:
    row = {
        "start": start, "end": start + dur, "deviceId": 0, "contextId": 1, "streamId": 7,
        "correlationId": start // 10, "globalPid": (4242 << 24), "demangledName": name_id,
        "shortName": short_id, "mangledName": None, "registersPerThread": 32, "gridX": 4,
        "gridY": 2, "gridZ": 1, "blockX": 128, "blockY": 1, "blockZ": 1,
        "staticSharedMemory": 0, "dynamicSharedMemory": 1024, "localMemoryPerThread": 0,
        "localMemoryTotal": 0, "gridId": 1,
    }
    row.update(kw)
    return row


def h100_gpu(dev_id=0, **kw) -> dict:
    row = {
        "vmId": 0, "id": dev_id, "cuDevice": dev_id, "name": "NVIDIA H100 80GB HBM3", "smCount": 132,
        "computeMajor": 9, "computeMinor": 0, "maxWarpsPerSm": 64, "maxBlocksPerSm": 32,
        "maxShmemPerSm": 233472, "maxShmemPerBlockOptin": 232448, "maxRegistersPerSm": 65536,
        "maxRegistersPerBlock": 65536, "threadsPerWarp": 32, "maxThreadsPerBlock": 1024,
        "l2CacheSize": 52428800, "memoryBandwidth": 3352320000000,
    }
    row.update(kw)
    return row


STRINGS = [
    (1, "void gemm_kernel<128, 128, 64>(Params)"),
    (2, "gemm_kernel"),
    (3, "void copy_kernel(float*, float const*, int)"),
    (4, "copy_kernel"),
    (5, "_Z11copy_kernelPfPKfi"),
    (10, "cudaLaunchKernel_v7000"),
    (11, "cuGetProcAddress_v2"),
    (12, "cudaStreamGetCaptureInfo_v2_v11030"),
    (20, "registered range"),
    (21, "my.domain"),
]


def basic_export(path: Path, *, kernel_decls=KERNEL_2024, kernels=None, gpu=True, extra=None) -> Path:
    kernels = kernels if kernels is not None else [
        kernel(1000, 500, 1, 2),
        kernel(2000, 300, 3, 4, mangledName=5, gridX=100, correlationId=None, graphNodeId=77),
        kernel(3000, 500, 1, 2, deviceId=0),
    ]
    tables = {
        "StringIds": (["id INTEGER PRIMARY KEY", "value TEXT NOT NULL"], STRINGS),
        "CUPTI_ACTIVITY_KIND_KERNEL": (kernel_decls, kernels),
    }
    if gpu:
        tables["TARGET_INFO_GPU"] = (GPU_COLS, [h100_gpu(0)])
    tables.update(extra or {})
    return write_db(path, tables)


# ---------------------------------------------------------------------------------------
# (a) the corpus, checked against raw SQL


@pytest.mark.parametrize("name", CORPUS_FILES or [pytest.param("none", marks=pytest.mark.skip("no nsys corpus"))])
def test_corpus_file_against_raw_queries(name):
    path = corpus_file(name)
    assert detect(path) == "nsys-sqlite"
    tables = raw_tables(path)
    if "CUPTI_ACTIVITY_KIND_KERNEL" not in tables:
        assert README_KERNELS.get(name, None) is None
        with pytest.raises(NoKernelsError) as err:
            load_trace(path)
        msg = str(err.value)
        assert "\n" not in msg and "CUPTI_ACTIVITY_KIND_KERNEL" in msg
        launches = raw(
            path,
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
            "WHERE s.value LIKE 'cudaLaunchKernel%'",
        )[0][0]
        if launches:
            assert f"{launches} kernel launch calls" in msg
        return

    trace = load_trace(path)
    k = trace.kernels
    (count, total, blocks, threads, regs), = raw(
        path,
        'SELECT count(*), sum("end" - start), sum(gridX * gridY * gridZ), '
        "sum(blockX * blockY * blockZ), sum(registersPerThread) FROM CUPTI_ACTIVITY_KIND_KERNEL",
    )
    if README_KERNELS.get(name) is not None:
        assert count == README_KERNELS[name]
    assert len(k) == count
    assert int(k["dur_ns"].sum()) == total
    assert int(k["grid_blocks"].sum()) == blocks
    assert int(k["block_threads"].sum()) == threads
    assert int(k["registers_per_thread"].sum()) == regs

    # Row by row: names through StringIds, grid and block as stored.
    expected = raw(
        path,
        "SELECT k.start, k.\"end\", d.value, s.value, k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, "
        "k.blockZ, k.staticSharedMemory, k.dynamicSharedMemory, k.deviceId, k.streamId "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds d ON d.id = k.demangledName "
        "JOIN StringIds s ON s.id = k.shortName ORDER BY k.start, k.\"end\", d.value",
    )
    got = k.sort_values(["start_ns", "end_ns", "name"])
    cols = ["start_ns", "end_ns", "name", "short_name", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
            "block_z", "static_smem_bytes", "dynamic_smem_bytes", "device_id", "stream_id"]
    assert [tuple(r) for r in got[cols].astype(object).itertuples(index=False)] == expected

    # Devices: the GPUs that ran kernels, described as TARGET_INFO_GPU says (an export without
    # that table, as nsys-ai's 2026 one: one device row per deviceId that ran kernels)
    dev = trace.devices.sort_values("device_id")
    if "TARGET_INFO_GPU" in tables:
        gpus = raw(
            path,
            "SELECT id, name, smCount, computeMajor, computeMinor FROM TARGET_INFO_GPU "
            "WHERE id IN (SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL) ORDER BY id",
        )
        assert [(int(r.device_id), r.name, int(r.sm_count), r.arch) for r in dev.itertuples()] == [
            (i, n, sms, f"{ma}.{mi}") for i, n, sms, ma, mi in gpus
        ]
        assert set(dev["sm_count_source"]) == {"trace"}
    else:
        ids = [r[0] for r in raw(path, "SELECT DISTINCT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY deviceId")]
        assert [int(x) for x in dev["device_id"]] == ids

    # Copies, runtime calls and NVTX ranges: counts and sums.
    n_copies, copy_bytes = 0, 0
    for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if table in tables:
            c, b = raw(path, f'SELECT count(*), coalesce(sum(bytes), 0) FROM "{table}"')[0]
            n_copies, copy_bytes = n_copies + c, copy_bytes + b
    assert len(trace.memcpy) == n_copies
    assert int(trace.memcpy["bytes"].sum()) == copy_bytes
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        assert len(trace.runtime) == raw(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")[0][0]
    if "NVTX_EVENTS" in tables:
        (n_ranges, range_ns), = raw(
            path,
            'SELECT count(*), sum("end" - start) FROM NVTX_EVENTS WHERE eventType IN (59, 60) AND "end" IS NOT NULL',
        )
        ranges = trace.nvtx[trace.nvtx["dur_ns"] > 0]
        assert len(ranges) == n_ranges and int(ranges["dur_ns"].sum()) == range_ns


def test_corpus_nvfuser_h100_details():
    path = corpus_file("nvfuser_h100_nvjet.sqlite")
    trace = load_trace(path)
    # 8 GPUs are listed; only device 0 ran kernels, and only it is a device here.
    assert raw(path, "SELECT count(*) FROM TARGET_INFO_GPU")[0][0] == 8
    dev = trace.devices[["device_id", "name", "sm_count", "arch", "max_warps_per_sm"]]
    assert dev.astype(object).values.tolist() == [[0, "NVIDIA H100 80GB HBM3", 132, "9.0", 64]]
    assert trace.kernels["name"].str.contains("nvjet").any()
    # NVTX text is inline here; every push/pop range comes through with its text.
    texts = raw(path, "SELECT text FROM NVTX_EVENTS WHERE eventType = 59 ORDER BY start, rowid")
    assert trace.nvtx.sort_values("start_ns", kind="stable")["text"].tolist() == [t for (t,) in texts]
    # Runtime names lose nsys's API-version suffix (cudaLaunchKernel_v7000).
    launches = raw(
        path,
        "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
        "WHERE s.value = 'cudaLaunchKernel_v7000'",
    )[0][0]
    assert launches > 0 and int((trace.runtime["name"] == "cudaLaunchKernel").sum()) == launches
    assert trace.meta["nsys_version"].startswith("2024.6")


def test_corpus_2021_schema():
    path = corpus_file("mordred_2021_schema.sqlite")
    assert "mangledName" not in [r[1] for r in raw(path, "PRAGMA table_info(CUPTI_ACTIVITY_KIND_KERNEL)")]
    trace = load_trace(path)
    assert len(trace.kernels) == raw(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0] == 12
    shorts = raw(
        path, "SELECT DISTINCT s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName"
    )
    assert set(trace.kernels["short_name"]) == {v for (v,) in shorts}
    assert "build_GPU2" in set(trace.kernels["short_name"])
    d = trace.devices.iloc[0]
    assert (d["name"], int(d["sm_count"]), d["arch"]) == ("Quadro RTX 6000", 72, "7.5")
    # No ENUM_CUDA_MEMCPY_OPER in 2021: copyKind 1 is host-to-device by CUPTI's numbering.
    htod = raw(path, "SELECT count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1")[0]
    m = trace.memcpy[trace.memcpy["kind"] == "HtoD"]
    assert (len(m), int(m["bytes"].sum())) == htod


def test_corpus_no_kernel_table_reads_empty_with_note():
    path = corpus_file("sgemm_no_kernel_table.sqlite")
    trace = nsys_sqlite.read(path, rank=0)
    assert trace.kernels.empty
    assert "no CUPTI_ACTIVITY_KIND_KERNEL table" in trace.meta["notes"][0]
    assert len(trace.runtime) == raw(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME")[0][0]


# ---------------------------------------------------------------------------------------
# (b) synthetic schemas


def test_full_schema_values(tmp_path):
    path = basic_export(tmp_path / "t.sqlite")
    trace = load_trace(path)
    k = trace.kernels.sort_values("start_ns").reset_index(drop=True)
    assert k["name"].tolist() == [STRINGS[0][1], STRINGS[2][1], STRINGS[0][1]]
    assert k["short_name"].tolist() == ["gemm_kernel", "copy_kernel", "gemm_kernel"]
    assert k["dur_ns"].tolist() == [500, 300, 500]
    assert k["grid_blocks"].tolist() == [8, 200, 8]
    assert k["block_threads"].tolist() == [128, 128, 128]
    assert k["dynamic_smem_bytes"].tolist() == [1024] * 3
    assert k["correlation_id"].isna().tolist() == [False, True, False]
    assert k["graph_node_id"].tolist()[1] == 77 and k["graph_node_id"].isna().sum() == 2
    d = trace.devices.iloc[0]
    assert (d["name"], d["sm_count"], d["cc_major"], d["cc_minor"], d["arch"]) == (
        "NVIDIA H100 80GB HBM3", 132, 9, 0, "9.0"
    )
    assert (d["smem_per_block_optin_bytes"], d["l2_bytes"], d["mem_bandwidth_bytes_per_s"]) == (
        232448, 52428800, 3.35232e12
    )


def test_old_kernel_columns_without_short_or_mangled_name(tmp_path):
    decls = [d for d in KERNEL_2024 if colname(d) not in ("shortName", "mangledName", "greenContextId")]
    path = basic_export(tmp_path / "old.sqlite", kernel_decls=decls)
    k = load_trace(path).kernels
    assert k["name"].tolist() == [STRINGS[0][1], STRINGS[2][1], STRINGS[0][1]]
    assert k["short_name"].isna().all()


def test_only_short_name_falls_back(tmp_path):
    decls = [d for d in KERNEL_2024 if colname(d) not in ("demangledName", "mangledName")]
    path = basic_export(tmp_path / "short.sqlite", kernel_decls=decls)
    assert load_trace(path).kernels["name"].tolist() == ["gemm_kernel", "copy_kernel", "gemm_kernel"]


def test_nvtx_text_id_domains_marks_and_open_ranges(tmp_path):
    nvtx_cols = ["start INTEGER NOT NULL", "end INTEGER", "eventType INTEGER NOT NULL", "rangeId INTEGER",
                 "category INTEGER", "color INTEGER", "text TEXT", "globalTid INTEGER", "endGlobalTid INTEGER",
                 "textId INTEGER", "domainId INTEGER"]
    tid = (4242 << 24) | 4243
    rows = [
        {"start": 10, "end": None, "eventType": 75, "text": "my.domain", "globalTid": tid, "domainId": 5},
        {"start": 100, "end": 200, "eventType": 59, "text": "inline push", "globalTid": tid, "domainId": 0},
        {"start": 300, "end": 450, "eventType": 59, "text": None, "textId": 20, "globalTid": tid, "domainId": 5},
        {"start": 500, "end": 900, "eventType": 60, "text": "start/end", "globalTid": tid, "domainId": 0},
        {"start": 600, "end": None, "eventType": 34, "text": "a mark", "globalTid": tid, "domainId": 0},
        {"start": 700, "end": None, "eventType": 59, "text": "never popped", "globalTid": tid, "domainId": 0},
        {"start": 800, "end": 801, "eventType": 33, "text": "a category", "globalTid": tid, "domainId": 0},
    ]
    path = basic_export(tmp_path / "nvtx.sqlite", extra={"NVTX_EVENTS": (nvtx_cols, rows)})
    trace = load_trace(path)
    n = trace.nvtx.sort_values("start_ns").reset_index(drop=True)
    assert n["text"].tolist() == ["inline push", "registered range", "start/end", "a mark"]
    assert n["dur_ns"].tolist() == [100, 150, 400, 0]
    assert n["end_ns"].tolist() == [200, 450, 900, 600]
    assert n["domain"].tolist()[1] == "my.domain" and n["domain"].isna().tolist() == [True, False, True, True]
    assert set(n["thread_id"]) == {4243}
    assert any("1 NVTX ranges were still open" in note for note in trace.meta["notes"])


def test_runtime_names_threads_and_memcpy_kinds(tmp_path):
    rt_cols = ["start INTEGER NOT NULL", "end INTEGER NOT NULL", "eventClass INTEGER NOT NULL",
               "globalTid INTEGER", "correlationId INTEGER", "nameId INTEGER NOT NULL",
               "returnValue INTEGER NOT NULL", "callchainId INTEGER"]
    tid = (77 << 24) | 99
    runtime = [
        (900, 950, 1, tid, 100, 10, 0, None),
        (960, 970, 1, tid, 101, 11, 0, None),
        (980, 990, 1, tid, 102, 12, 0, None),
    ]
    copy_cols = ["start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid", "bytes", "copyKind"]
    copies = [(100, 200, 0, 1, 7, 5, 0, 4096, 1), (300, 350, 0, 1, 7, 6, 0, 64, 2), (400, 410, 0, 1, 7, 7, 0, 8, 8),
              (420, 430, 0, 1, 7, 8, 0, 16, 10), (440, 450, 0, 1, 7, 9, 0, 32, 3)]
    memset = (["start", "end", "deviceId", "contextId", "streamId", "correlationId", "globalPid", "value", "bytes"],
              [(500, 600, 0, 1, 7, 10, 0, 0, 1 << 20)])
    path = basic_export(tmp_path / "rt.sqlite", extra={
        "CUPTI_ACTIVITY_KIND_RUNTIME": (rt_cols, runtime),
        "CUPTI_ACTIVITY_KIND_MEMCPY": (copy_cols, copies),
        "CUPTI_ACTIVITY_KIND_MEMSET": memset,
    })
    trace = load_trace(path)
    assert trace.runtime["name"].tolist() == ["cudaLaunchKernel", "cuGetProcAddress_v2", "cudaStreamGetCaptureInfo_v2"]
    assert set(trace.runtime["thread_id"]) == {99}
    m = trace.memcpy.sort_values("start_ns")
    # CUPTI numbering without an enum table: 1 HtoD, 2 DtoH, 8 DtoD, 10 PtoP, 3 HtoA (array = device).
    assert m["kind"].tolist() == ["HtoD", "DtoH", "DtoD", "PtoP", "HtoD", "memset"]
    assert m["op"].tolist() == ["memcpy"] * 5 + ["memset"]
    assert int(m["bytes"].sum()) == 4096 + 64 + 8 + 16 + 32 + (1 << 20)

    # With ENUM_CUDA_MEMCPY_OPER present its names win, whatever the numbering.
    path2 = basic_export(tmp_path / "enum.sqlite", extra={
        "CUPTI_ACTIVITY_KIND_MEMCPY": (copy_cols, copies[:2]),
        "ENUM_CUDA_MEMCPY_OPER": (
            ["id", "name", "label"], [(1, "CUDA_MEMCPY_KIND_DTOH", "x"), (2, "CUDA_MEMCPY_KIND_PTOP", "y")]
        ),
    })
    assert load_trace(path2).memcpy["kind"].tolist() == ["DtoH", "PtoP"]


def test_sm_count_from_cuda_device_table_when_no_gpu_table(tmp_path):
    path = basic_export(tmp_path / "dev.sqlite", gpu=False, extra={
        "TARGET_INFO_CUDA_DEVICE": (
            ["gpuId", "cudaId", "pid", "uuid", "numMultiprocessors"], [(0, 0, 1, None, 114), (1, 1, 1, None, 114)]
        ),
    })
    trace = load_trace(path)
    d = trace.devices
    assert d[["device_id", "sm_count", "sm_count_source"]].astype(object).values.tolist() == [[0, 114, "trace"]]


def test_no_gpu_info_at_all_leaves_sm_count_to_the_user(tmp_path):
    path = basic_export(tmp_path / "nogpu.sqlite", gpu=False)
    trace = load_trace(path)
    assert trace.devices["sm_count"].isna().all()
    assert any("SM count unknown" in n for n in trace.meta["notes"])
    assert any("no GPU description" in n for n in trace.meta["notes"])
    forced = load_trace(path, sm_count=78)
    assert forced.devices[["sm_count", "sm_count_source"]].astype(object).values.tolist() == [[78, "user"]]
    assert not any("replaces" in n for n in forced.meta["notes"])  # nothing was there to replace


def test_sm_count_that_overrides_the_trace_says_so(tmp_path):
    t = load_trace(DATA / "h200" / "tail.sqlite.gz", cache_dir=tmp_path, sm_count=114)
    assert t.devices[["sm_count", "sm_count_source"]].astype(object).values.tolist() == [[114, "user"]]
    assert "--sm-count 114 replaces the 132 SMs the trace gives for NVIDIA H200 (rank 0)" in t.meta["notes"]
    same = load_trace(DATA / "h200" / "tail.sqlite.gz", cache_dir=tmp_path, sm_count=132)
    assert not any("replaces" in n for n in same.meta["notes"])


def test_early_2021_cuda_gpu_table(tmp_path):
    cols = ["deviceId", "name", "numMultiprocessors", "computeCapabilityMajor", "computeCapabilityMinor",
            "numThreadsPerWarp", "maxWarpsPerMultiprocessor"]
    path = basic_export(tmp_path / "early.sqlite", gpu=False, extra={
        "TARGET_INFO_CUDA_GPU": (cols, [(0, "Tesla V100-SXM2-16GB", 80, 7, 0, 32, 64)]),
    })
    d = load_trace(path).devices.iloc[0]
    assert (d["name"], d["sm_count"], d["arch"], d["max_warps_per_sm"]) == ("Tesla V100-SXM2-16GB", 80, "7.0", 64)


def test_only_busy_devices_are_kept_and_ids_follow_gpu_id(tmp_path):
    gpus = [h100_gpu(i, busLocation=f"0000:{i:02x}:00.0") for i in range(4)]
    gpus[2]["name"] = "NVIDIA H200"
    gpus[2]["smCount"] = 0  # nsys writes 0 when it did not know: falls back to the known-GPU table
    kernels = [kernel(1000, 10, 1, 2, deviceId=2), kernel(2000, 10, 1, 2, deviceId=2)]
    path = basic_export(tmp_path / "multi.sqlite", kernels=kernels, gpu=False,
                        extra={"TARGET_INFO_GPU": (GPU_COLS, gpus)})
    d = load_trace(path).devices
    assert d[["device_id", "name", "sm_count", "sm_count_source"]].astype(object).values.tolist() == [
        [2, "NVIDIA H200", 132, "known-gpu"]
    ]


def test_two_exports_load_as_two_ranks(tmp_path):
    a = basic_export(tmp_path / "rank0.sqlite")
    b = basic_export(tmp_path / "rank1.sqlite", kernels=[kernel(5000, 250, 3, 4)])
    trace = load_trace([a, b])
    assert trace.kernels.groupby("rank")["dur_ns"].sum().to_dict() == {0: 1300, 1: 250}
    assert sorted(trace.devices["rank"]) == [0, 1]
    assert trace.meta["format"] == ["nsys-sqlite", "nsys-sqlite"]


def test_chunked_threaded_read_matches_raw(tmp_path, monkeypatch):
    # Small chunks force several row ranges, read on worker threads and put back in order.
    monkeypatch.setattr(_sqlite, "_CHUNK_ROWS", 700)
    monkeypatch.setattr(_sqlite.os, "cpu_count", lambda: 4)
    kernels = [kernel(10_000 + 10 * i, 5 + i % 7, 1 + 2 * (i % 2), 2 + 2 * (i % 2), gridX=1 + i % 13,
                      correlationId=None if i % 5 == 0 else i) for i in range(5000)]
    path = basic_export(tmp_path / "many.sqlite", kernels=kernels)
    k = load_trace(path).kernels
    expected = raw(
        path, 'SELECT start, "end" - start, gridX, correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid'
    )
    corr = k["correlation_id"].astype(object).where(k["correlation_id"].notna(), None)
    got = list(zip(k["start_ns"], k["dur_ns"], k["grid_x"], corr))
    assert got == expected


def test_non_integer_cells_take_the_slow_path(tmp_path, monkeypatch):
    kernels = [kernel(1000, 10, 1, 2), kernel(2000, 20, 3, 4, gridY="oops", blockX=2.5), kernel(3000, 30, 1, 2)]
    decls = [colname(d) for d in KERNEL_2024]  # untyped columns keep the text and the REAL as given
    path = basic_export(tmp_path / "odd.sqlite", kernels=kernels, kernel_decls=decls)
    k = load_trace(path).kernels.sort_values("start_ns")
    assert k["dur_ns"].tolist() == [10, 20, 30]
    assert k["grid_y"].isna().tolist() == [False, True, False]
    assert k["block_x"].isna().tolist() == [False, True, False]
    assert k["name"].tolist()[1] == STRINGS[2][1]


def test_bulk_path_is_used_for_integer_tables(tmp_path, monkeypatch):
    def no_slow(*a, **k):
        raise AssertionError("per-row fallback used on an all-integer table")

    monkeypatch.setattr(_sqlite, "_slow_read", no_slow)
    path = basic_export(tmp_path / "fast.sqlite")
    assert len(load_trace(path).kernels) == 3


def test_sniff_rejects_rocpd_and_other_sqlite(tmp_path):
    rocpd = write_db(tmp_path / "r.db", {"rocpd_kernel_dispatch": (["id", "start", "end"], []),
                                         "rocpd_info_agent": (["id"], [])})
    other = write_db(tmp_path / "o.sqlite", {"notes": (["id", "text"], [(1, "x")])})
    nsys = basic_export(tmp_path / "n.sqlite")
    head = lambda p: p.read_bytes()[:100]  # noqa: E731
    assert not nsys_sqlite.sniff(rocpd, head(rocpd))
    assert not nsys_sqlite.sniff(other, head(other))
    assert nsys_sqlite.sniff(nsys, head(nsys))
    with pytest.raises(TraceError, match="unknown trace format"):
        load_trace(other)


# ---------------------------------------------------------------------------------------
# (c) read-only, never modified


def test_file_untouched_and_readable_from_read_only_dir(tmp_path):
    ro = tmp_path / "ro dir %41"  # spaces and % must survive the file: URI
    ro.mkdir()
    path = basic_export(ro / "trace #1.sqlite")
    before = sha256(path)
    path.chmod(0o444)
    ro.chmod(0o555)
    try:
        listing = sorted(os.listdir(ro))
        mtime = path.stat().st_mtime_ns
        trace = load_trace(path)
        assert len(trace.kernels) == 3
        assert sha256(path) == before and path.stat().st_mtime_ns == mtime
        assert sorted(os.listdir(ro)) == listing  # no journal, -wal or -shm left beside it
    finally:
        ro.chmod(0o755)
        path.chmod(0o644)


def test_connection_refuses_writes(tmp_path):
    path = basic_export(tmp_path / "w.sqlite")
    before = sha256(path)
    conn = _sqlite.open_readonly(path)
    try:
        with pytest.raises(sqlite3.OperationalError):
            conn.execute("CREATE TABLE x (a)")
        with pytest.raises(sqlite3.OperationalError):
            conn.execute("DELETE FROM StringIds")
    finally:
        conn.close()
    assert sha256(path) == before


def test_immutable_fallback_when_read_only_open_fails(tmp_path, monkeypatch):
    path = basic_export(tmp_path / "i.sqlite")
    real = _sqlite._connect
    calls = []

    def flaky(p, immutable):
        calls.append(immutable)
        if not immutable:
            raise sqlite3.OperationalError("unable to open database file")
        return real(p, immutable)

    monkeypatch.setattr(_sqlite, "_connect", flaky)
    assert len(nsys_sqlite.read(path, rank=0).kernels) == 3
    assert calls[:2] == [False, True]


# ---------------------------------------------------------------------------------------
# (d) the CLI


def run_cli(*args, env=None):
    return CliRunner(env=env).invoke(cli, list(args))


def check_summary_json(path: Path) -> dict:
    result = run_cli("summary", str(path), "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    assert info["format"] == "nsys-sqlite"
    for d in info["devices"]:
        assert {"name", "sm_count", "compute_capability"} <= set(d)
    (count, total), = raw(path, 'SELECT count(*), sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL')
    assert info["kernels"]["count"] == count and info["kernels"]["total_ns"] == total
    # one row per (name, grid, block) (and shape, which these exports do not name)
    top = raw(
        path,
        'SELECT s.value, count(*), sum(k."end" - k.start) AS t, k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ '
        "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName "
        "GROUP BY s.value, k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ ORDER BY t DESC",
    )
    first = info["top_kernels"][0]
    assert {"name", "count", "total_ns", "grid", "block"} <= set(first)
    assert (first["name"], first["count"], first["total_ns"], *first["grid"], *first["block"]) == top[0]
    assert len(first["grid"]) == 3 and len(first["block"]) == 3
    return info


def test_summary_json_synthetic(tmp_path):
    info = check_summary_json(basic_export(tmp_path / "s.sqlite"))
    assert [(d["name"], d["sm_count"], d["compute_capability"]) for d in info["devices"]] == [
        ("NVIDIA H100 80GB HBM3", 132, "9.0")
    ]
    assert info["top_kernels"][0]["grid"] == [4, 2, 1] and info["top_kernels"][0]["block"] == [128, 1, 1]


def test_summary_json_corpus():
    path = corpus_file("nvfuser_h100_nvjet.sqlite")
    info = check_summary_json(path)
    assert [(d["name"], d["sm_count"], d["compute_capability"]) for d in info["devices"]] == [
        ("NVIDIA H100 80GB HBM3", 132, "9.0")
    ]
    grid = raw(
        path,
        "SELECT k.gridX, k.gridY, k.gridZ, k.blockX, k.blockY, k.blockZ, count(*) AS n "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName "
        "WHERE s.value = ? GROUP BY 1, 2, 3, 4, 5, 6 ORDER BY n DESC",
        (info["top_kernels"][0]["name"],),
    )[0]
    assert info["top_kernels"][0]["grid"] + info["top_kernels"][0]["block"] == list(grid[:6])


def assert_one_line_error(result, *needles):
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert "\n" not in err and err.startswith("advisor: error:"), err
    assert "Traceback" not in result.output
    for needle in needles:
        assert needle in err, err


def test_corrupt_and_truncated_sqlite_give_one_line_errors(tmp_path):
    good = basic_export(tmp_path / "good.sqlite", extra={
        "filler": (["a"], [("x" * 2000,) for _ in range(50)]),  # several pages, so truncation bites
    })
    data = good.read_bytes()
    assert len(data) > 8 * 4096

    garbage = tmp_path / "garbage.sqlite"
    garbage.write_bytes(data[:100] + os.urandom(len(data) - 100))
    assert_one_line_error(run_cli("summary", str(garbage), "--json"), "garbage.sqlite")

    truncated = tmp_path / "truncated.sqlite"
    truncated.write_bytes(data[: len(data) // 2])
    assert_one_line_error(run_cli("summary", str(truncated)), "truncated")

    stub = tmp_path / "stub.sqlite"
    stub.write_bytes(data[:40])
    assert_one_line_error(run_cli("summary", str(stub)), "stub.sqlite")


def test_no_kernel_table_exit_2(tmp_path):
    path = corpus_file("sgemm_no_kernel_table.sqlite")
    assert_one_line_error(run_cli("summary", str(path)), "no GPU kernel activity", "CUPTI_ACTIVITY_KIND_KERNEL")


# ---------------------------------------------------------------------------------------
# .nsys-rep through a fake nsys

REPORT_HEAD = b"NVIDIA Tegra Profiler Report 2026@1@1@204-12345v0.\n\x0bLocal (CLI)\x12\n"

FAKE_NSYS = r"""#!/bin/sh
# A stand-in for `nsys export`: logs its arguments, then copies $FAKE_NSYS_SOURCE to -o.
echo "$@" >> "$FAKE_NSYS_LOG"
if [ -n "$FAKE_NSYS_SLEEP" ]; then exec sleep "$FAKE_NSYS_SLEEP"; fi
if [ -n "$FAKE_NSYS_FAIL" ]; then echo "progress..." >&2; echo "$FAKE_NSYS_FAIL" >&2; exit 3; fi
out=""
while [ $# -gt 1 ]; do
  if [ "$1" = "-o" ]; then out="$2"; fi
  shift
done
cp "$FAKE_NSYS_SOURCE" "$out"
"""


@pytest.fixture
def fake_nsys(tmp_path, monkeypatch):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "nsys"
    script.write_text(FAKE_NSYS)
    script.chmod(0o755)
    source = basic_export(tmp_path / "exported.sqlite")
    log = tmp_path / "nsys.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("FAKE_NSYS_SOURCE", str(source))
    monkeypatch.setenv("FAKE_NSYS_LOG", str(log))
    monkeypatch.setattr(nsys_rep, "STANDARD_LOCATIONS", ())
    return script, log


@pytest.fixture
def report(tmp_path):
    d = tmp_path / "user"
    d.mkdir()
    path = d / "run 1.nsys-rep"
    path.write_bytes(REPORT_HEAD + os.urandom(2048))
    return path


def log_lines(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_rep_sniff():
    assert nsys_rep.sniff(Path("x.bin"), REPORT_HEAD)
    assert nsys_rep.sniff(Path("x.nsys-rep"), b"\x00\x01binary")
    assert nsys_rep.sniff(Path("x.qdrep"), b"\x00\x01binary")
    assert not nsys_rep.sniff(Path("x.nsys-rep"), b"SQLite format 3\x00...")
    assert not nsys_rep.sniff(Path("x.nsys-rep"), b'  {"traceEvents": []}')
    assert not nsys_rep.sniff(Path("x.bin"), b"\x00\x01binary")


def test_rep_converted_into_cache_and_reused(tmp_path, fake_nsys, report):
    _, log = fake_nsys
    cache = tmp_path / "cache"
    beside = sorted(os.listdir(report.parent))
    before = sha256(report)
    assert detect(report) == "nsys-rep"

    trace = load_trace(report, cache_dir=cache)
    assert trace.meta["format"] == "nsys-rep" and trace.meta["sources"] == [report.name]
    assert len(trace.kernels) == 3
    from advisor.traces._cache import source_key

    exported = cache / f"run_1-{source_key(report)}.sqlite"
    assert sorted(os.listdir(cache)) == [exported.name]
    assert sorted(os.listdir(report.parent)) == beside and sha256(report) == before
    (line,) = log_lines(log)
    assert line.startswith("export --type sqlite -f true -o ") and line.endswith(str(report))

    load_trace(report, cache_dir=cache)  # same content: the cached export, no second run
    assert len(log_lines(log)) == 1

    report.write_bytes(REPORT_HEAD + os.urandom(2048))  # new content: exported again
    load_trace(report, cache_dir=cache)
    assert len(log_lines(log)) == 2 and len(os.listdir(cache)) == 2


def test_rep_default_cache_dir_is_xdg(tmp_path, fake_nsys, report, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    load_trace(report)
    assert len(list((tmp_path / "xdg" / "advisor").glob("run_1-*.sqlite"))) == 1


def test_rep_nsys_from_env_var(tmp_path, fake_nsys, report, monkeypatch):
    script, log = fake_nsys
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    monkeypatch.setenv("NSYS", str(script))
    assert len(load_trace(report, cache_dir=tmp_path / "c").kernels) == 3
    monkeypatch.setenv("NSYS", str(tmp_path / "missing" / "nsys"))
    with pytest.raises(TraceError, match=r"\$NSYS"):
        load_trace(report, cache_dir=tmp_path / "c2")


def test_rep_standard_location(tmp_path, fake_nsys, report, monkeypatch):
    script, log = fake_nsys
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    for version in ("2024.6.1", "2025.3.1"):
        d = tmp_path / "opt" / version / "bin"
        d.mkdir(parents=True)
        (d / "nsys").write_text(FAKE_NSYS.replace('"$FAKE_NSYS_LOG"', f'"$FAKE_NSYS_LOG.{version}"'))
        (d / "nsys").chmod(0o755)
    monkeypatch.setattr(nsys_rep, "STANDARD_LOCATIONS", (str(tmp_path / "opt" / "*" / "bin" / "nsys"),))
    load_trace(report, cache_dir=tmp_path / "c")
    assert log_lines(Path(f"{log}.2025.3.1")) and not log_lines(Path(f"{log}.2024.6.1"))


def test_rep_without_nsys_says_how_to_export(tmp_path, report, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setattr(nsys_rep, "STANDARD_LOCATIONS", ())
    result = run_cli("summary", str(report), "--cache-dir", str(tmp_path / "c"))
    assert_one_line_error(result, "nsys export --type sqlite -o 'run 1.sqlite' 'run 1.nsys-rep'")
    assert not (tmp_path / "c").exists()


def test_rep_export_failure_and_timeout(tmp_path, fake_nsys, report, monkeypatch):
    cache = tmp_path / "cache"
    monkeypatch.setenv("FAKE_NSYS_FAIL", "Importer error: the report is damaged")
    with pytest.raises(TraceError, match="nsys export failed .*2026.1.1.204.*Importer error: the report is damaged"):
        load_trace(report, cache_dir=cache)
    assert list(cache.iterdir()) == []
    monkeypatch.delenv("FAKE_NSYS_FAIL")

    monkeypatch.setenv("FAKE_NSYS_SLEEP", "30")
    monkeypatch.setenv("ADVISOR_NSYS_TIMEOUT", "0.5")
    t0 = time.monotonic()
    result = run_cli("summary", str(report), "--cache-dir", str(cache))
    assert time.monotonic() - t0 < 10
    assert_one_line_error(result, "did not finish within 0.5 s")
    assert list(cache.iterdir()) == []


def test_rep_unreadable_export_is_not_cached(tmp_path, fake_nsys, report, monkeypatch):
    bad = tmp_path / "bad.sqlite"
    bad.write_bytes(b"SQLite format 3\x00" + b"\x00" * 84 + os.urandom(8192))
    monkeypatch.setenv("FAKE_NSYS_SOURCE", str(bad))
    cache = tmp_path / "cache"
    with pytest.raises(TraceError, match="SQLite export cannot be read"):
        load_trace(report, cache_dir=cache)
    assert list(cache.iterdir()) == []


# ---------------------------------------------------------------------------------------
# Performance (opt-in: timing on shared machines is noisy). ADVISOR_PERF=1 to run.


@pytest.mark.skipif(os.environ.get("ADVISOR_PERF") != "1", reason="set ADVISOR_PERF=1 to time a 1M-kernel load")
def test_million_kernels_load_in_seconds(tmp_path):
    path = basic_export(tmp_path / "big.sqlite", kernels=[])
    conn = sqlite3.connect(path)
    conn.execute(
        "WITH RECURSIVE s(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM s WHERE i < 999999) "
        "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, \"end\", deviceId, contextId, streamId, correlationId, "
        "demangledName, shortName, registersPerThread, gridX, gridY, gridZ, blockX, blockY, blockZ, "
        "staticSharedMemory, dynamicSharedMemory, localMemoryPerThread, localMemoryTotal, gridId) "
        "SELECT 1000 + i * 2000, 2500 + i * 2000, 0, 1, 7, i, 1 + 2 * (i % 2), 2 + 2 * (i % 2), 64, 132 + i % 5, "
        "1, 1, 256, 1, 1, 0, 49152, 0, 0, i FROM s"
    )
    conn.commit()
    conn.close()
    t0 = time.perf_counter()
    trace = load_trace(path)
    elapsed = time.perf_counter() - t0
    assert len(trace.kernels) == 1_000_000 and int(trace.kernels["dur_ns"].sum()) == 1500 * 1_000_000
    assert elapsed < 5.0, f"1M kernels took {elapsed:.1f} s"


def test_chunks_in_flight_are_bounded():
    """Chunks are read ahead on threads, at most `ahead` beyond the one being parsed (all of
    a 10M-row table's chunks at once held ~2 GB of text), and come back in order."""
    from concurrent.futures import ThreadPoolExecutor
    import threading

    started, lock = [], threading.Lock()

    def fetch(i):
        with lock:
            started.append(i)
        return i

    got = []
    with ThreadPoolExecutor(4) as pool:
        for r in _sqlite._ordered_map(pool, fetch, range(20), 2):
            time.sleep(0.002)  # parsing is the slow side
            with lock:  # the chunk handed out plus at most 2 read ahead
                assert len(started) - len(got) <= 3
            got.append(r)
    assert got == list(range(20))


def test_known_row_count_fills_columns_in_place(tmp_path, monkeypatch):
    """Without a filter the row count is known: chunks are copied into columns allocated
    once (no list of chunks joined at the end), with the same values."""
    monkeypatch.setattr(_sqlite, "_CHUNK_ROWS", 300)
    joins = []
    real = _sqlite.np.concatenate
    monkeypatch.setattr(_sqlite.np, "concatenate", lambda *a, **k: (joins.append(1), real(*a, **k))[1])
    kernels = [kernel(10_000 + 10 * i, 5 + i % 7, 1, 2, correlationId=None if i % 3 == 0 else i) for i in range(1000)]
    path = basic_export(tmp_path / "k.sqlite", kernels=kernels)
    df = _sqlite.read_int_columns(partial(_sqlite.open_readonly, path), "CUPTI_ACTIVITY_KIND_KERNEL", ["start", "correlationId"])
    assert not joins
    assert df["start"].tolist() == [10_000 + 10 * i for i in range(1000)]
    assert df["correlationId"].isna().tolist() == [i % 3 == 0 for i in range(1000)]


_NULLABLE = [d.replace(" NOT NULL", "") for d in KERNEL_2024]


@pytest.mark.parametrize("chunk", [300, 10_000])
def test_narrowed_read_is_the_wide_read(tmp_path, monkeypatch, chunk):
    """Columns asked for `narrow` come as Int32 when every value fits, with the same values
    and missing cells as the Int64 read; a value past int32 in a later chunk widens the
    column to Int64 (what was read so far kept), and an all-NULL column stays Int64."""
    monkeypatch.setattr(_sqlite, "_CHUNK_ROWS", chunk)
    kernels = [kernel(10_000 + 10 * i, 5 + i % 7, 1, 2, correlationId=None if i % 3 == 0 else i,
                      streamId=2**31 + 5 if i == 950 else (None if i % 5 == 0 else i % 4),
                      gridX=-(2**31) + 1 if i == 7 else 1 + i % 9, gridY=None)
               for i in range(1000)]
    path = basic_export(tmp_path / "k.sqlite", kernels=kernels, kernel_decls=_NULLABLE)
    cols = ["start", "correlationId", "streamId", "gridX", "gridY"]
    connect = partial(_sqlite.open_readonly, path)
    wide = _sqlite.read_int_columns(connect, "CUPTI_ACTIVITY_KIND_KERNEL", cols)
    narrow = _sqlite.read_int_columns(connect, "CUPTI_ACTIVITY_KIND_KERNEL", cols, narrow=cols[1:])
    assert {c: str(narrow[c].dtype) for c in cols} == {
        "start": "Int64", "correlationId": "Int32", "streamId": "Int64", "gridX": "Int32", "gridY": "Int64"}
    for c in cols:
        assert narrow[c].astype("Int64").equals(wide[c]), c
    # a filtered read (the chunks joined at the end) narrows the same way
    where = '"start" >= ?'
    f_wide = _sqlite.read_int_columns(connect, "CUPTI_ACTIVITY_KIND_KERNEL", cols, where=where, params=(12_000,))
    f_narrow = _sqlite.read_int_columns(connect, "CUPTI_ACTIVITY_KIND_KERNEL", cols, where=where, params=(12_000,),
                                        narrow=cols[1:])
    assert str(f_narrow["correlationId"].dtype) == "Int32" and str(f_narrow["streamId"].dtype) == "Int64"
    for c in cols:
        assert f_narrow[c].astype("Int64").equals(f_wide[c]), c


def test_narrowed_read_loads_the_same_trace(tmp_path, monkeypatch):
    """The nsys reader's int32 parse (ids, launch values, string ids) and int32 rank give the
    frames `load_trace` gave from the Int64 read: same dtypes after narrowing, same values,
    impossible values still masked."""
    kernels = [kernel(10_000 + 10 * i, 5 + i % 7, 1 + 2 * (i % 2), 2 + 2 * (i % 2), streamId=i % 3,
                      gridX=2**31 if i == 4 else 1 + i % 9, blockY=None if i == 5 else 1)
               for i in range(50)]
    path = basic_export(tmp_path / "k.sqlite", kernels=kernels, kernel_decls=_NULLABLE)
    new = load_trace(path)
    monkeypatch.setattr(nsys_sqlite, "_NARROW_READ", frozenset())
    old = load_trace(path)
    for name, df in new.frames().items():
        ref = getattr(old, name)
        assert list(df.columns) == list(ref.columns) and df.dtypes.equals(ref.dtypes), name
        assert df.equals(ref), name
    assert new.kernels["grid_x"].isna().sum() == 1
