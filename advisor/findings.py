"""What diagnosis produces: findings (symptom -> strategy, with evidence) and gate notes."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Finding:
    """One place where work maps badly onto the GPU, and what to try.

    `symptom` and `strategy` are stable ids (SKILL.md documents them). `evidence` holds the
    numbers behind the verdict; `suggestion` the knobs a generated variant should start from.
    `est_savings_ns` is what the remedy can plausibly recover over all launches, used to rank.
    Its unit is `savings_unit`: "gpu" (kernel time that goes away) or "wall" (idle time the GPU
    waited: launch gaps, host stalls). The two are never added together.

    `tier` places the remedy on the ladder the matrix follows: 1-3 are the basics (1: keep the
    GPU fed, 2: layout, dtype, alignment, 3: precision and library choice), 4 a kernel schedule
    (Split-K, Stream-K, persistent, warp specialization, overlap). `premature` is set by
    diagnosis on a Tier-4 finding while a larger Tier 1-3 lever covers the same kernels.
    Evidence carries `bound_ns` (the physics floor the estimate respects, where one applies)
    and `basis` (one line: how the estimate was obtained).
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
    tier: int = 4
    savings_unit: str = "gpu"  # "gpu" | "wall"
    premature: bool = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Gate:
    """A basic problem that makes scheduling work premature until it is fixed."""

    check: str  # stable id: gpu_idle | sync_calls | host_copies | gemm_below_roofline | startup_gap
    message: str
    value: float
    threshold: float
    rank: int | None = None
    kernel: str | None = None
    # False for a note that is no basic problem of the program (startup_gap: the profile window
    # holds start-up); only gates with premature=True make scheduling work premature
    premature: bool = True
    # the largest idle gaps behind gpu_idle/startup_gap: when (ms from the rank's first event),
    # how long, whose turn it was and what the host was doing
    gaps: list = field(default_factory=list, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
