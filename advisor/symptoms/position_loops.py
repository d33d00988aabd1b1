"""Python loops over the positions of one dimension, read from the recorded `aten::select` calls.

A recurrence written as `for t in range(T): h = a[:, t] * h + b[:, t]` (transformers' slow paths
of Mamba, RecurrentGemma's RG-LRU, RWKV's WKV without its CUDA kernel) selects position t of
its inputs on every iteration: Kineto with record_shapes keeps each `aten::select`'s tensor dims
and, in Concrete Inputs, its dim and index, so the loop shows as one tensor shape selected along
one dim at indices 0, 1, 2, ... (each index possibly several times in a row: several inputs, or
the output written back). Such a loop launches a few tiny kernels a position, T times over, and
no CUDA graph or fusion pass turns it into less serial work; one kernel that walks the
positions (a fused or parallel scan) does.

`position_loops(ctx, min_positions)` returns one row per loop: rank, thread_id, start_ns,
end_ns (the host window from its first select to one mean step past its last), tensors (JSON text: [[dims, dim],
...], every tensor the loop walks: walks whose windows overlap are one loop), positions,
selects. Only dims past the first count: a walk
over dim 0 is a stack of weights or experts taken one by one (a grouped launch's business), not
positions of a sequence. `loop_kernels(ctx, loops)` gives the kernels launched inside those
windows (positions in ctx.kernels, by their launch calls' correlation ids on the loop's thread).
A walk must start at the dim's first position (or its last, walking back) and launch at most
`max_loop_kernels_per_position` kernels a position: a decode loop writing token t of a
preallocated buffer walks positions too, but from the prompt's end and a whole model step apart.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from ..findings import Finding
from ..rules import Rule
from .context import Context, finding_for

UNNAMED = "(kernel name not in the trace)"  # launch_overhead's word for it

_COLUMNS = ["rank", "thread_id", "start_ns", "end_ns", "tensors", "positions", "selects"]


def _dim_index(text) -> tuple[int, int] | None:
    """(dim, index) from a select's Concrete Inputs text ('["", "1", "7"]'), else None."""
    if not isinstance(text, str):
        return None
    try:
        c = json.loads(text)
        dim, index = int(c[1]), int(c[2])
    except Exception:  # noqa: BLE001  (any text a trace may hold: not a loop step)
        return None
    return (dim, index) if abs(dim) < 64 and abs(index) < 2**40 else None


def _shape(dims_text) -> list[int] | None:
    """The selected tensor's dims (the first argument's), if a list of ints of rank 2+."""
    try:
        shape = json.loads(dims_text)[0]
    except Exception:  # noqa: BLE001
        return None
    if not isinstance(shape, list) or len(shape) < 2 or not all(isinstance(x, int) and x >= 0 for x in shape):
        return None
    return shape


def _walks(index: np.ndarray, extent: int, min_positions: int):
    """(first, last, positions) row ranges where the distinct consecutive indices step by +1
    from 0 (or by -1 from extent - 1) for at least min_positions positions."""
    change = np.flatnonzero(np.concatenate([[True], index[1:] != index[:-1]]))  # first row of each index value
    vals = index[change]
    step = np.diff(vals)
    out = []
    for direction, start in ((1, 0), (-1, extent - 1)):
        ok = step == direction
        edges = np.flatnonzero(np.diff(np.concatenate([[0], ok.astype(np.int8), [0]])))
        for a, b in zip(edges[::2], edges[1::2]):
            positions = b - a + 1
            if positions >= min_positions and vals[a] == start:
                first = change[a]
                last = (change[b + 1] - 1) if b + 1 < len(change) else len(index) - 1
                out.append((first, last, positions))
    return out


