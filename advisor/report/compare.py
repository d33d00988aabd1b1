"""Before and after, end to end: what a change did to a program's step, from two traces.

    from advisor.report.compare import compare
    c = compare(advisor.load_trace(["before.nsys-rep"]), advisor.load_trace(["after.json.gz"]))
    c.verdict, c.speedup, c.to_dict()

Each side is cut into steps: Kineto's `ProfilerStep#N` annotations, else NVTX / user ranges
named like a step or iteration (`step`, `train_step 3`, `iteration#7`), else the whole
captured window is one step. Per step: wall time, GPU busy time, GPU time per kernel class
(advisor.symptoms.kernel_class), launches; per kernel, the change matched by GEMM shape (when the
trace names it) or by name family; and the findings of advisor.diagnose.diagnosis.diagnose on both sides,
matched by symptom, kernel family and shape into resolved / new / remaining.

The verdict is `faster`, `slower`, `same` or `not_comparable`. `same` means the change is
inside the noise the traces themselves show: the robust spread of per-step times within each
side (1.4826 x MAD / median), combined as two standard errors of the difference of the two
medians, and never below NOISE_FLOOR. With one step per side there is no step spread, so the
spread of repeated launches of the same kernel (same family, shape and grid) stands in: how
much the GPU itself varies on identical work. Sides recorded by different profilers (nsys
against the PyTorch profiler) are judged on GPU busy time, since each profiler adds its own
host overhead to the wall time. Traces of different devices, different rank counts, or with
no work in common (no GEMM shape, kernel family, operator or range name shared) are
`not_comparable`, and the result says why.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from ..devices import devices_table
from ..diagnose.diagnosis import Diagnosis, diagnose
from ..errors import AdvisorError
from ..findings import Finding
from ..model import Trace
from ..symptoms import intervals
from ..symptoms.context import Context
from ..symptoms.gemm import _launch_points
from ..symptoms.kernel_class import CLASSES, classify, families, family

# A change smaller than this is never called faster or slower: repeated medians of the same
# GEMM timing on the H200 differed by 1-3% (advisor.run.loop.NOISE_MARGIN is 3% for kernels).
NOISE_FLOOR = 0.02
# Standard errors of the difference of medians that make a change real (about 95%).
NOISE_Z = 2.0
# Below this share of work in common (Jaccard index of kernel families, operator names or
# range names, whichever is highest) two traces are taken for different programs: an
# optimisation changes some kernels (tail -> Stream-K, a chunked collective), not all of the
# model's elementwise, norm and copy kernels at once.
MIN_WORK_OVERLAP = 0.1
# Repeated launches needed before a kernel's duration spread counts as noise evidence.
MIN_REPEATS = 3
# Robust standard deviation of a normal sample from its median absolute deviation.
MAD_TO_SD = 1.4826

_STEP_NAME = re.compile(
    r"^\s*(?:profilerstep#\d+|(?:train(?:ing)?[ _.:-]?)?(?:step|iter|iteration)(?:[ _#:.-]*\d+)?)\s*$", re.I
)
_PROFILER_STEP = re.compile(r"^ProfilerStep#\d+$")
_OP_RANGE = re.compile(r"^\s*[A-Za-z_][\w.]*::[\w.]+")  # emit_nvtx `aten::mm, seq = ...` / cpu_op names
_SHAPE_RANGE = re.compile(r"^advisor\.gemm\b|sizes = \[")

VERDICTS = ("faster", "slower", "same", "not_comparable")


# --------------------------------------------------------------------------- steps


@dataclass
class Steps:
    method: str  # "profiler_steps" | "nvtx_steps" | "window"
    name: str | None  # the range text pattern used, e.g. "ProfilerStep#N"
    windows: dict[int, list[tuple[int, int]]]  # rank -> [(start_ns, end_ns)] in order

    @property
    def count(self) -> int:
        return min((len(w) for w in self.windows.values()), default=0)


def _gpu_window(trace: Trace, rank: int) -> tuple[int, int] | None:
    k = trace.kernels[trace.kernels["rank"] == rank]
    m = trace.memcpy[trace.memcpy["rank"] == rank]
    starts = pd.concat([k["start_ns"], m["start_ns"]])
    ends = pd.concat([k["end_ns"], m["end_ns"]])
    if starts.empty:
        return None
    return int(starts.min()), int(ends.max())


def _top_level(rows: pd.DataFrame) -> list[tuple[int, int]]:
    """Ranges in start order, dropping any that starts inside the previous kept one."""
    out: list[tuple[int, int]] = []
    for s, e in sorted(zip(rows["start_ns"].astype("int64"), rows["end_ns"].astype("int64"))):
        if e <= s:
            continue
        if out and s < out[-1][1]:
            continue
        out.append((int(s), int(e)))
    return out


def find_steps(trace: Trace) -> Steps:
    """Step windows per rank: ProfilerStep#N, else the most frequent step-like range name,
    else the span of GPU activity."""
    ranks = sorted(set(trace.kernels["rank"].astype(int)))
    nv = trace.nvtx
    texts = nv["text"].astype(object).where(nv["text"].notna(), "")
    prof = nv[texts.map(lambda t: bool(_PROFILER_STEP.match(t))).to_numpy(dtype=bool)] if len(nv) else nv
    if len(prof):
        windows = {r: _top_level(prof[prof["rank"] == r]) for r in ranks}
        if all(windows.values()):
            return Steps("profiler_steps", "ProfilerStep#N", windows)
    if len(nv):
        like = nv[texts.map(lambda t: bool(_STEP_NAME.match(t))).to_numpy(dtype=bool)]
        if len(like):
            norm = like["text"].astype(str).str.replace(r"\d+", "N", regex=True).str.strip()
            best = norm.value_counts().index[0]
            chosen = like[(norm == best).to_numpy()]
            windows = {r: _top_level(chosen[chosen["rank"] == r]) for r in ranks}
            if all(windows.values()):
                return Steps("nvtx_steps", best, windows)
    windows = {}
    for r in ranks:
        w = _gpu_window(trace, r)
        windows[r] = [w] if w else []
    return Steps("window", None, windows)


def _window_steps(trace: Trace) -> Steps:
    windows = {}
    for r in sorted(set(trace.kernels["rank"].astype(int))):
        w = _gpu_window(trace, r)
        windows[r] = [w] if w else []
    return Steps("window", None, windows)


# --------------------------------------------------------------------------- one side


@dataclass
class Side:
    """One side's numbers, per step (the mean over the steps analysed)."""

    label: str
    sources: list[str]
    formats: list[str]
    devices: list[dict[str, Any]]
    ranks: list[int]
    steps: Steps
    step_ns: list[int]  # wall time of each step (slowest rank)
    busy_ns: list[int]  # GPU busy (union of kernels and copies launched in the step), per step
    kernels: pd.DataFrame  # Context.kernels of the kernels inside the steps, plus class, family, step
    copies: pd.DataFrame  # memcpy rows inside the steps, plus step
    outside: int  # kernels launched outside every step
    diagnosis: Diagnosis
    context: Context = field(repr=False)

    @property
    def n(self) -> int:
        return len(self.step_ns)

    @property
    def step_median_ns(self) -> float:
        return float(np.median(self.step_ns)) if self.step_ns else float("nan")

    @property
    def busy_median_ns(self) -> float:
        return float(np.median(self.busy_ns)) if self.busy_ns else float("nan")

    def step_spread(self) -> float | None:
        """Robust relative spread of the per-step wall times (None under 3 steps)."""
        return _rel_spread(self.step_ns)

    def busy_spread(self) -> float | None:
        return _rel_spread(self.busy_ns)

    def kernel_spread(self) -> float | None:
        """Time-weighted median of the relative spread of repeated launches of one kernel
        (same family, shape and grid on one rank): the GPU's own variation on equal work."""
        k = self.kernels
        if k.empty:
            return None
        keys = ["rank", "family", "M", "N", "K", "grid_x", "grid_y", "grid_z"]
        spreads, weights = [], []
        for _, g in k.groupby([k[c].astype(object).where(k[c].notna(), -1) for c in keys], sort=False):
            if len(g) < MIN_REPEATS:
                continue
            s = _rel_spread(g["dur_ns"].tolist())
            if s is not None:
                spreads.append(s)
                weights.append(float(g["dur_ns"].sum()))
        if not spreads:
            return None
        order = np.argsort(spreads)
        cum = np.cumsum(np.asarray(weights)[order])
        return float(np.asarray(spreads)[order][np.searchsorted(cum, cum[-1] / 2)])

    def per_step(self, ns: float) -> float:
        return ns / self.n if self.n else float("nan")

    def class_ns(self) -> dict[str, float]:
        out = {c: 0.0 for c in CLASSES}
        for c, ns in self.kernels.groupby("class")["dur_ns"].sum().items():
            out[str(c)] += float(ns)
        out["copy"] += float(self.copies["dur_ns"].sum()) if len(self.copies) else 0.0
        return {c: self.per_step(v) for c, v in out.items()}

    def summary(self) -> dict[str, Any]:
        launches = len(self.kernels) + len(self.copies)
        return {
            "label": self.label,
            "sources": self.sources,
            "formats": self.formats,
            "devices": [{"rank": d["rank"], "name": d["name"], "sm_count": d["sm_count"]} for d in self.devices],
            "ranks": self.ranks,
            "steps": self.n,
            "step_ns": _round(self.step_median_ns),
            "step_ns_each": [int(x) for x in self.step_ns],
            "step_spread": _round(self.step_spread(), 4),
            "gpu_busy_ns": _round(self.busy_median_ns),
            "gpu_busy_fraction": _round(self.busy_median_ns / self.step_median_ns, 4) if self.step_median_ns else None,
            "kernel_spread": _round(self.kernel_spread(), 4),
            "launches_per_step": _round(self.per_step(launches), 1),
            "kernels_outside_steps": self.outside,
            "classes_ns": {c: _round(v) for c, v in self.class_ns().items()},
            "findings": len(self.diagnosis.findings),
        }


