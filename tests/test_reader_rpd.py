"""rocmProfileData (RPD) SQLite traces: the vLLM MI300 corpus file, checked against counts read
by hand with sqlite3, and small RPDs written here in the schema's own DDL (rocmProfileData
`tableSchema.cmd`, as the corpus file declares it) for the edge cases."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner
from tracefiles import write_nsys, write_rocpd

from advisor.cli import cli
from advisor.errors import NoKernelsError, TraceError
from advisor.traces import detect, load_trace, nsys_sqlite, rocpd, rocprof_v1_db, rpd

NAME = "rpd_vllm_mi300_fp8_decode.rpd"

# The DDL of the corpus file's tables (sqlite3 .schema), as rpd_tracer creates them.
DDL = [
    'CREATE TABLE "rocpd_string" ("id" integer NOT NULL PRIMARY KEY AUTOINCREMENT, "string" varchar(4096) NOT NULL)',
    'CREATE TABLE "rocpd_op" ("id" integer NOT NULL PRIMARY KEY AUTOINCREMENT, "gpuId" integer NOT NULL, "queueId" integer NOT NULL, '
    '"sequenceId" integer NOT NULL, "completionSignal" varchar(18) NOT NULL, "start" integer NOT NULL, "end" integer NOT NULL, '
    '"description_id" integer NOT NULL, "opType_id" integer NOT NULL)',
    'CREATE TABLE "rocpd_api" ("id" integer NOT NULL PRIMARY KEY AUTOINCREMENT, "pid" integer NOT NULL, "tid" integer NOT NULL, '
    '"start" integer NOT NULL, "end" integer NOT NULL, "apiName_id" integer NOT NULL, "args_id" integer NOT NULL)',
    'CREATE TABLE "rocpd_api_ops" ("id" integer NOT NULL PRIMARY KEY AUTOINCREMENT, "api_id" integer NOT NULL, "op_id" integer NOT NULL)',
    'CREATE TABLE "rocpd_kernelapi" ("api_ptr_id" integer NOT NULL PRIMARY KEY, "stream" varchar(18) NOT NULL, '
    '"gridX" integer NOT NULL, "gridY" integer NOT NULL, "gridZ" integer NOT NULL, "workgroupX" integer NOT NULL, '
    '"workgroupY" integer NOT NULL, "workgroupZ" integer NOT NULL, "groupSegmentSize" integer NOT NULL, '
    '"privateSegmentSize" integer NOT NULL, "kernelArgAddress" varchar(18) NOT NULL, "aquireFence" varchar(8) NOT NULL, '
    '"releaseFence" varchar(8) NOT NULL, "codeObject_id" integer NOT NULL, "kernelName_id" integer NOT NULL)',
    'CREATE TABLE "rocpd_copyapi" ("api_ptr_id" integer NOT NULL PRIMARY KEY, "stream" varchar(18) NOT NULL, "size" integer NOT NULL, '
    '"width" integer NOT NULL, "height" integer NOT NULL, "kind" integer NOT NULL, "dst" varchar(18) NOT NULL, '
    '"src" varchar(18) NOT NULL, "dstDevice" integer NOT NULL, "srcDevice" integer NOT NULL, "sync" bool NOT NULL, "pinned" bool NOT NULL)',
    'CREATE TABLE "rocpd_barrierop" ("op_ptr_id" integer NOT NULL PRIMARY KEY, "signalCount" integer NOT NULL, '
    '"aquireFence" varchar(8) NOT NULL, "releaseFence" varchar(8) NOT NULL)',
    'CREATE TABLE "rocpd_metadata" ("id" integer NOT NULL PRIMARY KEY AUTOINCREMENT, "tag" varchar(4096) NOT NULL, "value" varchar(4096) NOT NULL)',
    'CREATE TABLE "ext_autogradapi" ("api_ptr_id" integer NOT NULL PRIMARY KEY, "autogradName_id" integer NOT NULL, '
    '"seq" integer NOT NULL, "op_id" integer NOT NULL, "sizes" varchar(4096) NOT NULL, "input_op_ids" varchar(4096) NOT NULL)',
]

STRINGS = {
    1: "", 2: "hipLaunchKernel", 3: "hipExtModuleLaunchKernel", 4: "hipGraphLaunch", 5: "hipMemcpyAsync",
    6: "KernelExecution", 7: "Task", 8: "CopyHostToDevice", 9: "Barrier", 10: "void fill_kernel<int>(int*, int)",
    11: "Cijk_Alik_Bljk_HHS_BH_MT128x128x32", 12: "paged_attention_kernel", 13: "UserMarker", 14: "step 0",
    15: "aten::mm", 16: "OpTable::writeRows", 17: "orphan_kernel(float*)",
}
T0 = 1_000_000_000


def write_rpd(path: Path, *, rows: bool = True) -> Path:
    """A small RPD: a hipLaunchKernel (grid in workgroups), a hipExtModuleLaunchKernel (grid in
    work-items), a hipGraphLaunch replaying one named Task and one unnamed Task, a kernel op
    with no api link, a kernel op whose description id names no string, a copy, a barrier,
    a user marker, an autograd op and one of the tracer's own rows."""
    conn = sqlite3.connect(path)
    for ddl in DDL:
        conn.execute(ddl)
    if rows:
        conn.executemany("INSERT INTO rocpd_string VALUES (?, ?)", list(STRINGS.items()))
        api = [  # id, pid, tid, start, end, apiName_id, args_id
            (101, 7, 70, T0, T0 + 5_000, 2, 1),
            (102, 7, 70, T0 + 20_000, T0 + 26_000, 3, 1),
            (103, 7, 70, T0 + 100_000, T0 + 150_000, 4, 1),
            (104, 7, 70, T0 + 200_000, T0 + 204_000, 5, 1),
            (105, 7, 70, T0 - 1_000, T0 + 300_000, 13, 14),
            (106, 7, 70, T0 - 500, T0 + 30_000, 13, 15),
            (107, 7, 71, T0 + 400_000, T0 + 401_000, 16, 1),
        ]
        conn.executemany("INSERT INTO rocpd_api VALUES (?, ?, ?, ?, ?, ?, ?)", api)
        ops = [  # id, gpuId, queueId, sequenceId, completionSignal, start, end, description_id, opType_id
            (201, 3, 1, 0, "0x0", T0 + 10_000, T0 + 12_000, 10, 6),
            (202, 3, 1, 1, "0x0", T0 + 30_000, T0 + 80_000, 11, 6),
            (203, 3, 1, 2, "0x0", T0 + 110_000, T0 + 120_000, 12, 7),
            (204, 3, 1, 3, "0x0", T0 + 121_000, T0 + 122_000, 1, 7),
            (205, 3, 1, 4, "0x0", T0 + 210_000, T0 + 211_000, 1, 8),
            (206, 3, 1, 5, "0x0", T0 + 212_000, T0 + 213_000, 1, 9),
            (207, 3, 2, 6, "0x0", T0 + 220_000, T0 + 225_000, 17, 6),
            (208, 3, 2, 7, "0x0", T0 + 230_000, T0 + 231_000, 999, 6),
        ]
        conn.executemany("INSERT INTO rocpd_op VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", ops)
        links = [(1, 101, 201), (2, 102, 202), (3, 103, 203), (4, 103, 204), (5, 104, 205)]
        conn.executemany("INSERT INTO rocpd_api_ops VALUES (?, ?, ?)", links)
        ka = [
            (101, "0x0", 4, 2, 1, 64, 1, 1, 128, 0, "0x0", "", "", 0, 10),
            (102, "0x0", 1024, 256, 1, 256, 2, 1, 0, 0, "0x0", "", "", 0, 11),
        ]
        conn.executemany(f"INSERT INTO rocpd_kernelapi VALUES ({', '.join('?' * 15)})", ka)
        conn.execute("INSERT INTO rocpd_copyapi VALUES (104, '0x0', 4096, 0, 0, 1, '0x1', '0x2', 3, -1, 0, 0)")
        conn.execute("INSERT INTO ext_autogradapi VALUES (106, 15, 1, 1, '[[64, 32], [32, 16]]', '')")
        conn.execute("INSERT INTO rocpd_metadata VALUES (1, 'schema_version', '2')")
    conn.commit()
    conn.close()
    return path


