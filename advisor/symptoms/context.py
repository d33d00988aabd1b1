"""What every symptom needs, computed once per trace: kernels joined with occupancy and GEMM
facts, and GPU time per rank/device."""

from __future__ import annotations

from functools import cached_property

import numpy as np
import pandas as pd

from ..findings import Finding
from ..model import Trace
from ..rules import Rule
from .gemm import gemm_table, small_ints
from .occupancy import occupancy
from .strings import contains, factorize


class Context:
    def __init__(self, trace: Trace, rules: dict | None = None, shapes: list[tuple[str, dict]] | None = None):
        self.trace = trace
        self.rules = rules or {}
        self.shapes = list(shapes or [])  # the user's --shape overrides: (kernel pattern, shape)
        self.cache: dict = {}  # results shared between symptoms (e.g. launch-bound runs)
        # what the diagnosis should say where no finding is raised ("cuBLAS is already near
        # peak here"): one line each, deduplicated by diagnose()
        self.notes: list[str] = []

    @cached_property
    def kernels(self) -> pd.DataFrame:
        """trace.kernels + occupancy columns + GEMM columns, same index; plus `_name_code`
        (the name factorized, -1 when missing) and `_launch_group` (one id per GROUP_KEYS
        combination), computed once here so that each symptom's grouping hashes integers
        instead of a million strings again (docs/scale.md)."""
        k = self.trace.kernels
        # the GEMM table first: occupancy's columns (24 bytes a kernel) need not be alive at its peak
        gemm = gemm_table(self.trace, self.shapes)
        out = pd.concat([k, occupancy(self.trace, OCCUPANCY_READ), gemm], axis=1)
        del gemm
        if "_name_code" not in out.columns:  # gemm_table factorized the names already
            out["_name_code"] = small_ints(factorize(out["name"])[0])
        # strings grouped as integer codes (-1 for missing, as groupby(dropna=False) keeps NA)
        keys = [out[c] for c in GROUP_KEYS if c in out.columns and c not in ("name", "dtype")] + [out["_name_code"]]
        if "dtype" in out:
            keys.append(factorize(out["dtype"])[0])
        out["_launch_group"] = small_ints(group_ids(keys)) if len(out) else 0
        return out

    @cached_property
    def serialized_ranks(self) -> frozenset[int]:
        """Ranks whose kernels the profiler ran one at a time (counter collection:
        trace.meta["serialized_ranks"]). Their gaps and overlaps are the profiler's, so the
        GPU-idle, sync-stall, launch-gap and exposed-communication judgements skip them."""
        return frozenset(int(r) for r in self.trace.meta.get("serialized_ranks", ()))

    @cached_property
    def devices(self) -> pd.DataFrame:
        return self.trace.devices.drop_duplicates(["rank", "device_id"]).set_index(["rank", "device_id"])

    @cached_property
    def gpu_time_ns(self) -> pd.Series:
        """Sum of kernel durations per (rank, device_id)."""
        k = self.trace.kernels
        rank, dev = k["rank"].to_numpy(), id_array(k["device_id"])
        if len(k) > 1 and not rank.strides[0] and not dev.strides[0]:
            # one (rank, device) (model.constant_view): its group-by over the first row, with
            # the total (the group-by's keys were full-length copies)
            one = k.iloc[:1]
            out = one.groupby([one["rank"], one["device_id"].fillna(-1).astype("int64")])["dur_ns"].sum()
            out.iloc[0] = k["dur_ns"].sum()
            return out
        return k.groupby([k["rank"], k["device_id"].fillna(-1).astype("int64")])["dur_ns"].sum()

    def device_value(self, rank: int, device_id, column: str):
        try:
            v = self.devices.loc[(int(rank), int(device_id)), column]
        except (KeyError, TypeError, ValueError):
            return None
        return None if pd.isna(v) else v

    def device_row(self, rank: int, device_id) -> dict | None:
        """The devices-frame row of (rank, device) as a dict (name, peak, bandwidth...), or None."""
        try:
            row = self.devices.loc[(int(rank), int(device_id))]
        except (KeyError, TypeError, ValueError):
            return None
        return {k: (None if pd.isna(v) else v) for k, v in row.items()}

    def share(self, rank: int, device_id, ns: float) -> float:
        key = (int(rank), -1 if pd.isna(device_id) else int(device_id))
        denom = self.gpu_time_ns.get(key, 0)
        return float(ns) / denom if denom else float("nan")


