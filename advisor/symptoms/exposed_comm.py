"""exposed_comm: collective communication not hidden behind compute, per rank.

What it detects: NCCL/RCCL kernels whose time is not covered by compute kernels running at the
same moment on the same device (other streams). Per rank: communication time, overlapped
time, exposed time, and its share of the device's busy time. Why it matters: exposed
communication is time every rank waits; in tensor/pipeline parallel steps it is the bubble.
What to do: chunk the collective and the GEMM so chunk i+1's collective runs while GEMM i
computes. Estimated recoverable time: the exposed communication, bounded by the compute time
available to hide it.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from ..findings import Finding
from ..rules import Rule
from . import intervals
from .context import Context, as_int

SYMPTOM = "exposed_comm"
REQUIRES = ()


def evidence(ctx: Context, rule: Rule) -> pd.DataFrame:
    k = ctx.kernels
    rows = []
    if k.empty or not k["is_comm"].any():
        return pd.DataFrame(rows)
    dev = k["device_id"].fillna(-1).astype("int64")
    for (rank, device_id), g in k.groupby([k["rank"], dev], sort=False):
        comm = g[g["is_comm"]]
        if comm.empty:
            continue
        compute = g[~g["is_comm"]]
        ms, me = intervals.merge(compute["start_ns"].to_numpy(), compute["end_ns"].to_numpy())
        ov = intervals.overlap(comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy(), ms, me)
        # Communication kernels can overlap each other (several streams): count wall time once.
        cs, ce = intervals.merge(comm["start_ns"].to_numpy(), comm["end_ns"].to_numpy())
        comm_wall = int((ce - cs).sum())
        comm_overlapped = int((intervals.overlap(cs, ce, ms, me)).sum())
        exposed = comm_wall - comm_overlapped
        busy = intervals.total(g["start_ns"].to_numpy(), g["end_ns"].to_numpy())
        per_name = (
            comm.assign(exposed_ns=comm["dur_ns"].to_numpy() - ov)
            .groupby("name")[["dur_ns", "exposed_ns"]]
            .sum()
            .sort_values("exposed_ns", ascending=False)
        )
        rows.append(
            {
                "rank": int(rank),
                "device_id": int(device_id),
                "comm_kernels": int(len(comm)),
                "comm_ns": comm_wall,
                "overlapped_ns": comm_overlapped,
                "exposed_ns": int(exposed),
                "compute_ns": int((me - ms).sum()),
                "busy_ns": int(busy),
                "exposed_fraction": exposed / busy if busy else np.nan,
                "top_kernel": str(per_name.index[0]),
                "collectives": {str(n): {"count": int((comm["name"] == n).sum()), "total_ns": int(v["dur_ns"]), "exposed_ns": int(v["exposed_ns"])} for n, v in per_name.head(5).iterrows()},
            }
        )
    return pd.DataFrame(rows)


def judge(ev: pd.DataFrame, rule: Rule, ctx: Context) -> list[Finding]:
    out = []
    for row in ev.to_dict("records") if len(ev) else []:
        if row["exposed_fraction"] < rule["min_exposed_fraction"] or row["exposed_ns"] < rule["min_exposed_ns"]:
            continue
        savings = min(row["exposed_ns"], row["compute_ns"])
        if savings < rule["min_savings_ns"]:
            continue
        out.append(
            Finding(
                symptom=SYMPTOM,
                strategy=rule.strategy,
                title=rule.title,
                kernel=row["top_kernel"],
                rank=as_int(row["rank"]),
                device_id=None if row["device_id"] < 0 else int(row["device_id"]),
                shape=None,
                grid=None,
                block=None,
                launches=int(row["comm_kernels"]),
                total_ns=int(row["comm_ns"]),
                est_savings_ns=int(savings),
                confidence="medium",
                watch_for=rule.watch_for,
                evidence={
                    "comm_ns": int(row["comm_ns"]),
                    "overlapped_ns": int(row["overlapped_ns"]),
                    "exposed_ns": int(row["exposed_ns"]),
                    "exposed_fraction": round(float(row["exposed_fraction"]), 3),
                    "compute_ns": int(row["compute_ns"]),
                    "collectives": row["collectives"],
                },
                suggestion={"pattern": "chunked collective + GEMM on separate streams"},
            )
        )
    return out
