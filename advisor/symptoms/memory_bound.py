"""slow_memory_bound_kernel: a data-movement kernel far below the GPU's bandwidth.

What it detects: kernels that are not GEMMs, convolutions, attention or communication, launched
inside a framework operator whose arguments the profiler recorded (Kineto `record_shapes`),
that move at least `min_bytes` (advisor.symptoms.op_bytes: every tensor argument read once,
the output written once, a broadcast view counted once) at under `max_bandwidth_fraction` of the
device's measured bandwidth. The usual causes, each measured on the H200
(bench/bench_memory_bound.py): an atomic scatter over unsorted indices (`index_add_`,
`scatter_add_`: 0.25 TB/s), PyTorch's channels_last upsampling kernel (0.24-0.28 TB/s), layer
norm over narrow rows (0.23 TB/s at 64 channels), a binary op whose 0-dim operand has another
dtype (PyTorch's dynamic-cast path).
Why it matters: a memory-bound kernel's floor is its bytes over the bandwidth; these run
5-20x over it, and the fix is a different implementation, not a schedule.
What to do (the finding's strategy): `segment_reduce` for the scatter family (sort the
indices once and reduce by segments: 9.7x measured), `slice_not_index` for an index_add_ that
only places slices (no more indices than positions: index_select's gradient where the forward
picked a range, as XLNet's relative shift does; unmeasured), else `fusion` (torch.compile writes a
bandwidth-bound kernel and fuses it with its neighbours: 3-10x measured, 1.3x on the max-pool
backward); the evidence names the operator and its cheapest known fix.
Estimate: per launch, its time minus the larger of its bytes at `achievable_fraction` of the
bandwidth (what the fixes reached) and its time over the speedup the fix measured on that
operator and dtype (the rule's `[measured]` table; `unmeasured_max_speedup` and low confidence
elsewhere), summed over the launches; `bound_ns` is the bytes at the full measured bandwidth
(the physics floor).
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd

from ..findings import Finding
from ..rules import Rule
from .attention import attention_backend
from .calibration import measured_bandwidth
from .context import Context, by_device, finding_for
from .gemm import innermost_ranges
from .kernel_kinds import schedule_excluded
from .op_bytes import ELEMENT_BYTES, family, op_bytes
from .strings import factorize
from .underfilled_kernel import _overlap_fraction

SYMPTOM = "slow_memory_bound_kernel"
REQUIRES = (
    ("cpu_ops", "input_dims", "Does the trace record operator shapes (Kineto with record_shapes=True)?"),
    ("runtime", "correlation_id", "Does the trace link kernels to their launch calls?"),
)

_OP_COLUMNS = ["rank", "thread_id", "start_ns", "end_ns", "name", "input_dims", "input_types", "input_strides",
               "concrete_inputs"]


def _op_ranges(ctx: Context) -> pd.DataFrame:
    """Framework operators with recorded argument shapes: all of them, so that each kernel finds
    its own innermost operator (a kernel of a skipped one, a sort inside embedding_backward, is
    not charged to the countable operator around it)."""
    ops = ctx.trace.cpu_ops
    if not len(ops):
        return pd.DataFrame(columns=_OP_COLUMNS)
    cols = [c for c in _OP_COLUMNS if c in ops.columns]
    names = ops["name"]
    codes, uniques = factorize(names)
    aten = np.array([isinstance(n, str) and n.startswith("aten::") for n in np.asarray(uniques, dtype=object)]
                    + [False])[codes]
    keep = aten & ops["input_dims"].notna().to_numpy(dtype=bool)
    return ops.loc[keep, cols].reset_index(drop=True)


# the fix for a family no [measured] entry covers in this dtype (same remedy, no measured gain)
_FAMILY_FIX = {
    "scatter": ("sort the indices (the edge list, by destination) once outside the step so that the rows to sum arrive "
                "in segment order, then reduce by segments (torch.segment_reduce(..., \"sum\", lengths=...)); or a "
                "CSR sparse matrix product (torch.sparse.mm) for the gather and the sum in one"),
}
# index_add_ that only places rows (as many indices as the target has positions along the dim,
# or fewer: index_select's gradient when the forward picked positions, e.g. XLNet's relative
# shift picking torch.arange(klen)): no two indices need to meet, so segments are no remedy
_SELECTION_FIX = ("the call adds {count} source slices into {extent} positions along dim {dim}: a placement, not a "
                  "reduction (no index needs to repeat), which segment sums do not speed up. Where the indices are "
                  "one range (torch.arange), slice instead: x.narrow({dim}, start, {count}) or x[..., start:start + "
                  "{count}] in the forward, whose gradient is a plain copy into zeros, no atomic adds")
_GENERIC_FIX = ("torch.compile the function that calls it: Inductor writes a bandwidth-bound kernel for the operator and "
                "fuses it with its neighbours")


def selection(op: str, dims: str | None) -> dict | None:
    """{"dim", "count", "extent"} of an index_add_ whose index holds no more entries than the
    target has positions along the dim (a placement, see _SELECTION_FIX), else None. The dim is
    the one where source and target differ (Kineto records no scalar's value there)."""
    if op.split("::", 1)[-1].split(".", 1)[0] not in ("index_add_", "index_add"):
        return None
    try:
        d = json.loads(dims) if isinstance(dims, str) else None
    except ValueError:
        return None
    if not isinstance(d, list) or len(d) < 4:
        return None
    target, index, source = d[0], d[2], d[3]
    if not (isinstance(target, list) and isinstance(source, list) and isinstance(index, list) and len(index) == 1
            and len(target) == len(source) >= 1):
        return None
    differ = [i for i, (a, b) in enumerate(zip(target, source)) if a != b]
    if not differ:  # same shapes: the one dim as long as the index, if only one is
        differ = [i for i, a in enumerate(target) if a == index[0]]
    if len(differ) != 1:
        return None
    dim = differ[0]
    if source[dim] != index[0] or index[0] > target[dim]:
        return None
    return {"dim": dim, "count": int(index[0]), "extent": int(target[dim])}


def case_key(op: str, dims: str | None, types: str | None, strides: str | None) -> str:
    """The operator's key in the rule's [measured] table: its aten name, "/channels_last" for a
    4-D+ channels_last first argument, "/mixed_dtype_scalar" for a 0-dim operand of another dtype."""
    base = op.split("::", 1)[-1].split(".", 1)[0]
    if _mixed_scalar(dims, types):
        return base + "/mixed_dtype_scalar"
    if _channels_last(dims, strides):
        return base + "/channels_last"
    return base


def measured_case(rule: Rule, key: str, dtype: str | None = None) -> tuple[str, dict | None, bool]:
    """(the key found, its [measured] entry, whether the entry holds for `dtype`): the qualified
    key, else the operator's own, else (key, None, False). An entry that names its `dtypes`
    holds only for those (Kineto's type of the first dimensioned tensor): a call in another
    dtype keeps the entry's cap where it is lower than the unmeasured one, at low confidence."""
    for k in (key, key.split("/", 1)[0]):
        entry = rule.measured.get(k)
        if entry is not None:
            return k, entry, not entry.get("dtypes") or dtype in entry["dtypes"]
    return key, None, False


def _first_dtype(dims: str | None, types: str | None) -> str | None:
    """The type of the first tensor argument with dimensions (not a 0-dim operand)."""
    try:
        d, t = json.loads(dims), json.loads(types)
    except (TypeError, ValueError):
        return None
    if not (isinstance(d, list) and isinstance(t, list)):
        return None
    return next((ty for x, ty in zip(d, t) if isinstance(ty, str) and ty in ELEMENT_BYTES and isinstance(x, list) and x),
                None)


def _channels_last(dims: str | None, strides: str | None) -> bool:
    try:
        d, st = json.loads(dims)[0], json.loads(strides)[0]
    except (TypeError, ValueError, IndexError, KeyError):
        return False
    # (a [N, C, 1, 1] tensor has channel stride 1 in either layout: not evidence)
    if not (isinstance(d, list) and isinstance(st, list) and len(d) == len(st) >= 4
            and all(isinstance(x, int) and not isinstance(x, bool) for x in st + d)):
        return False
    return d[1] > 1 and st[1] == 1 and math.prod(d[2:]) > 1


def _mixed_scalar(dims: str | None, types: str | None) -> bool:
    """A binary op on a tensor and a 0-dim tensor of another dtype (not a Python scalar)."""
    try:
        d, t = json.loads(dims), json.loads(types)
    except (TypeError, ValueError):
        return False
    if not (isinstance(d, list) and isinstance(t, list) and len(d) == len(t) and len(d) >= 2):
        return False
    t = [ty if isinstance(ty, str) else "?" for ty in t]
    big = [ty for x, ty in zip(d, t) if isinstance(x, list) and len(x) >= 1 and ty in ELEMENT_BYTES]
    # (Kineto records a Python number as a 0-dim double or long: nothing to cast there)
    zero_dim = [ty for x, ty in zip(d, t) if x == [] and ty in ELEMENT_BYTES and ty not in ("double", "long int")]
    return bool(big and zero_dim and any(z != big[0] for z in zero_dim))


def _autograd_nodes(ctx: Context) -> np.ndarray:
    """Per kernel: the autograd node whose backward launched it ("IndexSelectBackward0"), or None."""
    ops = ctx.trace.cpu_ops
    out = np.full(len(ctx.kernels), None, dtype=object)
    if not len(ops):
        return out
    names = ops["name"].astype(object)
    is_node = names.str.contains(r"Backward\d*$", regex=True, na=False).to_numpy(dtype=bool)
    if not is_node.any():
        return out
    nodes = ops.loc[is_node, ["rank", "thread_id", "start_ns", "end_ns", "name"]].reset_index(drop=True)
    ranges, hit = innermost_ranges(ctx.trace, nodes)
    has = hit >= 0
    names = [str(n).rsplit(": ", 1)[-1] for n in ranges["name"].to_numpy(dtype=object)[hit[has]]]
    # (a checkpointed forward recomputed in the backward is no gradient of anything)
    out[has] = [None if "Checkpoint" in n else n for n in names]
    return out


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    """Per (kernel, grid, operator) group of launches that ran under the bandwidth threshold:
    launches, time, bytes, the floor at the full and the achievable bandwidth."""
    k = ctx.kernels
    empty = pd.DataFrame(columns=["rank", "device_id", "name", "launches", "total_ns", "median_ns"])
    if not len(k):
        return empty
    codes, uniques = factorize(k["name"])
    names = np.asarray(uniques, dtype=object)
    # GEMMs, attention, communication and compiled (Inductor) kernels are other rules' or fused already
    other = np.array([attention_backend(n) is not None or str(n).startswith("triton_") for n in names] + [False])[codes]
    mask = (~k["is_gemm"] & ~k["is_comm"] & ~k["is_split_k"]).to_numpy(dtype=bool) & ~other
    mask &= ~np.asarray(schedule_excluded(ctx), dtype=bool)
    mask &= k["dur_ns"].to_numpy() >= float(rule["min_launch_ns"])
    if "grid_blocks" in k.columns and "sm_count" in k.columns:
        # a grid on a few SMs is underfilled_long_kernel's (its lever is the grid)
        few = (k["grid_blocks"] < float(rule["min_sm_fill"]) * k["sm_count"]).fillna(False).to_numpy(dtype=bool)
        mask &= ~few
    if not mask.any():
        return empty
    ranges, hit = innermost_ranges(ctx.trace, _op_ranges(ctx))
    mask &= hit >= 0
    if not mask.any():
        return empty
    # bytes per distinct operator call text (a trace repeats a few shapes many times)
    rows = np.unique(hit[mask])
    sub = ranges.loc[rows]
    strides = sub["input_strides"] if "input_strides" in sub.columns else pd.Series([None] * len(sub), index=sub.index)
    concrete = sub["concrete_inputs"] if "concrete_inputs" in sub.columns else pd.Series([None] * len(sub), index=sub.index)
    nbytes, speedup, case, placed = [], [], [], []
    default_speedup = float(rule["unmeasured_max_speedup"])
    for n, d, t, st, c in zip(sub["name"], sub["input_dims"], sub["input_types"], strides, concrete):
        st = st if isinstance(st, str) else None
        nbytes.append(op_bytes(n, d, t, st, c if isinstance(c, str) else None) or 0)
        placed.append(selection(n, d))
        key, entry, holds = measured_case(rule, case_key(n, d, t, st), _first_dtype(d, t))
        if placed[-1] is not None:  # the segment_reduce measurement is not this call's fix
            entry, holds = None, False
        case.append(key if entry and holds else None)
        cap = float(entry["speedup"]) if entry else default_speedup
        speedup.append(cap if holds else min(cap, default_speedup))
    launch_bytes = np.zeros(len(k))
    launch_bytes[mask] = pd.Series(np.array(nbytes, dtype=float), index=rows).reindex(hit[mask]).to_numpy()
    launch_speedup = np.ones(len(k))
    launch_speedup[mask] = pd.Series(np.array(speedup, dtype=float), index=rows).reindex(hit[mask]).to_numpy()
    case_of = pd.Series(np.array(case, dtype=object), index=rows)
    placed_of = pd.Series(np.array(placed + [None], dtype=object)[:-1], index=rows)
    mask &= launch_bytes >= float(rule["min_bytes"])
    if not mask.any():
        return empty
    # the device's measured bandwidth per launch
    bw = np.full(len(k), np.nan)
    for (rank, dev), idx in pd.Series(np.flatnonzero(mask)).groupby(
            [k["rank"].to_numpy()[mask], k["device_id"].fillna(-1).to_numpy()[mask]]):
        row = ctx.device_row(int(rank), None if dev == -1 else dev)
        b = measured_bandwidth(row) if row else None
        bw[idx.to_numpy()] = b if b else np.nan
    dur = k["dur_ns"].to_numpy(dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        fraction = launch_bytes / (dur * 1e-9) / bw
    mask &= np.nan_to_num(fraction, nan=1.0) < float(rule["max_bandwidth_fraction"])
    if not mask.any():
        return empty
    floor = launch_bytes / bw * 1e9  # ns at the full measured bandwidth
    # what a fix can reach: the bytes at the achievable share of the bandwidth, and never more
    # than the fix measured on this operator (or the unmeasured cap) allows
    reach = np.maximum(floor / float(rule["achievable_fraction"]), dur / launch_speedup)
    at = np.flatnonzero(mask)
    keys = [c for c in ("rank", "device_id", "name", "grid_x", "grid_y", "grid_z", "block_x", "block_y", "block_z")
            if c in k.columns]
    sel = k.iloc[at][keys + ["dur_ns"]].copy()
    sel["overlap_fraction"] = _overlap_fraction(k, sel.index)
    keep = sel["overlap_fraction"].to_numpy() <= float(rule["max_overlap_fraction"])
    if not keep.any():
        return empty
    sel, at = sel[keep], at[keep]
    op = ranges.loc[hit[at]]
    sel = sel.assign(_bytes=launch_bytes[at], _floor_ns=floor[at], _save_ns=np.maximum(dur[at] - reach[at], 0.0),
                     _bw_fraction=fraction[at], _speedup_cap=launch_speedup[at],
                     measured_case=case_of.reindex(hit[at]).to_numpy(),
                     _selection=placed_of.reindex(hit[at]).to_numpy(),
                     autograd_node=_autograd_nodes(ctx)[at],
                     **{"op_" + c: op[c].astype(object).where(op[c].notna(), None).to_numpy()
                        for c in ("name", "input_dims", "input_types", "input_strides") if c in op.columns})
    g = sel.groupby(keys + ["op_name"], dropna=False, sort=False)
    out = g.agg(launches=("dur_ns", "size"), total_ns=("dur_ns", "sum"), median_ns=("dur_ns", "median"),
                _bytes=("_bytes", "median"), _floor_ns=("_floor_ns", "sum"), _save_ns=("_save_ns", "sum"),
                _bw_fraction=("_bw_fraction", "median"), overlap_fraction=("overlap_fraction", "mean"),
                _speedup_cap=("_speedup_cap", "max"), measured_case=("measured_case", "first"),
                _selection=("_selection", "first"),
                autograd_node=("autograd_node", "first"), backward_launches=("autograd_node", "count"),
                **{c: (c, "first") for c in ("op_input_dims", "op_input_types", "op_input_strides") if c in sel.columns})
    out = out.reset_index()
    out["median_ns"] = out["median_ns"].round().astype("int64")
    return out.sort_values("total_ns", ascending=False, kind="stable").reset_index(drop=True)


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out = []
    if ev.empty:
        return out
    achievable = float(rule["achievable_fraction"])
    for (rank, dev), grp in by_device(ev):
        bw_row = ctx.device_row(int(rank), None if dev == -1 else dev)
        bw = measured_bandwidth(bw_row) if bw_row else None
        if not bw:
            continue
        for row in grp.to_dict("records"):
            total = float(row["total_ns"])
            save = float(row["_save_ns"])
            share = ctx.share(row["rank"], row["device_id"], total)
            if not share >= rule["min_share"] or save < rule["min_savings_ns"]:
                continue
            op = row.get("op_name") or ""
            fam = family(op)
            case = row.get("measured_case")
            case = case if isinstance(case, str) else None
            entry = rule.measured.get(case) if case else None
            fix = str(entry["fix"]) if entry else _FAMILY_FIX.get(fam, _GENERIC_FIX)
            cap = float(row["_speedup_cap"])
            if entry:
                measured = f"the fix measured {cap:g}x on {entry['source']} (bench/results/memory_bound)"
            else:
                measured = (f"no fix was measured on {op.split('::')[-1]} in this dtype: the rule's unmeasured cap, or "
                            f"what its fix measured in another dtype where that is lower")
            node = row.get("autograd_node")
            node = node if isinstance(node, str) else None
            backward = int(row.get("backward_launches") or 0)
            placed = row.get("_selection") if isinstance(row.get("_selection"), dict) else None
            if placed:
                fix = _SELECTION_FIX.format(**placed)
                if node:
                    fix += f" ({backward} of these {int(row['launches'])} launches are the gradient of {node})"
            elif node and fam == "scatter":
                fix += (f". {backward} of these {int(row['launches'])} launches are the gradient of {node} (autograd): "
                        "there the change is in the forward, e.g. a CSR sparse matrix product (torch.sparse.mm) in "
                        "place of the index_select / gather it differentiates, whose backward is a sparse product too")
            per_launch_floor = float(row["_bytes"]) / bw * 1e9
            out.append(finding_for(
                rule, row,
                strategy=rule.strategy_for("placement" if placed else fam),
                shape=None,
                total_ns=int(total),
                est_savings_ns=int(save),
                # the bytes come from the operator's recorded arguments; the fix's gain was
                # measured on a call like this one (medium) or on none (low)
                confidence="medium" if entry else "low",
                tier=3,
                savings_unit="gpu",
                evidence={
                    "operator": op,
                    "operator_family": fam,
                    "first_launch_input_dims": row.get("op_input_dims"),
                    "first_launch_input_types": row.get("op_input_types"),
                    "bytes_per_launch": int(row["_bytes"]),
                    "bandwidth_fraction": round(float(row["_bw_fraction"]), 4),
                    "measured_bandwidth_tb_per_s": round(bw / 1e12, 3),
                    "median_ns": int(row["median_ns"]),
                    "floor_ns_per_launch": int(per_launch_floor),
                    "share_of_gpu_time": round(share, 4),
                    "overlap_fraction": round(float(row["overlap_fraction"]), 3),
                    "autograd_node": node,
                    "backward_launches": backward,
                    "measured_case": case,
                    "what_it_is": str(entry.get("what", "")) if entry else "",
                    "fix": fix,
                    "bound_ns": int(row["_floor_ns"]),  # all launches' bytes at the full bandwidth
                    "basis": (f"a fix brings each launch down to its bytes (its operator's recorded arguments read once, "
                              f"its output written once) at {achievable:.0%} of the measured {bw / 1e12:.2f} TB/s (what "
                              f"the measured fixes reach), and no lower than its time / {cap:g}: {measured}"),
                },
                suggestion={"fix": fix},
            ))
    return out