def _rel_spread(values) -> float | None:
    v = np.asarray(values, dtype=np.float64)
    if v.size < MIN_REPEATS:
        return None
    med = float(np.median(v))
    if med <= 0:
        return None
    return MAD_TO_SD * float(np.median(np.abs(v - med))) / med


def _round(v, digits: int = 0):
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    return int(round(v)) if digits == 0 else round(float(v), digits)


def _profiler(fmt: str) -> str:
    fmt = str(fmt)
    if fmt.startswith("nsys"):
        return "nsys"
    if fmt.startswith("roc"):
        return "rocprof"
    return fmt


def _formats(trace: Trace) -> list[str]:
    fmt = trace.meta.get("format")
    return [str(f) for f in fmt] if isinstance(fmt, list) else [str(fmt)]


def build_side(trace: Trace, label: str, steps: Steps | None = None, rules=None,
               diagnosis: Diagnosis | None = None) -> Side:
    """Cut `trace` into steps (find_steps unless given) and gather its per-step numbers;
    `diagnosis` is diagnose(trace) when the caller has it already."""
    if trace.kernels.empty:
        raise AdvisorError(f"{label}: the trace holds no GPU kernels to compare")
    steps = steps or find_steps(trace)
    diag = diagnosis if diagnosis is not None else diagnose(trace, rules=rules)
    ctx = Context(trace, diag.rules)
    k = ctx.kernels.copy()
    k["class"] = classify(k["name"], k["is_gemm"], k["is_comm"]).to_numpy()
    k["family"] = families(k["name"]).to_numpy()
    # A kernel belongs to the step in which the host launched it (GPU work runs behind the
    # host); without a launch record, to the step it started in.
    launch = _launch_points(trace)["launch_ns"].to_numpy(dtype=np.float64)
    at = np.where(np.isnan(launch), k["start_ns"].to_numpy(dtype=np.float64), launch)
    if steps.method == "window":
        at = k["start_ns"].to_numpy(dtype=np.float64)
    k["step"] = _step_of(k["rank"].to_numpy(), at, steps)
    m = trace.memcpy.copy()
    m["step"] = _step_of(m["rank"].to_numpy(), m["start_ns"].to_numpy(dtype=np.float64), steps) if len(m) else []
    n = steps.count
    inside_k = k[(k["step"] >= 0) & (k["step"] < n)]
    inside_m = m[(m["step"] >= 0) & (m["step"] < n)] if len(m) else m
    step_ns, busy_ns = [], []
    per_rank = {}
    for r, w in steps.windows.items():
        kr = inside_k[inside_k["rank"] == r]
        mr = inside_m[inside_m["rank"] == r] if len(inside_m) else inside_m
        walls, busies, done = [], [], -math.inf
        for i in range(n):
            kk, mm = kr[kr["step"] == i], (mr[mr["step"] == i] if len(mr) else mr)
            s_ = np.concatenate([kk["start_ns"].to_numpy(np.int64), mm["start_ns"].to_numpy(np.int64)])
            e_ = np.concatenate([kk["end_ns"].to_numpy(np.int64), mm["end_ns"].to_numpy(np.int64)])
            busies.append(intervals.total(s_, e_))
            s, e = w[i]
            # A step is done when its host range has ended and the GPU has finished what it
            # launched (the host may run steps ahead of the GPU); it began at its host start,
            # or when the step before it was done if that was later.
            end = max(e, int(e_.max())) if e_.size else e
            walls.append(end - max(s, done))
            done = end
        per_rank[r] = (walls, busies)
    for i in range(n):
        step_ns.append(int(max(v[0][i] for v in per_rank.values())))
        busy_ns.append(int(max(v[1][i] for v in per_rank.values())))
    return Side(
        label=label,
        sources=list(trace.meta.get("sources", [])),
        formats=_formats(trace),
        devices=devices_table(trace),
        ranks=trace.ranks,
        steps=steps,
        step_ns=step_ns,
        busy_ns=busy_ns,
        kernels=inside_k,
        copies=inside_m,
        outside=int(len(k) - len(inside_k)),
        diagnosis=diag,
        context=ctx,
    )


