"""Several ranks on one clock, and what bounds a multi-rank step.

Each rank's profile is written against its own clock origin: Kineto adds its process's
`baseTimeNanoseconds`, nsys its session start, and processes on different hosts (or started
at different moments) disagree by microseconds to seconds. Comparing ranks needs one clock.

Alignment (`align_clocks`)
    A collective completes together: no rank's all-reduce/all-gather/reduce-scatter kernel
    can finish before the last rank's data has arrived, so the k-th instance of the same
    collective ends at about the same wall time on every rank, while its *start* is when
    that rank arrived (early ranks spin inside the kernel). Instances are matched by key
    (kernel name, lane, k): the lane is the order in which the rank's streams first ran that
    kernel name (stream ids need not agree across processes), and k counts the kernel's
    launches on that lane. For each rank r the offset that puts it on the reference rank's
    clock (the lowest rank with collectives) is the median over matched instances of
    ``end_ref - end_r``: the median ignores the few instances that a profiler delay or a
    mismatched pair throws off. ``spread_ns`` (median absolute deviation around the offset)
    says how well the ends agree after alignment. Point-to-point kernels (send/recv) are not
    used: a send and its receive involve two ranks only, and pipeline stages pair ranks
    differently. The match assumes every rank's profile starts at the same step (the usual
    torch.profiler schedule); a rank with a different number of instances is matched on
    the first ones and a note says so. No common collective, one rank only, or no
    collectives at all: offsets stay 0 and `status` says why.

Per rank and device (`per_rank`), on the rank's own clock
    comm_ns          wall time of communication kernels (NCCL/RCCL, custom all-reduce);
                     concurrent ones count once
    overlapped_ns    the part of it covered by compute kernels on the same device
    exposed_ns       comm_ns - overlapped_ns: time the device does nothing but communicate
    wait_ns          time spent inside collectives waiting for the last rank to arrive
                     (aligned start of the last arriver - own start, per instance); this is
                     load imbalance, which overlap cannot recover; exposed_wait_ns is its
                     part not covered by compute
    bubbles          gaps on the device with neither compute nor communication, at least
                     `min_bubble_ns` long (shorter ones are launch latency between dependent
                     kernels); copies do not fill a gap (the SMs are idle during them)
    work_ns          busy_ns - wait_ns: how long the rank was really working. The slowest
                     rank is the one with the most work (busy time when waits are unknown).

Critical path (`critical_path`), on the aligned clock, over the whole profiled window (a
trace of one step gives the step's path)
    Walk back from the end: start at the rank whose last kernel ends last; find the latest
    collective that rank took part in that ended before the current time; the time between
    that collective's end and the current time is the rank's own work (a compute segment:
    its compute busy time and idle time inside); the collective itself is on the path from
    the moment its last rank arrived to its end (a comm segment, naming that last rank);
    continue from the last arriver at its arrival time, until no earlier collective is
    left: the first segment is that rank's work from its first kernel. The path says which
    ranks' compute and which collectives bound the step: shortening anything off the path
    gains nothing.

Everything here is evidence (numbers); thresholds come in as arguments from the rule.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from . import intervals

# --------------------------------------------------------------------------- collective kinds

KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv", "broadcast", "reduce",
         "peer_copy", "barrier", "other")

# Order matters: the first pattern that matches names the kind ("ReduceScatter" is not a
# reduce, "AllReduce" is not a reduce).
_KIND_PATTERNS = (
    # copy-engine transports (symmetric memory, NVSHMEM, CUDA IPC): peer-to-peer copies, and
    # the signal kernels that order them across GPUs
    ("peer_copy", re.compile(r"memcpy ptop|^peer_copy$", re.I)),
    ("barrier", re.compile(r"(?:^|[^a-z])barrier_kernel|(?:put|wait)_signal_kernel", re.I)),
    ("reduce_scatter", re.compile(r"reduce_?scatter", re.I)),
    ("all_gather", re.compile(r"all_?gather", re.I)),
    # MoE expert-parallel dispatch/combine (DeepEP) is an all-to-all of tokens
    ("all_to_all", re.compile(r"all_?to_?all|::(?:intranode|internode(?:_ll)?)::\w*(?:dispatch|combine)", re.I)),
    ("all_reduce", re.compile(r"all_?reduce|cross_device_reduce|one_shot|two_shot", re.I)),
    ("send_recv", re.compile(r"send_?recv|(?:^|[^a-z])(?:send|recv)(?:[^a-z]|$)|sendkernel|recvkernel", re.I)),
    ("broadcast", re.compile(r"broadcast", re.I)),
    ("reduce", re.compile(r"reduce", re.I)),
)

# Kinds whose instances complete together on every rank of the group (used for alignment). A
# peer copy is one-sided: the GPU it reads from takes no part in it.
_TOGETHER = frozenset(k for k in KINDS if k not in ("send_recv", "peer_copy"))

# Optional per-kernel message facts (Kineto `Collective name`, `In msg nelems`,
# `Out msg nelems`, `dtype`, `Group size` kernel args). Used when the kernels frame has them.
SIZE_COLUMNS = ("comm_name", "comm_in_nelems", "comm_out_nelems", "comm_dtype", "comm_group_size")

# Kineto's dtype spellings (c10 ScalarType names) -> bytes per element.
ELEMENT_BYTES = {
    "float": 4, "float32": 4, "double": 8, "float64": 8, "half": 2, "float16": 2, "bfloat16": 2,
    "long": 8, "int64": 8, "int": 4, "int32": 4, "short": 2, "int16": 2, "char": 1, "int8": 1,
    "byte": 1, "uint8": 1, "bool": 1, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "float8_e4m3fnuz": 1, "float8_e5m2fnuz": 1,
}


def collective_kind(name: object) -> str:
    """all_reduce | all_gather | reduce_scatter | all_to_all | send_recv | broadcast | reduce
    | peer_copy | barrier | other, from a communication kernel's name (or Kineto's
    `Collective name`; peer copies are named `Memcpy PtoP`)."""
    text = str(name or "")
    for kind, pat in _KIND_PATTERNS:
        if pat.search(text):
            return kind
    return "other"


def collective_kinds(comm: pd.DataFrame) -> pd.Series:
    """Kind per communication kernel: Kineto's collective name when the frame has it (it
    tells all_to_all from the send/recv kernels NCCL runs it with), else the kernel name."""
    names = comm["name"].fillna("").astype(str)
    uniq = pd.unique(names)
    by_name = pd.Series([collective_kind(n) for n in uniq], index=uniq)
    kind = pd.Series(by_name.reindex(names.to_numpy()).to_numpy(), index=comm.index, dtype="object")
    if "comm_name" in comm.columns:
        cn = comm["comm_name"]
        has = cn.notna() & (cn.astype("string").str.len() > 0)
        if has.any():
            from_arg = cn[has].astype(str).map(collective_kind)
            known = from_arg != "other"
            kind.loc[from_arg.index[known]] = from_arg[known]
    return kind


def message_bytes(comm: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    """(in_bytes, out_bytes) per communication kernel, NA where the trace does not say."""
    na = pd.Series(pd.array([pd.NA] * len(comm), dtype="Int64"), index=comm.index)
    if not {"comm_in_nelems", "comm_out_nelems", "comm_dtype"} <= set(comm.columns):
        return na, na.copy()
    elt = comm["comm_dtype"].astype("string").str.lower().map(ELEMENT_BYTES)
    elt = pd.to_numeric(elt, errors="coerce").astype("Int64")
    nin = pd.to_numeric(comm["comm_in_nelems"], errors="coerce").astype("Int64")
    nout = pd.to_numeric(comm["comm_out_nelems"], errors="coerce").astype("Int64")
    return nin * elt, nout * elt


# --------------------------------------------------------------------------- alignment


@dataclass(frozen=True)
class Alignment:
    """Per-rank clock offsets: add offsets_ns[rank] to a rank's times to put them on the
    reference rank's clock.

    status: "aligned" (every rank with collectives matched the reference), "partial" (some
    did not: their offset is 0), "unaligned" (several ranks, none matched), "unrelated" (the
    files are not one run: not aligned on purpose), "single_rank" or "no_collectives"
    (nothing to align). `reason` is one sentence for the report.
    """

    offsets_ns: dict[int, int]
    reference_rank: int | None
    status: str
    reason: str
    matched: dict[int, int] = field(default_factory=dict)
    spread_ns: dict[int, int] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    def offset(self, rank: int) -> int:
        return int(self.offsets_ns.get(int(rank), 0))

    def aligned(self, rank: int) -> bool:
        """True when the rank's times can be compared with other ranks'."""
        if self.status == "single_rank":
            return True
        return int(rank) == self.reference_rank or int(rank) in self.matched

    @property
    def comparable(self) -> bool:
        """True when cross-rank numbers (waits, critical path) mean something."""
        return self.status in ("aligned", "single_rank")


def instance_keys(comm: pd.DataFrame) -> pd.DataFrame:
    """`comm` (communication kernels) with `lane` and `seq`: the k-th launch of a kernel name
    on the rank's lane-th stream that ran that name (first appearance order)."""
    if comm.empty:
        return comm.assign(lane=pd.Series(dtype="int64"), seq=pd.Series(dtype="int64"))
    c = comm.assign(_stream=comm["stream_id"].astype("Int64").fillna(-1).astype("int64"), _name=comm["name"].fillna("").astype(str))
    c = c.sort_values(["rank", "start_ns", "end_ns"], kind="stable")
    first = c.groupby(["rank", "_name", "_stream"], sort=False)["start_ns"].transform("min")
    c["lane"] = (
        c.assign(_first=first).groupby(["rank", "_name"], sort=False)["_first"].rank(method="dense").astype("int64") - 1
    )
    c["seq"] = c.groupby(["rank", "_name", "lane"], sort=False).cumcount().astype("int64")
    return c.drop(columns=["_stream"]).rename(columns={"_name": "key_name"})


