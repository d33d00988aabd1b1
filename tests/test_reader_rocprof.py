"""rocprof readers: v1/v2/v3 CSV, rocprofv3 JSON and rocpd SQLite.

Corpus files are checked against the files themselves, parsed here with the standard library
(`csv`, `json`); the grid conversions (work-items -> workgroups) are recomputed here too.
Header variants and the rocpd databases are small files written by the tests from the
layouts documented upstream:
- rocprofv3 kernel_trace.csv headers: rocprofiler-sdk `source/lib/output/generateCSV.cpp`
  (2024-05 without Thread_Id/Dispatch_Id, 2024-07 with them, 2025 with Stream_Id, and the
  newest with LDS_Block_Size/Scratch_Size/VGPR_Count/Accum_VGPR_Count/SGPR_Count);
- rocprofv2 headers: ROCm/rocprofiler `plugin/file` documentation (both file-plugin layouts);
- rocpd: rocprofiler-sdk `source/share/rocprofiler-sdk-rocpd/rocpd_tables.sql` and
  `rocpd_views.sql` (schema 3.x, uuid-suffixed tables plus unsuffixed views) and
  `versions/4.1.0/rocpd_tables.sql` (dispatches on `rocpd_track` rows).
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import os
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.errors import NoKernelsError, TraceError
from advisor.traces import detect, load_trace, rocpd

CORPUS = Path(os.environ.get("ADVISOR_CORPUS") or Path(__file__).resolve().parents[1].parent / "shared" / "corpus")
ROCPROF = CORPUS / "rocprof"


def corpus_file(name: str) -> Path:
    path = ROCPROF / name
    if not path.is_file():
        pytest.skip(f"corpus file {path} not found")
    return path


def csv_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh, quoting=csv.QUOTE_NONNUMERIC)
        w.writerow(header)
        w.writerows(rows)
    return path


def cli_error(path: Path) -> str:
    result = CliRunner().invoke(cli, ["summary", str(path)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


# --------------------------------------------------------------------------------------------
# rocprof v1 / v3 CSV from the corpus


def test_corpus_v1_results_csv():
    path = corpus_file("rocprof_v1_results.csv")
    rows = csv_rows(path)
    trace = load_trace(path)
    k = trace.kernels
    assert detect(path) == "rocprof-csv"
    assert len(k) == len(rows) == 1004
    # grd counts work-items: the grid is grd / wgr workgroups
    assert k["grid_x"].tolist() == [ceil_div(int(r["grd"]), int(r["wgr"])) for r in rows]
    assert k["grid_x"].iloc[0] == 134217728 // 256 == 524288
    assert k["grid_blocks"].tolist() == k["grid_x"].tolist()
    assert k["block_x"].tolist() == [int(r["wgr"]) for r in rows]
    assert k["start_ns"].tolist() == [int(r["BeginNs"]) for r in rows]
    assert k["dur_ns"].tolist() == [int(r["EndNs"]) - int(r["BeginNs"]) for r in rows]
    assert k["dur_ns"].tolist() == [int(r["DurationNs"]) for r in rows]
    assert k["registers_per_thread"].tolist() == [int(r["arch_vgpr"]) for r in rows]
    assert k["device_id"].tolist() == [int(r["gpu-id"]) for r in rows]
    assert k["name"].tolist() == [r["KernelName"].removesuffix(".kd") for r in rows]
    assert trace.devices["vendor"].tolist() == ["amd"]
    assert trace.devices["sm_count"].isna().all()  # the CSV names no GPU


def test_corpus_v1_with_sm_count_override():
    trace = load_trace(corpus_file("rocprof_v1_results.csv"), sm_count=104)
    assert trace.devices["sm_count"].tolist() == [104]
    assert trace.devices["sm_count_source"].tolist() == ["user"]


def test_corpus_stats_csv_is_refused():
    path = corpus_file("rocprof_v1_results.stats.csv")
    with pytest.raises(TraceError, match="summary .*pass results.csv"):
        load_trace(path)
    assert "results.csv" in cli_error(path)


def test_corpus_v3_kernel_trace_csv():
    path = corpus_file("rocprofv3_kernel_trace.csv")
    rows = csv_rows(path)
    k = load_trace(path).kernels
    assert len(k) == len(rows) == 8
    for axis in "XYZ":
        a = axis.lower()
        assert k[f"grid_{a}"].tolist() == [ceil_div(int(r[f"Grid_Size_{axis}"]), int(r[f"Workgroup_Size_{axis}"])) for r in rows]
        assert k[f"block_{a}"].tolist() == [int(r[f"Workgroup_Size_{axis}"]) for r in rows]
    # the sample launches 1024x1024 work-items in 64x1x1 workgroups: 16 x 1024 workgroups
    assert (k["grid_x"] == 16).all() and (k["grid_y"] == 1024).all() and (k["grid_blocks"] == 16384).all()
    assert k["dur_ns"].tolist() == [int(r["End_Timestamp"]) - int(r["Start_Timestamp"]) for r in rows]
    assert k["correlation_id"].tolist() == [int(r["Correlation_Id"]) for r in rows]
    assert k["stream_id"].tolist() == [int(r["Stream_Id"]) for r in rows]
    assert k["device_id"].tolist() == [int(r["Agent_Id"]) for r in rows]


# --------------------------------------------------------------------------------------------
# rocprofv3 CSV header variants (documented headers, small files written here)

V3_2024_05 = ["Kind", "Agent_Id", "Queue_Id", "Kernel_Id", "Kernel_Name", "Correlation_Id", "Start_Timestamp",
              "End_Timestamp", "Private_Segment_Size", "Group_Segment_Size", "Workgroup_Size_X", "Workgroup_Size_Y",
              "Workgroup_Size_Z", "Grid_Size_X", "Grid_Size_Y", "Grid_Size_Z"]
V3_2024_07 = V3_2024_05[:3] + ["Thread_Id", "Dispatch_Id"] + V3_2024_05[3:]
V3_2025_STREAM = V3_2024_05[:3] + ["Stream_Id", "Thread_Id", "Dispatch_Id"] + V3_2024_05[3:]
V3_LATEST = ["Kind", "Agent_Id", "Queue_Id", "Stream_Id", "Thread_Id", "Dispatch_Id", "Kernel_Id", "Kernel_Name",
             "Correlation_Id", "Start_Timestamp", "End_Timestamp", "LDS_Block_Size", "Scratch_Size", "VGPR_Count",
             "Accum_VGPR_Count", "SGPR_Count", "Workgroup_Size_X", "Workgroup_Size_Y", "Workgroup_Size_Z",
             "Grid_Size_X", "Grid_Size_Y", "Grid_Size_Z"]

# two dispatches: (agent, start, end, lds, vgpr, wg xyz, grid xyz in work-items)
DISPATCHES = [
    (2, 1_000_000_000_000_123, 1_000_000_000_050_123, 1024, 32, (256, 1, 1), (1000, 1, 1)),
    (3, 1_000_000_000_060_000, 1_000_000_000_090_500, 0, 64, (16, 16, 1), (512, 300, 2)),
]


def v3_row(header: list[str], i: int, d, agent_label: str = "") -> list:
    agent, start, end, lds, vgpr, wg, grid = d
    values = {
        "Kind": "KERNEL_DISPATCH", "Agent_Id": f"{agent_label}{agent}" if agent_label else agent, "Queue_Id": 1,
        "Stream_Id": 5, "Thread_Id": 4242, "Dispatch_Id": i + 1, "Kernel_Id": 7 + i,
        "Kernel_Name": f"void kern{i}<float>(float*, int)", "Correlation_Id": 100 + i,
        "Start_Timestamp": start, "End_Timestamp": end, "Private_Segment_Size": 0, "Group_Segment_Size": lds,
        "LDS_Block_Size": lds, "Scratch_Size": 0, "VGPR_Count": vgpr, "Accum_VGPR_Count": 0, "SGPR_Count": 32,
        "Workgroup_Size_X": wg[0], "Workgroup_Size_Y": wg[1], "Workgroup_Size_Z": wg[2],
        "Grid_Size_X": grid[0], "Grid_Size_Y": grid[1], "Grid_Size_Z": grid[2],
    }
    return [values[h] for h in header]


@pytest.mark.parametrize("header", [V3_2024_05, V3_2024_07, V3_2025_STREAM, V3_LATEST],
                         ids=["2024-05", "2024-07", "2025-stream", "latest"])
def test_v3_header_variants(tmp_path, header):
    path = write_csv(tmp_path / "run_kernel_trace.csv", header, [v3_row(header, i, d) for i, d in enumerate(DISPATCHES)])
    assert detect(path) == "rocprof-csv"
    k = load_trace(path).kernels
    assert k["start_ns"].tolist() == [d[1] for d in DISPATCHES]  # > 2**53: exact
    assert k["dur_ns"].tolist() == [d[2] - d[1] for d in DISPATCHES]
    assert k["device_id"].tolist() == [2, 3]
    assert [list(t) for t in zip(k["grid_x"], k["grid_y"], k["grid_z"])] == [[4, 1, 1], [32, 19, 2]]
    assert [list(t) for t in zip(k["block_x"], k["block_y"], k["block_z"])] == [[256, 1, 1], [16, 16, 1]]
    assert k["grid_blocks"].tolist() == [4, 32 * 19 * 2]
    assert k["static_smem_bytes"].tolist() == [1024, 0]
    assert k["correlation_id"].tolist() == [100, 101]
    assert k["short_name"].tolist() == ["kern0", "kern1"]
    if "VGPR_Count" in header:
        assert k["registers_per_thread"].tolist() == [32, 64]
    else:
        assert k["registers_per_thread"].isna().all()
    if "Stream_Id" in header:
        assert k["stream_id"].tolist() == [5, 5]
    else:
        assert k["stream_id"].tolist() == [1, 1]  # the HW queue stands in


@pytest.mark.parametrize("label, expected_ids", [("Agent ", [2, 3]), ("GPU ", [2, 3])])
def test_v3_labelled_agent_ids_and_agent_info(tmp_path, label, expected_ids):
    header = V3_LATEST
    path = write_csv(tmp_path / "123_kernel_trace.csv", header,
                     [v3_row(header, i, d, agent_label=label) for i, d in enumerate(DISPATCHES)])
    # the companion agent table (generateCSV.cpp agent_info columns, abridged to the ones read)
    info_header = ["Node_Id", "Logical_Node_Id", "Agent_Type", "Wave_Front_Size", "Cu_Count", "Lds_Size_In_Kb",
                   "Max_Waves_Per_Cu", "Workgroup_Max_Size", "Gfx_Target_Version", "Name", "Vendor_Name",
                   "Product_Name"]
    agents = [[0, 0, "CPU", 0, 64, 0, 0, 0, 0, "AMD EPYC", "CPU", "AMD EPYC"], [1, 1, "CPU", 0, 64, 0, 0, 0, 0, "AMD EPYC", "CPU", "AMD EPYC"]]
    agents += [[n, n, "GPU", 64, 304, 64, 32, 1024, 90402, "gfx942", "AMD", "AMD Instinct MI300X"] for n in range(2, 6)]
    write_csv(tmp_path / "123_agent_info.csv", info_header, agents)
    trace = load_trace(path)
    assert trace.kernels["device_id"].tolist() == expected_ids
    dev = trace.devices.set_index("device_id")
    assert dev.loc[2, "sm_count"] == 304 and dev.loc[2, "name"] == "AMD Instinct MI300X"
    assert dev.loc[2, "arch"] == "gfx942" and dev.loc[2, "warp_size"] == 64
    assert dev.loc[2, "smem_per_sm_bytes"] == 64 * 1024


def test_v3_counter_collection_one_kernel_per_dispatch(tmp_path):
    header = ["Correlation_Id", "Dispatch_Id", "Agent_Id", "Queue_Id", "Process_Id", "Thread_Id", "Grid_Size",
              "Kernel_Id", "Kernel_Name", "Workgroup_Size", "LDS_Block_Size", "Scratch_Size", "VGPR_Count",
              "SGPR_Count", "Counter_Name", "Counter_Value", "Start_Timestamp", "End_Timestamp"]
    rows = []
    for disp, grid in ((1, 4096), (2, 100)):
        for counter in ("SQ_WAVES", "GRBM_COUNT"):
            rows.append([disp, disp, 2, 1, 99, 99, grid, 3, "kern", 64, 0, 0, 16, 24, counter, 1.0, 1000 * disp, 1000 * disp + 500])
    k = load_trace(write_csv(tmp_path / "x_counter_collection.csv", header, rows)).kernels
    assert len(k) == 2
    assert k["grid_x"].tolist() == [64, 2]  # 4096 / 64, ceil(100 / 64)
    assert k["dur_ns"].tolist() == [500, 500]


# --------------------------------------------------------------------------------------------
# rocprofv2 CSV

V2_OLD = ["Dispatch_ID", "GPU_ID", "Queue_ID", "Queue_Index", "PID", "TID", "GRD", "WGR", "LDS", "SCR", "Arch_VGPR",
          "ACCUM_VGPR", "SGPR", "Wave_Size", "SIG", "OBJ", "Kernel_Name", "Start_Timestamp", "End_Timestamp",
          "Correlation_ID", "SQ_WAVES"]
V2_FILE_PLUGIN_V2 = ["Dispatch_ID", "GPU_ID", "Queue_ID", "PID", "TID", "Grid_Size", "Workgroup_Size",
                     "LDS_Per_Workgroup", "Scratch_Per_Workitem", "Arch_VGPR", "Accum_VGPR", "SGPR", "Wave_Size",
                     "Kernel_Name", "Start_Timestamp", "End_Timestamp", "Correlation_ID"]


@pytest.mark.parametrize("header", [V2_OLD, V2_FILE_PLUGIN_V2], ids=["v2", "file-plugin-v2"])
def test_v2_csv(tmp_path, header):
    def row(i, grid, wg, start, end):
        values = {
            "Dispatch_ID": i, "GPU_ID": 4, "Queue_ID": 1, "Queue_Index": i, "PID": 10, "TID": 10, "GRD": grid,
            "WGR": wg, "LDS": 512, "SCR": 0, "Arch_VGPR": 8, "ACCUM_VGPR": 0, "SGPR": 16, "Wave_Size": 64,
            "SIG": 1, "OBJ": 2, "Kernel_Name": "matrixTranspose(float*, float*, int) (.kd)",
            "Start_Timestamp": start, "End_Timestamp": end, "Correlation_ID": 30 + i, "SQ_WAVES": 1.0,
            "Grid_Size": grid, "Workgroup_Size": wg, "LDS_Per_Workgroup": 512, "Scratch_Per_Workitem": 0,
            "Accum_VGPR": 0,
        }
        return [values[h] for h in header]

    path = write_csv(tmp_path / "results_result.csv", header, [row(1, 1048576, 16, 100, 900), row(2, 1000, 256, 1000, 1100)])
    assert detect(path) == "rocprof-csv"
    trace = load_trace(path)
    k = trace.kernels
    assert trace.meta["variant"] == "rocprofv2"
    assert k["grid_x"].tolist() == [65536, 4]
    assert k["block_x"].tolist() == [16, 256]
    assert k["name"].tolist() == ["matrixTranspose(float*, float*, int)"] * 2
    assert k["short_name"].tolist() == ["matrixTranspose"] * 2
    assert k["dur_ns"].tolist() == [800, 100]
    assert k["device_id"].tolist() == [4, 4]
    assert k["registers_per_thread"].tolist() == [8, 8]


# --------------------------------------------------------------------------------------------
# CSV errors


def test_csv_companion_files_refused(tmp_path):
    api = write_csv(tmp_path / "p_hip_api_trace.csv",
                    ["Domain", "Function", "Process_Id", "Thread_Id", "Correlation_Id", "Start_Timestamp", "End_Timestamp"],
                    [["HIP_RUNTIME_API", "hipMalloc", 1, 1, 1, 10, 20]])
    with pytest.raises(TraceError, match="API trace"):
        load_trace(api)
    assert "kernel_trace.csv" in cli_error(api)


def test_csv_without_timestamps(tmp_path):
    path = write_csv(tmp_path / "results.csv", ["Index", "KernelName", "gpu-id", "grd", "wgr"], [[0, "k", 2, 64, 64]])
    with pytest.raises(TraceError, match="timestamps"):
        load_trace(path)


def test_csv_truncated_last_row(tmp_path):
    src = corpus_file("rocprofv3_kernel_trace.csv")
    data = src.read_bytes()
    cut = tmp_path / "cut_kernel_trace.csv"
    cut.write_bytes(data[: data.rindex(b",1024,1024,1") + 8])  # the last row stops at Grid_Size_Y "10"
    trace = load_trace(cut)
    k = trace.kernels
    assert len(k) == len(csv_rows(src)) - 1  # the cut row is dropped, not read as grid_y = 10
    assert (k["grid_y"] == 1024).all()
    assert any("ends mid-row" in n for n in trace.meta["notes"])


def test_csv_corrupt(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text('"Index","KernelName","gpu-id","grd","wgr","BeginNs","EndNs"\n0,"k",2,64,64,1,2\n1,"k","2,64,64,1,2\n')
    message = cli_error(path)
    assert "results.csv" in message


# --------------------------------------------------------------------------------------------
# rocprofv3 JSON


def test_corpus_rocprofv3_json():
    path = corpus_file("rocprofv3_mi350x_results.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))["rocprofiler-sdk-tool"][0]
    dispatches = doc["buffer_records"]["kernel_dispatch"]
    trace = load_trace(path)
    k = trace.kernels
    assert detect(path) == "rocprofv3-json"
    assert len(k) == len(dispatches) == 43915
    assert k["start_ns"].tolist() == [d["start_timestamp"] for d in dispatches]
    assert int(k["dur_ns"].sum()) == sum(d["end_timestamp"] - d["start_timestamp"] for d in dispatches)
    for axis in "xyz":
        assert k[f"grid_{axis}"].tolist() == [
            ceil_div(d["dispatch_info"]["grid_size"][axis], d["dispatch_info"]["workgroup_size"][axis]) for d in dispatches
        ]
        assert k[f"block_{axis}"].tolist() == [d["dispatch_info"]["workgroup_size"][axis] for d in dispatches]
    symbols = {s["kernel_id"]: s for s in doc["kernel_symbols"]}
    assert k["registers_per_thread"].tolist() == [symbols[d["dispatch_info"]["kernel_id"]]["arch_vgpr_count"] for d in dispatches]
    assert k["correlation_id"].tolist() == [d["correlation_id"]["internal"] for d in dispatches]
    # one GPU ran everything; the CPU agents and the idle GPUs are not devices
    gpus = [a for a in doc["agents"] if a["type"] == 2]
    used = {d["dispatch_info"]["agent_id"]["handle"] for d in dispatches}
    assert len(gpus) == 8 and len(used) == 1
    agent = next(a for a in gpus if a["id"]["handle"] in used)
    dev = trace.devices
    assert dev["device_id"].tolist() == [agent["gpu_index"]] == k["device_id"].unique().tolist()
    assert dev["sm_count"].tolist() == [agent["cu_count"]] == [256]
    assert dev["name"].tolist() == [agent["product_name"]]
    assert dev["arch"].tolist() == [agent["name"]] == ["gfx950"]
    assert dev["max_warps_per_sm"].tolist() == [agent["max_waves_per_cu"]]


def test_corpus_rocprofv3_json_names_and_lds():
    path = corpus_file("rocprofv3_mi350x_results.json.gz")
    k = load_trace(path).kernels
    nccl = k[k["short_name"] == "ncclDevKernel_Generic_1"]
    assert len(nccl) == 1310
    assert nccl["name"].iloc[0] == "ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)"
    assert (nccl["static_smem_bytes"] == 37664).all()
    assert not k["name"].str.endswith(".kd").any()
    # dispatch LDS 2049 over a 1-byte static symbol: 2048 bytes dynamic
    assert ((k["static_smem_bytes"] == 1) & (k["dynamic_smem_bytes"] == 2048)).any()


def _sdk_doc() -> dict:
    """A small rocprofv3 JSON in the layout of generateJSON.cpp (fields abridged)."""
    cpu = {"id": {"handle": 100}, "type": 1, "node_id": 0, "gpu_index": -1, "name": "EPYC", "cu_count": 64}
    gpus = [
        {"id": {"handle": 101 + i}, "type": 2, "node_id": 1 + i, "logical_node_type_id": i, "gpu_index": i,
         "name": "gfx942", "product_name": "AMD Instinct MI300X", "cu_count": 304, "wave_front_size": 64,
         "max_waves_per_cu": 32, "lds_size_in_kb": 64, "workgroup_max_size": 1024, "gfx_target_version": 90402}
        for i in range(2)
    ]
    ops = [{"kind": "NONE", "operations": []}] * 12
    ops[5] = {"kind": "HIP_RUNTIME_API", "operations": ["hipApiName", "hipLaunchKernel", "hipMemcpy"]}
    ops[7] = {"kind": "MARKER_CORE_API", "operations": ["roctxMarkA", "roctxRangePushA", "roctxRangePop"]}
    ops[10] = {"kind": "MEMORY_COPY", "operations": ["MEMORY_COPY_NONE", "MEMORY_COPY_HOST_TO_HOST", "MEMORY_COPY_HOST_TO_DEVICE"]}
    ops[11] = {"kind": "KERNEL_DISPATCH", "operations": ["NONE", "ENQUEUE", "COMPLETE"]}
    symbol = {"kernel_id": 3, "kernel_name": "_Z4gemmPf.kd", "formatted_kernel_name": "gemm(float*)",
              "demangled_kernel_name": "gemm(float*) [clone .kd]", "truncated_kernel_name": "gemm",
              "group_segment_size": 1024, "arch_vgpr_count": 128, "sgpr_count": 40}

    def dispatch(i, start, dur, grid):
        return {"kind": 11, "operation": 2, "thread_id": 7, "correlation_id": {"internal": 10 + i, "external": 0},
                "start_timestamp": start, "end_timestamp": start + dur, "stream_id": {"handle": 2},
                "dispatch_info": {"agent_id": {"handle": 102}, "queue_id": {"handle": 1}, "kernel_id": 3,
                                  "group_segment_size": 1024 + 512, "workgroup_size": {"x": 256, "y": 1, "z": 1},
                                  "grid_size": {"x": grid, "y": 4, "z": 1}}}

    return {"rocprofiler-sdk-tool": [{
        "metadata": {"pid": 7},
        "agents": [cpu, *gpus],
        "strings": {"buffer_records": ops, "marker_api": [{"key": 50, "value": "step 1"}]},
        "kernel_symbols": [symbol],
        "buffer_records": {
            "kernel_dispatch": [dispatch(0, 5000, 100, 1024), dispatch(1, 6000, 250, 1000)],
            "hip_api": [{"kind": 5, "operation": 1, "correlation_id": {"internal": 10, "external": 0},
                         "start_timestamp": 4000, "end_timestamp": 4100, "thread_id": 7}],
            "memory_copy": [{"kind": 10, "operation": 2, "thread_id": 7, "correlation_id": {"internal": 20, "external": 0},
                             "start_timestamp": 3000, "end_timestamp": 3400, "dst_agent_id": {"handle": 102},
                             "src_agent_id": {"handle": 100}, "bytes": 4096}],
            "marker_api": [{"kind": 7, "operation": 1, "correlation_id": {"internal": 50, "external": 0},
                            "start_timestamp": 3900, "end_timestamp": 7000, "thread_id": 7},
                           {"kind": 7, "operation": 2, "correlation_id": {"internal": 51, "external": 0},
                            "start_timestamp": 7000, "end_timestamp": 7001, "thread_id": 7}],
        },
    }]}


@pytest.mark.parametrize("gz", [False, True])
def test_rocprofv3_json_synthetic(tmp_path, gz):
    data = json.dumps(_sdk_doc()).encode()
    path = tmp_path / "p_results.json"
    path.write_bytes(gzip.compress(data) if gz else data)
    assert detect(path) == "rocprofv3-json"
    trace = load_trace(path)
    k = trace.kernels
    assert k["device_id"].tolist() == [1, 1]  # agent handle 102 is the second GPU
    assert k["grid_x"].tolist() == [4, 4] and k["grid_y"].tolist() == [4, 4]  # ceil(1000/256) = 4
    assert k["name"].tolist() == ["gemm(float*)"] * 2 and k["short_name"].tolist() == ["gemm"] * 2
    assert k["static_smem_bytes"].tolist() == [1024, 1024] and k["dynamic_smem_bytes"].tolist() == [512, 512]
    assert k["stream_id"].tolist() == [2, 2]
    assert k["dur_ns"].tolist() == [100, 250]
    assert trace.devices["device_id"].tolist() == [1]
    assert trace.devices["sm_count"].tolist() == [304]
    assert trace.runtime["name"].tolist() == ["hipLaunchKernel"]
    assert trace.runtime["correlation_id"].tolist() == [10]
    m = trace.memcpy
    assert m[["kind", "bytes", "device_id", "dur_ns"]].values.tolist() == [["HtoD", 4096, 1, 400]]
    assert trace.nvtx[["text", "domain", "dur_ns"]].values.tolist() == [["step 1", "roctx", 3100]]


def test_rocprofv3_json_peer_copy_is_ptop(tmp_path):
    # A device-to-device copy from GPU 0 (agent 101) to GPU 1 (agent 102) is a peer copy, as
    # CUPTI names it in nsys and Kineto traces; one within GPU 1 stays DtoD.
    doc = _sdk_doc()
    proc = doc["rocprofiler-sdk-tool"][0]
    proc["strings"]["buffer_records"][10] = {"kind": "MEMORY_COPY", "operations": [
        "MEMORY_COPY_NONE", "MEMORY_COPY_HOST_TO_HOST", "MEMORY_COPY_HOST_TO_DEVICE",
        "MEMORY_COPY_DEVICE_TO_HOST", "MEMORY_COPY_DEVICE_TO_DEVICE"]}
    proc["buffer_records"]["memory_copy"] = [
        {"kind": 10, "operation": 4, "correlation_id": {"internal": 21, "external": 0}, "start_timestamp": 3000 + 1000 * i,
         "end_timestamp": 3500 + 1000 * i, "dst_agent_id": {"handle": 102}, "src_agent_id": {"handle": src}, "bytes": 1 << 20}
        for i, src in enumerate((101, 102))
    ]
    path = tmp_path / "p_results.json"
    path.write_text(json.dumps(doc))
    m = load_trace(path).memcpy
    assert m[["kind", "device_id"]].values.tolist() == [["PtoP", 1], ["DtoD", 1]]


def test_rocprofv3_json_truncated(tmp_path):
    data = json.dumps(_sdk_doc()).encode()
    path = tmp_path / "p_results.json"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated or corrupt rocprofv3 JSON"):
        load_trace(path)
    gz = tmp_path / "q_results.json.gz"
    gz.write_bytes(gzip.compress(data)[:200])
    assert "q_results.json.gz" in cli_error(gz)


def test_rocprofv3_json_without_dispatches(tmp_path):
    doc = _sdk_doc()
    doc["rocprofiler-sdk-tool"][0]["buffer_records"]["kernel_dispatch"] = []
    path = tmp_path / "p_results.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(NoKernelsError):
        load_trace(path)


# --------------------------------------------------------------------------------------------
# rocpd SQLite, built here from the documented schema

UUID = "_0a1b2c3d_4e5f_6071_8293_a4b5c6d7e8f9"
V3_TABLES = """
CREATE TABLE "rocpd_string{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', string TEXT NOT NULL UNIQUE);
CREATE TABLE "rocpd_info_agent{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', nid INTEGER NOT NULL,
    pid INTEGER NOT NULL, type TEXT CHECK (type IN ('CPU', 'GPU', 'NIC')), absolute_index INTEGER, logical_index INTEGER,
    type_index INTEGER, uuid INTEGER, name TEXT, model_name TEXT, vendor_name TEXT, product_name TEXT, user_name TEXT,
    extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE "rocpd_info_thread{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', nid INTEGER NOT NULL,
    ppid INTEGER, pid INTEGER NOT NULL, tid INTEGER NOT NULL, name TEXT, start BIGINT, "end" BIGINT,
    extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE "rocpd_info_kernel_symbol{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', nid INTEGER NOT NULL,
    pid INTEGER NOT NULL, code_object_id INTEGER NOT NULL, kernel_name TEXT, display_name TEXT, kernel_object INTEGER,
    kernarg_segment_size INTEGER, kernarg_segment_alignment INTEGER, group_segment_size INTEGER,
    private_segment_size INTEGER, sgpr_count INTEGER, arch_vgpr_count INTEGER, accum_vgpr_count INTEGER,
    extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE "rocpd_event{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', category_id INTEGER,
    stack_id INTEGER, parent_stack_id INTEGER, correlation_id INTEGER, call_stack JSONB DEFAULT '{{}}' NOT NULL,
    line_info JSONB DEFAULT '{{}}' NOT NULL, extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE "rocpd_region{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', nid INTEGER NOT NULL,
    pid INTEGER NOT NULL, tid INTEGER NOT NULL, start BIGINT NOT NULL, "end" BIGINT NOT NULL, name_id INTEGER NOT NULL,
    event_id INTEGER, extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE "rocpd_kernel_dispatch{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', nid INTEGER NOT NULL,
    pid INTEGER NOT NULL, tid INTEGER, agent_id INTEGER NOT NULL, kernel_id INTEGER NOT NULL, dispatch_id INTEGER NOT NULL,
    queue_id INTEGER NOT NULL, stream_id INTEGER NOT NULL, start BIGINT NOT NULL, "end" BIGINT NOT NULL,
    private_segment_size INTEGER, group_segment_size INTEGER, workgroup_size_x INTEGER NOT NULL,
    workgroup_size_y INTEGER NOT NULL, workgroup_size_z INTEGER NOT NULL, grid_size_x INTEGER NOT NULL,
    grid_size_y INTEGER NOT NULL, grid_size_z INTEGER NOT NULL, region_name_id INTEGER, event_id INTEGER,
    extdata JSONB DEFAULT '{{}}' NOT NULL);