def position_loops(ctx: Context, min_positions: int) -> pd.DataFrame:
    key = ("position_loops", int(min_positions))
    if key in ctx.cache:
        return ctx.cache[key]
    ops = ctx.trace.cpu_ops
    rows = []
    if len(ops) and {"concrete_inputs", "input_dims", "name"} <= set(ops.columns):
        sel = ops[(ops["name"] == "aten::select").to_numpy(dtype=bool, na_value=False)
                  & ops["input_dims"].notna().to_numpy(dtype=bool)
                  & ops["concrete_inputs"].notna().to_numpy(dtype=bool)]
        if len(sel) >= min_positions:
            parsed = [_dim_index(t) for t in sel["concrete_inputs"]]
            keep = np.array([p is not None for p in parsed], dtype=bool)
            sel = sel[keep]
            di = np.array([p for p in parsed if p is not None], dtype=np.int64).reshape(-1, 2)
            sel = sel.assign(_dim=di[:, 0], _index=di[:, 1])
            for (rank, thread, dims, dim), g in sel.groupby(["rank", "thread_id", "input_dims", "_dim"], sort=False):
                if len(g) < min_positions:
                    continue
                shape = _shape(dims)
                if shape is None:
                    continue
                d = int(dim) + len(shape) if dim < 0 else int(dim)
                if not 1 <= d < len(shape):
                    continue
                extent = int(shape[d])
                g = g.sort_values("start_ns", kind="stable")
                index = g["_index"].to_numpy()
                index = np.where(index < 0, index + extent, index)
                starts, ends = g["start_ns"].to_numpy(np.int64), g["end_ns"].to_numpy(np.int64)
                for first, last, positions in _walks(index, extent, min_positions):
                    # the last position's work follows its select: one mean step past it
                    step = (starts[last] - starts[first]) / max(1, positions - 1)
                    rows.append({"rank": int(rank), "thread_id": thread, "start_ns": int(starts[first]),
                                 "end_ns": int(ends[last] + step), "tensors": [[shape, d]],
                                 "positions": int(positions), "selects": int(last - first + 1)})
    out = pd.DataFrame(_merged(rows), columns=_COLUMNS)
    ctx.cache[key] = out
    return out


def _merged(rows: list[dict]) -> list[dict]:
    """Walks of one thread whose windows overlap are one loop (it selects from several
    tensors each position: Mamba's A, B and C)."""
    out: list[dict] = []
    for r in sorted(rows, key=lambda r: (r["rank"], str(r["thread_id"]), r["start_ns"])):
        last = out[-1] if out else None
        if last and (last["rank"], last["thread_id"]) == (r["rank"], r["thread_id"]) and r["start_ns"] <= last["end_ns"]:
            last["end_ns"] = max(last["end_ns"], r["end_ns"])
            last["positions"] = max(last["positions"], r["positions"])
            last["selects"] += r["selects"]
            last["tensors"] += [t for t in r["tensors"] if t not in last["tensors"]]
        else:
            out.append(dict(r, tensors=list(r["tensors"])))
    for r in out:
        r["tensors"] = json.dumps(r["tensors"])
    return out


def loop_kernels(ctx: Context, loops: pd.DataFrame) -> pd.DataFrame:
    """The kernels launched inside the loops' host windows: `pos` (in ctx.kernels) and `loop`
    (the loop's row label), by the launch calls on the loop's thread matched to kernels by
    correlation id."""
    rt, k = ctx.trace.runtime, ctx.kernels
    empty = pd.DataFrame({"pos": np.zeros(0, dtype=np.int64), "loop": np.zeros(0, dtype=np.int64)})
    if not len(loops) or not len(rt) or "correlation_id" not in k.columns or "thread_id" not in rt.columns:
        return empty
    parts = []
    for (rank, thread), g in loops.groupby(["rank", "thread_id"], sort=False):
        on = rt[(rt["rank"] == rank).to_numpy(dtype=bool, na_value=False)
                & (rt["thread_id"] == thread).to_numpy(dtype=bool, na_value=False)
                & rt["correlation_id"].notna().to_numpy(dtype=bool)]
        if not len(on):
            continue
        order = np.argsort(on["start_ns"].to_numpy(np.int64), kind="stable")
        starts = on["start_ns"].to_numpy(np.int64)[order]
        corr = on["correlation_id"].to_numpy(np.int64)[order]
        for label, a, b in zip(g.index, g["start_ns"].to_numpy(), g["end_ns"].to_numpy()):
            lo, hi = np.searchsorted(starts, a, "left"), np.searchsorted(starts, b, "right")
            if hi > lo:
                parts.append(pd.DataFrame({"rank": int(rank), "correlation_id": corr[lo:hi], "loop": int(label)}))
    if not parts:
        return empty
    c = pd.concat(parts, ignore_index=True)
    kc = k["correlation_id"]
    has = kc.notna().to_numpy(dtype=bool)
    kk = pd.DataFrame({"rank": k["rank"].to_numpy()[has].astype(np.int64),
                       "correlation_id": kc.to_numpy()[has].astype(np.int64), "pos": np.flatnonzero(has)})
    m = kk.merge(c, on=["rank", "correlation_id"], how="inner")
    return m[["pos", "loop"]].drop_duplicates("pos").reset_index(drop=True)