def _raw(path: Path, sql: str) -> list[tuple]:
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


# ------------------------------------------------------------------------------ synthetic


def test_synthetic_kernels_grids_and_names(tmp_path):
    path = write_rpd(tmp_path / "t.rpd")
    assert detect(path) == "rpd"
    t = load_trace(path)
    k = t.kernels.set_index("start_ns")
    # 201, 202, 203 (named Task), 207 (no api link), 208 (description id names no string);
    # 204 (a Task without a name) is no kernel
    assert sorted(k.index - T0) == [10_000, 30_000, 110_000, 220_000, 230_000]
    fill = k.loc[T0 + 10_000]
    assert (fill["name"], fill["short_name"]) == ("void fill_kernel<int>(int*, int)", "fill_kernel")
    # hipLaunchKernel: gridX is numBlocks, already workgroups
    assert [fill[c] for c in ("grid_x", "grid_y", "grid_z", "block_x", "grid_blocks", "block_threads")] == [4, 2, 1, 64, 8, 64]
    assert fill["dynamic_smem_bytes"] == 128 and (fill["device_id"], fill["stream_id"], fill["correlation_id"]) == (3, 1, 101)
    # hipExtModuleLaunchKernel: globalWorkSize in work-items -> ceil(items / workgroup)
    gemm = k.loc[T0 + 30_000]
    assert [gemm[c] for c in ("grid_x", "grid_y", "grid_z", "block_x", "block_y", "grid_blocks")] == [4, 128, 1, 256, 2, 512]
    # the graph's kernel: no launch arguments, attributed to its hipGraphLaunch call
    task = k.loc[T0 + 110_000]
    assert task["name"] == "paged_attention_kernel" and task["correlation_id"] == 103 and task["graph_launch_id"] == 103
    assert task[["grid_x", "block_x"]].isna().all()
    assert k["graph_launch_id"].notna().sum() == 1
    orphan = k.loc[T0 + 220_000]
    assert orphan["name"] == "orphan_kernel(float*)" and orphan[["correlation_id", "grid_x"]].isna().all()
    assert orphan["stream_id"] == 2
    assert k.loc[T0 + 230_000, ["name", "short_name"]].isna().all()
    notes = " | ".join(t.meta["notes"])
    assert "1 RPD kernel op(s) have no name" in notes
    assert "RPD ops not read (neither kernels nor copies): 1 Barrier, 1 Task" in notes
    assert "does not record the GPU model" in notes


