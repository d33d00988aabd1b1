"""Bundle a schedule from `kernels/` and its local dependencies into one standalone source.

A generated variant must run on its own (copied into someone's repository, no advisor
installed), so the schedule file is inlined together with the files it imports relatively
(`from .common import ...`, `from .dp_gemm import mac_loop`), in dependency order:

* the schedule itself stays verbatim (comments and all), minus its relative imports, its
  `from __future__` line and its `__main__` block;
* each dependency is parsed with `ast`; top-level names that a later module defines again
  (every schedule has a `Config` and a `matmul`) are renamed inside the dependency
  (`_dp_gemm__Config`), so the dependency keeps calling its own; aliased imports become
  assignments (`dp_default = _dp_gemm__default_config`).

Nothing here imports torch or triton: generation works on a laptop.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from ..basics import GEMM_STRATEGIES
from ..errors import AdvisorError
from .kernel_lib import SCHEDULES, source_path
from ..resources import kernels_dir


@dataclass(frozen=True)
class ConfigField:
    name: str
    type: str  # "int" | "bool" | "str" | "float"
    default: object
    comment: str


def _module_path(name: str) -> Path:
    path = kernels_dir() / f"{name}.py"
    if not path.is_file():
        raise AdvisorError(f"schedule {name!r} not found in {kernels_dir()}")
    return path


def _relative_imports(tree: ast.Module) -> list[ast.ImportFrom]:
    return [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1]


def _defined_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name):
                    names.add(t.id)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def dependency_order(schedule: str, extra: tuple[str, ...] = ()) -> list[str]:
    """Module names in the order they must be inlined (dependencies first, `schedule` last;
    `extra` modules, e.g. the data-parallel baseline, come in before it)."""
    order: list[str] = []

    def visit(name: str, stack: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in stack:
            raise AdvisorError(f"import cycle among kernels: {' -> '.join(stack + (name,))}")
        tree = ast.parse(_module_path(name).read_text(encoding="utf-8"))
        for imp in _relative_imports(tree):
            if not imp.module:
                raise AdvisorError(f"{name}.py: 'from . import x' is not supported in kernels; import names from a module")
            visit(imp.module, stack + (name,))
        order.append(name)

    main = SCHEDULES.get(schedule, schedule)
    for name in extra:
        if SCHEDULES.get(name, name) != main:
            visit(SCHEDULES.get(name, name), ())
    visit(main, ())
    return order


class _Renamer(ast.NodeTransformer):
    def __init__(self, mapping: dict[str, str]):
        self.mapping = mapping

    def visit_Name(self, node: ast.Name):
        if node.id in self.mapping:
            node.id = self.mapping[node.id]
        return node

    def _def(self, node):
        if node.name in self.mapping:
            node.name = self.mapping[node.name]
        self.generic_visit(node)
        return node

    visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _def


# Modules a trimmed bundle replaces (module -> its stand-in in kernels/): a variant gets
# runtime.py's launch interface from an installed advisor, or Triton's plain launch
STAND_INS = {"runtime": "runtime_plain"}


def _is_main_block(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Compare)
        and isinstance(node.test.left, ast.Name)
        and node.test.left.id == "__name__"
    )


def _first_line(node: ast.stmt) -> int:
    """A statement's first line, its decorators included."""
    return min([d.lineno for d in getattr(node, "decorator_list", [])] + [node.lineno])


def _strip_lines(source: str, nodes: list[ast.stmt]) -> str:
    """`source` without the lines of `nodes`, and without the comment block right above each
    (its comment goes with it: a dropped table's measurements, say)."""
    lines = source.splitlines(keepends=True)
    drop: set[int] = set()
    for n in nodes:
        first = _first_line(n) - 1
        while first > 0 and lines[first - 1].lstrip().startswith("#"):
            first -= 1
        drop.update(range(first, n.end_lineno))
    text = "".join(line for i, line in enumerate(lines) if i not in drop)
    while "\n\n\n\n" in text:
        text = text.replace("\n\n\n\n", "\n\n\n")
    return text