def loop_findings(ctx: Context, rule: Rule, runs: pd.DataFrame, gapped: pd.DataFrame | None,
                  key_cols: list[str]) -> tuple[list[Finding], dict, list[int]]:
    """One finding per (rank, device) whose kernels position loops launched, strategy
    `fused_scan`, claiming the gaps before those kernels inside the tiny-kernel runs
    (launch_overhead.find_runs' own gaps: `gapped`, with run_id, pos and gap); and per run key
    (key_cols of `runs`) the gap ns taken, for the run findings to give up, and the kernel
    positions whose gaps are claimed. The kernels' own time, which a scan kernel also
    shortens, is not claimed."""
    none: tuple[list[Finding], dict, list[int]] = ([], {}, [])
    loops = position_loops(ctx, int(rule["min_loop_positions"]))
    if not len(loops) or gapped is None or not len(gapped) or not len(runs):
        return none
    lk = loop_kernels(ctx, loops)
    if not len(lk):
        return none
    # a whole model step a position is a decode loop, not a recurrence's step
    sizes = lk.groupby("loop").size()
    per_loop = sizes / loops["positions"].reindex(sizes.index).to_numpy()
    fine = per_loop[per_loop <= float(rule["max_loop_kernels_per_position"])].index
    lk = lk[lk["loop"].isin(fine)]
    if not len(lk):
        return none
    g = gapped[gapped["pos"].isin(lk["pos"].to_numpy())]
    g = g.join(runs.set_index("run_id")[key_cols], on="run_id")
    k = ctx.kernels
    dev_of = k["device_id"].fillna(-1).astype("int64").to_numpy()
    rank_of = k["rank"].astype("int64").to_numpy()
    found, taken, claimed = [], {}, []
    for (r, d), gd in g.groupby([g["rank"].astype("int64"), g["device_id"].astype("int64")], sort=False):
        at = lk[(rank_of[lk["pos"].to_numpy()] == r) & (dev_of[lk["pos"].to_numpy()] == d)]
        gap_ns, kernel_ns = int(gd["gap"].sum()), int(k["dur_ns"].to_numpy()[at["pos"].to_numpy()].sum())
        if gap_ns < rule["min_savings_ns"] or gap_ns / max(1, gap_ns + kernel_ns) < rule["min_gap_fraction"]:
            continue
        for key, v in gd.groupby(key_cols, sort=False)["gap"].sum().items():
            rk, dk, sk, gemm = key
            taken[(int(rk), int(dk), int(sk), bool(gemm))] = int(v)
        claimed += gd["pos"].tolist()
        names = pd.Series(k["dur_ns"].to_numpy()[at["pos"].to_numpy()]).groupby(
            k["name"].astype(object).to_numpy()[at["pos"].to_numpy()]).sum()
        top = names.sort_values(ascending=False).index[0] if len(names) else UNNAMED
        mine = loops.loc[at["loop"].unique()]
        shapes = mine.groupby("tensors", sort=False).agg(loops=("positions", "size"),
                                                         positions=("positions", "max")).reset_index()
        positions = int(mine["positions"].sum())
        per = len(at) / max(1, positions)
        desc = "; ".join(f"{int(x.loops)} loop(s) over {int(x.positions)} positions, walking "
                         + ", ".join(f"dim {dd} of a {list(t)} tensor" for t, dd in json.loads(x.tensors)[:3])
                         for x in shapes.head(4).itertuples())
        found.append(finding_for(
            rule, {"name": top, "rank": int(r)},
            strategy="fused_scan",
            device_id=None if d < 0 else int(d),
            shape=None, grid=None, block=None,
            launches=int(len(at)),
            total_ns=kernel_ns,
            est_savings_ns=gap_ns,
            confidence="medium",
            tier=1,
            savings_unit="wall",
            evidence={
                "pattern": "position loop",
                "run_kind": "position_loop",
                "loops": [{"tensors": [{"shape": t, "dim": dd} for t, dd in json.loads(x.tensors)],
                           "positions": int(x.positions), "loops": int(x.loops)} for x in shapes.head(8).itertuples()],
                "positions": positions,
                "kernels_per_position": round(per, 1),
                "kernel_ns": kernel_ns,
                "gap_ns": gap_ns,
                "basis": f"the idle gaps before {len(gd):,} of the loops' {len(at):,} kernels inside runs of tiny "
                         f"kernels (each up to {rule['max_gap_in_run_ns'] / 1000:g} us): wall time the GPU waited "
                         "between the loop's launches; their own kernel time, which one scan kernel also "
                         "shortens, is not claimed",
                "loop_text": f"{desc}: a Python loop, {per:.1f} kernels a position",
            },
            suggestion={"schedule": "fused_scan", "cuda_graph": False},
        ))
    return found, taken, claimed


__all__ = ["position_loops", "loop_kernels", "loop_findings"]