def test_synthetic_copies_runtime_markers_and_device(tmp_path):
    t = load_trace(write_rpd(tmp_path / "t.rpd"))
    m = t.memcpy
    assert len(m) == 1 and (m["kind"][0], m["bytes"][0], m["correlation_id"][0], m["device_id"][0]) == ("HtoD", 4096, 104, 3)
    rt = t.runtime.sort_values("start_ns")
    assert list(rt["name"]) == ["hipLaunchKernel", "hipExtModuleLaunchKernel", "hipGraphLaunch", "hipMemcpyAsync"]
    assert list(rt["correlation_id"]) == [101, 102, 103, 104] and set(rt["thread_id"]) == {70}
    assert list(t.nvtx["text"]) == ["step 0"] and list(t.nvtx["domain"]) == ["roctx"]
    ops = t.cpu_ops
    assert list(ops["name"]) == ["aten::mm"] and list(ops["input_dims"]) == ["[[64, 32], [32, 16]]"]
    assert "1 RPD api row(s) that are neither HIP/HSA calls nor user markers" in " ".join(t.meta["notes"])
    d = t.devices
    assert len(d) == 1 and (d["device_id"][0], d["vendor"][0]) == (3, "amd")
    assert d[["name", "arch", "sm_count"]].iloc[0].isna().all() and d["sm_count_source"][0] == "unknown"
    d = load_trace(tmp_path / "t.rpd", sm_count=80).devices
    assert (d["sm_count"][0], d["sm_count_source"][0]) == (80, "user")


