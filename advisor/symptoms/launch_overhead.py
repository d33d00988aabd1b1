"""launch_overhead: work cut into pieces so small that launching them costs as much as running them.

What it detects, two shapes of one problem:
* runs of tiny back-to-back kernels on one stream (each under `tiny_kernel_ns`), where the
  gaps between them are a large share of the run: the stream is launch-bound;
* huge grids of very short blocks: many waves (occupancy model) each lasting a few
  microseconds, so block launch and prologue are paid again and again.
Why it matters: the GPU idles between launches, and short blocks spend a visible share of
their life starting up. What to do: a persistent kernel (grid ~ #SMs looping over the work;
for many small GEMMs, one grouped launch); for runs of unrelated tiny kernels a CUDA graph
also removes the gaps. Estimated recoverable time: the gaps inside runs (idle wall time, so
it can exceed the kernels' own time); for big grids, waves x `block_overhead_ns` (a rough
figure, hence low confidence). A run finding covers every tiny kernel of the stream's runs
of one kind (mostly GEMMs: a grouped launch; the rest: a persistent kernel or a CUDA graph):
`launches` and `total_ns` are theirs, `kernel` names the one with the most time in them
(its own counts in the evidence).
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..findings import Finding
from ..model import STRING
from ..rules import Rule
from .context import Context, as_int, dims, group_launches, launch_rows, shape_of

SYMPTOM = "launch_overhead"
REQUIRES = ()  # runs need only kernel times; the big-grid half also needs grids and SM counts


UNNAMED = "(kernel name not in the trace)"

# One run finding per stream and kind of run (mostly GEMMs or not)
_KEY = ["rank", "device_id", "stream_id", "gemm_run"]


def _runs_key(rule: Rule) -> tuple:
    """ctx.cache key of find_runs' frame; + ("names",) and + ("shapes",) hold its side tables
    (per run_id: each kernel name's time and launches; each GEMM launch's shape and dtype)."""
    return ("runs", rule["tiny_kernel_ns"], rule["max_gap_in_run_ns"], rule["min_run_kernels"])


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
    d = k.loc[~k["rank"].isin(ctx.serialized_ranks), cols].copy() if ctx.serialized_ranks else k[cols].copy()
    d["device_id"] = d["device_id"].fillna(-1).astype("int64")
    d["stream_id"] = d["stream_id"].fillna(-1).astype("int64")
    d = d.sort_values(["rank", "device_id", "stream_id", "start_ns"], kind="stable")
    if d.empty:
        ctx.cache[key] = pd.DataFrame()
        return ctx.cache[key]
    same = (
        (d["rank"].to_numpy()[1:] == d["rank"].to_numpy()[:-1])
        & (d["device_id"].to_numpy()[1:] == d["device_id"].to_numpy()[:-1])
        & (d["stream_id"].to_numpy()[1:] == d["stream_id"].to_numpy()[:-1])
    )
    tiny = d["dur_ns"].to_numpy() < rule["tiny_kernel_ns"]
    gap = np.clip(d["start_ns"].to_numpy()[1:] - d["end_ns"].to_numpy()[:-1], 0, None)
    link = same & tiny[1:] & tiny[:-1] & (gap <= rule["max_gap_in_run_ns"])
    run_id = np.concatenate([[0], np.cumsum(~link)])
    d["run_id"] = run_id
    d["gap_before"] = np.concatenate([[0], np.where(link, gap, 0)])
    d = d[tiny]
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
    # a loop of small GEMMs and a stream of elementwise kernels want different fixes (one
    # grouped launch, a persistent kernel or a CUDA graph), even on one stream
    runs["gemm_run"] = runs["gemm_fraction"] >= 0.5
    if len(runs):
        in_runs = d[d["run_id"].isin(runs.index)]
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
        corr = d[d["run_id"].isin(runs.index)][["run_id", "rank", "correlation_id"]].dropna()
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
        shapes, dtypes = _gemm_shapes(ctx.cache.get(key + ("shapes",)), ids)
        per_stream["gemm_shapes"] = [shapes.get(k, []) for k in stream_keys]
        per_stream["gemm_dtype"] = [dtypes.get(k) for k in stream_keys]
        per_stream["kind"] = "run"
        parts.append(per_stream)
    k = ctx.kernels
    big = launch_rows(k, k["waves"].notna() & ~k["is_comm"], ["waves", "blocks_per_sm", "sm_count"]).copy()
    if len(big):
        big["wave_ns"] = big["dur_ns"] / np.ceil(big["waves"].astype("float64"))
        big = group_launches(big, ["waves", "wave_ns", "blocks_per_sm", "sm_count"])
        big["kind"] = "big_grid"
        parts.append(big)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


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


def _library(name: str) -> tuple[str, str] | None:
    for pattern, library, change in _LIBRARY_KERNELS:
        if pattern.search(name):
            return library, change
    return None


def _note_library(evidence: dict, name: str) -> dict:
    found = _library(name)
    if found:
        evidence["library"], evidence["library_change"] = found
    return evidence


def _run_finding(row, rule: Rule, ctx: Context) -> Finding | None:
    busy = row["kernel_ns"] + row["gap_ns"]
    frac = row["gap_ns"] / busy if busy else 0.0
    if frac < rule["min_gap_fraction"] or row["gap_ns"] < rule["min_savings_ns"]:
        return None
    grouped = row["gemm_fraction"] >= 0.5
    top_share = row["top_kernel_ns"] / row["kernel_ns"] if row["kernel_ns"] else 1.0
    mixed = not grouped and top_share < rule["mixed_top_share"]
    return Finding(
        symptom=SYMPTOM,
        strategy=rule.strategy,
        title=rule.title,
        kernel=str(row["name"]),
        rank=as_int(row["rank"]),
        device_id=None if row["device_id"] < 0 else int(row["device_id"]),
        shape=None,
        grid=None,
        block=None,
        launches=int(row["kernels"]),
        total_ns=int(row["kernel_ns"]),
        est_savings_ns=int(row["gap_ns"]),
        confidence="high" if frac >= 0.5 else "medium",
        watch_for=rule.watch_for,
        evidence=_note_library({
            "pattern": "tiny back-to-back kernels",
            "stream_id": None if row["stream_id"] < 0 else int(row["stream_id"]),
            "runs": int(row["runs"]),
            "kernels_in_runs": int(row["kernels"]),
            "kernel_ns": int(row["kernel_ns"]),
            "gap_ns": int(row["gap_ns"]),
            "gap_fraction": round(float(frac), 3),
            "mean_kernel_ns": int(row["kernel_ns"] / max(1, row["kernels"])),
            "launch_api_ns": None if pd.isna(row["launch_api_ns"]) else int(row["launch_api_ns"]),
            "gemm_fraction": round(float(row["gemm_fraction"]), 3),
            # `kernel` is only the runs' biggest part: its own launches and time
            "kernel_names": int(row["kernel_names"]),
            "top_kernel_launches": int(row["top_kernel_launches"]),
            "top_kernel_ns": int(row["top_kernel_ns"]),
            "top_kernel_share": round(float(top_share), 3),
            "gemm_shapes_known": len(row["gemm_shapes"]),
            **_odd_shapes(row["gemm_shapes"][:MAX_GROUPED_SHAPES] if grouped else [], row["gemm_dtype"]),
        }, str(row["name"])),
        suggestion=_run_suggestion(row, grouped, mixed),
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


def _run_suggestion(row, grouped: bool, mixed: bool) -> dict:
    """grouped: one launch for the run's GEMMs; cuda_graph: the run is mixed work (no kernel
    holds `mixed_top_share` of it), which only a graph of the whole loop replaces; else one
    persistent kernel for the run's repeated kernel."""
    out = {"schedule": "grouped" if grouped else "cuda_graph" if mixed else "persistent", "cuda_graph": True}
    if grouped and row["gemm_shapes"]:
        out["shapes"] = row["gemm_shapes"][:MAX_GROUPED_SHAPES]
        if row["gemm_dtype"]:
            out["dtype"] = row["gemm_dtype"]
    return out


