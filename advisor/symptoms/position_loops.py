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
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd

from ..findings import Finding
from ..rules import Rule
from .context import Context, finding_for

_COLUMNS = ["rank", "thread_id", "start_ns", "end_ns", "tensors", "positions", "selects"]


def _dim_index(text) -> tuple[int, int] | None:
    """(dim, index) from a select's Concrete Inputs text ('["", "1", "7"]'), else None."""
    if not isinstance(text, str):
        return None
    try:
        c = json.loads(text)
        return int(c[1]), int(c[2])
    except (ValueError, TypeError, IndexError):
        return None


def _walks(index: np.ndarray, starts: np.ndarray, ends: np.ndarray, min_positions: int):
    """(first, last, positions) row ranges where the distinct consecutive indices step by +1
    (or by -1) for at least min_positions positions."""
    change = np.flatnonzero(np.concatenate([[True], index[1:] != index[:-1]]))  # first row of each index value
    vals = index[change]
    step = np.diff(vals)
    out = []
    for direction in (1, -1):
        ok = step == direction
        # maximal stretches of ok steps: positions = steps + 1
        edges = np.flatnonzero(np.diff(np.concatenate([[0], ok.astype(np.int8), [0]])))
        for a, b in zip(edges[::2], edges[1::2]):
            positions = b - a + 1
            if positions >= min_positions:
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
    if len(ops) and "concrete_inputs" in ops.columns:
        sel = ops[(ops["name"] == "aten::select").to_numpy(dtype=bool)]
        sel = sel[sel["input_dims"].notna().to_numpy(dtype=bool) & sel["concrete_inputs"].notna().to_numpy(dtype=bool)]
        if len(sel):
            parsed = [_dim_index(t) for t in sel["concrete_inputs"]]
            keep = np.array([p is not None for p in parsed], dtype=bool)
            sel = sel[keep]
            di = np.array([p for p in parsed if p is not None], dtype=np.int64).reshape(-1, 2)
            sel = sel.assign(_dim=di[:, 0], _index=di[:, 1])
            for (rank, thread, dims, dim), g in sel.groupby(["rank", "thread_id", "input_dims", "_dim"], sort=False):
                if len(g) < min_positions:
                    continue
                try:
                    shape = json.loads(dims)[0]
                except (ValueError, TypeError, IndexError):
                    continue
                if not isinstance(shape, list) or len(shape) < 2:
                    continue
                d = int(dim) + len(shape) if dim < 0 else int(dim)
                if not 1 <= d < len(shape):
                    continue
                extent = int(shape[d])
                g = g.sort_values("start_ns", kind="stable")
                index = g["_index"].to_numpy()
                index = np.where(index < 0, index + extent, index)
                starts, ends = g["start_ns"].to_numpy(), g["end_ns"].to_numpy()
                for first, last, positions in _walks(index, starts, ends, min_positions):
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


def loop_kernels(ctx: Context, loops: pd.DataFrame) -> np.ndarray:
    """Positions in ctx.kernels of the kernels launched inside the loops' host windows (by the
    launch calls on the loop's thread, matched to kernels by correlation id)."""
    rt, k = ctx.trace.runtime, ctx.kernels
    if not len(loops) or not len(rt) or "correlation_id" not in k.columns:
        return np.zeros(0, dtype=np.int64)
    corr = []
    for (rank, thread), g in loops.groupby(["rank", "thread_id"], sort=False):
        on = rt[(rt["rank"] == rank).to_numpy(dtype=bool) & (rt["thread_id"] == thread).to_numpy(dtype=bool)]
        if not len(on):
            continue
        s = on["start_ns"].to_numpy()
        inside = np.zeros(len(on), dtype=bool)
        for a, b in zip(g["start_ns"].to_numpy(), g["end_ns"].to_numpy()):
            inside |= (s >= a) & (s <= b)
        corr.append(pd.DataFrame({"rank": int(rank), "correlation_id": on["correlation_id"].to_numpy()[inside]}))
    if not corr:
        return np.zeros(0, dtype=np.int64)
    c = pd.concat(corr, ignore_index=True).dropna()
    kk = pd.DataFrame({"rank": k["rank"].to_numpy(), "correlation_id": k["correlation_id"].to_numpy(),
                       "pos": np.arange(len(k))}).dropna(subset=["correlation_id"])
    m = kk.merge(c.astype({"correlation_id": kk["correlation_id"].dtype}), on=["rank", "correlation_id"], how="inner")
    return np.unique(m["pos"].to_numpy(dtype=np.int64))