def test_empty_rpd_is_a_clean_error(tmp_path):
    path = write_rpd(tmp_path / "empty.rpd", rows=False)
    assert detect(path) == "rpd"
    with pytest.raises(NoKernelsError, match="no GPU kernel activity"):
        load_trace(path)
    res = CliRunner().invoke(cli, ["diagnose", str(path)])
    assert res.exit_code == 2 and "Traceback" not in res.output and "no GPU kernel activity" in res.output


def test_rpd_without_op_times_is_a_clean_error(tmp_path):
    path = tmp_path / "odd.rpd"
    conn = sqlite3.connect(path)
    for ddl in ('CREATE TABLE rocpd_op (id integer, gpuId integer)', 'CREATE TABLE rocpd_api (id integer)',
                'CREATE TABLE rocpd_string (id integer, string text)'):
        conn.execute(ddl)
    conn.commit()
    conn.close()
    with pytest.raises(TraceError, match="lacks start/end/opType_id"):
        load_trace(path)


def test_sniffers_keep_to_their_own_files(tmp_path):
    r = write_rpd(tmp_path / "t.rpd")
    sdk = write_rocpd(tmp_path / "sdk.db")
    nsys = write_nsys(tmp_path / "n.sqlite")
    head = lambda p: p.read_bytes()[:4096]  # noqa: E731
    assert rpd.sniff(r, head(r))
    assert not rpd.sniff(sdk, head(sdk)) and not rpd.sniff(nsys, head(nsys))
    for other in (rocpd, nsys_sqlite, rocprof_v1_db):
        assert not other.sniff(r, head(r)), other.FORMAT
    assert detect(sdk) == "rocpd" and detect(nsys) == "nsys-sqlite"
    assert not rpd.sniff(tmp_path / "x.json", b'{"traceEvents": []}')


# ------------------------------------------------------------------------------ corpus


@pytest.fixture
def rpd_file(corpus) -> Path:
    path = corpus / "rocprof" / NAME
    if not path.is_file():
        pytest.skip(f"{NAME} not in the corpus")
    return path


def test_corpus_counts(rpd_file):
    assert detect(rpd_file) == "rpd"
    for other in (rocpd, nsys_sqlite, rocprof_v1_db):
        assert not other.sniff(rpd_file, rpd_file.read_bytes()[:4096]), other.FORMAT
    t = load_trace(rpd_file)
    k = t.kernels
    # sqlite3: 1228 KernelExecution + 7720 Task ops, all on gpuId 2, queueId 0
    assert len(k) == 8948 and set(k["device_id"]) == {2} and set(k["stream_id"]) == {0}
    assert k["name"].notna().all()
    graph = k[k["graph_launch_id"].notna()]
    # every Task op hangs off one of the 20 hipGraphLaunch rows: 386 kernels each
    assert len(graph) == 7720 and graph["graph_launch_id"].nunique() == 20
    assert set(graph.groupby("graph_launch_id").size()) == {386}
    assert graph["grid_x"].isna().all() and k[k["graph_launch_id"].isna()]["grid_x"].notna().all()
    qkv = k[k["name"].str.contains("paged_attention_ll4mi_QKV_kernel")]
    red = k[k["name"].str.contains("paged_attention_ll4mi_reduce_kernel")]
    assert len(qkv) == len(red) == 640 and qkv["graph_launch_id"].notna().all()
    # the ops' own durations, summed by sqlite3: 316,231,882 + 90,905,793 ns
    assert int(k["dur_ns"].sum()) == 316_231_882 + 90_905_793
    assert len(t.memcpy) == 1176 and dict(t.memcpy["kind"].value_counts()) == {"DtoD": 804, "HtoD": 350, "DtoH": 22}
    assert t.memcpy["bytes"].notna().sum() == 536  # the copies whose call has a rocpd_copyapi row
    assert len(t.runtime) == 2830 and (t.runtime["name"] == "hipGraphLaunch").sum() == 20
    assert len(t.cpu_ops) == 11816 and len(t.nvtx) == 68
    d = t.devices
    assert len(d) == 1 and d["device_id"][0] == 2 and d["vendor"][0] == "amd" and d[["name", "sm_count"]].iloc[0].isna().all()


