"""What keeps a 10M-kernel nsys export within memory (docs/scale.md): text columns holding one
str object per distinct string, launch dimensions stored as Int32 once impossible values
are masked, and Trace.build not copying the reader's frames."""

from __future__ import annotations

import numpy as np
import pandas as pd
import tracefiles as T

from advisor.model import NARROW, STRING, Trace
from advisor.traces import load_trace


def _objects(s: pd.Series) -> np.ndarray:
    return s.array.to_numpy(dtype=object)


def test_text_columns_share_one_str_per_distinct_value(tmp_path):
    tables = T.nsys_tables(40)
    kernels = tables["CUPTI_ACTIVITY_KIND_KERNEL"][1]
    for i, row in enumerate(kernels):  # two distinct names, alternating
        row["demangledName"] = 1 + 3 * (i % 2)
    tables["StringIds"][1].append((4, "void other_kernel(float*)"))
    t = load_trace(T.write_nsys(tmp_path / "t.sqlite", tables))
    for frame, col, distinct in (("kernels", "name", 2), ("kernels", "short_name", 1), ("runtime", "name", 1),
                                 ("nvtx", "text", 1)):
        s = getattr(t, frame)[col]
        assert s.dtype == STRING, (frame, col, s.dtype)
        values = _objects(s)
        assert len(set(values)) == distinct and len(values) == 40
        # pandas 3 turned object columns assigned to a frame into Arrow strings, and those
        # back into a new str per row: 10M names cost GBs instead of 80 MB
        assert len({id(v) for v in values}) == distinct, (frame, col)
    assert t.runtime["name"].iloc[0] == "cudaLaunchKernel"  # version suffix still dropped


def test_names_fall_back_per_row_and_null_strings_are_unknown(tmp_path):
    tables = T.nsys_tables(4)
    kernels = tables["CUPTI_ACTIVITY_KIND_KERNEL"][1]
    kernels[1]["demangledName"] = 99  # points nowhere: the short name stands in
    kernels[3]["demangledName"] = 5  # a NULL string
    tables["StringIds"] = (["id INTEGER PRIMARY KEY", "value TEXT"], [*tables["StringIds"][1], (5, None)])
    t = load_trace(T.write_nsys(tmp_path / "t.sqlite", tables))
    names = t.kernels.sort_values("start_ns")["name"].tolist()
    full = "void gemm_kernel<128, 128, 64>(Params)"
    assert names == [full, "gemm_kernel", full, "gemm_kernel"]


def test_launch_dimensions_are_int32_and_impossible_values_still_masked(tmp_path):
    tables = T.nsys_tables(3)
    kernels = tables["CUPTI_ACTIVITY_KIND_KERNEL"][1]
    kernels[1]["gridX"] = 2**31  # beyond CUDA's limit (and int32): unknown, not wrapped
    kernels[2]["dynamicSharedMemory"] = 2**40
    t = load_trace(T.write_nsys(tmp_path / "t.sqlite", tables))
    k = t.kernels.sort_values("start_ns").reset_index(drop=True)
    for col, dtype in NARROW["kernels"].items():
        assert str(k[col].dtype) == dtype, col
    assert k["grid_x"].isna().tolist() == [False, True, False]
    assert k["dynamic_smem_bytes"].isna().tolist() == [False, False, True]
    assert pd.isna(k.loc[1, "grid_blocks"]) and k.loc[0, "grid_blocks"] == k.loc[0, "grid_x"] * k.loc[0, "grid_y"]
    # products are Int32 where every one fits (NARROW_IF_FIT), computed in Int64 first
    assert str(k["grid_blocks"].dtype) == "Int32"
    assert any("impossible" in n for n in t.meta["notes"])
    kernels[1]["gridX"], kernels[1]["gridY"] = 2**20, 2**12  # 2**32 blocks: past int32, not wrapped
    k = load_trace(T.write_nsys(tmp_path / "wide.sqlite", tables)).kernels.sort_values("start_ns")
    assert str(k["grid_blocks"].dtype) == "Int64" and int(k["grid_blocks"].iloc[1]) == 2**32 * int(k["grid_z"].iloc[1])


