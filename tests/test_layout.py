"""The package layout: shared basics live in one module, advisor's modules import one another
without cycles (a cycle means something shared lives in a feature module), and the pipeline's
stages (traces -> symptoms -> diagnose -> report -> codegen -> run) import only backwards."""

import ast
from pathlib import Path

import pytest

from advisor.basics import ShapeError, parse_shape
from advisor.errors import AdvisorError

PACKAGE = Path(__file__).resolve().parents[1] / "advisor"


def _modules() -> dict[str, Path]:
    mods = {}
    for p in PACKAGE.rglob("*.py"):
        parts = p.relative_to(PACKAGE.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    """advisor modules `name` imports anywhere in its body (function-level imports too: a cycle
    hidden in a function is still a cycle). `from pkg import submodule` counts as the submodule."""
    pkg = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in mods)
        elif isinstance(node, ast.ImportFrom):
            base = pkg[: len(pkg) - node.level + 1] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
            subs = {f"{mod}.{a.name}" for a in node.names if f"{mod}.{a.name}" in mods}
            out.update(subs)
            if len(subs) < len(node.names) and mod in mods:
                out.add(mod)
    out.discard(name)
    return out


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    assert graph["advisor.run.loop"] >= {"advisor.basics", "advisor.run.gpu"}  # the walk sees imports at all
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_one():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


# The stages in pipeline order: a module imports its own stage and earlier ones, never a later
# one. Top-level modules (model, findings, rules, basics, errors...) are the shared basics
# below every stage and import none; the package's front doors (advisor/__init__, the CLI)
# call every stage.
STAGES = ("traces", "symptoms", "diagnose", "report", "codegen", "run")
FRONT_DOORS = {"advisor", "advisor.cli"}


def _stage(mod: str) -> int | None:
    """0 for a shared basic, 1.. for a stage, None for a front door."""
    if mod in FRONT_DOORS:
        return None
    part = mod.split(".")[1]
    return STAGES.index(part) + 1 if part in STAGES else 0


def _backward(graph: dict[str, set[str]]) -> list[str]:
    """Imports from a module to a later stage (a basic importing any stage included)."""
    out = []
    for mod, deps in sorted(graph.items()):
        here = _stage(mod)
        for dep in sorted(deps):
            there = _stage(dep)
            if here is not None and there is not None and there > here:
                out.append(f"{mod} -> {dep}")
    return out


def test_every_subpackage_is_a_stage():
    # a new subpackage takes a place in STAGES (and so in the direction check), or is a basic module
    subpackages = {p.parent.name for p in PACKAGE.glob("*/__init__.py")}
    assert subpackages == set(STAGES)


def test_the_pipeline_runs_one_way():
    mods = _modules()
    graph = {m: _imports(m, p, mods) for m, p in mods.items()}
    assert "advisor.symptoms.gemm" in graph["advisor.diagnose.diagnosis"]  # forward imports are seen
    assert _backward(graph) == []


def test_the_direction_check_finds_a_backward_import():
    graph = {"advisor.symptoms.tail_wave": {"advisor.report.render", "advisor.model", "advisor.traces.graphs"},
             "advisor.basics": {"advisor.traces", "advisor.errors"},
             "advisor.run.loop": {"advisor.codegen.generate", "advisor.run.gpu"},
             "advisor.cli": {"advisor.run.loop"}}
    assert _backward(graph) == ["advisor.basics -> advisor.traces", "advisor.symptoms.tail_wave -> advisor.report.render"]


def test_one_parse_shape():
    import advisor.run.bench.rows as rows
    import advisor.codegen.generate as generate

    assert rows.parse_shape is parse_shape and generate.parse_shape is parse_shape
    assert parse_shape(" 4096X4096*8192 ") == (4096, 4096, 8192)
    for bad in ("4096x4096", "0x1x1", "1x1x99999999999", "axbxc"):
        # one line for the CLI (AdvisorError), a ValueError for the bench scripts that catch that
        with pytest.raises(ShapeError) as exc:
            parse_shape(bad)
        assert isinstance(exc.value, AdvisorError) and isinstance(exc.value, ValueError)


def test_finding_for_fills_from_the_rule_and_the_row():
    from advisor.rules import load_rules
    from advisor.symptoms.context import finding_for

    rule = load_rules()["tail_wave"]
    row = {"name": "gemm", "rank": 0, "device_id": float("nan"), "M": 1664, "N": 1408, "K": 8192, "dtype": "bf16",
           "grid_x": 143, "grid_y": 1, "grid_z": 1, "block_x": 256, "block_y": None, "block_z": None,
           "launches": 6, "total_ns": 494042.0}
    f = finding_for(rule, row, est_savings_ns=1, confidence="high")
    assert (f.symptom, f.strategy, f.title, f.watch_for) == (rule.symptom, rule.strategy, rule.title, rule.watch_for)
    assert (f.kernel, f.rank, f.device_id, f.launches, f.total_ns) == ("gemm", 0, None, 6, 494042)
    assert f.shape == {"M": 1664, "N": 1408, "K": 8192, "batch": 1, "dtype": "bf16"}
    assert f.grid == [143, 1, 1] and f.block == [256, None, None]
    # any field can be given instead, the rule's ones too; a row without the columns then suffices
    g = finding_for(rule, {"name": "k", "rank": 1, "device_id": 0}, strategy="persistent", shape=None, grid=None,
                    block=None, launches=2, total_ns=5, est_savings_ns=1, confidence="low")
    assert (g.strategy, g.kernel, g.rank, g.shape, g.launches) == ("persistent", "k", 1, None, 2)


def test_the_run_candidates_come_from_the_rules(tmp_path):
    import re
    import shutil

    import advisor.run.loop as L
    from advisor.rules import load_rules

    bundled = L.strategies_for()
    assert bundled == {"tail_wave": ["stream_k", "persistent"], "small_grid_long_k": ["split_k", "stream_k"],
                       "hopper_no_ws": ["warp_specialization", "persistent"],
                       # the staged fallback where a misaligned dimension must stay
                       "misaligned_gemm": ["stream_k", "persistent"]}
    assert L.STRATEGIES_FOR == bundled  # the old name still answers
    # a --rules copy: its [run] lists count, an empty one times nothing, a rule without [run]
    # (a copy made before the table existed) keeps the bundled candidates
    d = tmp_path / "rules"
    shutil.copytree(PACKAGE.parent / "rules", d)
    edit = {"tail_wave.toml": ("persistent", '"persistent"'), "small_grid_long_k.toml": ("", ""),
            "hopper_no_ws.toml": None}
    for name, change in edit.items():
        text = (d / name).read_text(encoding="utf-8")
        if change is None:
            text = re.sub(r"^\[run\]\ncandidates = .*\n", "", text, flags=re.M)
        else:
            text = re.sub(r"^candidates = .*$", f"candidates = [{change[1]}]", text, flags=re.M)
        (d / name).write_text(text, encoding="utf-8")
    rules = load_rules(d)
    assert rules["hopper_no_ws"].run_candidates is None and rules["small_grid_long_k"].run_candidates == ()
    assert L.strategies_for(rules) == {"tail_wave": ["persistent"], "hopper_no_ws": ["warp_specialization", "persistent"],
                                       "misaligned_gemm": ["stream_k", "persistent"]}
