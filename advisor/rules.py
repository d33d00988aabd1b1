"""The symptom-to-strategy matrix as data: one TOML file per rule in `rules/`.

Each file names the symptom, the strategy to try first, what to watch for, and every
threshold as a table `{ value = ..., why = "..." }`, so `advisor rules` can print the reason
next to each number. Point `--rules DIR` at your own copy to change them.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .basics import GEMM_STRATEGIES, KINETO_TYPE_BYTES
from .errors import AdvisorError
from .resources import rules_dir


@dataclass(frozen=True)
class Threshold:
    value: Any
    why: str
    unit: str = ""


@dataclass(frozen=True)
class Rule:
    symptom: str
    strategy: str
    title: str
    try_first: str
    watch_for: str
    enabled: bool = True
    thresholds: dict[str, Threshold] = field(default_factory=dict, hash=False)
    source: str = ""
    # per-pattern strategy ids where one symptom has several remedies (launch_overhead: a
    # loop of GEMMs is grouped, an elementwise stream fused...): the `[strategies]` table
    strategies: dict[str, str] = field(default_factory=dict, hash=False)
    # what --run times for this symptom's GEMM, in order (the `[run] candidates` list); None
    # where the file has no [run] table (the run loop then takes the bundled rule's)
    run_candidates: tuple[str, ...] | None = None
    # what to watch for per strategy id where one symptom has several remedies (a CUDA graph
    # has other pitfalls than a persistent kernel): the `[watch_for_by_strategy]` table
    watch_for_by_strategy: dict[str, str] = field(default_factory=dict, hash=False)
    # what to try first per strategy id, likewise (the `[try_first_by_strategy]` table): a
    # finding headed sdpa_backend is not told to cast a PEFT adapter
    try_first_by_strategy: dict[str, str] = field(default_factory=dict, hash=False)
    # what a fix measured on a named case (the `[measured.<case>]` tables: speedup, fix, what it
    # was measured on), for rules whose estimates are capped by measurement per case
    measured: dict[str, dict[str, Any]] = field(default_factory=dict, hash=False)

    def strategy_for(self, pattern: str) -> str:
        """The strategy id the rule names for `pattern`, else the rule's own."""
        return self.strategies.get(pattern, self.strategy)

    def watch_for_with(self, strategy: str) -> str:
        """The watch-for text for a finding whose remedy is `strategy`."""
        return self.watch_for_by_strategy.get(strategy, self.watch_for)

    def try_first_with(self, strategy: str) -> str:
        """The try-first text for a finding whose remedy is `strategy`."""
        return self.try_first_by_strategy.get(strategy, self.try_first)

    def __getitem__(self, name: str) -> Any:
        try:
            return self.thresholds[name].value
        except KeyError:
            raise AdvisorError(f"{self.source}: threshold {name!r} is missing (the {self.symptom} rule needs it)") from None


_REQUIRED = ("symptom", "strategy", "title", "try_first", "watch_for")