def align_clocks(comm: pd.DataFrame, ranks: list[int] | None = None, min_matches: int = 1) -> Alignment:
    """Offsets that put every rank on the reference rank's clock, from the ends of matched
    collective instances. `comm` holds communication kernels (rank, name, stream_id,
    start_ns, end_ns; `kind` optional); `ranks` every rank of the trace."""
    all_ranks = sorted(set(int(r) for r in (ranks if ranks is not None else comm["rank"].unique())))
    zero = {r: 0 for r in all_ranks}
    if len(all_ranks) <= 1:
        return Alignment(zero, all_ranks[0] if all_ranks else None, "single_rank", "one rank: nothing to align")
    kind = comm["kind"] if "kind" in comm.columns else collective_kinds(comm)
    usable = comm[kind.isin(_TOGETHER)]
    if usable.empty:
        return Alignment(zero, None, "no_collectives", "no collective kernels (send/recv are not used to align): clocks taken as recorded")
    keyed = instance_keys(usable)
    with_comm = sorted(int(r) for r in keyed["rank"].unique())
    ref = with_comm[0]
    key = ["key_name", "lane", "seq"]
    ref_rows = keyed[keyed["rank"] == ref][key + ["end_ns"]].rename(columns={"end_ns": "ref_end"})
    offsets, matched, spread, notes = dict(zero), {}, {}, []
    counts = keyed.groupby(["rank", "key_name"]).size()
    for r in all_ranks:
        if r == ref:
            continue
        mine = keyed[keyed["rank"] == r][key + ["end_ns"]]
        j = mine.merge(ref_rows, on=key, how="inner")
        if len(j) < max(1, min_matches):
            why = "no collectives" if mine.empty else f"{len(j)} collective(s) in common with rank {ref}"
            notes.append(f"rank {r}: {why}, clock taken as recorded")
            continue
        d = (j["ref_end"] - j["end_ns"]).to_numpy(dtype=np.int64)
        off = int(np.round(np.median(d)))
        offsets[r] = off
        matched[r] = int(len(j))
        spread[r] = int(np.round(np.median(np.abs(d - off))))
        for name in mine["key_name"].unique():
            n_r, n_ref = int(counts.get((r, name), 0)), int(counts.get((ref, name), 0))
            if n_r != n_ref:
                notes.append(f"rank {r} ran {n_r} instance(s) of {name[:60]}, rank {ref} {n_ref}: matched the first {min(n_r, n_ref)}")
    others = [r for r in all_ranks if r != ref]
    if all(r in matched for r in others):
        status = "aligned"
        reason = f"ranks aligned on rank {ref}'s clock by the ends of {min(matched.values())}+ common collectives"
    elif matched:
        status = "partial"
        missing = ", ".join(str(r) for r in others if r not in matched)
        reason = f"rank(s) {missing} share no collective with rank {ref}: their clocks are taken as recorded"
    else:
        status = "unaligned"
        reason = f"no rank shares a collective with rank {ref}: clocks taken as recorded, cross-rank waits unknown"
    return Alignment(offsets, ref, status, reason, matched, spread, tuple(notes[:8]))