def test_corpus_grids(rpd_file):
    k = load_trace(rpd_file).kernels
    raw = _raw(rpd_file, "SELECT k.gridX, k.workgroupX, a.apiName FROM kernel k JOIN rocpd_api_ops x ON x.op_id = k.id "
                         "JOIN api a ON a.id = x.api_id WHERE k.kernelName LIKE 'Cijk%MT256x224x128%'")
    assert {r[2] for r in raw} == {"hipExtModuleLaunchKernel"} and len(raw) == 256
    # hipExtModuleLaunchKernel's gridX is work-items: 151552, 227328, 1060864 over 256-wide workgroups
    assert {(r[0], r[1]) for r in raw} == {(151552, 256), (227328, 256), (1060864, 256)}
    gemm = k[k["name"].str.startswith("Cijk_") & k["name"].str.contains("MT256x224x128")]
    assert sorted(set(gemm["grid_x"])) == [592, 888, 4144] and set(gemm["block_x"]) == {256}
    # hipLaunchKernel's grid is workgroups: ck_tile FMHA 32x2x32 of 256, fills on one workgroup
    fmha = k[k["name"].str.contains("FmhaFwdKernel")]
    assert len(fmha) == 64 and set(zip(fmha["grid_x"], fmha["grid_y"], fmha["grid_z"], fmha["block_x"])) == {(32, 2, 32, 256)}
    fill = k[k["name"].str.contains("vectorized_elementwise_kernel<4, at::native::FillFunctor<")]  # <int> x44, <long> x104
    assert len(fill) == 148 and set(zip(fill["grid_blocks"], fill["block_threads"])) == {(1, 256)}


def test_corpus_diagnose_renders(rpd_file):
    res = CliRunner().invoke(cli, ["diagnose", str(rpd_file), "--json"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.output)
    assert d["trace"]["format"] == "rpd" and d["trace"]["kernels"] == 8948
    assert d["devices"] == [{"rank": 0, "device_id": 2, "name": None, "vendor": "amd", "sm_count": None,
                             "sm_count_source": "unknown", "compute_capability": None}]
    res = CliRunner().invoke(cli, ["diagnose", str(rpd_file), "--sm-count", "304"])
    assert res.exit_code == 0 and "304 SMs (user)" in res.output


def test_cells_that_are_not_integers_are_skipped(tmp_path):
    path = write_rpd(tmp_path / "t.rpd")
    conn = sqlite3.connect(path)
    conn.execute("UPDATE rocpd_op SET start = 'soon' WHERE id = 201")  # a text cell in an integer column
    conn.execute("UPDATE rocpd_op SET \"end\" = start - 1 WHERE id = 202")  # ends before it starts
    conn.commit()
    conn.close()
    t = load_trace(path)
    assert sorted(t.kernels["start_ns"] - T0) == [110_000, 220_000, 230_000]
    assert "2 RPD op(s) without a valid start/end were skipped" in t.meta["notes"]