def _load_one(path: Path) -> Rule:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise AdvisorError(f"{path}: cannot read rule file ({exc})") from None
    missing = [k for k in _REQUIRED if not isinstance(data.get(k), str) or not data.get(k).strip()]
    if missing:
        raise AdvisorError(f"{path}: missing or empty keys: {', '.join(missing)}")
    thresholds = {}
    for name, spec in (data.get("thresholds") or {}).items():
        if not isinstance(spec, dict) or "value" not in spec or not str(spec.get("why", "")).strip():
            raise AdvisorError(f"{path}: threshold {name!r} needs a 'value' and a one-line 'why'")
        value = spec["value"]
        numbers = value if isinstance(value, list) else [value]
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in numbers)
        if not ok:
            raise AdvisorError(f"{path}: threshold {name!r} must be a number or a list of numbers")
        if not all(math.isfinite(v) for v in numbers):
            # nan compares false and inf passes everything: either silently turns a rule off
            raise AdvisorError(f"{path}: threshold {name!r} must be a finite number, not {value!r}")
        thresholds[name] = Threshold(value=value, why=str(spec["why"]).strip(), unit=str(spec.get("unit", "")))
    strategies = data.get("strategies") or {}
    if not isinstance(strategies, dict) or not all(isinstance(v, str) and v.strip() for v in strategies.values()):
        raise AdvisorError(f"{path}: [strategies] maps a pattern to a strategy id (a non-empty string)")
    watch_by = data.get("watch_for_by_strategy") or {}
    if not isinstance(watch_by, dict) or not all(isinstance(v, str) and v.strip() for v in watch_by.values()):
        raise AdvisorError(f"{path}: [watch_for_by_strategy] maps a strategy id to a non-empty string")
    try_by = data.get("try_first_by_strategy") or {}
    if not isinstance(try_by, dict) or not all(isinstance(v, str) and v.strip() for v in try_by.values()):
        raise AdvisorError(f"{path}: [try_first_by_strategy] maps a strategy id to a non-empty string")
    measured = data.get("measured") or {}
    for case, spec in measured.items():
        if (not isinstance(spec, dict) or not isinstance(spec.get("speedup"), (int, float))
                or isinstance(spec.get("speedup"), bool) or not math.isfinite(spec["speedup"]) or spec["speedup"] < 1
                or not str(spec.get("fix", "")).strip() or not str(spec.get("source", "")).strip()):
            raise AdvisorError(f"{path}: [measured.{case}] needs a finite 'speedup' >= 1, a 'fix' and a 'source'")
        if "dtypes" in spec:
            names = spec["dtypes"]
            if not (isinstance(names, list) and names and all(isinstance(t, str) and t in KINETO_TYPE_BYTES for t in names)):
                raise AdvisorError(f"{path}: [measured.{case}] 'dtypes' lists the profiler's tensor type names "
                                   f"(e.g. \"c10::BFloat16\", \"float\"), at least one")
    run = data.get("run") or {}
    candidates = run.get("candidates") if isinstance(run, dict) else None
    if "run" in data and (not isinstance(candidates, list)
                          or not all(c in GEMM_STRATEGIES and c != "dp" for c in candidates)):
        raise AdvisorError(f"{path}: [run] candidates lists GEMM strategy ids to time, each one of "
                           f"{', '.join(s for s in GEMM_STRATEGIES if s != 'dp')}")
    enabled = data.get("enabled", True)
    if not isinstance(enabled, bool):
        raise AdvisorError(f"{path}: 'enabled' must be true or false")
    return Rule(
        symptom=data["symptom"].strip(),
        strategy=data["strategy"].strip(),
        title=data["title"].strip(),
        try_first=data["try_first"].strip(),
        watch_for=data["watch_for"].strip(),
        enabled=enabled,
        thresholds=thresholds,
        source=path.name,
        strategies={str(k): v.strip() for k, v in strategies.items()},
        watch_for_by_strategy={str(k): v.strip() for k, v in watch_by.items()},
        try_first_by_strategy={str(k): v.strip() for k, v in try_by.items()},
        run_candidates=tuple(candidates) if "run" in data else None,
        measured={str(k): dict(v) for k, v in measured.items()},
    )


def load_rules(directory: str | Path | None = None) -> dict[str, Rule]:
    """All rules in `directory` (default: the bundled rules), keyed by symptom id."""
    d = Path(directory) if directory is not None else rules_dir()
    if not d.is_dir():
        raise AdvisorError(f"{d}: rules directory not found")
    files = sorted(d.glob("*.toml"))
    if not files:
        raise AdvisorError(f"{d}: no *.toml rule files")
    rules: dict[str, Rule] = {}
    for f in files:
        rule = _load_one(f)
        if rule.symptom in rules:
            raise AdvisorError(f"{f}: symptom {rule.symptom!r} already defined in {rules[rule.symptom].source}")
        rules[rule.symptom] = rule
    if d.resolve() != rules_dir().resolve():
        _check_against_bundled(rules, load_rules())
    return rules


def _check_against_bundled(rules: dict[str, Rule], bundled: dict[str, Rule]) -> None:
    """A user's copy (--rules DIR) names only symptoms advisor computes, and gives a list only
    where the bundled rule has one: a misspelt symptom id would drop its rule without a word,
    and a list where the symptom compares a number fails deep inside it."""
    for rule in rules.values():
        base = bundled.get(rule.symptom)
        if base is None:
            raise AdvisorError(f"{rule.source}: unknown symptom {rule.symptom!r}; advisor computes "
                               f"{', '.join(sorted(bundled))}")
        for name, t in rule.thresholds.items():
            b = base.thresholds.get(name)
            if b is not None and isinstance(t.value, list) and not isinstance(b.value, list):
                raise AdvisorError(f"{rule.source}: threshold {name!r} must be one number, as in the bundled "
                                   f"{base.source} (value = {b.value!r}), not a list")
