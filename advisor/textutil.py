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