# --------------------------------------------------------------------------- instances


def _offsets(ranks: pd.Series, alignment: Alignment) -> pd.Series:
    return ranks.map(alignment.offsets_ns).fillna(0).astype("int64")


def collective_instances(comm: pd.DataFrame, alignment: Alignment) -> pd.DataFrame:
    """One row per (collective instance, rank) on the aligned clock, index = the kernel's.

    Columns: rank, device_id, key_name, lane, seq, kind, start_ns, end_ns (aligned),
    local_start_ns, group_start_ns (the last arrival), group_end_ns (the last end),
    last_rank (who arrived last), ranks_in (ranks that ran this instance), wait_ns (time this
    rank waited in the kernel for the last arrival; 0 when clocks are not comparable)."""
    cols = ["rank", "device_id", "key_name", "lane", "seq", "kind", "start_ns", "end_ns", "local_start_ns",
            "group_start_ns", "group_end_ns", "last_rank", "ranks_in", "wait_ns"]
    if comm.empty:
        return pd.DataFrame(columns=cols)
    kind = comm["kind"] if "kind" in comm.columns else collective_kinds(comm)
    c = instance_keys(comm.assign(kind=kind))
    off = _offsets(c["rank"], alignment)
    c["local_start_ns"] = c["start_ns"]
    c["start_ns"] = c["start_ns"] + off
    c["end_ns"] = c["end_ns"] + off
    key = ["key_name", "lane", "seq"]
    g = c.groupby(key, sort=False)
    c["group_start_ns"] = g["start_ns"].transform("max")
    c["group_end_ns"] = g["end_ns"].transform("max")
    c["ranks_in"] = g["rank"].transform("nunique").astype("int64")
    # Ties (perfectly balanced ranks) go to the lowest rank: deterministic.
    last = c.sort_values(["start_ns", "rank"], ascending=[False, True], kind="stable").drop_duplicates(key)
    c = c.merge(last[key + ["rank"]].rename(columns={"rank": "last_rank"}), on=key, how="left").set_index(c.index)
    if alignment.comparable:
        wait = (c["group_start_ns"] - c["start_ns"]).clip(lower=0)
        wait = np.minimum(wait, c["end_ns"] - c["start_ns"])
        # point-to-point kernels pair two ranks differently at each pipeline stage: no wait
        c["wait_ns"] = wait.where(c["kind"].isin(_TOGETHER), 0).astype("int64")
    else:
        c["wait_ns"] = 0
    return c[cols]