def _gaps(k: pd.DataFrame, pos: np.ndarray, max_gap: float) -> np.ndarray:
    """Per kernel at `pos` (sorted by start within each stream): the idle time since the
    previous of these kernels on its stream, when at most max_gap, else 0."""
    sub = pd.DataFrame({"stream": k["stream_id"].to_numpy()[pos], "start": k["start_ns"].to_numpy()[pos],
                        "end": k["end_ns"].to_numpy()[pos]}).sort_values(["stream", "start"], kind="stable")
    gap = sub["start"].to_numpy() - np.concatenate([[0], sub["end"].to_numpy()[:-1]])
    first = np.concatenate([[True], sub["stream"].to_numpy()[1:] != sub["stream"].to_numpy()[:-1]])
    gap = np.where(first | (gap < 0) | (gap > max_gap), 0, gap)
    out = np.zeros(len(pos), dtype=np.int64)
    out[sub.index.to_numpy()] = gap
    return out


def loop_findings(ctx: Context, rule: Rule) -> tuple[list[Finding], dict]:
    """One finding per (rank, device) whose kernels a position loop launched, strategy
    `fused_scan`: its claim the loop kernels' launch gaps (as the run findings count them;
    the kernels' own time, which a fused scan also shortens, is not claimed), and per (rank,
    device, stream) the gap ns taken, for the run findings to give up."""
    loops = position_loops(ctx, int(rule["min_loop_positions"]))
    if not len(loops):
        return [], {}
    pos = loop_kernels(ctx, loops)
    k = ctx.kernels
    pos = pos[(k["dur_ns"].to_numpy()[pos] < rule["tiny_kernel_ns"])] if len(pos) else pos
    if not len(pos):
        return [], {}
    gaps = _gaps(k, pos, float(rule["max_gap_in_run_ns"]))
    found, taken = [], {}
    dev = k["device_id"].fillna(-1).astype("int64").to_numpy()[pos]
    rank = k["rank"].astype("int64").to_numpy()[pos]
    for r, d in sorted(set(zip(rank.tolist(), dev.tolist()))):
        at = pos[(rank == r) & (dev == d)]
        g = gaps[(rank == r) & (dev == d)]
        gap_ns, kernel_ns = int(g.sum()), int(k["dur_ns"].to_numpy()[at].sum())
        if gap_ns < rule["min_savings_ns"]:
            continue
        for s, v in pd.Series(g).groupby(k["stream_id"].to_numpy()[at]).sum().items():
            taken[(r, d, s)] = taken.get((r, d, s), 0) + int(v)
        names = pd.Series(k["dur_ns"].to_numpy()[at]).groupby(k["name"].to_numpy()[at]).agg(["sum", "size"])
        top = names.sort_values("sum", ascending=False).index[0]
        mine = loops[loops["rank"] == r]
        shapes = mine.groupby("tensors", sort=False).agg(loops=("positions", "size"),
                                                         positions=("positions", "max")).reset_index()
        positions = int(mine["positions"].sum())
        per = len(at) / max(1, positions)
        desc = "; ".join(f"{int(x.loops)} loop(s) over {int(x.positions)} positions, walking "
                         + ", ".join(f"dim {d} of a {list(t)} tensor" for t, d in json.loads(x.tensors)[:3])
                         for x in shapes.head(4).itertuples())
        found.append(finding_for(
            rule, {"name": top, "rank": r},
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
                "loops": [{"tensors": [{"shape": t, "dim": d} for t, d in json.loads(x.tensors)],
                           "positions": int(x.positions), "loops": int(x.loops)} for x in shapes.head(8).itertuples()],
                "positions": positions,
                "kernels_per_position": round(per, 1),
                "kernel_ns": kernel_ns,
                "gap_ns": gap_ns,
                "basis": f"the {len(at):,} loop kernels' idle gaps on their streams (each up to "
                         f"{rule['max_gap_in_run_ns'] / 1000:g} us): wall time the GPU waited between the loop's "
                         "launches; their own kernel time, which one scan kernel also shortens, is not claimed",
                "loop_text": f"{desc}: a Python loop stepping a recurrence, {per:.1f} kernels a position",
            },
            suggestion={"schedule": "fused_scan", "cuda_graph": False},
        ))
    return found, taken


__all__ = ["position_loops", "loop_kernels", "loop_findings"]