def _statement_defines(node: ast.stmt) -> set[str]:
    """Top-level names a statement binds (a def, an assignment, an import, or any of these
    inside a try block)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return {node.name}
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return {(a.asname or a.name).split(".")[0] for a in node.names}
    if isinstance(node, ast.Try):
        inner = node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body]
        return set().union(*(_statement_defines(s) for s in inner))
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}


def _kept_statements(order: list[str], trees: dict[str, ast.Module], roots: dict[str, set[str]]) -> dict[str, list[ast.stmt]]:
    """Per module, the top-level statements that `roots` ({module: names}) need, following
    every name they mention to its definition: in the same module, or through a relative
    import to another. A statement that binds no name (a module-level call) is kept."""
    imports: dict[str, dict[str, tuple[str, str]]] = {}
    for mod in order:
        imports[mod] = {a.asname or a.name: (imp.module, a.name) for imp in _relative_imports(trees[mod]) for a in imp.names}
    kept: dict[str, list[ast.stmt]] = {m: [] for m in order}
    seen: set[tuple[str, str]] = set()
    work = [(m, n) for m, names in roots.items() for n in names]
    for mod in order:  # statements that bind nothing, and what they mention
        for node in trees[mod].body:
            if (not _statement_defines(node) and not _is_main_block(node)
                    and not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))):
                kept[mod].append(node)
                work += [(mod, n.id) for n in ast.walk(node) if isinstance(n, ast.Name)]
    while work:
        mod, name = work.pop()
        if (mod, name) in seen:
            continue
        seen.add((mod, name))
        if name in imports[mod]:
            work.append(imports[mod][name])
            continue
        for node in trees[mod].body:
            if isinstance(node, ast.ImportFrom) and node.level:  # resolved through `imports` above
                continue
            if name in _statement_defines(node) and node not in kept[mod]:
                kept[mod].append(node)
                work += [(mod, n.id) for n in ast.walk(node) if isinstance(n, ast.Name)]
    return kept


def bundle(schedule: str, extra: tuple[str, ...] = (), roots: tuple[str, ...] | None = None,
           extra_roots: tuple[str, ...] = ()) -> tuple[str, dict[str, dict[str, str]]]:
    """One source text holding the schedule and its kernel-folder dependencies (and `extra`
    modules), plus the renames applied per module ({module: {name: new_name}}).

    With `roots` (the names the caller's code uses from the bundle, e.g. `matmul` and
    `Config`) and `extra_roots` (names of the `extra` modules it uses), only what those
    need is kept: the schedule's kernel, config, launcher and what they call, not the whole
    library (search spaces, self-checks and other schedules' kernels stay out). The schedule
    module is copied verbatim, comments and all; its dependencies are re-emitted by
    `ast.unparse` (docstrings kept, comments not) with the renames applied."""
    order = dependency_order(schedule, extra)
    # a trimmed variant carries runtime.py's interface without its internals (runtime_plain.py)
    stand_ins = STAND_INS if roots is not None else {}
    sources = {m: _module_path(stand_ins.get(m, m)).read_text(encoding="utf-8") for m in order}
    trees = {m: ast.parse(sources[m]) for m in order}
    main = order[-1]
    if roots is None:
        kept = {m: [n for n in trees[m].body] for m in order}
    else:
        # a name the caller's code uses is the flat namespace's: the last module that binds it
        wanted: dict[str, set[str]] = {}
        for name in roots:
            owner = next((m for m in reversed(order) if any(
                name in _statement_defines(n) for n in trees[m].body
                if not (isinstance(n, ast.ImportFrom) and n.level))), main)
            wanted.setdefault(owner, set()).add(name)
        for name in extra:
            mod = SCHEDULES.get(name, name)
            if mod != main:
                wanted.setdefault(mod, set()).update(extra_roots)
        kept = _kept_statements(order, trees, wanted)
    defined = {m: set().union(set(), *(_statement_defines(n) for n in kept[m]
                                        if not isinstance(n, (ast.Import, ast.ImportFrom, ast.Try))))
               for m in order}
    renamed: dict[str, dict[str, str]] = {}
    chunks: list[str] = []
    for i, mod in enumerate(order):
        tree = trees[mod]
        later = set().union(*(defined[m] for m in order[i + 1 :])) if i + 1 < len(order) else set()
        mapping = {n: f"_{mod}__{n}" for n in defined[mod] & later}
        renamed[mod] = mapping
        # Imports from earlier (already inlined) modules become plain assignments.
        aliases = []
        for imp in _relative_imports(tree):
            for alias in imp.names:
                local = alias.asname or alias.name
                if roots is not None and not _mentioned(local, kept[mod]):
                    continue
                target = renamed[imp.module].get(alias.name, alias.name)
                if local != target:
                    aliases.append(f"{local} = {target}")
        future = [n for n in tree.body if isinstance(n, ast.ImportFrom) and n.module == "__future__"]
        drop = _relative_imports(tree) + future + [n for n in tree.body if _is_main_block(n)]
        drop += [n for n in tree.body if n not in kept[mod] and n not in drop
                 and not (n is tree.body[0] and isinstance(n, ast.Expr) and mod == main)]
        is_docstring = bool(tree.body) and isinstance(tree.body[0], ast.Expr) and isinstance(
            getattr(tree.body[0], "value", None), ast.Constant)
        if mod != main and is_docstring and tree.body[0] not in drop:
            # Drop the dependency's module docstring: the variant's header says where it came from.
            drop.append(tree.body[0])
        header = f"# {'=' * 78}\n# inlined from kernels/{stand_ins.get(mod, mod)}.py\n# {'=' * 78}\n"
        if mod == main:
            body = _strip_lines(sources[mod], drop)
            if aliases:
                body = "\n".join(aliases) + "\n\n" + body.lstrip("\n")
        else:
            keep = [n for n in tree.body if n not in drop]
            new = _Renamer(mapping).visit(ast.Module(body=keep, type_ignores=[]))
            body = "\n".join(aliases) + ("\n" if aliases else "") + ast.unparse(ast.fix_missing_locations(new)) + "\n"
        if not body.strip():
            continue
        chunks.append(header + body.strip("\n") + "\n")
    return "\n\n".join(chunks), renamed


def _mentioned(name: str, nodes: list[ast.stmt]) -> bool:
    return any(isinstance(n, ast.Name) and n.id == name for node in nodes for n in ast.walk(node))


def _config_class(name: str, seen: tuple[str, ...] = ()) -> tuple[ast.ClassDef, list[str], Path]:
    """The `Config` dataclass node of kernels/<name>.py, or of the module it imports Config
    from (a schedule keeps its configs beside it: stream_k_gemm -> stream_k_configs)."""
    path = _module_path(name)
    source = path.read_text(encoding="utf-8")
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Config":
            return node, source.splitlines(), path
    for imp in _relative_imports(tree):
        if imp.module and imp.module not in seen and any(a.name == "Config" and a.asname in (None, "Config")
                                                          for a in imp.names):
            return _config_class(imp.module, seen + (name,))
    raise AdvisorError(f"{path.name}: no Config dataclass")


def config_fields(schedule: str) -> list[ConfigField]:
    """The knobs of a schedule's `Config` dataclass, read from its source (no torch needed)."""
    node, lines, _ = _config_class(SCHEDULES.get(schedule, schedule))
    fields = []
    for stmt in node.body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            ann = ast.unparse(stmt.annotation)
            default = ast.literal_eval(stmt.value) if stmt.value is not None else None
            line = lines[stmt.lineno - 1]
            comment = line.split("#", 1)[1].strip() if "#" in line else ""
            fields.append(ConfigField(stmt.target.id, ann, default, comment))
    return fields


def coerce_knobs(schedule: str, knobs: dict[str, object]) -> dict[str, object]:
    """Validate user/trace-supplied knobs against the schedule's Config: known names only,
    values of the field's type; strings limited to identifier characters. The result is safe
    to print with repr() into generated code."""
    fields = {f.name: f for f in config_fields(schedule)}
    out: dict[str, object] = {}
    for key, raw in knobs.items():
        f = fields.get(key)
        if f is None:
            raise AdvisorError(f"unknown knob {key!r} for {schedule}; knobs: {', '.join(fields)}")
        try:
            if f.type == "bool":
                if isinstance(raw, bool):
                    val = raw
                elif str(raw).lower() in ("1", "true", "yes", "on"):
                    val = True
                elif str(raw).lower() in ("0", "false", "no", "off"):
                    val = False
                else:
                    raise ValueError(raw)
            elif f.type == "int":
                if isinstance(raw, bool):
                    raise ValueError(raw)
                val = int(str(raw), 10) if not isinstance(raw, int) else raw
            elif f.type == "float":
                val = float(raw)
            else:
                val = str(raw)
                if not val.replace("_", "").replace("-", "").isalnum() or len(val) > 32:
                    raise ValueError(raw)
        except (TypeError, ValueError):
            raise AdvisorError(f"knob {key}={raw!r}: expected a {f.type}") from None
        out[key] = val
    return out


def complexity(provider: str) -> tuple[int | None, int | None]:
    """(lines of the schedule's kernel file, number of knobs) for one of our schedules."""
    if provider not in GEMM_STRATEGIES:
        return None, None
    try:
        return len(source_path(provider).read_text(encoding="utf-8").splitlines()), len(config_fields(provider))
    except (OSError, AdvisorError):
        return None, None