# the occupancy columns symptoms read from Context.kernels (`waves` is computed where read,
# occupancy.waves_at; tail_wave computes its tail efficiency from it for the launches it
# looks at)
OCCUPANCY_READ = ("blocks_per_sm", "sm_count")

GROUP_KEYS = ["rank", "device_id", "name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z", "M", "N", "K", "batch", "dtype"]


def sort_keys(*keys: np.ndarray) -> list[np.ndarray]:
    """`keys` (np.lexsort's, last one primary) without those that cannot change the order: a
    column of one value seen through a zero-stride view (model.constant_view, id_array) or
    a missing-value mask with nothing missing. lexsort made each a full-length copy."""
    return [a for a in keys if not (len(a) > 1 and (not a.strides[0] or (a.dtype == bool and not a.any())))]


def group_ids(columns: list) -> np.ndarray:
    """groupby(columns, dropna=False, sort=False).ngroup(): one id per distinct combination
    (missing values one value), in order of first appearance. Built a column at a time, each
    step's pair of codes renumbered densely (factorize keeps first appearance), so that only a
    few int64 arrays live at once (a frame of the 13 key columns and groupby's codes for each
    were ~120 bytes a kernel)."""
    ids = None
    for col in columns:
        codes, uniques = pd.factorize(col, use_na_sentinel=False)
        codes = np.asarray(codes, dtype=np.int64)
        ids = codes if ids is None else pd.factorize(ids * max(len(uniques), 1) + codes)[0].astype(np.int64)
    return ids


def id_array(s: pd.Series, missing: int = -1) -> np.ndarray:
    """An id column (device, stream) as int64, `missing` where NA, without fillna's and
    astype's full-length copies (for a nullable integer column: one array; read-only and
    zero-stride for a column of one value)."""
    if isinstance(s.dtype, pd.api.extensions.ExtensionDtype) and s.dtype.kind in "iu":
        data, mask = getattr(s.array, "_data", None), getattr(s.array, "_mask", None)
        if data is not None and len(data) > 1 and not data.strides[0] and not mask.strides[0]:
            # one value (model.constant_view): as one, read-only, not n int64s
            return np.broadcast_to(np.array([missing if mask[0] else data[0]], dtype=np.int64), (len(data),))
        return s.to_numpy(np.int64, na_value=missing)
    if s.dtype.kind in "iu":
        return s.to_numpy(np.int64)
    return s.astype("Float64").fillna(missing).to_numpy("int64")


def launch_rows(k: pd.DataFrame, mask, extra: list[str]) -> pd.DataFrame:
    """The rows of `k` (Context.kernels) where `mask` holds, with only `dur_ns`, the group id
    and `extra`: group_launches takes each group's key columns (GROUP_KEYS) from `k` at its
    first row (pass it `k`). Copying all ~50 columns of a million kernels for each symptom
    was a measurable share of a diagnosis, and the 14 key columns of every launch were
    still the peak of the GEMM symptoms (~75 bytes a launch)."""
    cols = list(dict.fromkeys(c for c in ["dur_ns", "_launch_group", *extra] if c in k.columns))
    return k.loc[np.asarray(mask, dtype=bool), cols]


def group_launches(df: pd.DataFrame, mean_cols: list[str], source: pd.DataFrame | None = None,
                   first_cols: tuple[str, ...] = ()) -> pd.DataFrame:
    """Collapse launches of the same kernel, launch shape and problem shape into one row:
    launches, total_ns, median_ns, the mean of `mean_cols` and the first row's value of
    `first_cols` (columns of `source`, or of `df`). `source`: the frame `df`'s rows were
    taken from (by index label), where its key columns are, for a `df` from launch_rows."""
    if df.empty:
        return pd.DataFrame(columns=GROUP_KEYS + list(first_cols) + ["launches", "total_ns", "median_ns"] + mean_cols)
    src = df if source is None else source
    keys = [c for c in GROUP_KEYS if c in src.columns]
    firsts = [c for c in first_cols if c in src.columns and c not in keys]
    if "_launch_group" in df.columns:
        # Context.kernels numbered the groups once: group by that integer, and take each
        # group's key values from its first row (groups in order of first appearance, as
        # groupby(sort=False) orders them).
        g = df.groupby("_launch_group", sort=False)
        out = g["dur_ns"].agg(launches="count", total_ns="sum", median_ns="median")
        if mean_cols:
            out = out.join(g[mean_cols].mean())
        at = df.index[~df["_launch_group"].duplicated().to_numpy()]
        first = src.loc[at, [*keys, *firsts, "_launch_group"]].set_index("_launch_group")
        out = first.join(out).reset_index(drop=True)
    else:
        g = df.groupby(keys, dropna=False, sort=False)
        out = g["dur_ns"].agg(launches="count", total_ns="sum", median_ns="median")
        if mean_cols:
            out = out.join(g[mean_cols].mean())
        if firsts:
            out = out.join(g[firsts].first())
        out = out.reset_index()
    out["median_ns"] = out["median_ns"].round().astype("int64")
    return out.sort_values("total_ns", ascending=False, kind="stable").reset_index(drop=True)


