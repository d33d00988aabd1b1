"""Markdown rendering with jinja2, safe by default for untrusted trace text.

Every `{{ expression }}` that yields a string is markdown-escaped unless a filter marked it
safe (`code` wraps text in a code span that cannot be broken out of; `ns`, `pct` and
`num` format numbers). Templates cannot print raw trace text by accident.
"""

from __future__ import annotations

import re

import json
from typing import Any

import jinja2

from ..resources import templates_dir
from ..textutil import fmt_bytes, fmt_ns, md_escape, safe_text


class MdSafe(str):
    """A string already safe for markdown output."""


def code(value: Any, limit: int = 120) -> MdSafe:
    """Inline code span for a kernel name or path: fenced with more backticks than it holds,
    pipes escaped for tables, control characters shown as escapes."""
    text = safe_text(value, limit)
    longest, run = 0, 0
    for ch in text:
        run = run + 1 if ch == "`" else 0
        longest = max(longest, run)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return MdSafe(f"{fence}{pad}{text.replace('|', chr(92) + '|')}{pad}{fence}")


def _finalize(value: Any) -> Any:
    if isinstance(value, MdSafe) or not isinstance(value, str):
        return "" if value is None else value
    return md_escape(value, limit=400)


def _num(value: Any, digits: int = 2) -> MdSafe:
    if value is None:
        return MdSafe("-")
    if isinstance(value, bool):
        return MdSafe(str(value).lower())
    if isinstance(value, int):
        return MdSafe(f"{value:,}")
    if isinstance(value, float):
        return MdSafe(f"{value:.{digits}f}")
    return MdSafe(md_escape(value))


def ident(value: Any) -> MdSafe:
    """Our own identifiers (symptom ids, evidence keys): printed as-is when they are plain
    identifiers (intraword underscores are not emphasis in CommonMark), escaped otherwise."""
    text = str(value)
    if text.replace("_", "").replace(".", "").isalnum() and text.isascii():
        return MdSafe(text)
    return MdSafe(md_escape(text))


def plain(value: Any) -> MdSafe:
    """Our own ids and file names inside code blocks (where escapes would show): allowed only
    when they hold nothing but letters, digits and ._,x/- characters."""
    text = str(value)
    if not text or not all(c.isalnum() or c in "._,/-" for c in text) or not text.isascii():
        raise ValueError(f"refusing to print {text!r} in a code block")
    return MdSafe(text)


def image(path: Any, alt: str) -> MdSafe:
    """An image link to a file we wrote next to the report (plain relative names only)."""
    text = str(path)
    if not text or not all(c.isalnum() or c in "._-/" for c in text) or ".." in text or text.startswith("/"):
        raise ValueError(f"refusing image path {text!r}")
    return MdSafe(f"![{md_escape(alt)}]({text})")


def _json(value: Any) -> MdSafe:
    """Compact JSON of numbers/strings, escaped for markdown."""
    return MdSafe(md_escape(json.dumps(value, default=str, separators=(", ", ": ")), limit=600))


def shape_pattern(kernel: Any) -> MdSafe:
    """A --shape KERNEL_PATTERN for a kernel name: its longest identifier-like token (letters,
    digits, underscores only, so it is a literal regular expression, safe in a code span and
    in single quotes), at most 48 characters."""
    tokens = re.findall(r"[A-Za-z0-9_]{3,}", str(kernel)[:4096]) if kernel is not None else []
    tokens = [t for t in tokens if t not in ("void", "const", "unsigned", "float", "int", "char")]
    return MdSafe(max(tokens, key=len)[:48] if tokens else "KERNEL")


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        autoescape=False,  # markdown, not HTML: escaping is done by _finalize
        finalize=_finalize,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    from ..basics import DEFAULT_SM_COUNT, DTYPES, GEMM_STRATEGIES

    # What `advisor generate` accepts, so a report suggests only commands that run (a code
    # span shows markdown escapes literally: `stream\_k` would be wrong there), and the SM
    # count it assumes unless told (a "Next:" command names the trace's when it differs).
    env.globals.update(gemm_strategies=GEMM_STRATEGIES, gemm_dtypes=tuple(DTYPES), default_sm_count=DEFAULT_SM_COUNT)
    env.filters.update(
        code=code,
        ident=ident,
        image=image,
        plain=plain,
        ns=lambda v: MdSafe(fmt_ns(v)),
        bytes=lambda v: MdSafe(fmt_bytes(v)),
        pct=lambda v, d=0: MdSafe("-" if v is None else f"{100 * v:.{d}f}%"),
        percent=lambda v, d=1: MdSafe("-" if v is None else f"{float(v):.{d}f}%"),  # v already in percent
        num=_num,
        json=_json,
        shape_pattern=shape_pattern,
    )
    return env


def render(template: str, **context: Any) -> str:
    return environment().get_template(template).render(**context)


# ------------------------------------------------------------------ generated Python code


class PySafe(str):
    """Python source text safe to paste into generated code."""


def _plain_literal(value: Any, depth: int = 0) -> Any:
    """`value` rebuilt from exact builtin types (str/int/float/bool/None, lists, str-keyed
    dicts), or ValueError. Subclasses are converted, not trusted: numpy's float64 is a float
    whose repr is `np.float64(1.0)`, code that would fail (or run) in the generated file; a
    str subclass could override __repr__. Floats that have no literal (NaN, infinities)
    become None."""
    if depth > 6:
        raise ValueError("literal nested too deeply")
    if value is None:
        return None
    if isinstance(value, bool):  # before int: bool is an int
        return bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        v = float(value)
        return v if v == v and v not in (float("inf"), float("-inf")) else None
    if isinstance(value, str):
        return str.__str__(value)
    if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        return _plain_literal(value.item(), depth)  # numpy bool_/integer/floating scalars
    if isinstance(value, (list, tuple)):
        items = [_plain_literal(v, depth + 1) for v in value]
        return tuple(items) if isinstance(value, tuple) else items
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"dict key {k!r} is not a string")
            out[str.__str__(k)] = _plain_literal(v, depth + 1)
        return out
    raise ValueError(f"{type(value).__name__} cannot be written into generated code")


def py_literal(value: Any) -> PySafe:
    """repr() of plain data (str/int/float/bool/None and lists/dicts of them): the only way
    trace-derived text enters generated code. repr escapes quotes, newlines and control
    characters, so the text stays inside its string literal."""
    import pprint

    return PySafe(pprint.pformat(_plain_literal(value), width=96, sort_dicts=False))


def _py_finalize(value: Any) -> Any:
    if isinstance(value, PySafe):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"refusing to print {type(value).__name__} into generated code without the py filter")
    return repr(value)


def code_environment() -> jinja2.Environment:
    """Jinja environment for Python templates: only numbers and `py`-filtered literals print."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir())),
        autoescape=False,
        finalize=_py_finalize,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.filters["py"] = py_literal
    return env
