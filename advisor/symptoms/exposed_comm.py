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

Which remedy (strategy ids from the rule's [strategies] table): the chunked collective +
GEMM schedule (comm_overlap) only where the exposed collective feeds or follows a GEMM on that
device (a GEMM starts right after it ends, or ends right before it starts: evidence
`collectives[kind].gemm_adjacent_fraction`); an all-to-all (MoE dispatch/combine) gets
expert_overlap, pipeline send/recv pipeline_schedule, any other collective async_collective.
Kernels that do not name their collective (ncclDevKernel_Generic, NCCL's SendRecv kernels
that also carry all-to-all) are named by the host range around their launch.

Estimated recoverable time: the exposed transfer time (exposed minus exposed waiting),
bounded by the compute time available to hide it (`bound_ns`, `basis`). Its unit is wall
time (savings_unit "wall"): overlapping communication shortens the step's critical path while
the communication kernels still run, so it is not GPU time that goes away.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from ..findings import Finding
from ..rules import Rule
from . import ranks as rk
from .context import Context, finding_for

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
    which collective they run, from the innermost host range around the launch call that
    names one (`nccl:broadcast`, `ncclAllReduce`...): RCCL's and NCCL's
    `ncclDevKernel_Generic`, and NCCL's SendRecv kernels, which also carry all-to-all,
    gather and scatter (a DLRM embedding all-to-all runs as `ncclKernel_SendRecv` inside
    `nccl:all_to_all`): pipeline send/recv is told from all-to-all only that way."""
    if kernels.empty or trace.nvtx.empty or "is_comm" not in kernels.columns:
        return kernels
    comm = kernels[kernels["is_comm"]]
    if comm.empty:
        return kernels
    unknown = rk.collective_kinds(comm).isin(["other", "send_recv"])
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


def gemm_neighbours(kernels: pd.DataFrame, window_ns: int) -> pd.Series:
    """Per communication kernel (index of `kernels`): True when a GEMM on the same device
    starts within `window_ns` after it ends (the GEMM consumes it: all-gather -> GEMM) or ends
    within `window_ns` before it starts (the GEMM produces it: GEMM -> reduce-scatter). A
    trace does not record data dependencies; a GEMM launched right behind the collective is
    the evidence that can be read."""
    comm = kernels[kernels["is_comm"]]
    out = pd.Series(False, index=comm.index)
    if comm.empty or "is_gemm" not in kernels.columns:
        return out
    gemm = kernels[kernels["is_gemm"].fillna(False).astype(bool) & ~kernels["is_comm"]]
    if gemm.empty:
        return out
    dev = lambda df: df["device_id"].astype("Int64").fillna(-1).astype("int64")  # noqa: E731
    by_dev = {key: g for key, g in gemm.groupby([gemm["rank"], dev(gemm)], sort=False)}
    for key, c in comm.groupby([comm["rank"], dev(comm)], sort=False):
        g = by_dev.get(key)
        if g is None:
            continue
        starts = np.sort(g["start_ns"].to_numpy(np.int64))
        ends = np.sort(g["end_ns"].to_numpy(np.int64))
        cs, ce = c["start_ns"].to_numpy(np.int64), c["end_ns"].to_numpy(np.int64)
        i = np.searchsorted(starts, ce, side="left")  # first GEMM starting at or after the end
        after = (i < starts.size) & ((starts[np.minimum(i, starts.size - 1)] - ce) <= window_ns)
        j = np.searchsorted(ends, cs, side="right") - 1  # last GEMM ending at or before the start
        before = (j >= 0) & ((cs - ends[np.maximum(j, 0)]) <= window_ns)
        out.loc[c.index] = after | before
    return out


def _adjacent_fractions(kernels: pd.DataFrame, window_ns: int) -> dict[tuple[int, int], dict[str, float]]:
    """(rank, device) -> {collective kind: share of its kernel time next to a GEMM}."""
    comm = kernels[kernels["is_comm"]]
    if comm.empty:
        return {}
    t = pd.DataFrame({
        "rank": comm["rank"].astype("int64"),
        "dev": comm["device_id"].astype("Int64").fillna(-1).astype("int64"),
        "kind": rk.collective_kinds(comm),
        "dur": comm["dur_ns"].astype("int64"),
        "adj": comm["dur_ns"].where(gemm_neighbours(kernels, window_ns), 0).astype("int64"),
    })
    out: dict[tuple[int, int], dict[str, float]] = {}
    for (r, d, kind), g in t.groupby(["rank", "dev", "kind"], sort=False):
        total = int(g["dur"].sum())
        out.setdefault((int(r), int(d)), {})[str(kind)] = round(int(g["adj"].sum()) / total, 3) if total else 0.0
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
    k = with_peer_copies(with_range_collectives(ctx.kernels, ctx.trace), ctx.trace.memcpy)
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
    adj = _adjacent_fractions(k, int(rule["gemm_adjacent_ns"]))
    ev["kinds"] = [
        {kind: {**v, "gemm_adjacent_fraction": adj.get((int(r), int(d)), {}).get(kind, 0.0)} for kind, v in (kinds or {}).items()}
        for r, d, kinds in zip(ev["rank"], ev["device_id"], ev["kinds"])
    ]
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


_KIND_TITLES = {
    "all_reduce": "All-reduce", "all_gather": "All-gather", "reduce_scatter": "Reduce-scatter",
    "all_to_all": "All-to-all", "send_recv": "Send/recv", "broadcast": "Broadcast", "reduce": "Reduce",
    "peer_copy": "Peer-to-peer copy", "barrier": "Cross-GPU signal wait",
}


def choose_strategy(kind: str | None, facts: dict, rule: Rule) -> tuple[str, str]:
    """(situation, strategy id) for the exposed collective `kind`; the ids are data
    (rule.strategies, rules/exposed_comm.toml). The chunked collective + GEMM schedule only
    where the collective feeds or follows a GEMM; an MoE all-to-all and pipeline send/recv have
    remedies of their own; any other collective is overlapped with independent compute."""
    ids = rule.strategies
    if kind == "all_to_all":
        situation = "all_to_all"
    elif kind == "send_recv":
        situation = "send_recv"
    elif kind in _SCHEDULES and facts.get("gemm_adjacent_fraction", 0.0) >= rule["min_gemm_adjacent_fraction"]:
        situation = "gemm_adjacent"
    elif kind in ("peer_copy", "barrier"):  # the copy-engine transport of an overlapped schedule
        situation = "gemm_adjacent"
    else:
        situation = "no_gemm"
    return situation, ids.get(situation, rule.strategy)


def _suggestion(situation: str, kind: str | None, rule: Rule) -> dict:
    if situation == "gemm_adjacent":
        out = {"pattern": "chunked collective + GEMM on separate streams", "collective": kind}
        if kind in _SCHEDULES:
            out.update(schedule=_SCHEDULES[kind], chunks=int(rule["suggested_chunks"]))
        return out
    if situation == "all_to_all":
        return {"pattern": "overlap the MoE all-to-all (token dispatch/combine) with expert compute", "collective": kind,
                "try": "split the batch in two micro-batches and run one's dispatch/combine while the other's experts "
                       "compute (DualPipe, two-batch overlap); chunk the dispatch so expert GEMMs start on the first "
                       "tokens; give the all-to-all a fixed SM budget on its own stream (DeepEP)"}
    if situation == "send_recv":
        return {"pattern": "pipeline bubble: change the pipeline schedule", "collective": kind,
                "try": "interleaved 1F1B (virtual pipeline stages), a zero-bubble schedule, or more micro-batches per "
                       "step; send/recv of activations overlapped with the next micro-batch's compute"}
    return {"pattern": "issue the collective asynchronously and overlap it with independent compute", "collective": kind,
            "try": "DDP gradient bucketing (bucket_cap_mb) so early buckets reduce during backward; FSDP prefetch; "
                   "async_op=True with the wait moved to just before the first use"}


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
        evidence["exposed_transfer_ns"] = recoverable  # exposed minus waiting for peers (skew)
        evidence["bound_ns"] = savings
        evidence["wall_pool"] = "exposed_comm"  # not the device's idle time (diagnose.share_budgets)
        evidence["basis"] = (
            "exposed communication time (wall time on the device's critical path), less time spent waiting for "
            "peers where ranks are aligned, capped by the compute time on the device that could hide it"
        )
        situation, strategy = choose_strategy(top_kind, kinds.get(top_kind, {}), rule)
        suggestion = _suggestion(situation, top_kind, rule)
        if already:
            suggestion = {
                "pattern": "already overlapped: trim the exposed rest (first/last chunk, per-chunk signals, "
                "SMs the collective takes from the GEMM)",
                "collective": top_kind,
                "hidden_fraction": _num(hidden),
                "try": "fewer chunks; a copy-engine transport (kernels/comm_overlap.py transport='p2p'); "
                "replay the step from a CUDA graph if the GPU waits on the host",
            }
        name = _KIND_TITLES.get(top_kind or "", "Communication")
        # a finding about a rank's communication, not one launch row: every row field is given
        out.append(
            finding_for(
                rule,
                row,
                strategy=strategy,
                title=(f"{name} only partly hidden behind compute (already overlapped)" if already
                       else f"{name} not overlapped with compute"),
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
                evidence=evidence,
                suggestion=suggestion,
                savings_unit="wall",
            )
        )
    return out