def _big_grid_finding(row, rule: Rule, ctx: Context) -> Finding | None:
    waves, wave_ns = row["waves"], row["wave_ns"]
    if waves < rule["min_waves_big_grid"] or wave_ns > rule["max_wave_ns"]:
        return None
    per_launch = row["total_ns"] / row["launches"]
    # Each wave pays roughly block_overhead_ns; a persistent loop pays it about once.
    saved = min(0.5 * per_launch, (np.ceil(waves) - 1) * rule["block_overhead_ns"])
    savings = saved * row["launches"]
    if savings < rule["min_savings_ns"]:
        return None
    sms = int(row["sm_count"])
    bps = int(row["blocks_per_sm"])
    return Finding(
        symptom=SYMPTOM,
        strategy=rule.strategy,
        title=rule.title,
        kernel=str(row["name"]),
        rank=as_int(row["rank"]),
        device_id=as_int(row["device_id"]),
        shape=shape_of(row),
        grid=dims(row, "grid"),
        block=dims(row, "block"),
        launches=int(row["launches"]),
        total_ns=int(row["total_ns"]),
        est_savings_ns=int(savings),
        confidence="low",
        watch_for=rule.watch_for,
        evidence=_note_library({
            "pattern": "huge grid of short blocks",
            "waves_occupancy": round(float(waves), 1),
            "wave_ns": int(wave_ns),
            "blocks_per_sm": bps,
            "sm_count": sms,
            "median_ns": int(row["median_ns"]),
        }, str(row["name"])),
        suggestion={"schedule": "persistent", "grid": sms * bps},
    )


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out = []
    for row in ev.to_dict("records") if len(ev) else []:
        f = _run_finding(row, rule, ctx) if row["kind"] == "run" else _big_grid_finding(row, rule, ctx)
        if f is not None:
            out.append(f)
    return out