# --------------------------------------------------------------------------- per rank


def _kind_table(comm: pd.DataFrame, ms: np.ndarray, me: np.ndarray) -> dict[str, dict]:
    """Per collective kind: count, total/exposed ns, top kernel and message sizes if known."""
    if comm.empty:
        return {}
    cov = intervals.overlap(comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy(), ms, me)
    inb, outb = message_bytes(comm)
    t = pd.DataFrame(
        {"kind": comm["kind"].to_numpy(), "name": comm["name"].fillna("").astype(str).to_numpy(),
         "dur_ns": comm["dur_ns"].to_numpy(), "exposed_ns": comm["dur_ns"].to_numpy() - cov,
         "in_bytes": inb.to_numpy(), "out_bytes": outb.to_numpy(),
         "group": (pd.to_numeric(comm["comm_group_size"], errors="coerce").to_numpy()
                   if "comm_group_size" in comm.columns else np.full(len(comm), np.nan))}
    )
    out = {}
    for kind, g in t.groupby("kind", sort=False):
        row = {
            "count": int(len(g)),
            "total_ns": int(g["dur_ns"].sum()),
            "exposed_ns": int(g["exposed_ns"].sum()),
            "top_kernel": str(g.groupby("name")["exposed_ns"].sum().idxmax()),
        }
        sized = g[g["in_bytes"].notna() & g["out_bytes"].notna()]
        if len(sized):
            msg = np.maximum(sized["in_bytes"].astype("int64"), sized["out_bytes"].astype("int64"))
            row["sized"] = int(len(sized))
            row["median_in_bytes"] = int(np.median(sized["in_bytes"].astype("int64")))
            row["median_out_bytes"] = int(np.median(sized["out_bytes"].astype("int64")))
            row["total_bytes"] = int(msg.sum())
            dur = int(sized["dur_ns"].sum())
            # algorithm bandwidth: the larger of input/output over kernel time (NCCL's algbw)
            row["algbw_gbps"] = round(float(msg.sum()) / dur, 2) if dur > 0 else None
        groups = pd.to_numeric(g["group"], errors="coerce").dropna()
        if len(groups):
            row["group_size"] = int(groups.median())
        out[str(kind)] = row
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["exposed_ns"]))


