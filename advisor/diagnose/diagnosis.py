"""Diagnosis: trace -> symptoms -> rules -> ranked findings and gate notes."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np


from ..devices import devices_table
from ..errors import AdvisorError
from ..findings import Finding, Gate
from ..model import Trace
from ..rules import Rule, load_rules
from ..symptoms import GATE, PATTERNS, Context
from ..symptoms import intervals
from ..symptoms.gemm import parse_shape_override
from .step_effect import note_step_effect


@dataclass
class Diagnosis:
    findings: list[Finding]
    gates: list[Gate]
    not_applicable: list[dict[str, str]]
    devices: list[dict[str, Any]]
    notes: list[str]
    trace: dict[str, Any]
    rules: dict[str, Rule] = field(repr=False, default_factory=dict)

    def sm_count_of(self, finding: Finding) -> int | None:
        """The SM count of the device `finding` ran on, when the trace (or --sm-count) gives it."""
        for dev in self.devices:
            if dev["rank"] == finding.rank and dev["device_id"] == finding.device_id:
                return dev["sm_count"]
        return None

    @property
    def premature(self) -> bool:
        """True when basic problems dominate and scheduling work should wait (a one-off
        start-up gap in the profile window does not)."""
        return any(g.premature for g in self.gates)

    @property
    def totals(self) -> dict[str, int]:
        """What the findings claim, GPU time and wall time apart (never added together). Findings
        on the same launches already share one budget, so these sums count nothing twice."""
        gpu = sum(f.est_savings_ns for f in self.findings if f.savings_unit == "gpu")
        wall = sum(f.est_savings_ns for f in self.findings if f.savings_unit == "wall")
        return {"gpu_time_ns": int(self.trace.get("gpu_time_ns", 0)), "recoverable_gpu_ns": int(gpu),
                "recoverable_wall_ns": int(wall)}

    def to_dict(self) -> dict[str, Any]:
        return {
            "findings": [f.to_dict() for f in self.findings],
            "gates": [g.to_dict() for g in self.gates],
            "premature": self.premature,
            "totals": self.totals,
            "not_applicable": self.not_applicable,
            "devices": self.devices,
            "notes": self.notes,
            "trace": self.trace,
        }


def _not_applicable(trace: Trace, module) -> str | None:
    for frame, column, question in module.REQUIRES:
        df = getattr(trace, frame)
        if df.empty or df[column].isna().all():
            return f"{question} No ({frame}.{column} is missing)."
    return None


def diagnose(
    trace: Trace,
    rules: str | Path | dict[str, Rule] | None = None,
    top: int | None = None,
    shapes: list[str] | None = None,
) -> Diagnosis:
    """Run every enabled rule over `trace`. `rules` is a directory of TOML rules (default: the
    bundled ones) or already-loaded rules. `shapes`: GEMM shapes the trace does not record,
    as `KERNEL_PATTERN=MxNxK[:dtype]` (a regular expression searched in kernel names; the first
    matching one wins). Findings come ranked by estimated recoverable time."""
    rules = rules if isinstance(rules, dict) else load_rules(rules)
    overrides = []
    for spec in shapes or []:
        try:
            overrides.append(parse_shape_override(spec))
        except ValueError as exc:
            raise AdvisorError(f"--shape {exc}") from None
    ctx = Context(trace, rules, overrides)
    findings: list[Finding] = []
    not_applicable = []
    for module in PATTERNS:
        rule = rules.get(module.SYMPTOM)
        if rule is None or not rule.enabled:
            continue
        reason = _not_applicable(trace, module)
        if reason:
            not_applicable.append({"symptom": module.SYMPTOM, "reason": reason})
            continue
        findings.extend(module.judge(module.evidence(ctx, rule), rule, ctx))
    gates: list[Gate] = []
    gate_rule = rules.get(GATE.SYMPTOM)
    if gate_rule is not None and gate_rule.enabled:
        gates = GATE.judge(GATE.evidence(ctx, gate_rule), gate_rule, ctx)
        # a GEMM far under its roofline that a Tier 1-3 finding already names (misaligned, fp32
        # on SIMT cores, ...) is that finding, with its cause and fix: no second, vaguer gate
        named = {(f.rank, k) for f in findings if f.tier <= 3 for k in (f.kernel, *(f.evidence.get("covers_kernels") or ()))}
        gates = [g for g in gates if not (g.check == "gemm_below_roofline" and (g.rank, g.kernel) in named)]
    findings = share_budgets(findings, ctx)
    findings = mark_premature(findings)
    findings = note_host_bound(findings, ctx, float(rules["launch_overhead"]["host_bound_caveat_share"])
                               if "launch_overhead" in rules else None)
    if "launch_overhead" in rules:
        lo = rules["launch_overhead"]
        costs = {r: (float(lo[f"profiler_op_cost_{r}_ns"]), float(lo[f"profiler_op_cost_{r}_max_ns"]))
                 for r in ("kineto", "nvtx")}
        findings = note_step_effect(findings, ctx, costs, float(lo["step_effect_caveat_share"]))
    # one list by lever size, Tier 1-3 and Tier 4 alike; a premature Tier-4 finding is never
    # larger than the lever that makes it premature, so that lever ranks above it
    findings.sort(key=lambda f: (-f.est_savings_ns, f.tier, f.symptom, f.kernel))
    if top is not None:
        findings = findings[:top]
    k = trace.kernels
    info = {
        "format": trace.meta.get("format"),
        "sources": list(trace.meta.get("sources", [])),
        "ranks": trace.ranks,
        "kernels": int(len(k)),
        "gpu_time_ns": int(k["dur_ns"].sum()) if len(k) else 0,
        "gemm_kernels": int(ctx.kernels["is_gemm"].sum()) if len(k) else 0,
        "gemm_shapes_known": int((ctx.kernels["is_gemm"] & ctx.kernels["M"].notna()).sum()) if len(k) else 0,
    }
    return Diagnosis(
        findings=findings,
        gates=gates,
        not_applicable=not_applicable,
        devices=devices_table(trace),
        notes=list(dict.fromkeys([*trace.meta.get("notes", []), *ctx.notes])),
        trace=info,
        rules=rules,
    )


def _launch_key(f: Finding) -> tuple:
    """The launches a finding is about: one kernel, with one problem shape and grid where known
    (one kernel name can run many shapes: each is its own budget)."""
    # GEMM shapes carry M/N/K, attention shapes B/Hq/Hkv/D/S: the shape's numbers, whatever they are
    shape = tuple(sorted((k, v) for k, v in f.shape.items() if isinstance(v, int))) if f.shape else None
    return (f.rank, f.device_id, f.kernel, shape, tuple(f.grid) if f.grid else None)


def share_budgets(findings: list[Finding], ctx: Context) -> list[Finding]:
    """Findings on the same launches share one budget.

    GPU time: findings on one kernel (rank, device, name) together claim at most its time minus
    its physics floor (the largest `bound_ns` among them, where known); the biggest claim is
    served first and the rest get what is left. Wall time: the idle-gap findings of one device
    together claim at most that device's idle time (span minus busy). A reduced finding keeps
    its own figure in evidence (`standalone_ns`) and names the findings it shares with."""
    out: list[Finding] = []
    by_key: dict[tuple, list[Finding]] = defaultdict(list)
    wall: dict[tuple, list[Finding]] = defaultdict(list)
    for f in findings:
        if f.savings_unit == "wall" and f.evidence.get("wall_pool", "idle") == "idle":
            wall[(f.rank, f.device_id)].append(f)
        elif f.savings_unit == "wall":
            # wall time from another pool (exposed_comm: communication no compute hides, while
            # the GPU is busy, not idle), bounded by its own evidence (`bound_ns`)
            out.append(f)
        else:
            by_key[_launch_key(f)].append(f)
    for group in by_key.values():
        if len(group) == 1:
            out.extend(group)
            continue
        floors = [f.evidence.get("bound_ns") for f in group if f.evidence.get("bound_ns") is not None]
        budget = max(f.total_ns for f in group) - (max(floors) if floors else 0)
        out.extend(_serve(group, max(0, int(budget))))
    for (rank, device_id), group in wall.items():
        idle = _idle_ns(ctx, rank, device_id)
        out.extend(_serve(group, idle) if idle is not None else group)
    return out


def _serve(group: list[Finding], budget: int) -> list[Finding]:
    out, left = [], budget
    names = [f.symptom for f in group]
    for f in sorted(group, key=lambda f: (-f.est_savings_ns, f.tier)):
        give = min(f.est_savings_ns, left)
        left -= give
        if give < f.est_savings_ns:
            others = [n for n in names if n != f.symptom]
            ev = {**f.evidence, "standalone_ns": f.est_savings_ns, "shares_budget_with": others}
            f = replace(f, est_savings_ns=int(give), evidence=ev)
        out.append(f)
    return out


def _idle_ns(ctx: Context, rank, device_id) -> int | None:
    k = ctx.trace.kernels
    sel = k[(k["rank"] == rank) & (k["device_id"].fillna(-1) == (-1 if device_id is None else device_id))]
    if sel.empty:
        return None
    s, e = sel["start_ns"].to_numpy(np.int64), sel["end_ns"].to_numpy(np.int64)
    return int(e.max() - s.min() - intervals.total(s, e))


def note_host_bound(findings: list[Finding], ctx: Context, min_share: float | None) -> list[Finding]:
    """Kernel time saved shortens a step only while the GPU is the bottleneck. Where the same
    device's wall findings (the GPU waiting on launches) cover `min_share` of its span or more,
    each kernel-time finding there carries `step_time_caveat`: the host may be the floor
    (ResNet-50 training on the H200: GPU time 27.0 -> 14.7 ms with channels_last, step time
    30.3 -> 29.4 ms; docs/measured_levers.md)."""
    if min_share is None:
        return findings
    wall: dict[tuple, int] = defaultdict(int)
    for f in findings:
        if f.savings_unit == "wall" and f.symptom == "launch_overhead":
            wall[(f.rank, f.device_id)] += f.est_savings_ns
    out = []
    for f in findings:
        w = wall.get((f.rank, f.device_id), 0)
        if w and f.savings_unit == "gpu":
            span = _span_ns(ctx, f.rank, f.device_id)
            share = w / span if span else 0.0
            if share >= min_share:
                f = replace(f, evidence={**f.evidence, "step_time_caveat": (
                    f"the GPU waits on the host for {w / 1e6:.2f} ms ({100 * share:.0f}% of this device's span; see the "
                    "launch_overhead finding): kernel time saved here shortens the step only as far as the host keeps "
                    "ahead of the GPU, so measure the step, and close the launch gaps too")})
        out.append(f)
    return out


def _span_ns(ctx: Context, rank, device_id) -> int:
    k = ctx.trace.kernels
    sel = k[((k["rank"] == rank) & (k["device_id"].fillna(-1) == (-1 if device_id is None else device_id))).to_numpy(dtype=bool)]
    return int(sel["end_ns"].max() - sel["start_ns"].min()) if len(sel) else 0


def mark_premature(findings: list[Finding]) -> list[Finding]:
    """A Tier-4 (schedule) finding is premature while a larger Tier 1-3 lever covers it: the same
    kernel, a kernel the lever's fix changes (evidence `covers_kernels`), or the same device's
    window when the lever is about the whole window (evidence `scope` == "window")."""
    basics = [f for f in findings if f.tier <= 3]
    out = []
    for f in findings:
        if f.tier >= 4:
            for b in basics:
                same_device = (b.rank, b.device_id) == (f.rank, f.device_id)
                covers = same_device and (
                    _launch_key(b)[:4] == _launch_key(f)[:4]
                    or f.kernel in (b.evidence.get("covers_kernels") or ())
                    or b.evidence.get("scope") == "window"
                )
                if covers and b.est_savings_ns >= f.est_savings_ns:
                    f = replace(f, premature=True, evidence={**f.evidence, "premature_because": f"{b.symptom} -> {b.strategy}"})
                    break
        out.append(f)
    return out


def rules_table(rules: dict[str, Rule]) -> list[dict[str, Any]]:
    """The matrix as rows (for `advisor rules` and the report)."""
    return [
        {
            "symptom": r.symptom,
            "strategy": r.strategy,
            "strategies": dict(r.strategies),
            "title": r.title,
            "try_first": r.try_first,
            "try_first_by_strategy": dict(r.try_first_by_strategy),
            "watch_for": r.watch_for,
            "enabled": r.enabled,
            "thresholds": {k: {"value": t.value, "unit": t.unit, "why": t.why} for k, t in r.thresholds.items()},
            "measured": {k: dict(v) for k, v in r.measured.items()},
            "source": r.source,
        }
        for r in rules.values()
    ]


def evidence_frames(trace: Trace, rules: dict[str, Rule] | None = None) -> dict[str, Any]:
    """The raw evidence of every pattern (for notebooks and agents that want the numbers)."""
    rules = rules or load_rules()
    ctx = Context(trace, rules)
    out: dict[str, Any] = {"kernels": ctx.kernels}
    for module in (*PATTERNS, GATE):
        rule = rules.get(module.SYMPTOM)
        if rule is not None and _not_applicable(trace, module) is None:
            out[module.SYMPTOM] = module.evidence(ctx, rule)
    return out


__all__ = ["Diagnosis", "diagnose", "rules_table", "evidence_frames"]