CREATE TABLE "rocpd_memory_copy{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', nid INTEGER NOT NULL,
    pid INTEGER NOT NULL, tid INTEGER, start BIGINT NOT NULL, "end" BIGINT NOT NULL, name_id INTEGER NOT NULL,
    dst_agent_id INTEGER, dst_address INTEGER, src_agent_id INTEGER, src_address INTEGER, size INTEGER NOT NULL,
    queue_id INTEGER, stream_id INTEGER, region_name_id INTEGER, event_id INTEGER, extdata JSONB DEFAULT '{{}}' NOT NULL);
"""
V3_VIEWS = "".join(
    f'CREATE VIEW "rocpd_{t}" AS SELECT * FROM "rocpd_{t}{{u}}";\n'
    for t in ("string", "info_agent", "info_thread", "info_kernel_symbol", "event", "region", "kernel_dispatch", "memory_copy")
)
# 1 << 60 ns: beyond float64's exact integers, so any float detour would show
T0 = 1 << 60


def _agent_extdata(cu: int) -> str:
    return json.dumps({"cu_count": cu, "wave_front_size": 64, "max_waves_per_cu": 32, "lds_size_in_kb": 64,
                       "workgroup_max_size": 1024, "name": "gfx942", "product_name": "AMD Instinct MI300X"})


def _fill_v3(conn: sqlite3.Connection, u: str) -> None:
    conn.executemany(f'INSERT INTO "rocpd_string{u}" (id, string) VALUES (?, ?)',
                     [(1, "HIP_RUNTIME_API"), (2, "hipLaunchKernel"), (3, "MARKER_CORE_API"), (4, "train step"),
                      (5, "MEMORY_COPY_DEVICE_TO_HOST"), (6, "KERNEL_DISPATCH"), (7, "gemm")])
    conn.executemany(f'INSERT INTO "rocpd_info_agent{u}" (id, nid, pid, type, absolute_index, logical_index, type_index, name, product_name, extdata) VALUES (?,?,?,?,?,?,?,?,?,?)',
                     [(0, 1, 1, "CPU", 0, 0, 0, "EPYC", "EPYC", "{}"),
                      (1, 1, 1, "GPU", 1, 1, 0, "gfx942", "AMD Instinct MI300X", _agent_extdata(304)),
                      (2, 1, 1, "GPU", 2, 2, 1, "gfx942", "AMD Instinct MI300X", _agent_extdata(304))])
    conn.execute(f'INSERT INTO "rocpd_info_thread{u}" (id, nid, pid, tid) VALUES (1, 1, 1, 31337)')
    conn.execute(f'INSERT INTO "rocpd_info_kernel_symbol{u}" (id, nid, pid, code_object_id, kernel_name, display_name, group_segment_size, arch_vgpr_count, extdata) '
                 "VALUES (1, 1, 1, 1, '_Z4gemmPf.kd', 'gemm(float*)', 2048, 96, ?)",
                 (json.dumps({"formatted_kernel_name": "gemm(float*)", "truncated_kernel_name": "gemm"}),))
    conn.executemany(f'INSERT INTO "rocpd_event{u}" (id, category_id, stack_id, correlation_id) VALUES (?,?,?,?)',
                     [(1, 1, 500, 0), (2, 3, 501, 0), (3, 6, 500, 0), (4, 6, 502, 0), (5, 6, 503, 0)])
    conn.executemany(f'INSERT INTO "rocpd_region{u}" (id, nid, pid, tid, start, "end", name_id, event_id) VALUES (?,?,?,?,?,?,?,?)',
                     [(1, 1, 1, 1, T0 + 10, T0 + 30, 2, 1), (2, 1, 1, 1, T0, T0 + 5000, 4, 2)])
    # dispatches: grid in work-items (1024x8 over 256x1 workgroups: 4x8), on GPU agent 2
    conn.executemany(f'INSERT INTO "rocpd_kernel_dispatch{u}" (id, nid, pid, tid, agent_id, kernel_id, dispatch_id, queue_id, stream_id, start, "end", private_segment_size, group_segment_size, workgroup_size_x, workgroup_size_y, workgroup_size_z, grid_size_x, grid_size_y, grid_size_z, region_name_id, event_id) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)',
                     [(1, 1, 1, 1, 2, 1, 1, 1, 3, T0 + 100, T0 + 1100, 0, 2048 + 4096, 256, 1, 1, 1024, 8, 1, 7, 3),
                      (2, 1, 1, 1, 2, 1, 2, 1, 3, T0 + 1200, T0 + 1450, 0, 2048, 256, 1, 1, 1000, 1, 1, 7, 4),
                      (3, 1, 1, 1, 2, 1, 3, 1, 3, T0 + 1500, T0 + 1600, 0, 2048, 64, 1, 1, 64, 1, 1, 7, 5)])
    conn.execute(f'INSERT INTO "rocpd_memory_copy{u}" (id, nid, pid, tid, start, "end", name_id, dst_agent_id, src_agent_id, size, stream_id) '
                 "VALUES (1, 1, 1, 1, ?, ?, 5, 0, 2, 65536, 3)", (T0 + 2000, T0 + 2600))


def make_rocpd_v3(path: Path, views: bool = True) -> Path:
    conn = sqlite3.connect(path)
    conn.executescript(V3_TABLES.format(u=UUID) + (V3_VIEWS.format(u=UUID) if views else ""))
    _fill_v3(conn, UUID)
    conn.commit()
    conn.close()
    return path


def make_rocpd_v4(path: Path) -> Path:
    """Schema 4.1 layout: dispatches, regions and copies point at rocpd_track rows."""
    u = UUID
    conn = sqlite3.connect(path)
    conn.executescript(f"""
    CREATE TABLE "rocpd_string{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', string TEXT NOT NULL UNIQUE);
    CREATE TABLE "rocpd_info_category{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', name TEXT NOT NULL, extdata JSONB DEFAULT '{{}}' NOT NULL);
    CREATE TABLE "rocpd_info_agent{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', nid INTEGER NOT NULL, pid INTEGER NOT NULL,
        type TEXT, absolute_index INTEGER, logical_index INTEGER, type_index INTEGER, uuid INTEGER, name TEXT, generic_name TEXT,
        model_name TEXT, vendor_name TEXT, product_name TEXT, extdata JSONB DEFAULT '{{}}' NOT NULL);
    CREATE TABLE "rocpd_info_kernel_symbol{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', nid INTEGER NOT NULL, pid INTEGER NOT NULL,
        code_object_id INTEGER NOT NULL, kernel_name TEXT, display_name TEXT, group_segment_size INTEGER, arch_vgpr_count INTEGER,
        extdata JSONB DEFAULT '{{}}' NOT NULL);
    CREATE TABLE "rocpd_info_thread{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', nid INTEGER NOT NULL, ppid INTEGER, pid INTEGER NOT NULL, tid INTEGER NOT NULL);
    CREATE TABLE "rocpd_track{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', nid INTEGER NOT NULL, ppid INTEGER, pid INTEGER,
        tid INTEGER, agent_id INTEGER, queue_id INTEGER, stream_id INTEGER, name_id INTEGER, extdata JSONB DEFAULT '{{}}' NOT NULL);
    CREATE TABLE "rocpd_event{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', category_id INTEGER, stack_id INTEGER,
        parent_stack_id INTEGER, correlation_id INTEGER, extdata JSONB DEFAULT '{{}}' NOT NULL);
    CREATE TABLE "rocpd_region{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', track_id INTEGER NOT NULL, name_id INTEGER NOT NULL,
        start BIGINT NOT NULL, "end" BIGINT NOT NULL, event_id INTEGER, extdata JSONB DEFAULT '{{}}' NOT NULL);
    CREATE TABLE "rocpd_kernel_dispatch{u}" (id INTEGER PRIMARY KEY, guid TEXT NOT NULL DEFAULT 'g1', track_id INTEGER NOT NULL,
        kernel_id INTEGER NOT NULL, dispatch_id INTEGER NOT NULL, start BIGINT NOT NULL, "end" BIGINT NOT NULL, private_segment_size INTEGER,
        group_segment_size INTEGER, workgroup_size_x INTEGER NOT NULL, workgroup_size_y INTEGER NOT NULL, workgroup_size_z INTEGER NOT NULL,
        grid_size_x INTEGER NOT NULL, grid_size_y INTEGER NOT NULL, grid_size_z INTEGER NOT NULL, region_name_id INTEGER, event_id INTEGER,
        extdata JSONB DEFAULT '{{}}' NOT NULL);
    INSERT INTO "rocpd_string{u}" (id, string) VALUES (1, 'hipMemcpy'), (2, 'gemm');
    INSERT INTO "rocpd_info_category{u}" (id, name) VALUES (1, 'HIP_RUNTIME_API_EXT'), (2, 'KERNEL_DISPATCH');
    INSERT INTO "rocpd_info_agent{u}" (id, nid, pid, type, absolute_index, logical_index, type_index, name, generic_name, product_name, extdata)
        VALUES (0, 1, 1, 'CPU', 0, 0, 0, NULL, 'EPYC', 'EPYC', '{{}}'), (1, 1, 1, 'GPU', 1, 1, 0, NULL, 'gfx950', 'AMD Instinct MI355X', '{{"cu_count": 256}}');
    INSERT INTO "rocpd_info_kernel_symbol{u}" (id, nid, pid, code_object_id, kernel_name, display_name, group_segment_size, arch_vgpr_count)
        VALUES (1, 1, 1, 1, '_Z4gemmv.kd', 'gemm()', 0, 64);
    INSERT INTO "rocpd_info_thread{u}" (id, nid, pid, tid) VALUES (1, 1, 1, 777);
    INSERT INTO "rocpd_track{u}" (id, nid, pid, tid, agent_id, queue_id, stream_id) VALUES (1, 1, 1, 1, NULL, NULL, NULL), (2, 1, 1, 1, 1, 4, 9);
    INSERT INTO "rocpd_event{u}" (id, category_id, stack_id) VALUES (1, 1, 70), (2, 2, 70);
    INSERT INTO "rocpd_region{u}" (id, track_id, name_id, start, "end", event_id) VALUES (1, 1, 1, 100, 150, 1);
    INSERT INTO "rocpd_kernel_dispatch{u}" (id, track_id, kernel_id, dispatch_id, start, "end", group_segment_size, workgroup_size_x,
        workgroup_size_y, workgroup_size_z, grid_size_x, grid_size_y, grid_size_z, event_id)
        VALUES (1, 2, 1, 1, 200, 900, 0, 128, 2, 1, 1280, 64, 3, 2);
    """)
    conn.commit()
    conn.close()
    return path


def test_rocpd_v3(tmp_path):
    path = make_rocpd_v3(tmp_path / "results.db")
    before = path.read_bytes()
    assert detect(path) == "rocpd"
    trace = load_trace(path)
    k = trace.kernels
    assert k["start_ns"].tolist() == [T0 + 100, T0 + 1200, T0 + 1500]
    assert k["dur_ns"].tolist() == [1000, 250, 100]
    assert [list(t) for t in zip(k["grid_x"], k["grid_y"], k["grid_z"])] == [[4, 8, 1], [4, 1, 1], [1, 1, 1]]
    assert k["block_x"].tolist() == [256, 256, 64]
    assert k["device_id"].tolist() == [1, 1, 1]  # agent row 2 is the second GPU (type_index 1)
    assert k["stream_id"].tolist() == [3, 3, 3]
    assert k["name"].tolist() == ["gemm(float*)"] * 3 and k["short_name"].tolist() == ["gemm"] * 3
    assert k["registers_per_thread"].tolist() == [96] * 3
    assert k["static_smem_bytes"].tolist() == [2048] * 3 and k["dynamic_smem_bytes"].tolist() == [4096, 0, 0]
    assert k["correlation_id"].tolist() == [500, 502, 503]
    dev = trace.devices
    assert dev[["device_id", "sm_count", "name", "arch", "vendor"]].values.tolist() == [[1, 304, "AMD Instinct MI300X", "gfx942", "amd"]]
    assert trace.memcpy[["kind", "bytes", "device_id", "dur_ns"]].values.tolist() == [["DtoH", 65536, 1, 600]]
    assert trace.runtime[["name", "thread_id", "correlation_id"]].values.tolist() == [["hipLaunchKernel", 31337, 500]]
    assert trace.nvtx[["text", "domain", "dur_ns"]].values.tolist() == [["train step", "roctx", 5000]]
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.db"]  # no journal/-wal/-shm left


def test_rocpd_peer_copy_is_ptop(tmp_path):
    # Agent rows 1 and 2 are GPUs 0 and 1: a DEVICE_TO_DEVICE copy between them is a peer
    # copy (PtoP, as CUPTI names it), one within GPU 1 stays DtoD.
    path = make_rocpd_v3(tmp_path / "results.db")
    conn = sqlite3.connect(path)
    conn.execute(f'INSERT INTO "rocpd_string{UUID}" (id, string) VALUES (8, ?)', ("MEMORY_COPY_DEVICE_TO_DEVICE",))
    conn.executemany(f'INSERT INTO "rocpd_memory_copy{UUID}" (id, nid, pid, tid, start, "end", name_id, dst_agent_id, src_agent_id, size, stream_id) '
                     "VALUES (?, 1, 1, 1, ?, ?, 8, 2, ?, 4096, 3)",
                     [(2, T0 + 3000, T0 + 3100, 1), (3, T0 + 4000, T0 + 4100, 2)])
    conn.commit()
    conn.close()
    m = load_trace(path).memcpy
    assert m[["kind", "device_id", "dur_ns"]].values.tolist() == [["DtoH", 1, 600], ["PtoP", 1, 100], ["DtoD", 1, 100]]


def test_rocpd_suffixed_tables_without_views(tmp_path):
    trace = load_trace(make_rocpd_v3(tmp_path / "novw.db", views=False))
    assert len(trace.kernels) == 3 and trace.devices["sm_count"].tolist() == [304]


def test_rocpd_v4_track_layout(tmp_path):
    path = make_rocpd_v4(tmp_path / "v4.db")
    assert detect(path) == "rocpd"
    trace = load_trace(path)
    k = trace.kernels
    assert k[["device_id", "stream_id", "start_ns", "dur_ns", "grid_x", "grid_y", "grid_z", "block_threads"]].values.tolist() == [
        [0, 9, 200, 700, 10, 32, 3, 256]
    ]
    assert k["name"].tolist() == ["gemm()"] and k["short_name"].tolist() == ["gemm"]
    assert trace.devices[["name", "arch", "sm_count"]].values.tolist() == [["AMD Instinct MI355X", "gfx950", 256]]
    assert trace.runtime[["name", "thread_id"]].values.tolist() == [["hipMemcpy", 777]]


def test_rocpd_and_nsys_sniffers_keep_apart(tmp_path):
    nsys_like = tmp_path / "report.sqlite"
    conn = sqlite3.connect(nsys_like)
    conn.executescript("CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT);"
                       "CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INT, end INT);")
    conn.close()
    head = nsys_like.read_bytes()[:4096]
    assert rocpd.sniff(nsys_like, head) is False
    db = make_rocpd_v3(tmp_path / "r.db")
    assert rocpd.sniff(db, db.read_bytes()[:4096]) is True
    from advisor.traces import nsys_sqlite

    assert nsys_sqlite.sniff(db, db.read_bytes()[:4096]) is False


def test_rocpd_without_dispatches(tmp_path):
    path = make_rocpd_v3(tmp_path / "empty.db")
    conn = sqlite3.connect(path)
    conn.execute(f'DELETE FROM "rocpd_kernel_dispatch{UUID}"')
    conn.commit()
    conn.close()
    with pytest.raises(NoKernelsError):
        load_trace(path)


def test_rocpd_truncated(tmp_path):
    path = make_rocpd_v3(tmp_path / "full.db")
    cut = tmp_path / "cut.db"
    data = path.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError):
        load_trace(cut)
    assert "cut.db" in cli_error(cut)


def test_rocpd_hostile_table_name_not_used(tmp_path):
    path = make_rocpd_v3(tmp_path / "h.db", views=False)
    conn = sqlite3.connect(path)
    conn.execute('CREATE TABLE "rocpd_kernel_dispatch_x"" ; DROP TABLE y; --" (id INTEGER)')
    conn.commit()
    conn.close()
    trace = load_trace(path)
    assert len(trace.kernels) == 3
    assert any("unexpected name suffix" in n for n in trace.meta["notes"])


def test_math_helper_matches_reader_convention():
    # the tests' own ceil division agrees with math.ceil on the corpus-like values used above
    assert [ceil_div(a, b) for a, b in ((1000, 256), (1024, 256), (300, 16))] == [math.ceil(a / b) for a, b in ((1000, 256), (1024, 256), (300, 16))]


def test_csv_gzip_told_by_content(tmp_path):
    src = corpus_file("rocprofv3_kernel_trace.csv")
    packed = tmp_path / "packed_kernel_trace.csv"  # gzip data under a .csv name
    packed.write_bytes(gzip.compress(src.read_bytes()))
    assert detect(packed) == "rocprof-csv"
    assert load_trace(packed).kernels.equals(load_trace(src).kernels)


# --------------------------------------------------------------------------------------------
# counter-collection CSVs: kernels the profiler ran one at a time (rocprofiler-sdk counter
# collection docs; rocprof-compute profile-mode docs)

CC_HEADER = ["Correlation_Id", "Dispatch_Id", "Agent_Id", "Queue_Id", "Process_Id", "Thread_Id", "Grid_Size",
             "Kernel_Id", "Kernel_Name", "Workgroup_Size", "LDS_Block_Size", "Scratch_Size", "VGPR_Count",
             "Accum_VGPR_Count", "SGPR_Count", "Counter_Name", "Counter_Value", "Start_Timestamp", "End_Timestamp"]


def _gappy_dispatches() -> list[tuple[int, int, int]]:
    """(queue, start, end): 40 tiny kernels 5 us apart (launch-bound by the timeline), then
    three 50 us kernels 2 ms apart (an idle GPU by the timeline)."""
    out = [(1, 1_000_000 + 10_000 * i, 1_000_000 + 10_000 * i + 5_000) for i in range(40)]
    out += [(2, 2_000_000 + 2_000_000 * i, 2_000_000 + 2_000_000 * i + 50_000) for i in range(3)]
    return out


def _counter_collection_csv(path: Path) -> Path:
    rows = []
    for i, (queue, start, end) in enumerate(_gappy_dispatches()):
        for counter, value in (("SQ_WAVES", 64), ("GRBM_GUI_ACTIVE", 9000)):
            rows.append([i + 1, i + 1, "Agent 2", queue, 100, 100, 4096, 11, "k(float*)", 256, 0, 0, 16, 0, 16,
                         counter, value, start, end])
    return write_csv(path, CC_HEADER, rows)


def _kernel_trace_csv(path: Path) -> Path:
    rows = []
    for i, (queue, start, end) in enumerate(_gappy_dispatches()):
        rows.append(v3_row(V3_LATEST, i, (2, start, end, 0, 16, (256, 1, 1), (4096, 1, 1))))
        rows[-1][V3_LATEST.index("Queue_Id")] = rows[-1][V3_LATEST.index("Stream_Id")] = queue
        rows[-1][V3_LATEST.index("Kernel_Name")] = "k(float*)"
    return write_csv(path, V3_LATEST, rows)


def _timeline_judgements(trace) -> tuple[set[str], set[str]]:
    from advisor.diagnose.diagnosis import diagnose

    d = diagnose(trace)
    return {g.check for g in d.gates}, {f.symptom for f in d.findings}


def test_counter_collection_timeline_marked_serialized(tmp_path):
    trace = load_trace(_counter_collection_csv(tmp_path / "run_counter_collection.csv"), sm_count=304)
    assert trace.meta["variant"] == "rocprofv3 counter_collection"
    assert len(trace.kernels) == 43  # one kernel per dispatch, not per counter
    assert trace.meta["serialized_ranks"] == [0]
    (note,) = [n for n in trace.meta["notes"] if "counter-collection" in n]
    assert "one kernel at a time" in note and "not the program's" in note
    assert "GPU idle, launch-gap and overlap findings are not made" in note


def test_counter_collection_skips_idle_and_launch_gap_judgements(tmp_path):
    # the same dispatches traced without counters: the timeline is the program's
    gates, symptoms = _timeline_judgements(load_trace(_kernel_trace_csv(tmp_path / "run_kernel_trace.csv"), sm_count=304))
    assert "gpu_idle" in gates and "launch_overhead" in symptoms
    # under counter collection the gaps are the profiler's: no idle or launch-gap judgement
    gates, symptoms = _timeline_judgements(load_trace(_counter_collection_csv(tmp_path / "run_counter_collection.csv"), sm_count=304))
    assert "gpu_idle" not in gates and "launch_overhead" not in symptoms


def test_serialized_rank_survives_merge(tmp_path):
    trace = load_trace([_kernel_trace_csv(tmp_path / "a_kernel_trace.csv"),
                        _counter_collection_csv(tmp_path / "b_counter_collection.csv")], sm_count=304)
    assert trace.ranks == [0, 1] and trace.meta["serialized_ranks"] == [1]
    from advisor.diagnose.diagnosis import diagnose

    d = diagnose(trace)
    assert {g.rank for g in d.gates if g.check == "gpu_idle"} == {0}
    assert {f.rank for f in d.findings if f.symptom == "launch_overhead" and f.evidence.get("pattern") == "tiny back-to-back kernels"} == {0}


# rocprof-compute pmc_perf.csv: the rocprofv2-style layout its CSV join writes (join_prof:
# Queue_ID/PID/TID dropped, Start/End_Timestamp the mean over counter passes), and the long
# form of its rocpd path (rocprofiler-compute tests: GPU_ID,Dispatch_ID,...,Counter_Name)
PMC_WIDE = ["Dispatch_ID", "Kernel_Name", "GPU_ID", "Grid_Size", "Workgroup_Size", "LDS_Per_Workgroup",
            "Scratch_Per_Workitem", "Arch_VGPR", "Accum_VGPR", "SGPR", "Wave_Size", "Correlation_ID",
            "SQ_WAVES", "GRBM_GUI_ACTIVE", "Start_Timestamp", "End_Timestamp"]
PMC_LONG = ["GPU_ID", "Dispatch_ID", "Grid_Size", "Workgroup_Size", "LDS_Per_Workgroup", "Scratch_Per_Workitem",
            "Arch_VGPR", "Accum_VGPR", "SGPR", "Kernel_Name", "Start_Timestamp", "End_Timestamp", "Kernel_ID",
            "Counter_Name", "Counter_Value"]


def test_rocprof_compute_pmc_perf_wide(tmp_path):
    path = tmp_path / "pmc_perf.csv"
    path.write_text(",".join(PMC_WIDE) + "\n"
                    "0,gemm_a(float*),0,1048576,256,0,0,64,0,32,64,1,4096,9000,1000000.25,1100000.75\n"
                    "1,side(float*),0,65536,256,0,0,16,0,16,64,2,256,800,2.41419276535e+15,2.41419276536e+15\n")
    trace = load_trace(path, sm_count=304)
    k = trace.kernels
    assert trace.meta["variant"] == "rocprof-compute pmc_perf.csv"
    assert k["start_ns"].tolist() == [1000000, 2414192765350000]  # averages rounded to whole ns
    assert k["end_ns"].tolist() == [1100001, 2414192765360000]
    assert k["grid_x"].tolist() == [4096, 256]
    assert trace.meta["serialized_ranks"] == [0]
    assert any(n.startswith("pmc_perf.csv is a counter-collection file (rocprof-compute") for n in trace.meta["notes"])


def test_rocprof_compute_pmc_perf_long_form(tmp_path):
    rows = []
    for disp, start in ((0, 10_000), (1, 20_000)):
        for counter, value in (("SQ_WAVES", 4), ("SQ_BUSY_CYCLES", 100)):
            rows.append([0, disp, 256, 64, 0, 0, 8, 0, 16, f"kernel_{disp}", start, start + 500, disp, counter, value])
    trace = load_trace(write_csv(tmp_path / "workload.csv", PMC_LONG, rows), sm_count=304)
    assert trace.meta["variant"] == "rocprof-compute pmc_perf.csv"  # told by content, whatever the name
    assert trace.kernels["name"].tolist() == ["kernel_0", "kernel_1"]  # one kernel per dispatch
    assert trace.meta["serialized_ranks"] == [0]


def test_kernel_trace_is_not_marked_serialized(tmp_path):
    trace = load_trace(_kernel_trace_csv(tmp_path / "run_kernel_trace.csv"), sm_count=304)
    assert "serialized_ranks" not in trace.meta
    assert not any("counter-collection" in n for n in trace.meta["notes"])


def test_v1_csv_with_counter_columns_is_marked_serialized(tmp_path):
    # rocprof v1 -i input.txt (pmc: SQ_WAVES ...) appends one column per counter to results.csv;
    # per-dispatch counters serialize the dispatches, as for rocprofv3 counter collection
    src = corpus_file("rocprof_v1_results.csv")
    rows = csv_rows(src)[:6]
    header = list(rows[0]) + ["SQ_WAVES", "SQ_INSTS_VALU", "FETCH_SIZE", "WRITE_SIZE", "VALUBusy"]
    path = write_csv(tmp_path / "results.csv", header,
                     [[r[h] for h in rows[0]] + [1, 2, 3.5, 4.5, 50.0] for r in rows])
    trace = load_trace(path)
    assert trace.meta["variant"] == "rocprof v1"
    assert trace.meta["serialized_ranks"] == [0]
    (note,) = [n for n in trace.meta["notes"] if "counter-collection" in n]
    assert "SQ_WAVES, SQ_INSTS_VALU, FETCH_SIZE, WRITE_SIZE and 1 more" in note
    assert len(trace.kernels) == 6
    # the corpus file itself (kernel columns only) is a plain trace
    assert "serialized_ranks" not in load_trace(src).meta


def test_v1_csv_of_rocm_5_2_is_not_a_counter_run(tmp_path):
    # before ROCm 5.3 rocprofiler's tool wrote vgpr, sgpr, fbar, sig, obj into every record
    header = ["Index", "KernelName", "gpu-id", "queue-id", "queue-index", "pid", "tid", "grd", "wgr", "lds", "scr",
              "vgpr", "sgpr", "fbar", "sig", "obj", "DispatchNs", "BeginNs", "EndNs", "CompleteNs"]
    row = [0, "k", 2, 0, 0, 7, 7, 4096, 256, 0, 0, 8, 16, 0, "0x0", "0x1", 10, 20, 120, 130]
    trace = load_trace(write_csv(tmp_path / "results.csv", header, [row]))
    assert trace.meta["variant"] == "rocprof v1" and "serialized_ranks" not in trace.meta


@pytest.mark.parametrize("header, serialized", [(V2_OLD, True), (V2_FILE_PLUGIN_V2, False)], ids=["SQ_WAVES", "plain"])
def test_v2_csv_counter_columns_mark_serialized(tmp_path, header, serialized):
    values = {"Dispatch_ID": 1, "GPU_ID": 4, "Queue_ID": 1, "Queue_Index": 1, "PID": 10, "TID": 10, "GRD": 1024,
              "WGR": 64, "LDS": 0, "SCR": 0, "Arch_VGPR": 8, "ACCUM_VGPR": 0, "SGPR": 16, "Wave_Size": 64, "SIG": 1,
              "OBJ": 2, "Kernel_Name": "k", "Start_Timestamp": 100, "End_Timestamp": 900, "Correlation_ID": 3,
              "SQ_WAVES": 16, "Grid_Size": 1024, "Workgroup_Size": 64, "LDS_Per_Workgroup": 0,
              "Scratch_Per_Workitem": 0, "Accum_VGPR": 0}
    trace = load_trace(write_csv(tmp_path / "results_result.csv", header, [[values[h] for h in header]]))
    assert trace.meta["variant"] == "rocprofv2"
    assert ("serialized_ranks" in trace.meta) is serialized


# --------------------------------------------------------------------------------------------
# rocprofv3 LDS_Block_Size: static LDS only (generateCSV.cpp: lds_block_size_v from the kernel
# symbol), while the older Group_Segment_Size is the dispatch's static + dynamic value


def test_v3_lds_block_size_leaves_dynamic_lds_unknown_with_a_note(tmp_path):
    latest = load_trace(write_csv(tmp_path / "new_kernel_trace.csv", V3_LATEST,
                                  [v3_row(V3_LATEST, i, d) for i, d in enumerate(DISPATCHES)]))
    assert latest.kernels["static_smem_bytes"].tolist() == [1024, 0]
    assert latest.kernels["dynamic_smem_bytes"].isna().all()
    (note,) = [n for n in latest.meta["notes"] if "LDS_Block_Size" in n]
    assert "static LDS only" in note and "occupancy" in note
    old = load_trace(write_csv(tmp_path / "old_kernel_trace.csv", V3_2024_05,
                               [v3_row(V3_2024_05, i, d) for i, d in enumerate(DISPATCHES)]))
    assert not any("LDS_Block_Size" in n for n in old.meta["notes"])


# --------------------------------------------------------------------------------------------
# rocprof v1 results.json (--hip-trace / --sys-trace), written here the way ROCm/rocprofiler's
# bin/sqlitedb.py writes it: open_json, label_json, dump_json (every value a string, args =
# the table row without Index and __ columns), flow_json, metadata_json, close_json

V1_T0 = 1_000_000_000_000_123  # beyond float64's exact integers


def _v1_event(name: str, pid, tid, begin: int, end: int, args: dict) -> str:
    vals = [f'"name":"{name}"', f'"pid":"{pid}"', f'"tid":"{tid}"', f'"ts":"{begin // 1000}"', f'"dur":"{(end - begin) // 1000}"']
    body = ",\n    ".join(f'"{k}":"{v}"' for k, v in args.items())
    return ',{"ph":"X",' + ",".join(vals) + ',\n  "args":{\n    ' + body + "\n  }\n}\n"


def _v1_results_json(path: Path, dispatches: bool = True) -> Path:
    out = ['{ "traceEvents":[{}\n']
    for i, label in enumerate(("CPU HIP API", "COPY", "GPU0", "GPU Barriers0")):
        pid = (2, 1, 6, 518)[i]
        out.append(f',{{"args":{{"name":"{label}"}},"ph":"M","pid":{pid},"name":"process_name","sort_index":{i}}}\n')
    kernels = [(V1_T0 + 10_000 * i, V1_T0 + 10_000 * i + 2_647, grd) for i, grd in enumerate((134217728, 1000))]
    if dispatches:
        for i, (b, e, grd) in enumerate(kernels):
            out.append(_v1_event("laplacian_kernel(float*) [clone .kd]", 6, 0, b, e, {
                "KernelName": "laplacian_kernel(float*) [clone .kd]", "gpu-id": 0, "queue-id": 0, "queue-index": i,
                "pid": 4242, "tid": 4242, "grd": grd, "wgr": 256, "lds": 0, "scr": 0, "arch_vgpr": 24, "accum_vgpr": 0,
                "sgpr": 16, "wave_size": 64, "sig": "0x0", "obj": "0x7f", "DispatchNs": b - 500, "BeginNs": b, "EndNs": e,
                "CompleteNs": e + 100, "DurationNs": e - b}))
    for name, b, e in (("hipMemcpy", V1_T0 - 5_000, V1_T0 - 1_000), ("hipLaunchKernel", V1_T0 - 900, V1_T0 - 800),
                       ("hipDeviceSynchronize", V1_T0 + 20_000, V1_T0 + 20_100)):
        out.append(_v1_event(name, 4242, 4243, b, e, {"BeginNs": b, "EndNs": e, "pid": 4242, "tid": 4243, "Name": name,
                                                      "args": "( stream(0) )", "Data": ""}))
    # HIP activity (OPS): the copy, and the kernels again without launch configuration
    ops = [("CopyHostToDevice", V1_T0 - 4_000, V1_T0 - 2_000)] + [("laplacian_kernel(float*)", b, e) for b, e, _ in kernels]
    ops.append(("<barrier packet>", V1_T0 + 30_000, V1_T0 + 30_001))
    for name, b, e in ops:
        out.append(_v1_event(name, 6, 0, b, e, {"BeginNs": b, "EndNs": e, "dev-id": 0, "queue-id": 0, "Name": name,
                                                "pid": 4242, "tid": 4243, "stream-id": 0, "Data": ""}))
    out.append(f',{{"ts":{V1_T0 // 1000},"ph":"s","cat":"DataFlow","id":0,"pid":2,"tid":4243,"name":"dep"}}\n')
    out.append('],\n"otherData": {\n    "ROCm version": "5.7"\n  }\n}')
    path.write_text("".join(out))
    return path


@pytest.mark.parametrize("gz", [False, True])
def test_rocprof_v1_results_json(tmp_path, gz):
    path = _v1_results_json(tmp_path / "results.json")
    if gz:
        packed = tmp_path / "results.json.gz"
        packed.write_bytes(gzip.compress(path.read_bytes()))
        path = packed
    assert detect(path) == "rocprof-v1-json"  # a Chrome trace, but not the PyTorch profiler's
    trace = load_trace(path, sm_count=104)
    k = trace.kernels
    assert k["start_ns"].tolist() == [V1_T0, V1_T0 + 10_000]  # BeginNs, exact
    assert k["dur_ns"].tolist() == [2_647, 2_647]
    # grd counts work-items: ceil(grd / wgr) workgroups, as for results.csv
    assert k["grid_x"].tolist() == [134217728 // 256, ceil_div(1000, 256)] and k["block_x"].tolist() == [256, 256]
    assert k["name"].tolist() == ["laplacian_kernel(float*)"] * 2
    assert k["registers_per_thread"].tolist() == [24, 24] and k["device_id"].tolist() == [0, 0]
    rt = trace.runtime
    assert rt["name"].tolist() == ["hipMemcpy", "hipLaunchKernel", "hipDeviceSynchronize"]
    assert rt["thread_id"].tolist() == [4243] * 3 and rt["start_ns"].tolist()[0] == V1_T0 - 5_000
    m = trace.memcpy
    assert m[["kind", "op", "device_id", "dur_ns"]].values.tolist() == [["HtoD", "memcpy", 0, 2_000]]
    assert trace.devices["sm_count"].tolist() == [104]


def test_rocprof_v1_results_json_activity_only(tmp_path):
    # no dispatch records: the kernels come from the HIP activity, without launch configuration
    trace = load_trace(_v1_results_json(tmp_path / "results.json", dispatches=False))
    k = trace.kernels
    assert k["name"].tolist() == ["laplacian_kernel(float*)"] * 2  # barrier packets are not kernels
    assert k["start_ns"].tolist() == [V1_T0, V1_T0 + 10_000]
    assert k["grid_x"].isna().all()
    assert any("HIP activity" in n for n in trace.meta["notes"])


def test_rocprof_v1_results_json_without_gpu_events(tmp_path):
    path = tmp_path / "results.json"
    path.write_text('{ "traceEvents":[{}\n,{"args":{"name":"COPY"},"ph":"M","pid":1,"name":"process_name","sort_index":0}\n'
                    '],\n"otherData": {\n  }\n}')
    with pytest.raises(NoKernelsError) as err:
        load_trace(path)
    assert detect(path) == "rocprof-v1-json"
    assert "results.json" in str(err.value)