def per_rank(kernels: pd.DataFrame, instances: pd.DataFrame, min_bubble_ns: int) -> pd.DataFrame:
    """Per (rank, device): communication, overlap, exposure, waits, bubbles (module doc).
    `kernels` needs is_comm and, for comm rows, kind; times on the rank's own clock."""
    rows = []
    if kernels.empty:
        return pd.DataFrame(rows)
    dev = kernels["device_id"].astype("Int64").fillna(-1).astype("int64")
    for (rank, device_id), g in kernels.groupby([kernels["rank"], dev], sort=True):
        comm = g[g["is_comm"]]
        compute = g[~g["is_comm"]]
        ms, me = intervals.merge(compute["start_ns"].to_numpy(), compute["end_ns"].to_numpy())
        cs, ce = intervals.merge(comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy())
        bs, be = intervals.merge(g["start_ns"].to_numpy(), g["end_ns"].to_numpy())
        comm_ns = int((ce - cs).sum())
        overlapped = int(intervals.overlap(cs, ce, ms, me).sum())
        busy = int((be - bs).sum())
        span = int(be[-1] - bs[0]) if bs.size else 0
        gaps = bs[1:] - be[:-1]
        bubbles = gaps[gaps >= max(1, int(min_bubble_ns))]
        inst = instances.loc[instances.index.intersection(comm.index)] if len(instances) else instances
        if len(inst):
            ws = inst["local_start_ns"].to_numpy(dtype=np.int64)
            we = ws + inst["wait_ns"].to_numpy(dtype=np.int64)
            keep = we > ws
            wms, wme = intervals.merge(ws[keep], we[keep])
            wait = int((wme - wms).sum())
            wait_covered = int(intervals.overlap(wms, wme, ms, me).sum())
            last_arrivals = int(((inst["last_rank"] == rank) & (inst["ranks_in"] > 1)).sum())
        else:
            wait, wait_covered, last_arrivals = 0, 0, 0
        rows.append(
            {
                "rank": int(rank),
                "device_id": int(device_id),
                "comm_kernels": int(len(comm)),
                "comm_ns": comm_ns,
                "overlapped_ns": overlapped,
                "exposed_ns": comm_ns - overlapped,
                "compute_ns": int((me - ms).sum()),
                "busy_ns": busy,
                "span_ns": span,
                "idle_ns": span - busy,
                "bubbles": int(bubbles.size),
                "bubble_ns": int(bubbles.sum()),
                "largest_bubble_ns": int(bubbles.max()) if bubbles.size else 0,
                "wait_ns": wait,
                "exposed_wait_ns": wait - wait_covered,
                "work_ns": busy - wait,
                "last_arrivals": last_arrivals,
                "exposed_fraction": (comm_ns - overlapped) / busy if busy else float("nan"),
                "kinds": _kind_table(comm, ms, me),
            }
        )
    return pd.DataFrame(rows)


