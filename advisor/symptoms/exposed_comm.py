"""exposed_comm: collective communication not hidden behind compute, per rank, across ranks.

What it detects
    NCCL/RCCL (and custom all-reduce) kernels, and the copy-engine transports' peer-to-peer
    copies (memcpy PtoP: symmetric memory, NVSHMEM, CUDA IPC) with their signal kernels,
    whose time is not covered by compute kernels running at the same moment on the same
    device. With several ranks (one trace file per
    rank), the ranks' clocks are first aligned on the ends of their common collectives
    (advisor.symptoms.ranks), which splits each rank's exposed communication into time spent
    waiting for the last rank to arrive (load imbalance) and the transfer itself, names the
    slowest rank and walks the critical path of the window.

Why it matters
    Exposed communication is time the GPU does nothing else; in tensor/sequence-parallel
    layers it sits between every pair of GEMMs, in pipeline parallelism it is the bubble.

What to do
    Decompose the collective and the GEMM that consumes or produces it into chunks, so that
    chunk i+1's all-gather (or chunk i's reduce-scatter) runs on its own stream while a GEMM
    computes: kernels/comm_overlap.py. Waiting for a slow rank is not fixed by overlap: it
    is reported (wait_ns) but not counted as recoverable.

Evidence (one row per rank and device)
    comm_ns, overlapped_ns, exposed_ns, exposed_fraction (of device busy time), compute_ns,
    wait_ns / exposed_wait_ns, recoverable_ns (exposed transfer time), idle_ns and bubbles,
    per collective kind (all_reduce, all_gather, reduce_scatter, all_to_all, send_recv, ...)
    counts, times and message sizes when the trace records them; the frame's `attrs` hold
    the alignment, the slowest rank and a digest of the critical path.

Estimated recoverable time: the exposed transfer time (exposed minus exposed waiting),
bounded by the compute time available to hide it.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from ..findings import Finding
from ..rules import Rule
from . import ranks as rk
from .context import Context

SYMPTOM = "exposed_comm"
REQUIRES = ()

# Which overlapped schedule fits the collective that is exposed (kernels/comm_overlap.py).
_SCHEDULES = {
    "all_gather": "all_gather_matmul",
    "reduce_scatter": "matmul_reduce_scatter",
    # an all-reduce after a row-parallel GEMM is a reduce-scatter + all-gather (sequence
    # parallelism): overlap the first half with the GEMM that produces it
    "all_reduce": "matmul_reduce_scatter",
}


def with_peer_copies(kernels: pd.DataFrame, memcpy: pd.DataFrame | None) -> pd.DataFrame:
    """The kernels frame plus one communication row per peer-to-peer copy (memcpy PtoP): a
    copy-engine transport moves the collective's bytes with copies instead of kernels, and
    those copies are exposed or hidden like NCCL kernels are."""
    if memcpy is None or memcpy.empty or not {"op", "kind"} <= set(memcpy.columns):
        return kernels
    p = memcpy[(memcpy["op"] == "memcpy") & (memcpy["kind"] == "PtoP")]
    if p.empty:
        return kernels
    cols = [c for c in ("rank", "device_id", "stream_id", "start_ns", "end_ns", "dur_ns") if c in p.columns]
    copies = p[cols].assign(name="Memcpy PtoP", is_comm=True)
    out = pd.concat([kernels, copies], ignore_index=True)
    out["is_comm"] = out["is_comm"].astype(bool)
    return out


# Host-side ranges that name the collective a launch belongs to: PyTorch's `nccl:all_reduce`
# record_function, c10d's `c10d::allreduce_`, NCCL's own NVTX ranges (`ncclAllReduce`).
_RANGE_COLLECTIVE = re.compile(r"^(?:nccl:|c10d::|nccl[A-Z]|rccl[A-Z])", re.I)


def with_range_collectives(kernels: pd.DataFrame, trace) -> pd.DataFrame:
    """`kernels` with `comm_name` filled, for communication kernels whose name does not say
    which collective they run (RCCL's and NCCL's `ncclDevKernel_Generic`), from the innermost
    host range around the launch call that names one (`nccl:broadcast`, `ncclAllReduce`...)."""
    if kernels.empty or trace.nvtx.empty or "is_comm" not in kernels.columns:
        return kernels
    comm = kernels[kernels["is_comm"]]
    if comm.empty:
        return kernels
    unknown = rk.collective_kinds(comm) == "other"
    if not unknown.any():
        return kernels
    text = trace.nvtx["text"].fillna("").astype(str)
    ranges = trace.nvtx[text.str.contains(_RANGE_COLLECTIVE) & text.map(rk.collective_kind).ne("other")]
    if ranges.empty:
        return kernels
    from .gemm import _launch_points

    lp = _launch_points(trace).loc[comm.index[unknown.to_numpy()]].dropna(subset=["launch_ns"])
    names = {}
    for (rank, tid), g in lp.groupby(["rank", "thread_id"], sort=False):
        rg = ranges[(ranges["rank"] == rank) & (ranges["thread_id"] == tid).fillna(False)]
        if rg.empty:
            continue
        rg = rg.sort_values("start_ns", kind="stable")
        starts, ends = rg["start_ns"].to_numpy(), rg["end_ns"].to_numpy()
        texts = rg["text"].astype(str).to_numpy()
        for idx, t in zip(g.index, g["launch_ns"].to_numpy()):
            i = int(np.searchsorted(starts, t, side="right")) - 1
            while i >= 0 and ends[i] < t:  # the latest-starting range that still covers t
                i -= 1
            if i >= 0:
                names[idx] = texts[i]
    if not names:
        return kernels
    out = kernels.copy()
    if "comm_name" not in out.columns:
        out["comm_name"] = pd.Series(pd.NA, index=out.index, dtype="string")
    fill = pd.Series(names)
    have = out.loc[fill.index, "comm_name"]
    fill = fill[have.isna().to_numpy()]
    out.loc[fill.index, "comm_name"] = fill.to_numpy()
    return out


def analysis(ctx: Context, rule: Rule) -> rk.RankAnalysis:
    """The cross-rank analysis, computed once per context."""
    key = ("ranks", int(rule["min_aligned_collectives"]), int(rule["min_bubble_ns"]))
    if key not in ctx.cache:
        ctx.cache[key] = rk.analyze(
            with_peer_copies(with_range_collectives(ctx.kernels, ctx.trace), ctx.trace.memcpy),
            min_matches=int(rule["min_aligned_collectives"]),
            min_bubble_ns=int(rule["min_bubble_ns"]),
            unrelated="; ".join(ctx.trace.meta.get("unrelated_ranks") or ()) or None,
        )
    return ctx.cache[key]


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    k = with_peer_copies(ctx.kernels, ctx.trace.memcpy)
    if k.empty or not k["is_comm"].any():
        return pd.DataFrame()
    a = analysis(ctx, rule)
    ev = a.stats[a.stats["comm_kernels"] > 0].reset_index(drop=True)
    al = a.alignment
    multi = len(ctx.trace.ranks) > 1
    cross = multi and al.comparable
    # Waiting for the last rank is imbalance, not something overlap hides.
    ev["recoverable_ns"] = ev["exposed_ns"] - (ev["exposed_wait_ns"] if cross else 0)
    ev["recoverable_fraction"] = ev["recoverable_ns"] / ev["busy_ns"].where(ev["busy_ns"] > 0)
    # Of the communication that is not waiting for a peer, the share already under compute
    # (a rank that waits long at a barrier for a late peer is not thereby "unoverlapped").
    transfer = ev["comm_ns"] - (ev["exposed_wait_ns"] if cross else 0)
    ev["hidden_fraction"] = (ev["overlapped_ns"] / transfer.where(transfer > 0)).clip(upper=1.0)
    ev["offset_ns"] = [al.offset(r) for r in ev["rank"]]
    ev["aligned"] = [al.aligned(r) for r in ev["rank"]]
    ev["alignment_spread_ns"] = [al.spread_ns.get(int(r), 0) for r in ev["rank"]]
    ev.attrs = {
        "ranks": len(ctx.trace.ranks),
        "alignment": {
            "status": al.status,
            "reason": al.reason,
            "reference_rank": al.reference_rank,
            "offsets_ns": {str(r): int(v) for r, v in al.offsets_ns.items()},
            "notes": list(al.notes),
        },
        "slowest_rank": a.slowest_rank,
        "critical_path": a.path_summary,
    }
    return ev


def _num(v):
    """JSON-safe number (NaN -> None)."""
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return None
    return round(float(v), 3) if isinstance(v, float) else int(v)


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out = []
    if ev is None or ev.empty:
        return out
    info = ev.attrs
    n_ranks = int(info.get("ranks", 1))
    al = info.get("alignment", {})
    for row in ev.to_dict("records"):
        if int(row["rank"]) in ctx.serialized_ranks:
            continue  # kernels run one at a time: nothing could overlap
        recoverable = int(row["recoverable_ns"])
        frac = row["recoverable_fraction"]
        if not (frac >= rule["min_exposed_fraction"]) or recoverable < rule["min_exposed_ns"]:
            continue
        savings = min(recoverable, int(row["compute_ns"]))
        if savings < rule["min_savings_ns"]:
            continue
        kinds = row["kinds"] or {}
        top_kind = next(iter(kinds), None)
        top_kernel = kinds[top_kind]["top_kernel"] if top_kind else ""
        confidence = "medium"
        hidden = row["hidden_fraction"]
        already = bool(hidden >= rule["already_overlapped_fraction"])
        if already:
            confidence = "low"  # what is left is the pipeline's fill/drain and signals: gains are small
        if n_ranks > 1 and (al.get("status") not in ("aligned",) or row["alignment_spread_ns"] > rule["max_alignment_spread_ns"]):
            confidence = "low"  # waits unknown or doubtful: part of the exposure may be imbalance
        world = ctx.trace.meta.get("world_size")
        missing_ranks = isinstance(world, int) and world > n_ranks
        if missing_ranks:
            confidence = "low"  # the other ranks' traces are missing: waits cannot be measured at all
        evidence = {
            "comm_ns": int(row["comm_ns"]),
            "overlapped_ns": int(row["overlapped_ns"]),
            "exposed_ns": int(row["exposed_ns"]),
            "exposed_fraction": _num(row["exposed_fraction"]),
            "hidden_fraction": _num(hidden),
            "recoverable_ns": recoverable,
            "compute_ns": int(row["compute_ns"]),
            "busy_ns": int(row["busy_ns"]),
            "wait_ns": int(row["wait_ns"]),
            "exposed_wait_ns": int(row["exposed_wait_ns"]),
            "idle_ns": int(row["idle_ns"]),
            "bubbles": int(row["bubbles"]),
            "bubble_ns": int(row["bubble_ns"]),
            "collectives": kinds,
        }
        if n_ranks > 1:
            evidence.update(
                {
                    "ranks": n_ranks,
                    "last_arrivals": int(row["last_arrivals"]),
                    "alignment": {
                        "status": al.get("status"),
                        "offset_ns": int(row["offset_ns"]),
                        "spread_ns": int(row["alignment_spread_ns"]),
                        "reason": al.get("reason"),
                    },
                }
            )
        if n_ranks > 1 and info.get("slowest_rank") is not None:  # only when every rank's clock is aligned
            evidence["slowest_rank"] = info["slowest_rank"]
        if info.get("critical_path"):
            evidence["critical_path"] = info["critical_path"]
        if missing_ranks:
            evidence["world_size"] = int(world)
        suggestion = {"pattern": "chunked collective + GEMM on separate streams", "collective": top_kind}
        if already:
            suggestion = {
                "pattern": "already overlapped: trim the exposed rest (first/last chunk, per-chunk signals, "
                "SMs the collective takes from the GEMM)",
                "collective": top_kind,
                "hidden_fraction": _num(hidden),
                "try": "fewer chunks; a copy-engine transport (kernels/comm_overlap.py transport='p2p'); "
                "replay the step from a CUDA graph if the GPU waits on the host",
            }
        elif top_kind in _SCHEDULES:
            suggestion.update(schedule=_SCHEDULES[top_kind], chunks=int(rule["suggested_chunks"]))
        out.append(
            Finding(
                symptom=SYMPTOM,
                strategy=rule.strategy,
                title=("Communication only partly hidden behind compute (already overlapped)" if already else rule.title),
                kernel=top_kernel,
                rank=int(row["rank"]),
                device_id=None if row["device_id"] < 0 else int(row["device_id"]),
                shape=None,
                grid=None,
                block=None,
                launches=int(row["comm_kernels"]),
                total_ns=int(row["comm_ns"]),
                est_savings_ns=int(savings),
                confidence=confidence,
                watch_for=rule.watch_for,
                evidence=evidence,
                suggestion=suggestion,
            )
        )
    return out
