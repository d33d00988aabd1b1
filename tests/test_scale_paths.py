"""The array paths the scale work (docs/scale.md, nsys fifth pass) put in place of frame
operations give what the frame operations gave, on random inputs with the awkward cases
(unsorted, ties, missing ids, duplicate correlation ids, negative durations)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from advisor.model import Trace, string_array
from advisor.symptoms import gemm, intervals, strings


def _merged_total(s, e) -> int:
    ms, me = intervals.merge(s, e)
    return int((me - ms).sum())


def test_total_is_the_merged_length():
    rng = np.random.default_rng(0)
    for _ in range(500):
        n = int(rng.integers(1, 40))
        s = rng.integers(0, 200, n)
        e = s + rng.integers(-10, 40, n)  # a few reversed intervals too
        assert intervals.total(s, e) == _merged_total(s, e)
    assert intervals.total([], []) == 0


def test_merge_blocks():
    s, e = intervals.merge([5, 0, 2, 20, 21], [8, 3, 4, 22, 30])
    assert s.tolist() == [0, 5, 20] and e.tolist() == [4, 8, 30]


def _trace(rng, n_k: int, n_r: int) -> Trace:
    corr_r = rng.integers(0, n_r // 2 + 1, n_r)  # duplicates: the first row is the launch call
    rt = pd.DataFrame({
        "rank": rng.integers(0, 2, n_r), "thread_id": pd.array(rng.integers(1, 4, n_r), dtype="Int64"),
        "correlation_id": pd.array(corr_r, dtype="Int64"), "start_ns": rng.integers(0, 10**6, n_r)})
    rt.loc[rng.random(n_r) < 0.1, "correlation_id"] = pd.NA
    rt.loc[rng.random(n_r) < 0.1, "thread_id"] = pd.NA
    rt["end_ns"] = rt["start_ns"] + 10
    rt["dur_ns"] = 10
    rt["name"] = string_array(np.full(n_r, "cudaLaunchKernel", dtype=object))
    k = pd.DataFrame({"rank": rng.integers(0, 2, n_k), "correlation_id": pd.array(rng.integers(0, n_r, n_k), dtype="Int64"),
                      "start_ns": rng.integers(0, 10**6, n_k)})
    k.loc[rng.random(n_k) < 0.1, "correlation_id"] = pd.NA
    k["end_ns"] = k["start_ns"] + 5
    k["dur_ns"] = 5
    k["name"] = string_array(np.full(n_k, "kernel", dtype=object))
    return Trace.build(kernels=k, runtime=rt)


@pytest.mark.parametrize("seed", range(5))
def test_launch_arrays_match_the_merge(seed):
    t = _trace(np.random.default_rng(seed), 300, 200)
    assert gemm._fits_one_key(t)
    launch, tid = gemm._launch_arrays(t)
    ref = gemm._launch_merge(t)
    assert np.array_equal(launch, ref["launch_ns"].to_numpy(np.float64, na_value=np.nan), equal_nan=True)
    assert tid.isna().tolist() == ref["thread_id"].isna().tolist()
    assert (tid.to_numpy(np.int64, na_value=-1) == ref["thread_id"].astype("Int64").to_numpy(np.int64, na_value=-1)).all()


def test_launch_points_fall_back_to_the_merge_for_wide_keys():
    t = _trace(np.random.default_rng(7), 50, 40)
    t.kernels["correlation_id"] = t.kernels["correlation_id"] + 2**41  # past one int64 key
    t.runtime["correlation_id"] = t.runtime["correlation_id"] + 2**41
    assert not gemm._fits_one_key(t)
    got = gemm._launch_points(t)
    assert got["launch_ns"].notna().sum() == gemm._launch_merge(t)["launch_ns"].notna().sum() > 0


def test_contains_in_chunks_is_contains(monkeypatch):
    values = np.array(["abc", pd.NA, "gemm_xyz", "a" * 5000 + "gemm", "nvjet"] * 7, dtype=object)
    s = pd.Series(string_array(values), index=np.arange(100, 135))
    whole = strings.contains(s, r"gemm|nvjet")
    monkeypatch.setattr(strings, "_CONTAINS_CHUNK", 4)
    chunked = strings.contains(s, r"gemm|nvjet")
    assert chunked.index.equals(whole.index) and (chunked == whole).all()
    assert whole.tolist()[:5] == [False, False, True, False, True]  # past MATCH_CHARS: not searched


@pytest.mark.parametrize("seed", range(3))
def test_busy_before_a_gap_is_the_running_busy_time(seed):
    from advisor.rules import load_rules
    from advisor.symptoms import Context, idle

    rng = np.random.default_rng(seed)
    n = 200
    start = np.sort(rng.integers(0, 20_000, n))
    end = start + rng.integers(1, 300, n)  # overlapping and disjoint kernels
    k = pd.DataFrame({"rank": 0, "device_id": pd.array(np.zeros(n, dtype=np.int64), dtype="Int64"),
                      "start_ns": start, "end_ns": end, "dur_ns": end - start,
                      "name": string_array(np.full(n, "k", dtype=object))})
    ctx = Context(Trace.build(kernels=k), load_rules())
    gaps = idle.gaps(ctx)
    assert len(gaps)
    # what gaps() kept before: the cumulative merged length up to the activity before each gap
    frontier = np.maximum.accumulate(end)
    busy = np.cumsum(np.maximum(0, end - np.concatenate([[start[0]], np.maximum(start[1:], frontier[:-1])])))
    before = np.flatnonzero(start[1:] > frontier[:-1])
    named = idle.named(ctx, gaps, busy=True)
    assert named["busy_before_ns"].tolist() == busy[before].tolist()
    assert named["next_name"].tolist() == ["k"] * len(gaps)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_attention_successors_do_not_depend_on_the_ids_width(seed):
    """decode_attention orders kernels by ids in their stored width (int32 ranks and Int32
    device/stream ids once load_trace narrows them): the same successors as with int64."""
    from advisor.rules import load_rules
    from advisor.symptoms import Context
    from advisor.symptoms.decode_attention import attention_launches

    rng = np.random.default_rng(seed)
    n = 400
    names = np.array(["void flash_fwd_kernel<T>(Params)", "flash_fwd_splitkv_kernel<T>",
                      "flash_fwd_splitkv_combine_kernel<T>", "gemm"], dtype=object)
    start = rng.integers(0, 5_000, n)  # ties included
    dev = pd.array(np.where(rng.random(n) < 0.1, -1, rng.integers(0, 2, n)), dtype="Int64")
    stream = pd.array(np.where(rng.random(n) < 0.1, -1, rng.integers(0, 3, n)), dtype="Int64")
    dev[dev == -1], stream[stream == -1] = pd.NA, pd.NA
    k = pd.DataFrame({"rank": rng.integers(0, 2, n), "device_id": dev, "stream_id": stream, "start_ns": start,
                      "end_ns": start + 10, "dur_ns": rng.integers(1, 100, n),
                      "name": string_array(names[rng.integers(0, 4, n)])})
    wide = attention_launches(Context(Trace.build(kernels=k), load_rules()))
    t = Trace.build(kernels=k)
    t.kernels["rank"] = t.kernels["rank"].astype(np.int32)
    for col in ("device_id", "stream_id"):
        t.kernels[col] = t.kernels[col].astype("Int32")
    narrow = attention_launches(Context(t, load_rules()))
    assert len(wide) and wide["next_is_combine"].any() and not wide["next_is_combine"].all()
    pd.testing.assert_frame_equal(wide, narrow)


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("one_rank", [False, True])
def test_launch_arrays_over_stored_widths_in_chunks_match_the_merge(seed, one_rank, monkeypatch):
    """_launch_arrays reads ids as stored (Int32 after `narrow`, a rank of one value as a
    zero-stride view) and builds its keys a chunk at a time: the same launches as the merge
    over the Int64 frames."""
    from advisor.model import narrow

    rng = np.random.default_rng(seed)
    t = _trace(rng, 300, 200)
    if one_rank:
        t.kernels["rank"] = 0
        t.runtime["rank"] = 0
    ref = gemm._launch_merge(t)
    narrow(t)
    assert str(t.kernels["correlation_id"].dtype) == "Int32" and t.kernels["rank"].dtype == np.int32
    assert (t.kernels["rank"].to_numpy().strides[0] == 0) == one_rank
    monkeypatch.setattr(gemm, "_KEY_CHUNK", 16)
    assert gemm._fits_one_key(t)
    launch, tid = gemm._launch_arrays(t)
    assert np.array_equal(launch, ref["launch_ns"].to_numpy(np.float64, na_value=np.nan), equal_nan=True)
    assert tid.astype("Int64").equals(ref["thread_id"].astype("Int64").array)


def test_merge_of_disjoint_intervals_is_the_intervals():
    """Without overlaps merge returns the starts and running ends themselves: the blocks
    the general path builds."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        n = int(rng.integers(1, 30))
        s = np.cumsum(rng.integers(1, 20, n))
        e = s + rng.integers(0, 1, n)  # empty or touching-free intervals, in order
        ms, me = intervals.merge(s, e)
        ref_s, ref_e = [int(s[0])], [int(e[0])]
        for a, b in zip(s[1:], e[1:]):
            if a > ref_e[-1]:
                ref_s.append(int(a))
                ref_e.append(int(b))
            else:
                ref_e[-1] = max(ref_e[-1], int(b))
        assert ms.tolist() == ref_s and me.tolist() == ref_e