def slowest_rank(stats: pd.DataFrame) -> int | None:
    """The rank with the most work (busy minus waiting; busy time when waits are unknown)."""
    if stats.empty:
        return None
    per = stats.groupby("rank")[["work_ns", "busy_ns"]].sum()
    return int(per.sort_values(["work_ns", "busy_ns"], ascending=False, kind="stable").index[0])


# --------------------------------------------------------------------------- critical path


def critical_path(kernels: pd.DataFrame, instances: pd.DataFrame, alignment: Alignment) -> pd.DataFrame:
    """The chain of compute and communication segments that bounds the window (module doc),
    oldest first. Columns: kind ("compute" | "comm"), rank, start_ns, end_ns, dur_ns (aligned
    clock), busy_ns (compute kernels' busy time inside a compute segment; the segment for a
    comm one), collective (kind of a comm segment), name, last_rank. Empty when clocks are
    not comparable or there are no kernels."""
    cols = ["kind", "rank", "start_ns", "end_ns", "dur_ns", "busy_ns", "collective", "name", "last_rank"]
    if kernels.empty or not alignment.comparable:
        return pd.DataFrame(columns=cols)
    off = _offsets(kernels["rank"], alignment)
    k = kernels.assign(a_start=kernels["start_ns"] + off, a_end=kernels["end_ns"] + off)
    compute = {}
    for rank, g in k[~k["is_comm"]].groupby("rank"):
        ms, me = intervals.merge(g["a_start"].to_numpy(), g["a_end"].to_numpy())
        compute[int(rank)] = (ms, me, np.concatenate([[0], np.cumsum(me - ms)]))
    first = k.groupby("rank")["a_start"].min()
    last = k.groupby("rank")["a_end"].max()

    def covered(rank: int, t: int) -> int:
        ms, me, cum = compute[rank]
        i = int(np.searchsorted(ms, t, side="right")) - 1
        return 0 if i < 0 else int(cum[i] + min(t, me[i]) - ms[i])

    def busy(rank: int, a: int, b: int) -> int:
        """Compute busy time of `rank` inside [a, b) (one binary search per end)."""
        if b <= a or rank not in compute or compute[rank][0].size == 0:
            return 0
        return covered(rank, b) - covered(rank, a)

    # Per rank, its instances as arrays sorted by (aligned) end: each step of the walk is a
    # binary search, so long traces with many collectives stay O(n log n).
    by_rank = {}
    if len(instances):
        inst = instances.sort_values(["end_ns", "group_end_ns"], kind="stable")
        for r, g in inst.groupby("rank", sort=False):
            by_rank[int(r)] = {
                "end": g["end_ns"].to_numpy(dtype=np.int64),
                "g0": g["group_start_ns"].to_numpy(dtype=np.int64),
                "g1": g["group_end_ns"].to_numpy(dtype=np.int64),
                "last": g["last_rank"].to_numpy(dtype=np.int64),
                "kind": g["kind"].astype(str).to_numpy(),
                "name": g["key_name"].astype(str).to_numpy(),
            }
    rank = int(last.sort_values(ascending=False, kind="stable").index[0])
    t = int(last[rank])
    segs = []
    for _ in range(len(instances) + 1):  # t strictly decreases: at most one step per instance
        mine = by_rank.get(rank)
        i = -1
        if mine is not None:
            # latest collective of this rank that ended by t and whose last rank arrived before t
            i = int(np.searchsorted(mine["end"], t, side="right")) - 1
            while i >= 0 and mine["g0"][i] >= t:
                i -= 1
        if i < 0:
            a = int(min(first[rank], t))
            segs.append(("compute", rank, a, t, busy(rank, a, t), None, None, None))
            break
        g0, g1 = int(mine["g0"][i]), int(mine["g1"][i])
        # the collective is over at the last rank's end (clamped: alignment noise may put
        # another rank's end a little after this rank's next work started)
        done = max(min(max(g1, int(mine["end"][i])), t), g0)
        if t > done:
            segs.append(("compute", rank, done, t, busy(rank, done, t), None, None, None))
        nxt = int(mine["last"][i])
        segs.append(("comm", nxt, g0, done, None, str(mine["kind"][i]), str(mine["name"][i]), nxt))
        rank, t = nxt, g0
    rows = []
    for kind, r, a, b, bz, coll, name, lr in reversed(segs):
        rows.append({"kind": kind, "rank": r, "start_ns": a, "end_ns": b, "dur_ns": b - a,
                     "busy_ns": (b - a) if bz is None else bz, "collective": coll, "name": name, "last_rank": lr})
    return pd.DataFrame(rows, columns=cols)


