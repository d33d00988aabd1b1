"""What every --run loop returns, and the one decision they all make.

A loop measures one problem (a GEMM shape: run.loop.ShapeResult; a loop of small GEMMs:
run.group_loop.GroupResult; a decode attention: run.attn_loop.AttnResult) and hands the
result to `decide`, which picks the baseline and the winner and says whether the winner is
worth adopting. Each kind says only what differs: which providers are its baselines and its
candidates, and how its verdict reads. The run report and run_report.json read every kind
alike (`kind` tells them apart).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path

from ..basics import NOISE_MARGIN


@dataclass(kw_only=True)
class RunResult(ABC):
    """The fields every kind shares; a kind adds its problem (positional) and its hooks."""

    finding: dict | None = None
    observed_ns: int | None = None  # the trace's kernel for this problem, when one call of it is comparable
    rows: list[dict] = field(default_factory=list)  # the bench's rows (verified or not)
    winner: dict | None = None
    baseline: dict | None = None
    recommended: bool = False
    verdict: str = ""
    variant_path: Path | None = None
    variant_knobs: dict | None = None
    ran_on_gpu: bool = False
    model: dict = field(default_factory=dict)  # the analytical model's ranking, where the kind has one
    counters: dict | None = None  # --counters: run.counters.CounterResult.to_dict()

    def outcome(self) -> dict:
        """The part of to_dict() every kind shares: the table, the decision and the variant."""
        return {
            "table": [dict(r) for r in self.table()],
            "winner": clean(self.winner),
            "baseline": clean(self.baseline),
            "recommended": self.recommended,
            "verdict": self.verdict,
            "variant": self.variant_path.name if self.variant_path else None,  # beside the report
            "variant_knobs": self.variant_knobs,
        }

    @abstractmethod
    def table(self) -> list[dict]:
        """The report's rows: each provider's best verified time (or why it has none)."""

    @abstractmethod
    def timed(self) -> dict[str, dict]:
        """Provider -> its verified row with `median_us` (the observed kernel not among them)."""

    @abstractmethod
    def is_baseline(self, provider: str) -> bool:
        """What the winner must beat (the library's call, the loop as it is...)."""

    @abstractmethod
    def is_candidate(self, provider: str) -> bool:
        """What may win (our generated variants)."""

    @abstractmethod
    def nothing_to_recommend(self) -> str:
        """The verdict when no candidate has a verified time."""

    @abstractmethod
    def verdict_text(self, win: dict, bases: dict[str, dict], timed: dict[str, dict]) -> str:
        """The verdict once winner, baseline and `recommended` are set."""


def clean(row: dict | None) -> dict | None:
    """A row for JSON: without the bench's private `_` keys."""
    return None if row is None else {k: v for k, v in row.items() if not k.startswith("_")}


def decide(res: RunResult) -> None:
    """Pick the baseline (the fastest one timed) and the winner (the fastest verified
    candidate), and recommend the winner only when it beats the baseline and the observed
    kernel (when known) each by more than NOISE_MARGIN; then the kind words the verdict."""
    timed = res.timed()
    bases = {p: r for p, r in timed.items() if res.is_baseline(p)}
    res.baseline = min(bases.values(), key=lambda r: r["median_us"]) if bases else None
    ours = {p: r for p, r in timed.items() if res.is_candidate(p)}
    if not ours:
        res.verdict = res.nothing_to_recommend()
        return
    win = min(ours.values(), key=lambda r: r["median_us"])
    res.winner = win
    refs = ([res.baseline["median_us"]] if res.baseline else []) + ([res.observed_ns / 1e3] if res.observed_ns else [])
    res.recommended = bool(refs) and all(win["median_us"] < (1 - NOISE_MARGIN) * r for r in refs)
    res.verdict = res.verdict_text(win, bases, timed)