def _step_of(ranks: np.ndarray, at: np.ndarray, steps: Steps) -> np.ndarray:
    out = np.full(len(at), -1, dtype=np.int64)
    for r, w in steps.windows.items():
        if not w:
            continue
        starts = np.array([s for s, _ in w], dtype=np.float64)
        ends = np.array([e for _, e in w], dtype=np.float64)
        sel = ranks == r
        idx = np.searchsorted(starts, at[sel], side="right") - 1
        ok = (idx >= 0) & (at[sel] <= ends[np.clip(idx, 0, None)])
        out[np.flatnonzero(sel)] = np.where(ok, idx, -1)
    return out


# --------------------------------------------------------------------------- matching


def _shape_text(row) -> str | None:
    if pd.isna(row["M"]) or pd.isna(row["N"]) or pd.isna(row["K"]):
        return None
    b = row["batch"]
    text = f"{int(row['M'])}x{int(row['N'])}x{int(row['K'])}"
    return text + (f" (x{int(b)})" if not pd.isna(b) and int(b) > 1 else "")


def _kernel_keys(side: Side) -> pd.DataFrame:
    """One row per kernel: match key (GEMMs with a known shape by shape, the rest by family),
    label, class."""
    k = side.kernels
    shape = k.apply(_shape_text, axis=1) if len(k) else pd.Series(dtype=object)
    is_gemm_shape = (k["class"] == "gemm") & shape.notna()
    key = np.where(is_gemm_shape, "gemm " + shape.astype(str), k["class"] + ":" + k["family"])
    return pd.DataFrame({"key": key, "class": k["class"], "shape": shape.where(is_gemm_shape, None),
                         "name": k["name"].astype(object), "dur_ns": k["dur_ns"]}, index=k.index)


