"""Interval arithmetic on sorted numpy arrays (vectorised: traces can hold millions)."""

from __future__ import annotations

import numpy as np


def merge(starts, ends) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint, sorted union of [start, end) intervals."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    if s.size == 0:
        return s, e
    if s.size > 1 and not bool(np.all(s[1:] >= s[:-1])):  # (a trace's activities usually come sorted)
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        del order
    run_end = np.maximum.accumulate(e)
    # A new block starts where the start is past every earlier end.
    new = np.empty(s.size, dtype=bool)
    new[0] = True
    new[1:] = s[1:] > run_end[:-1]
    idx = np.flatnonzero(new)
    del new
    if idx.size == s.size:  # no two overlap: the starts and running ends are the blocks (no copies)
        return s, run_end
    ms = s[idx]
    # each block ends at the running end just before the next block starts (idx shifted by
    # one in place: the temporaries of run_end[idx[1:] - 1] and np.append were ~16 bytes an
    # interval at the peak of the gate)
    idx[:-1] = idx[1:]
    idx[:-1] -= 1
    idx[-1] = s.size - 1
    me = run_end[idx]
    return ms, me


def total(starts, ends) -> int:
    """Length of the union of [start, end) intervals: the span from the first start to the
    last end, less the uncovered gaps (merge()'s blocks never built: two arrays, not five)."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    if s.size == 0:
        return 0
    if s.size > 1 and not bool(np.all(s[1:] >= s[:-1])):
        order = np.argsort(s, kind="stable")
        s, e = s[order], e[order]
        del order
    run_end = np.maximum.accumulate(e)
    gaps = s[1:] - run_end[:-1]
    np.maximum(gaps, 0, out=gaps)
    return int(run_end[-1] - s[0] - int(gaps.sum()))


def covered_before(ms: np.ndarray, me: np.ndarray, t) -> np.ndarray:
    """For merged intervals (ms, me): covered length in (-inf, t) for each t."""
    t = np.asarray(t, dtype=np.int64)
    if ms.size == 0:
        return np.zeros(t.shape, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(me - ms)])
    i = np.searchsorted(ms, t, side="right") - 1
    inside = np.where(i >= 0, np.minimum(t, me[np.clip(i, 0, None)]) - ms[np.clip(i, 0, None)], 0)
    return np.where(i >= 0, cum[np.clip(i, 0, None)] + np.maximum(inside, 0), 0)


def overlap(starts, ends, ms: np.ndarray, me: np.ndarray) -> np.ndarray:
    """Length of each [start, end) covered by the merged intervals (ms, me)."""
    s = np.asarray(starts, dtype=np.int64)
    e = np.asarray(ends, dtype=np.int64)
    return covered_before(ms, me, e) - covered_before(ms, me, s)