def path_summary(path: pd.DataFrame) -> dict:
    """Small, JSON-safe digest of a critical path for a finding's evidence."""
    if path.empty:
        return {}
    comp = path[path["kind"] == "compute"]
    comm = path[path["kind"] == "comm"]
    span = int(path["end_ns"].max() - path["start_ns"].min())
    compute_busy = int(comp["busy_ns"].sum())
    comm_ns = int(comm["dur_ns"].sum())
    by_rank = comp.groupby("rank")["busy_ns"].sum().sort_values(ascending=False)
    by_kind = comm.groupby("collective")["dur_ns"].sum().sort_values(ascending=False)
    return {
        "span_ns": span,
        "compute_ns": compute_busy,
        "comm_ns": comm_ns,
        "idle_ns": max(0, span - compute_busy - comm_ns),
        "collectives": int(len(comm)),
        "compute_by_rank": {str(int(r)): int(v) for r, v in by_rank.head(8).items()},
        "comm_by_kind": {str(k): int(v) for k, v in by_kind.items()},
        "last_arrivals": {str(int(r)): int(v) for r, v in comm["last_rank"].value_counts().head(8).items()},
    }


# --------------------------------------------------------------------------- all together


@dataclass
class RankAnalysis:
    alignment: Alignment
    stats: pd.DataFrame  # per (rank, device): per_rank()
    instances: pd.DataFrame  # per (collective instance, rank)
    path: pd.DataFrame  # critical_path()
    slowest_rank: int | None

    @property
    def path_summary(self) -> dict:
        return path_summary(self.path)


def analyze(kernels: pd.DataFrame, *, min_matches: int = 1, min_bubble_ns: int = 10_000,
            unrelated: str | None = None) -> RankAnalysis:
    """Everything above for `kernels` (trace.kernels with an `is_comm` column). `unrelated`
    (why the ranks are not one run, see advisor.traces.runs) skips the alignment: each rank
    keeps its own clock and no cross-rank figure is computed. The slowest rank is named only
    when every rank's clock is aligned."""
    ranks = sorted(int(r) for r in kernels["rank"].unique()) if len(kernels) else []
    comm = kernels[kernels["is_comm"]] if len(kernels) else kernels
    comm = comm.assign(kind=collective_kinds(comm)) if len(comm) else comm.assign(kind=pd.Series(dtype="object"))
    if unrelated and len(ranks) > 1:
        alignment = Alignment({r: 0 for r in ranks}, None, "unrelated", f"not one run ({unrelated}): clocks not aligned")
    else:
        alignment = align_clocks(comm, ranks, min_matches=min_matches)
    inst = collective_instances(comm, alignment)
    k = kernels.copy()
    k.loc[comm.index, "kind"] = comm["kind"]
    stats = per_rank(k, inst, min_bubble_ns)
    path = critical_path(kernels, inst, alignment)
    slowest = slowest_rank(stats) if alignment.status == "aligned" else None
    return RankAnalysis(alignment, stats, inst, path, slowest)