def _copy_keys(side: Side) -> pd.DataFrame:
    m = side.copies
    if m.empty:
        return pd.DataFrame(columns=["key", "class", "shape", "name", "dur_ns"])
    label = m["op"].fillna("memcpy").astype(str) + " " + m["kind"].fillna("unknown").astype(str)
    return pd.DataFrame({"key": "copy:" + label, "class": "copy", "shape": None, "name": label, "dur_ns": m["dur_ns"]})


def kernel_changes(before: Side, after: Side) -> list[dict[str, Any]]:
    """Per matched kernel (or copy kind): launches and GPU time per step on each side, and the
    change, largest absolute change first."""
    rows = {}
    for side, which in ((before, "before"), (after, "after")):
        t = pd.concat([_kernel_keys(side), _copy_keys(side)], ignore_index=True)
        for key, g in t.groupby("key", sort=False):
            names = g.groupby("name")["dur_ns"].sum().sort_values(ascending=False)
            r = rows.setdefault(key, {"key": key, "class": g["class"].iloc[0], "shape": g["shape"].iloc[0],
                                      "before": None, "after": None})
            r[which] = {
                "launches_per_step": round(side.per_step(len(g)), 2),
                "gpu_ns_per_step": _round(side.per_step(float(g["dur_ns"].sum()))),
                "median_ns": _round(float(g["dur_ns"].median())),
                "names": [str(n) for n in names.index[:3]],
            }
    out = []
    for r in rows.values():
        b = r["before"]["gpu_ns_per_step"] if r["before"] else 0
        a = r["after"]["gpu_ns_per_step"] if r["after"] else 0
        r["delta_ns_per_step"] = a - b
        r["ratio"] = round(b / a, 3) if a and b else None  # >1: faster after
        r["status"] = "gone" if not r["after"] else "new" if not r["before"] else "matched"
        r["label"] = (r["after"] or r["before"])["names"][0]
        out.append(r)
    out.sort(key=lambda r: (-abs(r["delta_ns_per_step"]), r["key"]))
    return out


