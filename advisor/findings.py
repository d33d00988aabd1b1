"""What diagnosis produces: findings (symptom -> strategy, with evidence) and gate notes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Finding:
    """One place where work maps badly onto the GPU, and what to try.

    `symptom` and `strategy` are stable ids (SKILL.md documents them). `evidence` holds the
    numbers behind the verdict; `suggestion` the knobs a generated variant should start from.
    `est_savings_ns` is an estimate of recoverable GPU time over all launches, used to rank.
    """

    symptom: str
    strategy: str
    title: str
    kernel: str
    rank: int | None
    device_id: int | None
    shape: dict[str, Any] | None  # {"M", "N", "K"} plus "batch", "dtype" when known
    grid: list[int | None] | None
    block: list[int | None] | None
    launches: int
    total_ns: int
    est_savings_ns: int
    confidence: str  # "high" | "medium" | "low"
    watch_for: str
    evidence: dict[str, Any] = field(default_factory=dict, hash=False)
    suggestion: dict[str, Any] = field(default_factory=dict, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Gate:
    """A basic problem that makes scheduling work premature until it is fixed."""

    check: str  # stable id: gpu_idle | sync_calls | host_copies | gemm_below_roofline
    message: str
    value: float
    threshold: float
    rank: int | None = None
    kernel: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
