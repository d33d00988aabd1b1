"""Kineto (PyTorch profiler) reader: corpus traces checked against the JSON itself, plus small
synthetic traces for the edge cases (time rounding, ROCm launches, ranks, gzip, bad files).

Expected numbers are computed here from the parsed JSON with the standard library (times with
`decimal`, so they do not share the reader's float arithmetic), never with reader helpers.
"""

from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import time
from decimal import ROUND_HALF_EVEN, Decimal
from pathlib import Path

import pytest
from click.testing import CliRunner

from advisor.cli import cli
from advisor.errors import NoKernelsError, TraceError
from advisor.traces import detect, load_trace

CORPUS = Path(os.environ.get("ADVISOR_CORPUS") or Path(__file__).resolve().parents[1].parent / "shared" / "corpus")
KINETO = CORPUS / "kineto"
CORPUS_FILES = [
    "hta_a100_nccl.json.gz",
    "tracelens_h100_bert_small.json.gz",
    "hta_mi250_rocm.json.gz",
    "tracelens_torch_compile_triton.json.gz",
]
WORKITEM_APIS = {"hipExtModuleLaunchKernel", "hipHccModuleLaunchKernel"}


def corpus_file(name: str) -> Path:
    path = KINETO / name
    if not path.is_file():
        pytest.skip(f"corpus file {path} not found")
    return path