def as_int(v):
    return None if v is None or (isinstance(v, float) and np.isnan(v)) or pd.isna(v) else int(v)


def dims(row, prefix: str) -> list[int | None]:
    return [as_int(row.get(f"{prefix}_{a}")) for a in "xyz"]


def shape_of(row) -> dict | None:
    """{"M","N","K","batch","dtype"} of a grouped row, or None when the shape is unknown."""
    if as_int(row.get("M")) is None:
        return None
    dtype = row.get("dtype")
    return {
        "M": as_int(row["M"]),
        "N": as_int(row["N"]),
        "K": as_int(row["K"]),
        "batch": as_int(row.get("batch")) or 1,
        "dtype": None if dtype is None or pd.isna(dtype) else str(dtype),
    }


# What a finding about one grouped launch row says, field by field; a symptom passes the rest
# (est_savings_ns, confidence, evidence, suggestion...) and overrides any of these.
_ROW_FIELDS = {
    "kernel": lambda row: str(row["name"]),
    "rank": lambda row: as_int(row["rank"]),
    "device_id": lambda row: as_int(row["device_id"]),
    "shape": shape_of,
    "grid": lambda row: dims(row, "grid"),
    "block": lambda row: dims(row, "block"),
    "launches": lambda row: int(row["launches"]),
    "total_ns": lambda row: int(row["total_ns"]),
}


def by_device(ev: pd.DataFrame):
    """An evidence frame grouped per (rank, device), a missing device as -1, in order of first
    appearance: iterate as `for (rank, dev), grp in by_device(ev)`."""
    return ev.assign(_dev=ev["device_id"].fillna(-1).astype("int64")).groupby(["rank", "_dev"], sort=False)


def finding_for(rule: Rule, row, **fields) -> Finding:
    """The Finding of `rule` about the grouped launch row `row` (group_launches' columns): the
    rule's symptom, strategy, title and watch-for, and the row's kernel, rank, device, shape,
    grid, block, launches and time, each unless `fields` gives it; `fields` add the rest."""
    strategy = fields.get("strategy", rule.strategy)
    base = {"symptom": rule.symptom, "strategy": rule.strategy, "title": rule.title,
            "watch_for": rule.watch_for_with(strategy)}
    base.update({k: f(row) for k, f in _ROW_FIELDS.items() if k not in fields})
    return Finding(**{**base, **fields})

ELEMENT_BYTES = {"fp8": 1, "fp16": 2, "bf16": 2, "fp32": 4, "fp64": 8}


def gemm_bytes(shape: dict, default_elt: int = 2) -> tuple[int, bool]:
    """Fewest bytes a GEMM must move (each operand read once, output written once), and
    whether the element size is known rather than assumed."""
    elt = ELEMENT_BYTES.get(shape.get("dtype") or "", None)
    known = elt is not None
    elt = elt or default_elt
    M, N, K, b = shape["M"], shape["N"], shape["K"], shape.get("batch") or 1
    return int(b * elt * (M * K + K * N + M * N)), known


def gemm_flop(shape: dict) -> int:
    return int(2 * shape["M"] * shape["N"] * shape["K"] * (shape.get("batch") or 1))


def has_backward(ctx: Context) -> bool:
    """Whether the trace records an autograd backward (Kineto's `...Backward0` ops, emit_nvtx's too)."""
    if "has_backward" not in ctx.cache:
        ops, nv = ctx.trace.cpu_ops, ctx.trace.nvtx
        ctx.cache["has_backward"] = bool((len(ops) and contains(ops["name"], r"Backward\d*\b").any())
                                         or (len(nv) and contains(nv["text"], r"Backward\d*\b").any()))
    return ctx.cache["has_backward"]