def test_constant_view_holds_one_value_without_its_rows():
    from advisor.model import constant_view

    n = 1000
    for s in (pd.Series(np.full(n, 3, dtype=np.int32)), pd.Series(pd.array(np.full(n, 7), dtype="Int32")),
              pd.Series(np.full(n, 132.0))):
        v = constant_view(s)
        data = getattr(v.array, "_data", None)
        assert (data if data is not None else v.to_numpy()).strides == (0,)
        assert v.equals(s) and v.dtype == s.dtype
        assert v.iloc[[1, 5]].tolist() == s.iloc[[1, 5]].tolist()
        assert v.groupby(v).size().tolist() == [n]
    # not one value, a missing value or NaN: the column itself
    for s in (pd.Series(np.arange(n)), pd.Series(pd.array([1] * (n - 1) + [None], dtype="Int32")),
              pd.Series(np.full(n, np.nan))):
        assert constant_view(s) is s


def _context(tmp_path):
    import tracefiles as T

    from advisor.rules import load_rules
    from advisor.symptoms.context import Context
    from advisor.traces import load_trace

    tables = T.nsys_tables(60)
    for i, row in enumerate(tables["CUPTI_ACTIVITY_KIND_KERNEL"][1]):
        row["gridX"] = 1 + (i * 37) % 400
        row["blockX"] = (64, 128, 256, 384)[i % 4]
    return Context(load_trace(T.write_nsys(tmp_path / "t.sqlite", tables)), load_rules())