def parse_exact(path: Path) -> dict:
    """The JSON with every float as a Decimal (exact text), gzip told by its magic."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw, parse_float=Decimal)


def ns(us, base: int = 0) -> int:
    return base + int((Decimal(us) * 1000).to_integral_value(ROUND_HALF_EVEN))


def x_events(doc: dict, cat: str) -> list[dict]:
    return [e for e in doc["traceEvents"] if e.get("cat") == cat and e.get("ph") == "X"]


def write_trace(path: Path, events: list[dict], gz: bool = False, **top) -> Path:
    doc = {"schemaVersion": 1, **top, "traceEvents": events}
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


def kernel(ts, dur, name="k", corr=1, device=0, **args) -> dict:
    return {
        "ph": "X", "cat": "kernel", "name": name, "pid": device, "tid": 7, "ts": ts, "dur": dur,
        "args": {"device": device, "stream": 7, "correlation": corr, **args},
    }


H100_PROPS = [{
    "id": 0, "name": "NVIDIA H100 80GB HBM3", "computeMajor": 9, "computeMinor": 0, "numSms": 132,
    "warpSize": 32, "maxThreadsPerMultiprocessor": 2048, "maxThreadsPerBlock": 1024,
    "regsPerMultiprocessor": 65536, "regsPerBlock": 65536, "sharedMemPerMultiprocessor": 233472,
    "sharedMemPerBlockOptin": 232448,
}]


# --------------------------------------------------------------------------------------------
# corpus


@pytest.mark.parametrize("name", CORPUS_FILES)
def test_corpus_kernels_match_json(name):
    path = corpus_file(name)
    doc = parse_exact(path)
    base = int(doc.get("baseTimeNanoseconds", 0))
    expected = x_events(doc, "kernel")
    trace = load_trace(path)
    k = trace.kernels
    assert detect(path) == "kineto"
    assert len(k) == len(expected) > 0
    assert k["name"].tolist() == [e["name"] for e in expected]
    assert k["start_ns"].tolist() == [ns(e["ts"], base) for e in expected]
    assert k["dur_ns"].tolist() == [ns(e["dur"]) for e in expected]
    assert (k["end_ns"] - k["start_ns"] == k["dur_ns"]).all()
    assert int(k["dur_ns"].sum()) == sum(ns(e["dur"]) for e in expected)
    assert k["correlation_id"].tolist() == [e["args"]["correlation"] for e in expected]


@pytest.mark.parametrize("name", ["hta_a100_nccl.json.gz", "tracelens_h100_bert_small.json.gz"])
def test_corpus_nvidia_grid_block_registers(name):
    path = corpus_file(name)
    expected = x_events(parse_exact(path), "kernel")
    k = load_trace(path).kernels
    for axis, i in zip("xyz", range(3)):
        assert k[f"grid_{axis}"].tolist() == [e["args"]["grid"][i] for e in expected]
        assert k[f"block_{axis}"].tolist() == [e["args"]["block"][i] for e in expected]
    assert k["grid_blocks"].tolist() == [math.prod(e["args"]["grid"]) for e in expected]
    assert k["registers_per_thread"].tolist() == [e["args"]["registers per thread"] for e in expected]
    assert k["static_smem_bytes"].tolist() == [e["args"]["shared memory"] for e in expected]


@pytest.mark.parametrize("name", ["hta_mi250_rocm.json.gz", "tracelens_torch_compile_triton.json.gz"])
def test_corpus_rocm_grid_in_workgroups(name):
    """ROCm kernels take grid/block from the launching HIP call when missing, and the
    global-work-size launches (hipExtModuleLaunchKernel: hipBLASLt GEMMs) become workgroups."""
    path = corpus_file(name)
    doc = parse_exact(path)
    launches = {e["args"]["correlation"]: e for e in x_events(doc, "cuda_runtime")}
    expected = []
    for e in x_events(doc, "kernel"):
        launch = launches[e["args"]["correlation"]]
        grid = e["args"].get("grid") or launch["args"]["grid"]
        block = e["args"].get("block") or launch["args"]["block"]
        if launch["name"] in WORKITEM_APIS:
            grid = [-(-g // b) for g, b in zip(grid, block)]
        expected.append((grid, block))
    k = load_trace(path).kernels
    got = [([r.grid_x, r.grid_y, r.grid_z], [r.block_x, r.block_y, r.block_z]) for r in k.itertuples()]
    assert got == expected
    assert any(launches[e["args"]["correlation"]]["name"] in WORKITEM_APIS for e in x_events(doc, "kernel"))


def test_corpus_mi300x_gemm_grid_is_workgroups():
    # 350208 work-items / 256 per workgroup: 1368 workgroups = 4.5 waves of 304 CUs.
    k = load_trace(corpus_file("tracelens_torch_compile_triton.json.gz")).kernels
    gemm = k[k["name"].str.startswith("Cijk_")]
    assert 1368 in set(gemm["grid_x"]) and 350208 not in set(gemm["grid_x"])


@pytest.mark.parametrize("name", CORPUS_FILES)
def test_corpus_device_properties(name):
    path = corpus_file(name)
    doc = parse_exact(path)
    props = {p["id"]: p for p in doc["deviceProperties"]}
    trace = load_trace(path)
    used = {e["args"]["device"] for e in x_events(doc, "kernel")}
    assert set(trace.devices["device_id"]) == used
    for row in trace.devices.itertuples():
        p = props.get(row.device_id) or next(iter(props.values()))  # ROCm agent-numbered id
        assert row.sm_count == p["numSms"]
        assert row.sm_count_source == "trace"
        assert row.warp_size == p["warpSize"]
        assert row.max_warps_per_sm == p["maxThreadsPerMultiprocessor"] // p["warpSize"]
        assert row.name == p["name"]
        if p["warpSize"] == 32:
            assert row.vendor == "nvidia"
            assert row.arch == f"{p['computeMajor']}.{p['computeMinor']}"
            assert row.smem_per_block_optin_bytes == p["sharedMemPerBlockOptin"]
        else:
            assert row.vendor == "amd"


def test_corpus_a100_sm_count_and_rank():
    trace = load_trace(corpus_file("hta_a100_nccl.json.gz"))
    assert trace.devices["sm_count"].tolist() == [108]
    assert trace.meta["declared_rank"] == 0
    assert set(trace.kernels["rank"]) == {0}


@pytest.mark.parametrize("name", ["tracelens_h100_bert_small.json.gz", "tracelens_torch_compile_triton.json.gz"])
def test_corpus_input_dims_preserved(name):
    path = corpus_file(name)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    expected = [e for e in doc["traceEvents"] if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    ops = load_trace(path).cpu_ops
    assert len(ops) == len(expected)
    with_dims = [(e["args"]["Input Dims"], e["args"].get("Input type")) for e in expected if "Input Dims" in e["args"]]
    assert with_dims, "corpus trace recorded shapes"
    got = ops[ops["input_dims"].notna()]
    assert [json.loads(s) for s in got["input_dims"]] == [d for d, _ in with_dims]
    assert [json.loads(s) for s in got["input_types"]] == [t for _, t in with_dims]


def test_corpus_mm_shapes_readable():
    ops = load_trace(corpus_file("tracelens_torch_compile_triton.json.gz")).cpu_ops
    mm = ops[ops["name"] == "aten::mm"]
    assert json.loads(mm["input_dims"].iloc[0])[:2] == [[32768, 2048], [2048, 2048]]


def test_corpus_memcpy_bytes_and_annotations():
    path = corpus_file("hta_a100_nccl.json.gz")
    doc = parse_exact(path)
    copies = x_events(doc, "gpu_memcpy") + x_events(doc, "gpu_memset")
    trace = load_trace(path)
    m = trace.memcpy
    assert len(m) == len(copies)
    assert int(m["bytes"].sum()) == sum(int(e["args"]["bytes"]) for e in copies)
    assert set(m["op"]) == {"memcpy", "memset"}
    assert (m.loc[m["op"] == "memset", "kind"] == "memset").all()
    annotations = x_events(doc, "user_annotation")
    assert trace.nvtx["text"].tolist() == [e["name"] for e in annotations]
    assert set(trace.nvtx["domain"]) == {"torch.profiler"}
    assert len(trace.runtime) == len(x_events(doc, "cuda_runtime")) + len(x_events(doc, "cuda_driver"))


def test_corpus_rocm_memcpy_bytes_from_launching_call():
    path = corpus_file("hta_mi250_rocm.json.gz")
    doc = parse_exact(path)
    calls = {e["args"]["correlation"]: e for e in x_events(doc, "cuda_runtime")}
    copies = x_events(doc, "gpu_memcpy")
    m = load_trace(path).memcpy
    assert m["bytes"].tolist() == [int(calls[e["args"]["correlation"]]["args"]["size"]) for e in copies]
    assert m["kind"].tolist() == ["HtoD"] * len(copies)


def test_corpus_two_files_get_two_ranks(tmp_path):
    path = corpus_file("tracelens_h100_bert_small.json.gz")
    copy = tmp_path / "rank1.json.gz"  # the same path twice is refused
    shutil.copyfile(path, copy)
    # the same content twice is not one run: read side by side only when asked (and noted)
    trace = load_trace([path, copy], allow_unrelated=True)
    assert trace.meta["unrelated_ranks"] and trace.ranks == [0, 1]
    assert (trace.kernels.groupby("rank").size() == 60).all()
    assert sorted(trace.devices["rank"]) == [0, 1]


# --------------------------------------------------------------------------------------------
# synthetic traces


def test_times_rounded_to_nearest_ns(tmp_path):
    events = [
        kernel(1752830085464752.5, 1.0, corr=1),  # epoch microseconds: float64 x 1000 would lose ns
        kernel(10.0006, 0.0015, corr=2),  # 10000.6 ns rounds up (truncation gives 10000)
        kernel("12.25", "3", corr=3),  # numbers as strings
    ]
    k = load_trace(write_trace(tmp_path / "t.json", events)).kernels
    assert k["start_ns"].tolist() == [1752830085464752500, 10001, 12250]
    assert k["dur_ns"].tolist() == [1000, 2, 3000]


def test_base_time_added(tmp_path):
    base = 1751410836000000000
    events = [kernel(1419247333430.849, 3.136)]
    k = load_trace(write_trace(tmp_path / "t.json", events, baseTimeNanoseconds=base)).kernels
    assert k["start_ns"].tolist() == [base + 1419247333430849]
    assert k["end_ns"].tolist() == [base + 1419247333430849 + 3136]


def test_gzip_and_plain_read_the_same(tmp_path):
    events = [kernel(100.5, 2.25, grid=[4, 2, 1], block=[128, 1, 1])]
    plain = write_trace(tmp_path / "a.json", events, deviceProperties=H100_PROPS)
    gz = write_trace(tmp_path / "b.json.gz", events, gz=True, deviceProperties=H100_PROPS)
    gz_named_json = write_trace(tmp_path / "c.json", events, gz=True, deviceProperties=H100_PROPS)
    frames = [load_trace(p).kernels for p in (plain, gz, gz_named_json)]
    assert detect(gz_named_json) == "kineto"
    for f in frames[1:]:
        assert f.equals(frames[0])
    assert frames[0]["grid_blocks"].tolist() == [8]


def test_distributed_info_ranks(tmp_path):
    a = write_trace(tmp_path / "a.json", [kernel(1.0, 1.0, name="on_rank1")], distributedInfo={"rank": 1, "world_size": 2})
    b = write_trace(tmp_path / "b.json", [kernel(1.0, 1.0, name="on_rank0")], distributedInfo={"rank": 0, "world_size": 2})
    trace = load_trace([a, b])
    by_rank = dict(zip(trace.kernels["rank"], trace.kernels["name"]))
    assert by_rank == {1: "on_rank1", 0: "on_rank0"}
    single = load_trace(a)
    assert single.kernels["rank"].tolist() == [1]


def test_files_without_distributed_info_ranked_by_order(tmp_path):
    a = write_trace(tmp_path / "a.json", [kernel(1.0, 1.0, name="first")])
    b = write_trace(tmp_path / "b.json", [kernel(1.0, 1.0, name="second")])
    trace = load_trace([a, b])
    assert dict(zip(trace.kernels["name"], trace.kernels["rank"])) == {"first": 0, "second": 1}


def test_no_kernels_raises(tmp_path):
    events = [{"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "ts": 1.0, "dur": 2.0, "args": {}}]
    path = write_trace(tmp_path / "cpu_only.json", events, deviceProperties=H100_PROPS)
    with pytest.raises(NoKernelsError):
        load_trace(path)
    trace = load_trace(path, require_kernels=False)
    assert len(trace.cpu_ops) == 1 and trace.kernels.empty


def test_old_capitalised_categories(tmp_path):
    events = [
        {"ph": "X", "cat": "Kernel", "name": "k", "pid": 0, "tid": 7, "ts": 1.0, "dur": 1.0, "args": {"device": 0}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 0.5, "dur": 0.2, "args": {}},
    ]
    trace = load_trace(write_trace(tmp_path / "old.json", events))
    assert len(trace.kernels) == 1 and trace.runtime["name"].tolist() == ["cudaLaunchKernel"]


def test_pytorch_1_8_input_dims_give_gemm_shape(tmp_path):
    # PyTorch 1.8's Kineto wrote "Operator" events with "Input dims" (lower-case d), integer
    # microsecond times, thread ids as strings and no deviceProperties; the GEMM shape must
    # still reach the kernel the operator launched.
    events = [
        {"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 118664, "tid": "1441273664",
         "ts": 1610366387140600, "dur": 40,
         "args": {"Input dims": [[512, 1024], [1024, 2048]], "Input type": [], "External id": 9}},
        {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 118664, "tid": "1441273664",
         "ts": 1610366387140610, "dur": 5, "args": {"cbid": 211, "correlation": 627, "external id": 9}},
        {"ph": "X", "cat": "Kernel", "name": "volta_sgemm_128x64_nn", "pid": 0, "tid": "stream 7",
         "ts": 1610366387140700, "dur": 100,
         "args": {"queued": 0, "device": 0, "context": 1, "stream": 7, "correlation": 627, "external id": 9,
                  "registers per thread": 80, "shared memory": 2304, "warps per SM": 627.2,
                  "grid": [32, 4, 1], "block": [256, 1, 1]}},
    ]
    trace = load_trace(write_trace(tmp_path / "worker0.pt.trace.json", events))
    assert json.loads(trace.cpu_ops["input_dims"].iloc[0]) == [[512, 1024], [1024, 2048]]
    from advisor.symptoms.gemm import gemm_table

    g = gemm_table(trace).iloc[0]
    assert (g["M"], g["N"], g["K"], g["shape_source"]) == (512, 2048, 1024, "kineto-input-dims")


def test_short_names(tmp_path):
    names = [
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char*, 1> >(int, at::native::FillFunctor<float>, at::detail::Array<char*, 1>)",
        "void at::native::(anonymous namespace)::indexSelectLargeIndex<float, long, unsigned int, 2, 2, -2, true>(float*)",
        "triton_poi_fused_add_0",
        "ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)",
    ]
    events = [kernel(float(i), 1.0, name=n, corr=i) for i, n in enumerate(names)]
    k = load_trace(write_trace(tmp_path / "n.json", events)).kernels
    assert k["short_name"].tolist() == [
        "vectorized_elementwise_kernel", "indexSelectLargeIndex", "triton_poi_fused_add_0", "ncclDevKernel_Generic_1",
    ]
    assert k["name"].tolist() == names


def test_memcpy_bytes_from_bandwidth(tmp_path):
    events = [
        kernel(1.0, 1.0),
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": 0, "tid": 7, "ts": 5.0, "dur": 2.0,
         "args": {"device": 0, "memory bandwidth (GB/s)": 10.0}},
    ]
    m = load_trace(write_trace(tmp_path / "m.json", events)).memcpy
    # 10 GB/s for 2 us = 20000 bytes
    assert m["bytes"].tolist() == [20000] and m["kind"].tolist() == ["HtoD"]


def test_kernel_without_ts_is_skipped_with_note(tmp_path):
    events = [kernel(1.0, 1.0, corr=1), {"ph": "X", "cat": "kernel", "name": "broken", "args": {}}]
    trace = load_trace(write_trace(tmp_path / "t.json", events))
    assert trace.kernels["name"].tolist() == ["k"]
    assert any("without a valid ts/dur" in n for n in trace.meta["notes"])


@pytest.mark.slow
def test_large_trace_is_fast(tmp_path):
    """200,000 events must cost a small multiple of parsing the JSON (a reader that builds
    frames row by row is ~100x slower)."""
    events = []
    for i in range(50_000):
        t = 10.0 * i
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 2, "ts": t, "dur": 5.5,
                       "args": {"Input Dims": [[128, 256], [256, 64]], "Input type": ["float", "float"]}})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 2, "ts": t + 1,
                       "dur": 3.25, "args": {"correlation": i}})
        events.append(kernel(t + 5.125, 2.0, name=f"gemm<{i % 50}>(float*)", corr=i, grid=[i % 100 + 1, 2, 1],
                             block=[128, 1, 1]))
        events.append({"ph": "f", "cat": "ac2g", "id": i, "pid": 1, "tid": 2, "ts": t + 1})
    path = write_trace(tmp_path / "big.json", events, deviceProperties=H100_PROPS)
    t0 = time.perf_counter()
    json.loads(path.read_bytes())
    parse = time.perf_counter() - t0
    t0 = time.perf_counter()
    trace = load_trace(path)
    read = time.perf_counter() - t0
    assert len(trace.kernels) == 50_000 and len(trace.cpu_ops) == 50_000
    assert read < 4 * parse + 3, f"read {read:.1f}s vs json parse {parse:.1f}s"


# --------------------------------------------------------------------------------------------
# bad input: one-line errors, exit code 2


def test_truncated_gzip(tmp_path):
    path = corpus_file("hta_mi250_rocm.json.gz")
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(TraceError) as err:
        load_trace(cut)
    assert "\n" not in str(err.value) and "cut.json.gz" in str(err.value)


def test_truncated_json(tmp_path):
    data = json.dumps({"schemaVersion": 1, "traceEvents": [kernel(1.0, 1.0)] * 20}).encode()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) - 30])
    with pytest.raises(TraceError, match="truncated or corrupt PyTorch profiler JSON"):
        load_trace(cut)


def test_corrupt_gzip_member(tmp_path):
    data = bytearray(gzip.compress(json.dumps({"traceEvents": [kernel(1.0, 1.0)] * 50}).encode()))
    data[30:40] = b"\x00" * 10
    bad = tmp_path / "bad.json.gz"
    bad.write_bytes(bytes(data))
    with pytest.raises(TraceError):
        load_trace(bad)


@pytest.mark.parametrize("kind", ["truncated", "no_kernels"])
def test_cli_exit_code_2_without_traceback(tmp_path, kind):
    if kind == "truncated":
        data = json.dumps({"traceEvents": [kernel(1.0, 1.0)] * 20}).encode()
        path = tmp_path / "t.json"
        path.write_bytes(data[:-25])
    else:
        path = write_trace(tmp_path / "t.json", [{"ph": "X", "cat": "cpu_op", "name": "x", "ts": 1, "dur": 1}])
    result = CliRunner().invoke(cli, ["summary", str(path)])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("advisor: error: t.json")


def test_cli_summary_json(tmp_path):
    path = write_trace(tmp_path / "t.json", [kernel(1.0, 2.0, grid=[3, 1, 1], block=[64, 1, 1])], deviceProperties=H100_PROPS)
    result = CliRunner().invoke(cli, ["summary", "--json", str(path)])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    assert info["format"] == "kineto"
    assert info["kernels"] == {"count": 1, "total_ns": 2000, "distinct": 1, "span_ns": 2000}
    assert info["devices"][0]["sm_count"] == 132
    assert info["top_kernels"][0]["grid"] == [3, 1, 1]