def test_build_does_not_copy_the_readers_columns():
    start = np.arange(1_000, dtype=np.int64)
    df = pd.DataFrame({"start_ns": start, "end_ns": start + 1, "dur_ns": 1, "rank": 0,
                       "correlation_id": pd.array(np.arange(1_000), dtype="Int64"),
                       "name": pd.array(["k"] * 1_000, dtype=STRING)})
    t = Trace.build(kernels=df)
    # nullable and text columns are each their own array: Trace.build keeps them (a second
    # copy of every frame at the peak of a read, before)
    for col in ("correlation_id", "name"):
        assert np.shares_memory(t.kernels[col].array._data if col != "name" else t.kernels[col].array._ndarray,
                                df[col].array._data if col != "name" else df[col].array._ndarray), col


def test_ids_are_int32_where_they_fit_and_int64_where_not(tmp_path):
    tables = T.nsys_tables(3)
    t = load_trace(T.write_nsys(tmp_path / "t.sqlite", tables))
    for frame, col in (("kernels", "device_id"), ("kernels", "stream_id"), ("kernels", "correlation_id"),
                       ("runtime", "correlation_id"), ("runtime", "thread_id")):
        assert str(getattr(t, frame)[col].dtype) == "Int32", (frame, col)
    assert t.kernels["graph_launch_id"].isna().all() and str(t.kernels["graph_launch_id"].dtype) == "Int64"
    assert t.kernels["rank"].dtype == np.int32 and t.runtime["rank"].dtype == np.int32
    assert t.devices["rank"].dtype == np.int64  # a few rows: left as they are
    # an id beyond int32 keeps the column wide, with its values exact
    kernels = tables["CUPTI_ACTIVITY_KIND_KERNEL"][1]
    calls = tables["CUPTI_ACTIVITY_KIND_RUNTIME"][1]
    kernels[2]["correlationId"] = calls[2]["correlationId"] = 2**31 + 7
    t = load_trace(T.write_nsys(tmp_path / "wide.sqlite", tables))
    for frame in ("kernels", "runtime"):
        s = getattr(t, frame)["correlation_id"]
        assert str(s.dtype) == "Int64" and (s == 2**31 + 7).sum() == 1, frame
    assert str(t.kernels["stream_id"].dtype) == "Int32"


def test_all_na_text_columns_take_no_memory_per_row_and_stay_writable():
    t = Trace.build(kernels=pd.DataFrame({"start_ns": np.arange(1_000), "end_ns": np.arange(1_000) + 1,
                                          "dur_ns": 1, "rank": 0}))
    s = t.kernels["comm_name"]
    assert s.dtype == STRING and s.isna().all() and s.array._ndarray.strides == (0,)
    # a copy written to (as exposed_comm fills comm_name) becomes an ordinary array
    k = t.kernels.copy()
    k.loc[[3, 5], "comm_name"] = ["allreduce", "all_gather"]
    assert k["comm_name"].iloc[[3, 5]].tolist() == ["allreduce", "all_gather"]
    assert k["comm_name"].isna().sum() == 998
    assert t.kernels["comm_name"].isna().all()
    assert pd.concat([t.kernels["comm_name"], s]).isna().all()


def test_one_rank_one_device_and_unknown_columns_are_views(tmp_path):
    """A single-process, single-GPU capture (the usual case): rank and device id hold one
    value each, kept as a zero-stride view (0 bytes a row); an all-NA number column's mask
    is one too. Values and dtypes are what they were."""
    t = load_trace(T.write_nsys(tmp_path / "t.sqlite", T.nsys_tables(40)))
    k = t.kernels
    assert k["rank"].dtype == np.int32 and k["rank"].to_numpy().strides == (0,) and set(k["rank"]) == {0}
    dev = k["device_id"].array
    assert str(k["device_id"].dtype) == "Int32" and dev._data.strides == (0,) and not dev._mask.any()
    assert k["graph_node_id"].isna().all() and k["graph_node_id"].array._mask.strides == (0,)
    assert t.runtime["rank"].to_numpy().strides == (0,)
    # a copy is a real array again
    assert k.loc[k.index[:5], "rank"].to_numpy().strides == (4,)
