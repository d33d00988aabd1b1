"""Formatting and escaping for untrusted text (kernel names, NVTX text, file names).

Trace strings come from programs we do not control. Before they reach a terminal, a
markdown report or generated code they pass through one of these functions.
"""

from __future__ import annotations

import re

# C0/C1 controls, line/paragraph separators, bidi embeddings/overrides/isolates (U+202A-E,
# U+2066-9), the zero-width and bidi marks (U+200B-F, U+061C), BOM, and lone surrogates
# (file names that are not UTF-8 reach us as U+DC80-DCFF and cannot be written as UTF-8).
_CONTROL = re.compile(
    "[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff\ud800-\udfff]"
)


def safe_text(s: object, limit: int = 160) -> str:
    """One printable line: control and bidi characters shown as escapes, length capped."""
    text = str(s).replace("\r", " ").replace("\n", " ").replace("\t", " ")
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group(0)):02x}" if ord(m.group(0)) < 0x100 else f"\\u{ord(m.group(0)):04x}", text)
    if len(text) > limit:
        text = text[: limit - 1] + "\u2026"
    return text


# Characters that start markup anywhere in a line (names never start a line in our reports);
# with brackets escaped, parentheses cannot form links, so they stay readable.
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~$])")


def md_escape(s: object, limit: int = 160) -> str:
    """Safe inside a markdown table cell or paragraph: no markup, no HTML, no links."""
    text = safe_text(s, limit)
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


_MD_ESCAPABLE = frozenset("\\`*_[]|~$")


def md_for_terminal(markdown: str) -> str:
    """Our markdown as it should read on a terminal: the backslash escapes and HTML entities
    that md_escape added are taken out again (`two\\_phase` -> `two_phase`), except inside
    code spans and fences (where they were never added) and for `\\|` in table rows (which
    would split a cell). Only for display: the text stays free of controls (safe_text shows
    them as escapes before md_escape runs), and report files keep the escaped form."""
    out = []
    fenced = False
    for line in markdown.split("\n"):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            out.append(line)
        elif fenced:
            out.append(line)
        else:
            out.append(_unescape_line(line, in_table=line.lstrip().startswith("|")))
    return "\n".join(out)


def _unescape_line(line: str, in_table: bool) -> str:
    """One line outside fences: escape pairs undone, code spans (`...`, any run of backticks
    closed by the same run) copied as they are."""
    out: list[str] = []
    text_start = i = 0

    def flush(stop: int) -> None:
        text = line[text_start:stop]
        out.append(text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&"))

    while i < len(line):
        ch = line[i]
        if ch == "\\" and i + 1 < len(line) and line[i + 1] in _MD_ESCAPABLE:
            flush(i)
            keep = in_table and line[i + 1] == "|"
            out.append(line[i:i + 2] if keep else line[i + 1])
            i += 2
            text_start = i
        elif ch == "`":
            run = len(line[i:]) - len(line[i:].lstrip("`"))
            close = line.find("`" * run, i + run)
            while close != -1 and line[close + run:close + run + 1] == "`":  # a longer run does not close it
                close = line.find("`" * run, close + run + 1)
            if close == -1:
                i += run
                continue
            flush(i)
            out.append(line[i:close + run])
            i = close + run
            text_start = i
        else:
            i += 1
    flush(len(line))
    return "".join(out)


def shell_quote(s: object) -> str:
    """`s` as one shell word on one line, for commands users paste: shlex.quote, unless it
    holds control characters (a newline, an escape), then ANSI-C quoting $'...' (bash, zsh,
    ksh, POSIX 2024 sh) with those written as \\xHH, so nothing reaches the terminal raw."""
    import shlex

    text = str(s)
    if not _CONTROL.search(text) and "\n" not in text and "\r" not in text and "\t" not in text:
        return shlex.quote(text)
    out = []
    for ch in text:
        if ch in "\\'":
            out.append("\\" + ch)
        elif ch == "\n" or ch == "\r" or ch == "\t" or _CONTROL.match(ch):
            data = ch.encode("utf-8", "surrogateescape") if "\udc80" <= ch <= "\udcff" else ch.encode("utf-8", "replace")
            out.append("".join(f"\\x{b:02x}" for b in data))
        else:
            out.append(ch)
    return "$'" + "".join(out) + "'"


# Longest trace string a JSON report carries whole: real kernel names reach ~2,000 characters
# (the shared corpus), agents need them exact; a hostile megabyte name is cut.
JSON_STRING_CHARS = 8192


def cap_strings(obj: object, limit: int = JSON_STRING_CHARS) -> object:
    """`obj` (JSON-like: dicts, lists, tuples, strings) with every string longer than `limit`
    cut to `limit` characters plus a marker giving its full length. Everything else as is."""
    if isinstance(obj, str):
        if len(obj) <= limit:
            return obj
        return f"{obj[:limit]}\u2026[truncated: {len(obj):,} characters]"
    if isinstance(obj, dict):
        return {cap_strings(k, limit): cap_strings(v, limit) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [cap_strings(v, limit) for v in obj]
    return obj


def fmt_ns(ns: float | int | None) -> str:
    """Human duration: 812 ns, 12.3 us, 4.56 ms, 1.23 s."""
    if ns is None:
        return "-"
    ns = float(ns)
    if abs(ns) < 1e3:
        return f"{ns:.0f} ns"
    if abs(ns) < 1e6:
        return f"{ns / 1e3:.1f} us"
    if abs(ns) < 1e9:
        return f"{ns / 1e6:.2f} ms"
    return f"{ns / 1e9:.2f} s"


def fmt_bytes(n: float | int | None) -> str:
    if n is None:
        return "-"
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"