def test_waves_where_read_are_occupancys(tmp_path):
    from advisor.symptoms.occupancy import occupancy, waves_at

    ctx = _context(tmp_path)
    k = ctx.kernels
    assert "waves" not in k.columns
    ref = occupancy(ctx.trace)["waves"].to_numpy()
    assert np.array_equal(waves_at(k), ref, equal_nan=True)
    rows = np.array([5, 0, 17, 59, 17])
    assert np.array_equal(waves_at(k, rows), ref[rows], equal_nan=True)


def test_launch_groups_keys_from_the_source_are_the_rows_own(tmp_path):
    """launch_rows no longer copies the key columns: group_launches takes them from
    Context.kernels at each group's first row, which are the values the rows held."""
    from advisor.symptoms.context import GROUP_KEYS, group_launches, launch_rows

    ctx = _context(tmp_path)
    k = ctx.kernels
    mask = np.random.default_rng(2).random(len(k)) < 0.6
    extra = ["grid_blocks", "sm_count"]
    lean = launch_rows(k, mask, extra)
    assert not set(GROUP_KEYS) & set(lean.columns)
    full = k.loc[mask, list(dict.fromkeys([*GROUP_KEYS, "dur_ns", "_launch_group", *extra]))]
    got = group_launches(lean, extra, k)
    assert got.equals(group_launches(full, extra))
    assert len(got) > 1