def _finding_key(f: Finding) -> tuple:
    s = f.shape or {}
    shape = (s.get("M"), s.get("N"), s.get("K"), s.get("batch") or 1) if s else None
    return f.symptom, family(f.kernel), shape


def _brief(f: Finding, side: Side) -> dict[str, Any]:
    s = f.shape or None
    return {
        "symptom": f.symptom,
        "strategy": f.strategy,
        "kernel": f.kernel,
        "shape": {k: s.get(k) for k in ("M", "N", "K", "batch", "dtype") if s.get(k) is not None} if s else None,
        "launches_per_step": round(side.per_step(f.launches), 2),
        "gpu_ns_per_step": _round(side.per_step(f.total_ns)),
        "est_savings_ns_per_step": _round(side.per_step(f.est_savings_ns)),
        "savings_unit": f.savings_unit,
        "tier": f.tier,
    }


def match_findings(before: Side, after: Side, gpu_only: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Findings resolved (before only), new (after only) and remaining (both), matched by
    symptom + kernel family + shape, then symptom + shape (the same GEMM now run by another
    kernel), then symptom + family (a shape the trace no longer names). `gpu_only`: leave out
    wall-time findings (launch gaps, host waits), which two profilers' own host overheads make
    differ on the same program."""
    left = [f for f in before.diagnosis.findings if not (gpu_only and f.savings_unit == "wall")]
    right = [f for f in after.diagnosis.findings if not (gpu_only and f.savings_unit == "wall")]
    pairs = []
    for keyfn in (lambda k: k, lambda k: (k[0], k[2]) if k[2] is not None else None, lambda k: (k[0], k[1])):
        index: dict[Any, list[int]] = {}
        for j, f in enumerate(right):
            key = keyfn(_finding_key(f))
            if key is not None:
                index.setdefault(key, []).append(j)
        keep_left = []
        taken = set()
        for f in left:
            key = keyfn(_finding_key(f))
            cands = [j for j in index.get(key, []) if j not in taken] if key is not None else []
            if cands:
                taken.add(cands[0])
                pairs.append((f, right[cands[0]]))
            else:
                keep_left.append(f)
        left = keep_left
        right = [f for j, f in enumerate(right) if j not in taken]
    return {
        "resolved": [_brief(f, before) for f in left],
        "new": [_brief(f, after) for f in right],
        "remaining": [{"before": _brief(b, before), "after": _brief(a, after)} for b, a in pairs],
    }


# --------------------------------------------------------------------------- comparability


def _tokens(side: Side) -> dict[str, set[str]]:
    k = side.context.kernels
    gemm = k["is_gemm"] & k["M"].notna()
    shapes = {f"{int(m)}x{int(n)}x{int(kk)}" for m, n, kk in zip(k.loc[gemm, "M"], k.loc[gemm, "N"], k.loc[gemm, "K"])}
    nv = side.context.trace.nvtx["text"].dropna().astype(str)
    ops = set(side.context.trace.cpu_ops["name"].dropna().astype(str))
    ops |= {t.split(",", 1)[0].strip() for t in nv if _OP_RANGE.match(t)}
    ranges = {re.sub(r"\d+", "#", t.strip()) for t in nv if not _OP_RANGE.match(t) and not _SHAPE_RANGE.search(t)}
    ranges = {r for r in ranges if not _PROFILER_STEP.match(r.replace("#", "0"))}
    return {"gemm shapes": shapes, "kernel families": set(families(k["name"])), "operators": ops,
            "range names": ranges}


def _jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a | b else 0.0


def comparability(before: Side, after: Side) -> tuple[str | None, dict[str, Any]]:
    """(why they are not comparable or None, the evidence)."""
    evidence: dict[str, Any] = {}
    names_b = {d["rank"]: d["name"] for d in before.devices if d["name"]}
    names_a = {d["rank"]: d["name"] for d in after.devices if d["name"]}
    gpus_b, gpus_a = sorted(set(names_b.values())), sorted(set(names_a.values()))
    evidence["devices"] = {"before": gpus_b, "after": gpus_a}
    if gpus_b and gpus_a and gpus_b != gpus_a:
        return f"different devices: before ran on {', '.join(gpus_b)}, after on {', '.join(gpus_a)}", evidence
    if len(before.ranks) != len(after.ranks):
        return (f"different rank counts: before holds {len(before.ranks)} rank(s), after {len(after.ranks)}; "
                "pass one file per rank on both sides"), evidence
    tb, ta = _tokens(before), _tokens(after)
    overlap = {cat: round(_jaccard(tb[cat], ta[cat]), 3) for cat in tb if tb[cat] and ta[cat]}
    evidence["work_overlap"] = overlap
    if tb["gemm shapes"] and ta["gemm shapes"] and not tb["gemm shapes"] & ta["gemm shapes"]:
        few = lambda s: ", ".join(sorted(s)[:3]) + (" ..." if len(s) > 3 else "")  # noqa: E731
        return (f"no GEMM shape in common (before {few(tb['gemm shapes'])}; after {few(ta['gemm shapes'])}): "
                "different programs or inputs"), evidence
    best = max(overlap.values(), default=0.0)
    if best < MIN_WORK_OVERLAP:
        return (f"almost no work in common (best overlap {best:.0%} of kernel families, operators or range names, "
                f"under {MIN_WORK_OVERLAP:.0%}): different programs"), evidence
    return None, evidence


# --------------------------------------------------------------------------- the comparison


@dataclass
class Comparison:
    verdict: str
    speedup: float | None  # before step wall time / after step wall time
    gpu_speedup: float | None  # before GPU busy per step / after
    judged_on: str  # "step wall time" | "GPU busy time"
    why: str  # one sentence: how the verdict was reached
    noise: dict[str, Any]
    alignment: dict[str, Any]
    before: Side
    after: Side
    kernels: list[dict[str, Any]]
    findings: dict[str, list[dict[str, Any]]]
    comparable: dict[str, Any]
    notes: list[str]

    @property
    def slowdown(self) -> float | None:
        """after / before - 1 on the judged metric (positive: slower)."""
        s = self.speedup if self.judged_on == "step wall time" else self.gpu_speedup
        return None if not s else 1.0 / s - 1.0

    def classes(self) -> list[dict[str, Any]]:
        b, a = self.before.class_ns(), self.after.class_ns()
        return [{"class": c, "before_ns": _round(b[c]), "after_ns": _round(a[c]), "delta_ns": _round(a[c] - b[c])}
                for c in CLASSES if b[c] or a[c]]

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "speedup": _round(self.speedup, 4),
            "gpu_speedup": _round(self.gpu_speedup, 4),
            "judged_on": self.judged_on,
            "why": self.why,
            "noise": self.noise,
            "alignment": self.alignment,
            "comparable": self.comparable,
            "before": self.before.summary(),
            "after": self.after.summary(),
            "classes": self.classes(),
            "kernels": self.kernels,
            "findings": self.findings,
            "notes": self.notes,
        }


def _band(sb: float | None, nb: int, sa: float | None, na: int) -> float:
    """NOISE_Z standard errors of the difference of two medians (relative), at least
    NOISE_FLOOR. The standard error of a median is about 1.25 sd / sqrt(n)."""
    var = sum((1.2533 * s) ** 2 / max(n, 1) for s, n in ((sb, nb), (sa, na)) if s is not None)
    return max(NOISE_FLOOR, NOISE_Z * math.sqrt(var))


def compare(before: Trace, after: Trace, *, rules=None, labels: tuple[str, str] = ("before", "after"),
            diagnoses: tuple[Diagnosis, Diagnosis] | None = None) -> Comparison:
    """Compare two traces of one program (each side one file or one per rank, merged by
    advisor.load_trace); `diagnoses` are the two sides' diagnose() results when the
    caller has them. Raises AdvisorError when a side holds no kernels."""
    notes: list[str] = []
    sb, sa = find_steps(before), find_steps(after)
    if sb.method != sa.method or (sb.method != "window" and sb.name != sa.name):
        what = lambda s: "the whole capture" if s.method == "window" else f"{s.count} {s.name!r} ranges"  # noqa: E731
        notes.append(f"steps differ (before: {what(sb)}; after: {what(sa)}): both sides compared as whole captures, "
                     "which assumes each captured the same work")
        sb, sa = _window_steps(before), _window_steps(after)
    db, da = diagnoses if diagnoses is not None else (None, None)
    b = build_side(before, labels[0], sb, rules=rules, diagnosis=db)
    a = build_side(after, labels[1], sa, rules=rules, diagnosis=da)
    alignment = {"method": sb.method, "name": sb.name, "before_steps": b.n, "after_steps": a.n}
    for side in (b, a):
        if side.outside:
            notes.append(f"{side.label}: {side.outside} kernel(s) launched outside the steps are left out")
    why_not, evidence = comparability(b, a)
    profilers = ({_profiler(f) for f in b.formats}, {_profiler(f) for f in a.formats})
    judged_on = "step wall time"
    if profilers[0] != profilers[1]:
        judged_on = "GPU busy time"
        notes.append(f"recorded by different profilers ({', '.join(sorted(profilers[0]))} before, "
                     f"{', '.join(sorted(profilers[1]))} after): each adds its own host overhead to the wall time, "
                     "so the verdict is judged on GPU busy time and wall-time findings (launch gaps, host waits) are "
                     "not matched; profile both sides with one profiler to judge the wall time")
    speedup = b.step_median_ns / a.step_median_ns if a.step_median_ns else None
    gpu_speedup = b.busy_median_ns / a.busy_median_ns if a.busy_median_ns else None
    if judged_on == "step wall time" and b.n >= MIN_REPEATS and a.n >= MIN_REPEATS:
        sp_b, sp_a, source = b.step_spread(), a.step_spread(), "per-step wall time"
        nb, na = b.n, a.n
    elif judged_on == "GPU busy time" and b.n >= MIN_REPEATS and a.n >= MIN_REPEATS:
        sp_b, sp_a, source = b.busy_spread(), a.busy_spread(), "per-step GPU busy time"
        nb, na = b.n, a.n
    else:
        sp_b, sp_a, source = b.kernel_spread(), a.kernel_spread(), "repeated launches of the same kernel"
        nb = na = 1
    band = _band(sp_b, nb, sp_a, na)
    how = (f"robust spread (1.4826 x MAD / median) of {source}: before {_pct(sp_b)}, after {_pct(sp_a)}"
           + (f" over {nb} and {na} steps" if nb > 1 else " (one step per side: the GPU's own variation on equal work)")
           + f"; {NOISE_Z:g} standard errors of the difference of medians, at least {NOISE_FLOOR:.0%}: +-{band:.1%}")
    noise = {"band": round(band, 4), "before_spread": _round(sp_b, 4), "after_spread": _round(sp_a, 4),
             "source": source, "how": how}
    judged = speedup if judged_on == "step wall time" else gpu_speedup
    if why_not is not None:
        verdict, why = "not_comparable", why_not
    elif judged is None:
        verdict, why = "not_comparable", "no step time on the after side"
    else:
        change = 1.0 / judged - 1.0  # relative change of the time: negative is faster
        if abs(change) <= band:
            verdict = "same"
            why = f"{judged_on} changed {change:+.1%}, inside the noise band of +-{band:.1%}"
        else:
            verdict = "faster" if change < 0 else "slower"
            why = f"{judged_on} changed {change:+.1%} ({judged:.2f}x), outside the noise band of +-{band:.1%}"
    launches = (b.per_step(len(b.kernels)), a.per_step(len(a.kernels)))
    if min(launches) and max(launches) / min(launches) > 2 and verdict != "not_comparable":
        notes.append(f"kernel launches per step went from {launches[0]:.0f} to {launches[1]:.0f}: check that both "
                     "captures hold the same amount of work")
    return Comparison(verdict=verdict, speedup=speedup, gpu_speedup=gpu_speedup, judged_on=judged_on, why=why,
                      noise=noise, alignment=alignment, before=b, after=a, kernels=kernel_changes(b, a),
                      findings=match_findings(b, a, gpu_only=judged_on == "GPU busy time"),
                      comparable=evidence, notes=notes)


def _pct(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.1%}"


def regression_exceeds(c: Comparison, pct: float) -> bool:
    """True when the verdict is `slower` by more than `pct` percent (for --fail-on-regression)."""
    return c.verdict == "slower" and c.slowdown is not None and 100.0 * c.slowdown > pct


__all__ = ["Comparison", "Side", "Steps", "VERDICTS", "build_side", "compare", "find_steps", "kernel_changes",
           "match_findings", "regression_exceeds"]
