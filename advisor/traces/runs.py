"""Are several trace files the ranks of one run?

`load_trace` reads one file per rank and lines their clocks up on common collectives; files
from different runs would be read as ranks of one anyway, and cross-rank figures (waits,
slowest rank, critical path) computed between them would be fiction. The files are taken as
one run unless one of these says otherwise:

- identical content: the same profile given twice (copied or renamed) is one rank, not two;
- colliding ranks: two files that declare the same rank (Kineto `distributedInfo.rank`);
- different device kinds: the GPUs that ran kernels have different model names in different
  files (a run mixes GPU models almost never; two runs on two machines often);
- clocks that never meet: each file's activity window is more than `MAX_CLOCK_GAP_NS` away
  from the first file's. Ranks of one run are profiled over the same steps, so their windows
  overlap up to the hosts' clock disagreement (microseconds to seconds, which the collective
  alignment then removes); a gap of minutes to years means different runs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Sequence

from ..model import Trace

# Hosts of one job disagree by microseconds (NTP/PTP) to a few seconds (no time sync); nsys
# times each capture from its own session start, so per-rank captures of one job also start
# within seconds of each other. 60 s is well beyond both and far below the gap between runs
# on different days (the corpus pairs that were misread as one run: 1.2 years and more).
MAX_CLOCK_GAP_NS = 60 * 10**9


def file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _window(t: Trace) -> tuple[int, int] | None:
    lo, hi = [], []
    for df in (t.kernels, t.runtime, t.memcpy):
        if len(df):
            lo.append(int(df["start_ns"].min()))
            hi.append(int(df["end_ns"].max()))
    return (min(lo), max(hi)) if lo else None


def _device_kinds(t: Trace) -> frozenset[str]:
    """Model names of the devices that ran kernels (all listed devices if none did)."""
    d = t.devices
    if d.empty:
        return frozenset()
    ran = set(t.kernels["device_id"].dropna().astype(int)) if len(t.kernels) else set()
    if ran:
        d = d[d["device_id"].isin(ran)]
    return frozenset(str(n).strip() for n in d["name"].dropna() if str(n).strip())


def _gap_s(a: tuple[int, int], b: tuple[int, int]) -> float:
    return max(0, max(a[0], b[0]) - min(a[1], b[1])) / 1e9


def _span(gap_s: float) -> str:
    for unit, sec in (("days", 86400), ("hours", 3600), ("minutes", 60)):
        if gap_s >= 2 * sec:
            return f"{gap_s / sec:.0f} {unit}"
    return f"{gap_s:.0f} s"


def unrelated_reasons(traces: Sequence[Trace], paths: Sequence[Path], digests: Sequence[str]) -> list[str]:
    """Why the files are not the ranks of one run (empty when nothing says so)."""
    if len(traces) < 2:
        return []
    names = [p.name for p in paths]
    out: list[str] = []
    seen: dict[str, int] = {}
    for i, dg in enumerate(digests):
        j = seen.setdefault(dg, i)
        if j != i:
            out.append(f"{names[i]} has the same content as {names[j]} (one profile given twice)")
    declared: dict[int, int] = {}
    for i, t in enumerate(traces):
        r = t.meta.get("declared_rank")
        if r is None:
            continue
        j = declared.setdefault(int(r), i)
        if j != i:
            out.append(f"{names[j]} and {names[i]} both declare rank {int(r)} (distributedInfo)")
    kinds = [_device_kinds(t) for t in traces]
    ref = next((i for i, k in enumerate(kinds) if k), None)
    if ref is not None:
        for i, k in enumerate(kinds):
            if k and i != ref and not (k & kinds[ref]):
                out.append(f"{names[ref]} ran on {', '.join(sorted(kinds[ref]))} but {names[i]} on {', '.join(sorted(k))}")
    windows = [_window(t) for t in traces]
    ref = next((i for i, w in enumerate(windows) if w is not None), None)
    if ref is not None:
        for i, w in enumerate(windows):
            if w is None or i == ref:
                continue
            gap = _gap_s(windows[ref], w)
            if gap * 1e9 > MAX_CLOCK_GAP_NS:
                out.append(f"the clocks of {names[ref]} and {names[i]} never meet ({_span(gap)} apart)")
    return out
