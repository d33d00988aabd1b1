"""Diagnosis: trace -> symptoms -> rules -> ranked findings and gate notes."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


from .findings import Finding, Gate
from .model import Trace
from .rules import Rule, load_rules
from .summary import devices_table
from .symptoms import GATE, PATTERNS, Context


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

    def to_dict(self) -> dict[str, Any]:
        return {
            "findings": [f.to_dict() for f in self.findings],
            "gates": [g.to_dict() for g in self.gates],
            "premature": self.premature,
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
) -> Diagnosis:
    """Run every enabled rule over `trace`. `rules` is a directory of TOML rules (default: the
    bundled ones) or already-loaded rules. Findings come ranked by estimated recoverable time."""
    rules = rules if isinstance(rules, dict) else load_rules(rules)
    ctx = Context(trace, rules)
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
    findings.sort(key=lambda f: (-f.est_savings_ns, f.symptom, f.kernel))
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
        notes=list(trace.meta.get("notes", [])),
        trace=info,
        rules=rules,
    )


def rules_table(rules: dict[str, Rule]) -> list[dict[str, Any]]:
    """The matrix as rows (for `advisor rules` and the report)."""
    return [
        {
            "symptom": r.symptom,
            "strategy": r.strategy,
            "strategies": dict(r.strategies),
            "title": r.title,
            "try_first": r.try_first,
            "watch_for": r.watch_for,
            "enabled": r.enabled,
            "thresholds": {k: {"value": t.value, "unit": t.unit, "why": t.why} for k, t in r.thresholds.items()},
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
