"""launch_overhead: work cut into pieces so small that launching them costs as much as running them.

What it detects, three shapes of one problem:
* runs of tiny back-to-back kernels on one stream (each under `tiny_kernel_ns`), where the
  gaps between them are a large share of the run: the stream is launch-bound;
* host-bound windows on a device: short idle gaps (up to `max_gap_in_run_ns`) where the launch
  call of the next kernel started only after the GPU had gone idle (advisor.symptoms.idle), so
  the GPU waited on the CPU, even where longer kernels break the tiny-kernel runs;
* huge grids of very short blocks: many waves (occupancy model) each lasting a few
  microseconds, so block launch and prologue are paid again and again. One finding per
  kernel (its grids' range in the evidence).
Why it matters: the GPU idles between launches, and short blocks spend a visible share of
their life starting up. What to do depends on what the run is made of, so the strategy id is
per pattern (rules/launch_overhead.toml `[strategies]`): a loop of small GEMMs -> one grouped
launch; a run of elementwise/reduction kernels -> fusion (torch.compile, torch._foreach_*);
mixed work (a model's layers) or a host-bound window -> capture the loop in a CUDA graph; one
kernel repeated or one huge grid -> persistent. Estimated recoverable time: for runs and
host-bound windows, the gaps (idle wall time, savings_unit "wall", so it can exceed the
kernels' own time); for big grids, the measured per-block scheduling cost
(`block_cost_ns`, experiments/block_cost.py) x blocks / SMs, capped by the kernel's own
throughput floor where its bytes are known (savings_unit "gpu"). A run finding covers every
tiny kernel of the stream's runs of one kind: `launches` and `total_ns` are theirs, `kernel`
names the one with the most time in them (its own counts in the evidence).
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pandas as pd

from ..findings import Finding
from ..model import STRING
from ..rules import Rule
from ..traces.graphs import is_graph_replayed
from .context import Context, finding_for, gemm_bytes, id_array, sort_keys
from .idle import gaps as idle_gaps
from .idle import SYNC_CALLS, host_context
from .idle import next_names as idle_next_names
from .idle import rank_start as idle_rank_start
from .kernel_kinds import schedule_excluded
from .occupancy import waves_at
from .position_loops import loop_findings
from .strings import contains, factorize

SYMPTOM = "launch_overhead"
REQUIRES = ()  # runs need only kernel times; the big-grid half also needs grids and SM counts

# torch.compile's (Inductor's) generated kernels: a run of these is fused already
_INDUCTOR = re.compile(r"^triton_(?:poi|red|per)_")
# A recurrent layer's own kernels (cuDNN's elemWiseRNNcell, LSTM_elementWise_bp1, its persistent
# RNN kernels; MIOpen's and compiled LSTM/GRU cells): a run of these and GEMMs steps through time,
# each step's GEMM reading the last step's output
_RECURRENT = re.compile(r"rnn|lstm|(?<![a-z])gru", re.IGNORECASE)
# Kernels whose work is elementwise or a reduction (ATen's elementwise/reduce templates,
# Inductor's pointwise/reduction/persistent-reduction kernels, multi-tensor optimizers, copies,
# fills, norms, softmax, index/scatter/gather): what fusion (torch.compile) or foreach ops merge.
_ELEMENTWISE = re.compile(
    r"elementwise|reduce_kernel|reduction|triton_(?:poi|red|per)_|multi_tensor_apply|foreach|CatArray|"
    r"fill|copy_kernel|index|softmax|norm|scatter|gather|where_kernel|_amp_",
    re.IGNORECASE,
)


UNNAMED = "(kernel name not in the trace)"
_EMIT_SIZES = re.compile(r"sizes = \[")

# One run finding per stream and kind of run (mostly GEMMs or not)
_KEY = ["rank", "device_id", "stream_id", "gemm_run"]


def _runs_key(rule: Rule) -> tuple:
    """ctx.cache key of find_runs' frame; + ("names",) and + ("shapes",) hold its side tables
    (per run_id: each kernel name's time and launches; each GEMM launch's shape and dtype)."""
    return ("runs", rule["tiny_kernel_ns"], rule["max_gap_in_run_ns"], rule["min_run_kernels"])


def _stream_ids(s: pd.Series) -> np.ndarray:
    """id_array's values (-1 where missing) in the column's own width when it is Int32."""
    if isinstance(s.dtype, pd.Int32Dtype):
        return s.to_numpy(np.int32, na_value=-1)
    return id_array(s)


def find_runs(ctx: Context, rule: Rule) -> pd.DataFrame:
    """Runs of tiny back-to-back kernels per (rank, device, stream): one row per run with
    kernels, kernel_ns, gap_ns, first/last times and the dominant kernel name. Cached. Ranks
    whose kernels the profiler serialized have none (their gaps are the profiler's)."""
    key = _runs_key(rule)
    if key in ctx.cache:
        return ctx.cache[key]
    k = ctx.kernels
    cols = ["rank", "device_id", "stream_id", "start_ns", "end_ns", "dur_ns", "name", "is_gemm", "correlation_id"]
    cols += [c for c in ("M", "N", "K", "batch", "dtype") if c in k.columns]
    name_key = "_name_code" if "_name_code" in k.columns else "name"  # integers hash faster than names
    if name_key != "name":
        cols.append(name_key)
    # sorted and linked over plain arrays, then only the tiny kernels' rows taken from k (a
    # copy of these columns for every kernel, then its sorted copy, was this symptom's peak)
    sel = np.flatnonzero(~k["rank"].isin(ctx.serialized_ranks).to_numpy(dtype=bool)) if ctx.serialized_ranks \
        else None  # None: every kernel (the columns themselves, not copies, are sorted below)
    if sel is not None and not len(sel) or not len(k):
        ctx.cache[key] = pd.DataFrame()
        return ctx.cache[key]
    # (streams in their stored width, int32 for Int32, until the tiny kernels' are taken)
    rank, dev, stream, start = ((a if sel is None else a[sel]) for a in (
        k["rank"].to_numpy(), id_array(k["device_id"]), _stream_ids(k["stream_id"]), k["start_ns"].to_numpy()))
    order = np.lexsort(sort_keys(start, stream, dev, rank))  # stable, as sort_values(kind="stable")
    sel = order if sel is None else sel[order]
    # neighbours in that order compared one key at a time, and each full-length temporary
    # written in place or let go at once (sorted copies of the four keys and the gap and run
    # arrays, each built through a temporary or two, were this symptom's peak)
    same = np.ones(max(len(order) - 1, 0), dtype=bool)
    for col in sort_keys(rank, dev, stream):  # (one value: every neighbour the same)
        sk = col[order]
        same &= sk[1:] == sk[:-1]
        del sk
    del rank
    start = start[order]
    # a kernel replayed from a CUDA graph was not launched on its own: the gaps around it are
    # not launch overhead, and a graph is what the advice would be
    tiny = k["dur_ns"].to_numpy()[sel] < rule["tiny_kernel_ns"]
    tiny &= ~is_graph_replayed(k).to_numpy(dtype=bool)[sel]
    gap = k["end_ns"].to_numpy()[sel[:-1]]
    np.subtract(start[1:], gap, out=gap)
    np.maximum(gap, 0, out=gap)  # as np.clip(..., 0, None)
    del start
    link = same & tiny[1:] & tiny[:-1] & (gap <= rule["max_gap_in_run_ns"])
    del same
    run_id = np.zeros(len(sel), dtype=np.int32 if len(sel) < 2**31 else np.int64)  # (int64 once taken)
    np.cumsum(~link, out=run_id[1:])
    np.multiply(gap, link, out=gap)  # the gap before each linked kernel (gap >= 0), 0 elsewhere
    del link
    tiny = np.flatnonzero(tiny)
    # each tiny kernel's gap before it (the first kernel has none), at those positions only
    # (positions sorted: only the first can be 0; one index array and the values taken)
    # (the positions shifted in place and back: no second index array)
    first = bool(len(tiny)) and tiny[0] == 0
    tiny -= 1
    gap_before = gap.take(tiny) if len(gap) else np.zeros(len(tiny), dtype=gap.dtype)
    tiny += 1
    del gap
    if first:
        gap_before[0] = 0
    # the tiny kernels' values, each full-length array let go as soon as it is taken (a
    # device of one value stays one value)
    at = order[tiny]
    rows = at if sel is order else sel[tiny]
    del sel, order
    run_id = run_id[tiny].astype(np.int64)
    del tiny
    dev = np.broadcast_to(dev[:1], at.shape) if len(dev) > 1 and not dev.strides[0] else dev[at]
    stream = stream[at].astype(np.int64)
    del at

    def frame(at: np.ndarray, names: list[str]) -> pd.DataFrame:
        """The tiny kernels' rows `at` (positions in `rows`) as a frame, column by column (k[cols]
        may copy k's blocks) and not consolidated (copy=False)."""
        own = {"device_id": dev, "stream_id": stream, "run_id": run_id, "gap_before": gap_before}
        return pd.DataFrame({c: own[c][at] if c in own else k[c].iloc[rows[at]] for c in names},
                            index=k.index[rows[at]], copy=False)

    # only the columns the runs' totals need for every tiny kernel; all of them for the
    # kernels in runs, once these are known
    # runs are contiguous in this order: the rows of runs long enough to count, found from
    # the runs' sizes (a frame and a group-by of every tiny kernel were this symptom's peak:
    # ~100 bytes a kernel, most of them in runs too short to report)
    first_of_run = np.flatnonzero(np.concatenate([[True], run_id[1:] != run_id[:-1]])) if len(run_id) else run_id
    sizes = np.diff(np.append(first_of_run, len(run_id)))
    long_enough = np.flatnonzero(np.repeat(sizes >= rule["min_run_kernels"], sizes))
    del first_of_run, sizes
    d = frame(long_enough, ["rank", "device_id", "stream_id", "start_ns", "end_ns", "dur_ns", "is_gemm", "run_id",
                            "gap_before"])
    del long_enough
    g = d.groupby("run_id", sort=False)
    runs = g.agg(
        rank=("rank", "first"),
        device_id=("device_id", "first"),
        stream_id=("stream_id", "first"),
        kernels=("dur_ns", "size"),
        kernel_ns=("dur_ns", "sum"),
        gap_ns=("gap_before", "sum"),
        first_ns=("start_ns", "min"),
        last_ns=("end_ns", "max"),
        gemm_fraction=("is_gemm", "mean"),
    )
    runs = runs[runs["kernels"] >= rule["min_run_kernels"]].copy()
    # the kernels whose gap before them a run counts (positions in ctx.kernels), so that the
    # host-bound windows do not count those gaps again where the run's finding fires
    del g, d
    in_run = np.isin(run_id, runs.index.to_numpy())
    gapped = in_run & (gap_before > 0)
    ctx.cache[key + ("gapped",)] = pd.DataFrame({"run_id": run_id[gapped],
                                                 "pos": k.index.get_indexer(k.index[rows[gapped]]),
                                                 "gap": gap_before[gapped]})
    streams = stream[gapped]
    if len(runs) and len(streams) and bool((streams != streams[0]).any()):
        # (one stream's gaps never overlap each other: a stream runs one kernel at a time)
        runs["gap_ns"] = _gaps_once(ctx, rows[gapped], dev[gapped], gap_before[gapped], run_id[gapped],
                                    runs.index)
    del gapped, streams
    # a loop of small GEMMs and a stream of elementwise kernels want different fixes (one
    # grouped launch, a persistent kernel or a CUDA graph), even on one stream
    runs["gemm_run"] = runs["gemm_fraction"] >= 0.5
    if len(runs):
        in_runs = frame(in_run, [*cols, "run_id", "gap_before"])
        per_name = in_runs.groupby(["run_id", name_key], sort=False)["dur_ns"].agg(["sum", "size"]).reset_index()
        if name_key != "name":
            names = in_runs.drop_duplicates(name_key).set_index(name_key)["name"]
            per_name["name"] = names.reindex(per_name[name_key].to_numpy()).to_numpy()
        # an export without names (no StringIds, ids pointing nowhere) still has runs: grouping
        # by name would drop them and leave NaN counts for the finding
        per_name["name"] = per_name["name"].astype(object).where(per_name["name"].notna(), UNNAMED)
        # what each run is made of, for the finding's "mostly <kernel>" (a run mixes kernels)
        per_name = per_name.rename(columns={"sum": "ns", "size": "launches"})
        ctx.cache[key + ("names",)] = per_name[["run_id", "name", "ns", "launches"]]
        # the GEMM shapes the runs launch (where NVTX or the profiler gave them): what a
        # grouped launch would take
        if {"M", "N", "K"} <= set(in_runs.columns):
            g = in_runs[in_runs["is_gemm"] & in_runs["M"].notna() & in_runs["N"].notna() & in_runs["K"].notna()]
            if "batch" in g:
                g = g[g["batch"].fillna(1) == 1]  # batched GEMMs are not what --shapes lists
            shapes = pd.DataFrame({
                "run_id": g["run_id"].to_numpy(),
                "shape": [f"{int(m)}x{int(n)}x{int(kk)}" for m, n, kk in zip(g["M"], g["N"], g["K"])],
                "dtype": g["dtype"].astype("object").to_numpy() if "dtype" in g else None,
            })
            ctx.cache[key + ("shapes",)] = shapes
        top = per_name.sort_values("ns", ascending=False).drop_duplicates("run_id").set_index("run_id")
        runs["top_kernel"] = top["name"].reindex(runs.index)
        corr = in_runs[["run_id", "rank", "correlation_id"]].dropna()
        rt = ctx.trace.runtime
        if len(rt) and len(corr):
            api = corr.merge(
                rt[["rank", "correlation_id", "dur_ns"]].dropna(subset=["correlation_id"]),
                on=["rank", "correlation_id"],
                how="inner",
            )
            runs["launch_api_ns"] = api.groupby("run_id")["dur_ns"].sum().reindex(runs.index).fillna(0)
        else:
            runs["launch_api_ns"] = np.nan
    ctx.cache[key] = runs.reset_index()
    return ctx.cache[key]


def _gaps_once(ctx: Context, rows, dev, gap, run_id, runs_index) -> np.ndarray:
    """Per run (in `runs_index` order): its kernels' gaps, with time in gaps of several streams
    at once counted once (for the gap that began first). Streams waiting together wait for the
    same wall time: cuDNN's LSTM steps two layers on two streams, and summing both streams'
    gaps claimed more wall time than the step had idle. (Time one stream waits while another
    runs a kernel still counts: that kernel may fill few SMs, as NCCL's do.)"""
    k = ctx.kernels
    start = k["start_ns"].to_numpy()[rows].astype(np.int64, copy=False)
    rank = k["rank"].to_numpy()[rows].astype(np.int64)  # (indexed first: rank may be a one-value view)
    dev = np.asarray(dev, dtype=np.int64)
    once = np.zeros(len(rows), dtype=np.int64)
    for r, d in np.unique(np.column_stack([rank, dev]), axis=0):
        at = np.flatnonzero((rank == r) & (dev == d))
        b = start[at]
        a = b - gap[at]
        order = np.argsort(a, kind="stable")
        a, b = a[order], b[order]
        # each gap begins no earlier than every earlier gap's end: the union is the same
        a[1:] = np.maximum(a[1:], np.maximum.accumulate(b)[:-1])
        once[at[order]] = np.maximum(b - a, 0)
    return pd.Series(once).groupby(run_id).sum().reindex(runs_index).fillna(0).to_numpy(np.int64)


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    """Two kinds of rows: kind="run" (per stream and kind of run, GEMM loops apart from the
    rest, summed over those runs) and kind="big_grid" (per kernel launch group)."""
    parts = []
    runs = find_runs(ctx, rule)
    if len(runs):
        per_stream = runs.groupby(_KEY, sort=False).agg(
            runs=("run_id", "size"),
            kernels=("kernels", "sum"),
            kernel_ns=("kernel_ns", "sum"),
            gap_ns=("gap_ns", "sum"),
            launch_api_ns=("launch_api_ns", lambda s: s.sum(min_count=1)),
            gemm_fraction=("gemm_fraction", "mean"),
        )
        per_stream = per_stream.reset_index()
        # the side tables per finding: their runs' rows, joined on run_id
        key, ids = _runs_key(rule), runs[["run_id", *_KEY]]
        stream_keys = pd.MultiIndex.from_frame(per_stream[_KEY])
        # the finding's kernel is the one with the most time in its runs, with its own counts
        names = ctx.cache[key + ("names",)].merge(ids, on="run_id")
        names = names.groupby([*_KEY, "name"], sort=False)[["ns", "launches"]].sum().reset_index()
        distinct = names.groupby(_KEY, sort=False)["name"].size()
        top = names.sort_values("ns", ascending=False, kind="stable").drop_duplicates(_KEY).set_index(_KEY)
        # the model's string dtype, as the big-grid rows have it (model.STRING: one storage)
        per_stream["name"] = pd.array(top["name"].reindex(stream_keys).to_numpy(), dtype=STRING)
        per_stream["top_kernel_launches"] = top["launches"].reindex(stream_keys).to_numpy()
        per_stream["top_kernel_ns"] = top["ns"].reindex(stream_keys).to_numpy()
        per_stream["kernel_names"] = distinct.reindex(stream_keys).to_numpy()
        ew = names[names["name"].astype(str).str.contains(_ELEMENTWISE).to_numpy()]
        per_stream["elementwise_ns"] = ew.groupby(_KEY, sort=False)["ns"].sum().reindex(stream_keys).fillna(0).to_numpy()
        ind = names[names["name"].astype(str).str.contains(_INDUCTOR).to_numpy()]
        per_stream["compiled_ns"] = ind.groupby(_KEY, sort=False)["ns"].sum().reindex(stream_keys).fillna(0).to_numpy()
        rec = names[names["name"].astype(str).str.contains(_RECURRENT).to_numpy()]
        per_stream["recurrent_launches"] = (rec.groupby(_KEY, sort=False)["launches"].sum()
                                            .reindex(stream_keys).fillna(0).to_numpy())
        shapes, dtypes = _gemm_shapes(ctx.cache.get(key + ("shapes",)), ids)
        per_stream["gemm_shapes"] = [shapes.get(k, []) for k in stream_keys]
        per_stream["gemm_dtype"] = [dtypes.get(k) for k in stream_keys]
        per_stream["kind"] = "run"
        parts.append(per_stream)
    big = _big_grids(ctx, rule)
    if len(big):
        parts.append(big)
    hb = _host_bound(ctx, rule)
    if len(hb):
        parts.append(hb)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def _big_grids(ctx: Context, rule: Rule) -> pd.DataFrame:
    """kind="big_grid": one row per kernel (rank, device, name) over its launches with at
    least `min_waves_big_grid` waves of at most `max_wave_ns` each, whatever their grids (a
    kernel whose grid follows its input is one kernel, not one finding per grid): launches,
    time, the range of grids and waves, and the per-launch estimate summed (`saved_ns`, with
    `bound_ns` where a byte count gives the kernel a throughput floor)."""
    k = ctx.kernels
    # layout transposes and NCHW batch norm are layout_churn's (channels_last), not a persistent kernel's
    all_waves = waves_at(k)
    m = ~np.isnan(all_waves) & (~k["is_comm"] & k["grid_blocks"].notna() & k["sm_count"].notna()).to_numpy(dtype=bool) \
        & ~np.asarray(schedule_excluded(ctx), dtype=bool)
    if not m.any():
        return pd.DataFrame()
    cols = [c for c in ("rank", "device_id", "name", "_name_code", "grid_x", "grid_y", "grid_z", "block_x", "block_y",
                        "block_z", "grid_blocks", "waves", "blocks_per_sm", "sm_count", "dur_ns", "M", "N", "K",
                        "batch", "dtype", "is_gemm") if c in k.columns or c == "waves"]
    # the launches that qualify found over arrays first, then only their rows taken (column by
    # column: a copy of these columns for every kernel was a step of this symptom's peak)
    # (enough waves first: the per-launch wave times only for those)
    pos = np.flatnonzero(m & (all_waves >= rule["min_waves_big_grid"]))
    del m
    waves = all_waves[pos]
    wave_ns = k["dur_ns"].to_numpy()[pos] / np.ceil(waves)
    keep = wave_ns <= rule["max_wave_ns"]
    taken = pos[keep]
    d = pd.DataFrame({c: pd.Series(all_waves[taken], index=k.index[taken]) if c == "waves" else k[c].iloc[taken]
                      for c in cols}, copy=False)
    del all_waves, taken
    d["wave_ns"] = wave_ns[keep]
    del pos, waves, wave_ns, keep
    if d.empty:
        return pd.DataFrame()
    dur = d["dur_ns"].to_numpy("float64")
    blocks = d["grid_blocks"].astype("float64").to_numpy()
    sms = d["sm_count"].astype("float64").to_numpy()
    # what a persistent loop saves: each block's scheduling cost, paid blocks/SMs times per SM
    cost = blocks / sms * rule["block_cost_ns"]
    # a kernel cannot beat its own compulsory traffic: known for GEMMs with a shape
    floor = np.zeros(len(d))
    bw = np.array([ctx.device_value(r, dv, "mem_bandwidth_bytes_per_s") or np.nan for r, dv in zip(d["rank"], d["device_id"])],
                  dtype="float64")
    if "M" in d.columns:
        for i, row in enumerate(d[["M", "N", "K", "batch", "dtype", "is_gemm"]].itertuples(index=False)):
            if row.is_gemm and not pd.isna(row.M) and not np.isnan(bw[i]):
                shape = {"M": int(row.M), "N": int(row.N), "K": int(row.K), "batch": None if pd.isna(row.batch) else int(row.batch),
                         "dtype": None if pd.isna(row.dtype) else str(row.dtype)}
                floor[i] = gemm_bytes(shape)[0] / bw[i] * 1e9
    # the loop still does the work: never more than max_saving_share of the kernel's time
    d["saved_ns"] = np.clip(np.minimum(np.minimum(cost, dur * rule["max_saving_share"]), dur - floor), 0, None)
    d["floor_ns"] = floor
    d["device_id"] = d["device_id"].astype("Float64").fillna(-1).astype("int64")
    key = ["rank", "device_id", "_name_code" if "_name_code" in d.columns else "name"]
    g = d.groupby(key, sort=False)
    out = g.agg(
        name=("name", "first"), launches=("dur_ns", "size"), total_ns=("dur_ns", "sum"), median_ns=("dur_ns", "median"),
        saved_ns=("saved_ns", "sum"), floor_ns=("floor_ns", "sum"), grid_blocks_min=("grid_blocks", "min"),
        grid_blocks_max=("grid_blocks", "max"), waves_min=("waves", "min"), waves_max=("waves", "max"),
        wave_ns=("wave_ns", "median"), blocks_per_sm=("blocks_per_sm", "median"), sm_count=("sm_count", "first"),
    ).reset_index()
    # the grid and block the kernel ran with most often, for the finding's grid/block fields
    common = d.assign(_n=1).groupby([*key, "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z"], sort=False, dropna=False)["_n"].size()
    common = common.reset_index().sort_values("_n", ascending=False, kind="stable").drop_duplicates(key)
    out = out.merge(common.drop(columns="_n"), on=key, how="left")
    firsts = d.drop_duplicates(key)[[*key, *[c for c in ("M", "N", "K", "batch", "dtype") if c in d.columns]]]
    out = out.merge(firsts, on=key, how="left")
    out["kind"] = "big_grid"
    return out.sort_values("total_ns", ascending=False, kind="stable").reset_index(drop=True)


def _host_bound(ctx: Context, rule: Rule) -> pd.DataFrame:
    """kind="host_bound": per (rank, device), the short idle gaps (up to `max_gap_in_run_ns`)
    whose next launch call started after the GPU went idle: the host was still launching.
    Longer gaps are host stalls the gate reports."""
    g = idle_gaps(ctx)
    if g.empty:
        return pd.DataFrame()
    k = ctx.kernels
    # a gap before a graph-replayed kernel: the loop already runs from a CUDA graph, so
    # "capture it in a graph" is not the remedy (the graph launches are another finding's)
    pos = g["next_pos"].to_numpy()
    replayed = is_graph_replayed(k).to_numpy(dtype=bool)
    before_graph = (pos >= 0) & replayed[np.clip(pos, 0, max(len(k) - 1, 0))] if len(k) else np.zeros(len(g), bool)
    del replayed
    sel = np.flatnonzero(g["host_bound"].to_numpy(dtype=bool, na_value=False)
                         & (g["gap_ns"] <= rule["max_gap_in_run_ns"]).to_numpy() & ~before_graph)
    if not len(sel):
        return pd.DataFrame()
    del before_graph
    # the gaps by position, per (rank, device) in order of first appearance (a copy of every
    # such gap's columns, then of each group's and of its kernels', was this step's peak)
    g_rank, g_dev = g["rank"].to_numpy(), g["device_id"].to_numpy()
    waited_on_device = ~g["host_bound"].to_numpy(dtype=bool, na_value=True)  # known, and false
    if bool((g_rank[sel] == g_rank[sel[0]]).all() and (g_dev[sel] == g_dev[sel[0]]).all()):
        groups = [sel]
    else:
        group = pd.DataFrame({"r": g_rank[sel], "d": g_dev[sel]}).groupby(["r", "d"], sort=False).ngroup().to_numpy()
        by = np.argsort(group, kind="stable")
        groups = np.split(sel[by], np.flatnonzero(np.diff(group[by])) + 1)
    gap_ns, gap_start, thread = g["gap_ns"].to_numpy(), g["gap_start_ns"].to_numpy(), g["thread_id"].to_numpy()
    k_rank, k_dev = k["rank"].to_numpy(), id_array(k["device_id"])
    k_start, k_end, k_dur = (k[c].to_numpy() for c in ("start_ns", "end_ns", "dur_ns"))
    rows = []
    for at in groups:
        rank, dev = g_rank[at[0]], g_dev[at[0]]
        mask = (k_rank == rank) & (k_dev == dev)
        whole = bool(mask.all())  # one device: its kernels are all of them, no copies
        st, en, du = (k_start, k_end, k_dur) if whole else (k_start[mask], k_end[mask], k_dur[mask])
        del mask
        kern = at[pos[at] >= 0]  # the kernels that waited (a copy is no kernel to name)
        names = pd.Series(idle_next_names(ctx, kern if len(kern) else at), dtype=object).value_counts()
        del kern
        tid = pd.Series(thread[at])
        rows.append({
            "kind": "host_bound", "rank": int(rank), "device_id": int(dev), "name": str(names.index[0]),
            "host_gaps": int(len(at)), "host_gap_ns": int(gap_ns[at].sum()),
            "first_ns": int(gap_start[at].min()), "last_ns": int(gap_start[at].max()),
            "trace_start_ns": int(idle_rank_start(ctx, rank)),
            "span_ns": int(en.max() - st.min()) if len(st) else 0,
            "kernels": int(len(st)), "kernel_ns": int(du.sum()),
            "tiny_kernels": int((du < rule["tiny_kernel_ns"]).sum()),
            "device_gaps": int(((g_rank == rank) & (g_dev == dev) & waited_on_device).sum()),
            "gap_positions": pos[at], "gap_sizes": gap_ns[at],
            "thread_id": tid.mode().iloc[0] if tid.notna().any() else None,
        })
        del st, en, du, tid
    return pd.DataFrame(rows)


def _gemm_shapes(shapes: pd.DataFrame | None, ids: pd.DataFrame) -> tuple[dict, dict]:
    """Per finding key (_KEY): the distinct GEMM shapes of its runs, most launched first, and
    their most common dtype (where one is known)."""
    if shapes is None or shapes.empty:
        return {}, {}
    by_shape, by_dtype = {}, {}
    for k, g in shapes.merge(ids, on="run_id").groupby(_KEY, sort=False):
        by_shape[k] = g["shape"].value_counts(sort=True).index.tolist()
        known = g["dtype"].dropna()
        by_dtype[k] = str(known.value_counts().index[0]) if len(known) else None
    return by_shape, by_dtype


# a grouped-GEMM suggestion lists at most this many shapes (the most launched)
MAX_GROUPED_SHAPES = 64

# Kernels that belong to a library or runtime: their code is not the user's to make
# persistent, but the call that launches them can change. (pattern, library, what to change)
_LIBRARY_KERNELS = [
    (re.compile(r"cudnn", re.IGNORECASE), "cuDNN",
     "keep tensors in the layout the convolution wants (e.g. channels_last end to end), so layout kernels do not run"),
    (re.compile(r"__amd_rocclr_|\brocclr", re.IGNORECASE), "the ROCm runtime: copy and fill",
     "move the data in fewer, larger copies, or keep it on the device"),
    (re.compile(r"at::native::|\bc10::"), "PyTorch ATen",
     "fuse the elementwise work (torch.compile) or batch it (torch._foreach_* ops); a CUDA graph removes the gaps"),
    (re.compile(r"\bcub::|\bthrust::"), "CUB/Thrust", "call it on larger batches"),
]


def _own_name(name: str) -> str:
    """The kernel's own qualified name: without `void` and its template arguments and
    parameters, which may name library types (a custom kernel templated on c10::Half is not
    ATen's)."""
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    return re.split(r"[<(]", text, maxsplit=1)[0]


def _library(name: str) -> tuple[str, str] | None:
    own = _own_name(name)
    for pattern, library, change in _LIBRARY_KERNELS:
        if pattern.search(own):
            return library, change
    return None


def _note_library(evidence: dict, name: str) -> dict:
    found = _library(name)
    if found:
        evidence["library"], evidence["library_change"] = found
    return evidence


def _run_pattern(row, rule: Rule) -> str:
    """Which remedy a run calls for (a key of the rule's [strategies] table)."""
    if row.get("recurrent_launches", 0) >= rule["recurrent_min_launch_share"] * row["kernels"]:
        # a recurrent layer stepping through time: each step's GEMM needs the last step's
        # output, so they can be neither grouped nor made one persistent launch here
        return "recurrent_run"
    if row["gemm_fraction"] >= 0.5:
        return "gemm_loop"
    if row["kernel_ns"] and row.get("elementwise_ns", 0) / row["kernel_ns"] >= rule["fusion_min_share"]:
        # torch.compile's own kernels: fusing is done, the launches are left
        if row.get("compiled_ns", 0) >= 0.5 * row["elementwise_ns"]:
            return "compiled_run"
        return "elementwise_run"
    top_share = row["top_kernel_ns"] / row["kernel_ns"] if row["kernel_ns"] else 1.0
    if top_share < rule["mixed_top_share"]:
        return "mixed_run"
    # one kernel dominates, but a library's or the runtime's (a ROCm blit copy, a cuDNN layout
    # kernel): no one can make it persistent; the launches can be graphed, the call changed
    return "library_run" if _library(str(row["name"])) else "kernel_run"


# tier of each pattern's remedy: fusing, graphing or feeding the GPU is a basic (1); one
# grouped or persistent launch is a kernel schedule (4)
_TIER = {"gemm_loop": 4, "elementwise_run": 1, "compiled_run": 1, "recurrent_run": 1, "mixed_run": 1, "library_run": 1, "kernel_run": 4,
         "host_bound": 1, "big_grid": 4}


def profiler_slows_host(ctx: Context) -> bool:
    """True when the trace was recorded with per-operator shape recording (Kineto
    record_shapes: cpu_ops with Input Dims; nsys with emit_nvtx: one NVTX range per op). Both
    add host time to every operator, so the GPU's waits on the host in such a trace are longer
    than in the program run bare: measured on the H200 (2026-12-02), a channels_last
    EfficientNet-B0 step's launch gaps were 36.9 ms under Kineto with record_shapes against a
    39.9 - 25.0 = 14.9 ms host share of the bare step (docs/measured_levers.md)."""
    key = ("profiler_slows_host",)
    if key not in ctx.cache:
        ops, nv = ctx.trace.cpu_ops, ctx.trace.nvtx
        shapes = len(ops) > 0 and bool(ops["input_dims"].notna().any())
        # each distinct text of the first 200k searched once, as Python strings (astype(str)
        # made an Arrow copy of them, whose pool kept the memory)
        emit = len(nv) > 0 and any(_EMIT_SIZES.search(t) for t in factorize(nv["text"].iloc[:200_000])[1])
        ctx.cache[key] = shapes or emit
    return ctx.cache[key]


def _wall_confidence(frac: float, ctx: Context) -> str:
    """high for a mostly idle window, but never above medium where the profiler itself slowed
    the host (the gaps are real, their size is not the bare program's)."""
    if frac >= 0.5 and not profiler_slows_host(ctx):
        return "high"
    return "medium"


def _run_finding(row, rule: Rule, ctx: Context) -> Finding | None:
    busy = row["kernel_ns"] + row["gap_ns"]
    frac = row["gap_ns"] / busy if busy else 0.0
    if frac < rule["min_gap_fraction"] or row["gap_ns"] < rule["min_savings_ns"]:
        return None
    pattern = _run_pattern(row, rule)
    grouped = pattern == "gemm_loop"
    top_share = row["top_kernel_ns"] / row["kernel_ns"] if row["kernel_ns"] else 1.0
    strategy = rule.strategy_for(pattern)
    return finding_for(
        rule, row,
        strategy=strategy,
        device_id=None if row["device_id"] < 0 else int(row["device_id"]),
        shape=None,
        grid=None,
        block=None,
        launches=int(row["kernels"]),
        total_ns=int(row["kernel_ns"]),
        est_savings_ns=int(row["gap_ns"]),
        confidence=_wall_confidence(frac, ctx),
        evidence=_note_library({
            "pattern": "tiny back-to-back kernels",
            "profiler_slowed_host": profiler_slows_host(ctx),
            "run_kind": pattern,
            "stream_id": None if row["stream_id"] < 0 else int(row["stream_id"]),
            "runs": int(row["runs"]),
            "kernels_in_runs": int(row["kernels"]),
            "kernel_ns": int(row["kernel_ns"]),
            "gap_ns": int(row["gap_ns"]),
            "gap_fraction": round(float(frac), 3),
            "mean_kernel_ns": int(row["kernel_ns"] / max(1, row["kernels"])),
            "launch_api_ns": None if pd.isna(row["launch_api_ns"]) else int(row["launch_api_ns"]),
            "gemm_fraction": round(float(row["gemm_fraction"]), 3),
            "elementwise_share": round(float(row.get("elementwise_ns", 0) / row["kernel_ns"]), 3) if row["kernel_ns"] else 0.0,
            "compiled_share": round(float(row.get("compiled_ns", 0) / row["kernel_ns"]), 3) if row["kernel_ns"] else 0.0,
            **({"recurrent_launches": int(row["recurrent_launches"])} if pattern == "recurrent_run" else {}),
            # `kernel` is only the runs' biggest part: its own launches and time
            "kernel_names": int(row["kernel_names"]),
            "top_kernel_launches": int(row["top_kernel_launches"]),
            "top_kernel_ns": int(row["top_kernel_ns"]),
            "top_kernel_share": round(float(top_share), 3),
            "gemm_shapes_known": len(row["gemm_shapes"]),
            **_odd_shapes(row["gemm_shapes"][:MAX_GROUPED_SHAPES] if grouped else [], row["gemm_dtype"]),
            "basis": f"sum of the {int(row['kernels']) - int(row['runs'])} idle gaps inside the runs (each up to "
                     f"{rule['max_gap_in_run_ns'] / 1000:g} us): wall time the GPU waited between launches",
        }, str(row["name"])),
        suggestion=_run_suggestion(row, pattern, strategy),
        tier=_TIER[pattern],
        savings_unit="wall",
    )


def _odd_shapes(shapes: list, dtype) -> dict:
    """How many of a grouped suggestion's shapes have a K or N that is not a whole number of
    16-byte rows: kernels/grouped_gemm.py copies those operands into padded buffers before
    its GEMMs (`stage`), which padding the model's dimensions would save. Empty when none."""
    per = 4 if dtype == "fp32" else 8  # elements in 16 bytes; 16-bit when the dtype is unknown
    odd = 0
    for text in shapes:
        try:
            _, n, k = (int(x) for x in str(text).split("x"))
        except ValueError:
            continue
        odd += bool(n % per or k % per)
    return {"gemm_shapes_unaligned": odd, "alignment_elements": per} if odd else {}


def _run_suggestion(row, pattern: str, strategy: str) -> dict:
    """`schedule` is the strategy id (grouped, fusion, cuda_graph, persistent); a grouped
    loop also lists its GEMM shapes (the most launched first) and dtype."""
    out = {"schedule": strategy, "cuda_graph": True}
    if pattern == "gemm_loop" and row["gemm_shapes"]:
        out["shapes"] = row["gemm_shapes"][:MAX_GROUPED_SHAPES]
        if row["gemm_dtype"]:
            out["dtype"] = row["gemm_dtype"]
    return out


def _big_grid_finding(row, rule: Rule, ctx: Context) -> Finding | None:
    savings = float(row["saved_ns"])
    if savings < rule["min_savings_ns"]:
        return None
    sms = int(row["sm_count"])
    bps = int(row["blocks_per_sm"])
    lo, hi = int(row["grid_blocks_min"]), int(row["grid_blocks_max"])
    grids = f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"
    floor = int(row["floor_ns"])
    basis = (f"per-block scheduling cost {rule['block_cost_ns']:g} ns x {grids} blocks / {sms} SMs per launch, at most "
             f"{rule['max_saving_share']:.0%} of its time"
             + (", capped by the kernel's time minus its HBM floor (compulsory bytes / bandwidth)" if floor else
                ", no byte count to cap it by the kernel's throughput"))
    return finding_for(
        rule, row,
        strategy=rule.strategy_for("big_grid"),
        device_id=None if row["device_id"] < 0 else int(row["device_id"]),
        est_savings_ns=int(savings),
        confidence="low",
        evidence=_note_library({
            "pattern": "huge grid of short blocks",
            "grid_blocks_min": lo,
            "grid_blocks_max": hi,
            "waves_occupancy": round(float(row["waves_max"]), 1),
            "waves_min": round(float(row["waves_min"]), 1),
            "wave_ns": int(row["wave_ns"]),
            "blocks_per_sm": bps,
            "sm_count": sms,
            "median_ns": int(row["median_ns"]),
            "block_cost_ns": rule["block_cost_ns"],
            "bound_ns": floor or None,
            "basis": basis,
        }, str(row["name"])),
        suggestion={"schedule": rule.strategy_for("big_grid"), "grid": sms * bps},
        tier=_TIER["big_grid"],
        savings_unit="gpu",
    )


def _host_bound_finding(row, rule: Rule, ctx: Context, counted: set) -> Finding | None:
    """The short host-bound gaps of a device that no fired run finding counts already."""
    pos, sizes = np.asarray(row["gap_positions"]), np.asarray(row["gap_sizes"], dtype=np.int64)
    keep = ~np.isin(pos, np.fromiter(counted, dtype=np.int64, count=len(counted))) if counted else np.ones(len(pos), bool)
    n, wait = int(keep.sum()), int(sizes[keep].sum())
    span = int(row["span_ns"])
    frac = wait / span if span else 0.0
    if n < rule["min_host_bound_gaps"] or frac < rule["min_host_bound_fraction"] or wait < rule["min_savings_ns"]:
        return None
    host = host_context(ctx, int(row["rank"]), int(row["first_ns"]), int(row["last_ns"]) + 1, row.get("thread_id"))
    t0 = int(row["trace_start_ns"])
    return finding_for(
        rule, row,
        strategy=rule.strategy_for("host_bound"),
        device_id=None if row["device_id"] < 0 else int(row["device_id"]),
        shape=None,
        grid=None,
        block=None,
        launches=int(row["kernels"]),
        total_ns=int(row["kernel_ns"]),
        est_savings_ns=wait,
        confidence=_wall_confidence(frac, ctx),
        evidence={
            "pattern": "host-bound launches",
            "profiler_slowed_host": profiler_slows_host(ctx),
            "host_gaps": n,
            "host_gap_ns": wait,
            "host_gap_fraction": round(frac, 3),
            "device_gaps": int(row["device_gaps"]),
            "span_ns": span,
            "kernels": int(row["kernels"]),
            "tiny_kernels": int(row["tiny_kernels"]),
            "window_ms": [round((int(row["first_ns"]) - t0) / 1e6, 3), round((int(row["last_ns"]) - t0) / 1e6, 3)],
            "host_api_calls": host["api_calls"],
            "host_range": host["range"]["text"] if host["range"] else None,
            "basis": f"sum of {n} idle gaps of up to {rule['max_gap_in_run_ns'] / 1000:g} us after which the next "
                     "launch call began only once the GPU had gone idle (the CPU was still launching); gaps counted "
                     "by a run finding are left out",
        },
        suggestion={"schedule": rule.strategy_for("host_bound"), "cuda_graph": True},
        tier=_TIER["host_bound"],
        savings_unit="wall",
    )


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out = []
    rows = ev.to_dict("records") if len(ev) else []
    fired_runs = []
    for row in rows:
        if row["kind"] == "run":
            f = _run_finding(row, rule, ctx)
            if f is not None:
                fired_runs.append(tuple(row[c] for c in _KEY))
        elif row["kind"] == "big_grid":
            f = _big_grid_finding(row, rule, ctx)
        else:
            continue
        if f is not None:
            out.append(f)
    out = _one_graph_finding_per_kind(out, rule, ctx)
    # a Python loop over a sequence's positions inside those runs is its own finding (one scan
    # kernel, not a graph of T x k launches): its gaps leave the run findings of its runs
    runs = find_runs(ctx, rule)
    gapped = ctx.cache.get(_runs_key(rule) + ("gapped",))
    loops, taken, loop_pos = loop_findings(ctx, rule, runs, gapped, _KEY)
    if loops:
        out = [_less_loop_gaps(f, taken) for f in out] + loops
    counted: set = set(loop_pos)
    if fired_runs:
        ids = runs[pd.MultiIndex.from_frame(runs[_KEY]).isin(fired_runs)]["run_id"]
        counted |= set(gapped.loc[gapped["run_id"].isin(ids), "pos"].tolist())
    for row in rows:
        if row["kind"] == "host_bound":
            f = _host_bound_finding(row, rule, ctx, counted)
            if f is not None:
                out.append(f)
    return [_with_host_syncs(f, ctx) for f in _less_profiler_cost(out, rule, ctx)]


def _less_loop_gaps(f: Finding, taken: dict) -> Finding:
    """A run finding without the gaps a position loop claims in its own runs (`taken`: per run
    key, rank, device, stream and whether GEMM runs)."""
    ev = f.evidence
    if ev.get("pattern") != "tiny back-to-back kernels":
        return f
    streams = ev.get("stream_ids") or [ev.get("stream_id")]
    rank = f.rank or 0
    dev = -1 if f.device_id is None else f.device_id
    gemm = ev.get("run_kind") == "gemm_loop"
    less = sum(taken.get((rank, dev, -1 if s is None else s, gemm), 0) for s in streams)
    if not less:
        return f
    return replace(f, est_savings_ns=max(0, int(f.est_savings_ns - less)),
                   evidence={**ev, "position_loop_gap_ns": int(less),
                             "basis": f"{ev.get('basis', '')}; less {less / 1e6:.2f} ms of gaps inside position loops "
                                      "(their own finding)"})


def _host_syncs(ctx: Context, rank: int | None) -> int:
    """Synchronising calls (gate's list) on any thread of the rank that return while its GPU
    work is under way (between its first kernel's start and its last kernel's end)."""
    key = ("launch_overhead.host_syncs", rank)
    if key not in ctx.cache:
        rt, k = ctx.trace.runtime, ctx.trace.kernels
        r = 0 if rank is None else rank
        on_k = (k["rank"] == r).to_numpy(dtype=bool)
        n = 0
        if len(rt) and on_k.any():
            lo, hi = int(k["start_ns"].to_numpy()[on_k].min()), int(k["end_ns"].to_numpy()[on_k].max())
            on = (rt["rank"] == r).to_numpy(dtype=bool)
            ends = rt["end_ns"].to_numpy()[on]
            inside = (ends > lo) & (ends < hi)
            if inside.any():
                n = int(contains(rt["name"][on][inside], SYNC_CALLS).sum())
        ctx.cache[key] = n
    return ctx.cache[key]


def _with_host_syncs(f: Finding, ctx: Context) -> Finding:
    """A CUDA-graph finding on a rank whose host waits for the GPU inside the window (.item(),
    .cpu(), a blocking copy: gate's sync_calls count) says how many times: a graph cannot hold
    a host sync, so it covers only the stretches between them, or the syncs leave the step."""
    if not f.suggestion.get("cuda_graph"):
        return f
    n = _host_syncs(ctx, f.rank)
    if not n:
        return f
    note = (f"the host waits for the GPU {n} times in this window (synchronising calls: .item(), .cpu(), blocking "
            "copies): a CUDA graph cannot hold them, so capture the stretches between them (the model's forward and "
            "backward) or move the host-side work out of the step; torch.compile needs no capture")
    return replace(f, evidence={**f.evidence, "host_syncs": int(n)}, suggestion={**f.suggestion, "graph_caveat": note})


_SUMMED = ("runs", "kernels_in_runs", "kernel_ns", "gap_ns", "recurrent_launches")


def _one_graph_finding_per_kind(found: list[Finding], rule: Rule, ctx: Context) -> list[Finding]:
    """Run findings of one device whose remedy is a CUDA graph and whose runs are of one kind
    (a recurrent layer on two streams; a forward's and a backward's streams) are one fix: one
    finding, on the kernel with the most time, with the streams listed. Their gaps were already
    counted once where streams waited together (`_gaps_once`)."""
    out: list[Finding] = []
    at: dict = {}
    for f in found:
        ev = f.evidence
        if f.strategy != "cuda_graph" or ev.get("pattern") != "tiny back-to-back kernels":
            out.append(f)
            continue
        key = (f.rank, f.device_id, ev.get("run_kind"))
        if key not in at:
            at[key] = len(out)
            out.append(f)
            continue
        g = out[at[key]]
        big, small = (g, f) if g.evidence["top_kernel_ns"] >= ev["top_kernel_ns"] else (f, g)
        e1, e2 = big.evidence, small.evidence
        merged = dict(e1)
        for c in _SUMMED:
            if c in e1 or c in e2:
                merged[c] = int(e1.get(c, 0)) + int(e2.get(c, 0))
        apis = [e["launch_api_ns"] for e in (e1, e2) if e.get("launch_api_ns") is not None]
        merged["launch_api_ns"] = sum(apis) if apis else None
        kn, n = merged["kernel_ns"], merged["kernels_in_runs"]
        for c in ("elementwise_share", "compiled_share"):
            merged[c] = round((e1[c] * e1["kernel_ns"] + e2[c] * e2["kernel_ns"]) / kn, 3) if kn else 0.0
        merged["gemm_fraction"] = round((e1["gemm_fraction"] * e1["kernels_in_runs"]
                                         + e2["gemm_fraction"] * e2["kernels_in_runs"]) / max(1, n), 3)
        merged["gap_fraction"] = round(merged["gap_ns"] / (kn + merged["gap_ns"]), 3) if kn + merged["gap_ns"] else 0.0
        merged["mean_kernel_ns"] = int(kn / max(1, n))
        merged["kernel_names"] = max(e1["kernel_names"], e2["kernel_names"])  # distinct names per stream: at least this
        if big.kernel == small.kernel:  # one top kernel on both streams (the LSTM's GEMM): its launches add up
            merged["top_kernel_launches"] = e1["top_kernel_launches"] + e2["top_kernel_launches"]
            merged["top_kernel_ns"] = e1["top_kernel_ns"] + e2["top_kernel_ns"]
        merged["top_kernel_share"] = round(merged["top_kernel_ns"] / kn, 3) if kn else 0.0
        merged["gemm_shapes_known"] = max(e1["gemm_shapes_known"], e2["gemm_shapes_known"])  # (shared shapes once)
        streams = {s for e in (e1, e2) for s in (e.get("stream_ids") or [e.get("stream_id")]) if s is not None}
        merged["stream_ids"] = sorted(streams)
        merged["stream_id"] = None  # several: stream_ids
        merged["basis"] = (f"sum of the {n - merged['runs']} idle gaps inside the runs on streams "
                           f"{', '.join(map(str, merged['stream_ids']))} (each up to {rule['max_gap_in_run_ns'] / 1000:g} "
                           "us; time several streams waited together counted once): wall time the GPU waited between "
                           "launches")
        out[at[key]] = replace(big, launches=big.launches + small.launches, total_ns=big.total_ns + small.total_ns,
                               est_savings_ns=big.est_savings_ns + small.est_savings_ns, evidence=merged,
                               confidence=_wall_confidence(merged["gap_fraction"], ctx))
    return out


def recorded_op_starts(ctx: Context, rank: int) -> tuple[np.ndarray, str | None]:
    """Sorted start times of the operators the profiler recorded with their shapes on `rank`,
    and which recorder (Kineto's record_shapes cpu_ops, or emit_nvtx's one NVTX range per op)."""
    ops = ctx.trace.cpu_ops
    if len(ops) and ops["input_dims"].notna().any():
        return np.sort(ops.loc[ops["rank"] == rank, "start_ns"].to_numpy(dtype=np.int64)), "kineto"
    nv = ctx.trace.nvtx
    if len(nv):
        sel = nv[(nv["rank"] == rank).to_numpy() & nv["text"].astype(str).str.contains(r", op_id = |sizes = \[", regex=True).to_numpy()]
        if len(sel):
            return np.sort(sel["start_ns"].to_numpy(dtype=np.int64)), "nvtx"
    return np.zeros(0, dtype=np.int64), None


def _idle_ns(on: pd.DataFrame, max_gap: float) -> int:
    """The device's idle time in gaps of up to `max_gap` ns between kernels (no kernel running
    on any stream): the launch-bound kind of idle, where the host's own cost lands."""
    st = on["start_ns"].to_numpy(dtype=np.int64)
    en = on["end_ns"].to_numpy(dtype=np.int64)
    order = np.argsort(st, kind="stable")
    st, en = st[order], np.maximum.accumulate(en[order])
    gap = np.clip(st[1:] - en[:-1], 0, None)
    return int(gap[gap <= max_gap].sum())


def _less_profiler_cost(found: list[Finding], rule: Rule, ctx: Context) -> list[Finding]:
    """Wall-time estimates net of the profiler's own host cost. Recording an operator's shapes
    costs the host a few microseconds, and where the GPU waits on the host (the device's short
    gaps, the launch-bound kind of idle) that is idle time the bare program does not have. The
    bare program keeps 1 - (recorded ops in the device's span) x (the measured cost an op) /
    (its short gaps) of them, and each wall finding that share of its gaps."""
    if not profiler_slows_host(ctx):
        return found
    wall = {}
    for i, f in enumerate(found):
        if f.savings_unit == "wall":
            wall.setdefault((f.rank, f.device_id), []).append(i)
    k = ctx.trace.kernels
    for (rank, dev), idx in wall.items():
        mask = (k["rank"] == (rank or 0)).to_numpy() & (k["device_id"].fillna(-1) == (-1 if dev is None else dev)).to_numpy()
        on = pd.DataFrame({c: k[c][mask] for c in ("start_ns", "end_ns")}, copy=False)  # not all of k's columns
        starts, recorder = recorded_op_starts(ctx, rank or 0)
        if len(on) < 2 or recorder is None:
            continue
        lo, hi = int(on["start_ns"].min()), int(on["end_ns"].max())
        n = int(np.searchsorted(starts, hi) - np.searchsorted(starts, lo))
        per_op = float(rule[f"profiler_op_cost_{recorder}_ns"])
        idle = _idle_ns(on, float(rule["max_gap_in_run_ns"]))
        if not n or not idle:
            continue
        keep = max(0.0, 1.0 - n * per_op / idle)  # the share of the short gaps the bare program keeps
        # torch.compile's kernels launch through Inductor's Python launcher, which costs the
        # profiler more than an operator does (not modelled): the GPT-2 compiled step's claim
        # was 2.6x its bare idle time on the H200 (docs/profiler_cost.md)
        compiled = bool(k.loc[mask, "name"].astype(str).str.contains(_INDUCTOR).any())
        for i in idx:
            f = found[i]
            ev = dict(f.evidence)
            ev["gaps_as_recorded_ns"] = f.est_savings_ns
            ev["basis"] = (f"{ev.get('basis', '')}; less the profiler's own host cost: the device's short gaps "
                           f"({idle / 1e6:.2f} ms) minus {n:,} operators recorded with their shapes ({recorder}) x "
                           f"{per_op / 1e3:g} us leave {100 * keep:.0f}% of them to the bare program"
                           + ("; torch.compile's launches cost the profiler more than that (not modelled): the bare "
                              "program's gaps may be a half or less of this" if compiled else ""))
            found[i] = replace(f, est_savings_ns=int(f.est_savings_ns * keep), evidence=ev,
                               confidence="low" if compiled else f.confidence)
    return [f for f in found if f.savings_unit != "wall" or f.est_savings_ns >= rule["min_savings_ns"]]
